//! The decode GEMV's split-K count, tuned per GPU and shape through the generic flow
//! ([`crate::tune::flow`]): the key is the dtype, `[m, n, k]` bucketed and the alignment class
//! ([`gemv_key`]); the candidates are split counts ([`GemvSplits`]).
//!
//! Tuning measures, so it allocates and synchronises: it happens in the allocating wrapper
//! ([`gemv_tuned`], which `api::gemv` uses) or in a warm-up call of [`tuned_gemv_splits`]
//! before a decode step is captured; `_into` forms never tune, they take the chosen split
//! count (`api::gemv_split_k_into`).

use std::sync::Arc;

use ruda_runtime::{alignment_class, bucket, measure_on_stream, Autotuner, DType, Device, Stream, Tensor, TuneKey};

use super::api::{gemv_launch, gemv_named, gemv_splits, gemv_workspace_len, GEMV_MAX_M};
use super::kernel::{gemv, gemv_reduce, GemvConfig, GemvLoads, GemvReduceConfig};
use crate::error::{OpError, Result};
use crate::host::kernel;
use crate::tune::flow::{run_tuned, tune, Kernels, Tuned, Tuning};
use crate::tune::{split_name, tuner_for, TUNE_ITERS};

/// The split-K counts GEMV tries besides its heuristic's.
pub const GEMV_SPLIT_CANDIDATES: [usize; 5] = [1, 2, 4, 8, 16];

/// GEMV's tuned choice: the split-K count (1: no split).
pub struct GemvSplits;

impl Tuned for GemvSplits {
    type Candidate = usize;
    type Dims = [usize; 3];
    const OP: &'static str = "gemv";

    fn name(splits: &usize) -> String {
        split_name(*splits)
    }

    /// The heuristic's split count for the key's bucketed shape first, then
    /// [`GEMV_SPLIT_CANDIDATES`]; the kernels are the GEMV with and without split-K at the row
    /// tile and loads the problem takes, and the reduction.
    fn candidates(device: &Device, key: &TuneKey, [m, n, k]: [usize; 3]) -> Result<(Vec<usize>, Kernels)> {
        let dtype = DType::from_name(&key.dtype).filter(|d| d.is_float()).ok_or_else(|| OpError::DType {
            op: "gemv",
            message: format!("{} (expected f32, f16 or bf16)", key.dtype),
        })?;
        let st = dtype.scalar_type();
        let m_tile = GemvConfig::m_tile_for(m as u32).unwrap_or(GEMV_MAX_M as u32);
        let chunk = 16 / dtype.size();
        let loads = if key.alignment == 16 && k.is_multiple_of(chunk) { GemvLoads::Vector } else { GemvLoads::Scalar };
        let mut kernels = Vec::new();
        for split_k in [false, true] {
            let cfg = GemvConfig { dtype: st, m_tile, loads, split_k, bias: false };
            kernels.push(kernel(cfg.id(), || gemv(&cfg))?);
        }
        let rcfg = GemvReduceConfig { dtype: st, bias: false };
        kernels.push(kernel(rcfg.id(), || gemv_reduce(&rcfg))?);
        let first = gemv_splits(device, bucket(n as u64) as usize, bucket(k as u64) as usize);
        let splits = std::iter::once(first).chain(GEMV_SPLIT_CANDIDATES.into_iter().filter(|&s| s != first));
        Ok((splits.collect(), kernels))
    }
}

/// `[m, n, k]` of `x[M, K] · w[N, K]ᵀ`, or `None` when the operands are not 2-D (the op
/// itself then reports the error).
fn gemv_dims(x: &Tensor, w: &Tensor) -> Option<[usize; 3]> {
    (x.rank() == 2 && w.rank() == 2).then(|| [x.shape()[0], w.shape()[0], x.shape()[1]])
}

/// The tuning key of a GEMV: dtype, `[m, n, k]` bucketed, and the alignment class of the
/// tensors' first elements and row strides in bytes (16 when vector loads apply).
pub fn gemv_key(x: &Tensor, w: &Tensor) -> Option<TuneKey> {
    let [m, n, k] = gemv_dims(x, w)?;
    let size = x.dtype().size() as u64;
    let align = alignment_class(&[x.offset() as u64 * size, w.offset() as u64 * size, k as u64 * size]);
    Some(TuneKey::new("gemv", x.dtype().name(), &[m as u64, n as u64, k as u64], align))
}

