//! RMSNorm in transformers' rounding order, alone or fused with the residual add before it.
//! Qwen3.5's zero-centred RMSNorm (`x̂ · (1 + w)`, in f32 and rounded once) is `rms_norm` (one
//! rounding, after the gamma) with the gamma `1 + w` made in f32 at load as transformers makes it
//! (`1.0 + weight.float()`), after the residual add rounded to the dtype: transformers' rounding
//! order. (The fused residual kernel rounds `x̂` before the gamma, as `Qwen2RMSNorm` does.)

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

    /// The launches that normalise `rows` rows of a decode step, with the residual add before
    /// them: fused (`rms_norm_residual`, two outputs), or for a zero-centred norm `add` then
    /// `rms_norm`; without it `rms_norm_hf` (`rms_norm` when zero-centred).
    pub fn decode_launches(&self, step: &DecodeStep, rows: usize, residual: bool, out: &mut Vec<PlannedLaunch>) {
        let size = self.weight.shape[0];
        let (e, n) = (step.elem(), (rows * size) as u64);
        let gamma = 4 * size as u64;
        let name = prefix(&self.weight.name);
        let (kernel, op, inputs) = match (residual, self.zero_centred) {
            (true, false) => ("rms_norm_residual", format!("{name} (+ residual)"), 2),
            (false, false) => ("rms_norm_hf", name.to_string(), 1),
            (true, true) => {
                let shape = format!("[{rows}, {size}]");
                out.push(launch(
                    format!("{name} (residual add)"),
                    format!("add.{}", step.dt()),
                    shape,
                    2 * n * e,
                    n * e,
                    n,
                ));
                ("rms_norm", name.to_string(), 1)
            }
            (false, true) => ("rms_norm", name.to_string(), 1),
        };
        out.push(PlannedLaunch {
            weight_bytes: gamma,
            ..launch(
                op,
                format!("{kernel}.{}.h{size}", step.dt()),
                format!("[{rows}, {size}]"),
                inputs * n * e + gamma,
                inputs * n * e,
                4 * n,
            )
        });
    }

    pub fn load(&self, ld: &Loader) -> Result<RmsNorm, LlmError> {
        let weight = ld.tensor(&self.weight)?;
        if !self.zero_centred {
            return Ok(RmsNorm { weight, eps: self.eps, zero_centred: false });
        }
        let gamma: Vec<f32> = weight.to_f32_vec()?.iter().map(|w| 1.0 + w).collect();
        Ok(RmsNorm {
            weight: Tensor::from_slice(ld.device, &gamma, weight.shape())?,
            eps: self.eps,
            zero_centred: true,
        })
    }
}

pub struct RmsNorm {
    /// The gamma (`1 + w` when zero-centred).
    weight: Tensor,
    eps: f32,
    /// Rounded once, after the gamma (Qwen3.5).
    zero_centred: bool,
}

impl RmsNorm {
    /// `out = rms_norm(x)` over the last dimension of `[rows, size]`.
    pub fn forward(&self, s: &Stream, x: &Tensor, out: &Tensor) -> Result<(), OpError> {
        match self.zero_centred {
            true => api::rms_norm_into(s, x, &self.weight, self.eps, out),
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
        if self.zero_centred {
            api::add_into(s, x, residual, residual_out)?;
            return api::rms_norm_into(s, residual_out, &self.weight, self.eps, out);
        }
        api::rms_norm_residual_into(s, x, residual, &self.weight, self.eps, out, residual_out)
    }
}
