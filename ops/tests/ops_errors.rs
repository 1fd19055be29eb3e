//! Bad inputs to the op entry points are errors that say what is wrong, never panics.

use crate::common::*;
use ruda_ops::api::{self, OpError};
use ruda_runtime::{DType, Tensor};

fn f32s(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

#[test]
fn shape_dtype_and_argument_errors() {
    let dev = device();
    let a = tensor(&dev, DType::F32, &f32s(6), &[2, 3]);
    let b = tensor(&dev, DType::F32, &f32s(6), &[3, 2]);
    let h = tensor(&dev, DType::F16, &f32s(6), &[2, 3]);
    let ints = Tensor::from_slice(&dev, &[1i32, 2, 3], &[3]).unwrap();

    assert!(matches!(api::add(&a, &b), Err(OpError::Shape { .. })));
    assert!(matches!(api::add(&a, &h), Err(OpError::DType { .. })));
    assert!(matches!(api::silu(&ints), Err(OpError::DType { .. })));
    assert!(matches!(api::matmul(&a, &a), Err(OpError::Shape { .. })));

    let gamma = tensor(&dev, DType::F32, &[1.0; 3], &[3]);
    let gamma_bf16 = tensor(&dev, DType::BF16, &[1.0; 3], &[3]);
    let gamma_short = tensor(&dev, DType::F32, &[1.0; 2], &[2]);
    for eps in [0.0, -1e-6, f32::NAN, f32::INFINITY] {
        let err = api::rms_norm(&a, &gamma, eps).unwrap_err();
        assert!(err.to_string().contains("epsilon"), "{err}");
    }
    assert!(matches!(api::rms_norm(&a, &gamma_bf16, 1e-6), Err(OpError::DType { .. })));
    assert!(matches!(api::layer_norm(&a, &gamma, Some(&gamma_short), 1e-6), Err(OpError::Shape { .. })));
}

#[test]
fn empty_and_non_contiguous_inputs_are_rejected() {
    let dev = device();
    let empty = Tensor::zeros(&dev, DType::F32, &[2, 0]).unwrap();
    let err = api::softmax_last_axis(&empty).unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    let gamma = Tensor::zeros(&dev, DType::F32, &[0]).unwrap();
    assert!(api::rms_norm(&empty, &gamma, 1e-6).is_err());

    let a = tensor(&dev, DType::F32, &f32s(12), &[3, 4]);
    let column = a.narrow(1, 1, 2).unwrap();
    let err = api::reduce_sum(&column).unwrap_err();
    assert!(err.to_string().contains("contiguous"), "{err}");
}
