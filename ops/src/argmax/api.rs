//! Argmax over the last axis.

use ruda_runtime::{DType, Device, LaunchConfig, Stream, Tensor};

use super::kernel::{ArgmaxConfig, ArgmaxParams, ArgmaxReduceParams, ARGMAX_REDUCE_THREADS, ARGMAX_THREADS};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// Fewest columns per split: less work per block than this is not worth a second launch.
const MIN_COLS_PER_SPLIT: usize = 2048;
/// Most splits per row.
const MAX_SPLITS: usize = 256;

/// The shape without its last axis (`[n]` → `[1]`).
fn reduced_shape(t: &Tensor) -> Vec<usize> {
    match &t.shape()[..t.rank().saturating_sub(1)] {
        [] => vec![1],
        s => s.to_vec(),
    }
}

/// How many blocks [`argmax_into`] splits each row into on `device` when given a workspace:
/// enough to give every SM two blocks (eight blocks on the CPU device, one per interpreter
/// thread or so), at least 2048 columns each; 1 when the rows alone fill the device.
pub fn argmax_splits(device: &Device, rows: usize, cols: usize) -> usize {
    let target = device.cuda_info().map_or(8, |i| 2 * i.multiprocessor_count as usize);
    if rows >= target {
        return 1;
    }
    target.div_ceil(rows.max(1)).min(cols.div_ceil(MIN_COLS_PER_SPLIT)).clamp(1, MAX_SPLITS)
}

/// `u64` elements of workspace [`argmax_into`] uses for `rows × cols` on `device` (0: none).
pub fn argmax_workspace_len(device: &Device, rows: usize, cols: usize) -> usize {
    match argmax_splits(device, rows, cols) {
        1 => 0,
        s => s * rows,
    }
}

/// Index of the maximum along the last axis into `out` (`u32`, the input's shape without its last
/// axis; `[1]` for a 1-D input), with `torch.argmax`'s rules: ties go to the lowest index, the
/// first NaN wins over any number, `-0.0 == +0.0`. With a `workspace` (`u64`, at least
/// [`argmax_workspace_len`] elements) and few rows, each row is split over several blocks and a
/// second kernel combines them ([`argmax_splits`]; a smaller workspace lowers the split count).
/// The result does not depend on the split.
pub fn argmax_into(stream: &Stream, x: &Tensor, out: &Tensor, workspace: Option<&Tensor>) -> Result<()> {
    let name = "argmax";
    let dtype = float_dtype(name, x)?;
    contiguous_nonempty(name, "input", x)?;
    expect_tensor(name, "out", out, DType::U32, &reduced_shape(x))?;
    same_device(name, stream, &[("input", x), ("out", out)])?;
    let (rows, cols) = rows_cols(name, x)?;
    let mut splits = argmax_splits(stream.device(), rows as usize, cols as usize);
    if let Some(ws) = workspace {
        expect_dtype(name, "workspace", ws, DType::U64)?;
        if !ws.is_contiguous() {
            return Err(OpError::InvalidArgument { op: name, message: "`workspace` must be contiguous".into() });
        }
        same_device(name, stream, &[("workspace", ws)])?;
        splits = splits.min(ws.numel() / rows as usize);
    } else {
        splits = 1;
    }
    let per_split = (cols as usize).div_ceil(splits.max(1)) as u32;
    let splits = cols.div_ceil(per_split);
    let grid = [rows, splits, 1];
    let block = [ARGMAX_THREADS, 1, 1];
    let cfg = ArgmaxConfig { dtype, partial: splits > 1 };
    let k = kernel(cfg.id(), || crate::kernels::argmax::argmax(&cfg))?;
    match workspace {
        Some(ws) if splits > 1 => {
            let args = ArgmaxParams { x, out: None, partials: Some(ws), cols, cols_per_split: per_split };
            params::launch(stream, &k, LaunchConfig { grid, block, dynamic_shared_bytes: 0 }, &args.args())?;
            let rk = kernel(ArgmaxConfig::reduce_id(), crate::kernels::argmax::argmax_reduce)?;
            let args = ArgmaxReduceParams { partials: ws, out, splits };
            params::launch(stream, &rk, LaunchConfig::linear(rows, ARGMAX_REDUCE_THREADS), &args.args())?;
        }
        _ => {
            let (whole, partials) = if cfg.partial { (None, Some(out)) } else { (Some(out), None) };
            let args = ArgmaxParams { x, out: whole, partials, cols, cols_per_split: per_split };
            params::launch(stream, &k, LaunchConfig { grid, block, dynamic_shared_bytes: 0 }, &args.args())?;
        }
    }
    Ok(())
}

/// Index of the maximum along the last axis (see [`argmax_into`]; allocates any workspace).
pub fn argmax(x: &Tensor) -> Result<Tensor> {
    contiguous_nonempty("argmax", "input", x)?;
    let out = Tensor::empty(x.device(), DType::U32, &reduced_shape(x))?;
    let cols = *x.shape().last().unwrap_or(&1);
    let len = argmax_workspace_len(x.device(), x.numel() / cols.max(1), cols);
    let ws = if len > 0 { Some(Tensor::empty(x.device(), DType::U64, &[len])?) } else { None };
    argmax_into(&x.device().default_stream(), x, &out, ws.as_ref())?;
    Ok(out)
}
