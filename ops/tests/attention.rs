//! Attention against a plain f64 reference (Hugging Face Qwen2 / SDPA semantics: GQA, causal
//! mask aligned to the end, additive bias, boolean mask), on the device `RUDA_DEVICE` names:
//! flash prefill over packed variable-length batches, split-KV decode, and the general
//! `attention` with each strategy; then the errors.
//!
//! Tolerances: the kernels compute in f32 from inputs already rounded to the dtype (the
//! reference uses the same rounded values), so the error is f32 accumulation and `ex2.approx`
//! (a few 1e-6 absolute for outputs of size ~1) plus one final rounding to the output dtype
//! (half an epsilon of the dtype, relative). Each check says which it uses.

use crate::common::*;
use ruda_ops::api::{self, AttentionOptions, AttentionSetupError, AttentionStrategy, DecodeWorkspace, OpError};
use ruda_runtime::{DType, Device, Tensor};

/// f32 math error allowance (absolute, outputs are averages of values in [-1, 1]).
const F32_ABS: f64 = 2e-5;

/// Relative allowance for the final rounding to `dtype` plus f32 math.
fn rel_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        other => epsilon(other),
    }
}

/// One sequence's attention in f64. `q` is `[tq, hq, d]`, `k` `[tk, hkv, d]`, `v` `[tk, hkv, dv]`
/// (row-major), the result `[tq, hq, dv]`;
/// `extra(h, i, j)` is `Some(bias)` when query `i` of head `h` may attend key `j` beyond the
/// causal rule, `None` when masked. Rows with no key give zeros.
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (tq, tk): (usize, usize),
    (hq, hkv, d, dv): (usize, usize, usize, usize),
    scale: f64,
    causal: bool,
    extra: &dyn Fn(usize, usize, usize) -> Option<f64>,
) -> Vec<f64> {
    let group = hq / hkv;
    let mut out = vec![0f64; tq * hq * dv];
    for h in 0..hq {
        let kh = h / group;
        for i in 0..tq {
            let mut logits = Vec::with_capacity(tk);
            for j in 0..tk {
                let allowed = !causal || j + tq <= i + tk;
                let bias = if allowed { extra(h, i, j) } else { None };
                logits.push(bias.map(|b| {
                    let dot: f64 =
                        (0..d).map(|x| q[(i * hq + h) * d + x] as f64 * k[(j * hkv + kh) * d + x] as f64).sum();
                    dot * scale + b
                }));
            }
            let m = logits.iter().flatten().copied().fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                continue;
            }
            let w: Vec<f64> = logits.iter().map(|l| l.map_or(0.0, |l| (l - m).exp())).collect();
            let sum: f64 = w.iter().sum();
            for x in 0..dv {
                let acc: f64 = (0..tk).map(|j| w[j] * v[(j * hkv + kh) * dv + x] as f64).sum();
                out[(i * hq + h) * dv + x] = acc / sum;
            }
        }
    }
    out
}

fn no_extra(_: usize, _: usize, _: usize) -> Option<f64> {
    Some(0.0)
}

fn upload_u32(dev: &Device, xs: &[u32]) -> Tensor {
    Tensor::from_slice(dev, xs, &[xs.len()]).unwrap()
}

/// A packed varlen problem: per-sequence (q_len, kv_len), heads, head dims of q/k and of v.
struct Varlen {
    lens: Vec<(usize, usize)>,
    hq: usize,
    hkv: usize,
    d: usize,
    dv: usize,
}

/// Run the varlen entry point and compare every sequence with the reference.
fn check_varlen(dev: &Device, rng: &mut Rng, dtype: DType, p: &Varlen, causal: bool, scale: Option<f32>, q_range: f32) {
    let (tq, tk): (usize, usize) = p.lens.iter().fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
    let q = quantize(dtype, &rng.vec(tq * p.hq * p.d, -q_range, q_range));
    let k = quantize(dtype, &rng.vec(tk * p.hkv * p.d, -1.0, 1.0));
    let v = quantize(dtype, &rng.vec(tk * p.hkv * p.dv, -1.0, 1.0));
    let mut cu_q = vec![0u32];
    let mut cu_k = vec![0u32];
    for (a, b) in &p.lens {
        cu_q.push(cu_q.last().unwrap() + *a as u32);
        cu_k.push(cu_k.last().unwrap() + *b as u32);
    }
    let got = api::attention_prefill_varlen(
        &tensor(dev, dtype, &q, &[tq, p.hq, p.d]),
        &tensor(dev, dtype, &k, &[tk, p.hkv, p.d]),
        &tensor(dev, dtype, &v, &[tk, p.hkv, p.dv]),
        &upload_u32(dev, &cu_q),
        &upload_u32(dev, &cu_k),
        None,
        scale,
        causal,
    )
    .unwrap();
    assert_eq!(got.dtype(), dtype);
    assert_eq!(got.shape(), &[tq, p.hq, p.dv]);
    let got = got.to_f32_vec().unwrap();
    let s = scale.map_or(1.0 / (p.d as f64).sqrt(), |s| s as f64);
    let (qr, kr, vr, or) = (p.hq * p.d, p.hkv * p.d, p.hkv * p.dv, p.hq * p.dv);
    for (seq, &(lq, lk)) in p.lens.iter().enumerate() {
        let (q0, k0) = (cu_q[seq] as usize, cu_k[seq] as usize);
        let want = reference(
            &q[q0 * qr..(q0 + lq) * qr],
            &k[k0 * kr..(k0 + lk) * kr],
            &v[k0 * vr..(k0 + lk) * vr],
            (lq, lk),
            (p.hq, p.hkv, p.d, p.dv),
            s,
            causal,
            &no_extra,
        );
        let what = format!(
            "varlen {dtype} d={} dv={} hq={} hkv={} causal={causal} seq {seq} ({lq}, {lk})",
            p.d, p.dv, p.hq, p.hkv
        );
        // f32 math, then one rounding to the dtype.
        assert_close(&what, &got[q0 * or..(q0 + lq) * or], &want, F32_ABS, rel_tol(dtype));
    }
}

