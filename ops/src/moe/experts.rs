//! Dispatch, the SwiGLU experts and the combine (ruDNN sections 5, 6 and 10):
//! [`RoutingPlan::dispatch`] groups token rows by expert ([`DispatchedTokens`]),
//! [`SwiGluExperts::forward_dispatched_with_strategy`] runs every expert's
//! `down(silu(gate x) · up x)` on its rows as grouped GEMMs, and
//! [`DispatchedTokens::combine`] adds each token's expert rows, weighted, back in token order.

use ruda_runtime::{DType, Device, LaunchConfig, Stream, Tensor};

use super::api::{route, route_sigmoid_grouped, GroupRoutingOptions, MoeError, RoutingOptions, RoutingPlan};
use super::dispatch::{
    moe_combine, moe_dispatch_count, moe_dispatch_scan, moe_dispatch_scatter, CombineConfig, CombineParams,
    DispatchCountConfig, DispatchCountParams, DispatchScanConfig, DispatchScanParams, DispatchScatterConfig,
    DispatchScatterParams, COMBINE_MAX_ROW_BLOCKS, COMBINE_THREADS, DISPATCH_CHUNK,
};
use super::grouped::{
    moe_grouped_simt, moe_grouped_tc, GroupedSimtConfig, GroupedSimtParams, GroupedTcConfig, GroupedTcParams,
    SIMT_THREADS,
};
use super::kernel::{route_threads, MAX_EXPERTS};
use super::tune::{deepest_stages, tuned_expert_tiles, ExpertTiles};
use crate::error::Result;
use crate::gemm::kernels::tc::GemmTcConfig;
use crate::gemm::tile::TcTile;
use crate::host::*;
use crate::params;
use crate::swiglu::api::swiglu_into;

/// How [`SwiGluExperts::forward_dispatched_with_strategy`] runs the grouped GEMMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupedStrategy {
    /// The tiled SIMT grouped GEMM: every float dtype and shape.
    Scalar,
    /// Tensor cores where the setup supports them (see [`GroupedStrategy::TensorCore`]), else
    /// Scalar. Only an unsupported setup falls back: a compile or launch failure is an error.
    Auto,
    /// The grouped tensor-core GEMM: f16/bf16 weights, hidden and intermediate sizes
    /// multiples of 8, weights starting 16-byte aligned, a device with `mma.sync` (sm_80+ or
    /// the interpreter). Anything else is a [`MoeError`].
    TensorCore,
}

/// Token rows grouped by expert (from [`RoutingPlan::dispatch`]) and the mapping back.
///
/// Entry `i = t · top_k + s` is token `t`'s slot `s` of the plan. Expert `e`'s rows are
/// `offsets[e]..offsets[e + 1]` of [`DispatchedTokens::rows`], in entry order (a stable
/// counting sort: the layout depends only on the routing). No entry is dropped: there are
/// `T · top_k` rows.
#[derive(Debug)]
pub struct DispatchedTokens {
    pub(super) rows: Tensor,
    pub(super) offsets: Tensor,
    pub(super) slot_rows: Tensor,
    row_slots: Tensor,
    pub(super) weights: Tensor,
    /// Per chunk of entries and expert (the count and scan kernels' workspace).
    counts: Tensor,
    tokens: usize,
    top_k: usize,
    experts: usize,
    hidden: usize,
}

/// `T · top_k`, and its chunks of [`DISPATCH_CHUNK`].
fn entries_and_chunks(tokens: usize, top_k: usize) -> (usize, usize) {
    let n = tokens * top_k;
    (n, n.div_ceil(DISPATCH_CHUNK as usize))
}

