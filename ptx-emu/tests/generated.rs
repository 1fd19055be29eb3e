//! Random kernels from `ruda_ir::gen`, run three ways on the same inputs: in the interpreter,
//! as the PTX backend's PTX in the emulator, and (when NVRTC is present) as NVRTC's PTX in
//! the emulator; every output buffer must agree bit for bit. 256 kernels per run, from seed 0
//! on (`RUDA_GEN_SEEDS=A..B` checks those seeds instead). Even seeds leave out the sm_90-only
//! conversions and are checked on sm_80 (and the PTX backend's sm_90 lowering), odd ones on
//! sm_90. NVRTC compiles each target's kernels as one module, on a second CPU thread. The
//! default run also checks that `mma`, `ldmatrix`, `cp.async` (zero-filling, and with
//! `wait_group 1`) and atomic exchange / CAS are among what it compared.

use crate::common;

use common::{dump_dir, first_difference, Input};
use ruda_codegen_ptx::{emit_ptx, Arch, Target};
use ruda_ir::gen::{generate, run_generated, ArgSpec, Entropy, GenConfig, GeneratedKernel};
use ruda_ir::{AtomicOp, Op, ScalarType};

/// The seeds to try, and how many kernels must be checked (0: all of the range).
fn seeds() -> (std::ops::Range<u64>, usize) {
    match std::env::var("RUDA_GEN_SEEDS") {
        Ok(s) => {
            let (a, b) = s.split_once("..").unwrap_or_else(|| panic!("RUDA_GEN_SEEDS must be A..B, got {s:?}"));
            let parse =
                |x: &str| x.trim().parse::<u64>().unwrap_or_else(|_| panic!("RUDA_GEN_SEEDS: bad number {x:?}"));
            (parse(a)..parse(b), 0)
        }
        Err(_) => (0..u64::MAX, 256),
    }
}

struct Checked {
    seed: u64,
    g: GeneratedKernel,
    inputs: Vec<Input>,
    elems: Vec<ScalarType>,
    want: Vec<Vec<u8>>,
    arch: Arch,
}

/// The first differing element of any buffer, as a message.
fn compare(c: &Checked, got: &[Vec<u8>]) -> Option<String> {
    for (i, (g, w)) in got.iter().zip(&c.want).enumerate() {
        let size = c.elems[i].bytes().max(1) as usize;
        if let Some(e) = first_difference(g, w, size) {
            let at = e * size;
            return Some(format!(
                "buffer {i} ({}) differs first at element {e}: emulator {:02x?}, interpreter {:02x?}",
                c.elems[i],
                &g[at..(at + size).min(g.len())],
                &w[at..(at + size).min(w.len())]
            ));
        }
    }
    None
}

fn dump(c: &Checked, engine: &str, arch: Arch, ptx: &str) -> String {
    let path = dump_dir().join(format!("gen_{}.{engine}.{arch}.ptx", c.seed));
    let _ = std::fs::write(&path, ptx);
    let _ = std::fs::write(dump_dir().join(format!("gen_{}.rir", c.seed)), ruda_ir::print_kernel(&c.g.kernel));
    path.display().to_string()
}

/// The PTX backend's lowering for `c.arch`, and for sm_90 when that is a different one.
fn check_direct(c: &Checked) -> Result<(), String> {
    let arches: &[Arch] = if c.arch == Arch::Sm80 { &[Arch::Sm80, Arch::Sm90] } else { &[Arch::Sm90] };
    for &arch in arches {
        let ptx = emit_ptx(&c.g.kernel, &Target::new(arch)).map_err(|e| format!("seed {} on {arch}: {e}", c.seed))?;
        let verdict = match common::emu_outputs(&ptx, &c.g.kernel.name, &c.g.launch, &c.inputs) {
            Err(e) => Some(e),
            Ok(got) => compare(c, &got),
        };
        if let Some(v) = verdict {
            let nvrtc = match ruda_codegen_nvrtc::compile_to_ptx(&c.g.kernel, &Target::new(arch)) {
                Ok(n) => dump(c, "nvrtc", arch, &n),
                Err(e) => format!("(no NVRTC PTX: {e})"),
            };
            return Err(format!(
                "seed {} through the PTX backend for {arch}: {v}\n  PTX (and .rir): {} and {nvrtc}",
                c.seed,
                dump(c, "direct", arch, &ptx)
            ));
        }
    }
    Ok(())
}

/// NVRTC's PTX of the kernels checked on `arch`, as one module.
fn nvrtc_ptx(checked: &[Checked], arch: Arch) -> Option<String> {
    let nvrtc =
        ruda_codegen_nvrtc::nvrtc_or_skip("generated kernels through NVRTC").unwrap_or_else(|e| panic!("{e}"))?;
    let kernels: Vec<_> = checked.iter().filter(|c| c.arch == arch).map(|c| &c.g.kernel).collect();
    Some(
        ruda_codegen_nvrtc::compile_module_with(&nvrtc, &kernels, &Target::new(arch))
            .unwrap_or_else(|e| panic!("NVRTC for {arch}: {e}")),
    )
}

