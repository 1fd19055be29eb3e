//! The ops around Qwen3.5's gated delta rule (causal conv1d prefill and decode, the gates, the
//! L2 / zero-centred / gated norms, the attention output gate and the head split) against plain
//! f64 references written here, at awkward shapes (1, 7 and 65 tokens; channel counts that are
//! not multiples of 32; head dims 48 and 100, and hidden-sized rows), in f32, f16 and bf16;
//! conv1d prefill in segments and followed by decode steps equals one pass over the whole; and
//! every invalid argument is an error.
//!
//! Tolerances, written beside each check: `f32` sums of `n` terms are held to `n` units of
//! `f32` rounding times the sum of magnitudes, plus one unit of the output dtype for the final
//! rounding.

use crate::common::*;
use ruda_ops::api::{self, OpError};
use ruda_runtime::{DType, Device, Tensor};

const TOKENS: [usize; 3] = [1, 7, 65];
const EPS32: f64 = f32::EPSILON as f64;

/// Below f16's normal range its values are 2^-24 apart: the absolute part of a tolerance there.
fn subnormal_step(dtype: DType) -> f64 {
    if dtype == DType::F16 {
        2f64.powi(-24)
    } else {
        1e-30
    }
}

fn silu64(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// `u[s, ch]` of the kernel's contract: `x` `[T, C]` preceded by `init` `[C, W - 1]` (zeros
/// without one).
fn conv_input(x: &[f32], init: Option<&[f32]>, c: usize, keep: usize, s: isize, ch: usize) -> f64 {
    if s >= 0 {
        x[s as usize * c + ch] as f64
    } else {
        init.map_or(0.0, |st| st[ch * keep + (keep as isize + s) as usize] as f64)
    }
}

/// `(y, |Σ| of the products, final_state)` of the causal depthwise conv1d, in f64.
fn conv_reference(
    x: &[f32],
    weight: &[f32],
    init: Option<&[f32]>,
    silu: bool,
    t: usize,
    c: usize,
    w: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f32>) {
    let keep = w - 1;
    let u = |s: isize, ch: usize| conv_input(x, init, c, keep, s, ch);
    let (mut y, mut mag) = (vec![0.0; t * c], vec![0.0; t * c]);
    for tt in 0..t {
        for ch in 0..c {
            let (mut acc, mut m) = (0.0, 0.0);
            for k in 0..w {
                let p = weight[ch * w + k] as f64 * u(tt as isize - keep as isize + k as isize, ch);
                acc += p;
                m += p.abs();
            }
            y[tt * c + ch] = if silu { silu64(acc) } else { acc };
            mag[tt * c + ch] = m;
        }
    }
    let mut fin = vec![0.0; c * keep];
    for ch in 0..c {
        for i in 0..keep {
            fin[ch * keep + i] = u(t as isize - keep as isize + i as isize, ch) as f32;
        }
    }
    (y, mag, fin)
}

/// `W` fma steps in f32 (each within one unit of the running magnitude), SiLU's few roundings,
/// then one rounding to the dtype.
fn check_conv(what: &str, dtype: DType, got: &[f32], want: &[f64], mag: &[f64], w: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for i in 0..got.len() {
        let tol = (w as f64 + 4.0) * EPS32 * (mag[i] + want[i].abs())
            + epsilon(dtype) * want[i].abs()
            + subnormal_step(dtype);
        let err = (got[i] as f64 - want[i]).abs();
        assert!(err <= tol, "{what}[{i}]: got {}, want {} (error {err:.3e} > {tol:.3e})", got[i], want[i]);
    }
}

#[test]
fn causal_conv1d_matches_reference() {
    let dev = device();
    let mut rng = Rng::new(351);
    for dtype in FLOAT_DTYPES {
        for w in [2, 3, 4] {
            for (ti, t) in TOKENS.into_iter().enumerate() {
                // Channel counts that are not multiples of 32, one past a block of 128 threads.
                let c = [37, 130, 45][ti];
                for silu in [true, false] {
                    for with_init in [false, true] {
                        let x = quantize(dtype, &rng.vec(t * c, -2.0, 2.0));
                        let weight = quantize(dtype, &rng.vec(c * w, -1.0, 1.0));
                        let init = quantize(dtype, &rng.vec(c * (w - 1), -2.0, 2.0));
                        let init_t = tensor(&dev, dtype, &init, &[c, w - 1]);
                        let (y, fin) = api::causal_conv1d(
                            &tensor(&dev, dtype, &x, &[t, c]),
                            &tensor(&dev, dtype, &weight, &[c, w]),
                            with_init.then_some(&init_t),
                            silu,
                        )
                        .unwrap();
                        assert_eq!((y.shape(), fin.shape(), y.dtype()), (&[t, c][..], &[c, w - 1][..], dtype));
                        let init_ref = with_init.then_some(&init[..]);
                        let (want, mag, want_fin) = conv_reference(&x, &weight, init_ref, silu, t, c, w);
                        let what = format!("causal_conv1d {dtype} W={w} T={t} C={c} silu={silu} init={with_init}");
                        check_conv(&what, dtype, &y.to_f32_vec().unwrap(), &want, &mag, w);
                        // The final state is a copy of inputs: exact.
                        assert_bits(&format!("{what} final_state"), &fin.to_f32_vec().unwrap(), &want_fin);
                    }
                }
            }
        }
    }
}

/// Hugging Face's `[C, 1, W]` weight is accepted as it is.
#[test]
fn causal_conv1d_takes_hugging_face_weight_layout() {
    let dev = device();
    let mut rng = Rng::new(352);
    let (t, c, w) = (7, 33, 4);
    let x = tensor(&dev, DType::F32, &rng.vec(t * c, -2.0, 2.0), &[t, c]);
    let wv = rng.vec(c * w, -1.0, 1.0);
    let (a, sa) = api::causal_conv1d(&x, &tensor(&dev, DType::F32, &wv, &[c, w]), None, true).unwrap();
    let (b, sb) = api::causal_conv1d(&x, &tensor(&dev, DType::F32, &wv, &[c, 1, w]), None, true).unwrap();
    assert_bits("[C, 1, W] weight", &b.to_f32_vec().unwrap(), &a.to_f32_vec().unwrap());
    assert_bits("[C, 1, W] weight state", &sb.to_f32_vec().unwrap(), &sa.to_f32_vec().unwrap());
}

fn rows(x: &[f32], c: usize, range: std::ops::Range<usize>) -> Vec<f32> {
    x[range.start * c..range.end * c].to_vec()
}

/// Prefill in two segments (the first's final state the second's initial state), and prefill
/// followed by decode steps, give the bits of one prefill over the whole sequence.
#[test]
fn conv1d_segments_and_decode_equal_the_whole() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(353);
    for dtype in FLOAT_DTYPES {
        for w in [2, 4] {
            let (t, c) = (65, 45);
            let x = quantize(dtype, &rng.vec(t * c, -2.0, 2.0));
            let weight = tensor(&dev, dtype, &quantize(dtype, &rng.vec(c * w, -1.0, 1.0)), &[c, w]);
            let init = tensor(&dev, dtype, &quantize(dtype, &rng.vec(c * (w - 1), -2.0, 2.0)), &[c, w - 1]);
            for with_init in [false, true] {
                let init = with_init.then_some(&init);
                let (whole, whole_state) =
                    api::causal_conv1d(&tensor(&dev, dtype, &x, &[t, c]), &weight, init, true).unwrap();
                let whole = whole.to_f32_vec().unwrap();
                let whole_state = whole_state.to_f32_vec().unwrap();
                // Splits shorter than the state (1, 2), at a chunk boundary (32) and off it (33).
                for split in [1, 2, 32, 33, 64] {
                    let what = format!("{dtype} W={w} init={with_init} split at {split}");
                    let first = tensor(&dev, dtype, &rows(&x, c, 0..split), &[split, c]);
                    let second = tensor(&dev, dtype, &rows(&x, c, split..t), &[t - split, c]);
                    let (y1, s1) = api::causal_conv1d(&first, &weight, init, true).unwrap();
                    let (y2, s2) = api::causal_conv1d(&second, &weight, Some(&s1), true).unwrap();
                    let mut got = y1.to_f32_vec().unwrap();
                    got.extend(y2.to_f32_vec().unwrap());
                    assert_bits(&format!("two segments {what}"), &got, &whole);
                    assert_bits(&format!("two segments {what} state"), &s2.to_f32_vec().unwrap(), &whole_state);
                }
                // Prefill 60 tokens, then decode 5, allocating and in place.
                let prefill = tensor(&dev, dtype, &rows(&x, c, 0..60), &[60, c]);
                let (_, mut state) = api::causal_conv1d(&prefill, &weight, init, true).unwrap();
                let y_into = Tensor::empty(&dev, dtype, &[1, c]).unwrap();
                for step in 60..t {
                    let xt = tensor(&dev, dtype, &rows(&x, c, step..step + 1), &[1, c]);
                    let y = if step % 2 == 0 {
                        api::causal_conv1d_update(&xt, &weight, &mut state, true).unwrap()
                    } else {
                        api::causal_conv1d_update_into(&stream, &xt, &weight, &state, true, &y_into).unwrap();
                        y_into.clone()
                    };
                    let what = format!("decode {dtype} W={w} init={with_init} token {step}");
                    assert_bits(&what, &y.to_f32_vec().unwrap(), &rows(&whole, c, step..step + 1));
                }
                let what = format!("decode {dtype} W={w} init={with_init} state");
                assert_bits(&what, &state.to_f32_vec().unwrap(), &whole_state);
            }
        }
    }
}

