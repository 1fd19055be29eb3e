//! GEMV (decode GEMM, `M ≤ 16`) against an f64 reference: vector and scalar loads, every
//! compiled row count, split-K, the `linear` dispatch, and errors.

use crate::common::*;
use ruda_ops::api::{self, OpError};
use ruda_runtime::{DType, Tensor};

#[test]
fn gemv_matches_reference_across_shapes_and_dtypes() {
    let dev = device();
    let mut rng = Rng::new(11);
    // (m, n, k): vector loads (k a multiple of 8), scalar loads (k = 1, 17, 4097), every m tile
    // (1, 2, 3 -> 4, 5 -> 8, 16), tails shorter than a chunk group, n not a multiple of 4 warps.
    let shapes =
        [(1, 1, 1), (1, 17, 8), (2, 5, 17), (3, 33, 1000), (5, 7, 264), (16, 6, 4097), (1, 9, 4096), (16, 3, 512)];
    for dtype in FLOAT_DTYPES {
        for (m, n, k) in shapes {
            let x = quantize(dtype, &rng.vec(m * k, -1.0, 1.0));
            let w = quantize(dtype, &rng.vec(n * k, -1.0, 1.0));
            let got = api::gemv(&tensor(&dev, dtype, &x, &[m, k]), &tensor(&dev, dtype, &w, &[n, k])).unwrap();
            assert_eq!((got.dtype(), got.shape()), (dtype, &[m, n][..]));
            let (want, mag) = linear_reference(&x, &w, m, n, k);
            check_linear(&format!("gemv {dtype} {m}x{n}x{k}"), dtype, &got.to_f32_vec().unwrap(), &want, &mag, k);
        }
    }
}

#[test]
fn unaligned_inputs_take_the_scalar_path() {
    let dev = device();
    let mut rng = Rng::new(12);
    let (m, n, k) = (2, 5, 64);
    for dtype in FLOAT_DTYPES {
        let x = quantize(dtype, &rng.vec(m * k + 1, -1.0, 1.0));
        let w = quantize(dtype, &rng.vec(n * k, -1.0, 1.0));
        // x starts one element into its buffer: not 16-byte aligned.
        let tx = tensor(&dev, dtype, &x, &[m * k + 1]).narrow(0, 1, m * k).unwrap().reshape(&[m, k]).unwrap();
        let got = api::gemv(&tx, &tensor(&dev, dtype, &w, &[n, k])).unwrap().to_f32_vec().unwrap();
        let (want, mag) = linear_reference(&x[1..], &w, m, n, k);
        check_linear(&format!("unaligned gemv {dtype}"), dtype, &got, &want, &mag, k);
    }
}

#[test]
fn split_k_matches_reference_and_reduces_in_order() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(13);
    for dtype in FLOAT_DTYPES {
        for (m, n, k, splits) in [(1, 6, 4096, 4), (3, 5, 2056, 3), (2, 3, 1001, 2), (1, 2, 64, 8)] {
            let x = quantize(dtype, &rng.vec(m * k, -1.0, 1.0));
            let w = quantize(dtype, &rng.vec(n * k, -1.0, 1.0));
            let (tx, tw) = (tensor(&dev, dtype, &x, &[m, k]), tensor(&dev, dtype, &w, &[n, k]));
            let out = Tensor::empty(&dev, dtype, &[m, n]).unwrap();
            let ws = Tensor::empty(&dev, DType::F32, &[splits * m * n]).unwrap();
            api::gemv_split_k_into(&stream, &tx, &tw, &out, &ws, splits).unwrap();
            let (want, mag) = linear_reference(&x, &w, m, n, k);
            let got = out.to_f32_vec().unwrap();
            check_linear(&format!("split-k gemv {dtype} {m}x{n}x{k}/{splits}"), dtype, &got, &want, &mag, k);
            // Deterministic: the same launch gives the same bits.
            api::gemv_split_k_into(&stream, &tx, &tw, &out, &ws, splits).unwrap();
            assert_bits("split-k rerun", &out.to_f32_vec().unwrap(), &got);
        }
    }
}

#[test]
fn linear_dispatches_to_gemv_up_to_16_rows() {
    let dev = device();
    let mut rng = Rng::new(14);
    let (n, k) = (9, 40);
    for dtype in FLOAT_DTYPES {
        let w = tensor(&dev, dtype, &quantize(dtype, &rng.vec(n * k, -1.0, 1.0)), &[n, k]);
        for m in [1, 16, 17] {
            let x = tensor(&dev, dtype, &quantize(dtype, &rng.vec(m * k, -1.0, 1.0)), &[m, k]);
            let via_linear = api::linear(&x, &w).unwrap().to_f32_vec().unwrap();
            if m <= api::GEMV_MAX_M {
                assert_bits(
                    &format!("linear = gemv {dtype} m={m}"),
                    &via_linear,
                    &api::gemv(&x, &w).unwrap().to_f32_vec().unwrap(),
                );
            } else {
                assert!(api::gemv(&x, &w).is_err(), "gemv takes at most 16 rows");
            }
        }
    }
}

