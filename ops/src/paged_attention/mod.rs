//! Attention over a paged KV cache (the layout of vLLM's PagedAttention).
//!
//! The cache of one layer is `key_cache [pages, page_size, Hkv, D]` and `value_cache
//! [pages, page_size, Hkv, Dv]`; a sequence's positions live in the pages of its block table, in
//! order. A step's [`HostPlan`](api::HostPlan) (block tables, lengths after the step, each query's
//! sequence and absolute position) is checked on the host, uploaded once as a
//! [`DevicePlan`](api::DevicePlan) (or updated in place in buffers sized by a
//! [`PlanCapacity`](api::PlanCapacity)), and drives the kernels:
//!
//! - [`kernel`]: `paged_append` (each query's key and value rows to its page slot) and
//!   `paged_gather` (pages to the contiguous `[B, Hkv, S_max, D]` cache of the legacy path);
//! - [`api`]: the plans and the entry points;
//! - [`attention`]: fused paged attention reading the pages directly (`DevicePlan::attention`,
//!   its split form over a [`SplitWorkspace`](attention::SplitWorkspace); kernels in
//!   `attention_kernel`);
//! - [`mla`]: paged MLA over a shared latent cache (kernels in `mla_kernel`).
//!
//! The two fused kernels share their per-tile steps (staging through the block table, the online
//! softmax, the `P · V` accumulation) in `tile`.

pub mod api;
pub mod attention;
mod attention_kernel;
pub mod kernel;
pub mod mla;
mod mla_kernel;
mod tile;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{paged_append, paged_gather, PagedCopyConfig};

/// The paged cache's copy kernels in every float dtype (families `paged_append`, `paged_gather`).
pub struct PagedCopy;

impl Family for PagedCopy {
    fn names(&self) -> &'static [&'static str] {
        &["paged_append", "paged_gather"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            let cfg = PagedCopyConfig { dtype };
            out.push(Registered::new(cfg.append_id(), "paged_append", Some(dtype), move || paged_append(&cfg)));
            out.push(Registered::new(cfg.gather_id(), "paged_gather", Some(dtype), move || paged_gather(&cfg)));
        }
        out
    }

    fn sample(&self, family: &str, _: &str) -> Option<Case> {
        match family {
            // Three queries (slots 0, 1, 2: the default u32 contents) of two heads, D ≠ Dv.
            "paged_append" => {
                let mut c = Case::new([3, 2, 1]);
                c.scalars.extend([("heads", 2), ("dim", 96), ("value_dim", 72)]);
                Some(c)
            }
            // Three sequences of two heads, ragged lengths over pages of 4 (tables 0, 1, 2, ...),
            // `out` two positions longer than the longest.
            "paged_gather" => {
                let mut c = Case::new([5, 6, 1]);
                c.scalars.extend([("page_size", 4), ("table_width", 2), ("heads", 2), ("dim", 40), ("max_length", 7)]);
                c.indices.insert("lengths", vec![5, 3, 4]);
                Some(c)
            }
            _ => None,
        }
    }
}
