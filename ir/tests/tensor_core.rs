//! Tensor-core operations on the interpreter: `mma.m16n8k16` against a plain f64 product, with
//! the fragments packed from the PTX ISA's element-wise layout tables (written here
//! independently of the interpreter's register-wise form), its accumulation model, `ldmatrix`
//! x1/x2/x4 with and without `.trans` against a plain reference, the warp-collective checks,
//! and the text form.

use crate::interp_support;

use interp_support::*;
use ruda_ir::interp::{run, KernelArg, LaunchConfig};
use ruda_ir::{parse_kernel, print_kernel, Kernel, KernelBuilder, MmaType, ScalarType::*};

/// One warp: load the lane's A (v4u32), B (v2u32) and C (v4f32) fragments from global memory,
/// `mma`, store D. With `half_warp_guard` the mma runs under `laneid < 16`.
fn mma_kernel(ty: MmaType, half_warp_guard: bool) -> Kernel {
    let mut b = KernelBuilder::new("mma");
    let (pa, pb, pc, pd) =
        (b.param("a", gptr(U32)), b.param("b", gptr(U32)), b.param("c", gptr(F32)), b.param("d", gptr(F32)));
    let lane = b.lane_id();
    let (two, four) = (b.const_u32(2), b.const_u32(4));
    let l4 = b.mul(lane, four);
    let l2 = b.mul(lane, two);
    let qa = b.ptr_add(pa, l4);
    let a = b.load_vec(qa, 4);
    let qb = b.ptr_add(pb, l2);
    let bf = b.load_vec(qb, 2);
    let qc = b.ptr_add(pc, l4);
    let c = b.load_vec(qc, 4);
    let qd = b.ptr_add(pd, l4);
    if half_warp_guard {
        let sixteen = b.const_u32(16);
        let cond = b.lt(lane, sixteen);
        b.if_then(cond, |b| {
            let d = b.mma_m16n8k16(ty, a, bf, c);
            b.store(qd, d);
        });
    } else {
        let d = b.mma_m16n8k16(ty, a, bf, c);
        b.store(qd, d);
    }
    b.finish().unwrap()
}

fn to_bits(ty: MmaType, x: f32) -> u16 {
    match ty {
        MmaType::F16 => half::f16::from_f32(x).to_bits(),
        MmaType::BF16 => half::bf16::from_f32(x).to_bits(),
    }
}

/// The PTX ISA's fragment tables for m16n8k16 with 16-bit inputs, element by element:
/// `(lane, register, half)` -> matrix position. `g = laneid >> 2`, `t = laneid % 4`.
fn a_pos(lane: usize, i: usize) -> (usize, usize) {
    let (g, t) = (lane >> 2, lane % 4);
    let row = if i < 2 || (4..6).contains(&i) { g } else { g + 8 };
    let col = t * 2 + (i & 1) + if i < 4 { 0 } else { 8 };
    (row, col)
}
fn b_pos(lane: usize, i: usize) -> (usize, usize) {
    let (g, t) = (lane >> 2, lane % 4);
    (t * 2 + (i & 1) + if i < 2 { 0 } else { 8 }, g)
}
fn c_pos(lane: usize, i: usize) -> (usize, usize) {
    let (g, t) = (lane >> 2, lane % 4);
    (if i < 2 { g } else { g + 8 }, t * 2 + (i & 1))
}

