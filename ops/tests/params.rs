//! Kernel parameters bound by name: arguments in the wrong order are caught at launch, even
//! where the types alone would pass.

use ruda_ir::ScalarType;
use ruda_ops::kernels::gemm::{gemm_simt, BLayout, GemmConfig, GemmSimtParams};
use ruda_ops::params::{check_names, launch};
use ruda_runtime::{DType, Device, HashedKernel, LaunchConfig, Launchable, Tensor};

#[test]
fn swapped_same_typed_arguments_are_caught_by_name() {
    let dev = Device::cpu();
    let stream = dev.default_stream();
    let cfg = GemmConfig { dtype: ScalarType::F32, b_layout: BLayout::RowMajor, bias: false };
    let kernel = HashedKernel::new(gemm_simt(&cfg).unwrap());
    let (m, n, k) = (2u32, 3u32, 4u32);
    // 4 × 4 buffers hold either reading of the dimensions.
    let a = Tensor::zeros(&dev, DType::F32, &[4, 4]).unwrap();
    let b = Tensor::zeros(&dev, DType::F32, &[4, 4]).unwrap();
    let c = Tensor::zeros(&dev, DType::F32, &[4, 4]).unwrap();
    let grid =
        LaunchConfig { grid: GemmConfig::grid(m, n), block: [GemmConfig::THREADS, 1, 1], dynamic_shared_bytes: 0 };
    let args = GemmSimtParams { a: &a, b: &b, bias: None, c: &c, m, n, k }.args();
    launch(&stream, &kernel, grid, &args).unwrap();

    // `m` and `n` swapped: both u32, so the runtime's type check alone accepts them.
    let mut swapped = args.clone();
    swapped.swap(3, 4);
    let positional: Vec<_> = swapped.iter().map(|(_, a)| *a).collect();
    stream.launch(&kernel, grid, &positional).expect("the types match");
    let e = check_names(kernel.kernel(), &swapped).unwrap_err().to_string();
    assert!(e.contains("argument 3 is `n`") && e.contains("parameter 3 is `m`"), "{e}");
    assert!(launch(&stream, &kernel, grid, &swapped).is_err());

    // A missing argument names the parameters.
    let e = check_names(kernel.kernel(), &args[..5]).unwrap_err().to_string();
    assert!(e.contains("a, b, c, m, n, k"), "{e}");
}