impl DispatchedTokens {
    /// Buffers for dispatching `tokens` rows of `hidden` elements of `dtype` to `top_k` of
    /// `experts` experts with [`RoutingPlan::dispatch_into`] (which then neither allocates nor
    /// waits).
    pub fn new(
        device: &Device,
        dtype: DType,
        tokens: usize,
        top_k: usize,
        experts: usize,
        hidden: usize,
    ) -> Result<DispatchedTokens> {
        let op = "moe_dispatch";
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(MoeError::DType { op, message: format!("{dtype} (expected f32, f16 or bf16)") });
        }
        if tokens == 0 || hidden == 0 {
            return Err(MoeError::Shape { op, message: format!("{tokens} tokens of {hidden} elements: empty") });
        }
        if !(1..=MAX_EXPERTS as usize).contains(&experts) {
            return Err(MoeError::InvalidArgument { op, message: format!("{experts} experts (1..={MAX_EXPERTS})") });
        }
        if !(1..=experts).contains(&top_k) {
            return Err(MoeError::InvalidArgument {
                op,
                message: format!("`top_k` = {top_k} must be in 1..={experts} (the experts)"),
            });
        }
        let (n, chunks) = entries_and_chunks(tokens, top_k);
        // Every index inside the kernels is a u32.
        to_u32(op, "rows (tokens · top_k)", n)?;
        to_u32(op, "elements of the dispatched rows", n * hidden)?;
        to_u32(op, "elements of the input", tokens * hidden)?;
        to_u32(op, "dispatch counts (chunks · experts)", chunks * experts)?;
        Ok(DispatchedTokens {
            rows: Tensor::empty(device, dtype, &[n, hidden])?,
            offsets: Tensor::empty(device, DType::U32, &[experts + 1])?,
            slot_rows: Tensor::empty(device, DType::U32, &[tokens, top_k])?,
            row_slots: Tensor::empty(device, DType::U32, &[n])?,
            weights: Tensor::empty(device, DType::F32, &[tokens, top_k])?,
            counts: Tensor::empty(device, DType::U32, &[chunks, experts])?,
            tokens,
            top_k,
            experts,
            hidden,
        })
    }

    /// The dispatched rows, `[T · top_k, H]` in the input's dtype, grouped by expert.
    pub fn rows(&self) -> &Tensor {
        &self.rows
    }

    /// `u32 [E + 1]`: expert `e`'s rows are `offsets[e]..offsets[e + 1]`; `offsets[E] = T ·
    /// top_k`.
    pub fn offsets(&self) -> &Tensor {
        &self.offsets
    }

    /// `u32 [T, top_k]`: the row of token `t`'s slot `s`.
    pub fn slot_rows(&self) -> &Tensor {
        &self.slot_rows
    }

    /// `u32 [T · top_k]`: the entry `t · top_k + s` (token `t`, slot `s`) of each row.
    pub fn row_slots(&self) -> &Tensor {
        &self.row_slots
    }

    /// `f32 [T, top_k]`: the plan's weights, widened, in token order (what the combine uses).
    pub fn weights(&self) -> &Tensor {
        &self.weights
    }

    pub fn tokens(&self) -> usize {
        self.tokens
    }

    pub fn top_k(&self) -> usize {
        self.top_k
    }

    pub fn experts(&self) -> usize {
        self.experts
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The dtype of the rows.
    pub fn dtype(&self) -> DType {
        self.rows.dtype()
    }

    /// Dispatched rows (`T · top_k`).
    pub fn len(&self) -> usize {
        self.tokens * self.top_k
    }

    /// Never: a dispatch has at least one token and one slot.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `out[t] = Σ_s w[t, s] · expert_out[slot_rows[t, s]]` for `expert_out` `[T · top_k, H]`
    /// in dispatched order and `out` `[T, H]`, both in the rows' dtype: `f32` fused
    /// multiply-adds in slot order, rounded once. A NaN weight (a routing row the contract
    /// calls unusable) makes its token's output NaN. Neither allocates nor waits.
    pub fn combine_into(&self, stream: &Stream, expert_out: &Tensor, out: &Tensor) -> Result<()> {
        let op = "moe_combine";
        let dtype = float_dtype(op, expert_out)?;
        contiguous_nonempty(op, "expert_out", expert_out)?;
        contiguous_nonempty(op, "out", out)?;
        expect_shape(op, "expert_out", expert_out, &[self.len(), self.hidden])?;
        expect_shape(op, "out", out, &[self.tokens, self.hidden])?;
        expect_dtype(op, "expert_out", expert_out, self.dtype())?;
        expect_dtype(op, "out", out, self.dtype())?;
        same_device(op, stream, &[("expert_out", expert_out), ("out", out), ("dispatched rows", &self.rows)])?;
        let cfg = CombineConfig { dtype };
        let k = kernel(cfg.id(), || moe_combine(&cfg))?;
        let hidden = to_u32(op, "hidden", self.hidden)?;
        let tokens = to_u32(op, "tokens", self.tokens)?;
        let launch = LaunchConfig {
            grid: [hidden.div_ceil(COMBINE_THREADS), tokens.min(COMBINE_MAX_ROW_BLOCKS), 1],
            block: [COMBINE_THREADS, 1, 1],
            dynamic_shared_bytes: 0,
        };
        let args = CombineParams {
            expert_out,
            slot_rows: &self.slot_rows,
            slot_weights: &self.weights,
            out,
            tokens,
            top_k: self.top_k as u32,
            hidden,
        };
        params::launch(stream, &k, launch, &args.args())
    }

    /// The weighted combine in token order (see [`DispatchedTokens::combine_into`]).
    pub fn combine(&self, expert_out: &Tensor) -> Result<Tensor> {
        let out = Tensor::empty(self.rows.device(), self.dtype(), &[self.tokens, self.hidden])?;
        self.combine_into(&self.rows.device().default_stream(), expert_out, &out)?;
        Ok(out)
    }
}