#[test]
fn generated_kernels_agree_across_engines() {
    let (range, want_kernels) = seeds();
    let mut checked = vec![];
    for seed in range {
        if want_kernels > 0 && checked.len() >= want_kernels {
            break;
        }
        let sm80 = seed % 2 == 0;
        let cfg = GenConfig { name: format!("gen_{seed}"), sm80_conversions: sm80, ..GenConfig::default() };
        let g = generate(&mut Entropy::from_seed(seed), &cfg);
        let want = run_generated(&g, &g.kernel).unwrap_or_else(|e| panic!("seed {seed}: interpreter: {e}"));
        let inputs = g
            .inputs
            .iter()
            .map(|a| match a {
                ArgSpec::Buffer { bytes, .. } => Input::Buffer(bytes.clone()),
                ArgSpec::Scalar(c) => Input::Scalar(*c),
            })
            .collect();
        let elems = g
            .inputs
            .iter()
            .filter_map(|a| match a {
                ArgSpec::Buffer { elem, .. } => Some(*elem),
                ArgSpec::Scalar(_) => None,
            })
            .collect();
        checked.push(Checked { seed, g, inputs, elems, want, arch: if sm80 { Arch::Sm80 } else { Arch::Sm90 } });
    }
    let nvrtc = std::thread::scope(|s| {
        let h = s.spawn(|| [Arch::Sm80, Arch::Sm90].map(|arch| (arch, nvrtc_ptx(&checked, arch))));
        let failures: Vec<String> = checked.iter().filter_map(|c| check_direct(c).err()).collect();
        assert!(failures.is_empty(), "{} generated kernels disagree:\n{}", failures.len(), failures.join("\n"));
        h.join().expect("the NVRTC thread")
    });
    let mut through_nvrtc = 0;
    for (arch, ptx) in &nvrtc {
        let Some(ptx) = ptx else { continue };
        let module = ruda_ptx_emu::Module::parse(ptx).unwrap_or_else(|e| panic!("NVRTC's PTX for {arch}: {e}"));
        for c in checked.iter().filter(|c| c.arch == *arch) {
            let verdict = match common::emu_module_outputs(&module, &c.g.kernel.name, &c.g.launch, &c.inputs) {
                Err(e) => Some(e),
                Ok(got) => compare(c, &got),
            };
            if let Some(v) = verdict {
                let direct = emit_ptx(&c.g.kernel, &Target::new(*arch)).unwrap_or_default();
                panic!(
                    "seed {} through NVRTC for {arch}: {v}\n  NVRTC's PTX: {}\n  the PTX backend's: {}",
                    c.seed,
                    dump(c, "nvrtc", *arch, ptx),
                    dump(c, "direct", *arch, &direct)
                );
            }
            through_nvrtc += 1;
        }
    }
    let kinds = tensor_core_kinds(&checked);
    println!("{} generated kernels agree ({through_nvrtc} also through NVRTC), using {kinds:?}", checked.len());
    assert!(checked.len() >= want_kernels, "{} kernels checked", checked.len());
    if want_kernels > 0 {
        assert!(kinds.iter().all(|(_, n)| *n >= 5), "too few kernels with each kind of op: {kinds:?}");
    }
}

/// How many of the checked kernels use each op the fast kernels are made of: the default run
/// must compare them, not only plain arithmetic.
fn tensor_core_kinds(checked: &[Checked]) -> Vec<(&'static str, usize)> {
    type IsKind = fn(&Op) -> bool;
    let kinds: [(&str, IsKind); 6] = [
        ("mma", |op| matches!(op, Op::Mma { .. })),
        ("ldmatrix", |op| matches!(op, Op::LdMatrix { .. })),
        ("cp.async", |op| matches!(op, Op::CpAsync { .. })),
        ("cp.async zero-fill", |op| matches!(op, Op::CpAsync { src_size: Some(_), .. })),
        ("cp.async.wait_group 1", |op| matches!(op, Op::CpAsyncWait(1))),
        ("atomic.exch/cas", |op| matches!(op, Op::Atomic { op: AtomicOp::Exch | AtomicOp::Cas, .. })),
    ];
    kinds
        .iter()
        .map(|&(name, is)| {
            let n = checked
                .iter()
                .filter(|c| {
                    let mut found = false;
                    c.g.kernel.walk(|_, inst| found |= is(&inst.op));
                    found
                })
                .count();
            (name, n)
        })
        .collect()
}
