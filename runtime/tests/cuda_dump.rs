//! RUDA_DUMP_IR on a GPU: a module-cache miss writes the emitted PTX. Its own test binary,
//! because it sets the process environment.

mod common;

use ruda_ir::interp::LaunchConfig;
use ruda_runtime::{Arg, DType, Tensor};

#[test]
fn cuda_dump_writes_the_ptx_of_each_compiled_kernel() {
    let Some(d) = common::cuda_or_skip("cuda_dump_writes_the_ptx_of_each_compiled_kernel") else { return };
    let dir = std::env::temp_dir().join(format!("ruda-dump-test-{}", std::process::id()));
    // The only test in this binary, so no other thread reads the environment meanwhile.
    std::env::set_var("RUDA_DUMP_IR", &dir);
    let k = common::scale2_kernel();
    let x = Tensor::from_slice(&d, &[1.0f32, 2.0], &[2]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[2]).unwrap();
    d.default_stream()
        .launch(&k, LaunchConfig::linear(1, 32), &[Arg::Tensor(&x), Arg::Tensor(&y), Arg::scalar(2u32)])
        .unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    std::env::remove_var("RUDA_DUMP_IR");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("scale2-") && name.ends_with(".ptx"), "{name}");
    let ptx = std::fs::read_to_string(&files[0]).unwrap();
    assert!(ptx.contains(".entry scale2"), "{ptx}");
    std::fs::remove_dir_all(&dir).unwrap();
}
