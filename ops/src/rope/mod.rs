//! Rotary position embedding in Hugging Face's rotate-half form, and its fusion with the KV-cache
//! append; `cos`/`sin` from a host-computed table. Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{rope, rope_kv_cache, RopeConfig};

/// RoPE (family `rope`) and its KV-cache append (family `rope_kv_cache`) at the Qwen head
/// sizes: 64, 128, and 256 with a 64-dim partial rotary.
pub struct Rope;

impl Family for Rope {
    fn names(&self) -> &'static [&'static str] {
        &["rope", "rope_kv_cache"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            for (head_dim, rotary_dim) in [(64, 64), (128, 128), (256, 64)] {
                let cfg = RopeConfig { dtype, head_dim, rotary_dim };
                out.push(Registered::new(cfg.id(), "rope", Some(dtype), move || rope(&cfg)));
                out.push(Registered::new(cfg.kv_cache_id(), "rope_kv_cache", Some(dtype), move || rope_kv_cache(&cfg)));
            }
        }
        out
    }

    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([3, 1, 1]);
        c.scalars.extend([("heads", 2), ("n_positions", 64), ("batch", 2), ("max_seq", 64)]);
        Some(c)
    }
}
