//! Argmax (ties, NaN, signed zeros, vocabulary-sized rows, split or not) and sampling
//! (temperature, top-k, top-p, min-p) against host references: the sampled token is recomputed on the
//! host from the same documented algorithm, thresholds found by sorting instead of a radix
//! select; determinism per seed; greedy limits; a chi-square check of the distribution.

use crate::common::*;
use ruda_ops::api::{self, OpError, SamplingParams};
use ruda_runtime::{DType, Tensor};

fn argmax_reference(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        let b = row[best];
        if !b.is_nan() && (v.is_nan() || v > b) {
            best = i;
        }
    }
    best as u32
}

#[test]
fn argmax_matches_reference_across_sizes_and_splits() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(41);
    for dtype in FLOAT_DTYPES {
        for (rows, cols) in [(1, 1), (3, 17), (2, 1000), (5, 4097), (2, 151_936)] {
            // Few distinct values, so ties are common (the lowest index must win).
            let x: Vec<f32> = rng.vec(rows * cols, -8.0, 8.0).iter().map(|v| (v * 4.0).round() / 4.0).collect();
            let x = quantize(dtype, &x);
            let t = tensor(&dev, dtype, &x, &[rows, cols]);
            let want: Vec<u32> = x.chunks(cols).map(argmax_reference).collect();
            let got = api::argmax(&t).unwrap();
            assert_eq!(got.shape(), &[rows]);
            assert_eq!(got.to_vec::<u32>().unwrap(), want, "argmax {dtype} {rows}x{cols}");
            // Forcing the split (a large workspace) or a single pass gives the same indices.
            let out = Tensor::empty(&dev, DType::U32, &[rows]).unwrap();
            let ws = Tensor::empty(&dev, DType::U64, &[64 * rows]).unwrap();
            for workspace in [Some(&ws), None] {
                api::argmax_into(&stream, &t, &out, workspace).unwrap();
                assert_eq!(
                    out.to_vec::<u32>().unwrap(),
                    want,
                    "argmax {dtype} {rows}x{cols} ws={}",
                    workspace.is_some()
                );
            }
        }
    }
}

#[test]
fn argmax_of_the_largest_vocabulary() {
    let dev = device();
    let cols = 248_320;
    let mut x = Rng::new(42).vec(cols, -1.0, 1.0);
    x[cols - 3] = 2.0;
    x[cols - 1] = 2.0;
    let got = api::argmax(&tensor(&dev, DType::F32, &x, &[1, cols])).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(got, vec![cols as u32 - 3]);
}

#[test]
fn argmax_nan_infinity_and_signed_zero_rules() {
    let dev = device();
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let rows: [[f32; 4]; 6] = [
        [1.0, nan, 5.0, nan],     // first NaN wins
        [inf, 3.0, nan, inf],     // NaN beats +inf
        [-inf, -inf, -inf, -inf], // all -inf: the first
        [-1.0, -0.0, 0.0, -2.0],  // -0 == +0: the first of them
        [inf, 1.0, inf, 0.0],     // ties at +inf: the first
        [-3.0, -1.0, -1.0, -2.0],
    ];
    let want = [1u32, 2, 0, 1, 0, 1];
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    for dtype in FLOAT_DTYPES {
        let got = api::argmax(&tensor(&dev, dtype, &flat, &[6, 4])).unwrap().to_vec::<u32>().unwrap();
        assert_eq!(got, want, "{dtype}");
    }
    // A 1-D input gives one index.
    let got = api::argmax(&tensor(&dev, DType::F32, &[0.0, 3.0, 1.0], &[3])).unwrap();
    assert_eq!((got.shape(), got.to_vec::<u32>().unwrap()), (&[1][..], vec![1]));
}

// ---- sampling -------------------------------------------------------------------------------

