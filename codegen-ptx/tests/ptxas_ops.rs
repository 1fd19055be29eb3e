//! Every operation and type combination the verifier accepts, emitted and assembled by ptxas
//! for sm_80 and sm_90 (sm_90a once). The kernels come from `ruda_ir::coverage`, which asks the
//! verifier, so a combination the IR starts to accept is covered without editing this file.

use crate::common;

use common::assemble_for;
use ruda_codegen_ptx::{emit_ptx, Arch, CodegenError, Target};
use ruda_ir::coverage::{
    accepts, arith_kernel, bits_kernel, conversions, cvt_kernel, cvt_needs_sm90, memory_kernel, params_kernel,
    preds_kernel, vectors_kernel, warp_kernel, ARITH_TYPES,
};
use ruda_ir::{AddrSpace, ScalarType, Type, VerifyError};

const BOTH: [Arch; 2] = [Arch::Sm80, Arch::Sm90];

fn verified<T>(k: Result<T, VerifyError>) -> T {
    k.unwrap_or_else(|e| panic!("test kernel does not verify: {e}"))
}

#[test]
fn arithmetic_on_every_type_assembles() {
    for t in ARITH_TYPES {
        let (k, count) = verified(arith_kernel(t));
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
    let k = verified(preds_kernel());
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

#[test]
fn every_conversion_emits_or_is_rejected_by_name() {
    let convs = conversions();
    assert!(convs.len() > 400, "only {} conversions accepted by the verifier", convs.len());
    for (from, cvt) in &convs {
        let k = verified(cvt_kernel("one_cvt", &[(*from, *cvt)]));
        for arch in Arch::ALL {
            let result = emit_ptx(&k, &Target::new(arch));
            let expect_error = arch < Arch::Sm90 && cvt_needs_sm90(*from, *cvt);
            match result {
                Ok(ptx) => {
                    assert!(!expect_error, "{from} -> {cvt:?} on {arch} should be unsupported");
                    assert!(!ptx.contains("cvt.f32.bf16") && !ptx.contains(".ftz"), "{from} -> {cvt:?}:\n{ptx}");
                }
                Err(CodegenError::Unsupported(msg)) => {
                    assert!(expect_error, "{from} -> {cvt:?} on {arch}: {msg}");
                    for part in ["one_cvt", "`cvt`", "sm_90", arch.name(), "coverage.rs"] {
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
    let sm80: Vec<_> = convs.iter().copied().filter(|(f, c)| !cvt_needs_sm90(*f, *c)).collect();
    let k80 = verified(cvt_kernel("cvt_sm80", &sm80));
    let ptx = common::emit(&k80, Arch::Sm80);
    assert!(ptx.contains(".version 7.0"));
    assert!(ptx.contains("cvt.rn.bf16.f32") && ptx.contains("cvt.rzi.s32.f32") && ptx.contains("cvt.rni.f32.f32"));
    assert!(ptx.contains("cvt.sat.s8.s32") && ptx.contains("cvt.rn.f16.f32") && ptx.contains("cvt.f32.f16"));
    if !assemble_for(&k80, &[Arch::Sm80]) {
        return;
    }
    let k90 = verified(cvt_kernel("cvt_sm90", &convs));
    assemble_for(&k90, &[Arch::Sm90]);
}

#[test]
fn bitcasts_and_constants_assemble() {
    let (k, bitcasts) = verified(bits_kernel());
    assert_eq!(bitcasts, 2 * 2 + 4 * 4 + 3 * 3 + 3 * 3, "every same-width pair");
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
    let (k, atomics) = verified(memory_kernel());
    // Kernel parameters are global pointers; shared pointers come only from the bases.
    assert!(!accepts(&[Type::Ptr(AddrSpace::Shared, ScalarType::U32)], |_, _| {}));
    assert_eq!(atomics, 4 * (5 + 4 + 4 + 6 + 6), "add: u32 s32 u64 f32 f64; min/max: 4 types; exch/cas: 6 types");
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
    let k = verified(warp_kernel());
    let ptx = common::emit(&k, Arch::Sm80);
    for m in ["%laneid", "%nctaid.z", "shfl.sync.up.b32", "bar.sync"] {
        assert!(ptx.contains(m), "no {m}");
    }
    assert!(ptx.contains(", 0x1f, 0xffffffff;") && ptx.contains(", 0, 0xffffffff;"), "clamp values of shfl");
    assemble_for(&k, &BOTH);
}

#[test]
fn every_parameter_type_and_launch_bounds_assemble() {
    let k = verified(params_kernel());
    let ptx = common::emit(&k, Arch::Sm80);
    for m in [".param .s8 params_param_1", ".param .b16", ".param .f64", ".maxntid 128, 1, 1", ".minnctapersm 4"] {
        assert!(ptx.contains(m), "no {m}");
    }
    assemble_for(&k, &BOTH);
}

/// Vectors built, taken apart, selected per element and carried through control flow.
#[test]
fn vectors_assemble() {
    assemble_for(&verified(vectors_kernel()), &BOTH);
}
