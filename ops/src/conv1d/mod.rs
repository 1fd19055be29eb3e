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
use kernel::{
    causal_conv1d, causal_conv1d_update, causal_conv1d_update_slots, causal_conv1d_varlen, causal_conv1d_varlen_state,
    Conv1dConfig, CONV_WIDTHS,
};

/// The prefill (family `causal_conv1d`) with and without SiLU and an initial state, the decode
/// step (family `causal_conv1d_update`) and the batched decode step over a pool of states
/// (family `causal_conv1d_update_slots`), and the prefill of packed sequences over a pool of
/// states (families `causal_conv1d_varlen` and `causal_conv1d_varlen_state`, its final states),
/// with and without SiLU, at every width W in 2..=4 and every float dtype.
pub struct Conv1d;

impl Family for Conv1d {
    fn names(&self) -> &'static [&'static str] {
        &[
            "causal_conv1d",
            "causal_conv1d_update",
            "causal_conv1d_update_slots",
            "causal_conv1d_varlen",
            "causal_conv1d_varlen_state",
        ]
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
                    out.push(Registered::new(cfg.slots_id(), "causal_conv1d_update_slots", Some(dtype), move || {
                        causal_conv1d_update_slots(&cfg)
                    }));
                    out.push(Registered::new(cfg.varlen_id(), "causal_conv1d_varlen", Some(dtype), move || {
                        causal_conv1d_varlen(&cfg)
                    }));
                }
                let cfg = Conv1dConfig { dtype, width, silu: false, initial_state: true };
                out.push(Registered::new(
                    cfg.varlen_state_id(),
                    "causal_conv1d_varlen_state",
                    Some(dtype),
                    move || causal_conv1d_varlen_state(&cfg),
                ));
            }
        }
        out
    }

    /// Prefill: 300 channels (three blocks, the last partly idle) by 70 tokens (three chunks,
    /// the last partial) on a grid of two chunk rows, so one row loops. Decode: 300 channels.
    /// Batched decode: 300 channels of 4 sequences in slots 5, 0, 9 (out of range: a NaN row)
    /// and 2 of a pool of 6. Packed prefill: below.
    fn sample(&self, name: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([3, 2, 1]);
        c.scalars.insert("channels", 300);
        match name {
            "causal_conv1d" => {
                c.scalars.insert("tokens", 70);
            }
            "causal_conv1d_update_slots" => {
                c.grid = [3, 4, 1];
                c.scalars.insert("slots", 6);
                c.indices.insert("state_slots", vec![5, 0, 9, 2]);
            }
            // Four sequences of 2, 0, 35 and 33 tokens (one shorter than a state, one empty, two
            // across chunks) in slots 4, 1, 9 (out of range) and 0 of a pool of 6.
            "causal_conv1d_varlen" | "causal_conv1d_varlen_state" => {
                c.scalars.extend([("tokens", 70), ("sequences", 4), ("slots", 6)]);
                c.indices.insert("cu_seqlens", vec![0, 2, 2, 37, 70]);
                c.indices.insert("state_slots", vec![4, 1, 9, 0]);
                if name == "causal_conv1d_varlen_state" {
                    c.grid = [3, 4, 1];
                }
            }
            _ => c.grid = [3, 1, 1],
        }
        Some(c)
    }
}
