//! AWQ (AutoAWQ's GEMM layout): the GEMV, the dequantisation and `awq_linear` against f64
//! references built from the unpacked values, at shapes that end mid-block, mid-group and
//! mid-word-tile, and every error.

use half::f16;
use ruda_ops::api::{self, AwqWeight, Strategy};
use ruda_runtime::{DType, Tensor};

use crate::common::*;

/// AutoAWQ's packing order: nibble `i` of a word holds column `8j + ORDER[i]`.
const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// A random AWQ projection: the unpacked values and the packed tensors.
struct Quantized {
    n: usize,
    k: usize,
    g: usize,
    /// `q[k][n]`, `zero[k / g][n]` in 0..=15; `scale[k / g][n]` f16.
    q: Vec<u32>,
    zero: Vec<u32>,
    scale: Vec<f16>,
    qweight: Tensor,
    qzeros: Tensor,
    scales: Tensor,
}

/// Words `[rows, cols / 8]` packing `vals[rows][cols]` as AutoAWQ does.
fn pack(vals: &[u32], rows: usize, cols: usize) -> Vec<i32> {
    let mut out = vec![0i32; rows * cols / 8];
    for r in 0..rows {
        for j in 0..cols / 8 {
            let mut word = 0u32;
            for (i, &c) in ORDER.iter().enumerate() {
                word |= vals[r * cols + 8 * j + c] << (4 * i);
            }
            out[r * cols / 8 + j] = word as i32;
        }
    }
    out
}

impl Quantized {
    fn new(n: usize, k: usize, g: usize, seed: u64) -> Quantized {
        let dev = device();
        let mut rng = Rng::new(seed);
        let groups = k / g;
        let nibble = |rng: &mut Rng| (rng.next_u64() % 16) as u32;
        let q: Vec<u32> = (0..k * n).map(|_| nibble(&mut rng)).collect();
        let zero: Vec<u32> = (0..groups * n).map(|_| nibble(&mut rng)).collect();
        // Scales of both signs and many binades, so that `(q − z) · s` often needs rounding.
        let scale: Vec<f16> = (0..groups * n)
            .map(|_| {
                let s = rng.uniform(-1.0, 1.0) * 2f32.powi(rng.uniform(-6.0, 2.0) as i32);
                f16::from_f32(s)
            })
            .collect();
        let qweight = Tensor::from_slice(&dev, &pack(&q, k, n), &[k, n / 8]).unwrap();
        let qzeros = Tensor::from_slice(&dev, &pack(&zero, groups, n), &[groups, n / 8]).unwrap();
        let scales = Tensor::from_slice(&dev, &scale, &[groups, n]).unwrap();
        Quantized { n, k, g, q, zero, scale, qweight, qzeros, scales }
    }

    fn weight(&self) -> AwqWeight<'_> {
        AwqWeight { qweight: &self.qweight, qzeros: &self.qzeros, scales: &self.scales, group_size: self.g }
    }

    /// `W[k][n] = f16((q − zero) · scale)`, the dequantised value every path must use.
    fn dense(&self, kk: usize, nn: usize) -> f32 {
        let gi = (kk / self.g) * self.n + nn;
        let diff = self.q[kk * self.n + nn] as f32 - self.zero[gi] as f32;
        f16::from_f32(diff * self.scale[gi].to_f32()).to_f32()
    }
}

/// `x[m, k] · W (+ bias)` in f64 with `W` in `dtype`, and the sum of the terms' magnitudes.
fn reference(w: &Quantized, dtype: DType, x: &[f32], bias: Option<&[f32]>, m: usize) -> (Vec<f64>, Vec<f64>) {
    let (n, k) = (w.n, w.k);
    let mut want = vec![0f64; m * n];
    let mut mag = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let t = x[i * k + p] as f64 * round_to(dtype, w.dense(p, j)) as f64;
                want[i * n + j] += t;
                mag[i * n + j] += t.abs();
            }
            if let Some(b) = bias {
                want[i * n + j] += b[j] as f64;
                mag[i * n + j] += (b[j] as f64).abs();
            }
        }
    }
    (want, mag)
}