/// The decode step against the reference directly, without SiLU and with it.
#[test]
fn causal_conv1d_update_matches_reference() {
    let dev = device();
    let mut rng = Rng::new(354);
    for dtype in FLOAT_DTYPES {
        for w in [2, 3, 4] {
            for silu in [false, true] {
                let c = 130;
                let x = quantize(dtype, &rng.vec(c, -2.0, 2.0));
                let weight = quantize(dtype, &rng.vec(c * w, -1.0, 1.0));
                let st = quantize(dtype, &rng.vec(c * (w - 1), -2.0, 2.0));
                let mut state = tensor(&dev, dtype, &st, &[c, w - 1]);
                let y = api::causal_conv1d_update(
                    &tensor(&dev, dtype, &x, &[1, c]),
                    &tensor(&dev, dtype, &weight, &[c, w]),
                    &mut state,
                    silu,
                )
                .unwrap();
                let (want, mag, want_state) = conv_reference(&x, &weight, Some(&st), silu, 1, c, w);
                let what = format!("causal_conv1d_update {dtype} W={w} silu={silu}");
                check_conv(&what, dtype, &y.to_f32_vec().unwrap(), &want, &mag, w);
                assert_bits(&format!("{what} state"), &state.to_f32_vec().unwrap(), &want_state);
            }
        }
    }
}

