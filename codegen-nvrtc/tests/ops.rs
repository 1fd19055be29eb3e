//! Every operation and type combination the verifier accepts (enumerated by asking the
//! verifier, as the PTX backend's tests do), emitted as C++, compiled by NVRTC for compute_80
//! and compute_90 (one translation unit per architecture), and the PTX assembled by ptxas for
//! sm_80 and sm_90.

mod common;

use common::{
    accepts, compile_and_assemble, compile_and_assemble_for, cuda, finish, global, Sink, ARITH_TYPES, DATA_TYPES,
};
use ruda_codegen_nvrtc::{check_target, NvrtcError};
use ruda_codegen_ptx::{Arch, Target};
use ruda_ir::{
    AddrSpace, AtomicOp, BinaryOp, CmpOp, Constant, Cvt, Kernel, KernelBuilder, Rounding, ScalarType, ShflMode,
    SpecialReg, Type, UnaryOp, Value, VoteMode,
};

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
fn arithmetic_uses_exact_forms() {
    for t in ARITH_TYPES {
        let (k, count) = arith_kernel(t);
        assert!(count >= 12, "{t}: only {count} operations accepted");
        let c = cuda(&k);
        assert!(!c.contains("#include"), "{t}: the C++ includes a header");
        if t.is_float() {
            let (s, name) = if t == ScalarType::F32 { ("f", "f32") } else { ("d", "f64") };
            for f in ["add_rn", "sub_rn", "mul_rn", "div_rn", "sqrt_rn", "rcp_rn"] {
                assert!(c.contains(&format!("__{s}{f}(")), "{t}: no __{s}{f} in\n{c}");
            }
            assert!(c.contains(if t == ScalarType::F32 { "__fmaf_rn(" } else { "__fma_rn(" }));
            // Min/max are PTX's own instructions; no libm call NVVM could fold differently.
            assert!(c.contains(&format!("asm(\"min.{name} %0, %1, %2;\"")), "{t}:\n{c}");
            assert!(c.contains(&format!("ruda_max_{name}(x, y)")), "{t}:\n{c}");
            assert!(!c.contains("fminf(") && !c.contains("fmaxf(") && !c.contains("fmin("));
            // Ordered `ne`, unordered `neu`, `nan` as self-inequality.
            assert!(c.contains("(x < y || x > y)") && c.contains("x != y") && c.contains("(x != x || y != y)"), "{c}");
        } else {
            for h in ["div", "rem", "shl", "shr"] {
                assert!(c.contains(&format!("ruda_{h}_{t}(")), "{t}: no ruda_{h}_{t} in\n{c}");
            }
            if t.is_signed_int() {
                // Signed wrapping arithmetic goes through unsigned types.
                assert!(
                    c.contains(&format!("{}x + (", if t.bits() > 32 { "(unsigned long long)" } else { "(unsigned)" }))
                );
            }
        }
        if t == ScalarType::F32 {
            for m in ["rsqrt", "ex2", "lg2", "tanh", "sin", "cos"] {
                assert!(c.contains(&format!("asm(\"{m}.approx.f32 %0, %1;\"")), "no {m}.approx.f32 in\n{c}");
            }
        }
    }
}

fn preds_kernel() -> Kernel {
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
    finish(b)
}

/// Every conversion the verifier accepts: (from, cvt).
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

/// Conversions whose lowering needs sm_90: bf16 results `.rm`/`.rp`, from f64, from 32/64-bit
/// integers (the PTX backend's rule).
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
        let c = cuda(&k);
        // Anything with a float is one PTX `cvt`; integer to integer is plain C++.
        let copy =
            (*from == cvt.to && cvt.rounding.is_none()) || (*from == ScalarType::BF16 && cvt.to == ScalarType::F32);
        assert_eq!(
            c.contains("asm(\"cvt."),
            (from.is_float() || cvt.to.is_float()) && !copy,
            "{from} -> {cvt:?}:\n{c}"
        );
        for arch in Arch::ALL {
            let expect_error = arch < Arch::Sm90 && needs_sm90(*from, *cvt);
            match check_target(&k, &Target::new(arch)) {
                Ok(()) => assert!(!expect_error, "{from} -> {cvt:?} on {arch} should be unsupported"),
                Err(NvrtcError::Unsupported(msg)) => {
                    assert!(expect_error, "{from} -> {cvt:?} on {arch}: {msg}");
                    for part in ["one_cvt", "`cvt`", "sm_90", arch.name(), "ops.rs", "bf16"] {
                        assert!(msg.contains(part), "message lacks {part:?}: {msg}");
                    }
                }
                Err(e) => panic!("{from} -> {cvt:?} on {arch}: {e}"),
            }
        }
    }
}

