//! RMSNorm and LayerNorm over the last axis: `f32` statistics and affine parameters, output in
//! the input dtype, one block per row; [`fused`] is RMSNorm fused with the residual add. Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod fused;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::{Registered, NORM_HIDDEN_SIZES};
use kernel::{layer_norm, rms_norm, NormConfig};

/// RMSNorm at the Qwen hidden sizes (family `rms_norm`) and LayerNorm with and without `beta`
/// (family `layer_norm`), in every float dtype.
pub struct Norm;

impl Family for Norm {
    fn names(&self) -> &'static [&'static str] {
        &["rms_norm", "layer_norm"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            for hidden in NORM_HIDDEN_SIZES {
                let cfg = NormConfig { dtype, hidden, beta: false };
                out.push(Registered::new(cfg.rms_id(), "rms_norm", Some(dtype), move || rms_norm(&cfg)));
            }
        }
        for dtype in FLOAT_DTYPES {
            for hidden in [1024, 4096] {
                for beta in [true, false] {
                    let cfg = NormConfig { dtype, hidden, beta };
                    out.push(Registered::new(cfg.layer_id(), "layer_norm", Some(dtype), move || layer_norm(&cfg)));
                }
            }
        }
        out
    }

    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        Some(Case::new([3, 1, 1]))
    }
}
