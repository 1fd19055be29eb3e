//! RMSNorm fused with the residual add before it, and RMSNorm alone, in Hugging Face's order of
//! roundings (`Qwen2RMSNorm`). Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::{Registered, NORM_HIDDEN_SIZES};
use kernel::{rms_norm_residual, FusedNormConfig};

/// The residual-fused RMSNorm at the Qwen hidden sizes (family `rms_norm_residual`), and
/// RMSNorm alone in the same rounding order (family `rms_norm_hf`) at Qwen3's per-head q/k norm
/// sizes (64, 128) and a first layer's input norm.
pub struct FusedNorm;

impl Family for FusedNorm {
    fn names(&self) -> &'static [&'static str] {
        &["rms_norm_residual", "rms_norm_hf"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            for hidden in NORM_HIDDEN_SIZES {
                let cfg = FusedNormConfig { dtype, hidden, residual: true };
                out.push(Registered::new(cfg.id(), "rms_norm_residual", Some(dtype), move || rms_norm_residual(&cfg)));
            }
            for hidden in [64, 128, 896, 1024] {
                let cfg = FusedNormConfig { dtype, hidden, residual: false };
                out.push(Registered::new(cfg.id(), "rms_norm_hf", Some(dtype), move || rms_norm_residual(&cfg)));
            }
        }
        out
    }

    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        Some(Case::new([3, 1, 1]))
    }
}
