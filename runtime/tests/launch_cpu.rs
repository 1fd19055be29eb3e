//! Launches on the CPU device, through the IR interpreter.

use crate::common;

use ruda_ir::interp::LaunchConfig;
use ruda_ir::Constant;
use ruda_runtime::{Arg, DType, Device, HashedKernel, LaunchRecord, RuntimeError, Tensor};

#[test]
fn scale_by_two_runs_in_the_interpreter() {
    let d = Device::cpu();
    let k = common::scale2_kernel();
    let n = 37u32; // not a multiple of the block
    let xs: Vec<f32> = (0..n).map(|i| i as f32 - 10.5).collect();
    let x = Tensor::from_slice(&d, &xs, &[n as usize]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[n as usize]).unwrap();
    d.default_stream()
        .launch(&k, LaunchConfig::linear(n.div_ceil(16), 16), &[Arg::Tensor(&x), Arg::Tensor(&y), Arg::scalar(n)])
        .unwrap();
    let want: Vec<f32> = xs.iter().map(|v| v * 2.0).collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), want);
}

#[test]
fn the_launch_record_keeps_what_ran_while_it_is_on() {
    let d = Device::cpu();
    let k = common::scale2_kernel();
    let x = Tensor::from_slice(&d, &[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[3]).unwrap();
    let s = d.default_stream();
    let run =
        |blocks: u32| s.launch(&k, LaunchConfig::linear(blocks, 32), &[(&x).into(), (&y).into(), Arg::scalar(3u32)]);
    run(1).unwrap();
    assert_eq!(s.take_launch_record(), [], "off unless started");
    s.start_launch_record();
    run(2).unwrap();
    // Another handle of the same stream records into the same list; a failed launch is not kept.
    let again = d.default_stream();
    again.launch(&k, LaunchConfig::linear(1, 32), &[(&x).into(), (&x).into(), Arg::scalar(3u32)]).unwrap_err();
    run(3).unwrap();
    let want = |blocks: u32| LaunchRecord {
        kernel: k.name.clone(),
        grid: [blocks, 1, 1],
        block: [32, 1, 1],
        dynamic_shared_bytes: 0,
    };
    assert_eq!(again.take_launch_record(), [want(2), want(3)]);
    run(4).unwrap();
    assert_eq!(s.take_launch_record(), [], "taking the record stops it");
    // A stream of its own keeps its own record.
    let other = d.create_stream().unwrap();
    other.start_launch_record();
    run(5).unwrap();
    assert_eq!(other.take_launch_record(), []);
}

#[test]
fn disjoint_views_of_one_buffer_are_separate_arguments() {
    let d = Device::cpu();
    let k = HashedKernel::new(common::scale2_kernel());
    // One buffer: x in the first half, y in the second.
    let both = Tensor::from_slice(&d, &[1.0f32, 2.0, 3.0, 0.0, 0.0, 0.0], &[6]).unwrap();
    let x = both.narrow(0, 0, 3).unwrap();
    let y = both.narrow(0, 3, 3).unwrap();
    // y first: the split must not depend on argument order.
    d.default_stream()
        .launch(&k, LaunchConfig::linear(1, 32), &[(&x).into(), (&y).into(), Arg::Scalar(Constant::u32(3))])
        .unwrap();
    assert_eq!(both.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 2.0, 4.0, 6.0]);
}

#[test]
fn overlapping_arguments_are_an_error_on_the_cpu() {
    let d = Device::cpu();
    let k = common::scale2_kernel();
    let x = Tensor::from_slice(&d, &[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let err = d
        .default_stream()
        .launch(&k, LaunchConfig::linear(1, 32), &[Arg::Tensor(&x), Arg::Tensor(&x), Arg::scalar(4u32)])
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("scale2") && msg.contains("overlap"), "{msg}");
    let shifted = x.narrow(0, 1, 3).unwrap();
    assert!(d
        .default_stream()
        .launch(&k, LaunchConfig::linear(1, 32), &[Arg::Tensor(&x), Arg::Tensor(&shifted), Arg::scalar(3u32)])
        .is_err());
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0], "nothing ran");
}

#[test]
fn bad_arguments_name_the_kernel_and_parameter() {
    let d = Device::cpu();
    let s = d.default_stream();
    let k = common::scale2_kernel();
    let x = Tensor::zeros(&d, DType::F32, &[4]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[4]).unwrap();
    let h = Tensor::zeros(&d, DType::F16, &[4]).unwrap();
    let cfg = LaunchConfig::linear(1, 32);

    let err = s.launch(&k, cfg, &[Arg::Tensor(&x), Arg::Tensor(&y)]).unwrap_err();
    assert!(err.to_string().contains("takes 3 arguments, 2 were given"), "{err}");

    let err = s.launch(&k, cfg, &[Arg::Tensor(&h), Arg::Tensor(&y), Arg::scalar(4u32)]).unwrap_err();
    assert!(matches!(&err, RuntimeError::InvalidArg { index: 0, param, .. } if param == "x"), "{err:?}");
    assert!(err.to_string().contains("f16 tensor for a pointer to f32"), "{err}");

    let err = s.launch(&k, cfg, &[Arg::Tensor(&x), Arg::Tensor(&y), Arg::scalar(4i32)]).unwrap_err();
    assert!(err.to_string().contains("argument 2 (`n`): a s32 scalar for a parameter of type u32"), "{err}");

    let err = s.launch(&k, cfg, &[Arg::scalar(1.0f32), Arg::Tensor(&y), Arg::scalar(4u32)]).unwrap_err();
    assert!(matches!(err, RuntimeError::InvalidArg { index: 0, .. }), "{err:?}");

    let err = s.launch(&k, cfg, &[Arg::Tensor(&x), Arg::Tensor(&y), Arg::Tensor(&x)]).unwrap_err();
    assert!(err.to_string().contains("a tensor for a parameter of type u32"), "{err}");
}

#[test]
fn bad_launch_shapes_are_errors() {
    let d = Device::cpu();
    let s = d.default_stream();
    let k = common::scale2_kernel();
    let x = Tensor::zeros(&d, DType::F32, &[4]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[4]).unwrap();
    let args = [Arg::Tensor(&x), Arg::Tensor(&y), Arg::scalar(4u32)];
    let shapes = [
        LaunchConfig::linear(0, 32),
        LaunchConfig::linear(1, 0),
        LaunchConfig::linear(1, 2048),
        LaunchConfig { grid: [1, 1, 1], block: [1, 1, 65], dynamic_shared_bytes: 0 },
        LaunchConfig { grid: [1, 65536, 1], block: [32, 1, 1], dynamic_shared_bytes: 0 },
        LaunchConfig { grid: [1, 1, 1], block: [64, 32, 1], dynamic_shared_bytes: 0 },
    ];
    for cfg in shapes {
        let err = s.launch(&k, cfg, &args).unwrap_err();
        assert!(
            matches!(err, RuntimeError::InvalidLaunch { ref kernel, .. } if kernel == "scale2"),
            "{cfg:?}: {err:?}"
        );
    }
}
