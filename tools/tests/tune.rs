//! `rudac tune`: its command line, and the binary on the CPU device (where autotuning is off,
//! so a shapes file is only checked) with the caches it shows.

use ruda_ops::tune::{tune_gemv_with, TuneCommand};
use ruda_runtime::{AutotuneMode, Autotuner, Device, DeviceFingerprint, Tensor};
use ruda_tools::driver::Command;

/// A fresh scratch folder for one test.
fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ruda-tools-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// A made-up H200, so that a cache written for a GPU can be shown from a machine without one.
fn fingerprint() -> DeviceFingerprint {
    DeviceFingerprint {
        device_name: "NVIDIA H200".into(),
        compute_capability: (9, 0),
        driver_version: "12.9".into(),
        compiler: "ptx".into(),
        compiler_version: "ruda-codegen-ptx 0.1.0".into(),
    }
}

/// GEMV operands `x [m, k]` and `w [n, k]`.
fn operands(dev: &Device, m: usize, n: usize, k: usize) -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..m * k).map(|i| ((i % 7) as f32 - 3.0) * 0.25).collect();
    let w: Vec<f32> = (0..n * k).map(|i| ((i % 5) as f32 - 2.0) * 0.5).collect();
    (Tensor::from_slice(dev, &x, &[m, k]).unwrap(), Tensor::from_slice(dev, &w, &[n, k]).unwrap())
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

#[test]
fn rudac_tune_parses() {
    assert_eq!(Command::parse(args("tune --shapes s.txt")), Ok(Command::Tune(TuneCommand::Shapes("s.txt".into()))));
    assert_eq!(Command::parse(args("tune --shapes=s.txt")), Ok(Command::Tune(TuneCommand::Shapes("s.txt".into()))));
    assert_eq!(Command::parse(args("tune --show")), Ok(Command::Tune(TuneCommand::Show)));
    for bad in ["tune", "tune --show --shapes s.txt", "tune extra --show", "tune --shapes", "tune --json"] {
        assert!(Command::parse(args(bad)).is_err(), "{bad}");
    }
}

fn rudac(cache: &std::path::Path, cmd: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_rudac"))
        .args(cmd)
        .env("RUDA_DEVICE", "cpu")
        .env("RUDA_CACHE_DIR", cache)
        .env_remove("RUDA_AUTOTUNE")
        .output()
        .expect("rudac runs")
}

#[test]
fn rudac_tune_on_the_cpu_checks_the_file_and_shows_caches() {
    let dir = temp_dir("tune-rudac");
    let good = dir.join("good.txt");
    std::fs::write(&good, "gemv bf16 m=1 n=4096 k=4096\ngemv f32 m=4 n=64 k=64\n").unwrap();
    let out = rudac(&dir, &["tune", "--shapes", good.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("autotuning is off on the CPU device: 2 shape(s)"), "{stdout}");

    let bad = dir.join("bad.txt");
    std::fs::write(&bad, "gemv bf16 m=1 n=8 k=8\ngemv bf16 m=1 n=8\n").unwrap();
    let out = rudac(&dir, &["tune", "--shapes", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.txt:2: missing `k=`"), "{stderr}");

    let out = rudac(&dir, &["tune", "--show"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no autotune cache files in"));
    // A cache written for a GPU, shown from a machine without one.
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    let dev = Device::cpu();
    let (x, w) = operands(&dev, 1, 8, 1024);
    tune_gemv_with(&tuner, &dev, &x, &w, |s| Ok(s as f64)).unwrap();
    let out = rudac(&dir, &["tune", "--show"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(stdout.contains("NVIDIA H200 (compute capability 9.0, driver CUDA 12.9"), "{stdout}");
    assert!(stdout.contains("gemv f32 1x8x1024 align16: best splits=1"), "{stdout}");
}

#[test]
fn rudac_tune_on_the_cpu_checks_attention_decode_lines() {
    let dir = temp_dir("tune-attention-rudac");
    let file = dir.join("shapes.txt");
    std::fs::write(
        &file,
        "attention_decode bf16 batch=1 q_heads=16 kv_heads=8 head_dim=128 s_max=4096\ngemv bf16 m=1 n=8 k=8\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rudac"))
        .args(["tune", "--shapes", file.to_str().unwrap()])
        .env("RUDA_DEVICE", "cpu")
        .env("RUDA_CACHE_DIR", &dir)
        .env_remove("RUDA_AUTOTUNE")
        .output()
        .expect("rudac runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("autotuning is off on the CPU device: 2 shape(s)"), "{stdout}");
}
