//! Sampling one token per row with temperature, top-k, top-p and min-p, reproducibly per seed (the
//! algorithm is documented in [`kernel`]). Entry points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::{f32_bits, Case};
use crate::registry::Registered;
use kernel::{sampling, SamplingConfig};

/// Sampling in every float dtype (family `sampling`).
pub struct Sampling;

impl Family for Sampling {
    fn names(&self) -> &'static [&'static str] {
        &["sampling"]
    }

    fn configs(&self) -> Vec<Registered> {
        FLOAT_DTYPES
            .into_iter()
            .map(|dtype| {
                let cfg = SamplingConfig { dtype };
                Registered::new(cfg.id(), "sampling", Some(dtype), move || sampling(&cfg))
            })
            .collect()
    }

    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([3, 1, 1]);
        c.scalars.extend([
            ("cols", 700),
            ("scale", f32_bits(1.4)),
            ("top_k", 50),
            ("top_p", f32_bits(0.9)),
            ("seed", 1234),
            ("min_p", f32_bits(0.05)),
        ]);
        Some(c)
    }
}