impl RoutingPlan {
    /// The expert ids (the contract's name for [`RoutingPlan::indices`]).
    pub fn expert_indices(&self) -> &Tensor {
        self.indices()
    }

    /// Group `input`'s rows (`[T, H]`, a float dtype, contiguous, `T` the plan's tokens) by
    /// expert into `out` (made by [`DispatchedTokens::new`] for this plan and input). Three
    /// launches, no atomics, no allocation, no wait.
    pub fn dispatch_into(&self, stream: &Stream, input: &Tensor, out: &DispatchedTokens) -> Result<()> {
        let op = "moe_dispatch";
        let dtype = float_dtype(op, input)?;
        contiguous_nonempty(op, "input", input)?;
        let &[tokens, hidden] = input.shape() else {
            return Err(MoeError::Shape {
                op,
                message: format!("`input` must be [tokens, hidden], is {:?}", input.shape()),
            });
        };
        if tokens != self.tokens() {
            return Err(MoeError::Shape {
                op,
                message: format!("`input` has {tokens} tokens, the routing plan {}", self.tokens()),
            });
        }
        let want = (self.tokens(), self.top_k(), self.experts(), hidden, input.dtype());
        let have = (out.tokens, out.top_k, out.experts, out.hidden, out.dtype());
        if want != have {
            return Err(MoeError::InvalidArgument {
                op,
                message: format!(
                    "the dispatch buffers are for (tokens, top_k, experts, hidden, dtype) = {have:?}, the plan and input \
                     need {want:?}"
                ),
            });
        }
        let (indices, weights) = (self.indices(), self.weights());
        same_device(
            op,
            stream,
            &[
                ("input", input),
                ("routing indices", indices),
                ("routing weights", weights),
                ("dispatched rows", &out.rows),
            ],
        )?;
        let (n, chunks) = entries_and_chunks(out.tokens, out.top_k);
        let (n, chunks) = (to_u32(op, "rows", n)?, to_u32(op, "chunks", chunks)?);
        let experts = out.experts as u32;

        let count_cfg = DispatchCountConfig { weight_dtype: weights.dtype().scalar_type() };
        let count = kernel(count_cfg.id(), || moe_dispatch_count(&count_cfg))?;
        let args = DispatchCountParams {
            indices,
            weights,
            counts: &out.counts,
            slot_weights: &out.weights,
            entries: n,
            experts,
        };
        params::launch(stream, &count, LaunchConfig::linear(chunks, DISPATCH_CHUNK), &args.args())?;

        let scan = kernel(DispatchScanConfig.id(), || moe_dispatch_scan(&DispatchScanConfig))?;
        let args = DispatchScanParams { counts: &out.counts, offsets: &out.offsets, chunks, experts };
        params::launch(stream, &scan, LaunchConfig::linear(1, route_threads(experts)), &args.args())?;

        let scatter_cfg = DispatchScatterConfig { dtype };
        let scatter = kernel(scatter_cfg.id(), || moe_dispatch_scatter(&scatter_cfg))?;
        let args = DispatchScatterParams {
            indices,
            counts: &out.counts,
            offsets: &out.offsets,
            input,
            rows: &out.rows,
            slot_rows: &out.slot_rows,
            row_slots: &out.row_slots,
            entries: n,
            experts,
            top_k: out.top_k as u32,
            hidden: hidden as u32,
        };
        params::launch(stream, &scatter, LaunchConfig::linear(chunks, DISPATCH_CHUNK), &args.args())
    }

