//! The norms around Qwen3.5's gated DeltaNet, over rows of a length known only at launch (head
//! dims and hidden sizes alike, so one configuration serves every model):
//!
//! ```text
//! l2_norm:                out = x · (1 / sqrt(Σx² + eps))
//! rms_norm_zero_centred:  out = x · (1 / sqrt(mean(x²) + eps)) · (1 + w)
//!   with the residual:    r = round(x + residual) (stored); then the same over r
//! gated_rms_norm:         out = w · (x · (1 / sqrt(mean(x²) + eps))) · silu(z)
//! ```
//!
//! Statistics and products in `f32`, the result rounded once to the input dtype; `w` is `f32`.
//! `x`'s rows may be evenly strided (the query halves of a `[T, H, 2·D]` projection, read in
//! place); every other tensor is dense.
//! `1 / sqrt` is two correctly rounded steps, so every engine agrees bit for bit. A row is
//! either one warp's (eight rows per block, shuffles only: head-sized rows, many of them) or one
//! block's (hidden-sized rows, few of them at decode).

use ruda_ir::{Kernel, KernelBuilder, ScalarType, VerifyError};

use crate::blocks::{block_reduce, load_f32, round_to, row_ptr, silu, store_from_f32, warp_reduce, Combine};

/// Threads per block of every row-norm kernel.
pub const ROW_NORM_THREADS: u32 = 256;
/// Rows per block when a warp owns a row.
pub const ROWS_PER_WARP_BLOCK: u32 = ROW_NORM_THREADS / 32;

/// Which norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowNormKind {
    /// `x / ‖x‖` (no weight, `eps` inside the root of the plain sum).
    L2,
    /// Qwen3.5's RMSNorm with the weight stored as an offset from one.
    ZeroCentred,
    /// [`RowNormKind::ZeroCentred`] after the residual add (Qwen3.5's decoder layers):
    /// `r = round(x + residual)` is stored and normalised.
    ZeroCentredResidual,
    /// RMSNorm times `w`, gated by `silu(z)` (Qwen3.5's `RMSNormGated`).
    Gated,
}

impl RowNormKind {
    /// The family name.
    pub fn name(self) -> &'static str {
        match self {
            RowNormKind::L2 => "l2_norm",
            RowNormKind::ZeroCentred => "rms_norm_zero_centred",
            RowNormKind::ZeroCentredResidual => "rms_norm_zero_centred_residual",
            RowNormKind::Gated => "gated_rms_norm",
        }
    }
}

/// Who owns a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowOwner {
    Warp,
    Block,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowNormConfig {
    pub kind: RowNormKind,
    pub dtype: ScalarType,
    pub owner: RowOwner,
}

