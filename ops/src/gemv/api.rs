//! GEMV / skinny GEMM for decode (`M ≤ 16`), with an optional split-K for narrow outputs.

use ruda_runtime::{DType, Device, LaunchConfig, Stream, Tensor};

use super::kernel::{
    GemvConfig, GemvLoads, GemvParams, GemvReduceConfig, GemvReduceParams, GEMV_REDUCE_THREADS, GEMV_THREADS,
    GEMV_WARPS,
};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// The largest `M` (rows of `x`) the GEMV kernels take; `linear` uses them up to this size.
pub const GEMV_MAX_M: usize = 16;

/// Most K-splits a launch uses.
const MAX_SPLITS: u32 = 32;

/// Fewest elements of `K` per split: below this the partials cost more than they save.
const MIN_K_PER_SPLIT: u32 = 1024;

/// Validated GEMV operands.
struct Gemv {
    dtype: ruda_ir::ScalarType,
    m: u32,
    n: u32,
    k: u32,
    loads: GemvLoads,
}

fn check(name: &'static str, stream: &Stream, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<Gemv> {
    let dtype = float_dtype(name, x)?;
    for (tn, t) in [("x", x), ("w", w), ("out", out)] {
        contiguous_nonempty(name, tn, t)?;
        expect_dtype(name, tn, t, x.dtype())?;
        if t.rank() != 2 {
            return Err(OpError::Shape { op: name, message: format!("`{tn}` must be 2-D, is {:?}", t.shape()) });
        }
    }
    same_device(name, stream, &[("x", x), ("w", w), ("out", out)])?;
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let n = w.shape()[0];
    if w.shape()[1] != k {
        return Err(OpError::Shape {
            op: name,
            message: format!("inner dimensions differ: x is {:?}, w is {:?} (expected [N, {k}])", x.shape(), w.shape()),
        });
    }
    if m > GEMV_MAX_M {
        return Err(OpError::Shape { op: name, message: format!("x has {m} rows; GEMV takes at most {GEMV_MAX_M}") });
    }
    expect_shape(name, "out", out, &[m, n])?;
    to_u32(name, "elements of `out`", m * n)?;
    let (m, n, k) = (to_u32(name, "m", m)?, to_u32(name, "n", n)?, to_u32(name, "k", k)?);
    // 16-byte loads need every row start 16-byte aligned: K a multiple of the chunk, and the
    // tensors' first elements aligned (allocations themselves are).
    let chunk = (16 / x.dtype().size()) as u32;
    let aligned = |t: &Tensor| (t.offset() * t.dtype().size()).is_multiple_of(16);
    let loads = if k.is_multiple_of(chunk) && aligned(x) && aligned(w) { GemvLoads::Vector } else { GemvLoads::Scalar };
    Ok(Gemv { dtype, m, n, k, loads })
}

/// How many K-splits GEMV uses for `n` output columns of depth `k` on `device`: enough blocks to
/// cover every SM twice, at least [`MIN_K_PER_SPLIT`] of `K` each, at most 32. One (no split) on
/// the CPU device and whenever `ceil(n / 4)` blocks already fill the GPU.
pub fn gemv_splits(device: &Device, n: usize, k: usize) -> usize {
    let Some(info) = device.cuda_info() else { return 1 };
    let blocks = n.div_ceil(GEMV_WARPS as usize).max(1);
    let target = 2 * info.multiprocessor_count as usize;
    if blocks >= target {
        return 1;
    }
    let by_fill = target.div_ceil(blocks);
    let by_k = k / MIN_K_PER_SPLIT as usize;
    by_fill.min(by_k).clamp(1, MAX_SPLITS as usize)
}

/// `f32` elements of workspace [`crate::api::gemv_into`] uses for `x[m, k] · w[n, k]ᵀ` on `device` (0 when
/// it does not split).
pub fn gemv_workspace_len(device: &Device, m: usize, n: usize, k: usize) -> usize {
    match gemv_splits(device, n, k) {
        1 => 0,
        s => s * m * n,
    }
}