#[test]
fn prefill_varlen_across_head_dims_gqa_ratios_and_dtypes() {
    let dev = device();
    let mut rng = Rng::new(11);
    // Lengths around the tiles (64 query rows × 32 keys at d=64, 32 × 16 at d=128, 16 × 8 at
    // d=256), uneven, with q_len < kv_len (chunked prefill) and q_len > kv_len (the leading
    // rows see no key and give zeros).
    let all = vec![(1, 1), (63, 63), (64, 64), (65, 65), (17, 40), (9, 3)];
    // Also a sequence without queries and one without keys (its queries give zeros).
    let short = vec![(1, 1), (33, 65), (0, 5), (17, 16), (9, 3), (3, 0)];
    // (d, hq, hkv, lengths, dtype): GQA ratios 1, 2, 7 and 8 over the head dims and dtypes.
    let cases = [
        (64, 8, 1, &all, DType::BF16),
        (64, 1, 1, &short, DType::F16),
        (128, 7, 1, &short, DType::F16),
        (128, 2, 2, &all, DType::F32),
        (256, 4, 2, &short, DType::BF16),
        (256, 8, 1, &short, DType::F32),
    ];
    for (d, hq, hkv, lens, dtype) in cases {
        let p = Varlen { lens: lens.clone(), hq, hkv, d, dv: d };
        for causal in [false, true] {
            check_varlen(&dev, &mut rng, dtype, &p, causal, None, 2.0);
        }
    }
}

#[test]
fn prefill_long_sequences_and_sharp_softmax() {
    let dev = device();
    let mut rng = Rng::new(12);
    // 1000 tokens, one head: many key tiles, the causal tile bound, and the running rescale.
    let p = Varlen { lens: vec![(1000, 1000)], hq: 1, hkv: 1, d: 64, dv: 64 };
    check_varlen(&dev, &mut rng, DType::BF16, &p, true, None, 1.0);
    // A large scale makes the softmax nearly one-hot (the max moves often within a row); a
    // small one makes it nearly flat.
    let p = Varlen { lens: vec![(20, 300), (3, 70)], hq: 2, hkv: 1, d: 128, dv: 128 };
    check_varlen(&dev, &mut rng, DType::F32, &p, true, Some(2.0), 1.0);
    check_varlen(&dev, &mut rng, DType::F16, &p, false, Some(0.05), 1.0);
}

/// Rows `0..len` of sequence `b` of a `[B, Hkv, S_max, D]` cache, packed as `[len, Hkv, D]`.
fn gather_cache(cache: &[f32], b: usize, len: usize, hkv: usize, s_max: usize, d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(len * hkv * d);
    for j in 0..len {
        for h in 0..hkv {
            let at = ((b * hkv + h) * s_max + j) * d;
            out.extend_from_slice(&cache[at..at + d]);
        }
    }
    out
}

#[test]
fn prefill_over_a_kv_cache() {
    let dev = device();
    let mut rng = Rng::new(16);
    // (q_len, seq_len) per sequence: a first prefill (q_len = seq_len), chunks continuing a
    // cache, a single query (decode through the prefill kernel), a length past the capacity.
    for (dtype, d, hq, hkv, s_max, lens) in [
        (DType::BF16, 128, 4, 2, 80, vec![(33usize, 33u32), (5, 70), (1, 17), (20, 95)]),
        (DType::F32, 64, 7, 1, 40, vec![(40, 40), (9, 12)]),
        (DType::F16, 256, 2, 1, 24, vec![(17, 24), (3, 3)]),
    ] {
        check_prefill_cache(&dev, &mut rng, dtype, (d, d), (hq, hkv), s_max, &lens);
    }
}

/// Prefill over a `[B, Hkv, S_max, D]` K and `[B, Hkv, S_max, Dv]` V cache, causal, against
/// the reference; `lens` are (q_len, seq_len) per sequence.
fn check_prefill_cache(
    dev: &Device,
    rng: &mut Rng,
    dtype: DType,
    (d, dv): (usize, usize),
    (hq, hkv): (usize, usize),
    s_max: usize,
    lens: &[(usize, u32)],
) {
    let b = lens.len();
    let tq: usize = lens.iter().map(|l| l.0).sum();
    let q = quantize(dtype, &rng.vec(tq * hq * d, -2.0, 2.0));
    let k = quantize(dtype, &rng.vec(b * hkv * s_max * d, -1.0, 1.0));
    let v = quantize(dtype, &rng.vec(b * hkv * s_max * dv, -1.0, 1.0));
    let mut cu = vec![0u32];
    for (ql, _) in lens {
        cu.push(cu.last().unwrap() + *ql as u32);
    }
    let seq_lens: Vec<u32> = lens.iter().map(|l| l.1).collect();
    let tensors = (
        tensor(dev, dtype, &q, &[tq, hq, d]),
        tensor(dev, dtype, &k, &[b, hkv, s_max, d]),
        tensor(dev, dtype, &v, &[b, hkv, s_max, dv]),
    );
    let out = Tensor::empty(dev, dtype, &[tq, hq, dv]).unwrap();
    let max_q = lens.iter().map(|l| l.0).max().unwrap_or(1).max(1);
    api::attention_prefill_cache_into(
        &dev.default_stream(),
        &tensors.0,
        &upload_u32(dev, &cu),
        max_q,
        &tensors.1,
        &tensors.2,
        &upload_u32(dev, &seq_lens),
        None,
        true,
        &out,
    )
    .unwrap();
    let got = out.to_f32_vec().unwrap();
    for (bi, &(ql, len)) in lens.iter().enumerate() {
        let len = (len as usize).min(s_max);
        let rows = cu[bi] as usize..cu[bi + 1] as usize;
        let want = reference(
            &q[rows.start * hq * d..rows.end * hq * d],
            &gather_cache(&k, bi, len, hkv, s_max, d),
            &gather_cache(&v, bi, len, hkv, s_max, dv),
            (ql, len),
            (hq, hkv, d, dv),
            1.0 / (d as f64).sqrt(),
            true,
            &no_extra,
        );
        let what = format!("prefill over cache {dtype} d={d} dv={dv} hq={hq} hkv={hkv} seq {bi} ({ql}, {len})");
        // f32 math, then one rounding to the dtype.
        assert_close(&what, &got[rows.start * hq * dv..rows.end * hq * dv], &want, F32_ABS, rel_tol(dtype));
    }
}