/// Run one `mma` over row-major A (16x16), B (16x8, `b[k][n]`) and C (16x8); D row-major.
fn run_mma(ty: MmaType, a: &[[f32; 16]; 16], bm: &[[f32; 8]; 16], c: &[[f32; 8]; 16]) -> [[f32; 8]; 16] {
    let k = mma_kernel(ty, false);
    let (mut fa, mut fb, mut fc) = (vec![0u32; 128], vec![0u32; 64], vec![0f32; 128]);
    for lane in 0..32 {
        for i in 0..8 {
            let (r, col) = a_pos(lane, i);
            fa[lane * 4 + i / 2] |= (to_bits(ty, a[r][col]) as u32) << (16 * (i % 2));
        }
        for i in 0..4 {
            let (r, col) = b_pos(lane, i);
            fb[lane * 2 + i / 2] |= (to_bits(ty, bm[r][col]) as u32) << (16 * (i % 2));
        }
        for i in 0..4 {
            let (r, col) = c_pos(lane, i);
            fc[lane * 4 + i] = c[r][col];
        }
    }
    let (mut ba, mut bb, mut bc, mut bd) = (u32s(&fa), u32s(&fb), f32s(&fc), vec![0u8; 512]);
    let mut args = [
        KernelArg::Buffer(&mut ba),
        KernelArg::Buffer(&mut bb),
        KernelArg::Buffer(&mut bc),
        KernelArg::Buffer(&mut bd),
    ];
    run(&k, &LaunchConfig::linear(1, 32), &mut args).unwrap();
    let out = to_f32s(&bd);
    let mut d = [[f32::NAN; 8]; 16];
    for lane in 0..32 {
        for i in 0..4 {
            let (r, col) = c_pos(lane, i);
            d[r][col] = out[lane * 4 + i];
        }
    }
    d
}

/// A deterministic pseudo-random multiple of 1/4 in [-8, 8): every product and partial sum is
/// exact in f32, so the result must equal the f64 reference exactly.
fn small(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 33) % 64) as f32 / 4.0 - 8.0
}

#[test]
fn mma_matches_an_f64_product_for_both_input_types() {
    for ty in [MmaType::F16, MmaType::BF16] {
        let mut seed = ty as u64 + 1;
        let mut a = [[0f32; 16]; 16];
        let mut bm = [[0f32; 8]; 16];
        let mut c = [[0f32; 8]; 16];
        a.iter_mut().flatten().for_each(|x| *x = small(&mut seed));
        bm.iter_mut().flatten().for_each(|x| *x = small(&mut seed));
        c.iter_mut().flatten().for_each(|x| *x = small(&mut seed) * 16.0);
        let d = run_mma(ty, &a, &bm, &c);
        for r in 0..16 {
            for n in 0..8 {
                let want = (0..16).map(|k| a[r][k] as f64 * bm[k][n] as f64).sum::<f64>() + c[r][n] as f64;
                assert_eq!(d[r][n] as f64, want, "{ty}: D[{r}][{n}]");
            }
        }
    }
}

/// Every fragment element lands where the tables say: a one-hot A and B pick out single
/// elements, so a wrong position shows up as a wrong output cell.
#[test]
fn mma_fragment_layouts_are_the_ptx_tables() {
    let ty = MmaType::F16;
    for (r, k, n) in [(0, 0, 0), (9, 3, 5), (15, 15, 7), (4, 12, 2), (11, 8, 1)] {
        let mut a = [[0f32; 16]; 16];
        let mut bm = [[0f32; 8]; 16];
        a[r][k] = 3.0;
        bm[k][n] = 5.0;
        let mut c = [[0f32; 8]; 16];
        c[15 - r][7 - n] = 1.0;
        let d = run_mma(ty, &a, &bm, &c);
        for (i, row) in d.iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                let want = if (i, j) == (r, n) { 15.0 } else { 0.0 } + c[i][j];
                assert_eq!(x, want, "one-hot ({r}, {k}, {n}): D[{i}][{j}]");
            }
        }
    }
}

/// The accumulation model: products summed in k order in f32 (round to nearest even), then C.
#[test]
fn mma_sums_in_k_order_in_f32() {
    let ty = MmaType::BF16;
    let big = 16_777_216.0f32; // 2^24: adding 1 is a tie that rounds back to even
    let mut a = [[1f32; 16]; 16];
    let bm = [[1f32; 8]; 16];
    a[0][0] = big; // row 0: 2^24 first, then fifteen ones, each lost
    a[1][15] = big; // row 1: fifteen ones first (15), then 2^24: 16777231 ties to 16777232
    let c = [[0f32; 8]; 16];
    let d = run_mma(ty, &a, &bm, &c);
    assert_eq!(d[0][0], big);
    assert_eq!(d[1][3], big + 16.0);
    assert_eq!(d[2][0], 16.0);
}

