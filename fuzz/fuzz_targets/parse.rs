//! Arbitrary bytes into the text-IR parser: never a panic; whatever parses round-trips through
//! the printer; whatever also verifies survives every pass and the PTX backend.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ruda_fuzz::check_parse(data));
