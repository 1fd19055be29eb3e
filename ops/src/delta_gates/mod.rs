//! The gates of the gated delta rule: `beta = sigmoid(b)` and
//! `g = -exp(A_log) · softplus(a + dt_bias)` in `f32`. Builder in [`kernel`], entry points in
//! [`api`].

pub mod api;
pub mod kernel;

use ruda_ir::ScalarType;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{gated_delta_gates, GatesConfig};

/// The gates (family `gated_delta_gates`) in every float dtype, with `A_log` and `dt_bias` in
/// `f32` or in the inputs' dtype.
pub struct DeltaGates;

impl Family for DeltaGates {
    fn names(&self) -> &'static [&'static str] {
        &["gated_delta_gates"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            let mut params = vec![ScalarType::F32];
            if dtype != ScalarType::F32 {
                params.push(dtype);
            }
            for params in params {
                let cfg = GatesConfig { dtype, params };
                out.push(Registered::new(cfg.id(), "gated_delta_gates", Some(dtype), move || gated_delta_gates(&cfg)));
            }
        }
        out
    }

    /// 700 elements of 48 heads (three blocks, the last partly idle); the sample's inputs in
    /// [-2, 2) include the infinities and zeros of the specials.
    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([3, 1, 1]);
        c.scalars.extend([("n", 700), ("heads", 48)]);
        c.specials = true;
        Some(c)
    }
}
