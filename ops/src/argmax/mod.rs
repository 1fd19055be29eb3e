//! Argmax over the last axis into `u32` indices, in one pass or split with a reduction.
//! Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{argmax, argmax_reduce, ArgmaxConfig};

/// Argmax in one pass or split (family `argmax`) in every float dtype, and the reduction of
/// the split partials (family `argmax_reduce`, dtype-free).
pub struct Argmax;

impl Family for Argmax {
    fn names(&self) -> &'static [&'static str] {
        &["argmax", "argmax_reduce"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            for partial in [false, true] {
                let cfg = ArgmaxConfig { dtype, partial };
                out.push(Registered::new(cfg.id(), "argmax", Some(dtype), move || argmax(&cfg)));
            }
        }
        out.push(Registered::new(ArgmaxConfig::reduce_id(), "argmax_reduce", None, argmax_reduce));
        out
    }

    fn sample(&self, name: &str, id: &str) -> Option<Case> {
        let mut c = Case::new([3, 1, 1]);
        if name == "argmax_reduce" {
            c.scalars.insert("splits", 3);
            return Some(c);
        }
        let partial = id.contains("partial");
        c.scalars.extend([("cols", 700), ("cols_per_split", if partial { 256 } else { 700 })]);
        c.grid[1] = if partial { 3 } else { 1 };
        Some(c)
    }
}
