//! Parsing of the environment variables, as pure functions of their values.

use ruda_runtime::{parse_interp_threads, parse_ptx_version, Compiler, DeviceSpec, PtxVersion, RuntimeError};

#[test]
fn device_spec_accepts_the_documented_forms() {
    assert_eq!(DeviceSpec::parse(None).unwrap(), DeviceSpec::Auto);
    assert_eq!(DeviceSpec::parse(Some("")).unwrap(), DeviceSpec::Auto);
    assert_eq!(DeviceSpec::parse(Some("auto")).unwrap(), DeviceSpec::Auto);
    assert_eq!(DeviceSpec::parse(Some("cpu")).unwrap(), DeviceSpec::Cpu);
    assert_eq!(DeviceSpec::parse(Some(" cpu ")).unwrap(), DeviceSpec::Cpu);
    assert_eq!(DeviceSpec::parse(Some("cuda")).unwrap(), DeviceSpec::Cuda(0));
    assert_eq!(DeviceSpec::parse(Some("cuda:0")).unwrap(), DeviceSpec::Cuda(0));
    assert_eq!(DeviceSpec::parse(Some("cuda:3")).unwrap(), DeviceSpec::Cuda(3));
    assert_eq!(DeviceSpec::Cuda(3).to_string(), "cuda:3");
}

#[test]
fn device_spec_rejects_everything_else_naming_value_and_forms() {
    for bad in [
        "gpu",
        "CUDA",
        "cuda:",
        "cuda:-1",
        "cuda:+1",
        "cuda:x",
        "cuda0",
        "cpu:0",
        "cuda:1:2",
        "cuda:99999999999999999999999",
    ] {
        let err = DeviceSpec::parse(Some(bad)).unwrap_err();
        assert!(matches!(err, RuntimeError::InvalidEnv { var: "RUDA_DEVICE", .. }), "{bad}: {err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("{bad:?}")), "{msg}");
        for form in ["auto", "cuda:N", "cpu"] {
            assert!(msg.contains(form), "{msg}");
        }
    }
}

#[test]
fn compiler_selection() {
    assert_eq!(Compiler::parse(None).unwrap(), Compiler::Ptx);
    assert_eq!(Compiler::parse(Some("")).unwrap(), Compiler::Ptx);
    assert_eq!(Compiler::parse(Some("ptx")).unwrap(), Compiler::Ptx);
    assert_eq!(Compiler::parse(Some("nvrtc")).unwrap(), Compiler::Nvrtc);
    let err = Compiler::parse(Some("nvcc")).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("RUDA_CUDA_COMPILER") && msg.contains("\"nvcc\""), "{msg}");
    assert!(msg.contains("ptx") && msg.contains("nvrtc"), "{msg}");
    assert_ne!(Compiler::Ptx.version(), Compiler::Nvrtc.version());
}

#[test]
fn ptx_version_parsing() {
    assert_eq!(parse_ptx_version(None).unwrap(), None);
    assert_eq!(parse_ptx_version(Some("")).unwrap(), None);
    assert_eq!(parse_ptx_version(Some("8.0")).unwrap(), Some(PtxVersion::new(8, 0)));
    assert_eq!(parse_ptx_version(Some(" 7.8 ")).unwrap(), Some(PtxVersion::new(7, 8)));
    assert_eq!(parse_ptx_version(Some("9.0")).unwrap(), Some(PtxVersion::new(9, 0)));
    // Malformed, never existed (8.9, 6.5 knows none of our targets), or newer than the backend knows.
    for bad in ["8", "8.", ".0", "8.0.1", "v8.0", "8.x", "-8.0", "+8.0", "8,0", "1234.0", "8.9", "6.5", "99.0"] {
        let err = parse_ptx_version(Some(bad)).unwrap_err();
        assert!(matches!(err, RuntimeError::InvalidEnv { var: "RUDA_PTX_VERSION", .. }), "{bad}: {err:?}");
    }
}

#[test]
fn interp_threads_parsing() {
    assert!(parse_interp_threads(None).unwrap() >= 1);
    assert_eq!(parse_interp_threads(Some("")).unwrap(), parse_interp_threads(None).unwrap());
    assert_eq!(parse_interp_threads(Some("1")).unwrap(), 1);
    assert_eq!(parse_interp_threads(Some(" 8 ")).unwrap(), 8);
    for bad in ["0", "-1", "+2", "many", "1.5", "99999999999999999999999"] {
        let err = parse_interp_threads(Some(bad)).unwrap_err();
        assert!(matches!(err, RuntimeError::InvalidEnv { var: "RUDA_INTERP_THREADS", .. }), "{bad}: {err:?}");
        assert!(err.to_string().contains("positive integer"), "{err}");
    }
}
