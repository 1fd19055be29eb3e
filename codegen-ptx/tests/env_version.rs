//! `Target::from_env` reads `RUDA_PTX_VERSION` (its own test binary: it sets the variable).

use ruda_codegen_ptx::{Arch, PtxVersion, Target, VersionError};

#[test]
fn ruda_ptx_version_forces_the_version() {
    std::env::remove_var(Target::PTX_VERSION_VAR);
    assert_eq!(Target::from_env(Arch::Sm80), Ok(Target::new(Arch::Sm80)));
    std::env::set_var(Target::PTX_VERSION_VAR, "");
    assert_eq!(Target::from_env(Arch::Sm80), Ok(Target::new(Arch::Sm80)));
    std::env::set_var(Target::PTX_VERSION_VAR, "8.0");
    assert_eq!(Target::from_env(Arch::Sm90).map(|t| t.ptx_version), Ok(Some(PtxVersion::new(8, 0))));
    std::env::set_var(Target::PTX_VERSION_VAR, "banana");
    match Target::from_env(Arch::Sm80) {
        Err(VersionError(m)) => assert!(m.starts_with("RUDA_PTX_VERSION: ") && m.contains("banana"), "{m}"),
        other => panic!("expected a version error, got {other:?}"),
    }
    std::env::set_var(Target::PTX_VERSION_VAR, "7.0");
    assert!(matches!(Target::from_env(Arch::Sm90), Err(VersionError(m)) if m.contains("too old for sm_90")));
    std::env::remove_var(Target::PTX_VERSION_VAR);
}