    /// Group `input`'s rows (`[T, H]`) by expert (see [`RoutingPlan::dispatch_into`]), on the
    /// input's default stream.
    pub fn dispatch(&self, input: &Tensor) -> Result<DispatchedTokens> {
        let op = "moe_dispatch";
        float_dtype(op, input)?;
        let &[_, hidden] = input.shape() else {
            return Err(MoeError::Shape {
                op,
                message: format!("`input` must be [tokens, hidden], is {:?}", input.shape()),
            });
        };
        let out =
            DispatchedTokens::new(input.device(), input.dtype(), self.tokens(), self.top_k(), self.experts(), hidden)?;
        self.dispatch_into(&input.device().default_stream(), input, &out)?;
        Ok(out)
    }
}

/// The gate and up projections: separate `[E, I, H]` tensors or one fused `[E, 2I, H]` (gate
/// rows first, Hugging Face's `gate_up_proj`).
#[derive(Clone, Debug)]
pub(super) enum Projections {
    Split { gate: Tensor, up: Tensor },
    Fused(Tensor),
}

/// The routed experts of a SwiGLU MoE block: expert `e` maps a row `x [H]` to
/// `down[e] · (silu(gate[e] · x) ⊙ (up[e] · x))`. Made once and reused across batches.
#[derive(Debug)]
pub struct SwiGluExperts {
    pub(super) proj: Projections,
    pub(super) down: Tensor,
    pub(super) experts: usize,
    pub(super) hidden: usize,
    pub(super) inter: usize,
}

/// The intermediate buffers of [`SwiGluExperts::forward_dispatched_into`] for `rows`
/// dispatched rows: the gate/up projections `[rows, 2I]` and the activation `[rows, I]`; and
/// the tensor-core tiles its grouped GEMMs run (the heuristic's unless tuned).
#[derive(Debug)]
pub struct ExpertsWorkspace {
    pub(super) gate_up: Tensor,
    pub(super) act: Tensor,
    tiles: Option<ExpertTiles>,
}

impl ExpertsWorkspace {
    /// Buffers for `rows` dispatched rows of `experts`, the heuristic's tiles.
    pub fn new(experts: &SwiGluExperts, rows: usize) -> Result<ExpertsWorkspace> {
        ExpertsWorkspace::with_tiles(experts, rows, None)
    }

    /// Buffers whose tensor-core GEMMs run `tiles` (`None`: the heuristic's).
    pub fn with_tiles(experts: &SwiGluExperts, rows: usize, tiles: Option<ExpertTiles>) -> Result<ExpertsWorkspace> {
        let device = experts.down.device();
        let dtype = experts.dtype();
        Ok(ExpertsWorkspace {
            gate_up: Tensor::empty(device, dtype, &[rows, 2 * experts.inter])?,
            act: Tensor::empty(device, dtype, &[rows, experts.inter])?,
            tiles,
        })
    }

    /// Buffers with the tiles tuned for `rows` rows on `stream`'s GPU ([`tuned_expert_tiles`]:
    /// measured on the first call for the shape, allocating and synchronising, so make it
    /// before capturing); the heuristic's where tuning does not apply.
    pub fn tuned(stream: &Stream, experts: &SwiGluExperts, rows: usize) -> Result<ExpertsWorkspace> {
        let tiles = tuned_expert_tiles(stream, experts, rows)?.map(|t| t.value);
        ExpertsWorkspace::with_tiles(experts, rows, tiles)
    }

    /// The tiles chosen for these buffers, `None` for the heuristic's.
    pub fn tiles(&self) -> Option<ExpertTiles> {
        self.tiles
    }
}

