//! The checks the fuzz targets run on each input. `ops/tests/fuzz_corpus.rs` includes this file
//! to replay the committed corpus as an ordinary test, so it uses nothing but `ruda_ir` and
//! `ruda_codegen_ptx`. A check panics, with the kernel's text, exactly when it finds a bug.

use ruda_codegen_ptx::{emit_ptx, Arch, CodegenError, Target};
use ruda_ir::gen::{generate, run_generated, Entropy, GenConfig, GeneratedKernel};
use ruda_ir::passes::{all_passes, parse_pipeline, run_pipeline};
use ruda_ir::{parse_kernel, print_kernel, print_kernel_with_locs, verify, verify_form, Kernel};

/// `parse` target: any bytes. The parser must not panic; a kernel it returns must print and
/// parse back to the same text (with and without locations); a kernel that also verifies must
/// pass every later stage (see [`later_stages`]).
pub fn check_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(kernel) = parse_kernel(text) else { return };
    round_trip(&kernel);
    if verify(&kernel).is_ok() {
        later_stages(&kernel, None);
    }
}

/// `pipeline` target: the bytes choose a kernel with `ruda_ir::gen`, which must verify and run
/// in the interpreter without errors (its guarantees); then every later stage must hold,
/// passes keeping the interpreter's results bit for bit.
pub fn check_pipeline(data: &[u8]) {
    let g = generate(&mut Entropy::from_bytes(data), &GenConfig::default());
    if let Err(e) = verify(&g.kernel) {
        panic!("ruda_ir::gen made a kernel that does not verify: {e}\n{}", print_kernel(&g.kernel));
    }
    round_trip(&g.kernel);
    later_stages(&g.kernel, Some(&g));
}

/// Every printed form parses back to itself.
fn round_trip(k: &Kernel) {
    for print in [print_kernel, print_kernel_with_locs] {
        let text = print(k);
        match parse_kernel(&text) {
            Ok(again) => assert_eq!(print(&again), text, "print(parse(text)) differs from text:\n{text}"),
            Err(e) => panic!("printed text does not parse: {e}\n{text}"),
        }
    }
}

/// A verified kernel through each pass alone and the default pipeline (each result must verify
/// and round-trip, and with `generated`, compute what the input did), then the PTX backend.
fn later_stages(k: &Kernel, generated: Option<&GeneratedKernel>) {
    let expected = generated.map(|g| {
        run_generated(g, k)
            .unwrap_or_else(|e| panic!("a ruda_ir::gen kernel fails in the interpreter: {e}\n{}", print_kernel(k)))
    });
    let same_results = |what: &str, out: &Kernel| {
        let (Some(g), Some(expected)) = (generated, &expected) else { return };
        match run_generated(g, out) {
            Ok(got) => assert!(
                got == *expected,
                "{what} changed the interpreter's results\ninput:\n{}\noutput:\n{}",
                print_kernel(k),
                print_kernel(out)
            ),
            Err(e) => panic!("{what}: the output fails in the interpreter: {e}\ninput:\n{}", print_kernel(k)),
        }
    };
    for pass in all_passes() {
        let mut out = k.clone();
        pass.run(&mut out);
        if let Err(e) = verify_form(&out) {
            panic!("pass `{}` produced IR that does not verify: {e}\ninput:\n{}", pass.name(), print_kernel(k));
        }
        round_trip(&out);
        same_results(&format!("pass `{}`", pass.name()), &out);
    }
    let mut optimized = k.clone();
    let pipeline = parse_pipeline("default").unwrap_or_else(|e| panic!("the default pipeline: {e}"));
    if let Err(e) = run_pipeline(&mut optimized, &pipeline, None) {
        panic!("the default pipeline failed: {e}\ninput:\n{}", print_kernel(k));
    }
    round_trip(&optimized);
    same_results("the default pipeline", &optimized);
    emit(k);
    emit(&optimized);
}

/// PTX for sm_80 (which may lack an instruction: an `Unsupported` error is the right answer
/// there) and sm_90 (which has every instruction the IR needs).
fn emit(k: &Kernel) {
    for arch in [Arch::Sm80, Arch::Sm90] {
        match emit_ptx(k, &Target::new(arch)) {
            Ok(_) => {}
            Err(CodegenError::Unsupported(_)) if arch == Arch::Sm80 => {}
            Err(e) => panic!("emitting PTX for {arch} failed: {e}\n{}", print_kernel(k)),
        }
    }
}
