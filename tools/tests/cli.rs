//! `rudac`'s command line through `clap`: `--help` of every subcommand, `--flag=value`, the
//! exit statuses, arguments that are not UTF-8, and messages that name the flag at fault.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::process::Output;

use ruda_codegen_ptx::Arch;
use ruda_tools::driver::{Command, EmitKind, Engine, RunArgs, Source};

fn rudac<I, T>(args: I) -> Output
where
    I: IntoIterator<Item = T>,
    T: AsRef<std::ffi::OsStr>,
{
    std::process::Command::new(env!("CARGO_BIN_EXE_rudac"))
        .args(args)
        .env_remove("RUDA_CUDA_COMPILER")
        .env_remove("RUDA_PTX_VERSION")
        .output()
        .expect("rudac runs")
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// `rudac SUB --help`: status 0, the usage line and every flag of the subcommand on stdout.
#[test]
fn every_subcommand_has_help() {
    for (sub, flags) in [
        ("list", &["--json"][..]),
        ("emit", &["--file", "--target", "--emit", "--compiler", "--passes"]),
        ("check", &["--target", "--compiler", "--passes"]),
        ("passes", &[]),
        ("bench-compile", &["--target"]),
        ("run", &["--file", "--engine", "--compiler", "--target", "--seed", "--input"]),
        ("profile", &["--file", "--seed", "--input", "--gpu", "--target", "--compiler", "--json"]),
        ("tune", &["--shapes", "--show"]),
    ] {
        let out = rudac([sub, "--help"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{sub} --help: {}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(&format!("Usage: rudac {sub}")), "{sub}: {stdout}");
        for flag in flags {
            assert!(stdout.contains(flag), "{sub} --help does not mention {flag}: {stdout}");
        }
    }
    let out = rudac(["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for sub in ["list", "emit", "check", "passes", "bench-compile", "run", "profile", "tune", "RUDA_CUDA_COMPILER"] {
        assert!(stdout.contains(sub), "rudac --help does not mention {sub}: {stdout}");
    }
    // The values of an enumerated flag and the defaults are in the help.
    let run = String::from_utf8_lossy(&rudac(["run", "--help"]).stdout).into_owned();
    assert!(run.contains("ptx-emu") && run.contains("[default: 0]"), "{run}");
    let check = String::from_utf8_lossy(&rudac(["check", "--help"]).stdout).into_owned();
    assert!(check.contains("[default: sm_80,sm_90]"), "{check}");
}

#[test]
fn flags_take_their_value_after_an_equals_sign() {
    for (spaced, joined) in [
        (
            "emit add.f32 --target sm_80 --emit ir-opt --passes none",
            "emit add.f32 --target=sm_80 --emit=ir-opt --passes=none",
        ),
        ("emit --file k.rir --compiler nvrtc", "emit --file=k.rir --compiler=nvrtc"),
        (
            "check --target sm_80,sm_90a --compiler nvrtc --passes fold,dce",
            "check --target=sm_80,sm_90a --compiler=nvrtc --passes=fold,dce",
        ),
        ("bench-compile --target sm_80", "bench-compile --target=sm_80"),
        (
            "run add.f32 --engine ptx-emu --compiler ptx --target sm_80 --seed 3 --input n=5 --input b=b.bin",
            "run add.f32 --engine=ptx-emu --compiler=ptx --target=sm_80 --seed=3 --input=n=5 --input=b=b.bin",
        ),
        ("tune --shapes s.txt", "tune --shapes=s.txt"),
    ] {
        let want = Command::parse(words(spaced)).unwrap_or_else(|e| panic!("{spaced}: {e}"));
        assert_eq!(Command::parse(words(joined)), Ok(want), "{joined}");
    }
    assert_eq!(
        Command::parse(words("run --file=k.rir --engine=interp --seed=3 --input=n=5")),
        Ok(Command::Run(RunArgs {
            source: Source::File("k.rir".into()),
            engine: Engine::Interp,
            compiler: None,
            arch: None,
            seed: 3,
            inputs: vec![("n".into(), "5".into())],
        }))
    );
}

/// The defaults, as before `clap`.
#[test]
fn defaults_are_unchanged() {
    assert_eq!(
        Command::parse(words("emit add.f32")),
        Ok(Command::Emit {
            source: Source::Id("add.f32".into()),
            arch: Arch::Sm90,
            kind: EmitKind::Ptx,
            compiler: None,
            passes: "default".into()
        })
    );
    assert_eq!(
        Command::parse(words("check")),
        Ok(Command::Check { archs: vec![Arch::Sm80, Arch::Sm90], compiler: None, passes: "default".into() })
    );
    assert_eq!(Command::parse(words("bench-compile")), Ok(Command::BenchCompile { arch: Arch::Sm90 }));
    assert_eq!(Command::parse(words("list")), Ok(Command::List { json: false }));
    let Ok(Command::Run(run)) = Command::parse(words("run add.f32 --engine cuda")) else { panic!("run parses") };
    assert_eq!((run.seed, run.arch, run.compiler, run.inputs.len()), (0, None, None, 0));
}

/// 0 when the command ran clean, 1 when it failed, 2 for a command line that does not parse.
#[test]
fn exit_statuses() {
    for (cmd, code) in [
        ("passes", 0),
        ("emit no.such.kernel", 1),
        ("emit add.f32 --compiler bogus", 1),
        ("run add.f32 --engine interp --input zz=1", 1),
        ("", 2),
        ("frob", 2),
        ("emit", 2),
        ("list --json extra", 2),
        ("emit add.f32 --target sm_70", 2),
        ("run add.f32 --engine gpu", 2),
        ("run add.f32 --engine interp --compiler nvrtc", 2),
        ("run add.f32 --engine interp --input n", 2),
        ("tune --show --shapes s.txt", 2),
    ] {
        let out = rudac(words(cmd));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "`rudac {cmd}`: {stderr}");
        assert!(!stderr.contains("panicked"), "{cmd}: {stderr}");
    }
}

/// A usage error names the flag (and, for a bad value, the value).
#[test]
fn usage_errors_name_the_flag() {
    for (cmd, want) in [
        ("emit add.f32 --target sm_70", "--target"),
        ("emit add.f32 --emit sass", "--emit"),
        ("emit add.f32 --passes bogus", "--passes"),
        ("check --target", "--target"),
        ("run add.f32 --engine gpu", "--engine"),
        ("run add.f32 --engine interp --seed x", "--seed"),
        ("run add.f32 --engine interp --engine cuda", "--engine"),
        ("list --frob", "--frob"),
    ] {
        let e = Command::parse(words(cmd)).expect_err(cmd);
        assert!(e.contains(want), "{cmd}: {e}");
    }
}

/// `--compiler bogus` is blamed on `--compiler`, not on `RUDA_CUDA_COMPILER`; a bad
/// `RUDA_CUDA_COMPILER` still is blamed on the variable.
#[test]
fn a_bad_compiler_flag_names_the_flag() {
    for cmd in
        ["emit add.f32 --compiler bogus", "run add.f32 --engine ptx-emu --compiler bogus", "check --compiler bogus"]
    {
        let out = rudac(words(cmd));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd}: {stderr}");
        assert!(stderr.contains("--compiler `bogus`") && stderr.contains("accepted values"), "{cmd}: {stderr}");
        assert!(!stderr.contains("RUDA_CUDA_COMPILER"), "{cmd}: {stderr}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rudac"))
        .args(["emit", "add.f32"])
        .env("RUDA_CUDA_COMPILER", "bogus")
        .output()
        .expect("rudac runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RUDA_CUDA_COMPILER"));
}

