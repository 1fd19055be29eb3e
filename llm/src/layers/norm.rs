//! RMSNorm in transformers' rounding order, alone or fused with the residual add before it.
//! Qwen3.5's zero-centred RMSNorm (`x̂ · (1 + w)` in f32, rounded once; the residual add before it
//! rounded to the dtype) runs its own kernels, fused with the residual add as the others are.

use ruda_ops::api::{self, OpError};
use ruda_runtime::{Stream, Tensor};

use super::plan::{launch, prefix, DecodeStep, PlannedLaunch};
use super::{ExpectedTensor, Loader, WeightDType};
use crate::error::LlmError;

/// `{prefix}.weight [size]`, held in f32.
#[derive(Clone, Debug)]
pub struct RmsNormSpec {
    pub weight: ExpectedTensor,
    pub eps: f32,
    /// The checkpoint stores `w` of `x̂ · (1 + w)` (Qwen3.5).
    pub zero_centred: bool,
}

impl RmsNormSpec {
    pub fn new(prefix: &str, size: usize, eps: f64) -> RmsNormSpec {
        RmsNormSpec {
            weight: ExpectedTensor {
                name: format!("{prefix}.weight"),
                shape: vec![size],
                dtype: WeightDType::F32,
                required: true,
            },
            eps: eps as f32,
            zero_centred: false,
        }
    }

    /// Qwen3.5's zero-centred norm: `x̂ · (1 + w)` for the stored `{prefix}.weight`.
    pub fn zero_centred(prefix: &str, size: usize, eps: f64) -> RmsNormSpec {
        RmsNormSpec { zero_centred: true, ..RmsNormSpec::new(prefix, size, eps) }
    }

    /// The launch that normalises `rows` rows of a decode step, fused with the residual add
    /// before it (`rms_norm_residual`, two outputs) or alone (`rms_norm_hf`), or their
    /// zero-centred forms.
    pub fn decode_launches(&self, step: &DecodeStep, rows: usize, residual: bool, out: &mut Vec<PlannedLaunch>) {
        let size = self.weight.shape[0];
        let (e, n) = (step.elem(), (rows * size) as u64);
        let gamma = 4 * size as u64;
        let name = prefix(&self.weight.name);
        let (kernel, op, inputs) = match residual {
            true => ("rms_norm_residual", format!("{name} (+ residual)"), 2),
            false => ("rms_norm_hf", name.to_string(), 1),
        };
        let kernel = match self.zero_centred {
            // The row-norm family's ids: `rms_norm_zero_centred[_residual].{dtype}.{warp|block}`.
            true => {
                let owner = if size as u32 <= api::ROW_NORM_WARP_MAX_COLS { "warp" } else { "block" };
                let fused = if residual { "_residual" } else { "" };
                format!("rms_norm_zero_centred{fused}.{}.{owner}", step.dt())
            }
            false => format!("{kernel}.{}.h{size}", step.dt()),
        };
        out.push(PlannedLaunch {
            weight_bytes: gamma,
            ..launch(op, kernel, format!("[{rows}, {size}]"), inputs * n * e + gamma, inputs * n * e, 4 * n)
        });
    }

    pub fn load(&self, ld: &Loader) -> Result<RmsNorm, LlmError> {
        Ok(RmsNorm { weight: ld.tensor(&self.weight)?, eps: self.eps, zero_centred: self.zero_centred })
    }
}

pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
    /// `x̂ · (1 + weight)` (Qwen3.5).
    zero_centred: bool,
}

impl RmsNorm {
    /// `out = rms_norm(x)` over the last dimension of `[rows, size]`.
    pub fn forward(&self, s: &Stream, x: &Tensor, out: &Tensor) -> Result<(), OpError> {
        match self.zero_centred {
            true => api::rms_norm_zero_centred_into(s, x, &self.weight, self.eps, out),
            false => api::rms_norm_hf_into(s, x, &self.weight, self.eps, out),
        }
    }

    /// `residual_out = x + residual; out = rms_norm(residual_out)`.
    pub fn forward_residual(
        &self,
        s: &Stream,
        x: &Tensor,
        residual: &Tensor,
        out: &Tensor,
        residual_out: &Tensor,
    ) -> Result<(), OpError> {
        match self.zero_centred {
            true => api::rms_norm_zero_centred_residual_into(s, x, residual, &self.weight, self.eps, out, residual_out),
            false => api::rms_norm_residual_into(s, x, residual, &self.weight, self.eps, out, residual_out),
        }
    }
}