/// The batched decode step over a pool of states equals each sequence's own decode step; the
/// slots no sequence names are untouched; a slot out of range gives a NaN row and writes no
/// state.
#[test]
fn causal_conv1d_update_slots_equals_one_sequence_at_a_time() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(360);
    for dtype in FLOAT_DTYPES {
        for w in [2, 4] {
            let (c, slots, keep) = (45, 5, w - 1);
            let weight = tensor(&dev, dtype, &quantize(dtype, &rng.vec(c * w, -1.0, 1.0)), &[c, w]);
            let pool = quantize(dtype, &rng.vec(slots * c * keep, -2.0, 2.0));
            let seq_slots = [3u32, 0, 7, 4];
            let n = seq_slots.len();
            let x = quantize(dtype, &rng.vec(n * c, -2.0, 2.0));
            let mut states = tensor(&dev, dtype, &pool, &[slots, c, keep]);
            let slot_t = Tensor::from_slice(&dev, &seq_slots, &[n]).unwrap();
            let y =
                api::causal_conv1d_update_slots(&tensor(&dev, dtype, &x, &[n, c]), &weight, &mut states, &slot_t, true)
                    .unwrap()
                    .to_f32_vec()
                    .unwrap();
            let got_states = states.to_f32_vec().unwrap();
            let mut want_states = pool.clone();
            let what = format!("causal_conv1d_update_slots {dtype} W={w}");
            for (i, &slot) in seq_slots.iter().enumerate() {
                let row = &y[i * c..(i + 1) * c];
                if slot as usize >= slots {
                    assert!(row.iter().all(|v| v.is_nan()), "{what}: sequence {i} (slot {slot} out of range) not NaN");
                    continue;
                }
                let range = slot as usize * c * keep..(slot as usize + 1) * c * keep;
                let mut one = tensor(&dev, dtype, &pool[range.clone()], &[c, keep]);
                let xt = tensor(&dev, dtype, &x[i * c..(i + 1) * c], &[1, c]);
                let want = api::causal_conv1d_update(&xt, &weight, &mut one, true).unwrap();
                assert_bits(&format!("{what} sequence {i}"), row, &want.to_f32_vec().unwrap());
                want_states.splice(range, one.to_f32_vec().unwrap());
            }
            assert_bits(&format!("{what} states"), &got_states, &want_states);
            // The _into form, with the slots that remain.
            let y_into = Tensor::empty(&dev, dtype, &[n, c]).unwrap();
            let xt = tensor(&dev, dtype, &x, &[n, c]);
            api::causal_conv1d_update_slots_into(&stream, &xt, &weight, &states, &slot_t, false, &y_into).unwrap();
            assert!(y_into.to_f32_vec().unwrap()[..c].iter().all(|v| v.is_finite()), "{what} into");
        }
    }
}

/// Packed sequences (one empty, some shorter than the state, some across chunks) over a pool
/// of states equal each sequence's own prefill from its slot, bit for bit; the pool ends with
/// each sequence's final state and untouched elsewhere; a slot out of range starts from zeros
/// and is not written.
#[test]
fn causal_conv1d_varlen_equals_one_sequence_at_a_time() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(362);
    for dtype in FLOAT_DTYPES {
        for w in [2, 4] {
            let (c, slots, keep) = (37, 9, w - 1);
            let lens = [2usize, 0, 40, 1, 33, 7, 5];
            let seq_slots = [5u32, 0, 2, 7, 1, 99, 3];
            let total: usize = lens.iter().sum();
            let mut cu = vec![0u32];
            for l in lens {
                cu.push(cu.last().unwrap() + l as u32);
            }
            let weight = tensor(&dev, dtype, &quantize(dtype, &rng.vec(c * w, -1.0, 1.0)), &[c, w]);
            let pool = quantize(dtype, &rng.vec(slots * c * keep, -2.0, 2.0));
            let x = quantize(dtype, &rng.vec(total * c, -2.0, 2.0));
            let mut states = tensor(&dev, dtype, &pool, &[slots, c, keep]);
            let cu_t = Tensor::from_slice(&dev, &cu, &[lens.len() + 1]).unwrap();
            let slot_t = Tensor::from_slice(&dev, &seq_slots, &[lens.len()]).unwrap();
            let xt = tensor(&dev, dtype, &x, &[total, c]);
            let y = api::causal_conv1d_varlen(&xt, &weight, &cu_t, &mut states, &slot_t, true).unwrap();
            let (y, got_states) = (y.to_f32_vec().unwrap(), states.to_f32_vec().unwrap());
            let mut want_states = pool.clone();
            let what = format!("causal_conv1d_varlen {dtype} W={w}");
            for (i, (&len, &slot)) in lens.iter().zip(&seq_slots).enumerate() {
                if len == 0 {
                    continue;
                }
                let (start, end) = (cu[i] as usize, cu[i + 1] as usize);
                let xs = tensor(&dev, dtype, &rows(&x, c, start..end), &[len, c]);
                let in_pool = (slot as usize) < slots;
                let range = slot as usize * c * keep..(slot as usize + 1) * c * keep;
                let init = in_pool.then(|| tensor(&dev, dtype, &pool[range.clone()], &[c, keep]));
                let (want, fin) = api::causal_conv1d(&xs, &weight, init.as_ref(), true).unwrap();
                assert_bits(&format!("{what} sequence {i}"), &rows(&y, c, start..end), &want.to_f32_vec().unwrap());
                if in_pool {
                    want_states.splice(range, fin.to_f32_vec().unwrap());
                }
            }
            assert_bits(&format!("{what} states"), &got_states, &want_states);
            // The _into form without SiLU runs too (the states move on again).
            let y_into = Tensor::empty(&dev, dtype, &[total, c]).unwrap();
            api::causal_conv1d_varlen_into(&stream, &xt, &weight, &cu_t, &states, &slot_t, false, &y_into).unwrap();
            assert!(y_into.to_f32_vec().unwrap().iter().all(|v| v.is_finite()), "{what} into");
        }
    }
}