#[test]
fn gemv_errors_name_the_problem() {
    let dev = device();
    let stream = dev.default_stream();
    let x = tensor(&dev, DType::BF16, &[0.5; 16], &[2, 8]);
    let w = tensor(&dev, DType::BF16, &[0.5; 24], &[3, 8]);
    let out = Tensor::empty(&dev, DType::BF16, &[2, 3]).unwrap();
    let tall = tensor(&dev, DType::BF16, &[0.5; 17 * 8], &[17, 8]);
    let err = api::gemv(&tall, &w).unwrap_err();
    assert!(matches!(err, OpError::Shape { .. }) && err.to_string().contains("at most 16"), "{err}");
    let w_bad_k = tensor(&dev, DType::BF16, &[0.5; 21], &[3, 7]);
    assert!(matches!(api::gemv(&x, &w_bad_k), Err(OpError::Shape { .. })));
    let w_f16 = tensor(&dev, DType::F16, &[0.5; 24], &[3, 8]);
    assert!(matches!(api::gemv(&x, &w_f16), Err(OpError::DType { .. })));
    let small_ws = Tensor::empty(&dev, DType::F32, &[5]).unwrap();
    // k = 8 is one chunk, so 2 splits round down to 1 and need no workspace...
    api::gemv_split_k_into(&stream, &x, &w, &out, &small_ws, 2).unwrap();
    // ...but a deep k with too small a workspace is an error naming it.
    let (xd, wd) = (
        tensor(&dev, DType::BF16, &[0.5; 2 * 4096], &[2, 4096]),
        tensor(&dev, DType::BF16, &[0.5; 3 * 4096], &[3, 4096]),
    );
    let err = api::gemv_split_k_into(&stream, &xd, &wd, &out, &small_ws, 2).unwrap_err();
    assert!(err.to_string().contains("workspace"), "{err}");
    let err = api::gemv_split_k_into(&stream, &x, &w, &out, &small_ws, 0).unwrap_err();
    assert!(err.to_string().contains("splits"), "{err}");
}

/// The bias joins the f32 sum before the one rounding (cuBLAS's epilogue), in the GEMV's store
/// and in the split-K reduction alike; a mis-shaped bias is an error.
#[test]
fn gemv_bias_is_added_before_the_rounding() {
    let dev = device();
    let mut rng = Rng::new(41);
    for dtype in FLOAT_DTYPES {
        for (m, n, k) in [(1, 70, 512), (3, 33, 256)] {
            let x = quantize(dtype, &rng.vec(m * k, -1.0, 1.0));
            let w = quantize(dtype, &rng.vec(n * k, -1.0, 1.0));
            let bias = quantize(dtype, &rng.vec(n, -4.0, 4.0));
            let (mut want, mag) = linear_reference(&x, &w, m, n, k);
            for (i, v) in want.iter_mut().enumerate() {
                *v += bias[i % n] as f64;
            }
            let (xt, wt, bt) =
                (tensor(&dev, dtype, &x, &[m, k]), tensor(&dev, dtype, &w, &[n, k]), tensor(&dev, dtype, &bias, &[n]));
            let ws = Tensor::zeros(&dev, DType::F32, &[4 * m * n]).unwrap();
            for splits in [1, 4] {
                let out = Tensor::zeros(&dev, dtype, &[m, n]).unwrap();
                api::gemv_bias_into(&dev.default_stream(), &xt, &wt, &bt, &out, Some(&ws), splits).unwrap();
                let got = out.to_f32_vec().unwrap();
                check_linear(&format!("gemv+bias {dtype} {m}x{n}x{k} splits={splits}"), dtype, &got, &want, &mag, k);
            }
        }
    }
    let x = Tensor::zeros(&dev, DType::F32, &[1, 8]).unwrap();
    let w = Tensor::zeros(&dev, DType::F32, &[4, 8]).unwrap();
    let out = Tensor::zeros(&dev, DType::F32, &[1, 4]).unwrap();
    let short = Tensor::zeros(&dev, DType::F32, &[3]).unwrap();
    let err = api::gemv_bias_into(&dev.default_stream(), &x, &w, &short, &out, None, 1).unwrap_err().to_string();
    assert!(err.contains("bias"), "{err}");
}
