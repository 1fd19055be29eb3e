//! The operation and type combinations the verifier accepts, enumerated by asking it, and the
//! kernels that exercise them: shared by the coverage suites of the backends (ptxas, NVRTC)
//! and of the PTX emulator, so that a combination the IR starts to accept is covered by
//! every suite without editing any of them.
//!
//! The lists are in a fixed order (types as in [`DATA_TYPES`], operations as in their `ALL`),
//! so the kernels built from them are deterministic. The kernel builders return the
//! verifier's error if a kernel does not verify.

use std::fmt;

use crate::{
    AddrSpace, AtomicOp, BinaryOp, CmpOp, Constant, Cvt, Kernel, KernelBuilder, MmaType, Rounding, ScalarType,
    ShflMode, SpecialReg, Type, UnaryOp, Value, VerifyError, VoteMode,
};

/// Every scalar type that may live in memory (all but `pred`).
pub const DATA_TYPES: [ScalarType; 12] = [
    ScalarType::I8,
    ScalarType::I16,
    ScalarType::I32,
    ScalarType::I64,
    ScalarType::U8,
    ScalarType::U16,
    ScalarType::U32,
    ScalarType::U64,
    ScalarType::F16,
    ScalarType::BF16,
    ScalarType::F32,
    ScalarType::F64,
];

/// The types the IR does arithmetic on.
pub const ARITH_TYPES: [ScalarType; 8] = [
    ScalarType::I16,
    ScalarType::U16,
    ScalarType::I32,
    ScalarType::U32,
    ScalarType::I64,
    ScalarType::U64,
    ScalarType::F32,
    ScalarType::F64,
];

/// The rounding choices of a conversion: none, then each mode.
pub const ROUNDINGS: [Option<Rounding>; 5] =
    [None, Some(Rounding::Rn), Some(Rounding::Rz), Some(Rounding::Rm), Some(Rounding::Rp)];

/// A global pointer to `t`.
pub fn global(t: ScalarType) -> Type {
    Type::Ptr(AddrSpace::Global, t)
}

/// Whether the verifier accepts `op` applied to fresh parameters of the given types.
pub fn accepts(param_types: &[Type], op: impl FnOnce(&mut KernelBuilder, &[Value])) -> bool {
    let mut b = KernelBuilder::new("probe");
    let params: Vec<Value> = param_types.iter().enumerate().map(|(i, t)| b.param(format!("p{i}"), *t)).collect();
    op(&mut b, &params);
    b.finish().is_ok()
}

/// One arithmetic operation of the enumeration on a type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithOp {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Fma,
    Cmp(CmpOp),
}

impl fmt::Display for ArithOp {
    /// The op's IR name; compares as `cmp.<op>` (the GPU check's spec relies on these names).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArithOp::Unary(op) => write!(f, "{op}"),
            ArithOp::Binary(op) => write!(f, "{op}"),
            ArithOp::Fma => f.write_str("fma"),
            ArithOp::Cmp(op) => write!(f, "cmp.{op}"),
        }
    }
}

/// The operands an [`ArithOp`] is applied to, all of one arithmetic type but `amount`.
#[derive(Clone, Copy, Debug)]
pub struct ArithOperands {
    pub x: Value,
    pub y: Value,
    pub z: Value,
    /// The `u32` shift amount.
    pub amount: Value,
    /// The right operand of `div` and `rem` (`y`, or a value that cannot be zero where the
    /// engine under test treats integer division by zero as an error).
    pub divisor: Value,
}