/// torch's `softplus` (threshold 20) in f64.
fn softplus64(v: f64) -> f64 {
    if v > 20.0 {
        v
    } else {
        v.exp().ln_1p()
    }
}

#[test]
fn gated_delta_gates_match_reference() {
    let dev = device();
    let mut rng = Rng::new(355);
    for dtype in FLOAT_DTYPES {
        for params in [DType::F32, dtype] {
            for (t, hv) in [(1, 48), (7, 5), (65, 48)] {
                let n = t * hv;
                let mut a = rng.vec(n, -30.0, 30.0);
                // Both sides of the threshold and the far negative tail, whatever the bias.
                a[0] = 40.0;
                a[n - 1] = -60.0;
                let a = quantize(dtype, &a);
                let b = quantize(dtype, &rng.vec(n, -12.0, 12.0));
                let a_log: Vec<f32> = (0..hv).map(|_| rng.uniform(0.01, 16.0).ln()).collect();
                let a_log = quantize(params, &a_log);
                let dt_bias = quantize(params, &rng.vec(hv, -1.0, 1.0));
                let (beta, g) = api::gated_delta_gates(
                    &tensor(&dev, dtype, &a, &[t, hv]),
                    &tensor(&dev, dtype, &b, &[t, hv]),
                    &tensor(&dev, params, &a_log, &[hv]),
                    &tensor(&dev, params, &dt_bias, &[hv]),
                )
                .unwrap();
                assert_eq!((beta.dtype(), g.dtype(), g.shape()), (DType::F32, DType::F32, &[t, hv][..]));
                let want_beta: Vec<f64> = b.iter().map(|v| 1.0 / (1.0 + (-(*v as f64)).exp())).collect();
                // The sum a + dt_bias is rounded to f32 as in the kernel (and torch), so the
                // threshold sees the same value.
                let want_g: Vec<f64> = (0..n)
                    .map(|i| {
                        let v = (a[i] + dt_bias[i % hv]) as f64;
                        -(a_log[i % hv] as f64).exp() * softplus64(v)
                    })
                    .collect();
                let what = format!("gates {dtype} params {params} T={t} Hv={hv}");
                // A sigmoid is a few f32 roundings (the exponent's argument scaled by log2 e).
                assert_close(&format!("{what} beta"), &beta.to_f32_vec().unwrap(), &want_beta, 1e-30, 64.0 * EPS32);
                // exp(A_log) and softplus: a few units of f32 relative each; log(1 + u) from
                // 1 + u rounded loses up to 2^-24 / log(1 + 1/32) ≈ 32 units relative.
                assert_close(&format!("{what} g"), &g.to_f32_vec().unwrap(), &want_g, 1e-30, 128.0 * EPS32);
            }
        }
    }
}

/// Softplus around torch's threshold: the identity above 20 (where `log1p(exp(v))` rounds to
/// `v` in f32 anyway), `log1p(exp(v))` below it, where a lower threshold would show (10.5 and
/// 15 are not their own softplus in f32), and tiny but not zero far below.
#[test]
fn gated_delta_gates_softplus_around_the_threshold() {
    let dev = device();
    let a = [10.5f32, 15.0, 19.5, 20.0, 20.5, 25.0, -90.0, 0.0];
    let n = a.len();
    let (_, g) = api::gated_delta_gates(
        &tensor(&dev, DType::F32, &a, &[n, 1]),
        &tensor(&dev, DType::F32, &vec![0.0; n], &[n, 1]),
        &tensor(&dev, DType::F32, &[0.0], &[1]),
        &tensor(&dev, DType::F32, &[0.0], &[1]),
    )
    .unwrap();
    let g = g.to_f32_vec().unwrap();
    // exp(0) = 1: g = -softplus(a).
    assert_eq!((g[4], g[5]), (-20.5, -25.0));
    assert_ne!(g[0], -10.5, "softplus(10.5) is 10.5 + 2.75e-5");
    let want: Vec<f64> = a.iter().map(|v| -softplus64(*v as f64)).collect();
    assert_close("softplus around the threshold", &g, &want, 1e-30, 16.0 * EPS32);
    assert!(g[6] < 0.0, "softplus(-90) is tiny but not zero: {}", g[6]);
}

/// `(kind, x, z, weight) -> f64 out` for one row.
fn norm_reference(kind: &str, x: &[f32], z: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let d = x.len();
    let sum: f64 = x.iter().map(|v| *v as f64 * *v as f64).sum();
    let stat = if kind == "l2" { sum } else { sum / d as f64 };
    let scale = 1.0 / (stat + eps as f64).sqrt();
    (0..d)
        .map(|j| {
            let y = x[j] as f64 * scale;
            match kind {
                "l2" => y,
                "zc" => y * (1.0 + w[j] as f64),
                _ => w[j] as f64 * y * silu64(z[j] as f64),
            }
        })
        .collect()
}

