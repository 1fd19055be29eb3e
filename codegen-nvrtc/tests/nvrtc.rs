//! NVRTC itself: the library and its version, the options, `.version` rewriting (ptxas must
//! accept the result), and errors: unsupported conversions, bad forced versions, and a compile
//! error that shows NVRTC's log and the numbered C++.

use crate::common;

use common::{finish, nvrtc};
use ruda_codegen_nvrtc::{
    check_target, compile_cuda, compile_module_with, emit_cuda, numbered, nvrtc_options, nvrtc_version,
    rewrite_ptx_version, virtual_arch, NvrtcError,
};
use ruda_codegen_ptx::{ptxas, Arch, PtxVersion, Target};
use ruda_ir::coverage::global;
use ruda_ir::{Cvt, Kernel, KernelBuilder, Rounding, ScalarType, Type};

/// `y[i] = a * x[i] + y[i]` with an explicit fma.
fn saxpy() -> Kernel {
    let mut b = KernelBuilder::new("saxpy");
    let x = b.param("x", global(ScalarType::F32));
    let y = b.param("y", global(ScalarType::F32));
    let a = b.param("a", Type::F32);
    let n = b.param("n", Type::U32);
    let i = b.global_thread_id_x();
    let ok = b.lt(i, n);
    b.if_then(ok, |b| {
        let px = b.ptr_add(x, i);
        let py = b.ptr_add(y, i);
        let vx = b.load(px);
        let vy = b.load(py);
        let m = b.mul(a, vx);
        let r = b.add(m, vy);
        b.store(py, r);
    });
    finish(b)
}

#[test]
fn options_name_the_virtual_architecture_and_exact_floats() {
    assert_eq!(virtual_arch(Arch::Sm80), "compute_80");
    assert_eq!(virtual_arch(Arch::Sm90a), "compute_90a");
    let opts = nvrtc_options(&Target::new(Arch::Sm89));
    for o in ["--gpu-architecture=compute_89", "--fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"] {
        assert!(opts.iter().any(|x| x == o), "no {o} in {opts:?}");
    }
    assert!(!opts.iter().any(|o| o.contains("fast-math")));
}

#[test]
fn the_library_reports_its_version_and_keeps_mul_add_separate() {
    let Some(n) = nvrtc("the_library_reports_its_version") else {
        return;
    };
    let (major, minor) = n.version();
    assert!(major >= 12, "NVRTC {major}.{minor} at {}", n.location());
    assert_eq!(nvrtc_version().expect("found once, found again"), (major, minor));
    let k = saxpy();
    let ptx = compile_module_with(&n, &[&k], &Target::new(Arch::Sm80)).unwrap_or_else(|e| panic!("{e}"));
    // NVRTC's own version stands when none is forced.
    assert!(ptx.contains(".target sm_80") && ptx.contains(".version "), "{ptx}");
    assert!(
        ptx.contains("mul.rn.f32") && ptx.contains("add.rn.f32") && !ptx.contains("fma.rn.f32"),
        "contracted:\n{ptx}"
    );
}

#[test]
fn a_forced_version_replaces_nvrtcs_and_ptxas_accepts_it() {
    let Some(n) = nvrtc("a_forced_version_replaces_nvrtcs") else {
        return;
    };
    let tool = match ptxas::ptxas_or_skip("a_forced_version_replaces_nvrtcs") {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    };
    // The memory-heavy kernel of the op tests is not needed: saxpy plus a bf16 conversion.
    let mut b = KernelBuilder::new("forced");
    let p = b.param("p", global(ScalarType::BF16));
    let f = b.param("f", Type::F32);
    let h = b.cvt_with(f, Cvt { to: ScalarType::BF16, rounding: Some(Rounding::Rn), sat: false });
    b.store(p, h);
    let k = finish(b);
    for (arch, version) in
        [(Arch::Sm80, "7.0"), (Arch::Sm80, "8.0"), (Arch::Sm90, "7.8"), (Arch::Sm90a, "8.0"), (Arch::Sm90, "8.8")]
    {
        let target = Target::with_version_str(arch, Some(version)).expect("a valid version");
        let ptx = compile_module_with(&n, &[&k, &saxpy()], &target).unwrap_or_else(|e| panic!("{arch} {version}: {e}"));
        assert_eq!(ptx.matches(".version").count(), 1, "{ptx}");
        assert!(ptx.contains(&format!("\n.version {version}\n")), "{arch} {version}:\n{ptx}");
        if let Some(tool) = &tool {
            ptxas::assemble_with(tool, &ptx, arch).unwrap_or_else(|e| panic!("{arch} {version}: {e}"));
        }
    }
}

