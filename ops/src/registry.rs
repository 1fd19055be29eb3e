//! Every registered kernel configuration: what `rudac list` prints, what snapshots cover and
//! what `rudac check` assembles with `ptxas`.

use ruda_codegen_ptx::Arch;
use ruda_ir::{Kernel, ScalarType, VerifyError};

use crate::kernels::*;

/// Targets every SIMT kernel is checked for.
pub const SIMT_TARGETS: [Arch; 4] = [Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90];

/// Hidden sizes of the registered norm configurations (Qwen2.5 0.5B/1.5B/3B/7B, Qwen3 0.6B/8B).
pub const NORM_HIDDEN_SIZES: [u32; 6] = [896, 1024, 1536, 2048, 3584, 4096];

/// A registered kernel configuration.
pub struct Registered {
    /// Stable id such as `rms_norm.bf16.h4096`.
    pub id: String,
    /// The op family (`rms_norm`, `gemm_simt`, ...), for representative snapshots.
    pub family: &'static str,
    /// Targets this configuration is checked for.
    pub targets: Vec<Arch>,
    build: Box<dyn Fn() -> Result<Kernel, VerifyError> + Send + Sync>,
}

impl Registered {
    fn new(
        id: String,
        family: &'static str,
        build: impl Fn() -> Result<Kernel, VerifyError> + Send + Sync + 'static,
    ) -> Registered {
        Registered { id, family, targets: SIMT_TARGETS.to_vec(), build: Box::new(build) }
    }

    /// Build (and verify) the kernel.
    pub fn build(&self) -> Result<Kernel, VerifyError> {
        (self.build)()
    }
}

