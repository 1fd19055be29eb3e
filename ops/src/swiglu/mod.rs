//! SwiGLU on a fused gate/up projection `[T, 2I]` → `[T, I]`, in `f32` rounded to the dtype.
//! Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{swiglu, SwigluConfig};

/// SwiGLU in every float dtype (family `swiglu`).
pub struct Swiglu;

impl Family for Swiglu {
    fn names(&self) -> &'static [&'static str] {
        &["swiglu"]
    }

    fn configs(&self) -> Vec<Registered> {
        FLOAT_DTYPES
            .into_iter()
            .map(|dtype| {
                let cfg = SwigluConfig { dtype };
                Registered::new(cfg.id(), "swiglu", Some(dtype), move || swiglu(&cfg))
            })
            .collect()
    }

    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([2, 3, 1]);
        c.scalars.extend([("inter", 300), ("rows", 3)]);
        Some(c)
    }
}