#[test]
fn conversions_are_the_ptx_backends_instructions() {
    let convs = conversions();
    let c = cuda(&cvt_kernel("cvt_all", &convs));
    for form in [
        "cvt.rzi.s32.f32",
        "cvt.rni.f32.f32",
        "cvt.rn.bf16.f32",
        "cvt.rm.bf16.f32",
        "cvt.rn.f16.f32",
        "cvt.f32.f16",
        "cvt.rp.f64.u64",
        "cvt.rzi.s8.f64",
        "cvt.rn.bf16.s64",
    ] {
        assert!(c.contains(&format!("asm(\"{form} %0, %1;\"")), "no {form} in\n{c}");
    }
    // bf16 is never converted by an instruction sm_80 lacks: it widens by a shift.
    assert!(!c.contains("cvt.f32.bf16") && c.contains("__uint_as_float((unsigned)"), "{c}");
    // `.sat` between integers is a clamp in C++.
    assert!(c.contains("(signed char)(") && c.contains(" < -128 ? -128 : "), "{c}");
}

fn bits_kernel() -> (Kernel, usize) {
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
    for c in constants {
        let v = b.constant(c);
        sink.put(&mut b, v);
    }
    (finish(b), bitcasts)
}

#[test]
fn bitcasts_and_constants_are_exact() {
    let (k, bitcasts) = bits_kernel();
    assert_eq!(bitcasts, 2 * 2 + 4 * 4 + 3 * 3 + 3 * 3, "every same-width pair");
    let c = cuda(&k);
    for expected in [
        "18446744073709551615ull",
        "(long long)0x8000000000000000ull",
        "(int)0x80000000u",
        "__uint_as_float(0x7fc00000u) /* NaN */",
        "__uint_as_float(0xff800000u) /* -inf */",
        "0x1.99999ap-4f",
        "-3.0f",
        "0x0.000002p-126f",
        "-0.0;",
        "0x1.921fb54442d18p+1",
        "__float_as_int(",
        "__longlong_as_double((long long)",
    ] {
        assert!(c.contains(expected), "no {expected} in\n{c}");
    }
}

/// Loads and stores (scalar, v2, v4) of every type through global, static shared and dynamic
/// shared pointers, every index type of `ptradd`, and every atomic the verifier accepts.
fn memory_kernel() -> (Kernel, usize) {
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
                // Stored elsewhere, so that NVVM cannot drop the pair as a no-op.
                let q = b.ptr_add(p, i32v);
                let v = b.load_vec(q, lanes);
                let elsewhere = b.ptr_add(p, idx[1]);
                b.store(elsewhere, v);
            }
            let v = b.load(p);
            b.store(p, v);
            let space = if base == g { AddrSpace::Global } else { AddrSpace::Shared };
            for &op in AtomicOp::ALL {
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
    (finish(b), atomics)
}

#[test]
fn memory_accesses_keep_32_bit_shared_addresses() {
    let (k, atomics) = memory_kernel();
    assert_eq!(atomics, 4 * (5 + 4 + 4 + 6 + 6), "add: u32 s32 u64 f32 f64; min/max: 4 types; exch/cas: 6 types");
    let c = cuda(&k);
    for expected in [
        "__shared__ __align__(16) unsigned char smem_tile[4096];",
        "__shared__ __align__(16) double smem_words[64];",
        "extern __shared__ __align__(16) unsigned char dyn_smem[];",
        "ruda_shared_addr(smem_tile)",
        "ruda_shared_ptr<float>",
        " * 8u;",
        "(unsigned)l * 2u",
        "*(ruda_vec<float, 4>*)",
        "*ruda_shared<ruda_vec<double, 4>>(",
        "atomicAdd(ruda_shared<float>(",
        "atomicCAS((unsigned long long*)",
        "__longlong_as_double((long long)atomicExch(ruda_shared<unsigned long long>(",
        "atomicMin(ruda_shared<long long>(",
    ] {
        assert!(c.contains(expected), "no {expected} in\n{c}");
    }
}

