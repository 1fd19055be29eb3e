//! Row reductions (sum, max) and softmax over the last axis of a `[rows, cols]` tensor, one block
//! per row, statistics in `f32` whatever the input dtype. Builders in [`kernel`], entry points in
//! [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{row_reduce, softmax, RowReduceConfig, RowReduceOp, SoftmaxConfig};

/// Row sums and maxima (family `reduce`) and softmax (family `softmax`) in every float dtype.
pub struct Rows;

impl Family for Rows {
    fn names(&self) -> &'static [&'static str] {
        &["reduce", "softmax"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for op in [RowReduceOp::Sum, RowReduceOp::Max] {
            for dtype in FLOAT_DTYPES {
                let cfg = RowReduceConfig { op, dtype };
                out.push(Registered::new(cfg.id(), "reduce", Some(dtype), move || row_reduce(&cfg)));
            }
        }
        for dtype in FLOAT_DTYPES {
            let cfg = SoftmaxConfig { dtype };
            out.push(Registered::new(cfg.id(), "softmax", Some(dtype), move || softmax(&cfg)));
        }
        out
    }

    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([3, 1, 1]);
        c.scalars.insert("cols", 300);
        Some(c)
    }
}
