//! GEMV / skinny GEMM for decode: `y[M, N] = x[M, K] · W[N, K]ᵀ` with `M ≤ 16`, accumulated in
//! `f32`, with an optional split-K (and its reduction) for narrow outputs. Builders in
//! [`kernel`], entry points in [`api`], the tuned split count in [`tune`].

pub mod api;
pub mod kernel;
pub mod tune;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::{id_number, Case};
use crate::registry::Registered;
use kernel::{gemv, gemv_reduce, GemvConfig, GemvLoads, GemvReduceConfig, GEMV_M_TILES};

/// The decode GEMV (family `gemv`) for every row tile with vector loads, with and without
/// split-K; the scalar-load fallback at 1 and 16 rows; the biased variant of Qwen2's q/k/v
/// projections; and the split-K reduction with and without bias (family `gemv_reduce`).
pub struct Gemv;

impl Family for Gemv {
    fn names(&self) -> &'static [&'static str] {
        &["gemv", "gemv_reduce"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            let mut push =
                |cfg: GemvConfig| out.push(Registered::new(cfg.id(), "gemv", Some(dtype), move || gemv(&cfg)));
            for m_tile in GEMV_M_TILES {
                for split_k in [false, true] {
                    push(GemvConfig { dtype, m_tile, loads: GemvLoads::Vector, split_k, bias: false });
                }
            }
            for m_tile in [1, 16] {
                push(GemvConfig { dtype, m_tile, loads: GemvLoads::Scalar, split_k: false, bias: false });
            }
            // The bias in the store; with split-K it is added in the reduction.
            push(GemvConfig { dtype, m_tile: 1, loads: GemvLoads::Vector, split_k: false, bias: true });
            for bias in [false, true] {
                let cfg = GemvReduceConfig { dtype, bias };
                out.push(Registered::new(cfg.id(), "gemv_reduce", Some(dtype), move || gemv_reduce(&cfg)));
            }
        }
        out
    }

    fn sample(&self, name: &str, id: &str) -> Option<Case> {
        if name == "gemv_reduce" {
            let mut c = Case::new([2, 1, 1]);
            c.scalars.extend([("len", 300), ("splits", 3), ("n", 10)]);
            return Some(c);
        }
        let m_tile = id_number(id, 'm')? as u64;
        let split = id.contains("splitk");
        let (k, per_split) = if id.contains("scalar") {
            (77, 96)
        } else if split {
            (512, 32)
        } else {
            (512, 256)
        };
        let mut c = Case::new([3, if split { 2 } else { 1 }, 1]);
        c.scalars.extend([
            ("m", m_tile.saturating_sub(1).max(1)),
            ("n", 10),
            ("k", k),
            ("chunks_per_split", per_split),
        ]);
        Some(c)
    }
}