/// Decode against the reference for each sequence's first `seq_lens[b]` cache rows; `dims`
/// are the head dims of q/k and of v.
#[allow(clippy::too_many_arguments)]
fn check_decode(
    dev: &Device,
    rng: &mut Rng,
    dtype: DType,
    seq_lens: &[u32],
    s_max: usize,
    hq: usize,
    hkv: usize,
    (d, dv): (usize, usize),
    splits: Option<usize>,
) {
    let b = seq_lens.len();
    let q = quantize(dtype, &rng.vec(b * hq * d, -2.0, 2.0));
    let k = quantize(dtype, &rng.vec(b * hkv * s_max * d, -1.0, 1.0));
    let v = quantize(dtype, &rng.vec(b * hkv * s_max * dv, -1.0, 1.0));
    let tq = tensor(dev, dtype, &q, &[b, hq, d]);
    let tk = tensor(dev, dtype, &k, &[b, hkv, s_max, d]);
    let tv = tensor(dev, dtype, &v, &[b, hkv, s_max, dv]);
    let lens = upload_u32(dev, seq_lens);
    let got = match splits {
        Some(n) => {
            let ws = DecodeWorkspace::with_value_head_dim(&tq, dv, n).unwrap();
            let out = Tensor::empty(dev, dtype, &[b, hq, dv]).unwrap();
            api::attention_decode_into(&dev.default_stream(), &tq, &tk, &tv, &lens, None, &ws, &out).unwrap();
            // Reusing the workspace gives the same bits.
            let again = Tensor::empty(dev, dtype, &[b, hq, dv]).unwrap();
            api::attention_decode_into(&dev.default_stream(), &tq, &tk, &tv, &lens, None, &ws, &again).unwrap();
            assert_bits("decode twice", &again.to_f32_vec().unwrap(), &out.to_f32_vec().unwrap());
            out
        }
        None => api::attention_decode(&tq, &tk, &tv, &lens, None).unwrap(),
    };
    assert_eq!(got.shape(), &[b, hq, dv]);
    let got = got.to_f32_vec().unwrap();
    for (bi, &len) in seq_lens.iter().enumerate() {
        let len = (len as usize).min(s_max);
        let want = reference(
            &q[bi * hq * d..(bi + 1) * hq * d],
            &gather_cache(&k, bi, len, hkv, s_max, d),
            &gather_cache(&v, bi, len, hkv, s_max, dv),
            (1, len),
            (hq, hkv, d, dv),
            1.0 / (d as f64).sqrt(),
            false,
            &no_extra,
        );
        let what = format!("decode {dtype} d={d} dv={dv} hq={hq} hkv={hkv} splits={splits:?} seq {bi} len {len}");
        // f32 partials merged in f32, then one rounding to the dtype.
        assert_close(&what, &got[bi * hq * dv..(bi + 1) * hq * dv], &want, F32_ABS, rel_tol(dtype));
    }
}

#[test]
fn decode_split_kv_matches_reference() {
    let dev = device();
    let mut rng = Rng::new(13);
    // Uneven lengths, an empty sequence (zeros) and one past the capacity (clamped).
    let lens = [1u32, 63, 0, 130, 500];
    check_decode(&dev, &mut rng, DType::BF16, &lens, 130, 8, 1, (128, 128), Some(3));
    check_decode(&dev, &mut rng, DType::F32, &[65, 1, 64], 96, 7, 1, (64, 64), Some(5));
    check_decode(&dev, &mut rng, DType::F16, &[40, 17], 48, 2, 2, (256, 256), Some(2));
    // One split, and the allocating wrapper's own choice over a long cache.
    check_decode(&dev, &mut rng, DType::F32, &[33, 64], 64, 4, 4, (64, 64), Some(1));
    check_decode(&dev, &mut rng, DType::BF16, &[1000, 7], 1000, 8, 1, (64, 64), None);
    // More query heads per group than a block has rows at d = 256 (16): two head chunks.
    check_decode(&dev, &mut rng, DType::F32, &[20], 32, 20, 1, (256, 256), Some(2));
}

/// `[B, H, T, D]` from per-batch packed `[T, H, D]` blocks.
fn to_bhtd(packed: &[f32], b: usize, t: usize, h: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0f32; packed.len()];
    for bi in 0..b {
        for ti in 0..t {
            for hi in 0..h {
                for x in 0..d {
                    out[((bi * h + hi) * t + ti) * d + x] = packed[((bi * t + ti) * h + hi) * d + x];
                }
            }
        }
    }
    out
}

/// A mask for [`check_dense`]: its data, its shape, and whether `(batch, head, query, key)` may
/// attend.
type MaskCase<'a> = (&'a [u8], &'a [usize], &'a dyn Fn(usize, usize, usize, usize) -> bool);
/// A bias for [`check_dense`]: its data, its shape, and its value at `(batch, head, query, key)`.
type BiasCase<'a> = (&'a [f32], &'a [usize], &'a dyn Fn(usize, usize, usize, usize) -> f64);

