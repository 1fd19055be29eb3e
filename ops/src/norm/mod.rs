//! RMSNorm and LayerNorm over the last axis: `f32` statistics and affine parameters, output in
//! the input dtype, one block per row; [`fused`] is RMSNorm fused with the residual add. Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod fused;
pub mod kernel;
