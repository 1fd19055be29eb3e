//! Elementwise ops (`add`, `mul`, `silu`), dtype casts and the bias add: one thread per
//! element (or 16-byte unit for the bias), arithmetic in `f32`, the result rounded to the output
//! dtype (nearest even). Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;

use ruda_ir::ScalarType::{BF16, F16, F32};

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{add_bias, elementwise, BiasConfig, ElementwiseConfig, ElementwiseOp};

/// `add`, `mul`, `silu` in every float dtype (family `elementwise`) and the casts between them
/// (family `cast`).
pub struct Elementwise;

impl Family for Elementwise {
    fn names(&self) -> &'static [&'static str] {
        &["elementwise", "cast"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for op in [ElementwiseOp::Add, ElementwiseOp::Mul, ElementwiseOp::Silu] {
            for dtype in FLOAT_DTYPES {
                let cfg = ElementwiseConfig { op, input: dtype, output: dtype };
                out.push(Registered::new(cfg.id(), "elementwise", Some(dtype), move || elementwise(&cfg)));
            }
        }
        for (from, to) in [(F32, F16), (F32, BF16), (F16, F32), (BF16, F32), (F16, BF16), (BF16, F16)] {
            let cfg = ElementwiseConfig { op: ElementwiseOp::Cast, input: from, output: to };
            out.push(Registered::new(cfg.id(), "cast", Some(from), move || elementwise(&cfg)));
        }
        out
    }

    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([3, 1, 1]);
        c.scalars.insert("n", 700);
        c.specials = true;
        Some(c)
    }
}

/// The row-broadcast bias add (family `add_bias`; Qwen2's projection biases), with 16-byte
/// vector accesses or scalar ones.
pub struct AddBias;

impl Family for AddBias {
    fn names(&self) -> &'static [&'static str] {
        &["add_bias"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            for vector in [true, false] {
                let cfg = BiasConfig { dtype, vector };
                out.push(Registered::new(cfg.id(), "add_bias", Some(dtype), move || add_bias(&cfg)));
            }
        }
        out
    }

    fn sample(&self, _: &str, id: &str) -> Option<Case> {
        // Rows of 520 elements (whole 16-byte units in every dtype), five rows over two block
        // rows.
        let per_thread = if id.contains("scalar") {
            1
        } else if id.contains("f32") {
            4
        } else {
            8
        };
        let mut c = Case::new([3, 2, 1]);
        c.scalars.extend([("units", 520 / per_thread), ("rows", 5)]);
        Some(c)
    }
}
