//! The roofline bound of one launch: the least time its DRAM traffic and its arithmetic need on
//! a GPU, whichever is longer.

use std::fmt;

use super::gpu::Gpu;

/// Which units do a kernel's arithmetic, so which peak applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Units {
    /// FP32 on the CUDA cores.
    Fp32,
    /// FP16/BF16 tensor cores through `mma.sync`, the instruction our kernels use on sm_80 to
    /// sm_90 (Hopper's faster `wgmma` is not emitted yet, so its peak does not apply).
    TensorCore,
}

/// Which of the two times is the longer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// DRAM bandwidth (ties count as memory: the arithmetic then hides under the traffic).
    Memory,
    /// The arithmetic units' peak.
    Compute,
}

/// A launch on the roofline.
#[derive(Clone, Debug, PartialEq)]
pub struct Roofline {
    /// `max(memory_us, compute_us)`: the launch cannot finish sooner.
    pub roofline_us: f64,
    /// Flops per DRAM byte; infinite when the launch moves no DRAM bytes but computes.
    pub intensity: f64,
    pub bound: Bound,
    /// The peak of the units used, flops per second.
    pub peak_flops: f64,
    /// DRAM bytes at full bandwidth, in microseconds.
    pub memory_us: f64,
    /// Flops at the peak, in microseconds.
    pub compute_us: f64,
    /// The intensity at which the two times are equal (peak / bandwidth): kernels below it are
    /// memory bound.
    pub ridge_intensity: f64,
}

impl Units {
    /// The peak of these units on `gpu`, flops per second.
    pub fn peak_flops(self, gpu: &Gpu) -> f64 {
        match self {
            Units::Fp32 => gpu.fp32_flops,
            Units::TensorCore => gpu.fp16_mma_sync_flops,
        }
    }
}

/// The roofline of a launch that moves `dram_bytes` to or from DRAM and does `flops` on `units`.
pub fn roofline(gpu: &Gpu, dram_bytes: u64, flops: u64, units: Units) -> Roofline {
    let peak_flops = units.peak_flops(gpu);
    let memory_us = dram_bytes as f64 / gpu.dram_bytes_per_s * 1e6;
    let compute_us = flops as f64 / peak_flops * 1e6;
    let intensity = match (flops, dram_bytes) {
        (0, _) => 0.0,
        (_, 0) => f64::INFINITY,
        (f, b) => f as f64 / b as f64,
    };
    let bound = if compute_us > memory_us { Bound::Compute } else { Bound::Memory };
    Roofline {
        roofline_us: memory_us.max(compute_us),
        intensity,
        bound,
        peak_flops,
        memory_us,
        compute_us,
        ridge_intensity: peak_flops / gpu.dram_bytes_per_s,
    }
}

impl fmt::Display for Units {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Units::Fp32 => "fp32",
            Units::TensorCore => "tensor-core",
        })
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Bound::Memory => "memory",
            Bound::Compute => "compute",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::gpu::gpu;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn a_decode_gemv_is_memory_bound() {
        // y = W x with W 4096 x 4096 bf16 on an H200: 33,554,432 weight bytes (x and y are
        // noise next to them: 8 KiB each) and 2 x 4096 x 4096 = 33,554,432 flops, 1 flop/byte.
        // Memory: 33,554,432 B / 4.8e12 B/s = 6.990507 us; compute on FP32: 33,554,432 /
        // 66.9e12 = 0.501561 us.
        let h200 = gpu("h200").unwrap();
        let r = roofline(h200, 33_554_432, 33_554_432, Units::Fp32);
        assert_eq!(r.bound, Bound::Memory);
        assert!(close(r.intensity, 1.0));
        assert!((r.roofline_us - 6.990507).abs() < 1e-6, "{r:?}");
        assert!((r.compute_us - 0.501561).abs() < 1e-6, "{r:?}");
        // The ridge: 66.9e12 / 4.8e12 = 13.9375 flops per byte.
        assert!(close(r.ridge_intensity, 13.9375));
    }

    #[test]
    fn a_large_gemm_is_compute_bound_and_hopper_mma_sync_is_slower_than_wgmma() {
        // 4096^3 f16 GEMM: 2 x 4096^3 = 137,438,953,472 flops over A, B and C once each,
        // 3 x 4096^2 x 2 = 100,663,296 bytes: intensity 1365.33 flops/byte.
        let (flops, bytes) = (137_438_953_472, 100_663_296);
        // A100, tensor cores: 137,438,953,472 / 312e12 = 440.5095 us; memory 100,663,296 /
        // 2.039e12 = 49.3689 us.
        let a100 = roofline(gpu("a100").unwrap(), bytes, flops, Units::TensorCore);
        assert_eq!(a100.bound, Bound::Compute);
        assert!((a100.intensity - 1365.3333).abs() < 1e-3);
        assert!((a100.roofline_us - 440.5095).abs() < 1e-3, "{a100:?}");
        assert!((a100.memory_us - 49.3689).abs() < 1e-3, "{a100:?}");
        // H100 SXM through mma.sync at 494.7e12: 277.8228 us (wgmma's 989.4e12 would halve it).
        let h100 = roofline(gpu("h100-sxm").unwrap(), bytes, flops, Units::TensorCore);
        assert!(close(h100.peak_flops, 494.7e12));
        assert!((h100.roofline_us - 277.8228).abs() < 1e-3, "{h100:?}");
    }

    #[test]
    fn ties_and_empty_launches() {
        // A100 FP32: 2,039,000 bytes take 1 us, and so do 19,500,000 flops: a tie is memory.
        let r = roofline(gpu("a100").unwrap(), 2_039_000, 19_500_000, Units::Fp32);
        assert_eq!(r.bound, Bound::Memory);
        assert!(close(r.roofline_us, 1.0) && close(r.compute_us, 1.0));
        let none = roofline(gpu("a100").unwrap(), 0, 0, Units::Fp32);
        assert_eq!((none.roofline_us, none.intensity, none.bound), (0.0, 0.0, Bound::Memory));
        let no_bytes = roofline(gpu("a100").unwrap(), 0, 19_500_000, Units::Fp32);
        assert_eq!((no_bytes.intensity, no_bytes.bound), (f64::INFINITY, Bound::Compute));
        assert_eq!(
            (Bound::Compute.to_string(), Units::TensorCore.to_string()),
            ("compute".into(), "tensor-core".into())
        );
    }
}
