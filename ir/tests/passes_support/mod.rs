//! Helpers shared by the pass tests: apply a pipeline, run a kernel before and after on the
//! same inputs, and the edge values inputs are made of.
#![allow(dead_code)] // each test crate uses a different subset

use ruda_ir::interp::{run_with_threads, InterpError, KernelArg, LaunchConfig};
use ruda_ir::passes::{parse_pipeline, run_pipeline};
use ruda_ir::{print_kernel, AddrSpace, Constant, Kernel, KernelBuilder, Op, ScalarType, Type, Value};

/// An owned kernel argument.
#[derive(Clone, Debug)]
pub enum Arg {
    Buffer(Vec<u8>),
    Scalar(Constant),
}

pub fn gptr(t: ScalarType) -> Type {
    Type::Ptr(AddrSpace::Global, t)
}

/// Run `pipeline` (pass names, comma-separated) on a copy of `k`, verifying after each pass.
pub fn optimized(k: &Kernel, pipeline: &str) -> Kernel {
    let mut out = k.clone();
    let passes = parse_pipeline(pipeline).expect("known passes");
    run_pipeline(&mut out, &passes, None).unwrap_or_else(|e| panic!("{e}\nbefore:\n{}", print_kernel(k)));
    out
}

/// Run `k` on a copy of `args`; the buffers afterwards.
pub fn run(k: &Kernel, launch: LaunchConfig, args: &[Arg]) -> Result<Vec<Vec<u8>>, InterpError> {
    let mut owned: Vec<Arg> = args.to_vec();
    let mut kargs: Vec<KernelArg<'_>> = owned
        .iter_mut()
        .map(|a| match a {
            Arg::Buffer(b) => KernelArg::Buffer(b.as_mut_slice()),
            Arg::Scalar(c) => KernelArg::Scalar(*c),
        })
        .collect();
    run_with_threads(k, &launch, &mut kargs, 1)?;
    drop(kargs);
    Ok(owned
        .into_iter()
        .filter_map(|a| match a {
            Arg::Buffer(b) => Some(b),
            Arg::Scalar(_) => None,
        })
        .collect())
}

/// `before` and `after` give bit-identical buffers, or fail with the same error message.
pub fn assert_same(before: &Kernel, after: &Kernel, launch: LaunchConfig, args: &[Arg]) {
    let (a, b) = (run(before, launch, args), run(after, launch, args));
    match (&a, &b) {
        (Ok(x), Ok(y)) => {
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                assert!(
                    x == y,
                    "buffer {i} differs\nbefore:\n{}\nafter:\n{}\nexpected {x:02x?}\n   found {y:02x?}",
                    print_kernel(before),
                    print_kernel(after)
                );
            }
        }
        (Err(x), Err(y)) => assert_eq!(
            (&x.op, &x.message, x.block, x.thread),
            (&y.op, &y.message, y.block, y.thread),
            "errors differ\nbefore:\n{}\nafter:\n{}",
            print_kernel(before),
            print_kernel(after)
        ),
        _ => panic!("before: {a:?}\nafter: {b:?}\nbefore:\n{}\nafter:\n{}", print_kernel(before), print_kernel(after)),
    }
}

/// Apply `pipeline`, check the result against the original on `args`, return it.
pub fn check(k: &Kernel, pipeline: &str, launch: LaunchConfig, args: &[Arg]) -> Kernel {
    let after = optimized(k, pipeline);
    assert_same(k, &after, launch, args);
    after
}

/// Instructions reachable from the entry region.
pub fn inst_count(k: &Kernel) -> usize {
    let mut n = 0;
    k.walk(|_, _| n += 1);
    n
}

/// How many reachable instructions satisfy `f`.
pub fn count(k: &Kernel, f: impl Fn(&Op) -> bool) -> usize {
    let mut n = 0;
    k.walk(|_, i| n += f(&i.op) as usize);
    n
}

/// Little-endian bytes of `vals`, each `bytes` wide.
pub fn bytes_of(vals: &[u64], bytes: usize) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()[..bytes].to_vec()).collect()
}

