//! RMSNorm fused with the residual add, SwiGLU and the embedding gather against plain
//! references, across dtypes and awkward sizes, and their errors.

use crate::common::*;
use ruda_ops::api::{self, OpError};
use ruda_runtime::{DType, Tensor};

const COLS: [usize; 4] = [1, 17, 1000, 4097];

/// Hugging Face's residual add and `Qwen2RMSNorm`, one PyTorch op at a time in `dtype`
/// (statistics in f64 here, so the kernel's f32 statistics are checked by a tolerance).
fn hf_residual_rms_norm(dtype: DType, x: &[f32], res: &[f32], gamma: &[f32], eps: f32) -> (Vec<f32>, Vec<f64>) {
    let h = gamma.len();
    let sum: Vec<f32> = x.iter().zip(res).map(|(a, b)| round_to(dtype, a + b)).collect();
    let mut out = Vec::with_capacity(x.len());
    for row in sum.chunks(h) {
        let var = row.iter().map(|v| *v as f64 * *v as f64).sum::<f64>() / h as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for (v, g) in row.iter().zip(gamma) {
            // hidden.to(f32) * rsqrt(var + eps), .to(dtype), then weight * hidden.
            let hidden = round_to(dtype, (*v as f64 * inv) as f32) as f64;
            out.push(*g as f64 * hidden);
        }
    }
    (sum, out)
}

#[test]
fn rms_norm_residual_matches_hugging_face_order() {
    let dev = device();
    let mut rng = Rng::new(31);
    for dtype in FLOAT_DTYPES {
        for h in COLS {
            let rows = 3;
            let x = quantize(dtype, &rng.vec(rows * h, -2.0, 2.0));
            let res = quantize(dtype, &rng.vec(rows * h, -2.0, 2.0));
            // gamma holds model-dtype weights, as when loaded from a bf16 checkpoint.
            let gamma = quantize(dtype, &rng.vec(h, 0.5, 1.5));
            let eps = 1e-6;
            let (out, sum) = api::rms_norm_residual(
                &tensor(&dev, dtype, &x, &[rows, h]),
                &tensor(&dev, dtype, &res, &[rows, h]),
                &tensor(&dev, DType::F32, &gamma, &[h]),
                eps,
            )
            .unwrap();
            let (want_sum, want) = hf_residual_rms_norm(dtype, &x, &res, &gamma, eps);
            // The residual add is one f32 add rounded to the dtype: exact.
            assert_bits(&format!("residual {dtype} h={h}"), &sum.to_f32_vec().unwrap(), &want_sum);
            // f32 statistics (a few ulp of f32) can move the intermediate rounding to the dtype
            // by one unit, then the product with gamma is rounded once more.
            assert_close(
                &format!("rms_norm_residual {dtype} h={h}"),
                &out.to_f32_vec().unwrap(),
                &want,
                1e-6,
                8.0 * f32::EPSILON as f64 + 2.0 * epsilon(dtype),
            );
        }
    }
}

/// RMSNorm alone in Hugging Face's order: the fused kernel with a zero residual bit for bit, the
/// reference within the same tolerance, and (in bf16) not the ruDNN `rms_norm`, which rounds once.
#[test]
fn rms_norm_hf_matches_hugging_face_order() {
    let dev = device();
    let mut rng = Rng::new(33);
    for dtype in FLOAT_DTYPES {
        let mut differs_from_rudnn = false;
        for h in COLS {
            let rows = 3;
            let x = quantize(dtype, &rng.vec(rows * h, -2.0, 2.0));
            let gamma = quantize(dtype, &rng.vec(h, 0.5, 1.5));
            let (xt, gt) = (tensor(&dev, dtype, &x, &[rows, h]), tensor(&dev, DType::F32, &gamma, &[h]));
            let out = api::rms_norm_hf(&xt, &gt, 1e-6).unwrap().to_f32_vec().unwrap();
            let zeros = tensor(&dev, dtype, &vec![0.0; rows * h], &[rows, h]);
            let (fused, _) = api::rms_norm_residual(&xt, &zeros, &gt, 1e-6).unwrap();
            assert_bits(&format!("rms_norm_hf {dtype} h={h} vs a zero residual"), &out, &fused.to_f32_vec().unwrap());
            let (_, want) = hf_residual_rms_norm(dtype, &x, &vec![0.0; rows * h], &gamma, 1e-6);
            let tol = 8.0 * f32::EPSILON as f64 + 2.0 * epsilon(dtype);
            assert_close(&format!("rms_norm_hf {dtype} h={h}"), &out, &want, 1e-6, tol);
            let rudnn = api::rms_norm(&xt, &gt, 1e-6).unwrap().to_f32_vec().unwrap();
            differs_from_rudnn |= out.iter().zip(&rudnn).any(|(a, b)| a.to_bits() != b.to_bits());
        }
        // In f32 the orders coincide; in f16/bf16 the extra rounding shows.
        assert_eq!(differs_from_rudnn, dtype != DType::F32, "{dtype}");
    }
    let x = tensor(&dev, DType::F32, &[1.0; 8], &[2, 4]);
    let err = api::rms_norm_hf(&x, &tensor(&dev, DType::F32, &[1.0; 3], &[3]), 1e-6).unwrap_err().to_string();
    assert!(err.contains("rms_norm_hf") && err.contains("gamma"), "{err}");
    assert!(api::rms_norm_hf(&x, &tensor(&dev, DType::F32, &[1.0; 4], &[4]), 0.0).is_err());
}

