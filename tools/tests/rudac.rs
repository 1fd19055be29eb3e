//! The `rudac` driver: argument parsing and the output of each command.

use ruda_codegen_ptx::Arch;
use ruda_tools::driver::{run, Command, EmitKind, Engine, RunArgs, Source};

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn output(cmd: &str) -> Result<(bool, String), String> {
    let command = Command::parse(args(cmd))?;
    let mut out = Vec::new();
    let ok = run(&command, &mut out)?;
    Ok((ok, String::from_utf8(out).expect("utf-8")))
}

#[test]
fn parses_commands_and_flags() {
    assert_eq!(Command::parse(args("list --json")), Ok(Command::List { json: true }));
    assert_eq!(
        Command::parse(args("emit add.f32 --target=sm_80 --emit ir")),
        Ok(Command::Emit {
            source: Source::Id("add.f32".into()),
            arch: Arch::Sm80,
            kind: EmitKind::Ir,
            compiler: None,
            passes: "default".into()
        })
    );
    assert_eq!(
        Command::parse(args("check --target sm_80,sm_90a")),
        Ok(Command::Check { archs: vec![Arch::Sm80, Arch::Sm90a], compiler: None, passes: "default".into() })
    );
    assert_eq!(
        Command::parse(args(
            "run gemv.f16.m4 --engine ptx-emu --compiler nvrtc --target sm_80 --seed 9 --input x=x.bin --input k=7"
        )),
        Ok(Command::Run(RunArgs {
            source: Source::Id("gemv.f16.m4".into()),
            engine: Engine::PtxEmu,
            compiler: Some("nvrtc".into()),
            arch: Some(Arch::Sm80),
            seed: 9,
            inputs: vec![("x".into(), "x.bin".into()), ("k".into(), "7".into())],
        }))
    );
    for bad in [
        "",
        "frob",
        "list extra",
        "emit",
        "emit a b",
        "emit add.f32 --target sm_70",
        "check --emit ir",
        "emit x --emit sass",
        "check --target",
        "emit add.f32 --passes bogus",
    ] {
        let e = Command::parse(args(bad)).expect_err(bad);
        assert!(!e.is_empty());
    }
}

/// `rudac passes`: one line per pass of the IR's pass list (name, then what it does), and the
/// default pipeline as the IR runs it.
#[test]
fn passes_lists_every_pass_and_the_default_pipeline() {
    let (ok, text) = output("passes").unwrap();
    assert!(ok);
    let passes = ruda_ir::passes::all_passes();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), passes.len() + 1, "{text}");
    for (line, pass) in lines.iter().zip(&passes) {
        let (name, what) = line.split_once(char::is_whitespace).expect("NAME DESCRIPTION");
        assert_eq!(name, pass.name());
        assert!(!what.trim().is_empty(), "{line}");
    }
    assert_eq!(lines[passes.len()], format!("default pipeline: {}", ruda_ir::passes::DEFAULT_PIPELINE.join(",")));
}

/// `rudac check`'s failure path: a `ptxas` that rejects everything fails every configuration,
/// each with the kept PTX and a one-line repro, and the command exits 1.
#[test]
fn check_fails_when_ptxas_rejects_the_ptx() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rudac"))
        .args(["check", "--target", "sm_80"])
        .env("RUDA_PTXAS", "/bin/false")
        .output()
        .expect("runs rudac");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let n = ruda_ops::registry::registry().len();
    assert!(
        text.contains(&format!("0 of {n} configurations assembled with zero spills; 0 spilled; {n} failed")),
        "{text}"
    );
    assert!(text.contains("ptxas FAILED") && text.contains("repro: /bin/false"), "{text}");
}

#[test]
fn list_prints_one_configuration_per_line() {
    let (ok, text) = output("list").unwrap();
    assert!(ok);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), ruda_ops::registry::registry().len());
    for line in &lines {
        let (id, targets) = line.split_once('\t').expect("ID<TAB>targets");
        assert!(!id.is_empty());
        assert!(targets.split(',').all(|t| Arch::from_name(t).is_some()), "{line}");
    }
    assert!(lines.iter().any(|l| l.starts_with("rms_norm.bf16.h4096\t")));
    let (_, json) = output("list --json").unwrap();
    assert!(json.starts_with("[{\"id\":\"add.f32\""), "{json}");
}

