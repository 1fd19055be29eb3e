//! Matrix multiplication: `matmul` (`a · b`) and `linear` (`x · wᵀ`, the layout of `nn.Linear`)
//! with its bias / residual epilogue and batched form, by level:
//!
//! - [`tile`]: the tensor-core tile and pipeline depth ([`tile::GemmTile`]) and its heuristic;
//! - [`load`]: the tensor-core kernel's staged, swizzled, pipelined loads of `x` and `w`;
//! - [`kernels`]: the SIMT kernel (every float dtype, both `B` layouts) and the tensor-core
//!   kernel (f16/bf16 inputs, `mma.m16n8k16`, f32 accumulation);
//! - [`api`]: the entry points, which pick a kernel and a tile;
//! - [`tune`]: the tile tuned per GPU and shape.

pub mod api;
pub mod kernels;
pub mod load;
pub mod tile;
pub mod tune;
