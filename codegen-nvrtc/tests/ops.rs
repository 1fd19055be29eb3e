//! Every operation and type combination the verifier accepts (the kernels of `ruda_ir::coverage`,
//! which the PTX backend's tests assemble too), emitted as C++, compiled by NVRTC for compute_80
//! and compute_90 (one translation unit per architecture), and the PTX assembled by ptxas for
//! sm_80 and sm_90.

use crate::common;

use common::{compile_and_assemble, compile_and_assemble_for, cuda};
use ruda_codegen_nvrtc::{check_target, NvrtcError};
use ruda_codegen_ptx::{Arch, Target};
use ruda_ir::coverage::{
    arith_kernel, bits_kernel, conversions, cvt_kernel, cvt_needs_sm90, memory_kernel, params_kernel, preds_kernel,
    vectors_kernel, warp_kernel, ARITH_TYPES,
};
use ruda_ir::{Kernel, ScalarType, VerifyError};

fn verified<T>(k: Result<T, VerifyError>) -> T {
    k.unwrap_or_else(|e| panic!("test kernel does not verify: {e}"))
}

#[test]
fn arithmetic_uses_exact_forms() {
    for t in ARITH_TYPES {
        let (k, count) = verified(arith_kernel(t));
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

#[test]
fn every_conversion_emits_or_is_rejected_by_name() {
    let convs = conversions();
    assert!(convs.len() > 400, "only {} conversions accepted by the verifier", convs.len());
    for (from, cvt) in &convs {
        let k = verified(cvt_kernel("one_cvt", &[(*from, *cvt)]));
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
            let expect_error = arch < Arch::Sm90 && cvt_needs_sm90(*from, *cvt);
            match check_target(&k, &Target::new(arch)) {
                Ok(()) => assert!(!expect_error, "{from} -> {cvt:?} on {arch} should be unsupported"),
                Err(NvrtcError::Unsupported(msg)) => {
                    assert!(expect_error, "{from} -> {cvt:?} on {arch}: {msg}");
                    for part in ["one_cvt", "`cvt`", "sm_90", arch.name(), "coverage.rs", "bf16"] {
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
    let c = cuda(&verified(cvt_kernel("cvt_all", &convs)));
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

#[test]
fn bitcasts_and_constants_are_exact() {
    let (k, bitcasts) = verified(bits_kernel());
    assert_eq!(bitcasts, 2 * 2 + 4 * 4 + 3 * 3 + 3 * 3, "every same-width pair");
    let c = cuda(&k);
    for expected in [
        "18446744073709551615ull",
        "(long long)0x8000000000000000ull",
        "(int)0x80000000u",
        // NaNs through an opaque `mov`, which NVVM cannot fold through.
        "ruda_mov_b32(0x7fc00000u) /* NaN */",
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

#[test]
fn memory_accesses_keep_32_bit_shared_addresses() {
    let (k, atomics) = verified(memory_kernel());
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

#[test]
fn warp_operations_parameters_and_launch_bounds() {
    let c = cuda(&verified(warp_kernel()));
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
    let c = cuda(&verified(params_kernel()));
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

/// Every kernel above in one translation unit per architecture: compute_80 (without the
/// conversions that need sm_90) and compute_90 (with them, and the `.version` rewritten to the
/// lowest sm_90 knows: ptxas must accept NVRTC's PTX under it), each assembled by ptxas.
#[test]
fn everything_compiles_with_nvrtc_and_assembles() {
    let convs = conversions();
    let sm80: Vec<_> = convs.iter().copied().filter(|(f, c)| !cvt_needs_sm90(*f, *c)).collect();
    let mut kernels: Vec<Kernel> = ARITH_TYPES.into_iter().map(|t| verified(arith_kernel(t)).0).collect();
    kernels.extend([
        verified(preds_kernel()),
        verified(bits_kernel()).0,
        verified(memory_kernel()).0,
        verified(warp_kernel()),
        verified(params_kernel()),
        verified(vectors_kernel()),
    ]);
    kernels.push(verified(cvt_kernel("cvt_sm80", &sm80)));
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
    kernels.push(verified(cvt_kernel("cvt_sm90", &convs)));
    let refs: Vec<&Kernel> = kernels.iter().collect();
    let oldest = Target { arch: Arch::Sm90, ptx_version: Some(Arch::Sm90.min_ptx_version()) };
    compile_and_assemble_for("ops on sm_90", &refs, &[oldest]);
}
