//! Tensor-core operations in the emulator: kernels using `mma.m16n8k16` (f16, bf16) and
//! `ldmatrix` (x1/x2/x4, with and without `.trans`), through the PTX backend and through NVRTC
//! (inline asm), must give the interpreter's results bit for bit on random bits (NaNs,
//! infinities and subnormals included), with two warps per block and two blocks.

use crate::common;

use common::{check, emu_outputs, first_difference, interp_outputs, Input, Rng};
use ruda_codegen_ptx::{Arch, Target};
use ruda_ir::coverage::global;
use ruda_ir::interp::LaunchConfig;
use ruda_ir::{Kernel, KernelBuilder, MmaType, ScalarType::*, Value};

const BLOCKS: u32 = 2;
const THREADS: u32 = 64;

/// The address of the row lane `lane` gives to an `ldmatrix` of `count` matrices: rows of the
/// warp's 32-row tile in a permuted order, and a misaligned address from the lanes `ldmatrix`
/// ignores (so that reading them would fail).
fn row_ptr(b: &mut KernelBuilder, tile: Value, lane: Value, count: u32, perm: u32) -> Value {
    let (mul, add, mask, sixteen) = (b.const_u32(perm), b.const_u32(3), b.const_u32(31), b.const_u32(16));
    let row = b.fma(lane, mul, add);
    let row = b.and(row, mask);
    let off = b.mul(row, sixteen);
    let limit = b.const_u32(8 * count);
    let used = b.lt(lane, limit);
    let one = b.const_u32(1);
    let skew = b.add(off, one);
    let off = b.select(used, off, skew);
    b.ptr_add(tile, off)
}

fn tile_kernel(ty: MmaType, trans: bool) -> Kernel {
    let mut b = KernelBuilder::new(format!("tc_{ty}_{}", if trans { "t" } else { "n" }));
    let pin = b.param("in", global(U32));
    let pc = b.param("c", global(F32));
    let pd = b.param("d", global(F32));
    let pe = b.param("e", global(U32));
    let tile = b.shared_array("tile", U32, 8 * THREADS);
    let s = b.shared_ptr(tile);
    let t = b.thread_id_x();
    let g = b.global_thread_id_x();
    let eight = b.const_u32(8);
    let base = b.mul(t, eight);
    let gbase = b.mul(g, eight);
    for j in 0..8 {
        let jj = b.const_u32(j);
        let i = b.add(gbase, jj);
        let src = b.ptr_add(pin, i);
        let x = b.load(src);
        let i = b.add(base, jj);
        let dst = b.ptr_add(s, i);
        b.store(dst, x);
    }
    b.barrier();
    // This warp's 32 rows of 8 halves (512 bytes).
    let h = b.ptr_cast(s, if ty == MmaType::F16 { F16 } else { BF16 });
    let (five, warp_halves) = (b.const_u32(5), b.const_u32(512));
    let warp = b.shr(t, five);
    let woff = b.mul(warp, warp_halves);
    let wtile = b.ptr_add(h, woff);
    let lane = b.lane_id();
    let pa = row_ptr(&mut b, wtile, lane, 4, 5);
    let a = b.ldmatrix(pa, 4, false);
    let pb = row_ptr(&mut b, wtile, lane, 2, 7);
    let bf = b.ldmatrix(pb, 2, trans);
    let p1 = row_ptr(&mut b, wtile, lane, 1, 11);
    let one = b.ldmatrix(p1, 1, trans);
    let four = b.const_u32(4);
    let g4 = b.mul(g, four);
    let qc = b.ptr_add(pc, g4);
    let c = b.load_vec(qc, 4);
    let d = b.mma_m16n8k16(ty, a, bf, c);
    let qd = b.ptr_add(pd, g4);
    b.store(qd, d);
    let qe = b.ptr_add(pe, g);
    b.store(qe, one);
    b.finish().unwrap()
}

fn inputs(seed: u64) -> Vec<Input> {
    let n = (BLOCKS * THREADS) as usize;
    let mut rng = Rng(seed);
    let bytes = |len: usize, rng: &mut Rng| (0..len).map(|_| rng.next() as u8).collect::<Vec<u8>>();
    vec![
        Input::Buffer(bytes(32 * n, &mut rng)),
        Input::Buffer(bytes(16 * n, &mut rng)),
        Input::Buffer(vec![0; 16 * n]),
        Input::Buffer(vec![0; 4 * n]),
    ]
}

fn kernels() -> Vec<Kernel> {
    [MmaType::F16, MmaType::BF16].into_iter().flat_map(|ty| [false, true].map(|trans| tile_kernel(ty, trans))).collect()
}

#[test]
fn the_emulator_matches_the_interpreter_on_ptx_backend_output() {
    let launch = LaunchConfig::linear(BLOCKS, THREADS);
    for (i, k) in kernels().iter().enumerate() {
        check(k, &launch, &inputs(i as u64 + 1), &[Arch::Sm80, Arch::Sm90]);
    }
}

#[test]
fn the_emulator_matches_the_interpreter_on_nvrtc_output() {
    let Some(nvrtc) =
        ruda_codegen_nvrtc::nvrtc_or_skip("tensor-core kernels through NVRTC").unwrap_or_else(|e| panic!("{e}"))
    else {
        return;
    };
    let launch = LaunchConfig::linear(BLOCKS, THREADS);
    let ks = kernels();
    let refs: Vec<&Kernel> = ks.iter().collect();
    let ptx = ruda_codegen_nvrtc::compile_module_with(&nvrtc, &refs, &Target::new(Arch::Sm80))
        .unwrap_or_else(|e| panic!("{e}"));
    for (i, k) in ks.iter().enumerate() {
        let ins = inputs(i as u64 + 100);
        let want = interp_outputs(k, &launch, &ins);
        let got = emu_outputs(&ptx, &k.name, &launch, &ins).unwrap_or_else(|e| panic!("`{}`: {e}\n{ptx}", k.name));
        for (b, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(first_difference(g, w, 4), None, "`{}`: buffer {b} differs", k.name);
        }
    }
}

#[test]
fn the_emulator_rejects_a_misaligned_row() {
    // Lanes 8..16 give skewed addresses; reading them as x2 must fail as in the interpreter.
    let k = tile_kernel(MmaType::F16, false);
    let ptx = ruda_codegen_ptx::emit_ptx(&k, &Target::new(Arch::Sm80)).unwrap();
    let bad = ptx.replacen(
        "ldmatrix.sync.aligned.m8n8.x1.shared.b16 {",
        "ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%r0, ",
        1,
    );
    assert_ne!(bad, ptx);
    let launch = LaunchConfig::linear(BLOCKS, THREADS);
    let e = emu_outputs(&bad, &k.name, &launch, &inputs(7)).unwrap_err();
    assert!(e.contains("16-byte aligned"), "{e}");
}
