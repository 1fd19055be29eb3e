//! Log-probabilities of chosen and top tokens against an f64 log-softmax on the host: dtypes,
//! vocabularies that are not multiples of the block (1, 17, 255, 257, 4097, 151 936), ties (to
//! the lower id), every `top` up to 20, NaN and infinite rows, and the entry point's errors.

use crate::common::*;
use ruda_ops::api::{self, OpError, LOGPROBS_MAX_TOP};
use ruda_runtime::{DType, Tensor};

/// `(ids, values)` of one row as the kernel documents it, in f64: column 0 the chosen token,
/// then the `top` largest (NaN first, ties to the lower id); NaN everywhere for a row with a
/// NaN, a `+inf` or only `-inf`.
fn reference(row: &[f32], chosen: u32, top: usize) -> (Vec<u32>, Vec<f64>) {
    let m = row.iter().fold(f64::NEG_INFINITY, |m, &z| m.max(z as f64));
    let undefined = row.iter().any(|z| z.is_nan()) || m == f64::INFINITY || m == f64::NEG_INFINITY;
    let lse = m + row.iter().map(|&z| (z as f64 - m).exp()).sum::<f64>().ln();
    let value = |i: usize| if undefined { f64::NAN } else { row[i] as f64 - lse };
    let mut order: Vec<usize> = (0..row.len()).collect();
    // NaN above everything; then larger first; equal values (-0 == +0) by id.
    order.sort_by(|&a, &b| {
        let (x, y) = (row[a], row[b]);
        match (x.is_nan(), y.is_nan()) {
            (true, true) => a.cmp(&b),
            (true, false) => std::cmp::Ordering::Less,
            (false, true) => std::cmp::Ordering::Greater,
            _ => y.partial_cmp(&x).unwrap().then(a.cmp(&b)),
        }
    });
    let mut ids = vec![chosen];
    let mut values = vec![if (chosen as usize) < row.len() { value(chosen as usize) } else { f64::NAN }];
    for &i in &order[..top] {
        ids.push(i as u32);
        values.push(value(i));
    }
    (ids, values)
}

fn check(what: &str, got_ids: &[u32], got: &[f32], want_ids: &[u32], want: &[f64]) {
    assert_eq!(got_ids, want_ids, "{what}: ids");
    for (c, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= 2e-5 + 2e-6 * w.abs()
        };
        assert!(ok, "{what}: column {c}: got {g}, want {w}");
    }
}

fn run(
    dev: &ruda_runtime::Device,
    dtype: DType,
    x: &[f32],
    rows: usize,
    chosen: &[u32],
    top: usize,
) -> (Vec<u32>, Vec<f32>) {
    let t = tensor(dev, dtype, x, &[rows, x.len() / rows]);
    let c = Tensor::from_slice(dev, chosen, &[rows]).unwrap();
    let (ids, values) = api::logprobs(&t, &c, top).unwrap();
    assert_eq!((ids.shape(), values.shape()), (&[rows, 1 + top][..], &[rows, 1 + top][..]));
    (ids.to_vec::<u32>().unwrap(), values.to_vec::<f32>().unwrap())
}

#[test]
fn logprobs_match_an_f64_log_softmax() {
    let dev = device();
    let mut rng = Rng::new(51);
    for dtype in FLOAT_DTYPES {
        for cols in [1, 17, 255, 257, 4097] {
            let rows = 3;
            // Coarse values: ties among the top tokens are common.
            let x: Vec<f32> = rng.vec(rows * cols, -8.0, 8.0).iter().map(|v| (v * 4.0).round() / 4.0).collect();
            let x = quantize(dtype, &x);
            let chosen: Vec<u32> = (0..rows).map(|r| ((r * 7919 + 3) % cols) as u32).collect();
            for top in [0, 1, 5, LOGPROBS_MAX_TOP] {
                let top = top.min(cols);
                let (ids, values) = run(&dev, dtype, &x, rows, &chosen, top);
                for (r, row) in x.chunks(cols).enumerate() {
                    let (want_ids, want) = reference(row, chosen[r], top);
                    let w = 1 + top;
                    check(
                        &format!("{dtype} cols={cols} top={top} row {r}"),
                        &ids[r * w..(r + 1) * w],
                        &values[r * w..(r + 1) * w],
                        &want_ids,
                        &want,
                    );
                }
            }
        }
    }
}

