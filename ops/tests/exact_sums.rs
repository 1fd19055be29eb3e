//! Exact cases for the matrix products and attention: inputs whose f32 sums are exact, so the
//! result must equal the exact result rounded once to the output dtype, bit for bit.
//!
//! The tolerance tests elsewhere bound the error by `k · ε · Σ|xw|`; at `k = 4096` that bound is
//! about 0.5 while one product of inputs in [-1, 1) averages 0.25, so a kernel that drops a k
//! term (a tail tile, a split, one lane's chunk) passes them. Here inputs are small integers
//! (−3..=3, exact in every float dtype): every partial sum is an integer below 2^24, exact in
//! f32 in any order, so any dropped, doubled or misplaced term changes the result.
//!
//! Attention gets the same idea through scores that are exact in f32: a query that is zero gives
//! equal scores, so the output is the exact mean of the values (key counts that are powers of
//! two); a query that matches one key by a margin of hundreds gives weights of exactly 1 and 0,
//! so the output is that key's value row, exactly.

use crate::common::*;
use ruda_ops::api::{self, AttentionOptions, AttentionStrategy, GemmTile};
use ruda_runtime::{DType, Tensor};

/// Integers in −3..=3.
fn small_ints(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| (rng.next_u64() % 7) as f32 - 3.0).collect()
}

/// `x[m, k] · w[n, k]ᵀ` exactly (f64 holds every such sum exactly).
fn exact_linear(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| x[i * k + p] as f64 * w[j * k + p] as f64).sum();
        }
    }
    out
}

/// The bits of `want` rounded once to `dtype`, beside the bits `got` holds.
fn assert_bits_equal(what: &str, dtype: DType, got: &Tensor, want: &[f64]) {
    let got = got.to_f32_vec().expect("readback");
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let w = round_to(dtype, *w as f32);
        assert!(
            g.to_bits() == w.to_bits(),
            "{what}: element {i} is {g}, the exact result rounded to {dtype} is {w} (a term dropped, doubled or misplaced)"
        );
    }
}

#[test]
fn simt_gemm_sums_exactly() {
    let dev = device();
    let mut rng = Rng::new(11);
    // `matmul` is always the SIMT GEMM; `linear` takes it for f32 (no tensor cores) and M > 16.
    for dtype in FLOAT_DTYPES {
        let (m, n, k) = (19, 37, 1029);
        let a = small_ints(&mut rng, m * k);
        let b = small_ints(&mut rng, k * n);
        // b[k, n] as w[n, k] for the reference.
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let want = exact_linear(&a, &bt, m, n, k);
        let out = api::matmul(&tensor(&dev, dtype, &a, &[m, k]), &tensor(&dev, dtype, &b, &[k, n])).unwrap();
        assert_bits_equal(&format!("matmul {dtype} {m}x{n}x{k}"), dtype, &out, &want);
    }
    let (m, n, k) = (21, 33, 1031);
    let x = small_ints(&mut rng, m * k);
    let w = small_ints(&mut rng, n * k);
    let out = api::linear(&tensor(&dev, DType::F32, &x, &[m, k]), &tensor(&dev, DType::F32, &w, &[n, k])).unwrap();
    assert_bits_equal("linear f32 (SIMT, transposed b)", DType::F32, &out, &exact_linear(&x, &w, m, n, k));
}

#[test]
fn every_tensor_core_tile_sums_exactly() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(12);
    // Not a multiple of any tile in m or n; k spans several 32-wide stages plus a tail of 8.
    let (m, n, k) = (45, 70, 520);
    for dtype in [DType::BF16, DType::F16] {
        let x = small_ints(&mut rng, m * k);
        let w = small_ints(&mut rng, n * k);
        let want = exact_linear(&x, &w, m, n, k);
        let (xt, wt) = (tensor(&dev, dtype, &x, &[m, k]), tensor(&dev, dtype, &w, &[n, k]));
        for tile in GemmTile::all() {
            for out_dtype in [dtype, DType::F32] {
                let out = Tensor::empty(&dev, out_dtype, &[m, n]).unwrap();
                api::linear_tile_into(&stream, &xt, &wt, None, None, &out, tile).unwrap();
                assert_bits_equal(&format!("{} {dtype} → {out_dtype}", tile.name()), out_dtype, &out, &want);
            }
        }
    }
}

