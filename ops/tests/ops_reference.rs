//! Every op against a plain Rust reference (f64 accumulation) across dtypes and awkward shapes,
//! on the device `RUDA_DEVICE` names: the interpreter here, a GPU in the GPU rung. Tolerances
//! are written beside each check, in units of the output dtype's epsilon where rounding to it
//! dominates.

use crate::common::*;
use ruda_ops::api;
use ruda_runtime::DType;

/// Column counts that are not multiples of anything: 1, a prime, round, just past a power of 2.
const COLS: [usize; 4] = [1, 17, 1000, 4097];

#[test]
fn add_and_mul_are_exact_in_f32_then_rounded() {
    let dev = device();
    let mut rng = Rng::new(1);
    for dtype in FLOAT_DTYPES {
        for n in COLS {
            let a = quantize(dtype, &rng.vec(n, -4.0, 4.0));
            let b = quantize(dtype, &rng.vec(n, -4.0, 4.0));
            let (ta, tb) = (tensor(&dev, dtype, &a, &[n]), tensor(&dev, dtype, &b, &[n]));
            let sum = api::add(&ta, &tb).unwrap().to_f32_vec().unwrap();
            let prod = api::mul(&ta, &tb).unwrap().to_f32_vec().unwrap();
            // The kernel adds in f32 (exactly rounded) and rounds once to the dtype.
            let want_sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| round_to(dtype, x + y)).collect();
            let want_prod: Vec<f32> = a.iter().zip(&b).map(|(x, y)| round_to(dtype, x * y)).collect();
            assert_bits(&format!("add {dtype} n={n}"), &sum, &want_sum);
            assert_bits(&format!("mul {dtype} n={n}"), &prod, &want_prod);
        }
    }
}

#[test]
fn silu_matches_reference() {
    let dev = device();
    let mut rng = Rng::new(2);
    for dtype in FLOAT_DTYPES {
        for n in COLS {
            let mut x = quantize(dtype, &rng.vec(n, -10.0, 10.0));
            if n > 4 {
                x[..4].copy_from_slice(&[0.0, -0.0, 80.0, -80.0]);
            }
            let got = api::silu(&tensor(&dev, dtype, &x, &[n])).unwrap().to_f32_vec().unwrap();
            let want: Vec<f64> = x.iter().map(|&v| v as f64 / (1.0 + (-(v as f64)).exp())).collect();
            // ex2.approx is within 2 ulp of f32; the result is then rounded to the dtype.
            assert_close(
                &format!("silu {dtype} n={n}"),
                &got,
                &want,
                1e-30,
                4.0 * f32::EPSILON as f64 + epsilon(dtype),
            );
        }
    }
}

#[test]
fn casts_round_to_nearest_even() {
    let dev = device();
    let mut rng = Rng::new(3);
    let n = 4097;
    let mut x = rng.vec(n, -70000.0, 70000.0);
    x[..6].copy_from_slice(&[f32::NAN, f32::INFINITY, -0.0, 1e-8, 65520.0, 1.0 + f32::EPSILON]);
    for from in FLOAT_DTYPES {
        for to in FLOAT_DTYPES {
            if from == to {
                continue;
            }
            let src = quantize(from, &x);
            let got = api::cast(&tensor(&dev, from, &src, &[n]), to).unwrap();
            assert_eq!(got.dtype(), to);
            let want: Vec<f32> = src.iter().map(|v| round_to(to, *v)).collect();
            assert_bits(&format!("cast {from}->{to}"), &got.to_f32_vec().unwrap(), &want);
        }
    }
}

