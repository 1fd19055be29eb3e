//! Every integration test of `ruda-codegen-ptx` in one binary (one module per former test
//! file). `env_version` stays a binary of its own: it sets `RUDA_PTX_VERSION`.
//! A new test file compiles only once it has a `mod` line here (the crate sets `autotests = false`).

mod common;

mod addressing;
mod cp_async;
mod emit;
mod filetests;
mod prop_ptxas;
mod ptxas_control;
mod ptxas_ops;
mod sass;
mod tensor_core;