impl ArithOp {
    /// Applies the operation: unary ops to `x`, binary ops to `x` and `y` (`amount` for
    /// shifts, `divisor` for `div`/`rem`), fma to all three, compares to `x` and `y`.
    #[track_caller]
    pub fn apply(self, b: &mut KernelBuilder, o: &ArithOperands) -> Value {
        match self {
            ArithOp::Unary(op) => b.unary(op, o.x),
            ArithOp::Binary(op @ (BinaryOp::Shl | BinaryOp::Shr)) => b.binary(op, o.x, o.amount),
            ArithOp::Binary(op @ (BinaryOp::Div | BinaryOp::Rem)) => b.binary(op, o.x, o.divisor),
            ArithOp::Binary(op) => b.binary(op, o.x, o.y),
            ArithOp::Fma => b.fma(o.x, o.y, o.z),
            ArithOp::Cmp(op) => b.cmp(op, o.x, o.y),
        }
    }
}

/// Every unary, binary, fma and compare operation the verifier accepts on `t`, in that order.
pub fn arith_ops(t: ScalarType) -> Vec<ArithOp> {
    let ty = Type::Scalar(t);
    let unary = UnaryOp::ALL.iter().map(|&op| ArithOp::Unary(op));
    let binary = BinaryOp::ALL.iter().map(|&op| ArithOp::Binary(op));
    let cmp = CmpOp::ALL.iter().map(|&op| ArithOp::Cmp(op));
    unary
        .chain(binary)
        .chain([ArithOp::Fma])
        .chain(cmp)
        .filter(|op| {
            accepts(&[ty, ty, ty, Type::U32], |b, p| {
                let o = ArithOperands { x: p[0], y: p[1], z: p[2], amount: p[3], divisor: p[1] };
                op.apply(b, &o);
            })
        })
        .collect()
}

/// Every conversion the verifier accepts between data types: (from, cvt).
pub fn conversions() -> Vec<(ScalarType, Cvt)> {
    let mut all = vec![];
    for from in DATA_TYPES {
        for to in DATA_TYPES {
            for rounding in ROUNDINGS {
                for sat in [false, true] {
                    let cvt = Cvt { to, rounding, sat };
                    if accepts(&[Type::Scalar(from)], |b, p| {
                        b.cvt_with(p[0], cvt);
                    }) {
                        all.push((from, cvt));
                    }
                }
            }
        }
    }
    all
}

/// Whether PTX has the conversion only from sm_90 (both backends refuse it for sm_80): a bf16
/// result with `.rm`/`.rp`, or from f64 or a 32/64-bit integer.
pub fn cvt_needs_sm90(from: ScalarType, cvt: Cvt) -> bool {
    cvt.to == ScalarType::BF16
        && from != ScalarType::BF16
        && (matches!(cvt.rounding, Some(Rounding::Rm | Rounding::Rp))
            || from == ScalarType::F64
            || (from.is_int() && from.bits() >= 32))
}

/// Every bitcast the verifier accepts between data types: (from, to).
pub fn bitcasts() -> Vec<(ScalarType, ScalarType)> {
    let mut all = vec![];
    for from in DATA_TYPES {
        for to in DATA_TYPES {
            if accepts(&[Type::Scalar(from)], |b, p| {
                b.bitcast(p[0], to);
            }) {
                all.push((from, to));
            }
        }
    }
    all
}

/// Every atomic operation the verifier accepts on `t` in `space`.
pub fn atomic_ops(t: ScalarType, space: AddrSpace) -> Vec<AtomicOp> {
    AtomicOp::ALL
        .iter()
        .copied()
        .filter(|&op| {
            // Shared pointers cannot be parameters: the probe makes one in the kernel.
            accepts(&[global(t), Type::Scalar(t)], |b, a| {
                let ptr = if space == AddrSpace::Global { a[0] } else { b.dyn_shared_ptr(t) };
                if op == AtomicOp::Cas {
                    b.atomic_cas(ptr, a[1], a[1]);
                } else {
                    b.atomic(op, ptr, a[1]);
                }
            })
        })
        .collect()
}

/// Applies `op` (which [`atomic_ops`] accepted) at `ptr`; a compare-and-swap compares with
/// `value` and stores it.
#[track_caller]
pub fn apply_atomic(b: &mut KernelBuilder, op: AtomicOp, ptr: Value, value: Value) -> Value {
    if op == AtomicOp::Cas {
        b.atomic_cas(ptr, value, value)
    } else {
        b.atomic(op, ptr, value)
    }
}