/// What the grouped GEMMs run on, resolved from a [`GroupedStrategy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Simt,
    TensorCore,
}

/// The operands of one grouped GEMM launch.
#[derive(Clone, Copy)]
struct Grouped<'a> {
    x: &'a Tensor,
    w: &'a Tensor,
    y: &'a Tensor,
    offsets: &'a Tensor,
    experts: usize,
    rows: usize,
    n: usize,
    k: usize,
    ldy: usize,
    /// The tensor-core tile.
    tile: TcTile,
}

/// `[E, a, b]` of a weight, checked: a float dtype, contiguous, non-empty, rank 3.
fn weight_dims(op: &'static str, name: &str, t: &Tensor) -> Result<[usize; 3]> {
    float_dtype(op, t)?;
    contiguous_nonempty(op, name, t)?;
    match *t.shape() {
        [e, a, b] => Ok([e, a, b]),
        _ => {
            Err(MoeError::Shape { op, message: format!("`{name}` must be [experts, rows, cols], is {:?}", t.shape()) })
        }
    }
}

impl SwiGluExperts {
    /// Experts from `gate` and `up` (`[E, I, H]`) and `down` (`[E, H, I]`), all of one float
    /// dtype, contiguous, on one device; `E ≤ 1024` (the router's limit).
    pub fn new(gate: Tensor, up: Tensor, down: Tensor) -> Result<SwiGluExperts> {
        let op = "moe_experts";
        let [e, i, h] = weight_dims(op, "gate", &gate)?;
        weight_dims(op, "up", &up)?;
        expect_shape(op, "up", &up, &[e, i, h])?;
        expect_dtype(op, "up", &up, gate.dtype())?;
        let experts = SwiGluExperts::build(op, Projections::Split { gate, up }, down, [e, i, h])?;
        Ok(experts)
    }

    /// Experts from a fused `gate_up` (`[E, 2I, H]`, the gate's `I` rows first, Hugging Face's
    /// `gate_up_proj`) and `down` (`[E, H, I]`).
    pub fn from_fused(gate_up: Tensor, down: Tensor) -> Result<SwiGluExperts> {
        let op = "moe_experts";
        let [e, two_i, h] = weight_dims(op, "gate_up", &gate_up)?;
        if two_i % 2 == 1 {
            return Err(MoeError::Shape {
                op,
                message: format!("`gate_up` is {:?}: its rows (2 · intermediate) must be even", gate_up.shape()),
            });
        }
        SwiGluExperts::build(op, Projections::Fused(gate_up), down, [e, two_i / 2, h])
    }

    fn build(op: &'static str, proj: Projections, down: Tensor, [e, i, h]: [usize; 3]) -> Result<SwiGluExperts> {
        let first = match &proj {
            Projections::Split { gate, .. } => gate,
            Projections::Fused(gu) => gu,
        };
        weight_dims(op, "down", &down)?;
        expect_shape(op, "down", &down, &[e, h, i])?;
        expect_dtype(op, "down", &down, first.dtype())?;
        let mut all = vec![("down", &down)];
        match &proj {
            Projections::Split { gate, up } => all.extend([("gate", gate), ("up", up)]),
            Projections::Fused(gu) => all.push(("gate_up", gu)),
        }
        same_device(op, &first.device().default_stream(), &all)?;
        if e > MAX_EXPERTS as usize {
            return Err(MoeError::InvalidArgument {
                op,
                message: format!("{e} experts; routing takes at most {MAX_EXPERTS}"),
            });
        }
        // One expert's weight is addressed with u32 element indices.
        to_u32(op, "elements of one expert's gate_up", 2 * i * h)?;
        Ok(SwiGluExperts { proj, down, experts: e, hidden: h, inter: i })
    }

    /// Experts (`E`).
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Hidden size (`H`).
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Intermediate size (`I`).
    pub fn intermediate(&self) -> usize {
        self.inter
    }

    pub fn dtype(&self) -> DType {
        self.down.dtype()
    }

    pub fn device(&self) -> &Device {
        self.down.device()
    }

    pub(super) fn weights(&self) -> Vec<&Tensor> {
        let mut all = vec![&self.down];
        match &self.proj {
            Projections::Split { gate, up } => all.extend([gate, up]),
            Projections::Fused(gu) => all.push(gu),
        }
        all
    }