impl RowNormConfig {
    /// `gated_rms_norm.bf16.warp`.
    pub fn id(&self) -> String {
        let owner = match self.owner {
            RowOwner::Warp => "warp",
            RowOwner::Block => "block",
        };
        format!("{}.{}.{owner}", self.kind.name(), self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`row_norm`], in order (`z` only for the gated norm, `weight` for the
    /// RMSNorms, `residual` and `residual_out` with the residual add).
    pub struct RowNormParams, RowNormValues for RowNormConfig as cfg {
        x: tensor(cfg.dtype),
        residual: opt_tensor(cfg.dtype, cfg.kind == RowNormKind::ZeroCentredResidual),
        z: opt_tensor(cfg.dtype, cfg.kind == RowNormKind::Gated),
        weight: opt_tensor(ScalarType::F32, cfg.kind != RowNormKind::L2),
        out: tensor(cfg.dtype),
        residual_out: opt_tensor(cfg.dtype, cfg.kind == RowNormKind::ZeroCentredResidual),
        rows: scalar(u32),
        cols: scalar(u32),
        x_stride: scalar(u32),
        eps: scalar(f32),
    }
}

/// Parameters: x `[rows, cols]`, residual (residual add), z (gated), weight (`f32 [cols]`,
/// RMSNorms), out, residual_out (residual add), rows, cols, x_stride (elements from one row of
/// `x` to the next: `x` may be a view), eps. Grid: `ceil(rows / 8)` blocks
/// of [`ROW_NORM_THREADS`] when a warp owns a row, `rows` blocks when a block does. Each thread
/// re-reads only what it read (or wrote to `residual_out`) itself, so on CUDA `out` may alias
/// `x`, and `residual_out` may alias `residual` or `x`.
pub fn row_norm(cfg: &RowNormConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let RowNormValues { x, residual, z, weight, out, residual_out, rows, cols, x_stride, eps } =
        RowNormParams::declare(&mut b, cfg);
    b.launch_bounds(ROW_NORM_THREADS, None);
    let (row, first, step) = match cfg.owner {
        RowOwner::Warp => {
            let block = b.block_id_x();
            let per_block = b.const_u32(ROWS_PER_WARP_BLOCK);
            let tid = b.thread_id_x();
            let c32 = b.const_u32(32);
            let warp = b.div(tid, c32);
            let row = b.fma(block, per_block, warp);
            (row, b.lane_id(), c32)
        }
        RowOwner::Block => {
            let row = b.block_id_x();
            let tid = b.thread_id_x();
            (row, tid, b.const_u32(ROW_NORM_THREADS))
        }
    };
    let scratch =
        (cfg.owner == RowOwner::Block).then(|| b.shared_array("partials", ScalarType::F32, ROW_NORM_THREADS / 32));
    let body = |b: &mut KernelBuilder| {
        let x_row = row_ptr(b, x, row, x_stride);
        let out_row = row_ptr(b, out, row, cols);
        let z_row = z.map(|z| row_ptr(b, z, row, cols));
        let sums = residual.zip(residual_out).map(|(r, s)| (row_ptr(b, r, row, cols), row_ptr(b, s, row, cols)));
        // The row normalised: `x`, or the rounded sum stored in `residual_out`.
        let norm_row = sums.map_or(x_row, |(_, s)| s);
        let zero = b.const_f32(0.0);
        let partial = b.for_range(first, cols, step, &[zero], |b, j, acc| {
            let v = load_f32(b, x_row, j);
            let v = match sums {
                Some((r_row, s_row)) => {
                    let r = load_f32(b, r_row, j);
                    let s = b.add(v, r);
                    let s = round_to(b, cfg.dtype, s);
                    store_from_f32(b, s_row, j, s);
                    s
                }
                None => v,
            };
            vec![b.fma(v, v, acc[0])]
        })[0];
        let sum_sq = match scratch {
            Some(s) => block_reduce(b, Combine::Sum, partial, ROW_NORM_THREADS, s),
            None => warp_reduce(b, Combine::Sum, partial),
        };
        let stat = match cfg.kind {
            RowNormKind::L2 => sum_sq,
            RowNormKind::ZeroCentred | RowNormKind::ZeroCentredResidual | RowNormKind::Gated => {
                let n = b.cvt(cols, ScalarType::F32);
                b.div(sum_sq, n)
            }
        };
        let stat_eps = b.add(stat, eps);
        let root = b.sqrt(stat_eps);
        let scale = b.rcp(root);
        b.for_each(first, cols, step, |b, j| {
            let v = load_f32(b, norm_row, j);
            let y = b.mul(v, scale);
            let y = match (weight, z_row) {
                (Some(w), Some(z_row)) => {
                    let w = load_f32(b, w, j);
                    let y = b.mul(w, y);
                    let zv = load_f32(b, z_row, j);
                    let s = silu(b, zv);
                    b.mul(y, s)
                }
                (Some(w), None) => {
                    let w = load_f32(b, w, j);
                    let one = b.const_f32(1.0);
                    let w1 = b.add(one, w);
                    b.mul(y, w1)
                }
                (None, _) => y,
            };
            store_from_f32(b, out_row, j, y);
        });
    };
    match cfg.owner {
        // The whole warp takes the same branch, so its shuffles see every lane.
        RowOwner::Warp => {
            let in_range = b.lt(row, rows);
            b.if_then(in_range, body);
        }
        // One block per row: always in range, and the block's barriers stay uniform.
        RowOwner::Block => body(&mut b),
    }
    b.finish()
}
