//! Tensors on the CPU device: round trips for every element type, views, shape and dtype errors.

use half::{bf16, f16};
use ruda_runtime::{DType, Device, Element, RuntimeError, Tensor};

fn round_trip<T: Element + PartialEq>(values: &[T]) {
    let d = Device::cpu();
    let t = Tensor::from_slice(&d, values, &[values.len()]).unwrap();
    assert_eq!(t.dtype(), T::DTYPE);
    assert_eq!(t.to_vec::<T>().unwrap(), values, "{}", T::DTYPE);
    assert_eq!(t.to_bytes().unwrap().len(), values.len() * T::DTYPE.size());
    let z = Tensor::zeros(&d, T::DTYPE, &[2, 3]).unwrap();
    assert!(z.to_bytes().unwrap().iter().all(|&b| b == 0));
}

#[test]
fn every_element_type_round_trips() {
    round_trip(&[1.5f32, -0.0, f32::MAX, f32::MIN_POSITIVE, f32::INFINITY]);
    round_trip(&[f16::from_f32(1.5), f16::MAX, f16::from_f32(-2.0)]);
    round_trip(&[bf16::from_f32(1.5), bf16::MAX, bf16::from_f32(-3.0e38)]);
    round_trip(&[1.5f64, -1e300, f64::EPSILON]);
    round_trip(&[i8::MIN, -1, 0, i8::MAX]);
    round_trip(&[i16::MIN, -1, 0, i16::MAX]);
    round_trip(&[i32::MIN, -1, 0, i32::MAX]);
    round_trip(&[i64::MIN, -1, 0, i64::MAX]);
    round_trip(&[0u8, 1, u8::MAX]);
    round_trip(&[0u16, 1, u16::MAX]);
    round_trip(&[0u32, 1, u32::MAX]);
    round_trip(&[0u64, 1, u64::MAX]);
    // NaN payloads survive bit for bit.
    let nan = f32::from_bits(0x7fc0_1234);
    let back = Tensor::from_slice(&Device::cpu(), &[nan], &[1]).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(back[0].to_bits(), 0x7fc0_1234);
}

#[test]
fn dtype_table() {
    for dt in DType::ALL {
        assert_eq!(DType::from_name(dt.name()), Some(dt));
        assert_eq!(DType::from_scalar_type(dt.scalar_type()), Some(dt));
        assert_eq!(dt.size(), dt.scalar_type().bytes() as usize);
    }
    assert_eq!(DType::from_scalar_type(ruda_ir::ScalarType::Pred), None);
    assert_eq!(DType::BF16.size(), 2);
    assert_eq!(7i32.to_constant(), ruda_ir::Constant::i32(7));
    assert_eq!((-1i8).to_constant().as_i64(), -1);
}

#[test]
fn to_f32_converts_float_dtypes_only() {
    let d = Device::cpu();
    let h = Tensor::from_slice(&d, &[f16::from_f32(0.5), f16::from_f32(-4.0)], &[2]).unwrap();
    assert_eq!(h.to_f32_vec().unwrap(), vec![0.5, -4.0]);
    let b = Tensor::from_slice(&d, &[bf16::from_f32(3.0)], &[1]).unwrap();
    assert_eq!(b.to_f32_vec().unwrap(), vec![3.0]);
    let w = Tensor::from_slice(&d, &[0.25f64], &[1]).unwrap();
    assert_eq!(w.to_f32_vec().unwrap(), vec![0.25]);
    let i = Tensor::from_slice(&d, &[1i32], &[1]).unwrap();
    assert!(matches!(i.to_f32_vec(), Err(RuntimeError::DType { .. })));
}

#[test]
fn shape_and_dtype_errors_are_errors() {
    let d = Device::cpu();
    let err = Tensor::from_slice(&d, &[1.0f32; 5], &[2, 3]).unwrap_err();
    assert!(err.to_string().contains("[2, 3] has 6 elements but the data has 5"), "{err}");
    assert!(Tensor::from_slice(&d, &[1.0f32; 4], &[usize::MAX, 2]).is_err());
    assert!(Tensor::zeros(&d, DType::F64, &[usize::MAX / 4]).is_err());
    assert!(Tensor::from_bytes(&d, DType::F32, &[2], &[0u8; 7]).is_err());
    let t = Tensor::from_slice(&d, &[1.0f32, 2.0], &[2]).unwrap();
    let err = t.to_vec::<f64>().unwrap_err();
    assert_eq!(err.to_string(), "Tensor::to_vec: expected dtype f64, got f32");
    assert!(t.reshape(&[3]).is_err());
    assert!(t.dim(1).is_err());
    assert!(t.narrow(0, 1, 2).is_err());
    assert!(t.narrow(1, 0, 1).is_err());
    assert!(t.narrow(0, usize::MAX, 2).is_err());
}

#[test]
fn shapes_views_and_layout() {
    let d = Device::cpu();
    let data: Vec<i32> = (0..24).collect();
    let t = Tensor::from_slice(&d, &data, &[2, 3, 4]).unwrap();
    assert_eq!((t.shape(), t.dims(), t.rank(), t.numel()), (&[2, 3, 4][..], &[2, 3, 4][..], 3, 24));
    assert_eq!(t.strides(), &[12, 4, 1]);
    assert!(t.is_contiguous());
    assert_eq!(t.dim(2).unwrap(), 4);

    let r = t.reshape(&[6, 4]).unwrap();
    assert_eq!(r.to_vec::<i32>().unwrap(), data);

    // Rows 1..3 of the middle dimension: still one dense block per outer index, not contiguous.
    let n = t.narrow(1, 1, 2).unwrap();
    assert_eq!(n.shape(), &[2, 2, 4]);
    assert!(!n.is_contiguous());
    assert_eq!(n.to_vec::<i32>().unwrap(), vec![4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23]);
    assert!(n.reshape(&[16]).is_err());

    // A narrowed outer dimension is contiguous, at an offset.
    let o = t.narrow(0, 1, 1).unwrap();
    assert!(o.is_contiguous());
    assert_eq!(o.offset(), 12);
    assert_eq!(o.reshape(&[12]).unwrap().to_vec::<i32>().unwrap(), (12..24).collect::<Vec<_>>());

    // Columns: stride-4 elements.
    let c = t.reshape(&[6, 4]).unwrap().narrow(1, 2, 1).unwrap();
    assert_eq!(c.to_vec::<i32>().unwrap(), vec![2, 6, 10, 14, 18, 22]);
    assert_eq!(c.to_device(&d).unwrap().strides(), &[1, 1]);

    // Scalars and empty tensors.
    let s = Tensor::from_slice(&d, &[7u8], &[]).unwrap();
    assert_eq!((s.numel(), s.rank(), s.to_vec::<u8>().unwrap()), (1, 0, vec![7]));
    let e = Tensor::zeros(&d, DType::F32, &[0, 5]).unwrap();
    assert_eq!(e.numel(), 0);
    assert!(e.to_vec::<f32>().unwrap().is_empty());
    assert!(t.narrow(0, 2, 0).unwrap().to_vec::<i32>().unwrap().is_empty());
}