#[test]
fn swiglu_matches_reference() {
    let dev = device();
    let mut rng = Rng::new(32);
    for dtype in FLOAT_DTYPES {
        for inter in COLS {
            for rows in [1, 5] {
                let gu = quantize(dtype, &rng.vec(rows * 2 * inter, -8.0, 8.0));
                let got = api::swiglu(&tensor(&dev, dtype, &gu, &[rows, 2 * inter])).unwrap();
                assert_eq!((got.dtype(), got.shape()), (dtype, &[rows, inter][..]));
                let want: Vec<f64> = gu
                    .chunks(2 * inter)
                    .flat_map(|row| {
                        (0..inter).map(move |j| {
                            let (g, u) = (row[j] as f64, row[inter + j] as f64);
                            g / (1.0 + (-g).exp()) * u
                        })
                    })
                    .collect();
                // ex2.approx (2 ulp of f32) and a few correctly rounded f32 steps, one rounding
                // to the dtype (half an f16 subnormal step, 2^-25, for results below its normals).
                let abs = if dtype == DType::F16 { 2f64.powi(-25) } else { 1e-30 };
                assert_close(
                    &format!("swiglu {dtype} rows={rows} I={inter}"),
                    &got.to_f32_vec().unwrap(),
                    &want,
                    abs,
                    8.0 * f32::EPSILON as f64 + epsilon(dtype),
                );
            }
        }
    }
}

#[test]
fn swiglu_keeps_leading_dimensions() {
    let dev = device();
    let gu = tensor(&dev, DType::F32, &[1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 5.0, 6.0], &[2, 1, 4]);
    let got = api::swiglu(&gu).unwrap();
    assert_eq!(got.shape(), &[2, 1, 2]);
    let silu = |x: f64| x / (1.0 + (-x).exp());
    let want = [silu(1.0) * 3.0, silu(2.0) * 4.0, silu(-1.0) * 5.0, silu(0.0) * 6.0];
    assert_close("swiglu 3-D", &got.to_f32_vec().unwrap(), &want, 1e-7, 1e-6);
}

#[test]
fn embedding_gathers_rows_and_zeroes_bad_ids() {
    let dev = device();
    let mut rng = Rng::new(33);
    for dtype in FLOAT_DTYPES {
        // Hidden sizes with whole 16-byte rows (vector copies) and without (element copies).
        for hidden in [1, 17, 64, 1000] {
            let vocab = 37;
            let table = quantize(dtype, &rng.vec(vocab * hidden, -1.0, 1.0));
            let ids = [5u32, 0, 36, 37, u32::MAX, 5];
            let got = api::embedding(
                &Tensor::from_slice(&dev, &ids, &[ids.len()]).unwrap(),
                &tensor(&dev, dtype, &table, &[vocab, hidden]),
            )
            .unwrap();
            assert_eq!((got.dtype(), got.shape()), (dtype, &[ids.len(), hidden][..]));
            let want: Vec<f32> = ids
                .iter()
                .flat_map(|&id| match table.get(id as usize * hidden..(id as usize + 1) * hidden) {
                    Some(row) if (id as usize) < vocab => row.to_vec(),
                    _ => vec![0.0; hidden],
                })
                .collect();
            assert_bits(&format!("embedding {dtype} H={hidden}"), &got.to_f32_vec().unwrap(), &want);
        }
    }
}

