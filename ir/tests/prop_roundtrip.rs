//! The text form of generated kernels (`ruda_ir::gen`): print -> parse -> print is the
//! identity, with and without locations, and the parsed kernel verifies and computes the
//! same buffers.

use ruda_ir::gen::{generate, run_generated, Entropy, GenConfig};
use ruda_ir::{parse_kernel, print_kernel, print_kernel_with_locs, verify};

#[test]
fn generated_kernels_round_trip_through_text() {
    let cfg = GenConfig::default();
    for seed in 0..600 {
        let g = generate(&mut Entropy::from_seed(seed), &cfg);
        for (what, text) in [("plain", print_kernel(&g.kernel)), ("with locations", print_kernel_with_locs(&g.kernel))]
        {
            let parsed = parse_kernel(&text).unwrap_or_else(|e| panic!("seed {seed}, {what}: {e}\n{text}"));
            let again = if what == "plain" { print_kernel(&parsed) } else { print_kernel_with_locs(&parsed) };
            assert_eq!(again, text, "seed {seed}, {what}: the text changed");
            verify(&parsed).unwrap_or_else(|e| panic!("seed {seed}, {what}: the parsed kernel does not verify: {e}"));
        }
        // The parsed kernel means the same (every fourth seed: the interpreter is the slow part).
        if seed % 4 == 0 {
            let parsed = parse_kernel(&print_kernel(&g.kernel)).expect("parsed above");
            assert_eq!(run_generated(&g, &parsed), run_generated(&g, &g.kernel), "seed {seed}");
        }
    }
}

#[test]
fn generated_kernels_with_fuzzer_bytes_round_trip() {
    let cfg = GenConfig::default();
    let mut rng = Entropy::from_seed(7);
    for case in 0..200 {
        let bytes: Vec<u8> = (0..rng.below(2048)).map(|_| rng.below(256) as u8).collect();
        let g = generate(&mut Entropy::from_bytes(&bytes), &cfg);
        let text = print_kernel(&g.kernel);
        let parsed = parse_kernel(&text).unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
        assert_eq!(print_kernel(&parsed), text, "case {case}");
    }
}
