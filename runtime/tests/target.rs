//! Architecture and PTX-version selection, without a GPU.

use ruda_runtime::{
    max_ptx_for_driver, ptx_text_version, select_arch, select_target, Arch, CudaVersion, PtxVersion, RuntimeError,
};

#[test]
fn driver_versions_map_to_the_ptx_isa_they_accept() {
    let cases = [
        ((10, 2), None),
        ((11, 0), Some((7, 0))),
        ((11, 8), Some((7, 8))),
        ((12, 0), Some((8, 0))),
        ((12, 1), Some((8, 1))),
        ((12, 2), Some((8, 2))),
        ((12, 3), Some((8, 3))),
        ((12, 4), Some((8, 4))),
        ((12, 5), Some((8, 5))),
        ((12, 6), Some((8, 5))),
        ((12, 7), Some((8, 6))),
        ((12, 8), Some((8, 7))),
        ((12, 9), Some((8, 8))),
        ((13, 0), Some((9, 0))),
        ((13, 1), Some((9, 1))),
        ((14, 0), Some((9, 1))),
    ];
    for ((major, minor), want) in cases {
        let got = max_ptx_for_driver(CudaVersion::new(major, minor));
        assert_eq!(got, want.map(|(a, b)| PtxVersion::new(a, b)), "CUDA {major}.{minor}");
    }
}

#[test]
fn driver_int_decodes() {
    assert_eq!(CudaVersion::from_driver_int(12090), CudaVersion::new(12, 9));
    assert_eq!(CudaVersion::from_driver_int(13000), CudaVersion::new(13, 0));
    assert_eq!(CudaVersion::from_driver_int(11080).to_string(), "11.8");
}

#[test]
fn compute_capability_selects_the_arch() {
    let arch = |major, minor| select_arch("gpu", major, minor, false).unwrap();
    assert_eq!(arch(8, 0), Arch::Sm80);
    assert_eq!(arch(8, 6), Arch::Sm86);
    assert_eq!(arch(8, 7), Arch::Sm80);
    assert_eq!(arch(8, 9), Arch::Sm89);
    assert_eq!(arch(9, 0), Arch::Sm90);
    assert_eq!(arch(10, 0), Arch::Sm90);
    assert_eq!(arch(12, 0), Arch::Sm90);
    assert_eq!(select_arch("h100", 9, 0, true).unwrap(), Arch::Sm90a);
    assert!(matches!(select_arch("b200", 10, 0, true), Err(RuntimeError::NeedsSm90a { major: 10, minor: 0 })));
    assert!(matches!(select_arch("a100", 8, 0, true), Err(RuntimeError::NeedsSm90a { .. })));
    let err = select_arch("Tesla V100", 7, 0, false).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("unsupported GPU") && msg.contains("Tesla V100") && msg.contains("7.0"), "{msg}");
}

#[test]
fn forced_ptx_version_is_checked_against_driver_and_arch() {
    let cuda12_2 = CudaVersion::new(12, 2);
    let t = select_target(Arch::Sm90, None, cuda12_2).unwrap();
    assert_eq!((t.arch, t.ptx_version), (Arch::Sm90, None));
    let t = select_target(Arch::Sm80, Some(PtxVersion::new(8, 2)), cuda12_2).unwrap();
    assert_eq!(t.ptx_version, Some(PtxVersion::new(8, 2)));
    let err = select_target(Arch::Sm80, Some(PtxVersion::new(8, 3)), cuda12_2).unwrap_err();
    assert!(matches!(err, RuntimeError::PtxVersionTooHigh { .. }), "{err:?}");
    assert!(err.to_string().contains("8.3") && err.to_string().contains("8.2"), "{err}");
    // sm_90 needs PTX ISA 7.8.
    let err = select_target(Arch::Sm90, Some(PtxVersion::new(7, 0)), cuda12_2).unwrap_err();
    assert!(matches!(err, RuntimeError::PtxVersionTooLow { .. }), "{err:?}");
    assert!(matches!(
        select_target(Arch::Sm80, None, CudaVersion::new(10, 2)),
        Err(RuntimeError::UnsupportedDriver { .. })
    ));
}

#[test]
fn ptx_version_directive_is_read() {
    let ptx = "//\n// Generated\n//\n\n.version 8.4\n.target sm_90\n.address_size 64\n";
    assert_eq!(ptx_text_version(ptx), Some(PtxVersion::new(8, 4)));
    assert_eq!(ptx_text_version(".target sm_80\n"), None);
}