#[test]
fn mma_needs_the_whole_warp() {
    let k = mma_kernel(MmaType::BF16, true);
    let (mut ba, mut bb, mut bc, mut bd) = (vec![0u8; 512], vec![0u8; 256], vec![0u8; 512], vec![0u8; 512]);
    let mut args = [
        KernelArg::Buffer(&mut ba),
        KernelArg::Buffer(&mut bb),
        KernelArg::Buffer(&mut bc),
        KernelArg::Buffer(&mut bd),
    ];
    let e = run(&k, &LaunchConfig::linear(1, 32), &mut args).unwrap_err();
    assert_eq!(e.op, "mma.m16n8k16.bf16");
    assert!(e.message.contains("inactive lanes"), "{e}");
}

/// 32 rows of 8 u16 in shared memory, 32 bytes apart (rows must be 16-byte aligned), filled
/// from `in`. Lane `l` addresses row `(5 * l + 3) % 32` (a
/// permutation, so each matrix row comes from a scattered place); lanes beyond `8 * count` give
/// a misaligned address, which `ldmatrix` must ignore. Each lane stores its registers to
/// `out[4 * l ..]`.
fn ldmatrix_kernel(count: u8, trans: bool) -> Kernel {
    let mut b = KernelBuilder::new("ldm");
    let (pin, pout) = (b.param("in", gptr(U16)), b.param("out", gptr(U32)));
    let tile = b.shared_array("tile", U16, 512);
    let s = b.shared_ptr(tile);
    let lane = b.lane_id();
    let sixteen = b.const_u32(16);
    let base = b.mul(lane, sixteen);
    for j in 0..16 {
        let jj = b.const_u32(j);
        let i = b.add(base, jj);
        let src = b.ptr_add(pin, i);
        let x = b.load(src);
        let dst = b.ptr_add(s, i);
        b.store(dst, x);
    }
    b.barrier();
    let (five, three, mask) = (b.const_u32(5), b.const_u32(3), b.const_u32(31));
    let row = b.fma(lane, five, three);
    let row = b.and(row, mask);
    let off = b.mul(row, sixteen);
    let limit = b.const_u32(8 * count as u32);
    let used = b.lt(lane, limit);
    let one = b.const_u32(1);
    let skew = b.add(off, one);
    let off = b.select(used, off, skew);
    let p = b.ptr_add(s, off);
    let r = b.ldmatrix(p, count, trans);
    let four = b.const_u32(4);
    let o = b.mul(lane, four);
    let q = b.ptr_add(pout, o);
    b.store(q, r);
    b.finish().unwrap()
}

#[test]
fn ldmatrix_matches_a_plain_reference() {
    let input: Vec<u16> = (0..512u32).map(|i| (i.wrapping_mul(40503) ^ 0x5a5a) as u16).collect();
    for count in [1u8, 2, 4] {
        for trans in [false, true] {
            let k = ldmatrix_kernel(count, trans);
            let mut inb: Vec<u8> = input.iter().flat_map(|x| x.to_le_bytes()).collect();
            let mut out = vec![0u8; 512];
            run(&k, &LaunchConfig::linear(1, 32), &mut [KernelArg::Buffer(&mut inb), KernelArg::Buffer(&mut out)])
                .unwrap();
            let out = to_u32s(&out);
            // Matrix m, row r: the 8 elements at the row lane 8m+r addressed.
            let elem = |m: usize, r: usize, c: usize| input[((5 * (8 * m + r) + 3) % 32) * 16 + c] as u32;
            for lane in 0..32 {
                for m in 0..count as usize {
                    let (g, t) = (lane / 4, lane % 4);
                    let (lo, hi) = if trans {
                        (elem(m, 2 * t, g), elem(m, 2 * t + 1, g))
                    } else {
                        (elem(m, g, 2 * t), elem(m, g, 2 * t + 1))
                    };
                    assert_eq!(out[lane * 4 + m], lo | hi << 16, "x{count} trans={trans} lane {lane} reg {m}");
                }
            }
        }
    }
}