/// Constants at the edges of every type: both predicates; 0, 1, all ones, the sign bit alone
/// and all bits below it, of every data type; float NaN, -inf, inexact decimals, subnormals.
pub fn edge_constants() -> Vec<Constant> {
    let mut constants = vec![Constant::pred(true), Constant::pred(false)];
    for t in DATA_TYPES {
        for bits in [0, 1, u64::MAX, 1u64 << (t.bits() - 1), (1u64 << (t.bits() - 1)) - 1] {
            constants.push(Constant::new(t, bits));
        }
    }
    constants.extend([
        Constant::f32(f32::NAN),
        Constant::f32(f32::NEG_INFINITY),
        Constant::f32(0.1),
        Constant::f32(-3.0),
        Constant::f32(1e-45),
        Constant::f64(-0.0),
        Constant::f64(1e-310),
        Constant::f64(std::f64::consts::PI),
    ]);
    constants
}

/// Stores values of any type into one byte buffer (the `out` parameter), each at its own
/// slot, so that every operation of a coverage kernel has a visible effect.
pub struct Sink {
    pub out: Value,
    next: u32,
}

impl Sink {
    /// Declares the `out` parameter.
    pub fn new(b: &mut KernelBuilder) -> Sink {
        Sink { out: b.param("out", global(ScalarType::U8)), next: 0 }
    }

    /// Store `v` (scalar, vector or predicate, as a `u32` 0 or 1) into the next slot.
    #[track_caller]
    pub fn put(&mut self, b: &mut KernelBuilder, v: Value) {
        let v = if b.ty(v) == Type::PRED {
            let one = b.const_u32(1);
            let zero = b.const_u32(0);
            b.select(v, one, zero)
        } else {
            v
        };
        let elem = b.ty(v).elem();
        let p = b.ptr_cast(self.out, elem);
        let i = b.const_u32(self.next);
        self.next += 4;
        let p = b.ptr_add(p, i);
        b.store(p, v);
    }
}

/// `arith_<t>`: every [`arith_ops`] operation on parameters `x`, `y`, `z` of type `t` (and a
/// `u32` shift amount), each compare feeding a select. Returns the kernel and how many
/// operations other than fma it holds.
pub fn arith_kernel(t: ScalarType) -> Result<(Kernel, usize), VerifyError> {
    let ty = Type::Scalar(t);
    let mut b = KernelBuilder::new(format!("arith_{t}"));
    let mut sink = Sink::new(&mut b);
    let (x, y, z) = (b.param("x", ty), b.param("y", ty), b.param("z", ty));
    let amount = b.param("amount", Type::U32);
    let o = ArithOperands { x, y, z, amount, divisor: y };
    let mut count = 0;
    for op in arith_ops(t) {
        let mut v = op.apply(&mut b, &o);
        if matches!(op, ArithOp::Cmp(_)) {
            v = b.select(v, x, z);
        }
        count += usize::from(op != ArithOp::Fma);
        sink.put(&mut b, v);
    }
    Ok((b.finish()?, count))
}

/// `preds`: predicate logic, compares of predicates, select on them, constant predicates and
/// every vote.
pub fn preds_kernel() -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new("preds");
    let mut sink = Sink::new(&mut b);
    let (x, y) = (b.param("x", Type::U32), b.param("y", Type::U32));
    let p = b.lt(x, y);
    let tid = b.thread_id_x();
    let q = b.gt(tid, x);
    let mut preds = vec![b.and(p, q), b.or(p, q), b.xor(p, q), b.not(p), b.eq(p, q), b.ne(p, q), b.select(p, q, p)];
    let t = b.const_pred(true);
    let f = b.const_pred(false);
    preds.push(b.and(t, f));
    for &mode in VoteMode::ALL {
        preds.push(b.vote(mode, q));
    }
    for v in preds {
        sink.put(&mut b, v);
    }
    b.finish()
}

