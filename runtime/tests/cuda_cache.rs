//! A GPU launch against the interpreter, and the module cache's hit/miss counts. Alone in its
//! own test binary: the counts are per device, so concurrent tests would disturb them.

mod common;

use ruda_ir::interp::LaunchConfig;
use ruda_runtime::{Arg, DType, Device, HashedKernel, Tensor};

#[test]
fn cuda_scale_by_two_matches_the_interpreter_and_hits_the_cache() {
    let Some(d) = common::cuda_or_skip("cuda_scale_by_two") else { return };
    let k = HashedKernel::new(common::scale2_kernel());
    let n = 100_003u32;
    let xs: Vec<f32> = (0..n).map(|i| (i as f32).sin() * 1e3).collect();
    let x = Tensor::from_slice(&d, &xs, &[n as usize]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[n as usize]).unwrap();
    let s = d.default_stream();
    let before = d.module_cache_stats();
    let cfg = LaunchConfig::linear(n.div_ceil(256), 256);
    s.launch(&k, cfg, &[Arg::Tensor(&x), Arg::Tensor(&y), Arg::scalar(n)]).unwrap();
    let want: Vec<f32> = xs.iter().map(|v| v * 2.0).collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), want);
    // The interpreter, the reference, agrees bit for bit.
    let cpu = Device::cpu();
    let (xc, yc) = (x.to_device(&cpu).unwrap(), Tensor::zeros(&cpu, DType::F32, &[n as usize]).unwrap());
    cpu.default_stream().launch(&k, cfg, &[Arg::Tensor(&xc), Arg::Tensor(&yc), Arg::scalar(n)]).unwrap();
    assert_eq!(yc.to_vec::<f32>().unwrap(), want);

    // In place, through a view at an offset (aliasing is fine on CUDA): doubles elements 1.. again.
    let tail = y.narrow(0, 1, n as usize - 1).unwrap();
    s.launch(&k, cfg, &[Arg::Tensor(&tail), Arg::Tensor(&tail), Arg::scalar(n - 1)]).unwrap();
    let got = y.to_vec::<f32>().unwrap();
    assert_eq!(got[0], want[0]);
    assert!(got[1..].iter().zip(&want[1..]).all(|(g, w)| *g == w * 2.0));
    let after = d.module_cache_stats();
    assert_eq!(after.misses - before.misses, 1, "{before:?} -> {after:?}");
    assert_eq!(after.hits - before.hits, 1, "{before:?} -> {after:?}");
}
