//! The tensor-core GEMM's tile and pipeline depth ([`GemmTile`]), tuned per GPU and shape
//! through the generic flow ([`crate::tune::flow`]).
//!
//! The key is the dtype, `[m, n, k]` bucketed to powers of two and the alignment class of the
//! operands; the epilogue and output dtype are left out (they cost the same for every tile).
//! The candidates are the heuristic's tile ([`heuristic_gemm_tile`], the choice when tuning is
//! off) followed by the rest of [`GemmTile::all`] ([`GemmTiles`]). As for GEMV, measuring
//! allocates and synchronises: it happens in [`tuned_gemm_tile`] (a warm-up call) or in the
//! allocating [`crate::api::linear_bias`]; [`crate::api::linear_tile_into`] takes the chosen
//! tile and never tunes.

use std::sync::Arc;

use ruda_runtime::{
    alignment_class, bucket, measure_on_stream, Autotuner, CandidateSet, DType, Device, Stream, Tensor, TuneKey,
};

use super::api::linear_tile_into;
use super::kernels::tc::{gemm_tc, GemmTcConfig};
use super::tile::{heuristic_gemm_tile, GemmTile};
use crate::error::{OpError, Result};
use crate::gemv::api::GEMV_MAX_M;
use crate::host::kernel;
use crate::tune::flow::{run_tuned, tune, Candidates, Kernels, Tuned, Tuning};
use crate::tune::tuner_for;

/// Launches per timed sample (a prefill GEMM takes tens of microseconds to milliseconds).
const TUNE_ITERS: usize = 5;

/// The tensor-core GEMM's tuned choice: the tile and pipeline depth.
pub struct GemmTiles;

impl Tuned for GemmTiles {
    type Candidate = GemmTile;
    /// `[m, n]` of the output.
    type Dims = [usize; 2];
    const OP: &'static str = "gemm";

    fn name(tile: &GemmTile) -> String {
        tile.name()
    }

    /// The heuristic's tile for the key's bucketed `m × n` first, then the others of
    /// [`GemmTile::all`]; the kernels are the plain (epilogue-free) kernel of every tile.
    fn candidates(device: &Device, key: &TuneKey, [m, n]: [usize; 2]) -> Result<(Vec<GemmTile>, Kernels)> {
        let ty =
            DType::from_name(&key.dtype).and_then(|d| GemmTcConfig::mma_type(d.scalar_type())).ok_or_else(|| {
                OpError::DType { op: "gemm", message: format!("{} (tensor cores take f16 or bf16)", key.dtype) }
            })?;
        let mut kernels = Vec::new();
        for t in GemmTile::all() {
            let cfg = GemmTcConfig::new(ty, t.tile, t.stages);
            kernels.push(kernel(cfg.id(), || gemm_tc(&cfg))?);
        }
        let first = heuristic_gemm_tile(device, bucket(m as u64) as usize, bucket(n as u64) as usize);
        let tiles = std::iter::once(first).chain(GemmTile::all().into_iter().filter(|&t| t != first));
        Ok((tiles.collect(), kernels))
    }
}

/// `[m, n, k]` of `x[M, K] · w[N, K]ᵀ`, or `None` when the operands are not 2-D.
fn gemm_dims(x: &Tensor, w: &Tensor) -> Option<[usize; 3]> {
    (x.rank() == 2 && w.rank() == 2).then(|| [x.shape()[0], w.shape()[0], x.shape()[1]])
}

/// The tuning key of `x · wᵀ`: dtype, `[m, n, k]` bucketed, and the alignment class of the
/// first elements and row strides in bytes (16 wherever the tensor-core GEMM runs).
pub fn gemm_key(x: &Tensor, w: &Tensor) -> Option<TuneKey> {
    let [m, n, k] = gemm_dims(x, w)?;
    let size = x.dtype().size() as u64;
    let align = alignment_class(&[x.offset() as u64 * size, w.offset() as u64 * size, k as u64 * size]);
    Some(TuneKey::new("gemm", x.dtype().name(), &[m as u64, n as u64, k as u64], align))
}

/// The candidate set the tuner sees for an `m × n` output under `key` on `device`.
pub fn gemm_candidates(device: &Device, key: &TuneKey, m: usize, n: usize) -> Result<CandidateSet> {
    Ok(Candidates::<GemmTiles>::new(device, key, [m, n])?.set)
}