/// The conversions `convs`, each of a value of its source type loaded from the `src` buffer.
pub fn cvt_kernel(name: &str, convs: &[(ScalarType, Cvt)]) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(name);
    let mut sink = Sink::new(&mut b);
    let src = b.param("src", global(ScalarType::U8));
    let mut inputs = vec![];
    for (i, t) in DATA_TYPES.into_iter().enumerate() {
        let p = b.ptr_cast(src, t);
        let idx = b.const_u32(i as u32);
        let p = b.ptr_add(p, idx);
        inputs.push((t, b.load(p)));
    }
    for &(from, cvt) in convs {
        let Some(&(_, v)) = inputs.iter().find(|(t, _)| *t == from) else {
            return Err(VerifyError {
                kernel: name.to_string(),
                op: "cvt".to_string(),
                loc: None,
                message: format!("no input of type {from}: the coverage conversions start from a data type"),
                context: String::new(),
            });
        };
        let r = b.cvt_with(v, cvt);
        sink.put(&mut b, r);
    }
    b.finish()
}

/// `bits`: every [`bitcasts`] pair on values loaded from `src`, and every [`edge_constants`]
/// constant. Returns the kernel and its number of bitcasts.
pub fn bits_kernel() -> Result<(Kernel, usize), VerifyError> {
    let mut b = KernelBuilder::new("bits");
    let mut sink = Sink::new(&mut b);
    let src = b.param("src", global(ScalarType::U8));
    let pairs = bitcasts();
    for (i, from) in DATA_TYPES.into_iter().enumerate() {
        let p = b.ptr_cast(src, from);
        let idx = b.const_u32(i as u32);
        let p = b.ptr_add(p, idx);
        let v = b.load(p);
        for &(_, to) in pairs.iter().filter(|(f, _)| *f == from) {
            let r = b.bitcast(v, to);
            sink.put(&mut b, r);
        }
    }
    for c in edge_constants() {
        let v = b.constant(c);
        sink.put(&mut b, v);
    }
    Ok((b.finish()?, pairs.len()))
}

/// `memory`: loads and stores (scalar, v2, v4) of every data type through global, static
/// shared and dynamic shared pointers, every index type of `ptradd`, and every atomic
/// [`atomic_ops`] accepts. Returns the kernel and its number of atomics.
pub fn memory_kernel() -> Result<(Kernel, usize), VerifyError> {
    let mut b = KernelBuilder::new("memory");
    let mut sink = Sink::new(&mut b);
    let g = b.param("g", global(ScalarType::U8));
    let i32v = b.param("i", Type::I32);
    let idx = [i32v, b.param("u", Type::U32), b.param("l", Type::I64), b.param("ul", Type::U64)];
    let tile = b.shared_array("tile", ScalarType::U8, 4096);
    let words = b.shared_array("words", ScalarType::F64, 64);
    let s = b.shared_ptr(tile);
    let w = b.shared_ptr(words);
    let d = b.dyn_shared_ptr(ScalarType::U8);
    let mut atomics = 0;
    for base in [g, s, d, w] {
        let space = if base == g { AddrSpace::Global } else { AddrSpace::Shared };
        for t in DATA_TYPES {
            let p = b.ptr_cast(base, t);
            for &i in &idx {
                let q = b.ptr_add(p, i);
                let v = b.load(q);
                sink.put(&mut b, v);
            }
            for lanes in [2u8, 4] {
                // Stored elsewhere, so that a compiler cannot drop the pair as a no-op.
                let q = b.ptr_add(p, i32v);
                let v = b.load_vec(q, lanes);
                let elsewhere = b.ptr_add(p, idx[1]);
                b.store(elsewhere, v);
            }
            let v = b.load(p);
            b.store(p, v);
            for op in atomic_ops(t, space) {
                let old = apply_atomic(&mut b, op, p, v);
                sink.put(&mut b, old);
                atomics += 1;
            }
        }
    }
    Ok((b.finish()?, atomics))
}

