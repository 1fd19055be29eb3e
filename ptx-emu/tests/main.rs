//! Every integration test of `ruda-ptx-emu` in one binary (one module per former test file).
//! A new test file compiles only once it has a `mod` line here (the crate sets `autotests = false`).

mod common;

mod cp_async;
mod generated;
mod ops;
mod ptx_text;
mod smoke;
mod tensor_core;
