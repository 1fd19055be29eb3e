//! The norms of Qwen3.5's layers over rows whose length is a launch parameter: L2
//! normalisation (q and k of the gated delta rule), the zero-centred RMSNorm (`x̂ · (1 + w)`:
//! input, post-attention, final and q/k norms), alone or fused with the residual add before it,
//! and the gated RMSNorm of the linear-attention
//! output (`w · x̂ · silu(z)`). Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::{row_norm, RowNormConfig, RowNormKind, RowOwner};

/// Each norm (families `l2_norm`, `rms_norm_zero_centred`, `rms_norm_zero_centred_residual`,
/// `gated_rms_norm`) in every float dtype, with a warp or a block per row.
pub struct RowNorm;

const KINDS: [RowNormKind; 4] =
    [RowNormKind::L2, RowNormKind::ZeroCentred, RowNormKind::ZeroCentredResidual, RowNormKind::Gated];

impl Family for RowNorm {
    fn names(&self) -> &'static [&'static str] {
        &["l2_norm", "rms_norm_zero_centred", "rms_norm_zero_centred_residual", "gated_rms_norm"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for kind in KINDS {
            for dtype in FLOAT_DTYPES {
                for owner in [RowOwner::Warp, RowOwner::Block] {
                    let cfg = RowNormConfig { kind, dtype, owner };
                    out.push(Registered::new(cfg.id(), kind.name(), Some(dtype), move || row_norm(&cfg)));
                }
            }
        }
        out
    }

    /// Warp rows: 20 rows of 100 (three blocks, the last partly idle), `x`'s 200 apart (a view
    /// of the first halves of a projection); block rows: 3 rows of 1500, dense.
    fn sample(&self, _: &str, id: &str) -> Option<Case> {
        let block = id.ends_with(".block");
        let mut c = Case::new([3, 1, 1]);
        let (rows, cols, x_stride) = if block { (3, 1500, 1500) } else { (20, 100, 200) };
        c.scalars.extend([("rows", rows), ("cols", cols), ("x_stride", x_stride)]);
        c.scalars.insert("eps", crate::problem::f32_bits(1e-6));
        Some(c)
    }
}