/// `warp`: every special register, every shuffle mode on u32, s32 and f32, a barrier.
pub fn warp_kernel() -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new("warp");
    let mut sink = Sink::new(&mut b);
    let lane = b.param("lane", Type::U32);
    for &s in SpecialReg::ALL.iter() {
        let v = b.special(s);
        sink.put(&mut b, v);
    }
    for t in [Type::U32, Type::I32, Type::F32] {
        let x = b.param(format!("x_{t}"), t);
        for &mode in ShflMode::ALL {
            let v = b.shfl(mode, x, lane);
            sink.put(&mut b, v);
        }
    }
    b.barrier();
    b.finish()
}

/// `params`: a value and a pointer parameter of every data type, parameters whose names are
/// keywords or not identifiers, launch bounds (128, 4).
pub fn params_kernel() -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new("params");
    let mut sink = Sink::new(&mut b);
    for t in DATA_TYPES {
        let v = b.param(format!("v_{t}"), t);
        sink.put(&mut b, v);
        let p = b.param(format!("p_{t}"), global(t));
        let x = b.load(p);
        sink.put(&mut b, x);
    }
    for name in ["int", "v1", "ruda_x", "2x", "a-b", "out", "v2_gemm", "v3_next"] {
        let v = b.param(name, Type::U32);
        sink.put(&mut b, v);
    }
    b.launch_bounds(128, Some(4));
    b.finish()
}

/// `vectors`: vectors built, taken apart, selected per element and carried through a loop.
pub fn vectors_kernel() -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new("vectors");
    let mut sink = Sink::new(&mut b);
    let p = b.param("p", global(ScalarType::F16));
    let n = b.param("n", Type::U32);
    let v = b.load_vec(p, 4);
    let lanes: Vec<Value> = (0..4).map(|i| b.extract(v, i)).collect();
    let swapped = b.make_vector(&[lanes[3], lanes[2], lanes[1], lanes[0]]);
    let pair = b.make_vector(&lanes[..2]);
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let out = b.for_range(zero, n, one, &[swapped, pair], |b, _, c| {
        let first = b.extract(c[0], 0);
        let again = b.make_vector(&[first, first]);
        vec![c[0], again]
    });
    b.store(p, out[0]);
    let x = b.extract(out[1], 1);
    sink.put(&mut b, x);
    b.finish()
}

/// `control`: a divergent if with results of several kinds (scalar, pointer, predicate,
/// vector), an if without else nested in a uniform if, a uniform loop carrying a swapped pair
/// with a barrier, a nested divergent loop and an if inside, and loops over every induction
/// type. Launch bounds 256.
pub fn control_kernel() -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new("control");
    let mut sink = Sink::new(&mut b);
    let n = b.param("n", Type::U32);
    let x = b.param("x", Type::F32);
    let data = b.param("data", global(ScalarType::F32));
    b.launch_bounds(256, None);
    let tile = b.shared_array("tile", ScalarType::F32, 256);
    let tid = b.thread_id_x();

    let divergent = b.lt(tid, n);
    let results = b.if_else(
        divergent,
        |b| {
            let v = b.add(x, x);
            let p = b.ptr_add(data, tid);
            let t = b.const_pred(true);
            let vec = b.make_vector(&[v, v]);
            vec![v, p, t, vec]
        },
        |b| {
            let f = b.const_pred(false);
            let vec = b.make_vector(&[x, x]);
            vec![x, data, f, vec]
        },
    );
    b.store(results[1], results[0]);
    sink.put(&mut b, results[2]);
    let lane = b.extract(results[3], 1);
    sink.put(&mut b, lane);

    let zero_u = b.const_u32(0);
    let uniform = b.gt(n, zero_u);
    b.if_then(uniform, |b| {
        b.if_then(divergent, |b| {
            let p = b.ptr_add(data, tid);
            b.store(p, x);
        });
    });

    let one_u = b.const_u32(1);
    let zero_f = b.const_f32(0.0);
    let one_f = b.const_f32(1.0);
    let swapped = b.for_range(zero_u, n, one_u, &[zero_f, one_f], |b, _, c| {
        let base = b.shared_ptr(tile);
        let slot = b.ptr_add(base, tid);
        b.store(slot, c[0]);
        b.barrier();
        let inner = b.for_range(tid, n, one_u, &[c[1]], |b, j, d| {
            let odd = b.and(j, one_u);
            let is_odd = b.ne(odd, zero_u);
            let r = b.if_else(is_odd, |b| vec![b.mul(d[0], x)], |_| vec![d[0]]);
            vec![r[0]]
        });
        let bumped = b.add(inner[0], c[0]);
        vec![c[1], bumped]
    });
    sink.put(&mut b, swapped[0]);
    sink.put(&mut b, swapped[1]);

    // The carried value is the induction variable itself.
    for t in [ScalarType::I32, ScalarType::U32, ScalarType::I64, ScalarType::U64] {
        let start = b.constant(Constant::new(t, 0));
        let step = b.constant(Constant::new(t, 3));
        let end = b.cvt(n, t);
        let last = b.for_range(start, end, step, &[start], |_, iv, _| vec![iv]);
        sink.put(&mut b, last[0]);
    }
    b.finish()
}

