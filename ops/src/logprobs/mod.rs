//! Log-probabilities (log-softmax of the logits) of each row's chosen token and its top tokens,
//! for OpenAI's `logprobs` (the algorithm is documented in [`kernel`]). Entry points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{logprobs, LogprobsConfig};

/// Log-probabilities in every float dtype (family `logprobs`).
pub struct Logprobs;

impl Family for Logprobs {
    fn names(&self) -> &'static [&'static str] {
        &["logprobs"]
    }

    fn configs(&self) -> Vec<Registered> {
        FLOAT_DTYPES
            .into_iter()
            .map(|dtype| {
                let cfg = LogprobsConfig { dtype };
                Registered::new(cfg.id(), "logprobs", Some(dtype), move || logprobs(&cfg))
            })
            .collect()
    }

    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([3, 1, 1]);
        c.scalars.extend([("cols", 700), ("top", 5)]);
        Some(c)
    }
}
