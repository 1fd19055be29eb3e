//! Every operation and type combination the verifier accepts, emitted and assembled by ptxas
//! for sm_80 and sm_90 (sm_90a once). Combinations are enumerated by asking the verifier, so a
//! new one the IR starts to accept is covered without editing this file.

mod common;

use common::{assemble_for, global, Sink, ARITH_TYPES, DATA_TYPES};
use ruda_codegen_ptx::{emit_ptx, Arch, CodegenError, Target};
use ruda_ir::{
    AddrSpace, AtomicOp, BinaryOp, CmpOp, Constant, Cvt, Kernel, KernelBuilder, Rounding, ScalarType, ShflMode,
    SpecialReg, Type, UnaryOp, Value, VoteMode,
};

const BOTH: [Arch; 2] = [Arch::Sm80, Arch::Sm90];

/// Whether the verifier accepts `op` applied to fresh parameters of the given types.
fn accepts(param_types: &[Type], op: impl FnOnce(&mut KernelBuilder, &[Value])) -> bool {
    let mut b = KernelBuilder::new("probe");
    let params: Vec<Value> = param_types.iter().enumerate().map(|(i, t)| b.param(format!("p{i}"), *t)).collect();
    op(&mut b, &params);
    b.finish().is_ok()
}

fn finish(b: KernelBuilder) -> Kernel {
    b.finish().unwrap_or_else(|e| panic!("test kernel does not verify: {e}"))
}

/// All unary, binary, fma, compare and select operations on one arithmetic type.
fn arith_kernel(t: ScalarType) -> (Kernel, usize) {
    let ty = Type::Scalar(t);
    let mut b = KernelBuilder::new(format!("arith_{t}"));
    let mut sink = Sink::new(&mut b);
    let (x, y, z) = (b.param("x", ty), b.param("y", ty), b.param("z", ty));
    let amount = b.param("amount", Type::U32);
    let mut count = 0;
    for &op in UnaryOp::ALL {
        if accepts(&[ty], |b, p| {
            b.unary(op, p[0]);
        }) {
            let v = b.unary(op, x);
            sink.put(&mut b, v);
            count += 1;
        }
    }
    for &op in BinaryOp::ALL {
        let rhs = if matches!(op, BinaryOp::Shl | BinaryOp::Shr) { Type::U32 } else { ty };
        if accepts(&[ty, rhs], |b, p| {
            b.binary(op, p[0], p[1]);
        }) {
            let r = if rhs == Type::U32 { amount } else { y };
            let v = b.binary(op, x, r);
            sink.put(&mut b, v);
            count += 1;
        }
    }
    let v = b.fma(x, y, z);
    sink.put(&mut b, v);
    for &op in CmpOp::ALL {
        if accepts(&[ty, ty], |b, p| {
            b.cmp(op, p[0], p[1]);
        }) {
            let c = b.cmp(op, x, y);
            let v = b.select(c, x, z);
            sink.put(&mut b, v);
            count += 1;
        }
    }
    (finish(b), count)
}

#[test]
fn arithmetic_on_every_type_assembles() {
    for t in ARITH_TYPES {
        let (k, count) = arith_kernel(t);
        // Sanity of the enumeration: add/sub/mul/div/min/max and six compares at least.
        assert!(count >= 12, "{t}: only {count} operations accepted");
        let ptx = common::emit(&k, Arch::Sm80);
        assert!(!ptx.contains(".ftz"), "{t}: flush-to-zero emitted");
        if t.is_float() {
            for m in ["add.rn.", "sub.rn.", "mul.rn.", "div.rn.", "fma.rn.", "sqrt.rn.", "rcp.rn."] {
                assert!(ptx.contains(&format!("{m}{t}")), "{t}: no {m}{t} in\n{ptx}");
            }
            assert!(ptx.contains(&format!("setp.neu.{t}")) && ptx.contains(&format!("setp.nan.{t}")));
        } else {
            assert!(ptx.contains(&format!("mad.lo.{t}")), "{t}: integer fma is mad.lo");
        }
        if t == ScalarType::F32 {
            for m in [
                "rsqrt.approx.f32",
                "ex2.approx.f32",
                "lg2.approx.f32",
                "tanh.approx.f32",
                "sin.approx.f32",
                "cos.approx.f32",
            ] {
                assert!(ptx.contains(m), "no {m}");
            }
        }
        if !assemble_for(&k, &BOTH) {
            return;
        }
    }
}

#[test]
fn predicate_logic_and_votes_assemble() {
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
    let k = finish(b);
    let ptx = common::emit(&k, Arch::Sm80);
    for m in [
        "and.pred",
        "or.pred",
        "xor.pred",
        "not.pred",
        "vote.sync.all.pred",
        "vote.sync.any.pred",
        "vote.sync.ballot.b32",
    ] {
        assert!(ptx.contains(m), "no {m} in\n{ptx}");
    }
    assemble_for(&k, &BOTH);
}