#[test]
fn emit_prints_ptx_or_ir() {
    let (_, ptx) = output("emit rms_norm.bf16.h1024 --target sm_80").unwrap();
    assert!(ptx.contains(".target sm_80") && ptx.contains(".visible .entry rms_norm_bf16_h1024("), "{ptx}");
    let (_, ir) = output("emit rms_norm.bf16.h1024 --emit ir").unwrap();
    assert!(ir.starts_with("kernel @rms_norm_bf16_h1024("), "{ir}");
    let e = output("emit no.such.kernel").unwrap_err();
    assert!(e.contains("rudac list"), "{e}");
    let e = output("emit add.f32 --compiler cuda").unwrap_err();
    assert!(e.contains("accepted values"), "{e}");
}

/// The binary itself, with `RUDA_PTX_VERSION` in its environment.
fn rudac(version: &str, cmd: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_rudac"))
        .args(args(cmd))
        .env("RUDA_PTX_VERSION", version)
        .env_remove("RUDA_CUDA_COMPILER")
        .output()
        .expect("rudac runs")
}

#[test]
fn ptx_version_from_the_environment() {
    let out = rudac("8.0", "emit add.f32 --target sm_90");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(".version 8.0\n"));
    for (bad, why) in [("banana", "malformed"), ("7.0", "too old for sm_90")] {
        let out = rudac(bad, "emit add.f32 --target sm_90");
        assert!(!out.status.success(), "{bad} must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn emit_a_text_ir_file_and_cuda() {
    let dir = std::env::temp_dir().join(format!("rudac-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("twice.rir");
    std::fs::write(
        &good,
        "kernel @twice(%0 x: ptr<global,f32>) {\n  %1: u32 = special tid.x\n  %2: ptr<global,f32> = ptradd %0, %1\n  %3: f32 = load %2\n  %4: f32 = add %3, %3\n  store %2, %4\n}\n",
    )
    .unwrap();
    let path = good.display().to_string();
    let (_, ptx) = output(&format!("emit --file {path} --target sm_80")).unwrap();
    assert!(ptx.contains(".visible .entry twice(") && ptx.contains("add.rn.f32"), "{ptx}");
    let (_, ir) = output(&format!("emit --file {path} --emit ir-opt --passes none")).unwrap();
    assert!(ir.starts_with("kernel @twice("), "{ir}");
    let (_, cuda) = output(&format!("emit --file {path} --emit cuda")).unwrap();
    assert!(cuda.contains("extern \"C\" __global__") && cuda.contains("__fadd_rn"), "{cuda}");

    let bad = dir.join("bad.rir");
    std::fs::write(&bad, "kernel @k(%0 x: ptr<global,f32>) {\n  %1: f32 = frobnicate %0\n}\n").unwrap();
    let e = output(&format!("emit --file {}", bad.display())).unwrap_err();
    assert!(e.contains("bad.rir:2:") && e.contains('^'), "{e}");
    let e = output(&format!("emit --file {}", dir.join("missing.rir").display())).unwrap_err();
    assert!(e.contains("missing.rir"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn emit_through_nvrtc() {
    let Some(_) = ruda_codegen_nvrtc::nvrtc_or_skip("emit_through_nvrtc").expect("nvrtc policy") else { return };
    let (_, ptx) = output("emit add.f32 --compiler nvrtc --target sm_80").unwrap();
    assert!(ptx.contains(".target sm_80") && ptx.contains(".entry add_f32("), "{ptx}");
}

/// `rudac run`'s checksum, parsed from its one output line.
fn run_checksum(cmd: &str) -> Result<u64, String> {
    let (ok, text) = output(cmd)?;
    assert!(ok, "{cmd}");
    let line = text.strip_suffix('\n').expect("one line");
    let (sum, time) = line.split_once(' ').expect("two fields");
    let sum = sum.strip_prefix("checksum=").expect("checksum=");
    assert_eq!(sum.len(), 16, "{line}");
    let ms: f64 = time.strip_prefix("time_ms=").expect("time_ms=").parse().expect("a number");
    assert!(ms >= 0.0, "{line}");
    Ok(u64::from_str_radix(sum, 16).expect("hex"))
}

/// Ids of different families: elementwise with special values, a norm, GEMV, RoPE with its
/// positions, attention decode with sequence lengths, sampling.
const RUN_IDS: [&str; 6] = [
    "add.f16",
    "rms_norm.bf16.h1024",
    "gemv.f32.m4.splitk",
    "rope.f16.d64",
    "attention_decode.bf16.d64",
    "sampling.f32",
];

#[test]
fn run_prints_the_same_checksum_on_interp_and_ptx_emu() {
    for id in RUN_IDS {
        for seed in [0, 3] {
            let want = run_checksum(&format!("run {id} --engine interp --seed {seed}")).unwrap();
            for target in ["sm_80", "sm_90"] {
                let got =
                    run_checksum(&format!("run {id} --engine ptx-emu --compiler ptx --target {target} --seed {seed}"))
                        .unwrap();
                assert_eq!(got, want, "{id} seed {seed}: ptx-emu (direct PTX, {target}) against interp");
            }
        }
        let seeds: Vec<u64> =
            [0, 1].map(|s| run_checksum(&format!("run {id} --engine interp --seed {s}")).unwrap()).to_vec();
        assert_ne!(seeds[0], seeds[1], "{id}: seeds 0 and 1 give the same checksum");
    }
    // The default seed is 0.
    assert_eq!(
        run_checksum("run add.f16 --engine interp").unwrap(),
        run_checksum("run add.f16 --engine interp --seed 0").unwrap()
    );
}

#[test]
fn run_through_nvrtc_prints_the_interpreters_checksum() {
    let Some(_) = ruda_codegen_nvrtc::nvrtc_or_skip("run_through_nvrtc").expect("nvrtc policy") else { return };
    // NVRTC takes seconds per large kernel: the small ones.
    for id in ["add.f16", "rms_norm.bf16.h1024", "rope.f16.d64"] {
        let want = run_checksum(&format!("run {id} --engine interp --seed 5")).unwrap();
        let got = run_checksum(&format!("run {id} --engine ptx-emu --compiler nvrtc --target sm_80 --seed 5")).unwrap();
        assert_eq!(got, want, "{id}: ptx-emu (NVRTC PTX) against interp");
    }
}

#[test]
fn every_registered_configuration_has_a_sample_problem() {
    let mut sampler = ruda_ops::sample::Sampler::default();
    for r in ruda_ops::registry::registry() {
        let kernel = r.build().unwrap_or_else(|e| panic!("`{}`: {e}", r.id));
        let p = sampler.problem(Some((r.family, &r.id)), &kernel, 0).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.args.len(), kernel.params.len(), "{}", r.id);
    }
    let kernel = ruda_ops::registry::find("add.f32").unwrap().build().unwrap();
    let e = ruda_ops::sample::sample_problem("no_such_family", "x.f32", &kernel, 0).unwrap_err();
    assert!(e.contains("no_such_family") && e.contains("x.f32"), "{e}");
}

/// A scratch folder for one test.
fn scratch(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rudac-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn run_with_input_files_and_scalars() {
    use ruda_ops::sample::{checksum, sample_problem, SampleArg, BUFFER_BYTES};
    let dir = scratch("inputs");
    // `b` of add.f32 replaced by 0, 1, 2, ...: the checksum must be that of the same problem
    // run here.
    let b: Vec<u8> = (0..BUFFER_BYTES / 4).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let file = dir.join("b.bin");
    std::fs::write(&file, &b).unwrap();
    let given = run_checksum(&format!("run add.f32 --engine interp --seed 2 --input b={}", file.display())).unwrap();
    let default = run_checksum("run add.f32 --engine interp --seed 2").unwrap();
    assert_ne!(given, default, "--input b changed nothing");
    let emu = run_checksum(&format!("run add.f32 --engine ptx-emu --seed 2 --input b={}", file.display())).unwrap();
    assert_eq!(emu, given);

    let mut kernel = ruda_ops::registry::find("add.f32").unwrap().build().unwrap();
    let mut p = sample_problem("elementwise", "add.f32", &kernel, 2).unwrap();
    for a in &mut p.args {
        if let SampleArg::Buffer { name, bytes, .. } = a {
            if name == "b" {
                bytes.clone_from(&b);
            }
        }
    }
    ruda_ir::passes::optimize(&mut kernel).unwrap();
    let bufs = p.run_with(|args| ruda_ir::interp::run(&kernel, &p.launch, args)).unwrap();
    assert_eq!(checksum(&bufs), given);

    // A scalar: `n` (700 by default) in decimal and in hex.
    let n5 = run_checksum("run add.f32 --engine interp --seed 2 --input n=5").unwrap();
    assert_ne!(n5, default);
    assert_eq!(run_checksum("run add.f32 --engine interp --seed 2 --input n=0x5").unwrap(), n5);
    assert_eq!(run_checksum("run add.f32 --engine interp --seed 2 --input n=700").unwrap(), default);

    let short = dir.join("short.bin");
    std::fs::write(&short, [0u8; 12]).unwrap();
    for (cmd, why) in [
        (format!("run add.f32 --engine interp --input b={}", short.display()), "takes exactly 262144 bytes"),
        (format!("run add.f32 --engine interp --input b={}", dir.join("none.bin").display()), "none.bin"),
        ("run add.f32 --engine interp --input zz=1".into(), "no parameter `zz` (its parameters: a, b, out, n)"),
        ("run add.f32 --engine interp --input n=-1".into(), "out of range for u32"),
        ("run add.f32 --engine interp --input n=1.5".into(), "not an integer"),
        ("run add.f32 --engine interp --input n=0x100000000".into(), "does not fit in u32"),
        ("run add.f32 --engine interp --input n=1 --input n=2".into(), "given twice"),
        ("run add.f32 --engine interp --input n".into(), "NAME=FILE or NAME=VALUE"),
    ] {
        let e = output(&cmd).unwrap_err();
        assert!(e.contains(why), "{cmd}: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_a_text_ir_file() {
    let dir = scratch("file");
    let path = dir.join("twice.rir");
    std::fs::write(
        &path,
        "kernel @twice(%0 x: ptr<global,f32>) {\n  %1: u32 = special tid.x\n  %2: ptr<global,f32> = ptradd %0, %1\n  %3: f32 = load %2\n  %4: f32 = add %3, %3\n  store %2, %4\n}\n",
    )
    .unwrap();
    let interp = run_checksum(&format!("run --file {} --engine interp", path.display())).unwrap();
    let emu = run_checksum(&format!("run --file {} --engine ptx-emu --target sm_80", path.display())).unwrap();
    assert_eq!(interp, emu);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_errors() {
    for (cmd, why) in [
        ("run no.such.kernel --engine interp", "rudac list"),
        ("run add.f32", "--engine <ENGINE>"),
        ("run add.f32 --engine gpu", "invalid value 'gpu' for '--engine <ENGINE>'"),
        ("run add.f32 --engine interp --target sm_80", "--target applies to --engine ptx-emu only"),
        ("run add.f32 --engine cuda --target sm_80", "picks the device's target"),
        ("run add.f32 --engine interp --compiler nvrtc", "--compiler does not apply"),
        ("run add.f32 --engine ptx-emu --compiler cuda", "accepted values"),
        ("run add.f32 --engine interp --seed -1", "invalid value '-1' for '--seed <N>'"),
        ("run --file /nonexistent/k.rir --engine interp", "/nonexistent/k.rir"),
        ("run --engine interp", "<ID|--file <F.rir>>"),
    ] {
        let e = output(cmd).unwrap_err();
        assert!(e.contains(why), "{cmd}: {e}");
    }
}

#[test]
fn run_on_cuda_needs_a_gpu() {
    let out = rudac("", "run add.f32 --engine cuda");
    if ruda_runtime::probe_driver().is_ok() {
        // A GPU machine: the line, with an informational checksum.
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("checksum="));
        return;
    }
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--engine cuda needs a CUDA GPU") && err.contains("CUDA device 0"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // The binary prints the line on stdout for the engines that run anywhere.
    let out = rudac("", "run add.f32 --engine interp");
    assert!(out.status.success());
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(line.starts_with("checksum=") && line.contains(" time_ms=") && line.ends_with('\n'), "{line}");
}
