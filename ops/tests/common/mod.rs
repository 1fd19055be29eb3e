//! Shared helpers of the op tests: the device under test, deterministic data, dtype rounding and
//! tolerance checks.

#![allow(dead_code)]

use std::path::PathBuf;

use half::{bf16, f16};
use ruda_runtime::{DType, Device, DeviceFingerprint, Tensor};

/// The device under test: `RUDA_DEVICE` (the interpreter here, a GPU in the GPU rung).
pub fn device() -> Device {
    let d = Device::from_env().expect("RUDA_DEVICE names a usable device");
    if ruda_runtime::require_gpu() {
        assert!(d.is_cuda(), "RUDA_REQUIRE_GPU=1 but the device is {}", d.description());
    }
    d
}

/// SplitMix64: a tiny deterministic generator, so tests need no `rand`.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

pub const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Round an `f32` to `dtype` and back (nearest even), the value the device sees.
pub fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F32 => x,
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        other => panic!("not a float dtype: {other}"),
    }
}

/// Values rounded to `dtype`.
pub fn quantize(dtype: DType, xs: &[f32]) -> Vec<f32> {
    xs.iter().map(|x| round_to(dtype, *x)).collect()
}

/// A tensor of `dtype` holding `xs` rounded to it.
pub fn tensor(device: &Device, dtype: DType, xs: &[f32], shape: &[usize]) -> Tensor {
    let t = match dtype {
        DType::F32 => Tensor::from_slice(device, xs, shape),
        DType::F16 => Tensor::from_slice(device, &xs.iter().map(|x| f16::from_f32(*x)).collect::<Vec<_>>(), shape),
        DType::BF16 => Tensor::from_slice(device, &xs.iter().map(|x| bf16::from_f32(*x)).collect::<Vec<_>>(), shape),
        other => panic!("not a float dtype: {other}"),
    };
    t.expect("tensor upload")
}

/// Relative size of one unit in the last place of `dtype` (machine epsilon).
pub fn epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f32::EPSILON as f64,
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        other => panic!("not a float dtype: {other}"),
    }
}

/// Assert `|got - want| <= abs + rel * |want|` elementwise (NaN must match NaN), naming the
/// first offending index.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], abs: f64, rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: got {g}, want NaN");
            continue;
        }
        let err = (*g as f64 - w).abs();
        let tol = abs + rel * w.abs();
        assert!(err <= tol, "{what}[{i}]: got {g}, want {w} (error {err:.3e} > tolerance {tol:.3e})");
    }
}

/// Assert bit-identical results.
pub fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{what}[{i}]: got {g:e}, want {w:e}");
    }
}

/// `x[m, k] · w[n, k]ᵀ` in f64, and the sum of the products' magnitudes (for the tolerance).
pub fn linear_reference(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut want = vec![0f64; m * n];
    let mut mag = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let prod = x[i * k + p] as f64 * w[j * k + p] as f64;
                want[i * n + j] += prod;
                mag[i * n + j] += prod.abs();
            }
        }
    }
    (want, mag)
}

/// A product over `k` accumulated in f32 (any order), then rounded once to `dtype`.
pub fn check_linear(what: &str, dtype: DType, got: &[f32], want: &[f64], mag: &[f64], k: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for i in 0..got.len() {
        let tol = k as f64 * f32::EPSILON as f64 * mag[i] + epsilon(dtype) * want[i].abs() + 1e-7;
        let err = (got[i] as f64 - want[i]).abs();
        assert!(err <= tol, "{what}[{i}]: got {}, want {} (error {err:.3e} > {tol:.3e})", got[i], want[i]);
    }
}

/// A fresh folder `ruda-ops-<name>-<pid>` under the system temp dir (an autotune cache).
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ruda-ops-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// A made-up H200 for autotuning tests that inject their timings.
pub fn fingerprint() -> DeviceFingerprint {
    DeviceFingerprint {
        device_name: "NVIDIA H200".into(),
        compute_capability: (9, 0),
        driver_version: "12.9".into(),
        compiler: "ptx".into(),
        compiler_version: "ruda-codegen-ptx 0.1.0".into(),
    }
}