#[test]
fn row_norms_match_reference() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(356);
    for dtype in FLOAT_DTYPES {
        // Head dims (a warp per row), the warp/block boundary and a hidden size (a block per row).
        for d in [48, 100, 1024, 1025, 1500] {
            for rows_n in TOKENS {
                if d > 1000 && rows_n == 65 {
                    continue;
                }
                let x = quantize(dtype, &rng.vec(rows_n * d, -3.0, 3.0));
                let z = quantize(dtype, &rng.vec(rows_n * d, -4.0, 4.0));
                let w = quantize(dtype, &rng.vec(d, -0.5, 0.5));
                let xt = tensor(&dev, dtype, &x, &[rows_n, d]);
                let zt = tensor(&dev, dtype, &z, &[rows_n, d]);
                let wt = tensor(&dev, DType::F32, &w, &[d]);
                let eps = 1e-6;
                // Σx² over d terms: a lane's d / 32 fmas and five shuffle adds (a block's
                // eight more), then a division, a root and a reciprocal; one rounding to the dtype.
                let rel = (d as f64 / 32.0 + 16.0) * EPS32 + epsilon(dtype);
                for kind in ["l2", "zc", "gated"] {
                    let got = match kind {
                        "l2" => api::l2_norm(&xt, eps),
                        "zc" => api::rms_norm_zero_centred(&xt, &wt, eps),
                        _ => api::gated_rms_norm(&xt, &zt, &wt, eps),
                    }
                    .unwrap();
                    assert_eq!((got.shape(), got.dtype()), (&[rows_n, d][..], dtype));
                    let want: Vec<f64> = (0..rows_n)
                        .flat_map(|r| norm_reference(kind, &x[r * d..][..d], &z[r * d..][..d], &w, eps))
                        .collect();
                    let what = format!("{kind} {dtype} rows={rows_n} D={d}");
                    assert_close(&what, &got.to_f32_vec().unwrap(), &want, subnormal_step(dtype), rel);
                }
                // The _into forms write the same bits.
                let out = Tensor::empty(&dev, dtype, &[rows_n, d]).unwrap();
                api::gated_rms_norm_into(&stream, &xt, &zt, &wt, eps, &out).unwrap();
                let again = api::gated_rms_norm(&xt, &zt, &wt, eps).unwrap();
                assert_bits("gated_rms_norm_into", &out.to_f32_vec().unwrap(), &again.to_f32_vec().unwrap());
            }
        }
    }
}

/// The residual add fused with the zero-centred norm: the sum rounded to the dtype (exact
/// against the reference), then the norm of the sum.
#[test]
fn rms_norm_zero_centred_residual_matches_reference() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(359);
    for dtype in FLOAT_DTYPES {
        for (rows_n, d) in [(1, 48), (7, 100), (65, 48), (1, 1500), (7, 1025)] {
            let x = quantize(dtype, &rng.vec(rows_n * d, -3.0, 3.0));
            let res = quantize(dtype, &rng.vec(rows_n * d, -3.0, 3.0));
            let w = quantize(dtype, &rng.vec(d, -0.5, 0.5));
            let (xt, rt) = (tensor(&dev, dtype, &x, &[rows_n, d]), tensor(&dev, dtype, &res, &[rows_n, d]));
            let wt = tensor(&dev, DType::F32, &w, &[d]);
            let (out, sum) = api::rms_norm_zero_centred_residual(&xt, &rt, &wt, 1e-6).unwrap();
            let want_sum: Vec<f32> = x.iter().zip(&res).map(|(a, b)| round_to(dtype, a + b)).collect();
            let what = format!("rms_norm_zero_centred_residual {dtype} rows={rows_n} D={d}");
            assert_bits(&format!("{what} residual_out"), &sum.to_f32_vec().unwrap(), &want_sum);
            let want: Vec<f64> =
                (0..rows_n).flat_map(|r| norm_reference("zc", &want_sum[r * d..][..d], &[], &w, 1e-6)).collect();
            let rel = (d as f64 / 32.0 + 16.0) * EPS32 + epsilon(dtype);
            assert_close(&what, &out.to_f32_vec().unwrap(), &want, subnormal_step(dtype), rel);
            // The norm of the stored sum is the plain zero-centred norm of it, bit for bit.
            let alone = api::rms_norm_zero_centred(&sum, &wt, 1e-6).unwrap();
            assert_bits(&format!("{what} vs alone"), &out.to_f32_vec().unwrap(), &alone.to_f32_vec().unwrap());
            let (o2, s2) =
                (Tensor::empty(&dev, dtype, &[rows_n, d]).unwrap(), Tensor::empty(&dev, dtype, &[rows_n, d]).unwrap());
            api::rms_norm_zero_centred_residual_into(&stream, &xt, &rt, &wt, 1e-6, &o2, &s2).unwrap();
            assert_bits(&format!("{what} into"), &o2.to_f32_vec().unwrap(), &out.to_f32_vec().unwrap());
        }
    }
}

/// Row norms over heads: `[T, H, D]` is `T · H` rows.
#[test]
fn row_norms_take_heads_as_rows() {
    let dev = device();
    let mut rng = Rng::new(357);
    let (t, h, d) = (7, 3, 48);
    let x = quantize(DType::BF16, &rng.vec(t * h * d, -3.0, 3.0));
    let three = api::l2_norm(&tensor(&dev, DType::BF16, &x, &[t, h, d]), 1e-6).unwrap();
    let flat = api::l2_norm(&tensor(&dev, DType::BF16, &x, &[t * h, d]), 1e-6).unwrap();
    assert_eq!(three.shape(), &[t, h, d]);
    assert_bits("l2_norm [T, H, D]", &three.to_f32_vec().unwrap(), &flat.to_f32_vec().unwrap());
}