/// (M, N, K, G): one row and one word; a ragged last block (72 columns) and three groups; rows
/// past the 8-row tile (9 rows: two grid rows) over 65 words; `K` = 1000 in groups of 8, so the
/// 16 slices (63 inputs each) start and end mid-group; one group spanning `K`; 16 rows.
const SHAPES: [(usize, usize, usize, usize); 6] =
    [(1, 8, 16, 16), (3, 72, 96, 32), (9, 520, 48, 16), (1, 64, 1000, 8), (5, 128, 200, 200), (16, 40, 64, 32)];

#[test]
fn the_gemv_matches_an_f64_reference_at_awkward_shapes() {
    let dev = device();
    let stream = dev.default_stream();
    for (case, &(m, n, k, g)) in SHAPES.iter().enumerate() {
        let w = Quantized::new(n, k, g, 10 + case as u64);
        for (d, dtype) in FLOAT_DTYPES.into_iter().enumerate() {
            let mut rng = Rng::new(100 + case as u64);
            let x = quantize(dtype, &rng.vec(m * k, -1.0, 1.0));
            let biased = (case + d) % 2 == 0;
            let bias = quantize(dtype, &rng.vec(n, -1.0, 1.0));
            let bias_t = tensor(&dev, dtype, &bias, &[n]);
            let out = Tensor::empty(&dev, dtype, &[m, n]).unwrap();
            let x_t = tensor(&dev, dtype, &x, &[m, k]);
            api::awq_gemv_into(&stream, &x_t, &w.weight(), biased.then_some(&bias_t), &out).unwrap();
            let (want, mag) = reference(&w, dtype, &x, biased.then_some(&bias), m);
            let what = format!("awq_gemv {dtype} {m}x{n}x{k} g{g} bias {biased}");
            check_linear(&what, dtype, &out.to_f32_vec().unwrap(), &want, &mag, k);
        }
    }
}

/// Every element is `f16((q − zero) · scale)` converted to the dtype, bit for bit: 33 words
/// (past one 32-word tile), `K` = 80 (two and a half 32-row tiles) in groups of 16.
#[test]
fn dequantization_is_exact() {
    let (n, k, g) = (264, 80, 16);
    let w = Quantized::new(n, k, g, 7);
    for dtype in FLOAT_DTYPES {
        let dense = api::awq_dequantize(&w.weight(), dtype).unwrap();
        assert_eq!(dense.shape(), [n, k]);
        let want: Vec<f32> =
            (0..n).flat_map(|j| (0..k).map(move |p| (j, p))).map(|(j, p)| round_to(dtype, w.dense(p, j))).collect();
        assert_bits(&format!("awq_dequantize {dtype}"), &dense.to_f32_vec().unwrap(), &want);
    }
}

/// Beyond 16 rows, `awq_linear` dequantises into the scratch and runs the dense product: the
/// tensor cores for f16/bf16 (bias in the epilogue), the SIMT GEMM for f32 and for `K` = 36.
#[test]
fn awq_linear_over_many_rows_matches_the_reference() {
    let dev = device();
    let stream = dev.default_stream();
    for (m, n, k, g) in [(40, 72, 64, 32), (17, 48, 36, 12)] {
        let w = Quantized::new(n, k, g, 21);
        for dtype in FLOAT_DTYPES {
            let mut rng = Rng::new(5);
            let x = quantize(dtype, &rng.vec(m * k, -1.0, 1.0));
            let bias = quantize(dtype, &rng.vec(n, -1.0, 1.0));
            let (x_t, bias_t) = (tensor(&dev, dtype, &x, &[m, k]), tensor(&dev, dtype, &bias, &[n]));
            // A scratch larger than the weight: only its first N·K elements are used.
            let scratch = Tensor::empty(&dev, dtype, &[n * k + 5]).unwrap();
            let out = Tensor::empty(&dev, dtype, &[m, n]).unwrap();
            api::awq_linear_into(&stream, &x_t, &w.weight(), Some(&bias_t), &out, Some(&scratch), Strategy::Auto)
                .unwrap();
            let (want, mag) = reference(&w, dtype, &x, Some(&bias), m);
            check_linear(&format!("awq_linear {dtype} {m}x{n}x{k}"), dtype, &out.to_f32_vec().unwrap(), &want, &mag, k);
            let allocating = api::awq_linear(&x_t, &w.weight(), Some(&bias_t)).unwrap();
            assert_bits("awq_linear (allocating)", &allocating.to_f32_vec().unwrap(), &out.to_f32_vec().unwrap());
        }
    }
}