/// The general entry point on `[B, H, T, D]` data for one strategy, compared with the reference.
#[allow(clippy::too_many_arguments)]
fn check_dense(
    dev: &Device,
    rng: &mut Rng,
    dtype: DType,
    (b, hq, hkv, t, s, d): (usize, usize, usize, usize, usize, usize),
    causal: bool,
    strategy: AttentionStrategy,
    mask: Option<MaskCase<'_>>,
    bias: Option<BiasCase<'_>>,
) {
    check_dense_dv(dev, rng, dtype, (b, hq, hkv, t, s, d, d), causal, strategy, mask, bias);
}

/// [`check_dense`] with a value head dim `dv` of its own.
#[allow(clippy::too_many_arguments)]
fn check_dense_dv(
    dev: &Device,
    rng: &mut Rng,
    dtype: DType,
    (b, hq, hkv, t, s, d, dv): (usize, usize, usize, usize, usize, usize, usize),
    causal: bool,
    strategy: AttentionStrategy,
    mask: Option<MaskCase<'_>>,
    bias: Option<BiasCase<'_>>,
) {
    let q = quantize(dtype, &rng.vec(b * t * hq * d, -2.0, 2.0));
    let k = quantize(dtype, &rng.vec(b * s * hkv * d, -1.0, 1.0));
    let v = quantize(dtype, &rng.vec(b * s * hkv * dv, -1.0, 1.0));
    let tq = tensor(dev, dtype, &to_bhtd(&q, b, t, hq, d), &[b, hq, t, d]);
    let tk = tensor(dev, dtype, &to_bhtd(&k, b, s, hkv, d), &[b, hkv, s, d]);
    let tv = tensor(dev, dtype, &to_bhtd(&v, b, s, hkv, dv), &[b, hkv, s, dv]);
    let tm = mask.map(|(m, shape, _)| Tensor::from_slice(dev, m, shape).unwrap());
    let tb = bias.map(|(x, shape, _)| tensor(dev, dtype, x, shape));
    let options = AttentionOptions { causal, scale: None };
    let got = api::attention(&tq, &tk, &tv, tm.as_ref(), tb.as_ref(), &options, strategy).unwrap();
    assert_eq!(got.shape(), &[b, hq, t, dv]);
    let got = got.to_f32_vec().unwrap();
    for bi in 0..b {
        let extra = |h: usize, i: usize, j: usize| -> Option<f64> {
            if let Some((_, _, allowed)) = &mask {
                if !allowed(bi, h, i, j) {
                    return None;
                }
            }
            // The bias is rounded to the dtype when uploaded, as the device sees it.
            Some(bias.as_ref().map_or(0.0, |(_, _, f)| round_to(dtype, f(bi, h, i, j) as f32) as f64))
        };
        let want = reference(
            &q[bi * t * hq * d..(bi + 1) * t * hq * d],
            &k[bi * s * hkv * d..(bi + 1) * s * hkv * d],
            &v[bi * s * hkv * dv..(bi + 1) * s * hkv * dv],
            (t, s),
            (hq, hkv, d, dv),
            1.0 / (d as f64).sqrt(),
            causal,
            &extra,
        );
        let want = to_bhtd(&want.iter().map(|x| *x as f32).collect::<Vec<_>>(), 1, t, hq, dv);
        let want: Vec<f64> = want.iter().map(|x| *x as f64).collect();
        let what = format!(
            "attention {strategy:?} {dtype} b={bi} hq={hq} hkv={hkv} t={t} s={s} d={d} dv={dv} causal={causal}"
        );
        // Flash: f32 math then one rounding; Fallback: f32 GEMMs and softmax then one rounding.
        assert_close(&what, &got[bi * hq * t * dv..(bi + 1) * hq * t * dv], &want, F32_ABS, rel_tol(dtype));
    }
}

#[test]
fn attention_contract_strategies_agree_with_reference() {
    let dev = device();
    let mut rng = Rng::new(14);
    for strategy in [AttentionStrategy::FlashUnit, AttentionStrategy::Fallback, AttentionStrategy::Autotune] {
        check_dense(&dev, &mut rng, DType::BF16, (2, 4, 2, 19, 33, 64), true, strategy, None, None);
        check_dense(&dev, &mut rng, DType::F32, (1, 2, 2, 40, 17, 128), false, strategy, None, None);
    }
    // Head dim 80 (a padded geometry) through every strategy.
    for strategy in [AttentionStrategy::FlashUnit, AttentionStrategy::Fallback, AttentionStrategy::Autotune] {
        check_dense(&dev, &mut rng, DType::F16, (1, 3, 1, 9, 12, 80), true, strategy, None, None);
    }
    // Rank 3 ([H, T, D]) is batch 1.
    let q = tensor(&dev, DType::F32, &rng.vec(2 * 5 * 64, -1.0, 1.0), &[2, 5, 64]);
    let k = tensor(&dev, DType::F32, &rng.vec(5 * 64, -1.0, 1.0), &[1, 5, 64]);
    let v = tensor(&dev, DType::F32, &rng.vec(5 * 64, -1.0, 1.0), &[1, 5, 64]);
    let o = AttentionOptions::default();
    let out3 = api::attention(&q, &k, &v, None, None, &o, AttentionStrategy::FlashUnit).unwrap();
    assert_eq!(out3.shape(), &[2, 5, 64]);
    let q4 = q.reshape(&[1, 2, 5, 64]).unwrap();
    let (k4, v4) = (k.reshape(&[1, 1, 5, 64]).unwrap(), v.reshape(&[1, 1, 5, 64]).unwrap());
    let out4 = api::attention(&q4, &k4, &v4, None, None, &o, AttentionStrategy::FlashUnit).unwrap();
    assert_bits("rank 3 vs rank 4", &out3.to_f32_vec().unwrap(), &out4.to_f32_vec().unwrap());
}