#[test]
fn sigmoid_gate_and_split_match_reference() {
    let dev = device();
    let mut rng = Rng::new(358);
    for dtype in FLOAT_DTYPES {
        for t in TOKENS {
            for d in [48, 100] {
                let h = 3;
                let q = quantize(dtype, &rng.vec(t * h * 2 * d, -4.0, 4.0));
                let (first, second) = api::split_heads_halves(&tensor(&dev, dtype, &q, &[t, h, 2 * d])).unwrap();
                assert_eq!((first.shape(), second.dtype()), (&[t, h, d][..], dtype));
                let half = |which: usize| -> Vec<f32> {
                    q.chunks(2 * d).flat_map(|row| row[which * d..(which + 1) * d].to_vec()).collect()
                };
                let what = format!("split_heads_halves {dtype} T={t} D={d}");
                assert_bits(&format!("{what} first"), &first.to_f32_vec().unwrap(), &half(0));
                assert_bits(&format!("{what} second"), &second.to_f32_vec().unwrap(), &half(1));

                let attn = quantize(dtype, &rng.vec(t * h * d, -4.0, 4.0));
                let got =
                    api::sigmoid_gate(&tensor(&dev, dtype, &attn, &[t, h * d]), &second.reshape(&[t, h * d]).unwrap())
                        .unwrap();
                let gate = half(1);
                let want: Vec<f64> =
                    attn.iter().zip(&gate).map(|(x, g)| *x as f64 / (1.0 + (-(*g as f64)).exp())).collect();
                // A few f32 roundings (the exponent's argument, the sum, the division), then one
                // rounding to the dtype.
                let rel = 32.0 * EPS32 + epsilon(dtype);
                assert_close(
                    &format!("sigmoid_gate {dtype} T={t} D={d}"),
                    &got.to_f32_vec().unwrap(),
                    &want,
                    subnormal_step(dtype),
                    rel,
                );
            }
        }
    }
}

/// The norms and the gate read `q_proj`'s per-head halves in place (views of `[T, H, 2·D]`,
/// rows `2·D` apart) with the bits they give on the split copies, as does a column block of a
/// `[T, C]` tensor.
#[test]
fn norms_and_gate_read_views_in_place() {
    let dev = device();
    let mut rng = Rng::new(361);
    for dtype in FLOAT_DTYPES {
        for (t, d) in [(1, 48), (7, 100)] {
            let h = 3;
            let q = tensor(&dev, dtype, &quantize(dtype, &rng.vec(t * h * 2 * d, -3.0, 3.0)), &[t, h, 2 * d]);
            let (first, second) = api::split_heads_halves(&q).unwrap();
            let (first_view, second_view) = (q.narrow(2, 0, d).unwrap(), q.narrow(2, d, d).unwrap());
            assert!(!first_view.is_contiguous());
            let w = tensor(&dev, DType::F32, &rng.vec(d, -0.5, 0.5), &[d]);
            let other = tensor(&dev, dtype, &quantize(dtype, &rng.vec(t * h * d, -3.0, 3.0)), &[t, h, d]);
            let what = format!("{dtype} T={t} D={d}");
            let bits = |a: Tensor, b: Tensor, what: &str| {
                assert_bits(what, &a.to_f32_vec().unwrap(), &b.to_f32_vec().unwrap())
            };
            bits(api::l2_norm(&first_view, 1e-6).unwrap(), api::l2_norm(&first, 1e-6).unwrap(), &format!("l2 {what}"));
            bits(
                api::rms_norm_zero_centred(&first_view, &w, 1e-6).unwrap(),
                api::rms_norm_zero_centred(&first, &w, 1e-6).unwrap(),
                &format!("zero-centred {what}"),
            );
            bits(
                api::gated_rms_norm(&second_view, &other, &w, 1e-6).unwrap(),
                api::gated_rms_norm(&second, &other, &w, 1e-6).unwrap(),
                &format!("gated {what}"),
            );
            let (view_out, view_sum) = api::rms_norm_zero_centred_residual(&first_view, &other, &w, 1e-6).unwrap();
            let (out, sum) = api::rms_norm_zero_centred_residual(&first, &other, &w, 1e-6).unwrap();
            bits(view_out, out, &format!("residual {what}"));
            bits(view_sum, sum, &format!("residual sum {what}"));
            bits(
                api::sigmoid_gate(&other, &second_view).unwrap(),
                api::sigmoid_gate(&other, &second).unwrap(),
                &format!("sigmoid_gate {what}"),
            );
            // A column block of [T, 2·H·D]: rows 2·H·D apart.
            let flat = q.reshape(&[t, 2 * h * d]).unwrap();
            let block = flat.narrow(1, d, d).unwrap();
            let dense_block: Vec<f32> =
                flat.to_f32_vec().unwrap().chunks(2 * h * d).flat_map(|r| r[d..2 * d].to_vec()).collect();
            let dense_block = tensor(&dev, dtype, &dense_block, &[t, d]);
            bits(
                api::l2_norm(&block, 1e-6).unwrap(),
                api::l2_norm(&dense_block, 1e-6).unwrap(),
                &format!("block {what}"),
            );
        }
    }
}

fn err_text<T: std::fmt::Debug>(r: Result<T, OpError>) -> (OpError, String) {
    let e = r.expect_err("an invalid argument is an error");
    let s = e.to_string();
    (e, s)
}

