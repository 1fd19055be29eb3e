//! Causal depthwise conv1d with optional SiLU over `[tokens, channels]` (Qwen3.5's gated
//! DeltaNet runs it on the `in_proj_qkv` output): prefill with an optional initial state and
//! the final state out, and the decode step that rolls the state in place. Builders in
//! [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{causal_conv1d, causal_conv1d_update, Conv1dConfig, CONV_WIDTHS};

/// The prefill (family `causal_conv1d`) with and without SiLU and an initial state, and the
/// decode step (family `causal_conv1d_update`) with and without SiLU, at every width W in
/// 2..=4 and every float dtype.
pub struct Conv1d;

impl Family for Conv1d {
    fn names(&self) -> &'static [&'static str] {
        &["causal_conv1d", "causal_conv1d_update"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            for width in CONV_WIDTHS {
                for silu in [true, false] {
                    for initial_state in [true, false] {
                        let cfg = Conv1dConfig { dtype, width, silu, initial_state };
                        let id = cfg.prefill_id();
                        out.push(Registered::new(id, "causal_conv1d", Some(dtype), move || causal_conv1d(&cfg)));
                    }
                    let cfg = Conv1dConfig { dtype, width, silu, initial_state: true };
                    out.push(Registered::new(cfg.update_id(), "causal_conv1d_update", Some(dtype), move || {
                        causal_conv1d_update(&cfg)
                    }));
                }
            }
        }
        out
    }

    /// Prefill: 300 channels (three blocks, the last partly idle) by 70 tokens (three chunks,
    /// the last partial) on a grid of two chunk rows, so one row loops. Decode: 300 channels.
    fn sample(&self, name: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([3, 2, 1]);
        c.scalars.insert("channels", 300);
        if name == "causal_conv1d" {
            c.scalars.insert("tokens", 70);
        } else {
            c.grid = [3, 1, 1];
        }
        Some(c)
    }
}
