//! Repetition penalty over logits, in place (Hugging Face's `RepetitionPenaltyLogitsProcessor`).
//! Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::{f32_bits, Case};
use crate::registry::Registered;
use kernel::{repetition_penalty, PenaltyConfig};

/// The repetition penalty in every float dtype (family `repetition_penalty`).
pub struct Penalty;

impl Family for Penalty {
    fn names(&self) -> &'static [&'static str] {
        &["repetition_penalty"]
    }

    fn configs(&self) -> Vec<Registered> {
        FLOAT_DTYPES
            .into_iter()
            .map(|dtype| {
                let cfg = PenaltyConfig { dtype };
                Registered::new(cfg.id(), "repetition_penalty", Some(dtype), move || repetition_penalty(&cfg))
            })
            .collect()
    }

    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        // Three rows of 300 ids over a vocabulary of 700: every id recurs 160 positions later
        // (within the first tile and across its end), every 11th is past the vocabulary.
        let mut c = Case::new([3, 1, 1]);
        let ids = (0..900u32).map(|i| if i % 11 == 5 { 700 + i } else { (i * 37) % 160 }).collect();
        c.indices.insert("token_ids", ids);
        c.scalars.extend([("vocab", 700), ("n", 300), ("penalty", f32_bits(1.3))]);
        Some(c)
    }
}
