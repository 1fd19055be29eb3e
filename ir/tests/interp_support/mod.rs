//! Helpers shared by the interpreter tests: element-wise kernels over typed buffers, and the
//! edge values each type is tested with.
#![allow(dead_code)] // each test crate uses a different subset

use ruda_ir::interp::{run, KernelArg, LaunchConfig};
use ruda_ir::{AddrSpace, Kernel, KernelBuilder, ScalarType, Type, Value};

use ScalarType::*;

/// The type a value of `t` is kept as in memory (predicates as `u32`).
pub fn mem_ty(t: ScalarType) -> ScalarType {
    if t == Pred {
        U32
    } else {
        t
    }
}

pub fn gptr(t: ScalarType) -> Type {
    Type::Ptr(AddrSpace::Global, t)
}

/// Little-endian bytes of `vals`, each `t.bytes()` wide.
pub fn to_bytes(t: ScalarType, vals: &[u64]) -> Vec<u8> {
    let size = mem_ty(t).bytes() as usize;
    vals.iter().flat_map(|v| v.to_le_bytes()[..size].to_vec()).collect()
}

pub fn from_bytes(t: ScalarType, bytes: &[u8]) -> Vec<u64> {
    let size = mem_ty(t).bytes() as usize;
    bytes
        .chunks(size)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..size].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

pub fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn to_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

pub fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn to_u32s(b: &[u8]) -> Vec<u32> {
    b.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Build and verify a kernel `out[i] = f(in_0[i], in_1[i], ...)` over `n` elements.
pub fn map_kernel(
    ins: &[ScalarType],
    out: ScalarType,
    f: impl FnOnce(&mut KernelBuilder, &[Value]) -> Value,
) -> Kernel {
    let mut b = KernelBuilder::new("map");
    let in_ptrs: Vec<Value> =
        ins.iter().enumerate().map(|(k, t)| b.param(format!("in{k}"), gptr(mem_ty(*t)))).collect();
    let out_ptr = b.param("out", gptr(mem_ty(out)));
    let n = b.param("n", Type::U32);
    let i = b.global_thread_id_x();
    let in_range = b.lt(i, n);
    b.if_then(in_range, |b| {
        let vals: Vec<Value> = in_ptrs
            .iter()
            .zip(ins)
            .map(|(&p, &t)| {
                let q = b.ptr_add(p, i);
                let v = b.load(q);
                if t == Pred {
                    let zero = b.const_u32(0);
                    b.ne(v, zero)
                } else {
                    v
                }
            })
            .collect();
        let mut r = f(b, &vals);
        if out == Pred {
            let (one, zero) = (b.const_u32(1), b.const_u32(0));
            r = b.select(r, one, zero);
        }
        let q = b.ptr_add(out_ptr, i);
        b.store(q, r);
    });
    b.finish().unwrap_or_else(|e| panic!("{e}"))
}

/// Run a kernel from [`map_kernel`] on the given inputs (bit patterns) and return the outputs.
pub fn run_map(kernel: &Kernel, ins: &[ScalarType], out: ScalarType, inputs: &[Vec<u64>]) -> Vec<u64> {
    let n = inputs[0].len();
    let mut bufs: Vec<Vec<u8>> = ins.iter().zip(inputs).map(|(t, v)| to_bytes(*t, v)).collect();
    let mut out_buf = vec![0u8; n * mem_ty(out).bytes() as usize];
    let mut args: Vec<KernelArg<'_>> = bufs.iter_mut().map(|b| KernelArg::Buffer(b)).collect();
    args.push(KernelArg::Buffer(&mut out_buf));
    args.push(KernelArg::Scalar(ruda_ir::Constant::u32(n as u32)));
    let blocks = (n as u32).div_ceil(64).max(1);
    run(kernel, &LaunchConfig::linear(blocks, 64), &mut args).unwrap_or_else(|e| panic!("{e}"));
    drop(args);
    from_bytes(out, &out_buf)
}

/// `map_kernel` + `run_map`.
pub fn map(
    ins: &[ScalarType],
    out: ScalarType,
    inputs: &[Vec<u64>],
    f: impl FnOnce(&mut KernelBuilder, &[Value]) -> Value,
) -> Vec<u64> {
    let k = map_kernel(ins, out, f);
    run_map(&k, ins, out, inputs)
}

pub fn width_mask(t: ScalarType) -> u64 {
    if t.bits() >= 64 {
        u64::MAX
    } else {
        (1 << t.bits()) - 1
    }
}

/// The value of the bit pattern `x` of integer type `t`.
pub fn ival(t: ScalarType, x: u64) -> i128 {
    let w = t.bits();
    let x = x & width_mask(t);
    if t.is_signed_int() && x >> (w - 1) == 1 {
        x as i128 - (1i128 << w)
    } else {
        x as i128
    }
}

/// The bit pattern of the integer `v` wrapped to type `t`.
pub fn ibits(t: ScalarType, v: i128) -> u64 {
    (v as u64) & width_mask(t)
}

pub const INT_TYPES: [ScalarType; 6] = [I16, I32, I64, U16, U32, U64];

/// Edge values of an integer type (bit patterns).
pub fn int_edges(t: ScalarType) -> Vec<u64> {
    let w = t.bits();
    let (min, max) =
        if t.is_signed_int() { (-(1i128 << (w - 1)), (1i128 << (w - 1)) - 1) } else { (0, (1i128 << w) - 1) };
    let mut v: Vec<i128> = vec![0, 1, 2, 3, 7, 100, min, min + 1, max, max - 1, -1, -2, -7, -100, 1 << (w / 2)];
    v.push(0x5555_5555_5555_5555u64 as i128);
    v.push(0xdead_beef_cafe_f00du64 as i128);
    let mut bits: Vec<u64> = v.into_iter().map(|x| ibits(t, x)).collect();
    bits.sort_unstable();
    bits.dedup();
    bits
}

/// Edge values of f32 (bit patterns): zeros, subnormals, normals, extremes, infinities, NaNs.
pub fn f32_edges() -> Vec<u64> {
    let vals: [f32; 22] = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -1.5,
        2.5,
        3.0,
        1.0 / 3.0,
        -2.75,
        f32::from_bits(1),            // smallest subnormal
        -f32::from_bits(0x007f_ffff), // largest subnormal
        f32::MIN_POSITIVE,
        f32::MAX,
        -f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        16_777_217.0,
        -123.456,
        std::f32::consts::PI,
        1e30,
        7e-39,
    ];
    let mut bits: Vec<u64> = vals.iter().map(|x| x.to_bits() as u64).collect();
    bits.extend([0x7fff_ffff, 0x7fc0_0000, 0xffc0_0001, 0x7f80_0001]); // NaNs with payloads
    bits
}

