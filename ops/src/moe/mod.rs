//! Mixture-of-experts routing: which experts each token goes to, and with what weights.
//!
//! - [`api::route`]: softmax over all experts in `f32`, top-k, optional renormalisation
//!   (Hugging Face's Qwen3-MoE `norm_topk_prob`; Mixtral's softmax over the top k is the
//!   renormalised form);
//! - [`api::route_sigmoid_grouped`]: sigmoid scores, a correction bias for selection only,
//!   group-limited top-k, weights from the original scores (DeepSeek-V3's `noaux_tc`).
//!
//! Both return a [`api::RoutingPlan`] (`u32 [T, top_k]` expert ids, best first, and `[T,
//! top_k]` weights in the logits' dtype); ties go to lower ids; rows with NaN or `+inf`, or only
//! `-inf`, get NaN weights and the indices `0..top_k`. The kernels (one block per token, a
//! thread per expert, selection by rank in shared memory) are documented in [`kernel`].
//! Dispatch, the experts and the combine are not built yet.

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::{f32_bits, Case};
use crate::registry::Registered;
use kernel::{moe_route, moe_route_grouped, GroupedRouteConfig, RouteConfig};

/// The routing kernels in every float dtype: softmax top-k (family `moe_route`) and grouped
/// sigmoid top-k without and with a correction bias (family `moe_route_grouped`).
pub struct Moe;

impl Family for Moe {
    fn names(&self) -> &'static [&'static str] {
        &["moe_route", "moe_route_grouped"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            let cfg = RouteConfig { dtype };
            out.push(Registered::new(cfg.id(), "moe_route", Some(dtype), move || moe_route(&cfg)));
            for bias in [false, true] {
                let cfg = GroupedRouteConfig { dtype, bias };
                out.push(Registered::new(cfg.id(), "moe_route_grouped", Some(dtype), move || moe_route_grouped(&cfg)));
            }
        }
        out
    }

    fn sample(&self, name: &str, _: &str) -> Option<Case> {
        // Three tokens; 60 experts (Qwen1.5-MoE's count: not a multiple of a warp) top-8, or
        // 64 experts in 8 groups, 3 kept, top-6 (DeepSeek-V3's rules at a small size).
        let mut c = Case::new([3, 1, 1]);
        if name == "moe_route" {
            c.scalars.extend([("experts", 60), ("top_k", 8), ("renormalize", 1)]);
        } else {
            c.scalars.extend([
                ("experts", 64),
                ("top_k", 6),
                ("groups", 8),
                ("selected_groups", 3),
                ("group_top_two", 1),
                ("renormalize", 1),
                ("scale", f32_bits(2.5)),
            ]);
        }
        Some(c)
    }
}