    /// Why the tensor-core path cannot take these experts on `device`, if it cannot.
    pub(super) fn tensor_core_obstacle(&self, device: &Device) -> Option<MoeError> {
        let op = "moe_experts";
        if GemmTcConfig::mma_type(self.dtype().scalar_type()).is_none() {
            return Some(MoeError::DType {
                op,
                message: format!("{} experts: the tensor-core grouped GEMM takes f16 or bf16", self.dtype()),
            });
        }
        let multiple = GemmTcConfig::K_MULTIPLE as usize;
        if !self.hidden.is_multiple_of(multiple) || !self.inter.is_multiple_of(multiple) {
            return Some(MoeError::InvalidArgument {
                op,
                message: format!(
                    "the tensor-core grouped GEMM needs hidden ({}) and intermediate ({}) sizes that are multiples of \
                     {multiple} (16-byte row loads); use GroupedStrategy::Scalar",
                    self.hidden, self.inter
                ),
            });
        }
        if let Some(t) = self.weights().into_iter().find(|t| !(t.offset() * t.dtype().size()).is_multiple_of(16)) {
            return Some(MoeError::InvalidArgument {
                op,
                message: format!(
                    "an expert weight starts {} bytes into its buffer; the tensor-core grouped GEMM needs 16-byte \
                     aligned weights",
                    t.offset() * t.dtype().size()
                ),
            });
        }
        if let Some(info) = device.cuda_info() {
            if info.compute_capability.0 < 8 {
                return Some(MoeError::InvalidArgument {
                    op,
                    message: format!(
                        "{device} (compute capability {}.{}) has no mma.sync for f16/bf16; sm_80 or newer is needed",
                        info.compute_capability.0, info.compute_capability.1
                    ),
                });
            }
        }
        None
    }

    fn engine(&self, device: &Device, strategy: GroupedStrategy) -> Result<Engine> {
        match strategy {
            GroupedStrategy::Scalar => Ok(Engine::Simt),
            GroupedStrategy::Auto => {
                Ok(if self.tensor_core_obstacle(device).is_none() { Engine::TensorCore } else { Engine::Simt })
            }
            GroupedStrategy::TensorCore => match self.tensor_core_obstacle(device) {
                Some(e) => Err(e),
                None => Ok(Engine::TensorCore),
            },
        }
    }

    /// One grouped GEMM launch: `y[r] = x[r] · w[e]ᵀ` over every expert's rows.
    fn grouped_gemm(&self, stream: &Stream, engine: Engine, g: Grouped<'_>) -> Result<()> {
        let op = "moe_experts";
        let dtype = self.dtype().scalar_type();
        // Element indices of x and y are u32 inside the kernels (the weight offset is u64).
        to_u32(op, "elements of the dispatched rows", g.rows * g.k)?;
        to_u32(op, "elements of an expert output", g.rows * g.ldy)?;
        let (rows, experts) = (to_u32(op, "rows", g.rows)?, g.experts as u32);
        let (n, k, ldy) = (g.n as u32, g.k as u32, g.ldy as u32);
        let w_stride = to_u32(op, "elements of one expert's weight", g.n * g.k)?;
        let too_many = |tiles: u32| MoeError::InvalidArgument {
            op,
            message: format!("{} dispatched rows need {tiles} row tiles; one launch takes at most 65535", g.rows),
        };
        match engine {
            Engine::Simt => {
                let cfg = GroupedSimtConfig { dtype };
                let grid = GroupedSimtConfig::grid(rows, experts, n);
                if grid[1] > 65535 {
                    return Err(too_many(grid[1]));
                }
                let kern = kernel(cfg.id(), || moe_grouped_simt(&cfg))?;
                let launch = LaunchConfig { grid, block: [SIMT_THREADS, 1, 1], dynamic_shared_bytes: 0 };
                let args =
                    GroupedSimtParams { x: g.x, w: g.w, y: g.y, offsets: g.offsets, experts, n, k, ldy, w_stride };
                params::launch(stream, &kern, launch, &args.args())
            }
            Engine::TensorCore => {
                let ty = GemmTcConfig::mma_type(dtype).ok_or_else(|| MoeError::DType {
                    op,
                    message: format!("{dtype}: the tensor-core grouped GEMM takes f16 or bf16"),
                })?;
                let cfg = GroupedTcConfig { ty, tile: g.tile, stages: deepest_stages() };
                let grid = cfg.grid(rows, experts, n);
                if grid[1] > 65535 {
                    return Err(too_many(grid[1]));
                }
                let kern = kernel(cfg.id(), || moe_grouped_tc(&cfg))?;
                let launch = LaunchConfig { grid, block: [cfg.threads(), 1, 1], dynamic_shared_bytes: 0 };
                let args = GroupedTcParams { x: g.x, w: g.w, y: g.y, offsets: g.offsets, experts, n, k, ldy, w_stride };
                params::launch(stream, &kern, launch, &args.args())
            }
        }
    }