/// Edge values of f64 (bit patterns).
pub fn f64_edges() -> Vec<u64> {
    let vals: [f64; 20] = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -1.5,
        2.5,
        1.0 / 3.0,
        f64::from_bits(1),
        -f64::from_bits(0x000f_ffff_ffff_ffff),
        f64::MIN_POSITIVE,
        f64::MAX,
        -f64::MAX,
        f64::INFINITY,
        f64::NEG_INFINITY,
        9_007_199_254_740_993.0,
        -123.456,
        std::f64::consts::E,
        1e300,
        3e-310,
    ];
    let mut bits: Vec<u64> = vals.iter().map(|x| x.to_bits()).collect();
    bits.extend([0x7fff_ffff_ffff_ffff, 0x7ff8_0000_0000_0000, 0xfff8_0000_0000_0001, 0x7ff0_0000_0000_0001]);
    bits
}

/// All pairs (a, b) of `xs` × `ys`, as two input columns.
pub fn pairs(xs: &[u64], ys: &[u64]) -> Vec<Vec<u64>> {
    let (mut a, mut b) = (vec![], vec![]);
    for &x in xs {
        for &y in ys {
            a.push(x);
            b.push(y);
        }
    }
    vec![a, b]
}

/// Compare outputs with expectations, reporting the first mismatches with their inputs.
pub fn check(what: &str, inputs: &[Vec<u64>], got: &[u64], expected: impl Fn(&[u64]) -> u64) {
    let mut failures = vec![];
    for (i, &g) in got.iter().enumerate() {
        let args: Vec<u64> = inputs.iter().map(|col| col[i]).collect();
        let e = expected(&args);
        if g != e {
            failures.push(format!("  inputs {args:#x?}: got {g:#x}, expected {e:#x}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{what}: {} mismatches\n{}",
        failures.len(),
        failures[..failures.len().min(8)].join("\n")
    );
}

/// The canonical NaNs.
pub const F32_NAN: u64 = 0x7fff_ffff;
pub const F64_NAN: u64 = 0x7fff_ffff_ffff_ffff;

pub fn canon32(x: f32) -> u64 {
    if x.is_nan() {
        F32_NAN
    } else {
        x.to_bits() as u64
    }
}

pub fn canon64(x: f64) -> u64 {
    if x.is_nan() {
        F64_NAN
    } else {
        x.to_bits()
    }
}
