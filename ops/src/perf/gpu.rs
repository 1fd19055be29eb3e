//! The peaks of the GPUs a roofline is drawn for, from NVIDIA's datasheets and whitepapers (the
//! `source` of each entry names them). Dense figures throughout: the datasheets' tensor-core
//! numbers "with sparsity" are twice the dense rate and apply only to 2:4 sparse operands.

use ruda_codegen_ptx::Arch;

/// One GPU's peaks, at its boost clock with every SM busy.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpu {
    /// The name `--gpu` takes, e.g. `a100`.
    pub name: &'static str,
    /// The product, for reports.
    pub label: &'static str,
    /// The architecture its kernels are compiled for.
    pub arch: Arch,
    /// DRAM (HBM) bandwidth in bytes per second.
    pub dram_bytes_per_s: f64,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// FP32 on the CUDA cores (no tensor cores), flops per second (an FMA is two).
    pub fp32_flops: f64,
    /// Dense FP16/BF16 tensor-core rate through warp-level `mma.sync`, flops per second.
    pub fp16_mma_sync_flops: f64,
    /// Dense FP16/BF16 rate through Hopper's warpgroup `wgmma`; `None` where there is none.
    pub fp16_wgmma_flops: Option<f64>,
    /// Where each number comes from.
    pub source: &'static str,
}

const TERA: f64 = 1e12;

/// The GPUs `--gpu` knows.
pub const GPUS: &[Gpu] = &[
    Gpu {
        name: "a100",
        label: "NVIDIA A100 SXM4 80GB",
        arch: Arch::Sm80,
        // Datasheet (A100 80GB SXM): "GPU Memory Bandwidth 2,039 GB/s".
        dram_bytes_per_s: 2039e9,
        // Whitepaper: the A100 product has 108 SMs enabled (of GA100's 128).
        sms: 108,
        // Datasheet: "FP32 19.5 TFLOPS".
        fp32_flops: 19.5 * TERA,
        // Datasheet: "BFLOAT16/FP16 Tensor Core 312 TFLOPS | 624 TFLOPS*" (* with sparsity).
        // Ampere has no wgmma: mma.sync is the full tensor-core rate.
        fp16_mma_sync_flops: 312.0 * TERA,
        fp16_wgmma_flops: None,
        source: "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM: 2,039 GB/s, FP32 19.5 TFLOPS, \
                 FP16/BF16 tensor 312 TFLOPS dense); NVIDIA A100 Tensor Core GPU Architecture whitepaper \
                 (108 SMs)",
    },
    Gpu {
        name: "h100-sxm",
        label: "NVIDIA H100 SXM5 80GB",
        arch: Arch::Sm90,
        // Datasheet (H100 SXM): "GPU Memory Bandwidth 3.35TB/s".
        dram_bytes_per_s: 3.35 * TERA,
        // Whitepaper: H100 SXM5 has 132 SMs enabled (of GH100's 144).
        sms: 132,
        // Whitepaper, H100 SXM5 column: "Peak FP32 TFLOPS 66.9" (the datasheet rounds to 67).
        fp32_flops: 66.9 * TERA,
        // See `HOPPER_MMA_SYNC`: mma.sync issues at half of wgmma's rate.
        fp16_mma_sync_flops: HOPPER_MMA_SYNC_FRACTION * 989.4 * TERA,
        // Whitepaper, H100 SXM5: "Peak FP16 Tensor TFLOPS with FP32 Accumulate 989.4/1978.9"
        // (dense/sparse; the datasheet's "1,979 teraFLOPS" is the sparse figure).
        fp16_wgmma_flops: Some(989.4 * TERA),
        source: "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 3.35 TB/s); NVIDIA H100 Tensor Core GPU \
                 Architecture whitepaper (H100 SXM5: 132 SMs, FP32 66.9 TFLOPS, FP16 tensor 989.4 TFLOPS \
                 dense through wgmma); mma.sync at half the wgmma rate (see HOPPER_MMA_SYNC_FRACTION)",
    },
    Gpu {
        name: "h200",
        label: "NVIDIA H200 SXM 141GB",
        arch: Arch::Sm90,
        // Datasheet (H200 SXM): "GPU Memory Bandwidth 4.8TB/s".
        dram_bytes_per_s: 4.8 * TERA,
        // The same GH100 configuration as H100 SXM5 (the datasheet's compute figures are H100
        // SXM's: FP32 67 TFLOPS, FP16/BF16 tensor 1,979 TFLOPS with sparsity).
        sms: 132,
        fp32_flops: 66.9 * TERA,
        fp16_mma_sync_flops: HOPPER_MMA_SYNC_FRACTION * 989.4 * TERA,
        fp16_wgmma_flops: Some(989.4 * TERA),
        source: "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: 4.8 TB/s, FP32 67 TFLOPS, FP16/BF16 tensor \
                 1,979 TFLOPS sparse = 989 dense, the compute of H100 SXM5: 132 SMs); mma.sync at half the \
                 wgmma rate (see HOPPER_MMA_SYNC_FRACTION)",
    },
];

