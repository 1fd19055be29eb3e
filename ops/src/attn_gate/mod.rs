//! Qwen3.5's full-attention output gate: split `q_proj`'s per-head `[query | gate]` halves
//! (`split_heads_halves`) and `attn · sigmoid(gate)` (`sigmoid_gate`). Builders in
//! [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{sigmoid_gate, split_heads_halves, AttnGateConfig};

/// Both ops (families `sigmoid_gate` and `split_heads_halves`) in every float dtype.
pub struct AttnGate;

impl Family for AttnGate {
    fn names(&self) -> &'static [&'static str] {
        &["sigmoid_gate", "split_heads_halves"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            let cfg = AttnGateConfig { dtype };
            out.push(Registered::new(cfg.gate_id(), "sigmoid_gate", Some(dtype), move || sigmoid_gate(&cfg)));
            out.push(Registered::new(cfg.split_id(), "split_heads_halves", Some(dtype), move || {
                split_heads_halves(&cfg)
            }));
        }
        out
    }

    /// 700 elements (three blocks, the last partly idle); the split's rows are 2 · 48 wide, the
    /// gate's 7 rows of 100 are read 200 apart (the second halves of a projection).
    fn sample(&self, name: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([3, 1, 1]);
        c.scalars.insert("n", 700);
        if name == "split_heads_halves" {
            c.scalars.insert("half", 48);
        } else {
            c.scalars.extend([("cols", 100), ("gate_stride", 200)]);
            c.specials = true;
        }
        Some(c)
    }
}
