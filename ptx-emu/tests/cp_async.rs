//! `cp.async` in the emulator: the double-buffered pipeline of `ruda_ir::coverage`, through
//! the PTX backend and through NVRTC (inline asm), gives the interpreter's results bit for bit;
//! the same kernel with its wait moved after the reads fails in both engines, as it must.

use crate::common;

use common::{check, emu_outputs, first_difference, interp_outputs, Input, Rng};
use ruda_codegen_ptx::{Arch, Target};
use ruda_ir::coverage::{cp_async_expected, cp_async_kernel, CP_ASYNC_TILE};
use ruda_ir::interp::LaunchConfig;
use ruda_ir::Kernel;

const TILES: u32 = 3;

fn inputs(seed: u64) -> Vec<Input> {
    let mut rng = Rng(seed);
    let x: Vec<u8> = (0..4 * TILES * CP_ASYNC_TILE).map(|_| rng.next() as u8).collect();
    vec![Input::Buffer(x), Input::Buffer(vec![0; 4 * 128])]
}

fn words(b: &[u8]) -> Vec<u32> {
    b.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn the_emulator_matches_the_interpreter_on_ptx_backend_output() {
    let k = cp_async_kernel(TILES).unwrap();
    let launch = LaunchConfig::linear(1, 32);
    let ins = inputs(1);
    let Input::Buffer(x) = &ins[0] else { unreachable!() };
    let want = interp_outputs(&k, &launch, &ins);
    assert_eq!(words(&want[1]), cp_async_expected(&words(x), TILES));
    check(&k, &launch, &ins, &[Arch::Sm80, Arch::Sm90]);
}

#[test]
fn the_emulator_matches_the_interpreter_on_nvrtc_output() {
    let Some(nvrtc) = ruda_codegen_nvrtc::nvrtc_or_skip("cp.async through NVRTC").unwrap_or_else(|e| panic!("{e}"))
    else {
        return;
    };
    let k = cp_async_kernel(TILES).unwrap();
    let refs: Vec<&Kernel> = vec![&k];
    let ptx = ruda_codegen_nvrtc::compile_module_with(&nvrtc, &refs, &Target::new(Arch::Sm80))
        .unwrap_or_else(|e| panic!("{e}"));
    let launch = LaunchConfig::linear(1, 32);
    let ins = inputs(2);
    let want = interp_outputs(&k, &launch, &ins);
    let got = emu_outputs(&ptx, &k.name, &launch, &ins).unwrap_or_else(|e| panic!("{e}\n{ptx}"));
    for (b, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(first_difference(g, w, 4), None, "buffer {b} differs");
    }
}

#[test]
fn reading_before_the_wait_fails_in_the_emulator() {
    // `wait_group 1` becomes `wait_group 2`: the tile being read is still pending.
    let k = cp_async_kernel(TILES).unwrap();
    let ptx = ruda_codegen_ptx::emit_ptx(&k, &Target::new(Arch::Sm80)).unwrap();
    let bad = ptx.replacen("wait_group     1;", "wait_group     2;", 1);
    assert_ne!(bad, ptx);
    let launch = LaunchConfig::linear(1, 32);
    let e = emu_outputs(&bad, &k.name, &launch, &inputs(3)).unwrap_err();
    assert!(e.contains("still pending"), "{e}");
}