/// The documented order key: NaN as -inf, -0 as +0.
fn key(z: f32) -> u32 {
    let z = if z.is_nan() { f32::NEG_INFINITY } else { z } + 0.0;
    let b = z.to_bits();
    if b >= 0x8000_0000 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Everything the host reference computes for one row.
struct Reference {
    token: u32,
    /// Inclusive prefix sums of kept weights (0 for dropped tokens' own contribution).
    prefix: Vec<u64>,
    kept: Vec<bool>,
    target: u64,
}

/// The sampling algorithm of `ruda_ops::kernels::sampling`, with `ex2` as the interpreter
/// computes it (the f64 result rounded to f32) and thresholds found by sorting.
fn sample_reference(row: &[f32], p: &SamplingParams, offset: u64) -> Reference {
    let z: Vec<f32> = row.iter().map(|v| if v.is_nan() { f32::NEG_INFINITY } else { *v }).collect();
    let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let scale = (std::f64::consts::LOG2_E / p.temperature as f64) as f32;
    let e: Vec<f32> = z.iter().map(|&v| if v == m { 1.0 } else { (((v - m) * scale) as f64).exp2() as f32 }).collect();
    let w: Vec<u64> = e.iter().map(|&e| (e * 1_099_511_627_776.0) as u64).collect();
    let keys: Vec<u32> = row.iter().map(|v| key(*v)).collect();
    let n = keys.len();
    let mut sorted = keys.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let k = p.top_k as usize;
    let t_k = if k > 0 && k < n { sorted[k - 1] } else { 0 };
    let mut t = t_k;
    if p.top_p < 1.0 {
        let total: u64 = (0..n).filter(|&i| keys[i] >= t_k).map(|i| w[i]).sum();
        let need = (((total as f64) * (p.top_p as f64)).ceil() as u64).min(total);
        sorted.dedup();
        let mut cum = 0u64;
        for &kv in &sorted {
            cum += (0..n).filter(|&i| keys[i] == kv && kv >= t_k).map(|i| w[i]).sum::<u64>();
            if cum >= need {
                t = kv;
                break;
            }
        }
    }
    // min-p last: `e` is the probability over the largest one's.
    let kept: Vec<bool> = keys.iter().zip(&e).map(|(&kv, &e)| kv >= t && e >= p.min_p).collect();
    let mut prefix = Vec::with_capacity(n);
    let mut s = 0u64;
    for i in 0..n {
        if kept[i] {
            s += w[i];
        }
        prefix.push(s);
    }
    let u = api::sampling_draw(p.seed, offset) as u128;
    let target = ((s as u128 * u) >> 24) as u64;
    let token = prefix.iter().position(|&c| c > target).unwrap() as u32;
    Reference { token, prefix, kept, target }
}

/// On the interpreter the token must match exactly; on a GPU `ex2.approx` may shift weights by
/// an ulp or two, so the token must be kept and its prefix interval must contain the target up
/// to that slack.
fn check_token(what: &str, exact: bool, got: u32, r: &Reference) {
    if exact {
        assert_eq!(got, r.token, "{what}");
        return;
    }
    let g = got as usize;
    assert!(r.kept[g], "{what}: token {got} was filtered out");
    let total = *r.prefix.last().unwrap() as f64;
    let slack = 1e-5 * total;
    let lo = if g == 0 { 0.0 } else { r.prefix[g - 1] as f64 };
    let hi = r.prefix[g] as f64;
    let t = r.target as f64;
    assert!(lo - slack <= t && t < hi + slack, "{what}: token {got} covers [{lo}, {hi}), target {t}");
}

fn offsets(dev: &ruda_runtime::Device, values: &[u64]) -> Tensor {
    Tensor::from_slice(dev, values, &[values.len()]).unwrap()
}

#[test]
fn sampling_matches_the_documented_algorithm() {
    let dev = device();
    let mut rng = Rng::new(43);
    let params = [
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 1, min_p: 0.0 },
        SamplingParams { temperature: 0.7, top_k: 40, top_p: 1.0, seed: 2, min_p: 0.0 },
        SamplingParams { temperature: 1.3, top_k: 0, top_p: 0.9, seed: 3, min_p: 0.0 },
        SamplingParams { temperature: 0.5, top_k: 20, top_p: 0.8, seed: 4, min_p: 0.0 },
        SamplingParams { temperature: 2.0, top_k: 5000, top_p: 0.5, seed: 5, min_p: 0.0 },
        // min-p alone, after top-k, after top-p, and one that keeps only the maximum's ties.
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 6, min_p: 0.05 },
        SamplingParams { temperature: 0.8, top_k: 30, top_p: 1.0, seed: 7, min_p: 0.3 },
        SamplingParams { temperature: 1.5, top_k: 0, top_p: 0.95, seed: 8, min_p: 0.1 },
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 9, min_p: 1.0 },
    ];
    for dtype in FLOAT_DTYPES {
        for cols in [1, 17, 1000, 4097] {
            let rows = 3;
            // Coarse values: ties at the top-k and top-p boundaries happen.
            let x: Vec<f32> = rng.vec(rows * cols, -6.0, 6.0).iter().map(|v| (v * 8.0).round() / 8.0).collect();
            let x = quantize(dtype, &x);
            let t = tensor(&dev, dtype, &x, &[rows, cols]);
            for p in &params {
                let offs: Vec<u64> = (0..rows as u64).map(|r| 1000 * p.seed + r).collect();
                let got = api::sample(&t, p, &offsets(&dev, &offs)).unwrap().to_vec::<u32>().unwrap();
                for (r, row) in x.chunks(cols).enumerate() {
                    let want = sample_reference(row, p, offs[r]);
                    check_token(&format!("{dtype} cols={cols} {p:?} row {r}"), dev.is_cpu(), got[r], &want);
                }
            }
        }
    }
}

