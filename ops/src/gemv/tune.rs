//! The decode GEMV's split-K count, tuned per GPU and shape with [`ruda_runtime::Autotuner`].
//!
//! Tuning measures, so it allocates and synchronises: it happens in the allocating wrapper
//! ([`gemv_tuned`], which `api::gemv` uses) or in a warm-up call of [`tuned_gemv_splits`]
//! before a decode step is captured; `_into` forms never tune, they take the chosen split
//! count ([`super::api::gemv_split_k_into`]).

use std::sync::Arc;

use ruda_ir::fnv1a64;
use ruda_runtime::{
    alignment_class, bucket, measure_on_stream, Autotuner, CandidateSet, Choice, DType, Device, Launchable, Stream,
    Tensor, TuneKey,
};

use super::api::{gemv_into, gemv_split_k_into, gemv_splits, gemv_workspace_len, GEMV_MAX_M};
use super::kernel::{gemv, gemv_reduce, GemvConfig, GemvLoads, GemvReduceConfig};
use crate::error::{OpError, Result};
use crate::host::kernel;
use crate::tune::{split_name, tuner_for, TUNE_ITERS};

/// The split-K counts GEMV tries besides its heuristic's.
pub const GEMV_SPLIT_CANDIDATES: [usize; 5] = [1, 2, 4, 8, 16];