/// `fib`: a loop carrying `(a, b) -> (b, a + b)`, which needs a parallel copy (`b` read
/// before `a` is overwritten with it); stores `a` to `out`.
pub fn fib_kernel() -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new("fib");
    let out = b.param("out", global(ScalarType::U32));
    let n = b.param("n", Type::U32);
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let r = b.for_range(zero, n, one, &[zero, one], |b, _, c| {
        let s = b.add(c[0], c[1]);
        vec![c[1], s]
    });
    b.store(out, r[0]);
    b.finish()
}

/// `mma_<ty>_<n|t>`: each lane copies 8 words of `in` to a shared tile, then `ldmatrix`es its A
/// (x4), B (x2, transposed when `trans`) and an x1, runs `mma.m16n8k16` with C from `c`, and
/// stores D to `d[4 * lane ..]` and the x1 register over `d[lane]`.
pub fn tensor_core_kernel(ty: MmaType, trans: bool) -> Result<Kernel, VerifyError> {
    use ScalarType::{BF16, F16, F32, U32};
    let mut b = KernelBuilder::new(format!("mma_{ty}_{}", if trans { "t" } else { "n" }));
    let pin = b.param("in", global(U32));
    let pc = b.param("c", global(F32));
    let pd = b.param("d", global(F32));
    let tile = b.shared_array("tile", U32, 256);
    let s = b.shared_ptr(tile);
    let lane = b.lane_id();
    let eight = b.const_u32(8);
    let base = b.mul(lane, eight);
    for j in 0..8 {
        let jj = b.const_u32(j);
        let i = b.add(base, jj);
        let src = b.ptr_add(pin, i);
        let x = b.load(src);
        let dst = b.ptr_add(s, i);
        b.store(dst, x);
    }
    b.barrier();
    let h = b.ptr_cast(s, if ty == MmaType::F16 { F16 } else { BF16 });
    let sixteen = b.const_u32(16);
    let row = b.mul(lane, sixteen);
    let p = b.ptr_add(h, row);
    let a = b.ldmatrix(p, 4, false);
    let bf = b.ldmatrix(p, 2, trans);
    let one = b.ldmatrix(p, 1, trans);
    let four = b.const_u32(4);
    let l4 = b.mul(lane, four);
    let qc = b.ptr_add(pc, l4);
    let c = b.load_vec(qc, 4);
    let d = b.mma_m16n8k16(ty, a, bf, c);
    let qd = b.ptr_add(pd, l4);
    b.store(qd, d);
    let x = b.bitcast(one, F32);
    let qx = b.ptr_add(pd, lane);
    b.store(qx, x);
    b.finish()
}