#[test]
fn attention_mask_and_bias() {
    let dev = device();
    let mut rng = Rng::new(15);
    let (b, hq, hkv, t, s, d): (usize, usize, usize, usize, usize, usize) = (2, 2, 1, 21, 37, 64);
    // Key padding mask [B, 1, 1, S]: sequence 0 sees its first 30 keys, sequence 1 all of them.
    let pad: Vec<u8> = (0..b * s).map(|x| u8::from(x / s == 1 || x % s < 30)).collect();
    let pad_ok = |bi: usize, _h: usize, _i: usize, j: usize| bi == 1 || j < 30;
    // A [T, S] pattern that masks query 3 entirely (its output must be zeros).
    let pattern: Vec<u8> = (0..t * s).map(|x| u8::from(x / s != 3 && !(x * 7).is_multiple_of(5))).collect();
    let pattern_ok = |_b: usize, _h: usize, i: usize, j: usize| i != 3 && !((i * s + j) * 7).is_multiple_of(5);
    // Per-head bias [1, H, T, S] (ALiBi-like slopes plus noise).
    let bias: Vec<f32> = (0..hq * t * s)
        .map(|x| -((x / (t * s) + 1) as f32) * 0.1 * ((x % s) as f32) + ((x * 13 % 7) as f32) * 0.3)
        .collect();
    let bias_at = |_b: usize, h: usize, i: usize, j: usize| bias[(h * t + i) * s + j] as f64;
    for strategy in [AttentionStrategy::FlashUnit, AttentionStrategy::Fallback] {
        for dtype in [DType::F32, DType::BF16] {
            let dims = (b, hq, hkv, t, s, d);
            check_dense(&dev, &mut rng, dtype, dims, false, strategy, Some((&pad, &[b, 1, 1, s], &pad_ok)), None);
            check_dense(&dev, &mut rng, dtype, dims, true, strategy, None, Some((&bias, &[1, hq, t, s], &bias_at)));
            check_dense(
                &dev,
                &mut rng,
                dtype,
                dims,
                false,
                strategy,
                Some((&pattern, &[t, s], &pattern_ok)),
                Some((&bias, &[1, hq, t, s], &bias_at)),
            );
        }
    }
}

#[test]
fn setup_errors_name_the_problem() {
    let dev = device();
    let f = |shape: &[usize], dtype: DType| Tensor::zeros(&dev, dtype, shape).unwrap();
    let q = f(&[1, 4, 8, 64], DType::F32);
    let kv = f(&[1, 2, 8, 64], DType::F32);
    let kv2 = f(&[1, 2, 8, 64], DType::F32);
    let o = AttentionOptions::default();
    let run = |q: &Tensor, k: &Tensor, v: &Tensor, m: Option<&Tensor>, b: Option<&Tensor>, o: &AttentionOptions, s| {
        api::attention(q, k, v, m, b, o, s).unwrap_err()
    };
    let flash = AttentionStrategy::FlashUnit;
    assert!(matches!(
        run(&q, &f(&[1, 3, 8, 64], DType::F32), &f(&[1, 3, 8, 64], DType::F32), None, None, &o, flash),
        AttentionSetupError::Shape(_)
    ));
    assert!(matches!(
        run(&q, &kv, &f(&[1, 2, 9, 64], DType::F32), None, None, &o, flash),
        AttentionSetupError::Shape(_)
    ));
    assert!(matches!(
        run(&q, &f(&[1, 2, 8, 64], DType::BF16), &kv, None, None, &o, flash),
        AttentionSetupError::DType(_)
    ));
    assert!(matches!(run(&f(&[4, 8, 64], DType::F32), &kv, &kv, None, None, &o, flash), AttentionSetupError::Shape(_)));
    let ints = f(&[1, 4, 8, 64], DType::I32);
    assert!(matches!(run(&ints, &ints, &ints, None, None, &o, flash), AttentionSetupError::DType(_)));
    for scale in [f32::NAN, f32::INFINITY] {
        let e = run(&q, &kv, &kv, None, None, &AttentionOptions { causal: false, scale: Some(scale) }, flash);
        assert!(matches!(e, AttentionSetupError::Scale(_)), "{e}");
    }
    // Head dims past 1024 (of query/key, or of value only): FlashUnit refuses, naming both.
    let q_big = f(&[1, 2, 4, 1025], DType::F32);
    let kv_big = f(&[1, 2, 4, 1025], DType::F32);
    let e = run(&q_big, &kv_big, &kv_big, None, None, &o, flash);
    assert!(matches!(e, AttentionSetupError::UnsupportedHeadDim { head_dim: 1025, v_head_dim: 1025, .. }), "{e}");
    assert!(e.to_string().contains("1025"), "{e}");
    let e = run(&f(&[1, 2, 4, 8], DType::F32), &f(&[1, 2, 4, 8], DType::F32), &kv_big, None, None, &o, flash);
    assert!(matches!(e, AttentionSetupError::UnsupportedHeadDim { head_dim: 8, v_head_dim: 1025, .. }), "{e}");
    // Mask: wrong dtype, non-broadcasting shape; bias: non-broadcasting shape.
    let e = run(&q, &kv, &kv, Some(&f(&[8, 8], DType::F32)), None, &o, flash);
    assert!(matches!(e, AttentionSetupError::DType(_)), "{e}");
    let e = run(&q, &kv, &kv, Some(&f(&[8, 7], DType::U8)), None, &o, flash);
    assert!(matches!(e, AttentionSetupError::MaskShape { name: "mask", .. }), "{e}");
    let e = run(&q, &kv, &kv, None, Some(&f(&[3, 8, 8], DType::F32)), &o, AttentionStrategy::Fallback);
    assert!(matches!(e, AttentionSetupError::MaskShape { name: "attn_bias", .. }), "{e}");
    let e = run(&q, &kv, &kv, None, Some(&f(&[1, 1, 1, 1, 8], DType::F32)), &o, flash);
    assert!(matches!(e, AttentionSetupError::MaskShape { .. }), "{e}");
    // A view that does not start at a multiple of 4 elements: FlashUnit refuses, Autotune falls back.
    let big = f(&[1 + 4 * 8 * 64], DType::F32);
    let odd = big.narrow(0, 1, 4 * 8 * 64).unwrap().reshape(&[1, 4, 8, 64]).unwrap();
    assert!(matches!(run(&odd, &kv, &kv, None, None, &o, flash), AttentionSetupError::Unsupported(_)));
    api::attention(&odd, &kv, &kv2, None, None, &o, AttentionStrategy::Autotune).unwrap();
}