#[test]
fn bad_awq_operands_are_errors_that_name_them() {
    let dev = device();
    let stream = dev.default_stream();
    let w = Quantized::new(16, 32, 16, 3);
    let x = Tensor::zeros(&dev, DType::F16, &[2, 32]).unwrap();
    let out = Tensor::empty(&dev, DType::F16, &[2, 16]).unwrap();
    let err = |r: Result<(), api::OpError>| r.unwrap_err().to_string();
    let as_f32 = api::cast(&w.qweight, DType::F32);
    // qweight as f32 (the cast may itself refuse an int source: then build one directly).
    let f32_words = as_f32.unwrap_or_else(|_| Tensor::zeros(&dev, DType::F32, &[32, 2]).unwrap());
    let bad = AwqWeight { qweight: &f32_words, ..w.weight() };
    assert!(err(api::awq_gemv_into(&stream, &x, &bad, None, &out)).contains("qweight"));
    let scales32 = Tensor::zeros(&dev, DType::F32, &[2, 16]).unwrap();
    let bad = AwqWeight { scales: &scales32, ..w.weight() };
    assert!(err(api::awq_gemv_into(&stream, &x, &bad, None, &out)).contains("scales"));
    let zeros3 = Tensor::zeros(&dev, DType::I32, &[3, 2]).unwrap();
    let bad = AwqWeight { qzeros: &zeros3, ..w.weight() };
    assert!(err(api::awq_gemv_into(&stream, &x, &bad, None, &out)).contains("qzeros"));
    for g in [0, 12] {
        let bad = AwqWeight { group_size: g, ..w.weight() };
        let e = err(api::awq_gemv_into(&stream, &x, &bad, None, &out));
        assert!(e.contains(&format!("group_size {g}")) && e.contains("K = 32"), "{e}");
    }
    // Scales one half past an allocation's start.
    let wide = Tensor::zeros(&dev, DType::F16, &[2 * 16 + 1]).unwrap();
    let shifted = wide.narrow(0, 1, 32).unwrap().reshape(&[2, 16]).unwrap();
    let bad = AwqWeight { scales: &shifted, ..w.weight() };
    assert!(err(api::awq_gemv_into(&stream, &x, &bad, None, &out)).contains("16-byte aligned"));
    let x_bad = Tensor::zeros(&dev, DType::F16, &[2, 30]).unwrap();
    assert!(err(api::awq_gemv_into(&stream, &x_bad, &w.weight(), None, &out)).contains("[M, 32]"));
    let x17 = Tensor::zeros(&dev, DType::F16, &[17, 32]).unwrap();
    let out17 = Tensor::empty(&dev, DType::F16, &[17, 16]).unwrap();
    assert!(err(api::awq_gemv_into(&stream, &x17, &w.weight(), None, &out17)).contains("at most 16"));
    let e = err(api::awq_linear_into(&stream, &x17, &w.weight(), None, &out17, None, Strategy::Auto));
    assert!(e.contains("scratch") && e.contains("512"), "{e}");
    let small = Tensor::empty(&dev, DType::F16, &[100]).unwrap();
    let e = err(api::awq_linear_into(&stream, &x17, &w.weight(), None, &out17, Some(&small), Strategy::Auto));
    assert!(e.contains("scratch") && e.contains("100"), "{e}");
    let bias = Tensor::zeros(&dev, DType::F16, &[15]).unwrap();
    assert!(err(api::awq_gemv_into(&stream, &x, &w.weight(), Some(&bias), &out)).contains("bias"));
    let out32 = Tensor::empty(&dev, DType::F32, &[2, 16]).unwrap();
    assert!(err(api::awq_gemv_into(&stream, &x, &w.weight(), None, &out32)).contains("out"));
    let dense_bad = Tensor::empty(&dev, DType::F16, &[32, 16]).unwrap();
    assert!(err(api::awq_dequantize_into(&stream, &w.weight(), &dense_bad)).contains("out"));
}