#[test]
fn row_reductions_match_reference() {
    let dev = device();
    let mut rng = Rng::new(4);
    for dtype in FLOAT_DTYPES {
        for cols in COLS {
            let rows = 3;
            let x = quantize(dtype, &rng.vec(rows * cols, -3.0, 3.0));
            let t = tensor(&dev, dtype, &x, &[rows, cols]);
            let sum = api::reduce_sum(&t).unwrap();
            assert_eq!(sum.shape(), &[rows]);
            let max = api::reduce_max(&t).unwrap().to_f32_vec().unwrap();
            let rows_of = x.chunks(cols);
            let want_sum: Vec<f64> = rows_of.clone().map(|r| r.iter().map(|v| *v as f64).sum()).collect();
            let abs_sum: Vec<f64> = rows_of.clone().map(|r| r.iter().map(|v| v.abs() as f64).sum()).collect();
            let got_sum = sum.to_f32_vec().unwrap();
            for r in 0..rows {
                // f32 accumulation: error grows with the sum of magnitudes, not the result.
                let tol = 1e-6 * abs_sum[r] + 1e-7;
                assert!(
                    (got_sum[r] as f64 - want_sum[r]).abs() <= tol,
                    "sum {dtype} cols={cols} row {r}: got {}, want {}",
                    got_sum[r],
                    want_sum[r]
                );
            }
            let want_max: Vec<f32> = rows_of.map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max)).collect();
            assert_bits(&format!("max {dtype} cols={cols}"), &max, &want_max);
        }
    }
}

#[test]
fn reduce_max_propagates_nan_and_handles_infinities() {
    let dev = device();
    let x = vec![
        1.0,
        f32::NAN,
        3.0,
        /* */ f32::NEG_INFINITY,
        f32::NEG_INFINITY,
        f32::NEG_INFINITY,
        /* */ -1.0,
        f32::INFINITY,
        2.0,
    ];
    let got = api::reduce_max(&tensor(&dev, DType::F32, &x, &[3, 3])).unwrap().to_f32_vec().unwrap();
    assert!(got[0].is_nan(), "a NaN row reduces to NaN, got {}", got[0]);
    assert_eq!(got[1], f32::NEG_INFINITY);
    assert_eq!(got[2], f32::INFINITY);
}

#[test]
fn softmax_matches_reference() {
    let dev = device();
    let mut rng = Rng::new(5);
    for dtype in FLOAT_DTYPES {
        for cols in COLS {
            let rows = 2;
            let x = quantize(dtype, &rng.vec(rows * cols, -8.0, 8.0));
            let got = api::softmax_last_axis(&tensor(&dev, dtype, &x, &[rows, cols])).unwrap().to_f32_vec().unwrap();
            let mut want = Vec::new();
            for r in x.chunks(cols) {
                let m = r.iter().map(|v| *v as f64).fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = r.iter().map(|v| (*v as f64 - m).exp()).collect();
                let s: f64 = e.iter().sum();
                want.extend(e.iter().map(|v| v / s));
            }
            // ex2.approx (2 ulp) per element plus f32 summation, then rounding to the dtype.
            assert_close(
                &format!("softmax {dtype} cols={cols}"),
                &got,
                &want,
                1e-7,
                16.0 * f32::EPSILON as f64 + epsilon(dtype),
            );
        }
    }
}

#[test]
fn softmax_rows_with_nan_or_infinities_give_nan() {
    let dev = device();
    let x = vec![
        1.0,
        f32::NAN,
        0.0, // NaN in the row
        f32::NEG_INFINITY,
        f32::NEG_INFINITY,
        f32::NEG_INFINITY, // only -inf
        0.0,
        f32::INFINITY,
        1.0, // +inf
        0.0,
        f32::NEG_INFINITY,
        0.0, // -inf among finite values is fine
    ];
    let got = api::softmax_last_axis(&tensor(&dev, DType::F32, &x, &[4, 3])).unwrap().to_f32_vec().unwrap();
    assert!(got[..9].iter().all(|v| v.is_nan()), "rows 0-2 must be NaN: {got:?}");
    assert_close("finite row", &got[9..], &[0.5, 0.0, 0.5], 1e-7, 1e-6);
}

fn norm_reference(x: &[f32], gamma: &[f32], beta: Option<&[f32]>, eps: f32, rms: bool) -> Vec<f64> {
    let h = gamma.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(h) {
        let row: Vec<f64> = row.iter().map(|v| *v as f64).collect();
        let mean = if rms { 0.0 } else { row.iter().sum::<f64>() / h as f64 };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for j in 0..h {
            let shift = beta.map_or(0.0, |b| b[j] as f64);
            out.push((row[j] - mean) * inv * gamma[j] as f64 + shift);
        }
    }
    out
}

