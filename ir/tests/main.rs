//! Every integration test of `ruda-ir` in one binary (one module per former test file), so
//! CI links one executable instead of two dozen. `interp_env` stays a binary of its own: it
//! changes the process environment.
//! A new test file compiles only once it has a `mod` line here (the crate sets `autotests = false`).

mod interp_support;
mod passes_support;

mod cp_async;
mod filetests;
mod interp_control;
mod interp_counters;
mod interp_cvt;
mod interp_errors;
mod interp_ops;
mod interp_parallel;
mod parse_errors;
mod parse_roundtrip;
mod passes_addr_fold;
mod passes_cse;
mod passes_dce;
mod passes_fold;
mod passes_licm;
mod passes_pipeline;
mod passes_random;
mod passes_simplify;
mod passes_unroll;
mod passes_vectorize;
mod prop_gen;
mod prop_passes;
mod prop_roundtrip;
mod tensor_core;
mod verify;