/// Edge values of a type, as bit patterns.
pub fn edges(t: ScalarType) -> Vec<u64> {
    use ScalarType::*;
    match t {
        F32 => [
            0.0f32.to_bits(),
            (-0.0f32).to_bits(),
            1.0f32.to_bits(),
            (-1.0f32).to_bits(),
            0.1f32.to_bits(),
            3.5f32.to_bits(),
            f32::INFINITY.to_bits(),
            f32::NEG_INFINITY.to_bits(),
            0x7fff_ffff, // the canonical NaN
            0x7fc0_0001, // a NaN with another payload
            0xffc0_0000, // a negative NaN
            1,           // the smallest subnormal
            f32::MAX.to_bits(),
            f32::MIN_POSITIVE.to_bits(),
            16_777_217.0f32.to_bits(),
            (-2.5f32).to_bits(),
        ]
        .map(u64::from)
        .to_vec(),
        F64 => vec![
            0.0f64.to_bits(),
            (-0.0f64).to_bits(),
            1.0f64.to_bits(),
            (-1.0f64).to_bits(),
            0.1f64.to_bits(),
            f64::INFINITY.to_bits(),
            f64::NEG_INFINITY.to_bits(),
            0x7fff_ffff_ffff_ffff,
            0x7ff8_0000_0000_0001,
            0xfff8_0000_0000_0000,
            1,
            f64::MAX.to_bits(),
            (-2.5f64).to_bits(),
            1e300f64.to_bits(),
            3.0f64.to_bits(),
            (1u64 << 53) as f64 as u64,
        ],
        t if t.is_int() => {
            let bits = t.bits();
            let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
            let min = if t.is_signed_int() { 1u64 << (bits - 1) } else { 0 };
            [
                0,
                1,
                2,
                3,
                7,
                8,
                15,
                16,
                100,
                u64::MAX,
                u64::MAX - 1,
                u64::MAX - 6,
                min,
                min.wrapping_sub(1),
                min + 1,
                12345,
            ]
            .iter()
            .map(|v| v & mask)
            .collect()
        }
        // Both 16-bit float formats: zeros, ones, infinities, the canonical NaN `0x7fff`, NaNs
        // of other payloads and signs, the smallest subnormal, the largest finite value.
        F16 => vec![0x0000, 0x8000, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7fff, 0x7e00, 0x7c01, 0xfe00, 0x0001, 0x7bff],
        BF16 => vec![0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fff, 0x7fc0, 0x7f81, 0xffc0, 0x0001, 0x7f7f],
        _ => vec![0, 1],
    }
}

/// A kernel `out[i] = f(x[i], y[i])` over `n` elements of type `t` (loaded from two buffers),
/// one thread per element, result type `out_t`.
pub fn binary_map(
    t: ScalarType,
    out_t: ScalarType,
    f: impl FnOnce(&mut KernelBuilder, Value, Value) -> Value,
) -> Kernel {
    let mut b = KernelBuilder::new("map");
    let x = b.param("x", gptr(t));
    let y = b.param("y", gptr(t));
    let out = b.param("out", gptr(out_t));
    let n = b.param("n", Type::U32);
    let i = b.global_thread_id_x();
    let ok = b.lt(i, n);
    b.if_then(ok, |b| {
        let px = b.ptr_add(x, i);
        let a = b.load(px);
        let py = b.ptr_add(y, i);
        let c = b.load(py);
        let r = f(b, a, c);
        let po = b.ptr_add(out, i);
        b.store(po, r);
    });
    b.finish().expect("verifies")
}

/// Inputs for [`binary_map`]: every pair of edge values of `t`.
pub fn pair_args(t: ScalarType, out_t: ScalarType) -> (LaunchConfig, Vec<Arg>) {
    let e = edges(t);
    let (mut xs, mut ys) = (vec![], vec![]);
    for &a in &e {
        for &b in &e {
            xs.push(a);
            ys.push(b);
        }
    }
    let n = xs.len();
    let size = t.bytes() as usize;
    let args = vec![
        Arg::Buffer(bytes_of(&xs, size)),
        Arg::Buffer(bytes_of(&ys, size)),
        Arg::Buffer(vec![0u8; n * out_t.bytes() as usize]),
        Arg::Scalar(Constant::u32(n as u32)),
    ];
    (LaunchConfig::linear((n as u32).div_ceil(64), 64), args)
}

