//! The `rudac` driver: argument parsing and the output of each command.

use ruda_codegen_ptx::Arch;
use ruda_ops::driver::{run, Command, EmitKind};

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
            id: "add.f32".into(),
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
    let e = output("emit add.f32 --compiler nvrtc").unwrap_err();
    assert!(e.contains("not implemented"), "{e}");
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