    pub(super) fn check_dispatched(&self, op: &'static str, d: &DispatchedTokens) -> Result<()> {
        if d.experts != self.experts || d.hidden != self.hidden {
            return Err(MoeError::Shape {
                op,
                message: format!(
                    "the dispatch is for {} experts of hidden size {}, the experts are {} of hidden size {}",
                    d.experts, d.hidden, self.experts, self.hidden
                ),
            });
        }
        expect_dtype(op, "dispatched rows", &d.rows, self.dtype())
    }

    /// Every expert on its dispatched rows into `out` (`[T · top_k, H]`, the experts' dtype),
    /// as `strategy` says: the gate/up grouped GEMM(s) into `workspace`, SwiGLU (`f32`, one
    /// rounding), the down grouped GEMM. Each product accumulates in `f32` and is rounded to
    /// the dtype once. Neither allocates nor waits.
    pub fn forward_dispatched_into(
        &self,
        stream: &Stream,
        dispatched: &DispatchedTokens,
        strategy: GroupedStrategy,
        workspace: &ExpertsWorkspace,
        out: &Tensor,
    ) -> Result<()> {
        let op = "moe_experts";
        self.check_dispatched(op, dispatched)?;
        let rows = dispatched.len();
        let (h, i) = (self.hidden, self.inter);
        expect_tensor(op, "out", out, self.dtype(), &[rows, h])?;
        for (name, t, cols) in [("workspace gate_up", &workspace.gate_up, 2 * i), ("workspace act", &workspace.act, i)]
        {
            expect_shape(op, name, t, &[rows, cols])?;
            expect_dtype(op, name, t, self.dtype())?;
        }
        let mut all = vec![
            ("out", out),
            ("dispatched rows", &dispatched.rows),
            ("workspace gate_up", &workspace.gate_up),
            ("workspace act", &workspace.act),
        ];
        all.extend(self.weights().into_iter().map(|w| ("expert weights", w)));
        same_device(op, stream, &all)?;
        let engine = self.engine(stream.device(), strategy)?;
        let tiles = workspace.tiles.unwrap_or_else(|| ExpertTiles::heuristic(rows, self.experts, h, i));
        let offsets = &dispatched.offsets;
        let x = &dispatched.rows;
        let base = Grouped {
            x,
            w: &self.down,
            y: out,
            offsets,
            experts: self.experts,
            rows,
            n: i,
            k: h,
            ldy: 2 * i,
            tile: tiles.gate_up,
        };
        match &self.proj {
            Projections::Split { gate, up } => {
                let gate_out = workspace.gate_up.narrow(1, 0, i)?;
                let up_out = workspace.gate_up.narrow(1, i, i)?;
                self.grouped_gemm(stream, engine, Grouped { w: gate, y: &gate_out, ..base })?;
                self.grouped_gemm(stream, engine, Grouped { w: up, y: &up_out, ..base })?;
            }
            Projections::Fused(gu) => {
                self.grouped_gemm(stream, engine, Grouped { w: gu, y: &workspace.gate_up, n: 2 * i, ..base })?;
            }
        }
        swiglu_into(stream, &workspace.gate_up, &workspace.act)?;
        let down = Grouped { x: &workspace.act, w: &self.down, y: out, n: h, k: i, ldy: h, tile: tiles.down, ..base };
        self.grouped_gemm(stream, engine, down)
    }

