//! The `rudac` driver: argument parsing and the output of each command.

use ruda_codegen_ptx::Arch;
use ruda_ops::driver::{run, Command, EmitKind, Source};

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn output(cmd: &str) -> Result<(bool, String), String> {
    let command = Command::parse(&args(cmd))?;
    let mut out = Vec::new();
    let ok = run(&command, &mut out)?;
    Ok((ok, String::from_utf8(out).expect("utf-8")))
}

#[test]
fn parses_commands_and_flags() {
    assert_eq!(Command::parse(&args("list --json")), Ok(Command::List { json: true }));
    assert_eq!(
        Command::parse(&args("emit add.f32 --target=sm_80 --emit ir")),
        Ok(Command::Emit {
            source: Source::Id("add.f32".into()),
            arch: Arch::Sm80,
            kind: EmitKind::Ir,
            compiler: None,
            passes: "default".into()
        })
    );
    assert_eq!(
        Command::parse(&args("check --target sm_80,sm_90a")),
        Ok(Command::Check { archs: vec![Arch::Sm80, Arch::Sm90a], compiler: None, passes: "default".into() })
    );
    for bad in ["", "frob", "list extra", "emit", "emit a b", "emit add.f32 --target sm_70", "check --emit ir", "emit x --emit sass", "check --target", "emit add.f32 --passes bogus"] {
        let e = Command::parse(&args(bad)).expect_err(bad);
        assert!(!e.is_empty());
    }
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