#[test]
fn varlen_and_decode_errors() {
    let dev = device();
    let f = |shape: &[usize], dtype: DType| Tensor::zeros(&dev, dtype, shape).unwrap();
    let q = f(&[10, 4, 64], DType::BF16);
    let kv = f(&[12, 2, 64], DType::BF16);
    let v = f(&[12, 2, 64], DType::BF16);
    let cu_q = upload_u32(&dev, &[0, 4, 10]);
    let cu_k = upload_u32(&dev, &[0, 5, 12]);
    let ok = api::attention_prefill_varlen(&q, &kv, &v, &cu_q, &cu_k, None, None, true).unwrap();
    assert_eq!(ok.shape(), &[10, 4, 64]);
    let varlen = |q: &Tensor, k: &Tensor, cq: &Tensor, ck: &Tensor, max_q: Option<usize>, scale: Option<f32>| {
        api::attention_prefill_varlen(q, k, k, cq, ck, max_q, scale, false).unwrap_err()
    };
    let msg = |e: OpError| e.to_string();
    assert!(msg(varlen(&q, &f(&[12, 3, 64], DType::BF16), &cu_q, &cu_k, None, None)).contains("multiple"));
    assert!(matches!(varlen(&q, &f(&[12, 2, 64], DType::F16), &cu_q, &cu_k, None, None), OpError::DType { .. }));
    assert!(msg(varlen(&f(&[10, 4, 1025], DType::BF16), &f(&[12, 2, 1025], DType::BF16), &cu_q, &cu_k, None, None))
        .contains("head dim 1025"));
    assert!(msg(varlen(&q, &kv, &cu_q, &cu_k, None, Some(f32::NAN))).contains("finite"));
    assert!(matches!(varlen(&q, &kv, &f(&[3], DType::I32), &cu_k, None, None), OpError::DType { .. }));
    assert!(matches!(varlen(&q, &kv, &upload_u32(&dev, &[0, 10]), &cu_k, None, None), OpError::Shape { .. }));
    // Contents of the cumulative lengths (checked by the allocating wrapper).
    assert!(msg(varlen(&q, &kv, &upload_u32(&dev, &[0, 4, 9]), &cu_k, None, None)).contains("ends at 9"));
    assert!(msg(varlen(&q, &kv, &upload_u32(&dev, &[0, 11, 10]), &cu_k, None, None)).contains("decreases"));
    assert!(msg(varlen(&q, &kv, &upload_u32(&dev, &[1, 4, 10]), &cu_k, None, None)).contains("start at 0"));
    assert!(msg(varlen(&q, &kv, &cu_q, &cu_k, Some(5), None)).contains("max_seqlen_q = 5"));
    let out = f(&[10, 4, 64], DType::BF16);
    let stream = dev.default_stream();
    let e = api::attention_prefill_varlen_into(&stream, &q, &kv, &v, &cu_q, &cu_k, 0, None, false, &out).unwrap_err();
    assert!(msg(e).contains("at least 1"));
    let e = api::attention_prefill_varlen_into(
        &stream,
        &q,
        &kv,
        &kv,
        &cu_q,
        &cu_k,
        6,
        None,
        false,
        &f(&[10, 4, 64], DType::F32),
    );
    assert!(matches!(e, Err(OpError::DType { .. })));

    // Prefill over a cache: the batch comes from cu_seqlens_q; lengths past the cache.
    let cache_k = f(&[2, 2, 16, 64], DType::BF16);
    let cache_v = f(&[2, 2, 16, 64], DType::BF16);
    let e = api::attention_prefill_cache(
        &q,
        &upload_u32(&dev, &[0, 10]),
        None,
        &cache_k,
        &cache_v,
        &upload_u32(&dev, &[3, 16]),
        None,
        true,
    );
    assert!(matches!(e, Err(OpError::Shape { .. })));
    let e = api::attention_prefill_cache(&q, &cu_q, None, &cache_k, &cache_v, &upload_u32(&dev, &[3]), None, true);
    assert!(matches!(e, Err(OpError::Shape { .. })));
    let e = api::attention_prefill_cache(&q, &cu_q, None, &cache_k, &cache_v, &upload_u32(&dev, &[3, 17]), None, true);
    assert!(msg(e.unwrap_err()).contains("seq_lens[1] = 17"));
    let ok = api::attention_prefill_cache(&q, &cu_q, None, &cache_k, &cache_v, &upload_u32(&dev, &[4, 16]), None, true)
        .unwrap();
    assert_eq!(ok.shape(), &[10, 4, 64]);

    // Decode.
    let q = f(&[2, 8, 128], DType::F16);
    let cache = f(&[2, 2, 16, 128], DType::F16);
    let v_cache = f(&[2, 2, 16, 128], DType::F16);
    let lens = upload_u32(&dev, &[3, 16]);
    let ws = DecodeWorkspace::new(&q, 2).unwrap();
    assert_eq!(ws.splits(), 2);
    let out = f(&[2, 8, 128], DType::F16);
    api::attention_decode_into(&stream, &q, &cache, &v_cache, &lens, None, &ws, &out).unwrap();
    for splits in [0, api::MAX_DECODE_SPLITS + 1] {
        assert!(msg(DecodeWorkspace::new(&q, splits).err().unwrap()).contains("splits"));
    }
    let other_ws = DecodeWorkspace::new(&f(&[2, 4, 128], DType::F16), 2).unwrap();
    let e = api::attention_decode_into(&stream, &q, &cache, &cache, &lens, None, &other_ws, &out).unwrap_err();
    assert!(msg(e).contains("workspace"));
    let e = api::attention_decode(&q, &cache, &cache, &upload_u32(&dev, &[3]), None).unwrap_err();
    assert!(matches!(e, OpError::Shape { .. }));
    let e = api::attention_decode(&q, &f(&[2, 3, 16, 128], DType::F16), &f(&[2, 3, 16, 128], DType::F16), &lens, None)
        .unwrap_err();
    assert!(msg(e).contains("multiple"));
    let e = api::attention_decode(&q, &cache, &f(&[2, 2, 15, 128], DType::F16), &lens, None).unwrap_err();
    assert!(matches!(e, OpError::Shape { .. }));
    let e = api::attention_decode(&q, &cache, &cache, &lens, Some(f32::INFINITY)).unwrap_err();
    assert!(msg(e).contains("finite"));
}

