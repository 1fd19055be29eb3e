//! Embedding gather `out[t, :] = table[ids[t], :]` (bits copied; an id past the vocabulary
//! yields zeros). Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{embedding, EmbeddingConfig};

/// The embedding gather in every float dtype, with 16-byte vector copies or scalar ones
/// (family `embedding`).
pub struct Embedding;

impl Family for Embedding {
    fn names(&self) -> &'static [&'static str] {
        &["embedding"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            for vector in [true, false] {
                let cfg = EmbeddingConfig { dtype, vector };
                out.push(Registered::new(cfg.id(), "embedding", Some(dtype), move || embedding(&cfg)));
            }
        }
        out
    }

    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([3, 1, 1]);
        c.scalars.extend([("vocab", 50), ("hidden", 96)]);
        Some(c)
    }
}