/// The split count a GEMV candidate stands for.
pub fn splits_of(choice: &Choice) -> Result<usize> {
    choice.candidate.name.strip_prefix("splits=").and_then(|n| n.parse().ok()).filter(|&n| n >= 1).ok_or_else(|| {
        OpError::InvalidArgument {
            op: "gemv",
            message: format!("autotune chose `{}`, not a split count", choice.candidate.name),
        }
    })
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

/// GEMV's candidates for `m` rows on `device`: the heuristic's split count for the key's
/// bucketed shape first (the choice when tuning is off), then [`GEMV_SPLIT_CANDIDATES`]; the
/// kernels' IR hashes are folded in.
pub fn gemv_candidates(device: &Device, key: &TuneKey, m: usize, n: usize, k: usize) -> Result<CandidateSet> {
    let dtype = DType::from_name(&key.dtype)
        .filter(|d| d.is_float())
        .ok_or_else(|| OpError::DType { op: "gemv", message: format!("{} (expected f32, f16 or bf16)", key.dtype) })?;
    let st = dtype.scalar_type();
    let m_tile = GemvConfig::m_tile_for(m as u32).unwrap_or(GEMV_MAX_M as u32);
    let chunk = 16 / dtype.size();
    let loads = if key.alignment == 16 && k.is_multiple_of(chunk) { GemvLoads::Vector } else { GemvLoads::Scalar };
    let mut hashes = String::new();
    for split_k in [false, true] {
        let cfg = GemvConfig { dtype: st, m_tile, loads, split_k, bias: false };
        hashes.push_str(&format!("{:016x}", kernel(cfg.id(), || gemv(&cfg))?.ir_hash()));
    }
    let rcfg = GemvReduceConfig { dtype: st, bias: false };
    hashes.push_str(&format!("{:016x}", kernel(rcfg.id(), || gemv_reduce(&rcfg))?.ir_hash()));
    // The heuristic sees the key's bucketed shape, so every shape of one key gets the same set
    // (a set that differed would invalidate the key's cached choice each time).
    let first = gemv_splits(device, bucket(n as u64) as usize, bucket(k as u64) as usize);
    let splits = std::iter::once(first).chain(GEMV_SPLIT_CANDIDATES.into_iter().filter(|&s| s != first));
    Ok(CandidateSet::new(splits.map(split_name), fnv1a64(hashes.as_bytes())))
}

/// The GEMV split count `tuner` picks for `x · wᵀ`, measuring with `measure(splits)` (median
/// milliseconds, or why that count failed) on a cache miss. Testable with injected timings.
pub fn tune_gemv_with(
    tuner: &Autotuner,
    device: &Device,
    x: &Tensor,
    w: &Tensor,
    mut measure: impl FnMut(usize) -> std::result::Result<f64, String>,
) -> Result<Choice> {
    let (Some(key), Some([m, n, k])) = (gemv_key(x, w), gemv_dims(x, w)) else {
        return Err(OpError::Shape {
            op: "gemv",
            message: format!("x {:?} and w {:?} must be 2-D", x.shape(), w.shape()),
        });
    };
    let set = gemv_candidates(device, &key, m, n, k)?;
    Ok(tuner.tune(&key, &set, |c| {
        let splits = c.name.strip_prefix("splits=").and_then(|s| s.parse().ok()).ok_or("not a split count")?;
        measure(splits)
    })?)
}

/// Time `x · wᵀ` with `splits` K-splits on `stream` (allocates the output and workspace).
fn measure_gemv(stream: &Stream, x: &Tensor, w: &Tensor, splits: usize) -> std::result::Result<f64, String> {
    let [m, n, _] = gemv_dims(x, w).ok_or("not 2-D")?;
    let out = Tensor::empty(stream.device(), x.dtype(), &[m, n]).map_err(|e| e.to_string())?;
    let ws = Tensor::empty(stream.device(), DType::F32, &[splits * m * n]).map_err(|e| e.to_string())?;
    measure_on_stream(stream, TUNE_ITERS, || {
        gemv_split_k_into(stream, x, w, &out, &ws, splits).map_err(|e| e.to_string())
    })
}

/// The split count for `x · wᵀ` on `stream`'s device: the heuristic's ([`gemv_splits`]) on
/// the CPU, with `RUDA_AUTOTUNE=off` or for operands GEMV rejects; else the tuned one,
/// measured on the first call for the key (allocating and synchronising: call it in warm-up,
/// not while capturing).
pub fn tuned_gemv_splits(stream: &Stream, x: &Tensor, w: &Tensor) -> Result<usize> {
    tuned_gemv(stream, x, w)?.map_or_else(|| heuristic(stream.device(), x, w), |(_, c)| splits_of(&c))
}

fn heuristic(device: &Device, x: &Tensor, w: &Tensor) -> Result<usize> {
    Ok(gemv_dims(x, w).map_or(1, |[_, n, k]| gemv_splits(device, n, k)))
}

/// The tuner and its choice, when tuning applies.
pub(crate) fn tuned_gemv(stream: &Stream, x: &Tensor, w: &Tensor) -> Result<Option<(Arc<Autotuner>, Choice)>> {
    let Some(tuner) = tuner_for(stream.device())? else { return Ok(None) };
    let Some([m, _, _]) = gemv_dims(x, w) else { return Ok(None) };
    if m == 0 || m > GEMV_MAX_M || !x.dtype().is_float() {
        return Ok(None);
    }
    let choice = tune_gemv_with(&tuner, stream.device(), x, w, |s| measure_gemv(stream, x, w, s))?;
    Ok(Some((tuner, choice)))
}

/// `x[M, K] · w[N, K]ᵀ` (`M ≤ 16`) with the tuned split count, allocating the output and
/// workspace on `x`'s default stream. When the cached choice fails to launch, its entry is
/// evicted and the next-best candidate runs.
pub fn gemv_tuned(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let stream = x.device().default_stream();
    let run = |splits: usize| -> Result<Tensor> {
        let [m, n, _] = gemv_dims(x, w).unwrap_or([0, 0, 0]);
        let out = Tensor::empty(x.device(), x.dtype(), &[m, n])?;
        if splits <= 1 {
            gemv_into(&stream, x, w, &out, None)?;
        } else {
            let ws = Tensor::empty(x.device(), DType::F32, &[splits * m * n])?;
            gemv_split_k_into(&stream, x, w, &out, &ws, splits)?;
        }
        Ok(out)
    };
    match tuned_gemv(&stream, x, w)? {
        None => {
            // The heuristic path, exactly as `gemv_into` sizes its workspace.
            let [m, n, k] = gemv_dims(x, w).unwrap_or([0, 0, 0]);
            let out = Tensor::empty(x.device(), x.dtype(), &[m, n])?;
            let len = gemv_workspace_len(x.device(), m, n, k);
            let ws = if len > 0 { Some(Tensor::empty(x.device(), DType::F32, &[len])?) } else { None };
            gemv_into(&stream, x, w, &out, ws.as_ref())?;
            Ok(out)
        }
        Some((tuner, choice)) => match run(splits_of(&choice)?) {
            Ok(out) => Ok(out),
            Err(first) if choice.cached => {
                let (key, [m, n, k]) = (gemv_key(x, w).ok_or(first)?, gemv_dims(x, w).unwrap_or([0, 0, 0]));
                let set = gemv_candidates(x.device(), &key, m, n, k)?;
                let next = tuner.evict_and_fall_back(&key, &set, &choice.candidate.name)?;
                run(splits_of(&next)?)
            }
            Err(e) => Err(e),
        },
    }
}