#[test]
fn sampling_is_deterministic_per_seed_and_varies_across_seeds() {
    let dev = device();
    let (rows, cols) = (16, 1000);
    let flat = tensor(&dev, DType::F32, &vec![0.5; rows * cols], &[rows, cols]);
    let offs = offsets(&dev, &[7; 16]);
    let run = |seed| {
        let p = SamplingParams { seed, ..SamplingParams::default() };
        api::sample(&flat, &p, &offs).unwrap().to_vec::<u32>().unwrap()
    };
    let (a, b, c) = (run(1), run(1), run(2));
    assert_eq!(a, b, "same seed and offsets, same tokens");
    assert_ne!(a, c, "another seed draws other tokens from a flat distribution");
    // The same offset in every row: every row draws the same uniform, so the same token.
    assert!(a.iter().all(|&t| t == a[0]), "{a:?}");
    // Distinct offsets give distinct draws.
    let p = SamplingParams { seed: 1, ..SamplingParams::default() };
    let spread =
        api::sample(&flat, &p, &offsets(&dev, &(0..16).collect::<Vec<u64>>())).unwrap().to_vec::<u32>().unwrap();
    assert!(spread.iter().any(|&t| t != spread[0]), "{spread:?}");
}

#[test]
fn greedy_limits_pick_the_argmax() {
    let dev = device();
    let mut rng = Rng::new(44);
    let (rows, cols) = (4, 1000);
    for dtype in FLOAT_DTYPES {
        let mut x = quantize(dtype, &rng.vec(rows * cols, -4.0, 4.0));
        // A unique maximum per row (ties at the top would all be kept by top-p and top-k).
        for r in 0..rows {
            x[r * cols + (r * 337) % cols] = 5.0;
        }
        let t = tensor(&dev, dtype, &x, &[rows, cols]);
        let want = api::argmax(&t).unwrap().to_vec::<u32>().unwrap();
        let offs = offsets(&dev, &[1, 2, 3, 4]);
        for p in [
            SamplingParams { temperature: 0.0, seed: 9, ..SamplingParams::default() },
            SamplingParams { top_k: 1, seed: 9, ..SamplingParams::default() },
            // A tiny top-p keeps only the largest logit (the kernel path, not the argmax one).
            SamplingParams { top_p: 1e-6, seed: 9, ..SamplingParams::default() },
            // A near-zero temperature gives the maximum all the mass.
            SamplingParams { temperature: 1e-6, seed: 9, ..SamplingParams::default() },
        ] {
            assert_eq!(api::sample(&t, &p, &offs).unwrap().to_vec::<u32>().unwrap(), want, "{dtype} {p:?}");
        }
    }
}