#[test]
fn gemv_and_split_k_sum_exactly() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(13);
    // Vector loads (k a multiple of 8) and element loads (k odd); 1, 3 and 16 rows.
    for (m, n, k) in [(1, 37, 4096), (3, 29, 2056), (16, 17, 1001)] {
        for dtype in FLOAT_DTYPES {
            let x = small_ints(&mut rng, m * k);
            let w = small_ints(&mut rng, n * k);
            let want = exact_linear(&x, &w, m, n, k);
            let (xt, wt) = (tensor(&dev, dtype, &x, &[m, k]), tensor(&dev, dtype, &w, &[n, k]));
            for splits in [1, 2, 3, 8] {
                let out = Tensor::empty(&dev, dtype, &[m, n]).unwrap();
                let ws = Tensor::empty(&dev, DType::F32, &[splits * m * n]).unwrap();
                api::gemv_split_k_into(&stream, &xt, &wt, &out, &ws, splits).unwrap();
                assert_bits_equal(&format!("gemv {dtype} {m}x{n}x{k} splits={splits}"), dtype, &out, &want);
            }
        }
    }
}

/// A bias joins the f32 sum before the one rounding (cuBLAS's epilogue, transformers' addmm) on
/// every path a biased `linear` takes without the tensor cores: the GEMV (M ≤ 16) and the SIMT
/// GEMM (K odd), through `linear_bias_into` and the allocating `linear_bias`. Integers in
/// −40..=40 (−15..=15 at K = 1001) make sums past every half dtype's integer range, and quarter biases make the sum
/// exact in f32: the result must be that sum rounded once, and the data are checked to
/// distinguish it from the product rounded first and then the bias added.
#[test]
fn a_bias_joins_the_sum_before_the_one_rounding() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(15);
    let ints = |rng: &mut Rng, n: usize, range: u64| {
        (0..n).map(|_| (rng.next_u64() % (2 * range + 1)) as f32 - range as f32).collect::<Vec<_>>()
    };
    for dtype in FLOAT_DTYPES {
        for (m, n, k) in [(37, 70, 33), (5, 70, 33), (17, 9, 1001)] {
            // Sums past f16's integers (2048) yet within its range (65504) at either depth.
            let range = if k < 100 { 40 } else { 15 };
            let (x, w) = (ints(&mut rng, m * k, range), ints(&mut rng, n * k, range));
            let bias: Vec<f32> = ints(&mut rng, n, 31).iter().map(|b| b / 4.0).collect();
            let sums = exact_linear(&x, &w, m, n, k);
            let want: Vec<f64> = sums.iter().enumerate().map(|(i, s)| s + bias[i % n] as f64).collect();
            if dtype != DType::F32 {
                let twice = sums.iter().enumerate().filter(|&(i, s)| {
                    let product = round_to(dtype, *s as f32);
                    round_to(dtype, product + bias[i % n]) != round_to(dtype, want[i] as f32)
                });
                assert!(twice.count() > 0, "{dtype} {m}x{n}x{k}: the data do not tell one rounding from two");
            }
            let (xt, wt, bt) =
                (tensor(&dev, dtype, &x, &[m, k]), tensor(&dev, dtype, &w, &[n, k]), tensor(&dev, dtype, &bias, &[n]));
            let out = Tensor::empty(&dev, dtype, &[m, n]).unwrap();
            api::linear_bias_into(&stream, &xt, &wt, Some(&bt), None, &out).unwrap();
            assert_bits_equal(&format!("linear_bias_into {dtype} {m}x{n}x{k}"), dtype, &out, &want);
            let out = api::linear_bias(&xt, &wt, Some(&bt), None).unwrap();
            assert_bits_equal(&format!("linear_bias {dtype} {m}x{n}x{k}"), dtype, &out, &want);
        }
    }
}

/// `[1, heads, len, d]` of small integers.
fn ints_tensor(rng: &mut Rng, dev: &ruda_runtime::Device, dtype: DType, shape: &[usize]) -> (Vec<f32>, Tensor) {
    let xs = small_ints(rng, shape.iter().product());
    let t = tensor(dev, dtype, &xs, shape);
    (xs, t)
}

#[test]
fn attention_with_equal_scores_is_the_exact_mean() {
    let dev = device();
    let mut rng = Rng::new(14);
    // A zero query scores every key 0: the weights are exactly 1/S, and with S a power of two
    // the mean of integer values is exact in f32 whatever the order of the sums.
    let (hq, hkv, t, d) = (4, 2, 5, 64);
    for dtype in FLOAT_DTYPES {
        for s in [64, 256] {
            let q = tensor(&dev, dtype, &vec![0.0; hq * t * d], &[1, hq, t, d]);
            let (_, k) = ints_tensor(&mut rng, &dev, dtype, &[1, hkv, s, d]);
            let (v, vt) = ints_tensor(&mut rng, &dev, dtype, &[1, hkv, s, d]);
            let mut want = vec![0.0; hq * t * d];
            for h in 0..hq {
                let g = h / (hq / hkv);
                for i in 0..t {
                    for e in 0..d {
                        let sum: f64 = (0..s).map(|j| v[(g * s + j) * d + e] as f64).sum();
                        want[(h * t + i) * d + e] = sum / s as f64;
                    }
                }
            }
            for strategy in [AttentionStrategy::FlashUnit, AttentionStrategy::Fallback] {
                let out = api::attention(&q, &k, &vt, None, None, &AttentionOptions::default(), strategy).unwrap();
                assert_bits_equal(&format!("attention {strategy:?} {dtype} S={s} (mean)"), dtype, &out, &want);
            }
        }
    }
}

