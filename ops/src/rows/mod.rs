//! Row reductions (sum, max) and softmax over the last axis of a `[rows, cols]` tensor, one block
//! per row, statistics in `f32` whatever the input dtype. Builders in [`kernel`], entry points in
//! [`api`].

pub mod api;
pub mod kernel;
