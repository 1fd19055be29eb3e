//! RMSNorm in transformers' rounding order, alone or fused with the residual add before it.

use ruda_ops::api::{self, OpError};
use ruda_runtime::{Stream, Tensor};

use super::{ExpectedTensor, Loader, WeightDType};
use crate::error::LlmError;

/// `{prefix}.weight [size]`, held in f32.
#[derive(Clone, Debug)]
pub struct RmsNormSpec {
    pub weight: ExpectedTensor,
    pub eps: f32,
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
        }
    }

    pub fn load(&self, ld: &Loader) -> Result<RmsNorm, LlmError> {
        Ok(RmsNorm { weight: ld.tensor(&self.weight)?, eps: self.eps })
    }
}

pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// `out = rms_norm(x)` over the last dimension of `[rows, size]`.
    pub fn forward(&self, s: &Stream, x: &Tensor, out: &Tensor) -> Result<(), OpError> {
        api::rms_norm_hf_into(s, x, &self.weight, self.eps, out)
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
        api::rms_norm_residual_into(s, x, residual, &self.weight, self.eps, out, residual_out)
    }
}