#[test]
fn embedding_of_an_unaligned_table_view_copies_elementwise() {
    let dev = device();
    let (vocab, hidden) = (4, 8);
    let flat: Vec<f32> = (0..vocab * hidden + 1).map(|i| i as f32).collect();
    // The table starts one element into its buffer: 16-byte copies would be misaligned.
    let table = tensor(&dev, DType::BF16, &flat, &[vocab * hidden + 1])
        .narrow(0, 1, vocab * hidden)
        .unwrap()
        .reshape(&[vocab, hidden])
        .unwrap();
    let got = api::embedding(&Tensor::from_slice(&dev, &[3u32, 1], &[2]).unwrap(), &table).unwrap();
    let want: Vec<f32> = (25..33).chain(9..17).map(|i| i as f32).collect();
    assert_bits("unaligned embedding", &got.to_f32_vec().unwrap(), &want);
}

#[test]
fn errors_name_the_problem() {
    let dev = device();
    let stream = dev.default_stream();
    let x = tensor(&dev, DType::BF16, &[1.0; 6], &[2, 3]);
    let gamma = tensor(&dev, DType::F32, &[1.0; 3], &[3]);
    let x_f16 = tensor(&dev, DType::F16, &[1.0; 6], &[2, 3]);
    assert!(matches!(api::rms_norm_residual(&x, &x_f16, &gamma, 1e-6), Err(OpError::DType { .. })));
    let err = api::rms_norm_residual(&x, &x, &gamma, 0.0).unwrap_err();
    assert!(err.to_string().contains("epsilon"), "{err}");
    let gamma_bf16 = tensor(&dev, DType::BF16, &[1.0; 3], &[3]);
    assert!(matches!(api::rms_norm_residual(&x, &x, &gamma_bf16, 1e-6), Err(OpError::DType { .. })));
    // A residual_out of the wrong shape.
    let small = Tensor::empty(&dev, DType::BF16, &[1, 3]).unwrap();
    let out = Tensor::empty(&dev, DType::BF16, &[2, 3]).unwrap();
    let err = api::rms_norm_residual_into(&stream, &x, &x.clone(), &gamma, 1e-6, &out, &small).unwrap_err();
    assert!(err.to_string().contains("residual_out"), "{err}");

    let odd = tensor(&dev, DType::BF16, &[1.0; 6], &[2, 3]);
    let err = api::swiglu(&odd).unwrap_err();
    assert!(err.to_string().contains("even"), "{err}");

    let table = tensor(&dev, DType::F32, &[1.0; 6], &[3, 2]);
    let ids_i32 = Tensor::from_slice(&dev, &[0i32], &[1]).unwrap();
    assert!(matches!(api::embedding(&ids_i32, &table), Err(OpError::DType { .. })));
    let ids_2d = Tensor::from_slice(&dev, &[0u32, 1], &[1, 2]).unwrap();
    assert!(matches!(api::embedding(&ids_2d, &table), Err(OpError::Shape { .. })));
}

/// PyTorch's `x + b` in `dtype`: the f32 sum of the (exact) widened values, rounded once.
fn bias_reference(dtype: DType, x: &[f32], bias: &[f32]) -> Vec<f32> {
    x.chunks(bias.len()).flat_map(|row| row.iter().zip(bias).map(|(a, b)| round_to(dtype, a + b))).collect()
}

#[test]
fn add_bias_matches_pytorch_rounding() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(34);
    for dtype in FLOAT_DTYPES {
        // Whole 16-byte rows (vector path) in every dtype, and sizes that are not (scalar path).
        for n in [1, 17, 64, 1000, 1152, 4097] {
            for shape in [vec![1, n], vec![3, n], vec![2, 2, n]] {
                let numel: usize = shape.iter().product();
                // Mixed magnitudes so that sums need rounding and cancel.
                let x = quantize(dtype, &rng.vec(numel, -100.0, 100.0));
                let bias = quantize(dtype, &rng.vec(n, -1.0, 1.0));
                let xt = tensor(&dev, dtype, &x, &shape);
                let bt = tensor(&dev, dtype, &bias, &[n]);
                let got = api::add_bias(&xt, &bt).unwrap();
                assert_eq!((got.dtype(), got.shape()), (dtype, &shape[..]));
                let want = bias_reference(dtype, &x, &bias);
                assert_bits(&format!("add_bias {dtype} {shape:?}"), &got.to_f32_vec().unwrap(), &want);
                let out = Tensor::empty(&dev, dtype, &shape).unwrap();
                api::add_bias_into(&stream, &xt, &bt, &out).unwrap();
                assert_bits(&format!("add_bias_into {dtype} {shape:?}"), &out.to_f32_vec().unwrap(), &want);
            }
        }
    }
}

