//! The default pass pipeline over every registered kernel: the result verifies, the
//! interpreter's outputs are bit-identical before and after on a small problem per family, and
//! the instruction counts are reported (`--nocapture` prints them).
//!
//! Inputs come from the parameter list: buffers of small values of their element type (with a
//! NaN, an infinity and a negative zero among the floats; integers small enough to index with),
//! `u32` sizes and `f32` scalars from a per-family table (a default for families it does not
//! know), two blocks of the kernel's launch bound, run on one interpreter thread.

use ruda_ir::interp::{run_with_threads, KernelArg, LaunchConfig};
use ruda_ir::passes::optimize;
use ruda_ir::{print_kernel, verify, AddrSpace, Constant, Kernel, ScalarType, Type};

/// Bytes of each buffer argument.
const BUFFER_BYTES: usize = 1 << 18;

/// Sizes of a family's problem: the `u32` parameters by name, and the grid.
fn problem(family: &str) -> (&'static [(&'static str, u32)], [u32; 3]) {
    match family {
        "elementwise" | "cast" => (&[("n", 300)], [2, 1, 1]),
        "reduce" | "softmax" => (&[("cols", 333)], [3, 1, 1]),
        "rms_norm" | "layer_norm" => (&[], [2, 1, 1]),
        // Not multiples of the 64 x 64 tile, and two steps of 16 along k (one partial).
        "gemm_simt" => (&[("m", 70), ("n", 65), ("k", 20)], [2, 2, 1]),
        _ => (&[], [2, 1, 1]),
    }
}

/// A small value of type `t` for element `i`: mostly in [-4, 4], a few special floats.
fn element(t: ScalarType, i: usize) -> u64 {
    let x = ((i * 37 + 11) % 64) as f64 / 8.0 - 4.0;
    let special = match i % 97 {
        13 => Some(f64::NAN),
        29 => Some(f64::INFINITY),
        41 => Some(-0.0),
        _ => None,
    };
    let f = special.unwrap_or(x);
    match t {
        ScalarType::F32 => (f as f32).to_bits() as u64,
        ScalarType::F64 => f.to_bits(),
        ScalarType::F16 => half::f16::from_f64(f).to_bits() as u64,
        ScalarType::BF16 => half::bf16::from_f64(f).to_bits() as u64,
        // Integers index other buffers: keep them small and non-negative.
        _ => (i % 4) as u64,
    }
}

fn buffer(t: ScalarType) -> Vec<u8> {
    let size = t.bytes() as usize;
    (0..BUFFER_BYTES / size).flat_map(|i| element(t, i).to_le_bytes()[..size].to_vec()).collect()
}

fn scalar(t: ScalarType, name: &str, sizes: &[(&str, u32)]) -> Constant {
    match t {
        ScalarType::F32 => Constant::f32(if name.contains("eps") { 1e-5 } else { 0.5 }),
        ScalarType::F64 => Constant::f64(0.5),
        _ => Constant::new(t, sizes.iter().find(|(n, _)| *n == name).map_or(3, |(_, v)| *v as u64)),
    }
}

/// Run `k` on the family's problem; the buffers afterwards, or the error's text.
fn outputs(k: &Kernel, family: &str) -> Result<Vec<Vec<u8>>, String> {
    let (sizes, grid) = problem(family);
    let mut buffers: Vec<Vec<u8>> =
        k.params.iter().filter(|p| k.ty(p.value).is_ptr()).map(|p| buffer(k.ty(p.value).elem())).collect();
    let mut free = buffers.iter_mut();
    let mut args = vec![];
    for p in &k.params {
        args.push(match k.ty(p.value) {
            Type::Ptr(AddrSpace::Global, _) => KernelArg::Buffer(free.next().expect("a buffer per pointer")),
            Type::Scalar(t) => KernelArg::Scalar(scalar(t, &p.name, sizes)),
            other => return Err(format!("parameter {} has type {other}", p.name)),
        });
    }
    let threads = k.launch_bounds.map_or(256, |lb| lb.max_threads);
    let launch = LaunchConfig { grid, block: [threads, 1, 1], dynamic_shared_bytes: 0 };
    // One interpreter thread, so the blocks run in a fixed order: the generic grid of two blocks
    // races for kernels launched as one block (the dispatch scan rewrites its counts in place),
    // and the order of atomics (the dispatch scatter's slots) is free, so with several threads
    // two runs of the same kernel may differ.
    run_with_threads(k, &launch, &mut args, 1).map_err(|e| e.to_string())?;
    drop(args);
    Ok(buffers)
}

fn inst_count(k: &Kernel) -> usize {
    let mut n = 0;
    k.walk(|_, _| n += 1);
    n
}

#[test]
fn the_default_pipeline_preserves_every_registered_kernel() {
    let mut failures = vec![];
    let (mut total_before, mut total_after) = (0, 0);
    let mut families_run = std::collections::BTreeMap::<&str, usize>::new();
    for r in ruda_ops::registry::registry() {
        let kernel = match r.build() {
            Ok(k) => k,
            Err(e) => {
                failures.push(format!("{}: does not build: {e}", r.id));
                continue;
            }
        };
        let mut optimized = kernel.clone();
        if let Err(e) = optimize(&mut optimized) {
            failures.push(format!("{}: {e}", r.id));
            continue;
        }
        if let Err(e) = verify(&optimized) {
            failures.push(format!("{}: the optimized kernel does not verify: {e}", r.id));
            continue;
        }
        let (before, after) = (inst_count(&kernel), inst_count(&optimized));
        total_before += before;
        total_after += after;
        println!("{:<40} {before:>6} -> {after:>6} instructions", r.id);
        // One configuration per family runs in the interpreter (the others share its code).
        if families_run.contains_key(r.family) {
            continue;
        }
        let (a, b) = (outputs(&kernel, r.family), outputs(&optimized, r.family));
        match (&a, &b) {
            (Ok(x), Ok(y)) if x == y => {}
            (Err(x), Err(y)) if x == y => println!("{}: both fail alike: {x}", r.id),
            _ => failures.push(format!(
                "{}: results differ\nbefore: {}\nafter: {}\noptimized kernel:\n{}",
                r.id,
                a.as_ref().map_or_else(|e| e.clone(), |_| "ok".into()),
                b.as_ref().map_or_else(|e| e.clone(), |_| "ok".into()),
                print_kernel(&optimized)
            )),
        }
        families_run.insert(r.family, a.is_ok() as usize);
    }
    println!(
        "total: {total_before} -> {total_after} instructions ({:+.1}%)",
        100.0 * (total_after as f64 - total_before as f64) / total_before.max(1) as f64
    );
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n\n"));
    assert!(families_run.values().any(|&ran| ran == 1), "no family ran without an error: {families_run:?}");
}
