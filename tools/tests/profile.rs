//! `rudac profile`: the JSON contract, counts against hand-derived ones, the table, and bad
//! flags. The counters' definitions are tested in depth by the interpreter's `profile` file
//! tests (ir/filetests/profile/); this checks what the command adds and reports.

use ruda_tools::driver::{run, Command};
use serde_json::Value;

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn profile(cmd: &str) -> Result<String, String> {
    let command = Command::parse(args(cmd))?;
    let mut out = Vec::new();
    run(&command, &mut out)?;
    Ok(String::from_utf8(out).expect("utf-8"))
}

fn profile_json(cmd: &str) -> Value {
    let text = profile(cmd).unwrap_or_else(|e| panic!("rudac {cmd}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("rudac {cmd}: not JSON ({e}): {text}"))
}

/// Whether `ptxas` and `nvdisasm` exist (CI requires ptxas, which comes with nvdisasm).
fn tools_present() -> bool {
    let ptxas = ruda_codegen_ptx::ptxas::find_ptxas().is_some();
    if std::env::var("RUDA_REQUIRE_PTXAS").is_ok_and(|v| v == "1") {
        assert!(ptxas, "RUDA_REQUIRE_PTXAS=1 but there is no ptxas");
    }
    ptxas && ruda_codegen_ptx::sass::find_nvdisasm().is_some()
}

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/stride2.rir");

#[test]
fn json_has_the_contract_keys_with_integer_counts() {
    let p = profile_json(&format!("profile --file {FILE} --json"));
    assert_eq!(p["kernel"], "stride2");
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
        "dram_bytes_min",
        "flops",
    ] {
        assert!(p[key].is_u64(), "`{key}` is not an integer: {}", p[key]);
    }
    assert!(p["instructions"]["total"].is_u64(), "{}", p["instructions"]);
    for key in ["registers", "spill_bytes", "shared_bytes", "occupancy_warps", "occupancy_limit", "sass"] {
        assert!(p.get(key).is_some(), "no `{key}`");
    }
    assert!(p["roofline_us"].as_f64().is_some_and(|t| t > 0.0), "{}", p["roofline_us"]);
    let sites = p["sites"].as_array().expect("sites");
    assert!(!sites.is_empty());
    assert!(sites.iter().all(|s| s["loc"].is_string() || s["loc"].is_null()));
    assert_eq!(p["gpu"], "h200");
    assert_eq!(p["target"], "sm_90", "--target defaults to the GPU's architecture");
    assert_eq!(p["estimate"], true);
}

/// The counts of the hand-made kernel in tests/data/stride2.rir, derived in its comment.
#[test]
fn counts_of_a_two_way_conflict() {
    let p = profile_json(&format!("profile --file {FILE} --json"));
    let count = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("`{k}`: {}", p[k]));
    assert_eq!(count("shared_store_wavefronts"), 1);
    assert_eq!(count("shared_load_requests"), 1);
    assert_eq!(count("shared_load_wavefronts"), 2);
    assert_eq!(count("shared_bank_conflicts"), 1);
    assert_eq!(count("global_store_requests"), 1);
    assert_eq!(count("global_store_sectors"), 4);
    assert_eq!(count("dram_bytes_min"), 128);
    assert_eq!(count("flops"), 0);
    // The conflict is reported at the load's site.
    let load = p["sites"].as_array().unwrap().iter().find(|s| s["shared_load_requests"] == 1).expect("the load");
    assert_eq!(load["shared_bank_conflicts"], 1);
    assert_eq!(load["op"], "load");
    if tools_present() {
        assert!(p["registers"].as_u64().is_some_and(|r| r > 0), "{}", p["registers"]);
        assert_eq!(p["spill_bytes"], 0);
        assert_eq!(p["shared_bytes"], 256);
        // One warp per block and sm_90's 32 blocks per SM: 32 warps, limited by blocks.
        assert_eq!(p["occupancy_warps"], 32);
        assert_eq!(p["occupancy_limit"], "blocks");
        assert_eq!(p["sass"]["LDS"], 1, "{}", p["sass"]);
        assert_eq!(p["sass"]["STS"], 1, "{}", p["sass"]);
        assert!(p["notices"].as_array().unwrap().is_empty(), "{}", p["notices"]);
    } else {
        assert!(p["registers"].is_null() && p["sass"].is_null());
        assert!(!p["notices"].as_array().unwrap().is_empty(), "a missing ptxas is said");
    }
}

#[test]
fn a_tensor_core_gemm_uses_mma_and_ldmatrix() {
    let p = profile_json("profile gemm.bf16.tc64x64.s2 --json --gpu a100");
    assert_eq!(p["kernel"], "gemm.bf16.tc64x64.s2");
    assert_eq!(p["target"], "sm_80");
    let mix = &p["instructions"];
    assert!(mix["mma"].as_u64().unwrap() > 0 && mix["ldmatrix"].as_u64().unwrap() > 0, "{mix}");
    assert!(mix["cp_async"].as_u64().unwrap() > 0, "{mix}");
    // Every flop is an m16n8k16 mma's: 4096 per warp-level instruction.
    assert_eq!(p["flops"].as_u64().unwrap(), 4096 * mix["mma"].as_u64().unwrap());
    // The swizzled tiles are conflict-free (the budgets test holds every configuration to it).
    assert_eq!(p["shared_bank_conflicts"], 0);
    if tools_present() {
        assert!(p["sass"]["HMMA"].as_u64().is_some_and(|n| n > 0), "{}", p["sass"]);
        assert!(p["sass"]["LDSM"].as_u64().is_some_and(|n| n > 0), "{}", p["sass"]);
    }
}

#[test]
fn the_table_labels_its_estimates() {
    let text = profile(&format!("profile --file {FILE}")).unwrap();
    for expected in ["shared loads", "conflicts", "ESTIMATE", "roofline", "kernel stride2"] {
        assert!(text.contains(expected), "no `{expected}` in:\n{text}");
    }
}

#[test]
fn bad_flags_are_errors_that_name_them() {
    for (cmd, says) in [
        ("profile gemv.f32.m1 --gpu v100", "a100, h100-sxm, h200"),
        ("profile no.such.kernel", "no registered kernel"),
        ("profile gemv.f32.m1 --compiler bogus", "--compiler"),
        ("profile gemv.f32.m1 --input nothing=1", "no parameter `nothing`"),
    ] {
        let e = profile(cmd).expect_err(cmd);
        assert!(e.contains(says), "rudac {cmd}: `{e}` does not say `{says}`");
    }
    for cmd in ["profile", "profile gemv.f32.m1 --target sm_70", "profile a --file b.rir"] {
        assert!(Command::parse(args(cmd)).is_err(), "{cmd}");
    }
}