#[test]
fn add_bias_special_values_and_many_rows() {
    let dev = device();
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let x = [1.0, -0.0, inf, 3.0e38, 65504.0, 1.0, -inf, 0.5];
    let bias = [1.0, 0.0, -inf, 3.0e38, 32.0, nan, 1.0, -0.5];
    for dtype in FLOAT_DTYPES {
        let x = quantize(dtype, &x);
        let bias = quantize(dtype, &bias);
        let got = api::add_bias(&tensor(&dev, dtype, &x, &[1, 8]), &tensor(&dev, dtype, &bias, &[8])).unwrap();
        assert_bits(
            &format!("add_bias specials {dtype}"),
            &got.to_f32_vec().unwrap(),
            &bias_reference(dtype, &x, &bias),
        );
    }
    // More rows than the grid's row blocks: block rows loop.
    let rows = 65_537;
    let x: Vec<f32> = (0..rows * 2).map(|i| i as f32).collect();
    let got = api::add_bias(&tensor(&dev, DType::F32, &x, &[rows, 2]), &tensor(&dev, DType::F32, &[0.5, -0.5], &[2]))
        .unwrap();
    assert_bits("add_bias many rows", &got.to_f32_vec().unwrap(), &bias_reference(DType::F32, &x, &[0.5, -0.5]));
}

#[test]
fn add_bias_of_unaligned_views_uses_scalar_accesses() {
    let dev = device();
    let flat: Vec<f32> = (0..17).map(|i| i as f32).collect();
    for dtype in FLOAT_DTYPES {
        // 8 columns are a whole 16-byte unit for halves, but the views start one element in.
        let x = tensor(&dev, dtype, &flat, &[17]).narrow(0, 1, 16).unwrap().reshape(&[2, 8]).unwrap();
        let bias = tensor(&dev, dtype, &flat, &[17]).narrow(0, 9, 8).unwrap();
        let got = api::add_bias(&x, &bias).unwrap();
        let want = bias_reference(dtype, &flat[1..17], &flat[9..17]);
        assert_bits(&format!("unaligned add_bias {dtype}"), &got.to_f32_vec().unwrap(), &want);
    }
}

#[test]
fn add_bias_errors() {
    let dev = device();
    let stream = dev.default_stream();
    let x = tensor(&dev, DType::BF16, &[1.0; 6], &[2, 3]);
    let bias = tensor(&dev, DType::BF16, &[1.0; 3], &[3]);
    let err = api::add_bias(&x, &tensor(&dev, DType::BF16, &[1.0; 2], &[2])).unwrap_err();
    assert!(matches!(err, OpError::Shape { .. }) && err.to_string().contains("bias"), "{err}");
    let err = api::add_bias(&x, &tensor(&dev, DType::F32, &[1.0; 3], &[3])).unwrap_err();
    assert!(matches!(err, OpError::DType { .. }) && err.to_string().contains("bias"), "{err}");
    let ints = Tensor::from_slice(&dev, &[1u32; 6], &[2, 3]).unwrap();
    assert!(matches!(api::add_bias(&ints, &bias), Err(OpError::DType { .. })));
    let out_f16 = Tensor::empty(&dev, DType::F16, &[2, 3]).unwrap();
    let err = api::add_bias_into(&stream, &x, &bias, &out_f16).unwrap_err();
    assert!(matches!(err, OpError::DType { .. }) && err.to_string().contains("out"), "{err}");
    let out_small = Tensor::empty(&dev, DType::BF16, &[1, 3]).unwrap();
    let err = api::add_bias_into(&stream, &x, &bias, &out_small).unwrap_err();
    assert!(matches!(err, OpError::Shape { .. }) && err.to_string().contains("out"), "{err}");
    let bias_2d = tensor(&dev, DType::BF16, &[1.0; 3], &[1, 3]);
    assert!(matches!(api::add_bias(&x, &bias_2d), Err(OpError::Shape { .. })));
    if !dev.is_cuda() {
        // The interpreter takes one exclusive buffer per argument: in place is refused there.
        assert!(api::add_bias_into(&stream, &x, &bias, &x).is_err());
    }
}
