//! The pass list and the default pipeline: names, descriptions, parsing, dumps, and the
//! pipeline reaching a fixed point on a kernel that exercises every pass.

use crate::passes_support;

use passes_support::*;
use ruda_ir::interp::LaunchConfig;
use ruda_ir::passes::{all_passes, default_pipeline, parse_pipeline, run_pipeline, DEFAULT_PIPELINE};
use ruda_ir::*;

use ScalarType::*;

#[test]
fn every_pass_has_a_unique_name_and_a_description() {
    let passes = all_passes();
    let names: Vec<&str> = passes.iter().map(|p| p.name()).collect();
    assert_eq!(names, ["fold", "simplify", "cse", "licm", "unroll", "addr-fold", "vectorize", "dce"]);
    for p in &passes {
        assert!(!p.description().is_empty() && !p.description().contains('\n'), "{}", p.name());
    }
    // The default pipeline uses every pass, and only those.
    for name in &names {
        assert!(DEFAULT_PIPELINE.contains(name), "{name} is not in the default pipeline");
    }
    let default: Vec<&str> = default_pipeline().iter().map(|p| p.name()).collect();
    assert_eq!(default, DEFAULT_PIPELINE);
}

#[test]
fn pipelines_parse() {
    assert_eq!(parse_pipeline("default").unwrap().len(), DEFAULT_PIPELINE.len());
    assert!(parse_pipeline("none").unwrap().is_empty());
    let p: Vec<&str> = parse_pipeline(" fold , dce,fold").unwrap().iter().map(|p| p.name()).collect();
    assert_eq!(p, ["fold", "dce", "fold"]);
    let err = parse_pipeline("fold,gvn").err().expect("unknown pass").to_string();
    assert!(err.contains("`gvn`") && err.contains("addr-fold") && err.contains("vectorize"), "{err}");
}

#[test]
fn dumps_name_each_step_of_a_pipeline_with_repeats() {
    let (k, _) = slots_kernel(|b| {
        let x = b.const_u32(2);
        vec![b.add(x, x)]
    });
    let dir = std::env::temp_dir().join(format!("ruda-passes-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut k2 = k.clone();
    run_pipeline(&mut k2, &default_pipeline(), Some(&dir)).unwrap();
    let mut files: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    files.sort();
    assert_eq!(files.len(), DEFAULT_PIPELINE.len() + 1);
    assert_eq!(files[0], "slots.00-input.rir");
    assert_eq!(files[1], "slots.01-fold.rir");
    assert_eq!(files[6], "slots.06-fold.rir");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A kernel with work for every pass: a constant-trip loop over a shared tile with invariant
/// arithmetic, duplicated address computations, dead values and constant conditions.
fn busy_kernel() -> Kernel {
    let mut b = KernelBuilder::new("busy");
    let x = b.param("x", gptr(F32));
    let out = b.param("out", gptr(F32));
    let n = b.param("n", Type::U32);
    let tile = b.shared_array("tile", F32, 256);
    let tid = b.thread_id_x();
    let smem = b.shared_ptr(tile);
    let ok = b.lt(tid, n);
    let v = b.if_else(
        ok,
        |b| {
            let p = b.ptr_add(x, tid);
            vec![b.load(p)]
        },
        |b| vec![b.const_f32(0.0)],
    )[0];
    let four = b.const_u32(4);
    let at = b.mul(tid, four);
    for j in 0..4 {
        let c = b.const_u32(j);
        let i = b.add(at, c);
        let p = b.ptr_add(smem, i);
        let jf = b.const_f32(j as f32);
        let w = b.add(v, jf);
        b.store(p, w);
    }
    b.barrier();
    let (s, e, st) = (b.const_u32(0), b.const_u32(4), b.const_u32(1));
    let zero = b.const_f32(0.0);
    let r = b.for_range(s, e, st, &[zero, zero], |b, j, acc| {
        let base = b.mul(tid, four);
        let i = b.add(base, j);
        let p = b.ptr_add(smem, i);
        let t = b.load(p);
        let one = b.const_f32(1.0);
        let t1 = b.mul(t, one);
        let yes = b.const_pred(true);
        let t2 = b.select(yes, t1, one);
        let dead = b.mul(t2, t2);
        let _ = b.add(dead, one);
        vec![b.add(acc[0], t2), acc[1]]
    })[0];
    let q = b.ptr_add(out, tid);
    b.store(q, r);
    b.finish().unwrap()
}

#[test]
fn the_default_pipeline_shrinks_a_busy_kernel_and_reaches_a_fixed_point() {
    let k = busy_kernel();
    let xs: Vec<u64> = (0..64).map(|i| (i as f32 * 0.25 - 3.0).to_bits() as u64).collect();
    let args = [Arg::Buffer(bytes_of(&xs, 4)), Arg::Buffer(vec![0; 256]), Arg::Scalar(Constant::u32(50))];
    let once = check(&k, "default", LaunchConfig::linear(1, 64), &args);
    assert!(inst_count(&once) < inst_count(&k), "{}", print_kernel(&once));
    assert!(!print_kernel(&once).contains("for "), "{}", print_kernel(&once));
    assert_eq!(count(&once, |o| matches!(o, Op::Load { lanes: 4, .. })), 1, "{}", print_kernel(&once));
    let twice = optimized(&once, "default");
    assert_eq!(inst_count(&twice), inst_count(&once), "{}", print_kernel(&twice));
}

#[test]
fn optimize_uses_the_default_pipeline() {
    let k = busy_kernel();
    let mut a = k.clone();
    ruda_ir::passes::optimize(&mut a).unwrap();
    assert_eq!(print_kernel(&a), print_kernel(&optimized(&k, "default")));
}