/// Every invalid argument is an error that names it, never a panic.
#[test]
fn invalid_arguments_are_errors() {
    let dev = device();
    let stream = dev.default_stream();
    let f = |shape: &[usize]| tensor(&dev, DType::F32, &vec![0.5; shape.iter().product()], shape);
    let h = |shape: &[usize]| tensor(&dev, DType::BF16, &vec![0.5; shape.iter().product()], shape);
    let (x, w, s) = (f(&[5, 6]), f(&[6, 4]), f(&[6, 3]));

    // causal_conv1d
    let (e, m) = err_text(api::causal_conv1d(&f(&[30]), &w, None, true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("[tokens, channels]"), "{m}");
    let (e, m) = err_text(api::causal_conv1d(&x, &f(&[5, 4]), None, true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`weight`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d(&x, &f(&[6, 2, 4]), None, true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`weight`"), "{m}");
    for width in [1, 5] {
        let (e, m) = err_text(api::causal_conv1d(&x, &f(&[6, width]), None, true));
        assert!(matches!(e, OpError::InvalidArgument { .. }) && m.contains("W = "), "{m}");
    }
    let (e, m) = err_text(api::causal_conv1d(&x, &h(&[6, 4]), None, true));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`weight`"), "{m}");
    let ids = Tensor::from_slice(&dev, &[1u32; 30], &[5, 6]).unwrap();
    let (e, _) = err_text(api::causal_conv1d(&ids, &w, None, true));
    assert!(matches!(e, OpError::DType { .. }));
    let (e, m) = err_text(api::causal_conv1d(&x, &w, Some(&f(&[6, 4])), true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`initial_state`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d(&x, &w, Some(&h(&[6, 3])), true));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`initial_state`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d(&Tensor::empty(&dev, DType::F32, &[0, 6]).unwrap(), &w, None, true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("empty"), "{m}");
    let wide = f(&[5, 12]);
    let (e, m) = err_text(api::causal_conv1d(&wide.narrow(1, 0, 6).unwrap(), &w, None, true));
    assert!(matches!(e, OpError::InvalidArgument { .. }) && m.contains("contiguous"), "{m}");
    let (e, m) = err_text(api::causal_conv1d_into(&stream, &x, &w, None, true, &f(&[6, 5]), &s));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`y`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d_into(&stream, &x, &w, None, true, &f(&[5, 6]), &f(&[6, 2])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`final_state`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d_into(&stream, &x, &w, None, true, &h(&[5, 6]), &s));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`y`"), "{m}");

    // causal_conv1d_update
    let mut state = f(&[6, 3]);
    let (e, m) = err_text(api::causal_conv1d_update(&x, &w, &mut state, true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("one token"), "{m}");
    let mut bad_state = f(&[6, 4]);
    let (e, m) = err_text(api::causal_conv1d_update(&f(&[1, 6]), &w, &mut bad_state, true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`state`"), "{m}");
    let mut bf_state = h(&[6, 3]);
    let (e, m) = err_text(api::causal_conv1d_update(&f(&[1, 6]), &w, &mut bf_state, true));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`state`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d_update(&f(&[1, 6]), &f(&[6, 7]), &mut state, false));
    assert!(matches!(e, OpError::InvalidArgument { .. }) && m.contains("W = 7"), "{m}");
    let (e, m) = err_text(api::causal_conv1d_update_into(&stream, &f(&[1, 6]), &w, &state, true, &f(&[1, 5])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`y`"), "{m}");

    // causal_conv1d_update_slots
    let (xs, slots_t) = (f(&[2, 6]), Tensor::from_slice(&dev, &[0u32, 1], &[2]).unwrap());
    let mut pool = f(&[3, 6, 3]);
    let (e, m) = err_text(api::causal_conv1d_update_slots(&xs, &w, &mut f(&[3, 6, 2]), &slots_t, true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`states`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d_update_slots(&xs, &w, &mut h(&[3, 6, 3]), &slots_t, true));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`states`"), "{m}");
    let three = Tensor::from_slice(&dev, &[0u32, 1, 2], &[3]).unwrap();
    let (e, m) = err_text(api::causal_conv1d_update_slots(&xs, &w, &mut pool, &three, true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`state_slots`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d_update_slots(&xs, &w, &mut pool, &f(&[2]), true));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`state_slots`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d_update_slots_into(&stream, &xs, &w, &pool, &slots_t, true, &f(&[1, 6])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`y`"), "{m}");

    // causal_conv1d_varlen
    let cu = Tensor::from_slice(&dev, &[0u32, 2, 5], &[3]).unwrap();
    let (e, m) = err_text(api::causal_conv1d_varlen(&x, &w, &cu, &mut pool, &three, true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`cu_seqlens`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d_varlen(&x, &w, &f(&[3]), &mut pool, &slots_t, true));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`cu_seqlens`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d_varlen(&x, &w, &cu, &mut f(&[3, 6, 2]), &slots_t, true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`states`"), "{m}");
    let slots_2d = Tensor::from_slice(&dev, &[0u32, 1], &[1, 2]).unwrap();
    let (e, m) = err_text(api::causal_conv1d_varlen(&x, &w, &cu, &mut pool, &slots_2d, true));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`state_slots`"), "{m}");
    let (e, m) = err_text(api::causal_conv1d_varlen_into(&stream, &x, &w, &cu, &pool, &slots_t, true, &f(&[4, 6])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`y`"), "{m}");

    // gated_delta_gates
    let (a, p) = (f(&[5, 4]), f(&[4]));
    let (e, m) = err_text(api::gated_delta_gates(&a, &f(&[5, 3]), &p, &p));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`b`"), "{m}");
    let (e, m) = err_text(api::gated_delta_gates(&a, &h(&[5, 4]), &p, &p));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`b`"), "{m}");
    let (e, m) = err_text(api::gated_delta_gates(&a, &a, &f(&[3]), &p));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`a_log`"), "{m}");
    let (e, m) = err_text(api::gated_delta_gates(&a, &a, &p, &f(&[5])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`dt_bias`"), "{m}");
    // Parameters of a third dtype, or of two different dtypes.
    let (e, m) = err_text(api::gated_delta_gates(&a, &a, &h(&[4]), &h(&[4])));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`a_log`"), "{m}");
    let (ab, pb) = (h(&[5, 4]), h(&[4]));
    let (e, m) = err_text(api::gated_delta_gates(&ab, &ab, &p, &pb));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`dt_bias`"), "{m}");
    let (e, m) = err_text(api::gated_delta_gates_into(&stream, &ab, &ab, &pb, &pb, &h(&[5, 4]), &f(&[5, 4])));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`beta`"), "{m}");
    let (e, m) = err_text(api::gated_delta_gates_into(&stream, &ab, &ab, &pb, &pb, &f(&[5, 4]), &f(&[4, 5])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`g`"), "{m}");

    // the row norms
    let (xn, wn) = (f(&[3, 8]), f(&[8]));
    for eps in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let (e, m) = err_text(api::l2_norm(&xn, eps));
        assert!(matches!(e, OpError::InvalidArgument { .. }) && m.contains("epsilon"), "{m}");
        let (_, m) = err_text(api::rms_norm_zero_centred(&xn, &wn, eps));
        assert!(m.contains("epsilon"), "{m}");
    }
    let (e, m) = err_text(api::rms_norm_zero_centred(&xn, &f(&[7]), 1e-6));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`weight`"), "{m}");
    let (e, m) = err_text(api::rms_norm_zero_centred(&h(&[3, 8]), &h(&[8]), 1e-6));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`weight`"), "{m}");
    let (e, m) = err_text(api::rms_norm_zero_centred_residual(&xn, &f(&[3, 7]), &wn, 1e-6));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`residual`"), "{m}");
    let (e, m) = err_text(api::rms_norm_zero_centred_residual(&xn, &h(&[3, 8]), &wn, 1e-6));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`residual`"), "{m}");
    let (e, m) =
        err_text(api::rms_norm_zero_centred_residual_into(&stream, &xn, &xn, &wn, 1e-6, &f(&[3, 8]), &f(&[8])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`residual_out`"), "{m}");
    let (e, m) = err_text(api::gated_rms_norm(&xn, &f(&[3, 7]), &wn, 1e-6));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`z`"), "{m}");
    let (e, m) = err_text(api::gated_rms_norm(&xn, &h(&[3, 8]), &wn, 1e-6));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`z`"), "{m}");
    let (e, m) = err_text(api::l2_norm_into(&stream, &xn, 1e-6, &h(&[3, 8])));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`out`"), "{m}");
    let (e, m) = err_text(api::gated_rms_norm_into(&stream, &xn, &xn, &wn, 1e-6, &f(&[8, 3])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`out`"), "{m}");
    let (e, _) = err_text(api::l2_norm(&Tensor::from_slice(&dev, &[1u32; 8], &[1, 8]).unwrap(), 1e-6));
    assert!(matches!(e, OpError::DType { .. }));

    // Views whose rows are not evenly spaced (two heads of three: rows 8 apart, then a jump);
    // a leading axis of one does not matter.
    let heads = f(&[4, 3, 8]);
    let uneven = heads.narrow(1, 0, 2).unwrap();
    let (e, m) = err_text(api::l2_norm(&uneven, 1e-6));
    assert!(matches!(e, OpError::InvalidArgument { .. }) && m.contains("evenly spaced"), "{m}");
    let (e, m) = err_text(api::sigmoid_gate(&f(&[4, 2, 8]), &uneven));
    assert!(matches!(e, OpError::InvalidArgument { .. }) && m.contains("`gate`"), "{m}");
    let one = f(&[1, 3, 8]).narrow(1, 0, 2).unwrap();
    assert_eq!(api::l2_norm(&one, 1e-6).unwrap().shape(), &[1, 2, 8]);
    let (e, m) = err_text(api::l2_norm(&Tensor::empty(&dev, DType::F32, &[0, 8]).unwrap(), 1e-6));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("empty"), "{m}");
    // The other operands stay dense.
    let (e, m) = err_text(api::sigmoid_gate(&uneven, &f(&[4, 2, 8])));
    assert!(matches!(e, OpError::InvalidArgument { .. }) && m.contains("contiguous"), "{m}");

    // sigmoid_gate and split_heads_halves
    let (e, m) = err_text(api::sigmoid_gate(&xn, &f(&[3, 7])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`gate`"), "{m}");
    let (e, m) = err_text(api::sigmoid_gate(&xn, &h(&[3, 8])));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`gate`"), "{m}");
    let (e, m) = err_text(api::sigmoid_gate_into(&stream, &xn, &xn, &f(&[24])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`out`"), "{m}");
    let (e, m) = err_text(api::split_heads_halves(&f(&[2, 3, 5])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("even"), "{m}");
    let q = f(&[2, 3, 8]);
    let (e, m) = err_text(api::split_heads_halves_into(&stream, &q, &f(&[2, 3, 4]), &f(&[2, 3, 8])));
    assert!(matches!(e, OpError::Shape { .. }) && m.contains("`second`"), "{m}");
    let (e, m) = err_text(api::split_heads_halves_into(&stream, &q, &h(&[2, 3, 4]), &f(&[2, 3, 4])));
    assert!(matches!(e, OpError::DType { .. }) && m.contains("`first`"), "{m}");

    // Tensors on another device than the stream (only a GPU run has two).
    if dev.is_cuda() {
        let cpu = Device::cpu();
        let cx = tensor(&cpu, DType::F32, &[0.5; 30], &[5, 6]);
        let (e, _) = err_text(api::causal_conv1d_into(&stream, &cx, &w, None, true, &x, &s));
        assert!(matches!(e, OpError::Device { .. }));
        let (e, _) = err_text(api::l2_norm_into(&stream, &xn, 1e-6, &tensor(&cpu, DType::F32, &[0.0; 24], &[3, 8])));
        assert!(matches!(e, OpError::Device { .. }));
    }
}
