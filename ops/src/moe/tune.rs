//! The routed experts' tensor-core tiles ([`ExpertTiles`]: one for the gate/up grouped GEMM,
//! one for the down), tuned per GPU and expert shape through the generic flow
//! ([`crate::tune::flow`]), for the `moe_experts` lines of shape files and `ruda-llm tune`.
//!
//! The key is `moe_experts DTYPE rows×E×H×I` bucketed (rows = tokens · top_k, the dispatched
//! rows) with the weights' alignment class. The candidates are the heuristic's pair
//! ([`grouped_tc_tile`] for each GEMM: the choice when tuning is off) followed by every tile of
//! [`GROUPED_TC_TILES`] for both GEMMs, all at the deepest pipeline. A candidate is timed on the
//! whole expert block (gate/up, SwiGLU, down) over rows spread evenly across the experts: the
//! rows per expert set the tiles' padding, and a real routing's are not known in advance.
//!
//! As for the GEMM, measuring allocates and synchronises: it happens in
//! [`crate::api::ExpertsWorkspace::tuned`] (made once, before any capture) or in
//! [`tune_experts_shape`]; `forward_dispatched_into` takes the workspace's tiles and never tunes.

use ruda_ir::MmaType;
use ruda_runtime::{alignment_class, bucket, measure_on_stream, Autotuner, DType, Device, Stream, Tensor, TuneKey};

use super::api::{MoeError, RoutingPlan};
use super::experts::{ExpertsWorkspace, SwiGluExperts};
use super::grouped::{grouped_tc_tile, moe_grouped_tc, GroupedTcConfig, GROUPED_TC_TILES};
use crate::error::Result;
use crate::gemm::kernels::tc::GemmTcConfig;
use crate::gemm::tile::TcTile;
use crate::host::kernel;
use crate::tune::flow::{tune, Kernels, Tuned, Tuning};
use crate::tune::tuner_for;

/// Launches per timed sample (a prefill expert block takes a millisecond or more).
const TUNE_ITERS: usize = 3;

/// The tiles of the experts' two grouped GEMMs on tensor cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExpertTiles {
    pub gate_up: TcTile,
    pub down: TcTile,
}

impl ExpertTiles {
    /// The heuristic's tiles for `rows` dispatched rows over `experts` experts of hidden size
    /// `hidden` and intermediate size `inter` (gate/up writes `2 · inter` columns).
    pub fn heuristic(rows: usize, experts: usize, hidden: usize, inter: usize) -> ExpertTiles {
        ExpertTiles { gate_up: grouped_tc_tile(rows, experts, 2 * inter), down: grouped_tc_tile(rows, experts, hidden) }
    }

    /// `tc64x64` when both GEMMs take one tile, else `tc128x128w4+tc64x64` (gate/up first): the
    /// candidate's name in the cache.
    pub fn name(&self) -> String {
        if self.gate_up == self.down {
            self.gate_up.name().to_string()
        } else {
            format!("{}+{}", self.gate_up.name(), self.down.name())
        }
    }
}

/// The experts' tuned choice.
pub struct ExpertTileChoice;

impl Tuned for ExpertTileChoice {
    type Candidate = ExpertTiles;
    /// `[rows, experts, hidden, inter]`.
    type Dims = [usize; 4];
    const OP: &'static str = "moe_experts";

    fn name(tiles: &ExpertTiles) -> String {
        tiles.name()
    }

    /// The heuristic's pair for the key's bucketed shape first (one key, one candidate set),
    /// then each tile for both GEMMs; the kernels are the grouped GEMM of every tile.
    fn candidates(
        _: &Device,
        key: &TuneKey,
        [rows, experts, hidden, inter]: [usize; 4],
    ) -> Result<(Vec<ExpertTiles>, Kernels)> {
        let ty = mma_type(&key.dtype)?;
        let stages = deepest_stages();
        let mut kernels = Vec::new();
        for tile in GROUPED_TC_TILES {
            let cfg = GroupedTcConfig { ty, tile, stages };
            kernels.push(kernel(cfg.id(), || moe_grouped_tc(&cfg))?);
        }
        let [rows, experts, hidden, inter] = [rows, experts, hidden, inter].map(|d| bucket(d as u64) as usize);
        let first = ExpertTiles::heuristic(rows, experts, hidden, inter);
        let mut out = vec![first];
        out.extend(GROUPED_TC_TILES.map(|t| ExpertTiles { gate_up: t, down: t }).into_iter().filter(|&t| t != first));
        Ok((out, kernels))
    }
}

fn mma_type(dtype: &str) -> Result<MmaType> {
    DType::from_name(dtype).and_then(|d| GemmTcConfig::mma_type(d.scalar_type())).ok_or_else(|| MoeError::DType {
        op: "moe_experts",
        message: format!("{dtype}: the tensor-core grouped GEMM takes f16 or bf16"),
    })
}

/// The grouped GEMM's pipeline depth (the deepest).
pub(super) fn deepest_stages() -> u32 {
    *crate::gemm::tile::STAGES.last().unwrap_or(&2)
}

