//! Decode attention's split-KV count, tuned per GPU and shape through the generic flow
//! ([`crate::tune::flow`]), as GEMV's split-K is: the candidates are split counts
//! ([`DecodeSplits`]), the heuristic's ([`decode_splits`]) first, then
//! [`DECODE_SPLIT_CANDIDATES`].
//!
//! The key is the dtype, `[batch, q_heads, kv_heads, head_dim, s_max]` bucketed (with the V
//! cache's head dim appended where it differs from `head_dim`), and the alignment class.
//! Candidates are timed with every sequence at the cache's capacity `s_max` (the workspace is
//! sized per capacity, not per step, so its split count must suit the longest context it will
//! see).

use std::sync::Arc;

use ruda_runtime::{
    alignment_class, bucket, measure_on_stream, Autotuner, CandidateSet, Choice, DType, Device, Stream, Tensor, TuneKey,
};

use super::kernels::{self as kern, AttentionDecodeConfig, FLASH_HEAD_DIM_RANGE};
use crate::api::{self, attention_decode_into, decode_splits, DecodeWorkspace, OpError, Result};
use crate::tune::flow::{ir_digest, run_tuned, tune, Kernels, Tuned, Tuning};
use crate::tune::{split_name, tuner_for, TUNE_ITERS};

/// The split counts decode attention tries besides its heuristic's (those that leave every
/// split at least one key tile of the cache are kept).
pub const DECODE_SPLIT_CANDIDATES: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

const OP: &str = "attention_decode";

/// `[batch, q_heads, kv_heads, head_dim, s_max]` of `q [B, Hq, D]` and `k_cache [B, Hkv,
/// S_max, D]`, or `None` when the ranks are wrong (the op then reports the error).
pub fn decode_dims(q: &Tensor, k_cache: &Tensor) -> Option<[usize; 5]> {
    (q.rank() == 3 && k_cache.rank() == 4)
        .then(|| [q.shape()[0], q.shape()[1], k_cache.shape()[1], q.shape()[2], k_cache.shape()[2]])
}

/// The V cache's head dim (`Dv`, the last dimension of `v_cache`), when it has one.
fn v_head_dim(v_cache: &Tensor) -> Option<usize> {
    (v_cache.rank() == 4).then(|| v_cache.shape()[3])
}

/// The tuning key of a decode: dtype, `[batch, q_heads, kv_heads, head_dim, s_max]` bucketed
/// (then `v_head_dim` where it is not `head_dim`), and the alignment class of `q`'s and the
/// caches' first elements and rows in bytes.
pub fn decode_key(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor) -> Option<TuneKey> {
    let dims = decode_dims(q, k_cache)?;
    let dv = v_head_dim(v_cache)?;
    let size = q.dtype().size() as u64;
    let align = alignment_class(&[
        q.offset() as u64 * size,
        k_cache.offset() as u64 * size,
        v_cache.offset() as u64 * size,
        dims[3] as u64 * size,
    ]);
    let mut key_dims = dims.map(|d| d as u64).to_vec();
    if dv != dims[3] {
        key_dims.push(dv as u64);
    }
    Some(TuneKey::new(OP, q.dtype().name(), &key_dims, align))
}

fn decode_config(op: &'static str, dtype: DType, head_dim: usize, v_head_dim: usize) -> Result<AttentionDecodeConfig> {
    if !dtype.is_float() {
        return Err(OpError::DType { op, message: format!("{dtype} (expected f32, f16 or bf16)") });
    }
    let (lo, hi) = (FLASH_HEAD_DIM_RANGE.start(), FLASH_HEAD_DIM_RANGE.end());
    let dim = |what: &str, d: usize| {
        u32::try_from(d).ok().filter(|d| FLASH_HEAD_DIM_RANGE.contains(d)).ok_or_else(|| OpError::InvalidArgument {
            op,
            message: format!("{what} {d} is not supported (decode takes {lo} to {hi})"),
        })
    };
    let (head_dim, v_head_dim) = (dim("head dim", head_dim)?, dim("value head dim", v_head_dim)?);
    Ok(AttentionDecodeConfig { dtype: dtype.scalar_type(), head_dim, v_head_dim })
}

/// `[batch, q_heads, kv_heads, head_dim, s_max]` and the V cache's head dim.
pub type DecodeDims = ([usize; 5], usize);

/// Decode attention's tuned choice: the split-KV count (1: no split).
pub struct DecodeSplits;

impl Tuned for DecodeSplits {
    type Candidate = usize;
    type Dims = DecodeDims;
    const OP: &'static str = OP;

    fn name(splits: &usize) -> String {
        split_name(*splits)
    }