#[test]
fn nan_and_infinite_logits() {
    let dev = device();
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let rows = [[nan, 0.0, nan, -inf], [0.0, inf, 3.0, inf], [-inf, -inf, 2.0, -inf]];
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    let t = tensor(&dev, DType::F32, &flat, &[3, 4]);
    for seed in 0..8 {
        let p = SamplingParams { seed, ..SamplingParams::default() };
        let got = api::sample(&t, &p, &offsets(&dev, &[seed, seed + 1, seed + 2])).unwrap().to_vec::<u32>().unwrap();
        assert_eq!(got[0], 1, "NaN and -inf logits are never drawn");
        assert!(got[1] == 1 || got[1] == 3, "only the +inf logits are drawn: {got:?}");
        assert_eq!(got[2], 2);
    }
}

/// Pearson's chi-square statistic of `counts` against probabilities `probs`.
fn chi_square(counts: &[u64], probs: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .filter(|(_, p)| **p > 0.0)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            (c as f64 - e) * (c as f64 - e) / e
        })
        .sum()
}

#[test]
fn sampled_frequencies_follow_the_filtered_softmax() {
    let dev = device();
    let logits = [1.0f32, 0.5, 0.0, -0.5, 2.0, -1.0, 0.25, 1.5];
    let rows = 1200;
    let flat: Vec<f32> = logits.iter().copied().cycle().take(rows * logits.len()).collect();
    let t = tensor(&dev, DType::F32, &flat, &[rows, logits.len()]);
    let offs = offsets(&dev, &(0..rows as u64).collect::<Vec<u64>>());
    // (params, expected probabilities): plain softmax at T = 0.8; top-3; top-p 0.7 (the sorted
    // probabilities 2.0, 1.5, 1.0 ... reach 0.7 at the third).
    let softmax = |temp: f64, keep: &dyn Fn(usize) -> bool| -> Vec<f64> {
        let e: Vec<f64> =
            logits.iter().enumerate().map(|(i, &z)| if keep(i) { (z as f64 / temp).exp() } else { 0.0 }).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    };
    let top3 = |i: usize| [4, 7, 0].contains(&i);
    let cases = [
        (SamplingParams { temperature: 0.8, seed: 11, ..SamplingParams::default() }, softmax(0.8, &|_| true)),
        (SamplingParams { top_k: 3, seed: 12, ..SamplingParams::default() }, softmax(1.0, &top3)),
        (SamplingParams { top_p: 0.7, seed: 13, ..SamplingParams::default() }, softmax(1.0, &top3)),
        // min-p 0.3 keeps probabilities of at least 0.3 × the largest's: e^(z - 2) ≥ 0.3, i.e.
        // z ≥ 2 + ln 0.3 ≈ 0.796: the logits 2.0, 1.5 and 1.0 again.
        (SamplingParams { min_p: 0.3, seed: 14, ..SamplingParams::default() }, softmax(1.0, &top3)),
        // After top-p 0.9 (six tokens: 2 down to 0), min-p 0.2 (z ≥ 2 + ln 0.2 ≈ 0.39) keeps four.
        (
            SamplingParams { top_p: 0.9, min_p: 0.2, seed: 15, ..SamplingParams::default() },
            softmax(1.0, &|i| [4, 7, 0, 1].contains(&i)),
        ),
    ];
    let full = softmax(1.0, &|_| true);
    assert!(full[4] + full[7] < 0.7 && full[4] + full[7] + full[0] >= 0.7, "the top-p case keeps three tokens");
    for (p, probs) in cases {
        let got = api::sample(&t, &p, &offs).unwrap().to_vec::<u32>().unwrap();
        let mut counts = vec![0u64; logits.len()];
        for &tok in &got {
            assert!(probs[tok as usize] > 0.0, "{p:?}: token {tok} should have been filtered out");
            counts[tok as usize] += 1;
        }
        // 7 degrees of freedom at most: P(chi² > 30) < 1e-4.
        let chi = chi_square(&counts, &probs);
        assert!(chi < 30.0, "{p:?}: counts {counts:?} vs {probs:?}: chi² = {chi}");
    }
}