#[test]
fn rms_norm_matches_reference() {
    let dev = device();
    let mut rng = Rng::new(6);
    for dtype in FLOAT_DTYPES {
        for h in COLS {
            let rows = 3;
            let x = quantize(dtype, &rng.vec(rows * h, -2.0, 2.0));
            let gamma = rng.vec(h, 0.5, 1.5);
            let eps = 1e-6;
            let got = api::rms_norm(&tensor(&dev, dtype, &x, &[rows, h]), &tensor(&dev, DType::F32, &gamma, &[h]), eps)
                .unwrap();
            assert_eq!(got.dtype(), dtype);
            let want = norm_reference(&x, &gamma, None, eps, true);
            // f32 statistics (a few ulp), then one rounding to the dtype.
            assert_close(
                &format!("rms_norm {dtype} h={h}"),
                &got.to_f32_vec().unwrap(),
                &want,
                1e-6,
                8.0 * f32::EPSILON as f64 + epsilon(dtype),
            );
        }
    }
}

#[test]
fn layer_norm_matches_reference_with_and_without_beta() {
    let dev = device();
    let mut rng = Rng::new(7);
    for dtype in FLOAT_DTYPES {
        for h in COLS {
            let rows = 2;
            let x = quantize(dtype, &rng.vec(rows * h, -2.0, 3.0));
            let gamma = rng.vec(h, 0.5, 1.5);
            let beta = rng.vec(h, -0.5, 0.5);
            let eps = 1e-5;
            let tx = tensor(&dev, dtype, &x, &[rows, h]);
            let tg = tensor(&dev, DType::F32, &gamma, &[h]);
            let tb = tensor(&dev, DType::F32, &beta, &[h]);
            for with_beta in [true, false] {
                let beta_arg = with_beta.then_some(&tb);
                let got = api::layer_norm(&tx, &tg, beta_arg, eps).unwrap().to_f32_vec().unwrap();
                let want = norm_reference(&x, &gamma, with_beta.then_some(&beta[..]), eps, false);
                assert_close(
                    &format!("layer_norm {dtype} h={h} beta={with_beta}"),
                    &got,
                    &want,
                    1e-5,
                    16.0 * f32::EPSILON as f64 + epsilon(dtype),
                );
            }
        }
    }
}

#[test]
fn gemm_matches_reference_for_both_layouts() {
    let dev = device();
    let mut rng = Rng::new(8);
    for dtype in FLOAT_DTYPES {
        for (m, n, k) in [(1, 1, 1), (17, 33, 65), (64, 64, 16), (70, 130, 40)] {
            let a = quantize(dtype, &rng.vec(m * k, -1.0, 1.0));
            let b = quantize(dtype, &rng.vec(k * n, -1.0, 1.0));
            // The same B as [N, K] for `linear`.
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let ta = tensor(&dev, dtype, &a, &[m, k]);
            let via_matmul = api::matmul(&ta, &tensor(&dev, dtype, &b, &[k, n])).unwrap().to_f32_vec().unwrap();
            let via_linear = api::linear(&ta, &tensor(&dev, dtype, &bt, &[n, k])).unwrap().to_f32_vec().unwrap();
            let mut want = vec![0f64; m * n];
            let mut mag = vec![0f64; m * n];
            for i in 0..m {
                for j in 0..n {
                    for p in 0..k {
                        let prod = a[i * k + p] as f64 * b[p * n + j] as f64;
                        want[i * n + j] += prod;
                        mag[i * n + j] += prod.abs();
                    }
                }
            }
            for (name, got) in [("matmul", &via_matmul), ("linear", &via_linear)] {
                for idx in 0..m * n {
                    // f32 fma accumulation over k, then one rounding to the dtype.
                    let tol = k as f64 * f32::EPSILON as f64 * mag[idx] + epsilon(dtype) * want[idx].abs() + 1e-7;
                    let err = (got[idx] as f64 - want[idx]).abs();
                    assert!(err <= tol, "{name} {dtype} {m}x{n}x{k} [{idx}]: got {}, want {}", got[idx], want[idx]);
                }
            }
            // Both take the SIMT kernel (same order of fmas) unless `linear` takes tensor cores
            // (f16/bf16, k % 8 == 0, more than 16 rows), which sum in another order.
            let tensor_cores = dtype != DType::F32 && k % 8 == 0 && m > 16;
            if !tensor_cores {
                assert_bits(&format!("matmul vs linear {dtype}"), &via_matmul, &via_linear);
            }
        }
    }
}
