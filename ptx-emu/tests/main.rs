//! Every integration test of `ruda-ptx-emu` in one binary (one module per former test file).

mod common;

mod cp_async;
mod generated;
mod ops;
mod ptx_text;
mod smoke;
mod tensor_core;
