//! RoPE against Hugging Face's formula written out step by step (the same `f32` table math and
//! the same roundings in the model dtype), full and partial rotary, position offsets, the fused
//! KV-cache append, and errors.

use crate::common::*;
use ruda_ops::api::{self, OpError, RopeTable};
use ruda_runtime::{DType, Tensor};

/// Hugging Face's `inv_freq` and `cos`/`sin` for one position, written independently of the
/// library: `1.0 / (base ** (arange(0, dim, 2).float() / dim))` in f32, `freqs = inv_freq * pos`
/// in f32, `cos`/`sin` of that f32.
fn hf_cos_sin(theta: f32, rotary_dim: usize, pos: u32) -> (Vec<f32>, Vec<f32>) {
    (0..rotary_dim / 2)
        .map(|i| {
            let inv = 1.0f32 / (theta as f64).powf(((2 * i) as f32 / rotary_dim as f32) as f64) as f32;
            let freq = inv * pos as f32;
            ((freq as f64).cos() as f32, (freq as f64).sin() as f32)
        })
        .unzip()
}

/// `q * cos + rotate_half(q) * sin` with every tensor op rounded to `dtype`, as PyTorch does in
/// the model dtype; dimensions past `rotary_dim` pass through.
fn hf_rope(dtype: DType, x: &[f32], heads: usize, d: usize, rotary_dim: usize, cos: &[f32], sin: &[f32]) -> Vec<f32> {
    let r = |v: f32| round_to(dtype, v);
    let h = rotary_dim / 2;
    let mut out = x.to_vec();
    for head in x.chunks(d).zip(out.chunks_mut(d)).take(heads) {
        let (src, dst) = head;
        for i in 0..h {
            let (c, s) = (r(cos[i]), r(sin[i]));
            dst[i] = r(r(src[i] * c) + r(-src[i + h] * s));
            dst[i + h] = r(r(src[i + h] * c) + r(src[i] * s));
        }
    }
    out
}

#[test]
fn table_matches_hugging_face_formula() {
    let dev = device();
    for (theta, rotary_dim) in [(10000.0, 64), (1_000_000.0, 128)] {
        let table = RopeTable::new(&dev, theta, rotary_dim, 40).unwrap();
        assert_eq!(table.cos().shape(), &[40, rotary_dim / 2]);
        let (cos, sin) = (table.cos().to_f32_vec().unwrap(), table.sin().to_f32_vec().unwrap());
        for pos in [0u32, 1, 17, 39] {
            let (want_c, want_s) = hf_cos_sin(theta as f32, rotary_dim, pos);
            let row = pos as usize * rotary_dim / 2..(pos as usize + 1) * rotary_dim / 2;
            assert_bits(&format!("cos theta={theta} pos={pos}"), &cos[row.clone()], &want_c);
            assert_bits(&format!("sin theta={theta} pos={pos}"), &sin[row], &want_s);
        }
    }
}

#[test]
fn rope_matches_hugging_face_bit_for_bit() {
    let dev = device();
    let mut rng = Rng::new(21);
    let theta = 1_000_000.0;
    // (tokens, heads, head_dim, rotary_dim): full rotary at Qwen sizes, partial rotary, odd
    // head counts, a single token.
    for (t, heads, d, rotary_dim) in [(3, 2, 128, 128), (1, 1, 64, 64), (5, 3, 16, 8), (2, 7, 256, 64)] {
        let max_pos = 4096;
        let table = RopeTable::new(&dev, theta, rotary_dim, max_pos).unwrap();
        // Absolute positions with an offset, as in decode after a prompt.
        let positions: Vec<u32> = (0..t as u32).map(|i| 4000 + 17 * i).collect();
        let tp = Tensor::from_slice(&dev, &positions, &[t]).unwrap();
        for dtype in FLOAT_DTYPES {
            let x = quantize(dtype, &rng.vec(t * heads * d, -3.0, 3.0));
            let got = api::rope(&tensor(&dev, dtype, &x, &[t, heads, d]), &tp, &table).unwrap();
            assert_eq!((got.dtype(), got.shape()), (dtype, &[t, heads, d][..]));
            let got = got.to_f32_vec().unwrap();
            for (ti, pos) in positions.iter().enumerate() {
                let (cos, sin) = hf_cos_sin(theta as f32, rotary_dim, *pos);
                let span = ti * heads * d..(ti + 1) * heads * d;
                let want = hf_rope(dtype, &x[span.clone()], heads, d, rotary_dim, &cos, &sin);
                assert_bits(
                    &format!("rope {dtype} t={t} h={heads} d={d} r={rotary_dim} token {ti}"),
                    &got[span],
                    &want,
                );
            }
        }
    }
}

#[test]
fn positions_outside_the_table_give_nan_in_the_rotated_part() {
    let dev = device();
    let table = RopeTable::new(&dev, 10000.0, 4, 8).unwrap();
    let x = tensor(&dev, DType::F32, &[1.0; 2 * 8], &[2, 1, 8]);
    let tp = Tensor::from_slice(&dev, &[7u32, 8], &[2]).unwrap();
    let got = api::rope(&x, &tp, &table).unwrap().to_f32_vec().unwrap();
    assert!(got[..8].iter().all(|v| v.is_finite()), "position 7 is in the table: {got:?}");
    assert!(got[8..12].iter().all(|v| v.is_nan()), "position 8 is past the table: {got:?}");
    assert_eq!(&got[12..], &[1.0; 4], "pass-through dims are copied");
}

