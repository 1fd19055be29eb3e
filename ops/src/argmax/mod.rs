//! Argmax over the last axis into `u32` indices, in one pass or split with a reduction.
//! Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;
