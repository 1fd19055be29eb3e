//! Bytes drive `ruda_ir::gen` to a random, verifying kernel, which goes through the verifier,
//! the interpreter, every pass (each keeping the interpreter's result bit for bit), the text
//! form and the PTX backend without a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ruda_fuzz::check_pipeline(data));