/// Every conversion the verifier accepts: (from, to, rounding, sat).
fn conversions() -> Vec<(ScalarType, Cvt)> {
    let roundings = [None, Some(Rounding::Rn), Some(Rounding::Rz), Some(Rounding::Rm), Some(Rounding::Rp)];
    let mut all = vec![];
    for from in DATA_TYPES {
        for to in DATA_TYPES {
            for rounding in roundings {
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

/// Where the backend reports a conversion as unsupported on sm_80: bf16 results that need
/// sm_90 (`.rm`/`.rp`, from f64, from 32/64-bit integers).
fn needs_sm90(from: ScalarType, cvt: Cvt) -> bool {
    cvt.to == ScalarType::BF16
        && from != ScalarType::BF16
        && (matches!(cvt.rounding, Some(Rounding::Rm | Rounding::Rp))
            || from == ScalarType::F64
            || (from.is_int() && from.bits() >= 32))
}

fn cvt_kernel(name: &str, convs: &[(ScalarType, Cvt)]) -> Kernel {
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
    for (from, cvt) in convs {
        let v = inputs.iter().find(|(t, _)| t == from).map(|(_, v)| *v).expect("an input of every type");
        let r = b.cvt_with(v, *cvt);
        sink.put(&mut b, r);
    }
    finish(b)
}

#[test]
fn every_conversion_emits_or_is_rejected_by_name() {
    let convs = conversions();
    assert!(convs.len() > 400, "only {} conversions accepted by the verifier", convs.len());
    for (from, cvt) in &convs {
        let k = cvt_kernel("one_cvt", &[(*from, *cvt)]);
        for arch in Arch::ALL {
            let result = emit_ptx(&k, &Target::new(arch));
            let expect_error = arch < Arch::Sm90 && needs_sm90(*from, *cvt);
            match result {
                Ok(ptx) => {
                    assert!(!expect_error, "{from} -> {cvt:?} on {arch} should be unsupported");
                    assert!(!ptx.contains("cvt.f32.bf16") && !ptx.contains(".ftz"), "{from} -> {cvt:?}:\n{ptx}");
                }
                Err(CodegenError::Unsupported(msg)) => {
                    assert!(expect_error, "{from} -> {cvt:?} on {arch}: {msg}");
                    for part in ["one_cvt", "`cvt`", "sm_90", arch.name(), "ptxas_ops.rs"] {
                        assert!(msg.contains(part), "message lacks {part:?}: {msg}");
                    }
                }
                Err(e) => panic!("{from} -> {cvt:?} on {arch}: {e}"),
            }
        }
    }
}

#[test]
fn every_conversion_assembles() {
    let convs = conversions();
    let sm80: Vec<_> = convs.iter().copied().filter(|(f, c)| !needs_sm90(*f, *c)).collect();
    let k80 = cvt_kernel("cvt_sm80", &sm80);
    let ptx = common::emit(&k80, Arch::Sm80);
    assert!(ptx.contains(".version 7.0"));
    assert!(ptx.contains("cvt.rn.bf16.f32") && ptx.contains("cvt.rzi.s32.f32") && ptx.contains("cvt.rni.f32.f32"));
    assert!(ptx.contains("cvt.sat.s8.s32") && ptx.contains("cvt.rn.f16.f32") && ptx.contains("cvt.f32.f16"));
    if !assemble_for(&k80, &[Arch::Sm80]) {
        return;
    }
    let k90 = cvt_kernel("cvt_sm90", &convs);
    assemble_for(&k90, &[Arch::Sm90]);
}

#[test]
fn bitcasts_and_constants_assemble() {
    let mut b = KernelBuilder::new("bits");
    let mut sink = Sink::new(&mut b);
    let src = b.param("src", global(ScalarType::U8));
    let mut bitcasts = 0;
    for (i, from) in DATA_TYPES.into_iter().enumerate() {
        let p = b.ptr_cast(src, from);
        let idx = b.const_u32(i as u32);
        let p = b.ptr_add(p, idx);
        let v = b.load(p);
        for to in DATA_TYPES {
            if accepts(&[Type::Scalar(from)], |b, p| {
                b.bitcast(p[0], to);
            }) {
                let r = b.bitcast(v, to);
                sink.put(&mut b, r);
                bitcasts += 1;
            }
        }
    }
    assert_eq!(bitcasts, 2 * 2 + 4 * 4 + 3 * 3 + 3 * 3, "every same-width pair");
    let mut constants = vec![Constant::pred(true), Constant::pred(false)];
    for t in DATA_TYPES {
        for bits in [0, 1, u64::MAX, 1u64 << (t.bits() - 1), (1u64 << (t.bits() - 1)) - 1] {
            constants.push(Constant::new(t, bits));
        }
    }
    constants.extend([
        Constant::f32(f32::NAN),
        Constant::f32(f32::NEG_INFINITY),
        Constant::f64(-0.0),
        Constant::f64(1e-310),
    ]);
    for c in constants {
        let v = b.constant(c);
        sink.put(&mut b, v);
    }
    let k = finish(b);
    let ptx = common::emit(&k, Arch::Sm80);
    assert!(ptx.contains("mov.u64") && ptx.contains("18446744073709551615"), "u64::MAX as an immediate");
    assert!(ptx.contains("mov.s64") && ptx.contains("-9223372036854775808"), "i64::MIN as an immediate");
    assert!(ptx.contains("0f7FC00000") && ptx.contains("0fFF800000"), "f32 NaN and -inf as exact bits");
    assemble_for(&k, &BOTH);
}

/// Loads and stores (scalar, v2, v4) of every type through global, static shared and dynamic
/// shared pointers, every index type of `ptradd`, and every atomic the verifier accepts.
#[test]
fn memory_operations_assemble() {
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
        for t in DATA_TYPES {
            let p = b.ptr_cast(base, t);
            for &i in &idx {
                let q = b.ptr_add(p, i);
                let v = b.load(q);
                sink.put(&mut b, v);
            }
            for lanes in [2u8, 4] {
                let q = b.ptr_add(p, i32v);
                let v = b.load_vec(q, lanes);
                b.store(q, v);
            }
            let v = b.load(p);
            b.store(p, v);
            let space = if base == g { AddrSpace::Global } else { AddrSpace::Shared };
            for &op in AtomicOp::ALL {
                // Shared pointers cannot be parameters: the probe makes one in the kernel.
                let ok = accepts(&[global(t), Type::Scalar(t)], |b, a| {
                    let ptr = if space == AddrSpace::Global { a[0] } else { b.dyn_shared_ptr(t) };
                    if op == AtomicOp::Cas {
                        b.atomic_cas(ptr, a[1], a[1]);
                    } else {
                        b.atomic(op, ptr, a[1]);
                    }
                });
                if ok {
                    let old = if op == AtomicOp::Cas { b.atomic_cas(p, v, v) } else { b.atomic(op, p, v) };
                    sink.put(&mut b, old);
                    atomics += 1;
                }
            }
        }
    }
    // Kernel parameters are global pointers; shared pointers come only from the bases.
    assert!(!accepts(&[Type::Ptr(AddrSpace::Shared, ScalarType::U32)], |_, _| {}));
    assert_eq!(atomics, 4 * (5 + 4 + 4 + 6 + 6), "add: u32 s32 u64 f32 f64; min/max: 4 types; exch/cas: 6 types");
    let k = finish(b);
    let ptx = common::emit(&k, Arch::Sm80);
    for m in [
        "ld.global.v4.f32",
        "st.shared.v2.f64",
        "ld.global.v2.u64",
        "ld.shared.v4.u8",
        "ld.global.b16",
        "mul.wide.s32",
        "mul.wide.u32",
        "atom.global.add.f32",
        "atom.shared.add.u32",
        "atom.global.cas.b32",
        "atom.shared.exch.b64",
        "atom.global.min.s64",
        ".extern .shared .align 16 .b8 dyn_smem[];",
        ".shared .align 16 .b8 smem_tile[4096];",
        ".shared .align 16 .b8 smem_words[512];",
    ] {
        assert!(ptx.contains(m), "no {m}");
    }
    // v4 of 64-bit elements is two 16-byte accesses.
    assert!(ptx.contains("+16]"), "split v4.f64");
    assert!(!ptx.contains(".v4.f64") && !ptx.contains(".v4.u64"));
    assemble_for(&k, &BOTH);
}

#[test]
fn warp_operations_and_special_registers_assemble() {
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
    let k = finish(b);
    let ptx = common::emit(&k, Arch::Sm80);
    for m in ["%laneid", "%nctaid.z", "shfl.sync.up.b32", "bar.sync"] {
        assert!(ptx.contains(m), "no {m}");
    }
    assert!(ptx.contains(", 0x1f, 0xffffffff;") && ptx.contains(", 0, 0xffffffff;"), "clamp values of shfl");
    assemble_for(&k, &BOTH);
}

#[test]
fn every_parameter_type_and_launch_bounds_assemble() {
    let mut b = KernelBuilder::new("params");
    let mut sink = Sink::new(&mut b);
    for t in DATA_TYPES {
        let v = b.param(format!("v_{t}"), t);
        sink.put(&mut b, v);
        let p = b.param(format!("p_{t}"), global(t));
        let x = b.load(p);
        sink.put(&mut b, x);
    }
    b.launch_bounds(128, Some(4));
    let k = finish(b);
    let ptx = common::emit(&k, Arch::Sm80);
    for m in [".param .s8 params_param_1", ".param .b16", ".param .f64", ".maxntid 128, 1, 1", ".minnctapersm 4"] {
        assert!(ptx.contains(m), "no {m}");
    }
    assemble_for(&k, &BOTH);
}

/// Vectors built, taken apart, selected per element and carried through control flow.
#[test]
fn vectors_assemble() {
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
    let k = finish(b);
    assemble_for(&k, &BOTH);
}