#[test]
fn logprobs_of_a_full_vocabulary() {
    let dev = device();
    let cols = 151_936;
    let mut x = Rng::new(52).vec(cols, -4.0, 4.0);
    // A tie at the top far apart, and the rest of the top 20 near the end of the row.
    x[cols - 1] = 9.0;
    x[5] = 9.0;
    for i in 0..25 {
        x[cols - 100 + i] = 6.0 + (i % 5) as f32 * 0.5;
    }
    let (ids, values) = run(&dev, DType::BF16, &quantize(DType::BF16, &x), 1, &[12_345], 20);
    let (want_ids, want) = reference(&quantize(DType::BF16, &x), 12_345, 20);
    check("bf16 151936", &ids, &values, &want_ids, &want);
    assert_eq!(&ids[1..3], &[5, cols as u32 - 1], "ties go to the lower id");
    // Probabilities: each at most 1, their sum too.
    let mass: f64 = values[1..].iter().map(|&v| (v as f64).exp()).sum();
    assert!(values.iter().all(|&v| v <= 0.0) && mass <= 1.0 + 1e-5, "{values:?}");
}

#[test]
fn logprobs_nan_and_infinity_rules() {
    let dev = device();
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let rows: [[f32; 5]; 5] = [
        [1.0, nan, 3.0, nan, 0.0],      // NaN: all NaN, the NaNs ranked first
        [0.0, inf, 3.0, inf, -1.0],     // +inf: all NaN
        [-inf, -inf, -inf, -inf, -inf], // only -inf: all NaN
        [0.0, -inf, 2.0, -0.0, 2.0],    // -inf is -inf; -0 == +0; ties to the lower id
        [-1.0, -1.0, -1.0, -1.0, -1.0], // flat: ln(1/5) each
    ];
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    for dtype in FLOAT_DTYPES {
        // Chosen 1 in each row, and an id outside the row for the last.
        let chosen = [1, 1, 1, 1, 9];
        let (ids, values) = run(&dev, dtype, &flat, 5, &chosen, 5);
        for (r, row) in rows.iter().enumerate() {
            let (want_ids, want) = reference(row, chosen[r], 5);
            check(&format!("{dtype} row {r}"), &ids[r * 6..(r + 1) * 6], &values[r * 6..(r + 1) * 6], &want_ids, &want);
        }
        assert_eq!(&ids[1..3], &[1, 3], "{dtype}: NaNs first");
        assert!(values[..18].iter().all(|v| v.is_nan()), "{dtype}: {values:?}");
        assert_eq!(&ids[19..24], &[2, 4, 0, 3, 1], "{dtype}");
        assert_eq!(values[18], f32::NEG_INFINITY);
        assert!(values[24].is_nan(), "an id outside the row");
        assert!((values[25] as f64 - (0.2f64).ln()).abs() < 1e-6);
    }
}

#[test]
fn logprobs_errors() {
    let dev = device();
    let stream = dev.default_stream();
    let x = tensor(&dev, DType::F32, &[0.0; 6], &[2, 3]);
    let chosen = Tensor::from_slice(&dev, &[0u32, 1], &[2]).unwrap();
    let err = api::logprobs(&x, &chosen, 4).unwrap_err();
    assert!(matches!(err, OpError::InvalidArgument { .. }) && err.to_string().contains("top"), "{err}");
    let big = tensor(&dev, DType::F32, &[0.0; 2 * 30], &[2, 30]);
    assert!(matches!(api::logprobs(&big, &chosen, 21), Err(OpError::InvalidArgument { .. })));
    let chosen_i32 = Tensor::from_slice(&dev, &[0i32, 1], &[2]).unwrap();
    assert!(matches!(api::logprobs(&x, &chosen_i32, 1), Err(OpError::DType { .. })));
    let chosen_3 = Tensor::from_slice(&dev, &[0u32, 1, 2], &[3]).unwrap();
    assert!(matches!(api::logprobs(&x, &chosen_3, 1), Err(OpError::Shape { .. })));
    let flat = tensor(&dev, DType::F32, &[0.0; 3], &[3]);
    assert!(matches!(api::logprobs(&flat, &chosen, 1), Err(OpError::Shape { .. })));
    let ids = Tensor::empty(&dev, DType::U32, &[2, 2]).unwrap();
    let values = Tensor::empty(&dev, DType::F32, &[2, 3]).unwrap();
    let err = api::logprobs_into(&stream, &x, &chosen, 1, &ids, &values).unwrap_err();
    assert!(err.to_string().contains("values"), "{err}");
    let ints = Tensor::from_slice(&dev, &[0u32; 6], &[2, 3]).unwrap();
    assert!(matches!(api::logprobs(&ints, &chosen, 1), Err(OpError::DType { .. })));
}