fn warp_kernel() -> Kernel {
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
    finish(b)
}

fn params_kernel() -> Kernel {
    let mut b = KernelBuilder::new("params");
    let mut sink = Sink::new(&mut b);
    for t in DATA_TYPES {
        let v = b.param(format!("v_{t}"), t);
        sink.put(&mut b, v);
        let p = b.param(format!("p_{t}"), global(t));
        let x = b.load(p);
        sink.put(&mut b, x);
    }
    // Names C++ cannot take as they are.
    for name in ["int", "v1", "ruda_x", "2x", "a-b", "out", "v2_gemm", "v3_next"] {
        let v = b.param(name, Type::U32);
        sink.put(&mut b, v);
    }
    b.launch_bounds(128, Some(4));
    finish(b)
}

#[test]
fn warp_operations_parameters_and_launch_bounds() {
    let c = cuda(&warp_kernel());
    for expected in [
        "__shfl_sync(0xffffffffu, x_f32, (int)lane)",
        "__shfl_up_sync(0xffffffffu, x_u32, lane)",
        "__shfl_down_sync(0xffffffffu, x_s32, lane)",
        "__shfl_xor_sync(0xffffffffu, x_f32, (int)lane)",
        "ruda_laneid()",
        "gridDim.z",
        "__syncthreads();",
    ] {
        assert!(c.contains(expected), "no {expected} in\n{c}");
    }
    let c = cuda(&params_kernel());
    assert!(
        c.contains("extern \"C\" __global__ void __launch_bounds__(128, 4) params(unsigned char* out, signed char v_s8, signed char* p_s8,"),
        "{c}"
    );
    for expected in [
        "unsigned short v_bf16",
        "double* p_f64",
        "unsigned p25_int",
        "unsigned p26_v1",
        "unsigned p27_ruda_x",
        "unsigned p28_2x",
        "unsigned a_b",
        "unsigned out_1",
        "unsigned v2_gemm",
        "unsigned p32_v3_next",
    ] {
        assert!(c.contains(expected), "no {expected} in\n{c}");
    }
}

fn vectors_kernel() -> Kernel {
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
    finish(b)
}

/// Every kernel above in one translation unit per architecture: compute_80 (without the
/// conversions that need sm_90) and compute_90 (with them, and the `.version` rewritten to the
/// lowest sm_90 knows: ptxas must accept NVRTC's PTX under it), each assembled by ptxas.
#[test]
fn everything_compiles_with_nvrtc_and_assembles() {
    let convs = conversions();
    let sm80: Vec<_> = convs.iter().copied().filter(|(f, c)| !needs_sm90(*f, *c)).collect();
    let mut kernels: Vec<Kernel> = ARITH_TYPES.into_iter().map(|t| arith_kernel(t).0).collect();
    kernels.extend([
        preds_kernel(),
        bits_kernel().0,
        memory_kernel().0,
        warp_kernel(),
        params_kernel(),
        vectors_kernel(),
    ]);
    kernels.push(cvt_kernel("cvt_sm80", &sm80));
    let refs: Vec<&Kernel> = kernels.iter().collect();
    let ptx80 = compile_and_assemble("ops on sm_80", &refs, &[Arch::Sm80]);
    if let Some((_, ptx)) = ptx80.first() {
        // The instructions the C++ asked for arrive in NVRTC's PTX unchanged.
        for m in [
            "add.rn.f32",
            "fma.rn.f64",
            "min.f32",
            "ex2.approx.f32",
            "cvt.rzi.s32.f32",
            "shfl.sync.up.b32",
            "vote.sync.ballot.b32",
            "atom.shared.add.f32",
            "ld.shared.v4.f32",
            "mul.hi.u64",
            "bar.sync",
        ] {
            assert!(ptx.contains(m), "no {m} in NVRTC's PTX");
        }
        assert!(!ptx.contains(".ftz"), "flush-to-zero in NVRTC's PTX");
    }
    kernels.push(cvt_kernel("cvt_sm90", &convs));
    let refs: Vec<&Kernel> = kernels.iter().collect();
    let oldest = Target { arch: Arch::Sm90, ptx_version: Some(Arch::Sm90.min_ptx_version()) };
    compile_and_assemble_for("ops on sm_90", &refs, &[oldest]);
}
