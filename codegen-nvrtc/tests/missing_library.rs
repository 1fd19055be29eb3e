//! `RUDA_NVRTC` pointing nowhere: an error that says where it looked, never a panic and never a
//! fallback to another library. Its own test binary, because it sets the process environment.

use ruda_codegen_nvrtc::{compile_to_ptx, find_nvrtc, nvrtc_or_skip, nvrtc_version, NvrtcError, REQUIRE_VAR};
use ruda_codegen_ptx::{Arch, Target};
use ruda_ir::{AddrSpace, KernelBuilder, ScalarType, Type};

#[test]
fn a_wrong_ruda_nvrtc_is_reported_with_the_places_looked_at() {
    let nowhere = std::env::temp_dir().join("ruda-no-such-dir").join("libnvrtc.so.12");
    // The only test in this binary, so no other thread reads the environment meanwhile.
    std::env::set_var("RUDA_NVRTC", &nowhere);
    let mut b = KernelBuilder::new("k");
    let p = b.param("p", Type::Ptr(AddrSpace::Global, ScalarType::F32));
    let one = b.const_f32(1.0);
    b.store(p, one);
    let k = b.finish().expect("verifies");

    let err = compile_to_ptx(&k, &Target::new(Arch::Sm80)).unwrap_err();
    let NvrtcError::NotFound { searched } = &err else { panic!("expected not-found, got {err:?}") };
    assert_eq!(searched.len(), 1, "a set RUDA_NVRTC is the only place looked at: {searched:?}");
    let msg = err.to_string();
    assert!(msg.contains("libnvrtc not found") && msg.contains(&format!("RUDA_NVRTC={}", nowhere.display())), "{msg}");
    assert!(msg.contains("install-cuda-tools.sh"), "{msg}");
    assert!(matches!(nvrtc_version(), Err(NvrtcError::NotFound { .. })));
    assert!(find_nvrtc().is_err());

    // Tests skip without NVRTC, unless it is required.
    std::env::remove_var(REQUIRE_VAR);
    assert!(matches!(nvrtc_or_skip("missing-library test"), Ok(None)));
    std::env::set_var(REQUIRE_VAR, "1");
    match nvrtc_or_skip("missing-library test") {
        Err(NvrtcError::Required(m)) => assert!(m.contains("RUDA_NVRTC="), "{m}"),
        other => panic!("expected a required error, got {other:?}"),
    }
    std::env::remove_var(REQUIRE_VAR);
    std::env::remove_var("RUDA_NVRTC");
}
