//! Every integration test of `ruda-codegen-nvrtc` in one binary (one module per former test
//! file). `missing_library` stays a binary of its own: it sets `RUDA_NVRTC`.
//! A new test file compiles only once it has a `mod` line here (the crate sets `autotests = false`).

mod common;

mod control;
mod cp_async;
mod nvrtc;
mod ops;
mod tensor_core;
