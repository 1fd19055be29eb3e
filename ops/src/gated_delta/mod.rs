//! The gated delta rule (Gated DeltaNet, the linear attention of Qwen3-Next and Qwen3.5): a
//! `[K, V]` state per value head, decayed, corrected toward each value and read by each query.
//! Builders in [`kernel`], entry points in [`api`].
//!
//! Per value head, with `g = log_decay` and `S` in `f32` (`[K, V]`), for each token:
//!
//! ```text
//! S ← e^g · S
//! d = β · (v − Sᵀ k)
//! S ← S + k · dᵀ
//! o = Sᵀ (q · query_scale)
//! ```
//!
//! as Hugging Face `transformers`' `torch_recurrent_gated_delta_rule` (all in `f32`; the
//! output rounded once to the query's dtype). Key heads may divide value heads: value head `j`
//! reads key head `j / (Hv / Hk)`. [`api::gated_delta_rule`] runs it token by token;
//! [`api::chunk_gated_delta_rule`] computes the same by chunks in the WY representation
//! (`torch_chunk_gated_delta_rule`): within a chunk, `(I + A)⁻¹` by forward substitution in
//! shared memory, then the chunk's outputs and the state passed to the next chunk. Both keep
//! the state in shared memory and split V across blocks (each block owns a 32-column tile of
//! every state), so K = V = 128 runs in 16 KiB of state per block.
//!
//! Left for speed (both kernels are written to be right first): one warp per block; `q`/`k`
//! rows read from global memory by every thread instead of staged in shared memory or
//! registers; the chunk's `k kᵀ` and `q kᵀ` recomputed by every V tile and with scalar `f32`
//! FMAs instead of tensor cores; the forward substitution one barrier per row; the workspace in
//! static shared memory, so chunks whose workspace, state tile and corrected values pass 48 KiB
//! are refused even where a device could opt in to more.
//!
//! The `_varlen` forms take packed sequences (`[total, H, ·]` cut by `cu_seqlens`), one state
//! per sequence. The `_slots_into` forms keep the states in a pool `[slots, Hv, K, V]`, sequence
//! `n` reading and updating slot `state_slots[n]` in place, and neither allocate nor
//! synchronise (a decode step captured in a graph): [`api::gated_delta_rule_slots_into`] one
//! token per sequence, [`api::chunk_gated_delta_rule_varlen_slots_into`] packed prefill chunks
//! with `cu_seqlens` known on the host.

pub mod api;
pub mod kernel;

use ruda_ir::ScalarType;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::{id_number, Case};
use crate::registry::Registered;
use kernel::{gated_delta, gated_delta_chunk, GatedDeltaConfig};

/// The chunk size of the registered chunked configurations (the API builds any other on
/// demand).
pub const REGISTERED_CHUNK: u32 = 64;

/// Head dims `(K, V)` of the registered configurations: Qwen3.5's 128, 64, and an awkward pair
/// (neither a power of two, K ≠ V, V not a multiple of the tile).
pub const HEAD_DIMS: [(u32, u32); 3] = [(128, 128), (64, 64), (24, 40)];

/// Token-by-token (family `gated_delta`) and chunked (family `gated_delta_chunk`) gated delta
/// rule, and their packed forms (`gated_delta_varlen`, `gated_delta_chunk_varlen`).
pub struct GatedDelta;

impl Family for GatedDelta {
    fn names(&self) -> &'static [&'static str] {
        &[
            "gated_delta",
            "gated_delta_chunk",
            "gated_delta_varlen",
            "gated_delta_chunk_varlen",
            "gated_delta_slots",
            "gated_delta_chunk_varlen_slots",
        ]
    }

    /// Dense in every dtype with gates in it or in `f32`; packed with `f32` gates (the model's).
    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            let gates: &[ScalarType] =
                if dtype == ScalarType::F32 { &[ScalarType::F32] } else { &[dtype, ScalarType::F32] };
            for packed in [false, true] {
                for &gate_dtype in gates.iter().filter(|&&g| !packed || g == ScalarType::F32) {
                    for (k_dim, v_dim) in HEAD_DIMS {
                        let cfg = GatedDeltaConfig { dtype, gate_dtype, k_dim, v_dim, packed, slots: false };
                        let (rec, chunk) = if packed {
                            ("gated_delta_varlen", "gated_delta_chunk_varlen")
                        } else {
                            ("gated_delta", "gated_delta_chunk")
                        };
                        out.push(Registered::new(cfg.id(), rec, Some(dtype), move || gated_delta(&cfg)));
                        out.push(Registered::new(cfg.chunk_id(REGISTERED_CHUNK), chunk, Some(dtype), move || {
                            gated_delta_chunk(&cfg, REGISTERED_CHUNK)
                        }));
                        // Over a state pool, with the model's f32 gates: decode (dense, one
                        // token) and chunked prefill (packed).
                        if gate_dtype == ScalarType::F32 {
                            let cfg = GatedDeltaConfig { slots: true, ..cfg };
                            if packed {
                                out.push(Registered::new(
                                    cfg.chunk_id(REGISTERED_CHUNK),
                                    "gated_delta_chunk_varlen_slots",
                                    Some(dtype),
                                    move || gated_delta_chunk(&cfg, REGISTERED_CHUNK),
                                ));
                            } else {
                                out.push(Registered::new(cfg.id(), "gated_delta_slots", Some(dtype), move || {
                                    gated_delta(&cfg)
                                }));
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Two value heads on one key head; dense one sequence, packed two of different lengths.
    /// The chunked kernels get a full chunk and a padded one. Over a pool: two sequences on
    /// slots 1 and 0 of two (decode one token each).
    fn sample(&self, name: &str, id: &str) -> Option<Case> {
        let v_dim = id_number(id, 'v')?;
        let chunked = name.starts_with("gated_delta_chunk");
        let seq_len = if chunked { REGISTERED_CHUNK + 6 } else { 9 };
        let slots = name.ends_with("_slots");
        let packed = name.contains("_varlen");
        let seq_len = if slots && !packed { 1 } else { seq_len };
        let mut c = Case::new([v_dim.div_ceil(kernel::V_TILE), 2, if packed || slots { 2 } else { 1 }]);
        c.scalars.extend([("key_heads", 1), ("value_heads", 2), ("seq_len", seq_len as u64)]);
        if packed {
            c.indices.insert("cu_seqlens", vec![0, seq_len, seq_len + 5]);
        }
        if slots {
            c.scalars.insert("pool_slots", 2);
            c.indices.insert("state_slots", vec![1, 0]);
        }
        Some(c)
    }
}