    /// See [`decode_candidates`]; the key gives the dtype (the split counts do not depend on
    /// the device).
    fn candidates(_: &Device, key: &TuneKey, (dims, v_head_dim): DecodeDims) -> Result<(Vec<usize>, Kernels)> {
        let dtype = DType::from_name(&key.dtype)
            .ok_or_else(|| OpError::DType { op: OP, message: format!("{} (expected f32, f16 or bf16)", key.dtype) })?;
        candidate_splits(dtype, dims, v_head_dim)
    }
}

/// Decode's candidates for `dims` = `[batch, q_heads, kv_heads, head_dim, s_max]` and the V
/// cache's head dim, bucketed as the key is: the heuristic's split count first (the choice when
/// tuning is off), then those of [`DECODE_SPLIT_CANDIDATES`] that give every split at least one
/// key tile; the kernels are the partial and combine kernels of the head dims.
fn candidate_splits(dtype: DType, dims: [usize; 5], v_head_dim: usize) -> Result<(Vec<usize>, Kernels)> {
    let [batch, q_heads, kv_heads, head_dim, s_max] = dims;
    let cfg = decode_config(OP, dtype, head_dim, v_head_dim)?;
    let kernels = vec![
        api::kernel(cfg.id(), || kern::attention_decode(&cfg))?,
        api::kernel(cfg.combine_id(), || kern::attention_decode_combine(&cfg))?,
    ];
    // The key's bucketed shape, so every shape of one key gets the same set.
    let [batch, q_heads, kv_heads, s_max] = [batch, q_heads, kv_heads, s_max].map(|d| bucket(d as u64) as usize);
    let tiles = s_max.div_ceil(cfg.geometry().keys as usize).max(1);
    let first = decode_splits(batch, q_heads, kv_heads, head_dim, s_max);
    let rest = DECODE_SPLIT_CANDIDATES.into_iter().filter(|&s| s != first && s <= tiles);
    Ok((std::iter::once(first).chain(rest).collect(), kernels))
}

/// The candidate set the tuner sees for decoding `dims` (see `candidate_splits`): the split
/// counts' names and the checksum of the kernels' location-free IR.
pub fn decode_candidates(dtype: DType, dims: [usize; 5], v_head_dim: usize) -> Result<CandidateSet> {
    let (splits, kernels) = candidate_splits(dtype, dims, v_head_dim)?;
    Ok(CandidateSet::new(splits.into_iter().map(split_name), ir_digest(&kernels)))
}

/// The key and dims of a decode, or the op's error for operands of the wrong ranks.
fn key_dims(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor) -> Result<(TuneKey, DecodeDims)> {
    let (Some(key), Some(dims), Some(dv)) =
        (decode_key(q, k_cache, v_cache), decode_dims(q, k_cache), v_head_dim(v_cache))
    else {
        return Err(OpError::Shape {
            op: OP,
            message: format!(
                "q {:?} must be [batch, heads, head_dim] and k_cache {:?} [batch, kv_heads, max_seq_len, head_dim]",
                q.shape(),
                k_cache.shape()
            ),
        });
    };
    Ok((key, (dims, dv)))
}

/// The split count `tuner` picks for decoding `q` against `k_cache`/`v_cache`, measuring with
/// `measure(splits)` (median milliseconds, or why that count failed) on a cache miss.
/// Testable with injected timings.
pub fn tune_decode_with(
    tuner: &Autotuner,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    measure: impl FnMut(usize) -> std::result::Result<f64, String>,
) -> Result<Tuning<usize>> {
    let (key, dims) = key_dims(q, k_cache, v_cache)?;
    tune::<DecodeSplits>(tuner, q.device(), &key, dims, measure)
}

/// Whether the op accepts these operands as far as tuning cares: otherwise the op itself
/// reports the error, instead of every candidate failing to measure.
fn tunable(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor) -> Option<[usize; 5]> {
    let dims @ [batch, q_heads, kv_heads, head_dim, s_max] = decode_dims(q, k_cache)?;
    let dv = v_head_dim(v_cache)?;
    let takes = |d: usize| u32::try_from(d).is_ok_and(|d| FLASH_HEAD_DIM_RANGE.contains(&d));
    let ok = q.dtype().is_float()
        && k_cache.dtype() == q.dtype()
        && v_cache.dtype() == q.dtype()
        && k_cache.shape() == [batch, kv_heads, s_max, head_dim]
        && v_cache.shape() == [batch, kv_heads, s_max, dv]
        && kv_heads > 0
        && q_heads.is_multiple_of(kv_heads)
        && takes(head_dim)
        && takes(dv)
        && [q, k_cache, v_cache].iter().all(|t| t.is_contiguous() && t.numel() > 0 && t.device() == q.device());
    ok.then_some(dims)
}

