//! AWQ: 4-bit weights in AutoAWQ's GEMM layout (`qweight`, `qzeros`, `scales`), multiplied
//! without a dense copy for decode-sized inputs (a GEMV that reads the packed words once) and
//! dequantised to a dense weight for the tensor-core GEMM beyond. Builders in [`kernel`], entry
//! points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::{id_number, Case};
use crate::registry::Registered;
use kernel::{awq_dequantize, awq_gemv, AwqDequantizeConfig, AwqGemvConfig, AWQ_GEMV_M_TILES};

/// The AWQ GEMV (family `awq_gemv`) for each row tile, with and without a bias, and the
/// dequantisation to a dense weight (family `awq_dequantize`), in every float dtype.
pub struct Awq;

impl Family for Awq {
    fn names(&self) -> &'static [&'static str] {
        &["awq_gemv", "awq_dequantize"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            for m_tile in AWQ_GEMV_M_TILES {
                for bias in [false, true] {
                    let cfg = AwqGemvConfig { dtype, m_tile, bias };
                    out.push(Registered::new(cfg.id(), "awq_gemv", Some(dtype), move || awq_gemv(&cfg)));
                }
            }
            let cfg = AwqDequantizeConfig { dtype };
            out.push(Registered::new(cfg.id(), "awq_dequantize", Some(dtype), move || awq_dequantize(&cfg)));
        }
        out
    }

    /// 15 words (the second block's columns partly past `N`), groups of 16 or 32, and `K` a
    /// tile and a half for the dequantisation.
    fn sample(&self, name: &str, id: &str) -> Option<Case> {
        if name == "awq_dequantize" {
            let mut c = Case::new([3, 1, 1]);
            c.scalars.extend([("n", 120), ("k", 80), ("group_size", 16)]);
            return Some(c);
        }
        let m_tile = id_number(id, 'm')? as u64;
        let (m, row_blocks) = if m_tile == 1 { (2, 2) } else { (5, 1) };
        let mut c = Case::new([2, row_blocks, 1]);
        c.scalars.extend([("m", m), ("n", 120), ("k", 96), ("group_size", 32)]);
        Some(c)
    }
}