#[test]
fn argmax_and_sampling_errors() {
    let dev = device();
    let stream = dev.default_stream();
    let x = tensor(&dev, DType::F32, &[0.0; 6], &[2, 3]);
    let offs = offsets(&dev, &[0, 1]);
    for (p, what) in [
        (SamplingParams { temperature: -1.0, ..SamplingParams::default() }, "temperature"),
        (SamplingParams { temperature: f32::NAN, ..SamplingParams::default() }, "temperature"),
        (SamplingParams { top_p: 0.0, ..SamplingParams::default() }, "top_p"),
        (SamplingParams { top_p: 1.5, ..SamplingParams::default() }, "top_p"),
        (SamplingParams { min_p: -0.1, ..SamplingParams::default() }, "min_p"),
        (SamplingParams { min_p: 1.5, ..SamplingParams::default() }, "min_p"),
        (SamplingParams { min_p: f32::NAN, ..SamplingParams::default() }, "min_p"),
    ] {
        let err = api::sample(&x, &p, &offs).unwrap_err();
        assert!(err.to_string().contains(what), "{err}");
    }
    let p = SamplingParams::default();
    let offs_u32 = Tensor::from_slice(&dev, &[0u32, 1], &[2]).unwrap();
    assert!(matches!(api::sample(&x, &p, &offs_u32), Err(OpError::DType { .. })));
    assert!(matches!(api::sample(&x, &p, &offsets(&dev, &[0])), Err(OpError::Shape { .. })));
    let flat = tensor(&dev, DType::F32, &[0.0; 3], &[3]);
    assert!(matches!(api::sample(&flat, &p, &offsets(&dev, &[0])), Err(OpError::Shape { .. })));
    let out_i32 = Tensor::empty(&dev, DType::I32, &[2]).unwrap();
    assert!(matches!(api::argmax_into(&stream, &x, &out_i32, None), Err(OpError::DType { .. })));
    let ws_f32 = Tensor::empty(&dev, DType::F32, &[8]).unwrap();
    let out = Tensor::empty(&dev, DType::U32, &[2]).unwrap();
    assert!(matches!(api::argmax_into(&stream, &x, &out, Some(&ws_f32)), Err(OpError::DType { .. })));
}

/// Hugging Face's repetition penalty on one row in `dtype`: each distinct id `< V` once, one
/// f32 operation rounded to the dtype.
fn penalty_reference(dtype: DType, row: &mut [f32], ids: &[u32], penalty: f32) {
    let mut done = std::collections::BTreeSet::new();
    for &id in ids {
        let Some(z) = row.get_mut(id as usize) else { continue };
        if done.insert(id) {
            *z = round_to(dtype, if *z < 0.0 { *z * penalty } else { *z / penalty });
        }
    }
}

#[test]
fn repetition_penalty_matches_hugging_face() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(45);
    for dtype in FLOAT_DTYPES {
        // Lists shorter than a tile, across tiles, and with repeats far apart.
        for (rows, vocab, n) in [(1, 1, 1), (3, 17, 40), (2, 1000, 600), (2, 151_936, 300)] {
            let logits = quantize(dtype, &rng.vec(rows * vocab, -10.0, 10.0));
            // Ids from a range smaller than the list (many repeats), some past the vocabulary.
            let ids: Vec<u32> = (0..rows * n)
                .map(|_| {
                    let r = rng.next_u64();
                    if r.is_multiple_of(9) {
                        vocab as u32 + (r >> 40) as u32 % 1000
                    } else {
                        (r >> 32) as u32 % (vocab.min(n / 2 + 1) as u32)
                    }
                })
                .collect();
            for penalty in [1.3, 0.7] {
                let t = tensor(&dev, dtype, &logits, &[rows, vocab]);
                let id_t = Tensor::from_slice(&dev, &ids, &[rows, n]).unwrap();
                api::repetition_penalty_into(&stream, &t, &id_t, penalty).unwrap();
                let mut want = logits.clone();
                for (row, list) in want.chunks_mut(vocab).zip(ids.chunks(n)) {
                    penalty_reference(dtype, row, list, penalty);
                }
                assert_bits(
                    &format!("repetition_penalty {dtype} {rows}x{vocab} n={n} p={penalty}"),
                    &t.to_f32_vec().unwrap(),
                    &want,
                );
            }
        }
    }
}