/// The key and `[m, n]` of `x · wᵀ`, or the op's error for operands that are not 2-D.
fn key_dims(x: &Tensor, w: &Tensor) -> Result<(TuneKey, [usize; 2])> {
    gemm_key(x, w).zip(gemm_dims(x, w)).map(|(key, [m, n, _])| (key, [m, n])).ok_or_else(|| OpError::Shape {
        op: "gemm",
        message: format!("x {:?} and w {:?} must be 2-D", x.shape(), w.shape()),
    })
}

/// The tile `tuner` picks for `x · wᵀ`, measuring with `measure(tile)` (median milliseconds,
/// or why that tile failed) on a cache miss. Testable with injected timings.
pub fn tune_gemm_with(
    tuner: &Autotuner,
    device: &Device,
    x: &Tensor,
    w: &Tensor,
    measure: impl FnMut(GemmTile) -> std::result::Result<f64, String>,
) -> Result<Tuning<GemmTile>> {
    let (key, dims) = key_dims(x, w)?;
    tune::<GemmTiles>(tuner, device, &key, dims, measure)
}

/// Time `x · wᵀ` with `tile` on `stream` (allocates the output).
fn measure_gemm(stream: &Stream, x: &Tensor, w: &Tensor, tile: GemmTile) -> std::result::Result<f64, String> {
    let [m, n, _] = gemm_dims(x, w).ok_or("not 2-D")?;
    let out = Tensor::empty(stream.device(), x.dtype(), &[m, n]).map_err(|e| e.to_string())?;
    measure_on_stream(stream, TUNE_ITERS, || {
        linear_tile_into(stream, x, w, None, None, &out, tile).map_err(|e| e.to_string())
    })
}

/// The tuner and its choice, when tuning applies (a GPU, `RUDA_AUTOTUNE` on, f16/bf16 operands
/// of more than [`GEMV_MAX_M`] rows).
fn tuned_gemm(stream: &Stream, x: &Tensor, w: &Tensor) -> Result<Option<(Arc<Autotuner>, Tuning<GemmTile>)>> {
    let Some(tuner) = tuner_for(stream.device())? else { return Ok(None) };
    let Some([m, _, _]) = gemm_dims(x, w) else { return Ok(None) };
    if m <= GEMV_MAX_M || GemmTcConfig::mma_type(x.dtype().scalar_type()).is_none() {
        return Ok(None);
    }
    let tuning = tune_gemm_with(&tuner, stream.device(), x, w, |t| measure_gemm(stream, x, w, t))?;
    Ok(Some((tuner, tuning)))
}

/// The tile for `x · wᵀ` on `stream`'s device: the heuristic's on the CPU, with
/// `RUDA_AUTOTUNE=off` or where tuning does not apply; else the tuned one, measured on the
/// first call for the key (allocating and synchronising: call it in warm-up, not while
/// capturing), for [`linear_tile_into`].
pub fn tuned_gemm_tile(stream: &Stream, x: &Tensor, w: &Tensor) -> Result<GemmTile> {
    match tuned_gemm(stream, x, w)? {
        Some((_, t)) => Ok(t.value),
        None => {
            let [m, n, _] = gemm_dims(x, w).unwrap_or([0, 0, 0]);
            Ok(heuristic_gemm_tile(stream.device(), m, n))
        }
    }
}

/// [`linear_tile_into`] with the tuned tile ([`tuned_gemm_tile`]). When the cached choice
/// fails to launch, its entry is evicted and the next-best candidate runs.
pub fn gemm_tuned_into(
    stream: &Stream,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let run = |tile: GemmTile| linear_tile_into(stream, x, w, bias, residual, out, tile);
    match tuned_gemm(stream, x, w)? {
        None => {
            let [m, n, _] = gemm_dims(x, w).unwrap_or([0, 0, 0]);
            run(heuristic_gemm_tile(stream.device(), m, n))
        }
        Some((tuner, tuning)) => {
            let (key, dims) = key_dims(x, w)?;
            run_tuned::<GemmTiles, _>(&tuner, stream.device(), &key, dims, &tuning, run)
        }
    }
}

/// Tune `x[m, k] · w[n, k]ᵀ` of `dtype` on `stream`'s GPU with zero-filled operands (timing
/// does not depend on the values), for `rudac tune --shapes`: the choice, or `None` when tuning
/// does not apply (CPU device, `RUDA_AUTOTUNE=off`, not f16/bf16, at most [`GEMV_MAX_M`] rows).
pub fn tune_gemm_shape(
    stream: &Stream,
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
) -> Result<Option<ruda_runtime::Choice>> {
    let x = Tensor::zeros(stream.device(), dtype, &[m, k])?;
    let w = Tensor::zeros(stream.device(), dtype, &[n, k])?;
    Ok(tuned_gemm(stream, &x, &w)?.map(|(_, t)| t.choice))
}