/// The key and dims of `x · wᵀ`, or the op's error for operands that are not 2-D.
fn key_dims(x: &Tensor, w: &Tensor) -> Result<(TuneKey, [usize; 3])> {
    gemv_key(x, w).zip(gemv_dims(x, w)).ok_or_else(|| OpError::Shape {
        op: "gemv",
        message: format!("x {:?} and w {:?} must be 2-D", x.shape(), w.shape()),
    })
}

/// The GEMV split count `tuner` picks for `x · wᵀ`, measuring with `measure(splits)` (median
/// milliseconds, or why that count failed) on a cache miss. Testable with injected timings.
pub fn tune_gemv_with(
    tuner: &Autotuner,
    device: &Device,
    x: &Tensor,
    w: &Tensor,
    measure: impl FnMut(usize) -> std::result::Result<f64, String>,
) -> Result<Tuning<usize>> {
    let (key, dims) = key_dims(x, w)?;
    tune::<GemvSplits>(tuner, device, &key, dims, measure)
}

/// Time `x · wᵀ` with `splits` K-splits on `stream` (allocates the output and workspace).
fn measure_gemv(stream: &Stream, x: &Tensor, w: &Tensor, splits: usize) -> std::result::Result<f64, String> {
    let [m, n, _] = gemv_dims(x, w).ok_or("not 2-D")?;
    let out = Tensor::empty(stream.device(), x.dtype(), &[m, n]).map_err(|e| e.to_string())?;
    let ws = Tensor::empty(stream.device(), DType::F32, &[splits * m * n]).map_err(|e| e.to_string())?;
    measure_on_stream(stream, TUNE_ITERS, || {
        gemv_launch("gemv", stream, x, w, None, &out, Some(&ws), splits as u32).map_err(|e| e.to_string())
    })
}

/// The split count for `x · wᵀ` on `stream`'s device: the heuristic's ([`gemv_splits`]) on
/// the CPU, with `RUDA_AUTOTUNE=off` or for operands GEMV rejects; else the tuned one,
/// measured on the first call for the key (allocating and synchronising: call it in warm-up,
/// not while capturing).
pub fn tuned_gemv_splits(stream: &Stream, x: &Tensor, w: &Tensor) -> Result<usize> {
    match tuned_gemv(stream, x, w)? {
        Some((_, t)) => Ok(t.value),
        None => Ok(gemv_dims(x, w).map_or(1, |[_, n, k]| gemv_splits(stream.device(), n, k))),
    }
}

/// The tuner and its choice, when tuning applies.
pub(crate) fn tuned_gemv(stream: &Stream, x: &Tensor, w: &Tensor) -> Result<Option<(Arc<Autotuner>, Tuning<usize>)>> {
    let Some(tuner) = tuner_for(stream.device())? else { return Ok(None) };
    let Some([m, _, _]) = gemv_dims(x, w) else { return Ok(None) };
    if m == 0 || m > GEMV_MAX_M || !x.dtype().is_float() {
        return Ok(None);
    }
    let tuning = tune_gemv_with(&tuner, stream.device(), x, w, |s| measure_gemv(stream, x, w, s))?;
    Ok(Some((tuner, tuning)))
}

/// `x[M, K] · w[N, K]ᵀ` (`M ≤ 16`) with the tuned split count, allocating the output and
/// workspace on `x`'s default stream. When the cached choice fails to launch, its entry is
/// evicted and the next-best candidate runs.
pub fn gemv_tuned(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let stream = x.device().default_stream();
    let [m, n, k] = gemv_dims(x, w).unwrap_or([0, 0, 0]);
    let Some((tuner, tuning)) = tuned_gemv(&stream, x, w)? else {
        // The heuristic path, exactly as `gemv_into` sizes its workspace.
        let out = Tensor::empty(x.device(), x.dtype(), &[m, n])?;
        let len = gemv_workspace_len(x.device(), m, n, k);
        let ws = if len > 0 { Some(Tensor::empty(x.device(), DType::F32, &[len])?) } else { None };
        gemv_named("gemv", &stream, x, w, &out, ws.as_ref())?;
        return Ok(out);
    };
    let (key, dims) = key_dims(x, w)?;
    run_tuned::<GemvSplits, _>(&tuner, x.device(), &key, dims, &tuning, |splits| {
        let out = Tensor::empty(x.device(), x.dtype(), &[m, n])?;
        if splits <= 1 {
            gemv_named("gemv", &stream, x, w, &out, None)?;
        } else {
            let ws = Tensor::empty(x.device(), DType::F32, &[splits * m * n])?;
            gemv_launch("gemv", &stream, x, w, None, &out, Some(&ws), splits as u32)?;
        }
        Ok(out)
    })
}