#[test]
fn repetition_penalty_applies_once_per_distinct_id() {
    let dev = device();
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let logits = [2.0, -2.0, 0.0, -0.0, inf, -inf, nan, 3.0];
    // Every id repeated, 7 three times, and padding past the vocabulary.
    let ids = [0, 1, 2, 3, 4, 5, 6, 0, 1, 7, 7, 7, 8, u32::MAX, 3];
    for dtype in FLOAT_DTYPES {
        let t = tensor(&dev, dtype, &logits, &[8]);
        api::apply_repetition_penalty(&t, &ids, 2.0).unwrap();
        let want = [1.0, -4.0, 0.0, -0.0, inf, -inf, nan, 1.5];
        assert_bits(&format!("penalty once {dtype}"), &t.to_f32_vec().unwrap(), &want);
        // bf16 rounding of the quotient: 1.0078125 / 1.1 is not a bf16.
        let t = tensor(&dev, dtype, &[1.0078125, -1.0078125], &[1, 2]);
        api::apply_repetition_penalty(&t, &[0, 1, 0], 1.1).unwrap();
        let want =
            [round_to(dtype, round_to(dtype, 1.0078125) / 1.1), round_to(dtype, round_to(dtype, -1.0078125) * 1.1)];
        assert_bits(&format!("penalty rounding {dtype}"), &t.to_f32_vec().unwrap(), &want);
        // No ids, or penalty 1: unchanged.
        api::apply_repetition_penalty(&t, &[], 1.5).unwrap();
        api::apply_repetition_penalty(&t, &[0, 1], 1.0).unwrap();
        assert_bits(&format!("penalty no-op {dtype}"), &t.to_f32_vec().unwrap(), &want);
    }
}

#[test]
fn repetition_penalty_errors() {
    let dev = device();
    let stream = dev.default_stream();
    let logits = tensor(&dev, DType::BF16, &[1.0; 6], &[2, 3]);
    let ids = Tensor::from_slice(&dev, &[0u32, 1, 2, 0], &[2, 2]).unwrap();
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let err = api::repetition_penalty_into(&stream, &logits, &ids, bad).unwrap_err();
        assert!(matches!(err, OpError::InvalidArgument { .. }) && err.to_string().contains("penalty"), "{err}");
        assert!(matches!(
            api::apply_repetition_penalty(&logits.narrow(0, 0, 1).unwrap(), &[0], bad),
            Err(OpError::InvalidArgument { .. })
        ));
    }
    let ids_i32 = Tensor::from_slice(&dev, &[0i32; 4], &[2, 2]).unwrap();
    assert!(matches!(api::repetition_penalty_into(&stream, &logits, &ids_i32, 1.2), Err(OpError::DType { .. })));
    let ids_rows = Tensor::from_slice(&dev, &[0u32; 3], &[3, 1]).unwrap();
    let err = api::repetition_penalty_into(&stream, &logits, &ids_rows, 1.2).unwrap_err();
    assert!(matches!(err, OpError::Shape { .. }) && err.to_string().contains("token_ids"), "{err}");
    let ids_1d = Tensor::from_slice(&dev, &[0u32; 2], &[2]).unwrap();
    assert!(matches!(api::repetition_penalty_into(&stream, &logits, &ids_1d, 1.2), Err(OpError::Shape { .. })));
    let logits_3d = tensor(&dev, DType::F32, &[1.0; 6], &[1, 2, 3]);
    assert!(matches!(api::repetition_penalty_into(&stream, &logits_3d, &ids, 1.2), Err(OpError::Shape { .. })));
    let int_logits = Tensor::from_slice(&dev, &[0u32; 6], &[2, 3]).unwrap();
    assert!(matches!(api::repetition_penalty_into(&stream, &int_logits, &ids, 1.2), Err(OpError::DType { .. })));
    // The single-row helper wants one row.
    let err = api::apply_repetition_penalty(&logits, &[0], 1.2).unwrap_err();
    assert!(matches!(err, OpError::Shape { .. }) && err.to_string().contains("one row"), "{err}");
}