/// Hopper's `mma.sync` rate as a fraction of its `wgmma` rate. The datasheets quote only the
/// `wgmma` figure. Assumption, derived: an A100 SM does 1,024 dense FP16 FMAs per clock
/// (312 TFLOPS / (108 SMs x 1.41 GHz x 2)), a Hopper SM 2,048 through `wgmma`
/// (989.4 TFLOPS / (132 SMs x 1.83 GHz x 2)); warp-level `mma.sync` is taken to issue at the
/// Ampere rate per SM, half of `wgmma`'s.
pub const HOPPER_MMA_SYNC_FRACTION: f64 = 0.5;

/// The GPU named `name` (`a100`, `h100-sxm`, `h200`); the error lists the known names.
pub fn gpu(name: &str) -> Result<&'static Gpu, String> {
    GPUS.iter().find(|g| g.name == name).ok_or_else(|| {
        let known: Vec<&str> = GPUS.iter().map(|g| g.name).collect();
        format!("unknown GPU `{name}` (known: {})", known.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_gpus_up_by_name() {
        let h200 = gpu("h200").expect("h200 is known");
        assert_eq!(h200.arch, Arch::Sm90);
        assert_eq!(h200.sms, 132);
        assert_eq!(h200.dram_bytes_per_s, 4.8e12);
        assert_eq!(gpu("a100").expect("a100 is known").fp16_wgmma_flops, None);
        let err = gpu("v100").expect_err("v100 is not in the table");
        assert_eq!(err, "unknown GPU `v100` (known: a100, h100-sxm, h200)");
    }

    #[test]
    fn peaks_agree_with_the_per_sm_rates() {
        // A100: 108 SMs x 1,024 dense FP16 FMAs per clock x 2 flops x 1.41 GHz = 311.9 TFLOPS,
        // and 108 SMs x 64 FP32 FMAs x 2 x 1.41 GHz = 19.5 TFLOPS.
        let a100 = gpu("a100").unwrap();
        assert!((a100.fp16_mma_sync_flops - 108.0 * 1024.0 * 2.0 * 1.41e9).abs() < 0.5e12);
        assert!((a100.fp32_flops - 108.0 * 64.0 * 2.0 * 1.41e9).abs() < 0.1e12);
        // H100 SXM5: 132 SMs x 2,048 FMAs x 2 x 1.83 GHz = 989.4 TFLOPS through wgmma, half of
        // it through mma.sync; FP32: 132 x 128 x 2 x 1.98 GHz = 66.9 TFLOPS (the clocks the
        // whitepaper's two figures imply).
        let h100 = gpu("h100-sxm").unwrap();
        let wgmma = h100.fp16_wgmma_flops.unwrap();
        assert!((wgmma - 132.0 * 2048.0 * 2.0 * 1.83e9).abs() < 0.5e12);
        assert_eq!(h100.fp16_mma_sync_flops, wgmma / 2.0);
        assert!((h100.fp32_flops - 132.0 * 128.0 * 2.0 * 1.98e9).abs() < 0.1e12);
        for g in GPUS {
            assert!(g.fp16_mma_sync_flops > g.fp32_flops, "{}: tensor cores beat FP32", g.name);
            assert!(!g.source.is_empty());
        }
    }
}