#[test]
fn rewriting_the_version_touches_only_the_directive() {
    let ptx = "//\n// .version in a comment is not the directive\n.version 8.8\n.target sm_80\n.address_size 64\n";
    let out = rewrite_ptx_version(ptx, PtxVersion::new(7, 0)).expect("has a directive");
    assert_eq!(out, ptx.replace(".version 8.8\n", ".version 7.0\n"));
    assert!(matches!(rewrite_ptx_version(".target sm_80\n", PtxVersion::new(7, 0)), Err(NvrtcError::Internal(_))));
}

#[test]
fn bad_forced_versions_and_old_targets_are_errors_before_nvrtc() {
    let k = saxpy();
    let forced = |arch, major, minor| Target { arch, ptx_version: Some(PtxVersion::new(major, minor)) };
    for (target, expected) in [
        (forced(Arch::Sm90, 7, 0), "PTX ISA 7.0 is too old for sm_90, which needs 7.8"),
        (forced(Arch::Sm80, 7, 9), "PTX ISA 7.9 does not exist"),
        (forced(Arch::Sm80, 9, 1), "PTX ISA 9.1 does not exist"),
    ] {
        match check_target(&k, &target) {
            Err(NvrtcError::Version(m)) => assert!(m.contains(expected), "{m}"),
            other => panic!("{target:?}: expected a version error, got {other:?}"),
        }
    }
    let mut b = KernelBuilder::new("round_down");
    let p = b.param("p", global(ScalarType::BF16));
    let f = b.param("f", Type::F32);
    let line = line!() + 1;
    let h = b.cvt_with(f, Cvt { to: ScalarType::BF16, rounding: Some(Rounding::Rm), sat: false });
    b.store(p, h);
    let k = finish(b);
    match check_target(&k, &Target::new(Arch::Sm89)) {
        Err(NvrtcError::Unsupported(m)) => {
            let at = format!("nvrtc.rs:{line}:");
            for part in ["kernel `round_down`", "`cvt`", &at, "`cvt.rm.bf16.f32`", "needs sm_90", "the target is sm_89"]
            {
                assert!(m.contains(part), "no {part:?} in {m}");
            }
        }
        other => panic!("expected an unsupported error, got {other:?}"),
    }
    assert!(check_target(&k, &Target::new(Arch::Sm90)).is_ok());
    // A kernel whose name C++ cannot take.
    let mut b = KernelBuilder::new("float");
    b.barrier();
    let e = emit_cuda(&finish(b)).unwrap_err().to_string();
    assert!(e.contains("kernel `float`") && e.contains("C++ keyword"), "{e}");
}

#[test]
fn a_compile_error_shows_the_log_and_the_numbered_source() {
    let Some(n) = nvrtc("a_compile_error_shows_the_log") else {
        return;
    };
    let source = "extern \"C\" __global__ void broken(int* p) {\n    int x = ;\n    *p = x;\n}\n";
    let err = compile_cuda(&n, source, "broken", "kernel `broken`", &Target::new(Arch::Sm80)).unwrap_err();
    let NvrtcError::Compile { ref log, ref source_path, .. } = err else {
        panic!("expected a compile error, got {err:?}")
    };
    assert!(log.contains("broken.cu(2)") && log.contains("expected an expression"), "{log}");
    let kept = source_path.as_ref().expect("the source is kept on disk");
    assert_eq!(std::fs::read_to_string(kept).expect("readable"), source);
    let msg = err.to_string();
    for part in [
        "NVRTC could not compile kernel `broken` for compute_80",
        "expected an expression",
        "2 |     int x = ;",
        "4 | }",
    ] {
        assert!(msg.contains(part), "no {part:?} in\n{msg}");
    }
    assert_eq!(numbered("a\nb\n"), "1 | a\n2 | b\n");
}