/// Tiles of `cp_async_kernel`: 32 threads copy 16 bytes each, 128 `u32` per tile.
pub const CP_ASYNC_TILE: u32 = 128;

/// `cp_async_pipeline`, one block of 32 threads: `x` holds `tiles` tiles of
/// [`CP_ASYNC_TILE`] `u32`, streamed through a two-stage shared buffer by `cp.async.16`
/// (the next tile's copy is issued before the current one is waited for, with a zero-fill
/// past the last tile), each thread summing the words `(4 * tid + 5 * j) % 128`, `j < 8`, of
/// every tile into `out[tid]` (wrapping). Then a tail of `cp.async.8` with source sizes
/// `tid % 9` and `cp.async.4` with `tid % 5`, waited with `wait_all`, copies `x[2 * tid ..]`
/// and `x[tid]` through shared memory to `out[32 + 2 * tid ..]` and `out[96 + tid]` (128
/// words of `out` in all).
pub fn cp_async_kernel(tiles: u32) -> Result<Kernel, VerifyError> {
    use ScalarType::U32;
    let mut b = KernelBuilder::new("cp_async_pipeline");
    let x = b.param("x", global(U32));
    let out = b.param("out", global(U32));
    let stages = b.shared_array("stages", U32, 2 * CP_ASYNC_TILE);
    let tail = b.shared_array("tail", U32, 96);
    let s = b.shared_ptr(stages);
    let tid = b.thread_id_x();
    let (zero, one, two, four, five, sixteen) =
        (b.const_u32(0), b.const_u32(1), b.const_u32(2), b.const_u32(4), b.const_u32(5), b.const_u32(16));
    let (tile_words, last, n) = (b.const_u32(CP_ASYNC_TILE), b.const_u32(tiles - 1), b.const_u32(tiles));
    let mask = b.const_u32(CP_ASYNC_TILE - 1);
    let t4 = b.mul(tid, four);
    // Issue tile `i` into stage `i % 2`; past the last tile, read nothing and zero-fill.
    let issue = |b: &mut KernelBuilder, i: Value| {
        let valid = b.lt(i, n);
        let bytes = b.select(valid, sixteen, zero);
        let clamped = b.min(i, last);
        let base = b.mul(clamped, tile_words);
        let at = b.add(base, t4);
        let src = b.ptr_add(x, at);
        let stage = b.and(i, one);
        let soff = b.mul(stage, tile_words);
        let soff = b.add(soff, t4);
        let dst = b.ptr_add(s, soff);
        b.cp_async_zfill(dst, src, 16, bytes);
        b.cp_async_commit();
    };
    issue(&mut b, zero);
    let sums = b.for_range(zero, n, one, &[zero], |b, i, carried| {
        let next = b.add(i, one);
        issue(b, next);
        b.cp_async_wait(1);
        b.barrier();
        let stage = b.and(i, one);
        let sbase = b.mul(stage, tile_words);
        let mut acc = carried[0];
        for j in 0..8 {
            let k = b.const_u32(5 * j);
            let w = b.add(t4, k);
            let w = b.and(w, mask);
            let w = b.add(sbase, w);
            let p = b.ptr_add(s, w);
            let v = b.load(p);
            acc = b.add(acc, v);
        }
        b.barrier();
        vec![acc]
    });
    b.cp_async_wait(0);
    let q = b.ptr_add(out, tid);
    b.store(q, sums[0]);
    // The tail: 8- and 4-byte copies with partial source sizes.
    let tl = b.shared_ptr(tail);
    let t2 = b.mul(tid, two);
    let nine = b.const_u32(9);
    let src8 = b.ptr_add(x, t2);
    let dst8 = b.ptr_add(tl, t2);
    let bytes8 = b.rem(tid, nine);
    b.cp_async_zfill(dst8, src8, 8, bytes8);
    let src4 = b.ptr_add(x, tid);
    let sixty_four = b.const_u32(64);
    let at4 = b.add(sixty_four, tid);
    let dst4 = b.ptr_add(tl, at4);
    let bytes4 = b.rem(tid, five);
    b.cp_async_zfill(dst4, src4, 4, bytes4);
    b.cp_async_wait_all();
    b.barrier();
    let r8 = b.ptr_add(tl, t2);
    let v8 = b.load_vec(r8, 2);
    let thirty_two = b.const_u32(32);
    let o8 = b.add(thirty_two, t2);
    let q8 = b.ptr_add(out, o8);
    b.store(q8, v8);
    let r4 = b.ptr_add(tl, at4);
    let v4 = b.load(r4);
    let o4 = b.const_u32(96);
    let o4 = b.add(o4, tid);
    let q4 = b.ptr_add(out, o4);
    b.store(q4, v4);
    b.finish()
}