#[test]
fn kv_cache_append_rotates_k_and_copies_v_at_each_position() {
    let dev = device();
    let stream = dev.default_stream();
    let mut rng = Rng::new(22);
    let (batch, hkv, max_seq, d) = (3, 2, 6, 16);
    let table = RopeTable::new(&dev, 10000.0, d, max_seq).unwrap();
    for dtype in FLOAT_DTYPES {
        // Tokens go to (slot, position); the last two are out of range and write nothing.
        let placement: [(u32, u32); 5] = [(0, 0), (2, 5), (1, 3), (3, 0), (0, 6)];
        let t = placement.len();
        let k = quantize(dtype, &rng.vec(t * hkv * d, -2.0, 2.0));
        let v = quantize(dtype, &rng.vec(t * hkv * d, -2.0, 2.0));
        let cache_len = batch * hkv * max_seq * d;
        let k_cache = tensor(&dev, dtype, &vec![7.0; cache_len], &[batch, hkv, max_seq, d]);
        let v_cache = tensor(&dev, dtype, &vec![7.0; cache_len], &[batch, hkv, max_seq, d]);
        let slots: Vec<u32> = placement.iter().map(|p| p.0).collect();
        let positions: Vec<u32> = placement.iter().map(|p| p.1).collect();
        api::rope_kv_cache_into(
            &stream,
            &tensor(&dev, dtype, &k, &[t, hkv, d]),
            &tensor(&dev, dtype, &v, &[t, hkv, d]),
            &Tensor::from_slice(&dev, &positions, &[t]).unwrap(),
            &Tensor::from_slice(&dev, &slots, &[t]).unwrap(),
            &table,
            &k_cache,
            &v_cache,
        )
        .unwrap();
        let mut want_k = vec![7.0; cache_len];
        let mut want_v = vec![7.0; cache_len];
        for (ti, &(slot, pos)) in placement.iter().enumerate() {
            if slot as usize >= batch || pos as usize >= max_seq {
                continue;
            }
            let (cos, sin) = hf_cos_sin(10000.0, d, pos);
            let span = ti * hkv * d..(ti + 1) * hkv * d;
            let rotated = hf_rope(dtype, &k[span.clone()], hkv, d, d, &cos, &sin);
            for h in 0..hkv {
                let at = ((slot as usize * hkv + h) * max_seq + pos as usize) * d;
                want_k[at..at + d].copy_from_slice(&rotated[h * d..(h + 1) * d]);
                want_v[at..at + d].copy_from_slice(&v[span.start + h * d..span.start + (h + 1) * d]);
            }
        }
        assert_bits(&format!("k_cache {dtype}"), &k_cache.to_f32_vec().unwrap(), &want_k);
        assert_bits(&format!("v_cache {dtype}"), &v_cache.to_f32_vec().unwrap(), &want_v);
    }
}

#[test]
fn rope_errors_name_the_problem() {
    let dev = device();
    let stream = dev.default_stream();
    let table = RopeTable::new(&dev, 10000.0, 8, 16).unwrap();
    let x = tensor(&dev, DType::BF16, &[1.0; 2 * 3 * 8], &[2, 3, 8]);
    let pos = Tensor::from_slice(&dev, &[0u32, 1], &[2]).unwrap();
    let pos_i32 = Tensor::from_slice(&dev, &[0i32, 1], &[2]).unwrap();
    let pos_short = Tensor::from_slice(&dev, &[0u32], &[1]).unwrap();
    assert!(matches!(api::rope(&x, &pos_i32, &table), Err(OpError::DType { .. })));
    assert!(matches!(api::rope(&x, &pos_short, &table), Err(OpError::Shape { .. })));
    let narrow_heads = tensor(&dev, DType::BF16, &[1.0; 2 * 4], &[2, 1, 4]);
    let err = api::rope(&narrow_heads, &pos, &table).unwrap_err();
    assert!(err.to_string().contains("rotates 8 dimensions"), "{err}");
    assert!(RopeTable::new(&dev, 10000.0, 7, 16).is_err());
    assert!(RopeTable::new(&dev, -1.0, 8, 16).is_err());
    let out_f32 = Tensor::empty(&dev, DType::F32, &[2, 3, 8]).unwrap();
    assert!(matches!(api::rope_into(&stream, &x, &pos, &table, &out_f32), Err(OpError::DType { .. })));
    // A cache longer than the table could be written at positions the table lacks.
    let long_cache = Tensor::zeros(&dev, DType::BF16, &[1, 3, 32, 8]).unwrap();
    let err = api::rope_kv_cache_into(&stream, &x, &x.clone(), &pos, &pos, &table, &long_cache, &long_cache.clone())
        .unwrap_err();
    assert!(err.to_string().contains("table"), "{err}");
    let wrong_heads = Tensor::zeros(&dev, DType::BF16, &[1, 2, 16, 8]).unwrap();
    let err = api::rope_kv_cache_into(&stream, &x, &x.clone(), &pos, &pos, &table, &wrong_heads, &wrong_heads.clone())
        .unwrap_err();
    assert!(matches!(err, OpError::Shape { .. }), "{err}");
}