/// Queries and keys that select one key per query by a margin of `16 · 16 = 256` in the score:
/// `q[h, i]` is 16 at dimension `i`, key `j` is 16 at dimension `target(j)` and 0 elsewhere.
/// `exp(-256)` is 0 in f32, so the softmax weights are exactly one 1 and zeros.
fn one_hot_problem(d: usize, t: usize, s: usize, hq: usize, hkv: usize) -> (Vec<f32>, Vec<f32>, Vec<usize>) {
    let mut q = vec![0.0; hq * t * d];
    for h in 0..hq {
        for i in 0..t {
            q[(h * t + i) * d + i] = 16.0;
        }
    }
    // Query i picks key picks[i]: spread over the keys, the last one included.
    let picks: Vec<usize> = (0..t).map(|i| (i * 7 + s - 1) % s).collect();
    let mut k = vec![0.0; hkv * s * d];
    for g in 0..hkv {
        for (i, &j) in picks.iter().enumerate() {
            k[(g * s + j) * d + i] = 16.0;
        }
    }
    (q, k, picks)
}

#[test]
fn attention_that_selects_one_key_returns_its_value_exactly() {
    let dev = device();
    let mut rng = Rng::new(15);
    let (hq, hkv, t, s, d) = (3, 1, 6, 77, 64);
    let (q, k, picks) = one_hot_problem(d, t, s, hq, hkv);
    let options = AttentionOptions { causal: false, scale: Some(1.0) };
    for dtype in FLOAT_DTYPES {
        let (v, vt) = ints_tensor(&mut rng, &dev, dtype, &[1, hkv, s, d]);
        let mut want = vec![0.0; hq * t * d];
        for h in 0..hq {
            for (i, &j) in picks.iter().enumerate() {
                for e in 0..d {
                    want[(h * t + i) * d + e] = v[j * d + e] as f64;
                }
            }
        }
        let (qt, kt) = (tensor(&dev, dtype, &q, &[1, hq, t, d]), tensor(&dev, dtype, &k, &[1, hkv, s, d]));
        for strategy in [AttentionStrategy::FlashUnit, AttentionStrategy::Fallback] {
            let out = api::attention(&qt, &kt, &vt, None, None, &options, strategy).unwrap();
            assert_bits_equal(&format!("attention {strategy:?} {dtype} (one key per query)"), dtype, &out, &want);
        }
    }
}

#[test]
fn split_kv_decode_that_selects_one_key_returns_its_value_exactly() {
    let dev = device();
    let mut rng = Rng::new(16);
    // Two sequences, query heads 0..4 over 2 KV heads; each query head h of sequence b picks one
    // key among the first seq_lens[b] of a 300-key cache (several splits). The keys past a
    // sequence's length score twice as high as its pick, so reading past the length shows too.
    let (batch, hq, hkv, s_max, d) = (2, 4, 2, 300, 64);
    let seq_lens = [300usize, 131];
    for dtype in FLOAT_DTYPES {
        let mut q = vec![0.0; batch * hq * d];
        let mut k = vec![0.0; batch * hkv * s_max * d];
        let mut want = vec![0.0; batch * hq * d];
        let (v, vt) = ints_tensor(&mut rng, &dev, dtype, &[batch, hkv, s_max, d]);
        for b in 0..batch {
            for g in 0..hkv {
                for j in seq_lens[b]..s_max {
                    k[((b * hkv + g) * s_max + j) * d..][..hq].fill(32.0);
                }
            }
            for h in 0..hq {
                let g = h / (hq / hkv);
                let pick = (h * 53 + b * 17 + seq_lens[b] - 1) % seq_lens[b];
                q[(b * hq + h) * d + h] = 16.0;
                k[((b * hkv + g) * s_max + pick) * d + h] = 16.0;
                for e in 0..d {
                    want[(b * hq + h) * d + e] = v[((b * hkv + g) * s_max + pick) * d + e] as f64;
                }
            }
        }
        let qt = tensor(&dev, dtype, &q, &[batch, hq, d]);
        let kt = tensor(&dev, dtype, &k, &[batch, hkv, s_max, d]);
        let lens = Tensor::from_slice(&dev, &seq_lens.map(|l| l as u32), &[batch]).unwrap();
        let out = api::attention_decode(&qt, &kt, &vt, &lens, Some(1.0)).unwrap();
        assert_bits_equal(&format!("attention_decode {dtype} (one key per query)"), dtype, &out, &want);
    }
}