/// What [`cp_async_kernel`] writes to `out`, computed directly from `x`.
pub fn cp_async_expected(x: &[u32], tiles: u32) -> Vec<u32> {
    let n = CP_ASYNC_TILE as usize;
    let mut out = vec![0u32; 128];
    for t in 0..32usize {
        for i in 0..tiles as usize {
            for j in 0..8 {
                out[t] = out[t].wrapping_add(x[i * n + (4 * t + 5 * j) % n]);
            }
        }
        let bytes = |word: u32, keep: usize, from: usize| {
            let b = word.to_le_bytes();
            let mut r = [0u8; 4];
            for (k, v) in r.iter_mut().enumerate() {
                if from + k < keep {
                    *v = b[k];
                }
            }
            u32::from_le_bytes(r)
        };
        out[32 + 2 * t] = bytes(x[2 * t], t % 9, 0);
        out[33 + 2 * t] = bytes(x[2 * t + 1], t % 9, 4);
        out[96 + t] = bytes(x[t], t % 5, 0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enumerations_find_the_known_combinations() {
        assert!(conversions().len() > 400);
        assert_eq!(bitcasts().len(), 2 * 2 + 4 * 4 + 3 * 3 + 3 * 3, "every same-width pair");
        let per_type = |t| atomic_ops(t, AddrSpace::Global).len() + atomic_ops(t, AddrSpace::Shared).len();
        let atomics: usize = DATA_TYPES.into_iter().map(per_type).sum();
        assert_eq!(atomics, 2 * (5 + 4 + 4 + 6 + 6), "add: 5 types; min/max: 4; exch/cas: 6");
        for t in ARITH_TYPES {
            let ops = arith_ops(t);
            assert!(ops.contains(&ArithOp::Fma) && ops.len() >= 13, "{t}: {ops:?}");
            assert_eq!(ops.contains(&ArithOp::Unary(UnaryOp::Sqrt)), t.is_float(), "{t}");
        }
        // f16 is storage only: no arithmetic at all.
        assert!(arith_ops(ScalarType::F16).is_empty());
        assert_eq!(ArithOp::Cmp(CmpOp::Lt).to_string(), "cmp.lt");
        let bf16_from_f32 = Cvt { to: ScalarType::BF16, rounding: Some(Rounding::Rn), sat: false };
        assert!(!cvt_needs_sm90(ScalarType::F32, bf16_from_f32));
        assert!(cvt_needs_sm90(ScalarType::F64, bf16_from_f32));
    }

    #[test]
    fn every_kernel_verifies() {
        for t in ARITH_TYPES {
            arith_kernel(t).unwrap();
        }
        let all = conversions();
        cvt_kernel("cvt", &all).unwrap();
        for k in [preds_kernel(), warp_kernel(), params_kernel(), vectors_kernel(), control_kernel(), fib_kernel()] {
            k.unwrap();
        }
        bits_kernel().unwrap();
        memory_kernel().unwrap();
        cp_async_kernel(3).unwrap();
        for ty in MmaType::ALL {
            tensor_core_kernel(*ty, false).unwrap();
            tensor_core_kernel(*ty, true).unwrap();
        }
    }
}