/// The tuning key of `experts` on `rows` dispatched rows: dtype, `[rows, E, H, I]` bucketed,
/// and the alignment class of the weights' starts and rows in bytes.
pub fn experts_key(experts: &SwiGluExperts, rows: usize) -> TuneKey {
    let size = experts.dtype().size() as u64;
    let mut starts: Vec<u64> = experts.weights().iter().map(|t| t.offset() as u64 * size).collect();
    starts.extend([experts.hidden() as u64 * size, experts.intermediate() as u64 * size]);
    let dims = [rows, experts.experts(), experts.hidden(), experts.intermediate()].map(|d| d as u64);
    TuneKey::new("moe_experts", experts.dtype().name(), &dims, alignment_class(&starts))
}

/// The tiles `tuner` picks for `experts` on `rows` dispatched rows, measuring with
/// `measure(tiles)` (median milliseconds, or why those tiles failed) on a cache miss. Testable
/// with injected timings.
pub fn tune_experts_with(
    tuner: &Autotuner,
    device: &Device,
    experts: &SwiGluExperts,
    rows: usize,
    measure: impl FnMut(ExpertTiles) -> std::result::Result<f64, String>,
) -> Result<Tuning<ExpertTiles>> {
    let dims = [rows, experts.experts(), experts.hidden(), experts.intermediate()];
    tune::<ExpertTileChoice>(tuner, device, &experts_key(experts, rows), dims, measure)
}

/// `tokens · top_k = rows` split as evenly as the experts allow: one token per row, each row
/// its own slot (`top_k = 1`), row `r` to expert `r · E / rows`.
fn even_plan(device: &Device, dtype: DType, rows: usize, experts: usize) -> Result<RoutingPlan> {
    let ids: Vec<u32> = (0..rows).map(|r| (r * experts / rows) as u32).collect();
    let weights = crate::api::cast(&Tensor::from_slice(device, &vec![1.0f32; rows], &[rows, 1])?, dtype)?;
    RoutingPlan::from_selection(Tensor::from_slice(device, &ids, &[rows, 1])?, weights, experts)
}

/// Time the expert block with `tiles` on `stream` over `rows` even rows (allocates).
fn measure_experts(
    stream: &Stream,
    experts: &SwiGluExperts,
    rows: usize,
    tiles: ExpertTiles,
) -> std::result::Result<f64, String> {
    let run = || -> Result<std::result::Result<f64, String>> {
        let device = stream.device();
        let plan = even_plan(device, experts.dtype(), rows, experts.experts())?;
        let input = Tensor::zeros(device, experts.dtype(), &[rows, experts.hidden()])?;
        let dispatched = plan.dispatch(&input)?;
        let workspace = ExpertsWorkspace::with_tiles(experts, rows, Some(tiles))?;
        let out = Tensor::empty(device, experts.dtype(), &[rows, experts.hidden()])?;
        Ok(measure_on_stream(stream, TUNE_ITERS, || {
            experts
                .forward_dispatched_into(
                    stream,
                    &dispatched,
                    super::experts::GroupedStrategy::TensorCore,
                    &workspace,
                    &out,
                )
                .map_err(|e| e.to_string())
        }))
    };
    run().map_err(|e| e.to_string())?
}

/// The tiles for `experts` on `rows` dispatched rows on `stream`'s GPU: `None` where tuning does
/// not apply (the CPU device, `RUDA_AUTOTUNE=off`, experts the tensor cores cannot take), else
/// the tuned choice, measured on the first call for the key (allocating and synchronising).
pub fn tuned_expert_tiles(
    stream: &Stream,
    experts: &SwiGluExperts,
    rows: usize,
) -> Result<Option<Tuning<ExpertTiles>>> {
    let Some(tuner) = tuner_for(stream.device())? else { return Ok(None) };
    if experts.tensor_core_obstacle(stream.device()).is_some() {
        return Ok(None);
    }
    let tuning =
        tune_experts_with(&tuner, stream.device(), experts, rows, |t| measure_experts(stream, experts, rows, t))?;
    Ok(Some(tuning))
}

/// Tune the experts of a `moe_experts` shape line on `stream`'s GPU with zero-filled weights
/// (timing does not depend on the values): `rows = tokens · top_k` dispatched rows. `None` where
/// tuning does not apply ([`tuned_expert_tiles`]).
pub fn tune_experts_shape(
    stream: &Stream,
    dtype: DType,
    [tokens, experts, top_k, hidden, inter]: [usize; 5],
) -> Result<Option<ruda_runtime::Choice>> {
    let device = stream.device();
    let gate_up = Tensor::zeros(device, dtype, &[experts, 2 * inter, hidden])?;
    let down = Tensor::zeros(device, dtype, &[experts, hidden, inter])?;
    let experts = SwiGluExperts::from_fused(gate_up, down)?;
    Ok(tuned_expert_tiles(stream, &experts, tokens * top_k)?.map(|t| t.choice))
}
