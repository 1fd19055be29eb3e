//! The attention families' [`Family`], a thin adapter over the attention code where it is today
//! (`kernels/attention.rs`, `api/attention.rs`, `tune/attention.rs`) until attention moves into
//! a folder of its own: flash prefill (every dtype, head dim, causal or not; packed with or
//! without mask and bias, or over a KV cache), split-KV decode with its combine, and the
//! fallback's f32 masked softmax.

use ruda_runtime::DType;

use crate::blocks::FLOAT_DTYPES;
use crate::family::{Family, ShapeLine};
use crate::kernels::attention::{
    attention_decode, attention_decode_combine, attention_prefill, attention_softmax, AttentionDecodeConfig,
    AttentionPrefillConfig, AttentionSoftmaxConfig, KvSource, FLASH_HEAD_DIMS,
};
use crate::problem::{id_number, Case};
use crate::registry::Registered;
use crate::tune::{DecodeShape, TuneShape};

/// Families `attention_prefill`, `attention_decode` and `attention_fallback`.
pub struct Attention;

impl Family for Attention {
    fn names(&self) -> &'static [&'static str] {
        &["attention_prefill", "attention_decode", "attention_fallback"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            for head_dim in FLASH_HEAD_DIMS {
                for causal in [false, true] {
                    for (masked, kv) in [(false, KvSource::Packed), (true, KvSource::Packed), (false, KvSource::Cache)]
                    {
                        let cfg = AttentionPrefillConfig { dtype, head_dim, causal, masked, kv };
                        out.push(Registered::new(cfg.id(), "attention_prefill", Some(dtype), move || {
                            attention_prefill(&cfg)
                        }));
                    }
                }
            }
        }
        for dtype in FLOAT_DTYPES {
            for head_dim in FLASH_HEAD_DIMS {
                let cfg = AttentionDecodeConfig { dtype, head_dim };
                out.push(Registered::new(cfg.id(), "attention_decode", Some(dtype), move || attention_decode(&cfg)));
                out.push(Registered::new(cfg.combine_id(), "attention_decode", Some(dtype), move || {
                    attention_decode_combine(&cfg)
                }));
            }
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
                // token-major `[tokens, heads, d]` layouts.
                let d = id_number(id, 'd')? as u64;
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
                s.extend([("mask_batch", 0), ("mask_head", 0), ("mask_query", 32), ("mask_key", 1)]);
                s.extend([("bias_batch", 0), ("bias_head", 0), ("bias_query", 32), ("bias_key", 1)]);
                c.grid = [1, 2, 2];
            }
            "attention_decode" if id.contains("combine") => {
                s.insert("splits", 2);
                c.grid = [4, 1, 1];
            }
            "attention_decode" => {
                c.indices.insert("seq_lens", vec![37, 64]);
                s.extend([("s_max", 64), ("kv_heads", 2), ("group", 2), ("split_len", 32)]);
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
                     64, 128 or 256; S the KV cache capacity)",
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