/// Launch the GEMV (and with `splits > 1` its reduction) under the caller's op name.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv_launch(
    name: &'static str,
    stream: &Stream,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
    workspace: Option<&Tensor>,
    splits: u32,
) -> Result<()> {
    let g = check(name, stream, x, w, out)?;
    if let Some(b) = bias {
        expect_tensor(name, "bias", b, x.dtype(), &[g.n as usize])?;
        same_device(name, stream, &[("bias", b)])?;
    }
    let chunk = match g.loads {
        GemvLoads::Vector => 16 / x.dtype().size() as u32,
        GemvLoads::Scalar => 1,
    };
    let chunks = g.k / chunk;
    // Whole warps' worth of chunks per split, and no empty splits.
    let per_split = chunks.div_ceil(splits).next_multiple_of(32).max(32);
    let splits = chunks.div_ceil(per_split).max(1);
    let m_tile = GemvConfig::m_tile_for(g.m).unwrap_or(16);
    let grid = [g.n.div_ceil(GEMV_WARPS), splits, 1];
    let block = [GEMV_THREADS, 1, 1];
    let gemv_args = |out, partials, bias| GemvParams {
        x,
        w,
        out,
        partials,
        bias,
        m: g.m,
        n: g.n,
        k: g.k,
        chunks_per_split: per_split,
    };
    if splits == 1 {
        let cfg = GemvConfig { dtype: g.dtype, m_tile, loads: g.loads, split_k: false, bias: bias.is_some() };
        let kern = kernel(cfg.id(), || crate::kernels::gemv::gemv(&cfg))?;
        let args = gemv_args(Some(out), None, bias);
        params::launch(stream, &kern, LaunchConfig { grid, block, dynamic_shared_bytes: 0 }, &args.args())?;
        return Ok(());
    }
    let Some(ws) = workspace else {
        return Err(OpError::InvalidArgument { op: name, message: "split-K needs a workspace".into() });
    };
    let len = g.m * g.n;
    let need = splits as usize * len as usize;
    check_workspace(name, stream, ws, need)?;
    to_u32(name, "workspace elements", need)?;
    let cfg = GemvConfig { dtype: g.dtype, m_tile, loads: g.loads, split_k: true, bias: false };
    let kern = kernel(cfg.id(), || crate::kernels::gemv::gemv(&cfg))?;
    let args = gemv_args(None, Some(ws), None);
    params::launch(stream, &kern, LaunchConfig { grid, block, dynamic_shared_bytes: 0 }, &args.args())?;
    let rcfg = GemvReduceConfig { dtype: g.dtype, bias: bias.is_some() };
    let rk = kernel(rcfg.id(), || crate::kernels::gemv::gemv_reduce(&rcfg))?;
    let args = GemvReduceParams { partials: ws, out, bias, len, splits, n: bias.map(|_| g.n) };
    let grid = LaunchConfig::linear(len.div_ceil(GEMV_REDUCE_THREADS), GEMV_REDUCE_THREADS);
    params::launch(stream, &rk, grid, &args.args())?;
    Ok(())
}

fn check_workspace(name: &'static str, stream: &Stream, ws: &Tensor, need: usize) -> Result<()> {
    expect_dtype(name, "workspace", ws, DType::F32)?;
    if !ws.is_contiguous() {
        return Err(OpError::InvalidArgument { op: name, message: "`workspace` must be contiguous".into() });
    }
    if ws.numel() < need {
        return Err(OpError::Shape {
            op: name,
            message: format!("`workspace` has {} elements, {need} are needed", ws.numel()),
        });
    }
    same_device(name, stream, &[("workspace", ws)])
}

/// The GEMV with the heuristic's split count lowered to what `workspace` holds, under the
/// caller's op name.
pub(crate) fn gemv_named(
    name: &'static str,
    stream: &Stream,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
    workspace: Option<&Tensor>,
) -> Result<()> {
    let (m, n, k) = (
        x.shape().first().copied().unwrap_or(0),
        w.shape().first().copied().unwrap_or(0),
        x.shape().get(1).copied().unwrap_or(0),
    );
    let mut splits = gemv_splits(stream.device(), n, k);
    // A smaller workspace caps the split count; none (or room for fewer than 2) disables it.
    let room = workspace.map_or(0, |ws| ws.numel() / (m * n).max(1));
    splits = splits.min(room);
    gemv_launch(name, stream, x, w, None, out, workspace, splits.max(1) as u32)
}

/// `x[M, K] · w[N, K]ᵀ` for `M ≤ 16` (allocates the output and any workspace), with the
/// split count autotuned on a GPU ([`crate::tune::gemv_tuned`]).
pub fn gemv(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    crate::tune::gemv_tuned(x, w)
}