/// All registered configurations, in a stable order.
pub fn registry() -> Vec<Registered> {
    use ScalarType::{BF16, F16, F32};
    let mut out = Vec::new();
    for op in [ElementwiseOp::Add, ElementwiseOp::Mul, ElementwiseOp::Silu] {
        for dtype in common::FLOAT_DTYPES {
            let cfg = ElementwiseConfig { op, input: dtype, output: dtype };
            out.push(Registered::new(cfg.id(), "elementwise", move || elementwise(&cfg)));
        }
    }
    for (from, to) in [(F32, F16), (F32, BF16), (F16, F32), (BF16, F32), (F16, BF16), (BF16, F16)] {
        let cfg = ElementwiseConfig { op: ElementwiseOp::Cast, input: from, output: to };
        out.push(Registered::new(cfg.id(), "cast", move || elementwise(&cfg)));
    }
    for op in [RowReduceOp::Sum, RowReduceOp::Max] {
        for dtype in common::FLOAT_DTYPES {
            let cfg = RowReduceConfig { op, dtype };
            out.push(Registered::new(cfg.id(), "reduce", move || row_reduce(&cfg)));
        }
    }
    for dtype in common::FLOAT_DTYPES {
        let cfg = SoftmaxConfig { dtype };
        out.push(Registered::new(cfg.id(), "softmax", move || softmax(&cfg)));
    }
    for dtype in common::FLOAT_DTYPES {
        for hidden in NORM_HIDDEN_SIZES {
            let cfg = NormConfig { dtype, hidden, beta: false };
            out.push(Registered::new(cfg.rms_id(), "rms_norm", move || rms_norm(&cfg)));
        }
    }
    for dtype in common::FLOAT_DTYPES {
        for hidden in [1024, 4096] {
            for beta in [true, false] {
                let cfg = NormConfig { dtype, hidden, beta };
                out.push(Registered::new(cfg.layer_id(), "layer_norm", move || layer_norm(&cfg)));
            }
        }
    }
    for dtype in common::FLOAT_DTYPES {
        for b_layout in [BLayout::RowMajor, BLayout::Transposed] {
            let cfg = GemmConfig { dtype, b_layout };
            out.push(Registered::new(cfg.id(), "gemm_simt", move || gemm_simt(&cfg)));
        }
    }
    for cfg in gemm_tc::registered_configs() {
        out.push(Registered::new(cfg.id(), "gemm", move || gemm_tc(&cfg)));
    }
    // Attention: flash prefill (every dtype, common head dim, causal or not; packed with or
    // without mask and bias, or over a KV cache), split-KV decode with its combine, the general
    // path's head dims (f32: the dtypes share its code), and the fallback's f32 masked softmax.
    let variants = [(false, KvSource::Packed), (true, KvSource::Packed), (false, KvSource::Cache)];
    let prefill = |out: &mut Vec<Registered>, dtype, (head_dim, v_head_dim)| {
        for causal in [false, true] {
            for (masked, kv) in variants {
                let cfg = AttentionPrefillConfig { dtype, head_dim, v_head_dim, causal, masked, kv };
                out.push(Registered::new(cfg.id(), "attention_prefill", move || attention_prefill(&cfg)));
            }
        }
    };
    let decode = |out: &mut Vec<Registered>, dtype, (head_dim, v_head_dim)| {
        let cfg = AttentionDecodeConfig { dtype, head_dim, v_head_dim };
        out.push(Registered::new(cfg.id(), "attention_decode", move || attention_decode(&cfg)));
        out.push(Registered::new(cfg.combine_id(), "attention_decode", move || attention_decode_combine(&cfg)));
    };
    for dtype in common::FLOAT_DTYPES {
        for d in attention::FLASH_HEAD_DIMS {
            prefill(&mut out, dtype, (d, d));
        }
    }
    for dtype in common::FLOAT_DTYPES {
        for d in attention::FLASH_HEAD_DIMS {
            decode(&mut out, dtype, (d, d));
        }
    }
    for dims in attention::FLASH_GENERAL_HEAD_DIMS {
        prefill(&mut out, F32, dims);
        decode(&mut out, F32, dims);
    }
    for causal in [false, true] {
        for masked in [false, true] {
            let cfg = AttentionSoftmaxConfig { causal, masked };
            out.push(Registered::new(cfg.id(), "attention_fallback", move || attention_softmax(&cfg)));
        }
    }
    // Decode ops around attention: GEMV for every row tile (vector loads; the scalar-load
    // fallback at 1 and 16 rows), its split-K reduction, RoPE and its KV-cache append at the
    // Qwen head sizes (64, 128, and 256 with a 64-dim partial rotary), the residual-fused RMSNorm,
    // SwiGLU, the embedding gather, argmax (one pass, or split with its reduction) and sampling.
    for dtype in common::FLOAT_DTYPES {
        for m_tile in gemv::GEMV_M_TILES {
            for split_k in [false, true] {
                let cfg = gemv::GemvConfig { dtype, m_tile, loads: gemv::GemvLoads::Vector, split_k, bias: false };
                out.push(Registered::new(cfg.id(), "gemv", move || gemv::gemv(&cfg)));
            }
        }
        for m_tile in [1, 16] {
            let cfg = gemv::GemvConfig { dtype, m_tile, loads: gemv::GemvLoads::Scalar, split_k: false, bias: false };
            out.push(Registered::new(cfg.id(), "gemv", move || gemv::gemv(&cfg)));
        }
        // Decode's biased projections (Qwen2's q/k/v): the bias in the store, or in the reduction.
        let cfg = gemv::GemvConfig { dtype, m_tile: 1, loads: gemv::GemvLoads::Vector, split_k: false, bias: true };
        out.push(Registered::new(cfg.id(), "gemv", move || gemv::gemv(&cfg)));
        for bias in [false, true] {
            let cfg = gemv::GemvReduceConfig { dtype, bias };
            out.push(Registered::new(cfg.id(), "gemv_reduce", move || gemv::gemv_reduce(&cfg)));
        }
    }
    for dtype in common::FLOAT_DTYPES {
        for (head_dim, rotary_dim) in [(64, 64), (128, 128), (256, 64)] {
            let cfg = rope::RopeConfig { dtype, head_dim, rotary_dim };
            out.push(Registered::new(cfg.id(), "rope", move || rope::rope(&cfg)));
            out.push(Registered::new(cfg.kv_cache_id(), "rope_kv_cache", move || rope::rope_kv_cache(&cfg)));
        }
    }
    for dtype in common::FLOAT_DTYPES {
        for hidden in NORM_HIDDEN_SIZES {
            let cfg = fused_norm::FusedNormConfig { dtype, hidden, residual: true };
            out.push(Registered::new(cfg.id(), "rms_norm_residual", move || fused_norm::rms_norm_residual(&cfg)));
        }
        // Qwen3's per-head q/k norms (head dims 64 and 128) and a first layer's input norm.
        for hidden in [64, 128, 896, 1024] {
            let cfg = fused_norm::FusedNormConfig { dtype, hidden, residual: false };
            out.push(Registered::new(cfg.id(), "rms_norm_hf", move || fused_norm::rms_norm_residual(&cfg)));
        }
    }
    for dtype in common::FLOAT_DTYPES {
        let cfg = swiglu::SwigluConfig { dtype };
        out.push(Registered::new(cfg.id(), "swiglu", move || swiglu::swiglu(&cfg)));
        for vector in [true, false] {
            let cfg = embedding::EmbeddingConfig { dtype, vector };
            out.push(Registered::new(cfg.id(), "embedding", move || embedding::embedding(&cfg)));
        }
    }
    for dtype in common::FLOAT_DTYPES {
        for partial in [false, true] {
            let cfg = argmax::ArgmaxConfig { dtype, partial };
            out.push(Registered::new(cfg.id(), "argmax", move || argmax::argmax(&cfg)));
        }
        let cfg = sampling::SamplingConfig { dtype };
        out.push(Registered::new(cfg.id(), "sampling", move || sampling::sampling(&cfg)));
    }
    out.push(Registered::new(argmax::ArgmaxConfig::reduce_id(), "argmax_reduce", argmax::argmax_reduce));
    // Qwen2's projection biases and the repetition penalty.
    for dtype in common::FLOAT_DTYPES {
        for vector in [true, false] {
            let cfg = elementwise::BiasConfig { dtype, vector };
            out.push(Registered::new(cfg.id(), "add_bias", move || elementwise::add_bias(&cfg)));
        }
        let cfg = penalty::PenaltyConfig { dtype };
        out.push(Registered::new(cfg.id(), "repetition_penalty", move || penalty::repetition_penalty(&cfg)));
    }
    // End of the decode ops.
    out
}

/// Find one configuration by id.
pub fn find(id: &str) -> Option<Registered> {
    registry().into_iter().find(|r| r.id == id)
}