/// `(dtype, d, dv, hq, hkv, (q_len, kv_len) per sequence)`.
type HeadDimCase = (DType, usize, usize, usize, usize, &'static [(usize, usize)]);

#[test]
fn flash_at_every_head_dim() {
    let dev = device();
    let mut rng = Rng::new(17);
    // (dtype, d, dv, hq, hkv, lengths): head dims that are not 64, 128 or 256 (scalar loads at
    // d = 1, padded groups at 80, 112, 200, one lane per row at 16, one row per lane at 1024),
    // value head dims of their own, GQA ratios 1 to 3.
    let cases: [HeadDimCase; 10] = [
        (DType::F32, 1, 1, 3, 1, &[(5, 9), (3, 2)]),
        (DType::BF16, 16, 16, 2, 2, &[(9, 17)]),
        (DType::F16, 48, 48, 3, 1, &[(7, 12), (1, 5)]),
        (DType::F32, 80, 80, 2, 1, &[(6, 11)]),
        (DType::BF16, 96, 96, 2, 2, &[(4, 9)]),
        (DType::F32, 112, 112, 2, 1, &[(5, 21), (2, 1)]),
        (DType::F16, 200, 200, 2, 1, &[(3, 10)]),
        (DType::F32, 1024, 1024, 1, 1, &[(5, 7)]),
        (DType::F32, 48, 32, 2, 1, &[(6, 13)]),
        (DType::BF16, 16, 80, 3, 1, &[(4, 10)]),
    ];
    for (dtype, d, dv, hq, hkv, lens) in cases {
        let p = Varlen { lens: lens.to_vec(), hq, hkv, d, dv };
        for causal in [false, true] {
            check_varlen(&dev, &mut rng, dtype, &p, causal, None, 2.0);
        }
    }
    // Decode with several splits (and a GQA group), and prefill over a cache.
    for (dtype, dims) in
        [(DType::F32, (1, 1)), (DType::BF16, (80, 80)), (DType::F32, (48, 32)), (DType::F16, (200, 200))]
    {
        check_decode(&dev, &mut rng, dtype, &[13, 40], 40, 4, 2, dims, Some(3));
    }
    check_decode(&dev, &mut rng, DType::F32, &[9], 12, 2, 1, (1024, 1024), Some(2));
    check_prefill_cache(&dev, &mut rng, DType::F32, (112, 112), (3, 1), 24, &[(5, 20), (1, 7)]);
    check_prefill_cache(&dev, &mut rng, DType::BF16, (48, 32), (2, 2), 16, &[(4, 16), (3, 3)]);
    // The general entry point: the flash kernels at other head dims, with and without a mask.
    let flash = AttentionStrategy::FlashUnit;
    check_dense(&dev, &mut rng, DType::F32, (2, 2, 1, 7, 9, 16), true, flash, None, None);
    check_dense_dv(&dev, &mut rng, DType::BF16, (2, 3, 1, 5, 11, 48, 80), false, flash, None, None);
    let (t, s): (usize, usize) = (6, 10);
    let pattern: Vec<u8> = (0..t * s).map(|x| u8::from(!(x * 7).is_multiple_of(3))).collect();
    let pattern_ok = |_b: usize, _h: usize, i: usize, j: usize| !((i * s + j) * 7).is_multiple_of(3);
    let mask = Some((&pattern[..], &[t, s][..], &pattern_ok as &dyn Fn(usize, usize, usize, usize) -> bool));
    check_dense_dv(&dev, &mut rng, DType::F32, (1, 2, 2, t, s, 200, 200), true, flash, mask, None);
    // A per-head bias with a value head dim of its own.
    let bias: Vec<f32> = (0..2 * t * s).map(|x| ((x * 5 % 11) as f32) * 0.2 - 1.0).collect();
    let bias_at = |_b: usize, h: usize, i: usize, j: usize| bias[(h * t + i) * s + j] as f64;
    let bias_case = Some((&bias[..], &[1, 2, t, s][..], &bias_at as &dyn Fn(usize, usize, usize, usize) -> f64));
    check_dense_dv(&dev, &mut rng, DType::F32, (1, 2, 1, t, s, 16, 48), false, flash, mask, bias_case);
}

#[test]
fn head_dim_errors_name_the_shape() {
    let dev = device();
    let f = |shape: &[usize], dtype: DType| Tensor::zeros(&dev, dtype, shape).unwrap();
    let msg = |e: OpError| e.to_string();
    // The model layer's load-time check.
    api::attention_supports(DType::BF16, 14, 2, 64, 64).unwrap();
    api::attention_supports(DType::F16, 3, 1, 1, 1024).unwrap();
    api::attention_supports(DType::F32, 8, 8, 48, 32).unwrap();
    for (d, dv, want) in [(0, 64, "head dim 0"), (1025, 64, "head dim 1025"), (64, 1025, "value head dim 1025")] {
        let e = msg(api::attention_supports(DType::BF16, 4, 2, d, dv).unwrap_err());
        assert!(e.contains(want), "{e}");
        assert!(e.contains(&format!("4 query heads, 2 key/value heads, head dim {d}, value head dim {dv}")), "{e}");
    }
    assert!(msg(api::attention_supports(DType::BF16, 6, 4, 64, 64).unwrap_err()).contains("multiple"));
    assert!(api::attention_supports(DType::BF16, 6, 0, 64, 64).is_err());
    assert!(api::attention_supports(DType::BF16, 0, 1, 64, 64).is_err());
    assert!(matches!(api::attention_supports(DType::I32, 4, 2, 64, 64), Err(OpError::DType { .. })));

    // D = 0 and D = 1025 at the entry points.
    let cu_q = upload_u32(&dev, &[0, 3]);
    let cu_k = upload_u32(&dev, &[0, 4]);
    for d in [0, 1025] {
        let (q, k) = (f(&[3, 2, d], DType::F32), f(&[4, 1, d], DType::F32));
        let e = api::attention_prefill_varlen(&q, &k, &k, &cu_q, &cu_k, None, None, false).unwrap_err();
        if d > 0 {
            assert!(msg(e).contains("head dim 1025"));
        }
        let (q, cache) = (f(&[1, 2, d], DType::F32), f(&[1, 1, 8, d], DType::F32));
        let e = api::attention_decode(&q, &cache, &cache, &upload_u32(&dev, &[5]), None).unwrap_err();
        if d > 0 {
            assert!(msg(e).contains("head dim 1025"));
        }
        let e = api::attention_prefill_cache(
            &f(&[3, 2, d], DType::F32),
            &cu_q,
            None,
            &cache,
            &cache,
            &upload_u32(&dev, &[5]),
            None,
            true,
        )
        .unwrap_err();
        if d > 0 {
            assert!(msg(e).contains("head dim 1025"));
        }
        let (q4, kv4) = (f(&[1, 2, 3, d], DType::F32), f(&[1, 1, 4, d], DType::F32));
        let o = AttentionOptions::default();
        assert!(api::attention(&q4, &kv4, &kv4, None, None, &o, AttentionStrategy::FlashUnit).is_err());
    }

    // A value head dim that disagrees with the V cache, the workspace or the output.
    let stream = dev.default_stream();
    let q = f(&[2, 4, 48], DType::F32);
    let k_cache = f(&[2, 2, 8, 48], DType::F32);
    let v_cache = f(&[2, 2, 8, 32], DType::F32);
    let lens = upload_u32(&dev, &[3, 8]);
    let ws = DecodeWorkspace::with_value_head_dim(&q, 32, 2).unwrap();
    api::attention_decode_into(&stream, &q, &k_cache, &v_cache, &lens, None, &ws, &f(&[2, 4, 32], DType::F32)).unwrap();
    let e = api::attention_decode_into(&stream, &q, &k_cache, &v_cache, &lens, None, &ws, &f(&[2, 4, 48], DType::F32));
    assert!(msg(e.unwrap_err()).contains("`out`"));
    let ws48 = DecodeWorkspace::new(&q, 2).unwrap();
    let e =
        api::attention_decode_into(&stream, &q, &k_cache, &v_cache, &lens, None, &ws48, &f(&[2, 4, 32], DType::F32));
    assert!(msg(e.unwrap_err()).contains("value head dim of 48"));
    let e = api::attention_decode(&q, &k_cache, &f(&[2, 2, 7, 32], DType::F32), &lens, None).unwrap_err();
    assert!(msg(e).contains("v_cache"));
    let qp = f(&[5, 4, 48], DType::F32);
    let cu = upload_u32(&dev, &[0, 2, 5]);
    let e = api::attention_prefill_cache_into(
        &stream,
        &qp,
        &cu,
        3,
        &k_cache,
        &v_cache,
        &lens,
        None,
        true,
        &f(&[5, 4, 48], DType::F32),
    );
    assert!(msg(e.unwrap_err()).contains("`out`"));
    let out = api::attention_prefill_cache(&qp, &cu, None, &k_cache, &v_cache, &lens, None, true).unwrap();
    assert_eq!(out.shape(), &[5, 4, 32]);
}

/// The decode kernel's arguments are bound by name: `s_max` and `kv_heads` swapped (both `u32`,
/// so their types alone pass) are an error naming both.
#[test]
fn decode_arguments_are_checked_by_name() {
    use ruda_ops::kernels::attention::{attention_decode, AttentionDecodeConfig, AttentionDecodeParams};
    use ruda_ops::params::check_names;
    let dev = Device::cpu();
    let cfg = AttentionDecodeConfig { dtype: ruda_ir::ScalarType::F32, head_dim: 64, v_head_dim: 64 };
    let kernel = attention_decode(&cfg).unwrap();
    let t = Tensor::zeros(&dev, DType::F32, &[4]).unwrap();
    let lens = Tensor::zeros(&dev, DType::U32, &[1]).unwrap();
    let args = AttentionDecodeParams {
        q: &t,
        k_cache: &t,
        v_cache: &t,
        seq_lens: &lens,
        workspace: &t,
        scale: 1.0,
        s_max: 8,
        kv_heads: 1,
        group: 1,
        split_len: 8,
    }
    .args();
    check_names(&kernel, &args).unwrap();
    let mut swapped = args.clone();
    swapped.swap(6, 7);
    let e = check_names(&kernel, &swapped).unwrap_err().to_string();
    assert!(e.contains("argument 6 is `kv_heads`") && e.contains("parameter 6 is `s_max`"), "{e}");
}