    /// Every expert on its dispatched rows with `strategy` (see
    /// [`SwiGluExperts::forward_dispatched_into`]): `[T · top_k, H]` in dispatched order. On a
    /// GPU the tensor cores run the tiles tuned for the shape ([`ExpertsWorkspace::tuned`]).
    pub fn forward_dispatched_with_strategy(
        &self,
        dispatched: &DispatchedTokens,
        strategy: GroupedStrategy,
    ) -> Result<Tensor> {
        self.check_dispatched("moe_experts", dispatched)?;
        let device = dispatched.rows.device();
        let out = Tensor::empty(device, self.dtype(), &[dispatched.len(), self.hidden])?;
        let workspace = match strategy {
            GroupedStrategy::Scalar => ExpertsWorkspace::new(self, dispatched.len())?,
            _ => ExpertsWorkspace::tuned(&device.default_stream(), self, dispatched.len())?,
        };
        self.forward_dispatched_into(&device.default_stream(), dispatched, strategy, &workspace, &out)?;
        Ok(out)
    }

    /// Every expert on its dispatched rows with [`GroupedStrategy::Scalar`].
    pub fn forward_dispatched(&self, dispatched: &DispatchedTokens) -> Result<Tensor> {
        self.forward_dispatched_with_strategy(dispatched, GroupedStrategy::Scalar)
    }

    /// `input` `[T, H]` and `logits` `[T, E]` agree with each other and with the experts.
    fn check_input(&self, input: &Tensor, logits: &Tensor) -> Result<()> {
        let op = "moe_experts";
        float_dtype(op, input)?;
        let (&[t, h], &[tl, e]) = (input.shape(), logits.shape()) else {
            return Err(MoeError::Shape {
                op,
                message: format!(
                    "expected input [tokens, hidden] and logits [tokens, experts], got {:?} and {:?}",
                    input.shape(),
                    logits.shape()
                ),
            });
        };
        if t != tl || h != self.hidden || e != self.experts {
            return Err(MoeError::Shape {
                op,
                message: format!(
                    "input {:?} and logits {:?} for {} experts of hidden size {}",
                    input.shape(),
                    logits.shape(),
                    self.experts,
                    self.hidden
                ),
            });
        }
        expect_dtype(op, "input", input, self.dtype())
    }

    fn run(&self, plan: &RoutingPlan, input: &Tensor, strategy: GroupedStrategy) -> Result<Tensor> {
        let dispatched = plan.dispatch(input)?;
        let expert_out = self.forward_dispatched_with_strategy(&dispatched, strategy)?;
        dispatched.combine(&expert_out)
    }

    /// The routed MoE block on `input` (`[T, H]`) with router `logits` (`[T, E]`): softmax
    /// top-k routing, dispatch, the experts ([`GroupedStrategy::Scalar`]), combine → `[T, H]`.
    pub fn forward(&self, input: &Tensor, logits: &Tensor, options: RoutingOptions) -> Result<Tensor> {
        self.forward_with_strategy(input, logits, options, GroupedStrategy::Scalar)
    }

    /// [`SwiGluExperts::forward`] with the experts run as `strategy` says.
    pub fn forward_with_strategy(
        &self,
        input: &Tensor,
        logits: &Tensor,
        options: RoutingOptions,
        strategy: GroupedStrategy,
    ) -> Result<Tensor> {
        self.check_input(input, logits)?;
        let plan = route(logits, options)?;
        self.run(&plan, input, strategy)
    }

    /// The routed MoE block with group-limited sigmoid routing ([`route_sigmoid_grouped`]:
    /// `bias` an optional `f32 [E]` correction for selection), the experts run as `strategy`
    /// says.
    pub fn forward_sigmoid_grouped(
        &self,
        input: &Tensor,
        logits: &Tensor,
        bias: Option<&Tensor>,
        options: GroupRoutingOptions,
        strategy: GroupedStrategy,
    ) -> Result<Tensor> {
        self.check_input(input, logits)?;
        let plan = route_sigmoid_grouped(logits, bias, options)?;
        self.run(&plan, input, strategy)
    }
}
