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
//! - [`api`]: the plans and the entry points.

pub mod api;
pub mod kernel;