/// `\xff.rir` and friends: legal Linux file names that are not UTF-8.
#[test]
fn arguments_that_are_not_utf8() {
    let bad = |prefix: &[u8], suffix: &[u8]| OsString::from_vec([prefix, b"\xff", suffix].concat());
    // A path that is not UTF-8 is a path: a missing one is "not found", not a panic.
    let out = rudac([OsString::from("emit"), OsString::from("--file"), bad(b"", b".rir")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("\u{fffd}.rir") && !stderr.contains("panicked"), "{stderr}");
    let out = rudac([OsString::from("emit"), bad(b"--file=", b".rir")]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let out = rudac([OsString::from("tune"), OsString::from("--shapes"), bad(b"", b".txt")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("\u{fffd}.txt") && !stderr.contains("panicked"), "{stderr}");

    // One that exists runs, as its UTF-8 twin does.
    let dir = std::env::temp_dir().join(format!("rudac-non-utf8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = "kernel @twice(%0 x: ptr<global,f32>) {\n  %1: u32 = special tid.x\n  %2: ptr<global,f32> = ptradd %0, %1\n  %3: f32 = load %2\n  %4: f32 = add %3, %3\n  store %2, %4\n}\n";
    let mut path = dir.clone().into_os_string();
    path.push("/");
    path.push(bad(b"k", b".rir"));
    std::fs::write(&path, text).unwrap();
    let out = rudac([
        OsString::from("run"),
        OsString::from("--file"),
        path.clone(),
        OsString::from("--engine"),
        OsString::from("interp"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let twin = dir.join("k.rir");
    std::fs::write(&twin, text).unwrap();
    let want = rudac(["run", "--file", twin.to_str().unwrap(), "--engine", "interp"]);
    let checksum = |o: &Output| String::from_utf8_lossy(&o.stdout).split(' ').next().map(String::from);
    assert_eq!(checksum(&out), checksum(&want));

    // `--input NAME=FILE` with such a file name.
    let bytes: Vec<u8> = (0..65536u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let mut input = dir.clone().into_os_string();
    input.push("/");
    input.push(bad(b"b", b".bin"));
    std::fs::write(&input, &bytes).unwrap();
    let mut arg = OsString::from("b=");
    arg.push(&input);
    assert!(matches!(
        Command::parse([OsString::from("run"), OsString::from("add.f32"), OsString::from("--engine=interp"), OsString::from("--input"), arg.clone()]),
        Ok(Command::Run(RunArgs { ref inputs, .. })) if inputs[0] == ("b".to_string(), input.clone())
    ));
    let out = rudac([
        OsString::from("run"),
        OsString::from("add.f32"),
        OsString::from("--engine=interp"),
        OsString::from("--input"),
        arg,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    // Where text is required, a clear error (status 2 for the command line, 1 for a scalar).
    for args in [
        vec![OsString::from("emit"), bad(b"add", b".f32")],
        vec![OsString::from("emit"), OsString::from("add.f32"), OsString::from("--target"), bad(b"sm_", b"")],
        vec![
            OsString::from("run"),
            OsString::from("add.f32"),
            OsString::from("--engine=interp"),
            OsString::from("--input"),
            bad(b"n", b"=1"),
        ],
    ] {
        let out = rudac(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("UTF-8") && !stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    let out = rudac([
        OsString::from("run"),
        OsString::from("add.f32"),
        OsString::from("--engine=interp"),
        OsString::from("--input"),
        bad(b"n=", b""),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--input n=") && stderr.contains("not UTF-8"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ruda-bench`'s command line: help, a bad number named by its flag, the list without a device.
#[test]
fn ruda_bench_command_line() {
    let bench =
        |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_ruda-bench")).args(args).output().unwrap();
    let out = bench(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--list", "--quick", "--sample-ms", "--samples", "--budget-s", "--exclude", "[FILTER]"] {
        assert!(help.contains(flag), "{flag}: {help}");
    }
    for args in [&["--samples", "0"][..], &["--budget-s=-1"], &["--sample-ms", "nan"], &["--frob"]] {
        let out = bench(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let flag = args[0].split('=').next().unwrap();
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
    let all = bench(&["--list", "--quick"]);
    assert_eq!(all.status.code(), Some(0));
    let lines = String::from_utf8_lossy(&all.stdout).lines().count();
    assert!(lines > 1);
    let some = bench(&["--list", "--quick", "gate_up"]);
    let some: Vec<String> = String::from_utf8_lossy(&some.stdout).lines().map(String::from).collect();
    assert!(!some.is_empty() && some.len() < lines && some.iter().all(|l| l.contains("gate_up")), "{some:?}");
    let none = bench(&["--list", "--quick", "no-such-benchmark"]);
    assert_eq!(none.status.code(), Some(2));
    let rest = bench(&["--list", "--quick", "--exclude", "gate_up", "--exclude", "lm_head"]);
    let rest: Vec<String> = String::from_utf8_lossy(&rest.stdout).lines().map(String::from).collect();
    assert!(!rest.is_empty() && rest.iter().all(|l| !l.contains("gate_up") && !l.contains("lm_head")), "{rest:?}");
    assert_eq!(rest.len() + some.len() + lines_with(&all.stdout, "lm_head"), lines, "{rest:?}");
    let nothing_left = bench(&["--list", "--quick", "gate_up", "--exclude", "linear"]);
    assert_eq!(nothing_left.status.code(), Some(2));
    // The gated delta rows at Qwen3.5's heads (Hk 16, Hv 32, K = V = 128) that issue 13 measures:
    // chunked prefill at T = 2k, 8k and 64k, decode at batch 1 and 32.
    let delta = bench(&["--list", "gated_delta"]);
    let delta = String::from_utf8_lossy(&delta.stdout).to_string();
    for row in [
        "gated_delta_chunk_bf16 [1, 2048, 16, 32, 128, 128]",
        "gated_delta_chunk_bf16 [1, 8192, 16, 32, 128, 128]",
        "gated_delta_chunk_bf16 [1, 65536, 16, 32, 128, 128]",
        "gated_delta_decode_bf16 [1, 16, 32, 128, 128]",
        "gated_delta_decode_bf16 [32, 16, 32, 128, 128]",
    ] {
        assert!(delta.contains(row), "{row}: {delta}");
    }
    assert_eq!(delta.lines().count(), 5, "{delta}");
}

/// The lines of a `--list` output that contain `word`.
fn lines_with(stdout: &[u8], word: &str) -> usize {
    String::from_utf8_lossy(stdout).lines().filter(|l| l.contains(word)).count()
}

/// `ruda-bench --quick` on the interpreter for the rows `filter` picks: its JSON rows and stderr
/// (it must exit 0).
fn quick_rows(filter: &str) -> (Vec<serde_json::Value>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ruda-bench"))
        .args(["--quick", "--samples", "1", "--sample-ms", "1", filter])
        .env("RUDA_DEVICE", "cpu")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let rows = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (rows, stderr)
}

/// The gated delta rows' setup and launches, at the quick shapes on the interpreter: every row
/// prints a JSON line, and a decode row's bytes are its state read and written
/// (`2 · B · Hv · K · V · 4`), the floor the GPU rung's summary divides by the copy bandwidth.
#[test]
fn ruda_bench_gated_delta_rows_run_on_the_interpreter() {
    let (rows, stderr) = quick_rows("gated_delta");
    let ops: Vec<&str> = rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["gated_delta_decode_bf16", "gated_delta_decode_bf16", "gated_delta_chunk_bf16"], "{stderr}");
    for r in &rows {
        assert!(r["ruda_ms"].as_f64().unwrap() > 0.0, "{r}");
        let shape: Vec<u64> = r["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        if r["op"] == "gated_delta_decode_bf16" {
            let [b, _, hv, k, v] = shape[..] else { panic!("{r}") };
            assert_eq!(r["bytes"].as_f64().unwrap(), (2 * b * hv * k * v * 4) as f64, "{r}");
        }
    }
}

/// The MoE rows at the quick shapes on the interpreter: the grouped experts against both torch
/// baselines' names, and a decode step through the decode path and through the dispatched path
/// (its baseline), whose bytes are the selected experts' weights (`3 · H · I` bf16 each).
#[test]
fn ruda_bench_moe_rows_run_on_the_interpreter() {
    let (rows, stderr) = quick_rows("moe");
    let ops: Vec<&str> = rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(
        ops,
        ["moe_experts_bf16", "moe_experts_loop_bf16", "moe_decode_bf16", "moe_decode_grouped_bf16"],
        "{stderr}"
    );
    for r in &rows {
        assert!(r["ruda_ms"].as_f64().unwrap() > 0.0, "{r}");
        let shape: Vec<u64> = r["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        if r["op"].as_str().unwrap().starts_with("moe_decode") {
            let [t, e, k, h, i] = shape[..] else { panic!("{r}") };
            assert_eq!(r["bytes"].as_f64().unwrap(), (2 * 3 * (t * k).min(e) * h * i) as f64, "{r}");
        }
    }
}

/// The AWQ rows at the quick shapes on the interpreter: decode rows (the GEMV) and a 32-row chunk
/// (dequantisation and the dense GEMM), each against the dense bf16 row of its shape, its bytes
/// the packed weight, zeros, scales and the activations.
#[test]
fn ruda_bench_awq_rows_run_on_the_interpreter() {
    let (rows, stderr) = quick_rows("awq");
    assert_eq!(rows.len(), 8, "{stderr}");
    for r in &rows {
        assert_eq!((r["op"].as_str(), r["base"].as_str()), (Some("awq_linear_f16"), Some("linear_bf16")), "{r}");
        assert!(r["ruda_ms"].as_f64().unwrap() > 0.0, "{r}");
        let shape: Vec<u64> = r["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        let [m, n, k] = shape[..] else { panic!("{r}") };
        let groups = k / 128;
        let bytes = k * n / 2 + groups * n / 2 + 2 * groups * n + 2 * (m * k + m * n);
        assert_eq!(r["bytes"].as_f64().unwrap(), bytes as f64, "{r}");
    }
    assert!(rows.iter().any(|r| r["shape"][0] == 32), "a prefill-sized row");
}
