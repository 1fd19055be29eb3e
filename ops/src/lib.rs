//! `ruda-ops`: RUDA's kernel library, written once in the IR.
//!
//! One folder per op family ([`elementwise`], [`rows`], [`norm`] (with [`norm::fused`]), [`gemv`],
//! [`gemm`], [`awq`], [`rope`], [`embedding`], [`argmax`], [`sampling`], [`logprobs`], [`moe`], [`penalty`], [`swiglu`],
//! [`attention`], [`paged_attention`], [`gated_delta`], and around it [`conv1d`], [`delta_gates`], [`row_norm`],
//! [`attn_gate`]), each holding its kernel builders (`kernel`), host
//! entry points (`api`) and, where it is tuned, its tuning (`tune`). Shared pieces:
//!
//! - [`blocks`]: kernel building blocks (reductions, conversions, index arithmetic, packing);
//! - [`host`] and [`error`]: the host-side checks and the error of every entry point;
//! - [`api`] and [`kernels`]: every family's entry points and builders in one namespace;
//! - [`family`]: the trait each family implements, and [`registry`], the list of families
//!   (every registered configuration, `rudac list`);
//! - [`problem`]: a small valid problem for each configuration (`rudac run`, differential tests);
//! - [`tune`]: autotuning and the shape files of `rudac tune`;
//! - [`perf`]: GPU peaks, occupancy and roofline estimates, without a GPU.
//!
//! The `rudac` and `ruda-bench` tools live in `ruda-tools` (`tools/`).

pub mod api;
pub mod blocks;
pub mod error;
pub mod family;
pub mod host;
pub mod kernels;
pub mod params;
pub mod perf;
pub mod problem;
pub mod registry;
pub mod tune;

pub mod argmax;
pub mod attention;
pub mod attention_pieces;
pub mod attn_gate;
pub mod awq;
pub mod conv1d;
pub mod delta_gates;
pub mod elementwise;
pub mod embedding;
pub mod gated_delta;
pub mod gemm;
pub mod gemv;
pub mod logprobs;
pub mod moe;
pub mod norm;
pub mod paged_attention;
pub mod penalty;
pub mod rope;
pub mod row_norm;
pub mod rows;
pub mod sampling;
pub mod swiglu;

/// The sample problems under their old name, for the `rudac` driver (`ruda-tools`).
pub use problem as sample;
