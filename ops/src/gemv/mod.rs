//! GEMV / skinny GEMM for decode: `y[M, N] = x[M, K] · W[N, K]ᵀ` with `M ≤ 16`, accumulated in
//! `f32`, with an optional split-K (and its reduction) for narrow outputs. Builders in
//! [`kernel`], entry points in [`api`], the tuned split count in [`tune`].

pub mod api;
pub mod kernel;
pub mod tune;
