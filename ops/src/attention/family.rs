//! The attention families' [`Family`]: flash prefill (every dtype, head dim, causal or not; packed with or
//! without mask and bias, or over a KV cache), split-KV decode with its combine, and the
//! fallback's f32 masked softmax.

use ruda_ir::ScalarType;
use ruda_runtime::DType;

use super::kernels::{
    attention_decode, attention_decode_combine, attention_prefill, attention_softmax, head_dims_of_id,
    AttentionDecodeConfig, AttentionPrefillConfig, AttentionSoftmaxConfig, KvSource, FLASH_GENERAL_HEAD_DIMS,
    FLASH_HEAD_DIMS,
};
use crate::blocks::FLOAT_DTYPES;
use crate::family::{Family, ShapeLine};
use crate::problem::Case;
use crate::registry::Registered;
use crate::tune::{DecodeShape, TuneShape};

/// Families `attention_prefill`, `attention_decode` and `attention_fallback`.
pub struct Attention;

impl Family for Attention {
    fn names(&self) -> &'static [&'static str] {
        &["attention_prefill", "attention_decode", "attention_fallback"]
    }

    fn configs(&self) -> Vec<Registered> {
        // Every dtype at the common head dims, then the general path's head dims (f32: the
        // dtypes share its code), then the fallback's f32 masked softmax.
        let mut out = Vec::new();
        let variants = [(false, KvSource::Packed), (true, KvSource::Packed), (false, KvSource::Cache)];
        let prefill = |out: &mut Vec<Registered>, dtype, (head_dim, v_head_dim)| {
            for causal in [false, true] {
                for (masked, kv) in variants {
                    let cfg = AttentionPrefillConfig { dtype, head_dim, v_head_dim, causal, masked, kv };
                    out.push(Registered::new(cfg.id(), "attention_prefill", Some(dtype), move || {
                        attention_prefill(&cfg)
                    }));
                }
            }
        };
        let decode = |out: &mut Vec<Registered>, dtype, (head_dim, v_head_dim)| {
            let cfg = AttentionDecodeConfig { dtype, head_dim, v_head_dim };
            out.push(Registered::new(cfg.id(), "attention_decode", Some(dtype), move || attention_decode(&cfg)));
            out.push(Registered::new(cfg.combine_id(), "attention_decode", Some(dtype), move || {
                attention_decode_combine(&cfg)
            }));
        };
        for dtype in FLOAT_DTYPES {
            for d in FLASH_HEAD_DIMS {
                prefill(&mut out, dtype, (d, d));
            }
        }
        for dtype in FLOAT_DTYPES {
            for d in FLASH_HEAD_DIMS {
                decode(&mut out, dtype, (d, d));
            }
        }
        for dims in FLASH_GENERAL_HEAD_DIMS {
            prefill(&mut out, ScalarType::F32, dims);
            decode(&mut out, ScalarType::F32, dims);
        }
        for causal in [false, true] {
            for masked in [false, true] {
                let cfg = AttentionSoftmaxConfig { causal, masked };
                out.push(Registered::new(cfg.id(), "attention_fallback", None, move || attention_softmax(&cfg)));
            }
        }
        out
    }

    fn sample(&self, name: &str, id: &str) -> Option<Case> {
        let mut c = Case::new([3, 1, 1]);
        let s = &mut c.scalars;
        match name {
            "attention_prefill" => {
                // Two sequences of 5 and 12 queries over 9 and 21 keys, two heads, group 1,
                // token-major `[tokens, heads, d]` layouts (`[tokens, heads, dv]` for v and out).
                let (d, dv) = head_dims_of_id(id)?;
                let (d, dv) = (d as u64, dv as u64);
                c.indices.insert("cu_q", vec![0, 5, 17]);
                c.indices.insert("cu_k", vec![0, 9, 30]);
                // The KV-cache variant's key counts.
                c.indices.insert("seq_lens", vec![9, 21]);
                s.extend([("total_q", 17), ("total_k", 30), ("group", 1)]);
                s.extend([
                    ("q_token", 2 * d),
                    ("q_head", d),
                    ("q_batch", 0),
                    ("k_token", 2 * d),
                    ("k_head", d),
                    ("k_batch", 0),
                ]);
                s.extend([("v_token", 2 * dv), ("v_head", dv), ("v_batch", 0)]);
                s.extend([("o_token", 2 * dv), ("o_head", dv), ("o_batch", 0)]);
                s.extend([("mask_batch", 0), ("mask_head", 0), ("mask_query", 32), ("mask_key", 1)]);
                s.extend([("bias_batch", 0), ("bias_head", 0), ("bias_query", 32), ("bias_key", 1)]);
                c.grid = [1, 2, 2];
            }
            "attention_decode" if id.contains("combine") => {
                s.insert("splits", 2);
                c.grid = [4, 1, 1];
            }
            "attention_decode" => {
                // Two sequences, two KV heads: a cache of 64 positions, fewer past head dim 256
                // so that it fits the buffers (in f32).
                let (d, dv) = head_dims_of_id(id)?;
                let s_max = (16384 / d.max(dv)).min(64);
                c.indices.insert("seq_lens", vec![s_max * 37 / 64, s_max]);
                s.extend([("s_max", s_max as u64), ("kv_heads", 2), ("group", 2), ("split_len", s_max as u64 / 2)]);
                c.grid = [2, 2, 2];
            }
            _ => {
                s.extend([("q_len", 5), ("kv_len", 37), ("batch", 1), ("head", 1)]);
                s.extend([("mask_batch", 64), ("mask_head", 0), ("mask_query", 40), ("mask_key", 1)]);
                s.extend([("bias_batch", 64), ("bias_head", 0), ("bias_query", 40), ("bias_key", 1)]);
                c.grid = [5, 1, 1];
            }
        }
        Some(c)
    }

    fn shape_lines(&self) -> &'static [ShapeLine] {
        &[ShapeLine {
            op: "attention_decode",
            dims: &["batch", "q_heads", "kv_heads", "head_dim", "s_max"],
            format: "`attention_decode DTYPE batch=B q_heads=H kv_heads=G head_dim=D s_max=S` (H a multiple of G; D \
                     1 to 1024; S the KV cache capacity)",
            parse: decode_shape,
        }]
    }
}

fn decode_shape(dtype: DType, dims: &[usize]) -> Result<TuneShape, String> {
    let &[batch, q_heads, kv_heads, head_dim, s_max] = dims else {
        return Err(format!("expected 5 dimensions, got {}", dims.len()));
    };
    let s = DecodeShape { dtype, batch, q_heads, kv_heads, head_dim, s_max };
    s.check()?;
    Ok(TuneShape::AttentionDecode(s))
}