/// Time a decode with `splits` key splits on `stream`, every sequence at the full capacity
/// (allocates the output, workspace and lengths).
fn measure_decode(
    stream: &Stream,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    splits: usize,
) -> std::result::Result<f64, String> {
    let [batch, _, _, _, s_max] = decode_dims(q, k_cache).ok_or("wrong ranks")?;
    let err = |e: OpError| e.to_string();
    let full = u32::try_from(s_max).map_err(|_| format!("max_seq_len {s_max} exceeds u32"))?;
    let lens = Tensor::from_slice(stream.device(), &vec![full; batch], &[batch]).map_err(|e| e.to_string())?;
    let dv = v_head_dim(v_cache).ok_or("wrong ranks")?;
    let ws = DecodeWorkspace::with_value_head_dim(q, dv, splits).map_err(err)?;
    let out = Tensor::empty(stream.device(), q.dtype(), &[batch, q.shape()[1], dv]).map_err(|e| e.to_string())?;
    measure_on_stream(stream, TUNE_ITERS, || {
        attention_decode_into(stream, q, k_cache, v_cache, &lens, None, &ws, &out).map_err(err)
    })
}

/// The tuner and its choice, when tuning applies.
fn tuned_decode(
    stream: &Stream,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
) -> Result<Option<(Arc<Autotuner>, Tuning<usize>)>> {
    let Some(tuner) = tuner_for(stream.device())? else { return Ok(None) };
    if tunable(q, k_cache, v_cache).is_none() {
        return Ok(None);
    }
    let tuning = tune_decode_with(&tuner, q, k_cache, v_cache, |s| measure_decode(stream, q, k_cache, v_cache, s))?;
    Ok(Some((tuner, tuning)))
}

fn heuristic(q: &Tensor, k_cache: &Tensor) -> usize {
    decode_dims(q, k_cache).map_or(1, |[b, hq, hkv, d, s]| decode_splits(b, hq, hkv, d, s))
}

/// The split count to make a [`DecodeWorkspace`] with for decoding queries shaped like `q`
/// against `k_cache`/`v_cache` on `stream`'s device: the heuristic's ([`decode_splits`]) on
/// the CPU, with `RUDA_AUTOTUNE=off` or for operands the op rejects; else the tuned one,
/// measured on the first call for the key (allocating and synchronising: call it in warm-up,
/// not while capturing). Neither the caches' contents nor `q`'s are changed.
pub fn tuned_decode_splits(stream: &Stream, q: &Tensor, k_cache: &Tensor, v_cache: &Tensor) -> Result<usize> {
    match tuned_decode(stream, q, k_cache, v_cache)? {
        Some((_, t)) => Ok(t.value),
        None => Ok(heuristic(q, k_cache)),
    }
}

/// [`attention_decode_into`] into a new tensor with a new workspace of the tuned split count,
/// on `q`'s default stream (what [`crate::api::attention_decode`] runs). When the cached
/// choice fails to launch, its entry is evicted and the next-best candidate runs.
pub fn attention_decode_tuned(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    seq_lens: &Tensor,
    scale: Option<f32>,
) -> Result<Tensor> {
    let stream = q.device().default_stream();
    let run = |splits: usize| -> Result<Tensor> {
        let dv = v_head_dim(v_cache).unwrap_or(q.shape()[2]);
        let ws = DecodeWorkspace::with_value_head_dim(q, dv, splits)?;
        let out = Tensor::empty(q.device(), q.dtype(), &[q.shape()[0], q.shape()[1], dv])?;
        attention_decode_into(&stream, q, k_cache, v_cache, seq_lens, scale, &ws, &out)?;
        Ok(out)
    };
    match tuned_decode(&stream, q, k_cache, v_cache)? {
        None => run(heuristic(q, k_cache)),
        Some((tuner, tuning)) => {
            let (key, dims) = key_dims(q, k_cache, v_cache)?;
            run_tuned::<DecodeSplits, _>(&tuner, q.device(), &key, dims, &tuning, run)
        }
    }
}

/// One `attention_decode` line of a shapes file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    pub dtype: DType,
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub s_max: usize,
}

impl DecodeShape {
    /// Why the op would reject this shape, if it would.
    pub fn check(&self) -> std::result::Result<(), String> {
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return Err(format!("q_heads={} is not a multiple of kv_heads={}", self.q_heads, self.kv_heads));
        }
        decode_config(OP, self.dtype, self.head_dim, self.head_dim).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// Tune one decode shape on `stream`'s GPU with zero-filled operands (timing does not depend
/// on the values): its choice, or `None` when tuning does not apply.
pub(crate) fn tune_decode_shape(stream: &Stream, s: &DecodeShape) -> Result<Option<Choice>> {
    let q = Tensor::zeros(stream.device(), s.dtype, &[s.batch, s.q_heads, s.head_dim])?;
    let cache = [s.batch, s.kv_heads, s.s_max, s.head_dim];
    let (k, v) = (Tensor::zeros(stream.device(), s.dtype, &cache)?, Tensor::zeros(stream.device(), s.dtype, &cache)?);
    Ok(tuned_decode(stream, &q, &k, &v)?.map(|(_, t)| t.choice))
}
