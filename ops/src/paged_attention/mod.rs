//! Paged attention over physical KV pages.

pub mod mla;
mod mla_kernel;
