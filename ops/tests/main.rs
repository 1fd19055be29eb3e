//! The op library's integration tests, in one binary (one link instead of one per file). Each
//! former test file is a module; `common` holds their shared helpers. Tests that set
//! environment variables or count per-process state would keep binaries of their own (see
//! ops/Cargo.toml); none does today.
//! A new test file compiles only once it has a `mod` line here (the crate sets `autotests = false`).

mod common;

mod attention;
mod attention_pieces;
mod awq;
mod budgets;
mod differential;
mod exact_sums;
mod fuzz_corpus;
mod gated_delta;
mod gemm_tc;
mod gemv;
mod into_forms;
mod ir_roundtrip;
mod linear;
mod logprobs;
mod moe_expert_training;
mod moe_experts;
mod moe_routing;
mod moe_shared_expert;
mod moe_training;
mod nvrtc_registry;
mod ops_errors;
mod ops_reference;
mod paged_attention;
mod paged_attention_fused;
mod paged_mla;
mod params;
mod passes_registry;
mod perf;
mod qwen35_ops;
mod registry;
mod rope;
mod sampling;
mod small_ops;
mod snapshots;
mod tune;
mod tune_attention;
mod tune_gemm;
