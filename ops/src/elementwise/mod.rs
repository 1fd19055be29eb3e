//! Elementwise ops (`add`, `mul`, `silu`), dtype casts and the bias add: one thread per
//! element (or 16-byte unit for the bias), arithmetic in `f32`, the result rounded to the output
//! dtype (nearest even). Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;