#[test]
fn ldmatrix_rejects_misaligned_rows_and_partial_warps() {
    // A 16-thread block: half a warp.
    let k = ldmatrix_kernel(1, false);
    let mut inb = vec![0u8; 1024];
    let mut out = vec![0u8; 512];
    let e = run(&k, &LaunchConfig::linear(1, 16), &mut [KernelArg::Buffer(&mut inb), KernelArg::Buffer(&mut out)])
        .unwrap_err();
    assert!(e.message.contains("inactive lanes"), "{e}");
    // Misaligned: lanes beyond 8 * count skew their address; with x1 read as x2 by text editing
    // the skewed lanes 8..16 are used.
    let text = print_kernel(&k).replace("ldmatrix.x1", "ldmatrix.x2").replace(": u32 = ldmatrix", ": v2u32 = ldmatrix");
    let k2 = parse_kernel(&text).unwrap();
    let e = run(&k2, &LaunchConfig::linear(1, 32), &mut [KernelArg::Buffer(&mut inb), KernelArg::Buffer(&mut out)])
        .unwrap_err();
    assert!(e.message.contains("misaligned"), "{e}");
}

#[test]
fn text_form_round_trips_and_types_are_checked() {
    for k in [
        mma_kernel(MmaType::F16, false),
        mma_kernel(MmaType::BF16, true),
        ldmatrix_kernel(4, true),
        ldmatrix_kernel(2, false),
    ] {
        let text = print_kernel(&k);
        let back = parse_kernel(&text).unwrap();
        assert_eq!(print_kernel(&back), text);
    }
    let text = print_kernel(&ldmatrix_kernel(4, true));
    assert!(text.contains("v4u32 = ldmatrix.x4.trans %"), "{text}");
    // A wrong result type or operand fragment is a verifier error.
    let bad = text.replace(": v4u32 = ldmatrix", ": v2u32 = ldmatrix");
    let e = ruda_ir::verify(&parse_kernel(&bad).unwrap()).unwrap_err();
    assert!(e.to_string().contains("ldmatrix"), "{e}");
    let mma = print_kernel(&mma_kernel(MmaType::F16, false));
    assert!(mma.contains("= mma.m16n8k16.f16 %"), "{mma}");
    let bad = mma.replace("mma.m16n8k16.f16", "mma.m16n8k8.f16");
    assert!(parse_kernel(&bad).is_err());
    // A C fragment of the wrong type.
    let mut b = KernelBuilder::new("bad");
    let p = b.param("a", gptr(U32));
    let a = b.load_vec(p, 4);
    let bf = b.load_vec(p, 2);
    let d = b.mma_m16n8k16(MmaType::BF16, a, bf, a);
    b.store(p, d);
    let e = b.finish().unwrap_err();
    assert!(e.to_string().contains("C fragment"), "{e}");
}

/// The default pass pipeline keeps the warp-collective ops where they are and the results the
/// same.
#[test]
fn the_pass_pipeline_keeps_tensor_core_results() {
    let input: Vec<u8> = (0..1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for k in [ldmatrix_kernel(4, true), ldmatrix_kernel(1, false), mma_kernel(MmaType::BF16, false)] {
        let mut opt = k.clone();
        ruda_ir::passes::optimize(&mut opt).unwrap();
        let text = print_kernel(&opt);
        assert!(text.contains("ldmatrix.") || text.contains("mma.m16n8k16."), "{text}");
        let outputs = |k: &Kernel| {
            let n_params = k.params.len();
            let mut bufs: Vec<Vec<u8>> = (0..n_params).map(|_| input.clone()).collect();
            let mut args: Vec<KernelArg<'_>> = bufs.iter_mut().map(|b| KernelArg::Buffer(b)).collect();
            run(k, &LaunchConfig::linear(1, 32), &mut args).unwrap();
            bufs
        };
        assert_eq!(outputs(&k), outputs(&opt), "{}", k.name);
    }
}