/// Store each of `vals` into its own 8-byte slot of `out` (a `u8` buffer); predicates as a
/// `u32` 0 or 1.
pub fn store_slots(b: &mut KernelBuilder, out: Value, vals: &[Value]) {
    for (i, &v) in vals.iter().enumerate() {
        let v = if b.ty(v) == Type::PRED {
            let (one, zero) = (b.const_u32(1), b.const_u32(0));
            b.select(v, one, zero)
        } else {
            v
        };
        let t = b.ty(v).elem();
        let p = b.ptr_cast(out, t);
        let index = b.const_u32(8 * i as u32 / t.bytes());
        let p = b.ptr_add(p, index);
        b.store(p, v);
    }
}

/// A one-thread kernel storing the values `f` builds into slots of its only buffer.
pub fn slots_kernel(f: impl FnOnce(&mut KernelBuilder) -> Vec<Value>) -> (Kernel, usize) {
    let mut b = KernelBuilder::new("slots");
    let out = b.param("out", gptr(ScalarType::U8));
    let vals = f(&mut b);
    store_slots(&mut b, out, &vals);
    (b.finish().expect("verifies"), vals.len())
}

/// Run a [`slots_kernel`] before and after `pipeline`; the optimised kernel.
pub fn check_slots(k: &Kernel, slots: usize, pipeline: &str) -> Kernel {
    check(k, pipeline, LaunchConfig::linear(1, 1), &[Arg::Buffer(vec![0u8; 8 * slots.max(1)])])
}

/// A kernel in which thread `i` loads `x[i]` and `y[i]` (of type `t`) and stores each value
/// `f` builds into its own 8-byte slot of `out` (a `u8` buffer, `slots` slots per thread);
/// returns the kernel and the number of slots.
pub fn multi_map(t: ScalarType, f: impl FnOnce(&mut KernelBuilder, Value, Value) -> Vec<Value>) -> (Kernel, usize) {
    let mut b = KernelBuilder::new("multi");
    let x = b.param("x", gptr(t));
    let y = b.param("y", gptr(t));
    let out = b.param("out", gptr(ScalarType::U8));
    let n = b.param("n", Type::U32);
    let i = b.global_thread_id_x();
    let ok = b.lt(i, n);
    let mut slots = 0;
    b.if_then(ok, |b| {
        let px = b.ptr_add(x, i);
        let a = b.load(px);
        let py = b.ptr_add(y, i);
        let c = b.load(py);
        let vals = f(b, a, c);
        slots = vals.len();
        let stride = b.const_u32(8 * slots as u32);
        let offset = b.mul(i, stride);
        let base = b.ptr_add(out, offset);
        store_slots(b, base, &vals);
    });
    (b.finish().expect("verifies"), slots)
}

/// Inputs for [`multi_map`]: every pair of edge values of `t`.
pub fn multi_args(t: ScalarType, slots: usize) -> (LaunchConfig, Vec<Arg>) {
    let (launch, mut args) = pair_args(t, t);
    let n = edges(t).len().pow(2);
    args[2] = Arg::Buffer(vec![0u8; n * 8 * slots]);
    (launch, args)
}

/// Build a [`multi_map`] kernel, apply `pipeline`, compare on every pair of edge values.
pub fn check_multi(
    t: ScalarType,
    pipeline: &str,
    f: impl FnOnce(&mut KernelBuilder, Value, Value) -> Vec<Value>,
) -> (Kernel, Kernel) {
    let (k, slots) = multi_map(t, f);
    let (launch, args) = multi_args(t, slots);
    let after = check(&k, pipeline, launch, &args);
    (k, after)
}
