//! `run_profiled` beyond the file tests (`ir/filetests/profile/`): failures, the counter
//! names reports print, and sums.

use crate::interp_support::*;

use ruda_ir::interp::{run_profiled, run_with_threads, Counters, KernelArg, LaunchConfig};
use ruda_ir::{Kernel, KernelBuilder, ScalarType::*};

/// `ldmatrix` by every thread of the block, rows 16 bytes apart.
fn ldmatrix_kernel() -> Kernel {
    let mut b = KernelBuilder::new("ldm");
    let out = b.param("out", gptr(U32));
    let tile = b.shared_array("tile", U16, 512);
    let s = b.shared_ptr(tile);
    let t = b.thread_id_x();
    let eight = b.const_u32(8);
    let lane = b.lane_id();
    let off = b.mul(lane, eight);
    let p = b.ptr_add(s, off);
    let r = b.ldmatrix(p, 4, false);
    let q = b.ptr_add(out, t);
    let r0 = b.extract(r, 0);
    b.store(q, r0);
    b.finish().unwrap()
}

#[test]
fn a_profiled_launch_fails_as_a_plain_one_does() {
    let k = ldmatrix_kernel();
    // 40 threads: the second warp has 8 lanes, and `ldmatrix` needs the whole warp.
    let launch = LaunchConfig::linear(1, 40);
    let mut a = vec![0u8; 4 * 40];
    let plain = run_with_threads(&k, &launch, &mut [KernelArg::Buffer(&mut a)], 1).unwrap_err();
    let mut b = vec![0u8; 4 * 40];
    let profiled = run_profiled(&k, &launch, &mut [KernelArg::Buffer(&mut b)], 1).unwrap_err();
    assert_eq!(plain, profiled);
    assert!(profiled.message.contains("inactive lanes"), "{profiled}");
    // A launch that does not fit is refused before anything runs.
    let too_big = LaunchConfig::linear(1, 2048);
    let e = run_profiled(&k, &too_big, &mut [KernelArg::Buffer(&mut b)], 1).unwrap_err();
    assert_eq!(e.op, "launch");
}

#[test]
fn two_whole_warps_count_each_matrix() {
    let k = ldmatrix_kernel();
    let mut out = vec![0u8; 4 * 64];
    let p = run_profiled(&k, &LaunchConfig::linear(1, 64), &mut [KernelArg::Buffer(&mut out)], 2).unwrap();
    // Per warp: 4 matrices of rows 16 bytes apart, one wavefront each (the file tests derive it).
    assert_eq!(p.totals.shared_load_requests, 2);
    assert_eq!(p.totals.shared_load_wavefronts, 8);
    assert_eq!(p.totals.shared_bank_conflicts(), 0);
    let site = p.sites.iter().find(|s| s.op == "ldmatrix.x4").expect("the ldmatrix site");
    assert_eq!(site.counters.instructions.ldmatrix, 2);
    assert!(site.loc.as_ref().is_some_and(|l| l.file.ends_with("interp_counters.rs")));
}

/// The names reports and `rudac profile --json` print (issue 12's list of keys).
#[test]
fn counters_are_listed_by_their_json_names() {
    let c = Counters::default();
    let names: Vec<&str> = c.fields().iter().map(|(n, _)| *n).collect();
    for key in [
        "global_load_requests",
        "global_load_sectors",
        "global_store_requests",
        "global_store_sectors",
        "shared_load_requests",
        "shared_load_wavefronts",
        "shared_store_requests",
        "shared_store_wavefronts",
        "shared_bank_conflicts",
        "divergent_branches",
        "bytes_requested",
        "bytes_moved",
        "flops",
    ] {
        assert!(names.contains(&key), "{key} missing from {names:?}");
    }
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "a name twice in {names:?}");
    let classes: Vec<&str> = c.instructions.fields().iter().map(|(n, _)| *n).collect();
    assert_eq!(
        classes,
        [
            "fp32",
            "fp16_bf16",
            "fp64",
            "integer",
            "mma",
            "ldmatrix",
            "cp_async",
            "shuffles",
            "barriers",
            "branches",
            "memory",
            "other"
        ]
    );
}

#[test]
fn add_sums_every_counter() {
    // A profile with something in most fields, added to itself, doubles every one.
    let k = ldmatrix_kernel();
    let mut out = vec![0u8; 4 * 32];
    let p = run_profiled(&k, &LaunchConfig::linear(1, 32), &mut [KernelArg::Buffer(&mut out)], 1).unwrap();
    let mut twice = p.totals.clone();
    twice.add(&p.totals);
    for ((name, a), (_, b)) in p.totals.fields().iter().zip(twice.fields()) {
        assert_eq!(2 * a, b, "{name}");
    }
    for ((name, a), (_, b)) in p.totals.instructions.fields().iter().zip(twice.instructions.fields()) {
        assert_eq!(2 * a, b, "{name}");
    }
    assert_eq!(twice.instructions.total(), 2 * p.totals.instructions.total());
    assert!(p.totals.instructions.total() > 0 && p.totals.global_store_sectors == 4);
}
