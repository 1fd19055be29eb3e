//! The environment variables as the process sees them: a bad value is an error naming the
//! variable and its accepted values on every device, the CPU interpreter included. Its own test
//! binary, because it sets the process environment (one test, so no other thread reads it).

mod common;

use ruda_ir::interp::LaunchConfig;
use ruda_runtime::{Arg, DType, Device, RuntimeError, Tensor};

const VARS: [&str; 5] =
    ["RUDA_DEVICE", "RUDA_CUDA_COMPILER", "RUDA_PTX_VERSION", "RUDA_AUTOTUNE", "RUDA_INTERP_THREADS"];

fn clear() {
    for v in VARS {
        std::env::remove_var(v);
    }
}

#[test]
fn bad_values_are_errors_on_the_cpu_device_too() {
    clear();
    let cases = [
        ("RUDA_AUTOTUNE", "maybe", "off"),
        ("RUDA_CUDA_COMPILER", "bogus", "nvrtc"),
        ("RUDA_PTX_VERSION", "banana", "MAJOR.MINOR"),
        ("RUDA_INTERP_THREADS", "0", "positive integer"),
        ("RUDA_INTERP_THREADS", "many", "positive integer"),
        ("RUDA_INTERP_THREADS", "+2", "positive integer"),
    ];
    for (var, value, accepted) in cases {
        for device in ["cpu", "auto"] {
            std::env::set_var("RUDA_DEVICE", device);
            std::env::set_var(var, value);
            let e = Device::from_env().expect_err(&format!("{var}={value} with RUDA_DEVICE={device}"));
            let RuntimeError::InvalidEnv { var: named, .. } = &e else { panic!("{var}={value}: {e}") };
            assert_eq!(*named, var);
            let msg = e.to_string();
            assert!(msg.contains(&format!("{var}={value:?}")) && msg.contains(accepted), "{msg}");
            std::env::remove_var(var);
        }
    }
    // Good values pass on the CPU device.
    std::env::set_var("RUDA_DEVICE", "cpu");
    for (var, value) in [("RUDA_AUTOTUNE", "off"), ("RUDA_CUDA_COMPILER", "nvrtc"), ("RUDA_PTX_VERSION", "8.0")] {
        std::env::set_var(var, value);
    }
    std::env::set_var("RUDA_INTERP_THREADS", "2");
    let d = Device::from_env().unwrap();
    assert!(d.is_cpu());

    // RUDA_INTERP_THREADS=0 set after the device was chosen: the CPU launch names the variable
    // (it used to surface from the interpreter inside whatever the caller was doing).
    let k = common::scale2_kernel();
    let x = Tensor::from_slice(&d, &[1.0f32, 2.0], &[2]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[2]).unwrap();
    let run = || {
        d.default_stream().launch(
            &k,
            LaunchConfig::linear(1, 32),
            &[Arg::Tensor(&x), Arg::Tensor(&y), Arg::scalar(2u32)],
        )
    };
    run().unwrap();
    std::env::set_var("RUDA_INTERP_THREADS", "0");
    let e = run().unwrap_err();
    assert!(matches!(e, RuntimeError::InvalidEnv { var: "RUDA_INTERP_THREADS", .. }), "{e}");
    clear();
}
