//! The routed experts for a decode step (at most [`EXPERTS_DECODE_MAX_TOKENS`] tokens), where a
//! grouped GEMM would multiply padding and a dispatch cost more than the rows it moves. Each
//! selected expert's weights are read once per step, as the GEMV reads a linear's:
//!
//! 1. [`moe_decode`] (`moe_decode_gate_up[_fused]`): `act[s, i] = silu(gate_e[i] · x[t]) ·
//!    (up_e[i] · x[t])` per routing slot `s = t · top_k + j`, its expert `e = indices[s]`;
//! 2. [`moe_decode`] (`moe_decode_down`): `y[s, c] = down_e[c] · act[s]`, rows in slot order;
//! 3. [`moe_combine_slots`]: `out[t] = Σ_j w[t, j] · y[t · top_k + j]` (the combine of
//!    [`super::dispatch`] without a dispatch map).
//!
//! **Schedule.** Block row `s` of the projections belongs to slot `s`'s expert `e`, and only
//! the first slot with that expert does the work (the block walks the earlier slots' ids: a
//! broadcast, uniform control flow); the others exit, so an expert picked by several tokens is
//! still read once. A warp computes one output column for every token of the step (the GEMV's
//! lane split and loads, [`WarpDot`]), `m_tile` tokens compiled in, and stores the columns of
//! the tokens that picked `e`, at each slot that names it (an id may repeat within a token). A
//! token that did not pick `e` costs arithmetic, not memory, which the step has to spare. An id
//! past the last expert is clamped to it, as the dispatch does.
//!
//! **Numerics.** Every product accumulates in `f32`; gate and up are rounded to the dtype before
//! SwiGLU (as the grouped path stores them), which runs in `f32` and rounds once; the down
//! product and the combine each round once. The sums run in the GEMV's order, not the grouped
//! GEMM's, so the two paths agree to rounding, not bit for bit.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, Value, VerifyError};
use ruda_runtime::{LaunchConfig, Stream, Tensor};

use super::api::{MoeError, RoutingPlan};
use super::dispatch::{combine_body, COMBINE_MAX_ROW_BLOCKS, COMBINE_THREADS};
use super::experts::{Projections, SwiGluExperts};
use crate::blocks::{round_to, row_ptr, silu, store_from_f32, warp_reduce, Combine, FLOAT_DTYPES};
use crate::error::Result;
use crate::family::Family;
use crate::gemv::kernel::{GemvLoads, WarpDot, GEMV_THREADS, GEMV_WARPS};
use crate::host::*;
use crate::params;
use crate::problem::{id_number, Case};
use crate::registry::Registered;

/// The most tokens the decode path takes; more go through the dispatch and grouped GEMMs.
pub const EXPERTS_DECODE_MAX_TOKENS: usize = 8;
/// The compiled token counts; a launch uses the smallest that covers its tokens.
pub const DECODE_TOKEN_TILES: [u32; 4] = [1, 2, 4, 8];

/// Which projection a decode kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeProjection {
    /// Gate and up together, then SwiGLU: `[T, H]` → `[T · top_k, I]`, gate and up in two
    /// tensors.
    GateUp,
    /// The same from one `[E, 2I, H]` tensor, each expert's up rows `up_offset` elements after
    /// its gate rows.
    GateUpFused,
    /// Down: `[T · top_k, I]` → `[T · top_k, H]`.
    Down,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeConfig {
    pub dtype: ScalarType,
    pub projection: DecodeProjection,
    /// Tokens compiled in (one of [`DECODE_TOKEN_TILES`]).
    pub m_tile: u32,
    pub loads: GemvLoads,
}

impl DecodeConfig {
    /// `moe_decode_gate_up.bf16.m1`, `moe_decode_down.f32.m8.scalar`.
    pub fn id(&self) -> String {
        let loads = if self.loads == GemvLoads::Scalar { ".scalar" } else { "" };
        format!("{}.{}.m{}{loads}", self.projection.name(), self.dtype, self.m_tile)
    }

    fn warp_dot(&self) -> WarpDot {
        // Gate and up are two rows in flight per chunk: half the GEMV's unroll for as many
        // loads, and one group at 8 tokens, whose accumulators take the registers.
        let unroll = match (self.projection, self.m_tile) {
            (DecodeProjection::Down, 1..=4) => 4,
            (DecodeProjection::Down, _) | (_, 1..=4) => 2,
            _ => 1,
        };
        WarpDot { dtype: self.dtype, loads: self.loads, unroll }
    }

    /// Elements per load.
    pub fn chunk(&self) -> u32 {
        self.warp_dot().chunk()
    }

    /// Grid for `n` output columns and `slots` routing slots.
    pub fn grid(n: u32, slots: u32) -> [u32; 3] {
        [n.div_ceil(GEMV_WARPS), slots, 1]
    }
}

impl DecodeProjection {
    pub const ALL: [DecodeProjection; 3] =
        [DecodeProjection::GateUp, DecodeProjection::GateUpFused, DecodeProjection::Down];

    /// The kernel's name (and family name).
    pub fn name(self) -> &'static str {
        match self {
            DecodeProjection::GateUp => "moe_decode_gate_up",
            DecodeProjection::GateUpFused => "moe_decode_gate_up_fused",
            DecodeProjection::Down => "moe_decode_down",
        }
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_decode`], in order: for gate/up `x` the tokens, `w` the gate,
    /// `up`, `y` the activations; for down `x` the activations, `w` the down weights, `y`.
    pub struct DecodeParams, DecodeValues for DecodeConfig as cfg {
        x: tensor(cfg.dtype),
        indices: tensor(ScalarType::U32),
        w: tensor(cfg.dtype),
        up: opt_tensor(cfg.dtype, cfg.projection == DecodeProjection::GateUp),
        y: tensor(cfg.dtype),
        tokens: scalar(u32),
        top_k: scalar(u32),
        experts: scalar(u32),
        n: scalar(u32),
        k: scalar(u32),
        w_stride: scalar(u32),
        up_offset: opt_scalar(u32, cfg.projection == DecodeProjection::GateUpFused),
    }
}

/// `min(indices[slot], experts - 1)`.
#[track_caller]
fn expert_of(b: &mut KernelBuilder, indices: Value, last: Value, slot: Value) -> Value {
    let p = b.ptr_add(indices, slot);
    let e = b.load(p);
    b.min(e, last)
}

/// Gate/up (with SwiGLU) or down for one step's slots. Parameters: x (`[T, K]`: the tokens, or
/// the slots' activations for down), indices (`u32 [T · top_k]`), w (`[E, n, K]`, experts
/// `w_stride` elements apart: gate, gate/up fused, or down), up (split gate/up only, strided as
/// `w`), y (`[T · top_k, n]`), tokens, top_k, experts, n, k, w_stride, and for fused gate/up
/// up_offset (`u32`). Grid [`DecodeConfig::grid`], block [`GEMV_THREADS`]; `k` a multiple of
/// [`DecodeConfig::chunk`].
pub fn moe_decode(cfg: &DecodeConfig) -> std::result::Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let DecodeValues { x, indices, w, up, y, tokens, top_k, experts, n, k, w_stride, up_offset } =
        DecodeParams::declare(&mut b, cfg);
    b.launch_bounds(GEMV_THREADS, None);
    let (zero, one) = (b.const_u32(0), b.const_u32(1));
    let tid = b.thread_id_x();
    let five = b.const_u32(5);
    let warp = b.shr(tid, five);
    let lane = b.lane_id();
    let warps = b.const_u32(GEMV_WARPS);
    let block = b.block_id_x();
    let col = b.fma(block, warps, warp);
    let slot = b.block_id_y();
    let last_expert = b.sub(experts, one);
    let e = expert_of(&mut b, indices, last_expert, slot);
    // Only the first slot naming `e` runs it.
    let earlier = b.for_range(zero, slot, one, &[zero], |b, s, acc| {
        let other = expert_of(b, indices, last_expert, s);
        let same = b.eq(other, e);
        vec![b.select(same, one, acc[0])]
    })[0];
    let first = b.eq(earlier, zero);
    let col_ok = b.lt(col, n);
    let run = b.and(first, col_ok);
    // Uniform per warp, so its shuffles see every lane.
    b.if_then(run, |b| {
        let e64 = b.cvt(e, ScalarType::U64);
        let s64 = b.cvt(w_stride, ScalarType::U64);
        let off = b.mul(e64, s64);
        let w_e = b.ptr_add(w, off);
        let mut w_rows = vec![row_ptr(b, w_e, col, k)];
        if let Some(up) = up {
            let up_e = b.ptr_add(up, off);
            w_rows.push(row_ptr(b, up_e, col, k));
        }
        if let Some(up_offset) = up_offset {
            let up_e = b.ptr_add(w_e, up_offset);
            w_rows.push(row_ptr(b, up_e, col, k));
        }
        let last_token = b.sub(tokens, one);
        // Token `t`'s input row: its own for gate/up; for down, the activation of its first
        // slot naming `e` (slot `s` itself when it names none, a row never stored).
        let x_rows: Vec<Value> = (0..cfg.m_tile)
            .map(|t| {
                let t = b.const_u32(t);
                let t = b.min(t, last_token);
                let row = match cfg.projection {
                    DecodeProjection::GateUp | DecodeProjection::GateUpFused => t,
                    DecodeProjection::Down => {
                        let base = b.mul(t, top_k);
                        let found = b.for_range(zero, top_k, one, &[slot, zero], |b, j, acc| {
                            let s = b.add(base, j);
                            let other = expert_of(b, indices, last_expert, s);
                            let same = b.eq(other, e);
                            let unseen = b.eq(acc[1], zero);
                            let take = b.and(same, unseen);
                            vec![b.select(take, s, acc[0]), b.select(same, one, acc[1])]
                        });
                        found[0]
                    }
                };
                row_ptr(b, x, row, k)
            })
            .collect();
        let shift = b.const_u32(cfg.chunk().trailing_zeros());
        let chunks = b.shr(k, shift);
        let acc = cfg.warp_dot().lane_dots(b, &w_rows, &x_rows, zero, chunks);
        let totals: Vec<Value> = acc.iter().map(|&a| warp_reduce(b, Combine::Sum, a)).collect();
        let m = cfg.m_tile as usize;
        let lane0 = b.eq(lane, zero);
        for t in 0..m {
            let value = match cfg.projection {
                DecodeProjection::GateUp | DecodeProjection::GateUpFused => {
                    let g = round_to(b, cfg.dtype, totals[t]);
                    let u = round_to(b, cfg.dtype, totals[m + t]);
                    let s = silu(b, g);
                    b.mul(s, u)
                }
                DecodeProjection::Down => totals[t],
            };
            let t = b.const_u32(t as u32);
            let real = b.lt(t, tokens);
            let store = b.and(lane0, real);
            b.if_then(store, |b| {
                let base = b.mul(t, top_k);
                b.for_each(zero, top_k, one, |b, j| {
                    let s = b.add(base, j);
                    let other = expert_of(b, indices, last_expert, s);
                    let same = b.eq(other, e);
                    b.if_then(same, |b| {
                        let dst = row_ptr(b, y, s, n);
                        store_from_f32(b, dst, col, value);
                    });
                });
            });
        }
    });
    b.finish()
}

/// The combine of expert rows in slot order, with routing weights of `weight_dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotCombineConfig {
    pub dtype: ScalarType,
    pub weight_dtype: ScalarType,
}

impl SlotCombineConfig {
    /// `moe_combine_slots.bf16.wf32`.
    pub fn id(&self) -> String {
        format!("moe_combine_slots.{}.w{}", self.dtype, self.weight_dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_combine_slots`], in order.
    pub struct SlotCombineParams, SlotCombineValues for SlotCombineConfig as cfg {
        expert_out: tensor(cfg.dtype),
        weights: tensor(cfg.weight_dtype),
        out: tensor(cfg.dtype),
        tokens: scalar(u32),
        top_k: scalar(u32),
        hidden: scalar(u32),
    }
}

/// `out[t, c] = Σ_j weights[t, j] · expert_out[t · top_k + j, c]` in `f32` (fused
/// multiply-adds in slot order), rounded once. Parameters: expert_out (`[T · top_k, H]`),
/// weights (`[T, top_k]`), out (`[T, H]`), tokens, top_k, hidden (`u32`). Grid `(ceil(H / 256),
/// min(T, 65535))`, block [`COMBINE_THREADS`].
pub fn moe_combine_slots(cfg: &SlotCombineConfig) -> std::result::Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let SlotCombineValues { expert_out, weights, out, tokens, top_k, hidden } = SlotCombineParams::declare(&mut b, cfg);
    combine_body(&mut b, expert_out, None, weights, out, [tokens, top_k, hidden]);
    b.finish()
}

/// The decode path's buffers for a step of `tokens` tokens: the slots' activations `[T · top_k,
/// I]` and expert rows `[T · top_k, H]`.
#[derive(Debug)]
pub struct ExpertsDecodeWorkspace {
    act: Tensor,
    expert_out: Tensor,
    tokens: usize,
    top_k: usize,
}

impl ExpertsDecodeWorkspace {
    /// Buffers for `tokens` tokens (at most [`EXPERTS_DECODE_MAX_TOKENS`]) of `top_k` slots each.
    pub fn new(experts: &SwiGluExperts, tokens: usize, top_k: usize) -> Result<ExpertsDecodeWorkspace> {
        let op = "moe_experts_decode";
        if !(1..=EXPERTS_DECODE_MAX_TOKENS).contains(&tokens) || !(1..=experts.experts()).contains(&top_k) {
            return Err(MoeError::InvalidArgument {
                op,
                message: format!(
                    "{tokens} tokens of top {top_k}: the decode path takes 1..={EXPERTS_DECODE_MAX_TOKENS} tokens and 1 <= \
                     top_k <= {} experts",
                    experts.experts()
                ),
            });
        }
        let (device, dtype) = (experts.device(), experts.dtype());
        Ok(ExpertsDecodeWorkspace {
            act: Tensor::empty(device, dtype, &[tokens * top_k, experts.intermediate()])?,
            expert_out: Tensor::empty(device, dtype, &[tokens * top_k, experts.hidden()])?,
            tokens,
            top_k,
        })
    }
}

/// One decode launch's operands.
struct DecodeLaunch<'a> {
    x: &'a Tensor,
    w: &'a Tensor,
    up: Option<&'a Tensor>,
    up_offset: Option<usize>,
    y: &'a Tensor,
    n: usize,
    k: usize,
    w_stride: usize,
}

impl SwiGluExperts {
    /// Whether `tensors` allow 16-byte loads along rows of `k` elements.
    fn vector_loads(&self, k: usize, tensors: &[&Tensor]) -> GemvLoads {
        let chunk = 16 / self.dtype().size();
        let aligned = tensors.iter().all(|t| (t.offset() * t.dtype().size()).is_multiple_of(16));
        if k.is_multiple_of(chunk) && aligned {
            GemvLoads::Vector
        } else {
            GemvLoads::Scalar
        }
    }

    fn decode_launch(
        &self,
        stream: &Stream,
        projection: DecodeProjection,
        plan: &RoutingPlan,
        l: DecodeLaunch<'_>,
    ) -> Result<()> {
        let op = "moe_experts_decode";
        let tokens = plan.tokens();
        let m_tile = DECODE_TOKEN_TILES.into_iter().find(|&m| m as usize >= tokens).ok_or_else(|| {
            MoeError::InvalidArgument {
                op,
                message: format!("{tokens} tokens; the decode path takes at most {EXPERTS_DECODE_MAX_TOKENS}"),
            }
        })?;
        let mut all = vec![l.x, l.w, l.y];
        all.extend(l.up);
        let loads = self.vector_loads(l.k, &all);
        let cfg = DecodeConfig { dtype: self.dtype().scalar_type(), projection, m_tile, loads };
        let slots = to_u32(op, "routing slots", tokens * plan.top_k())?;
        let kern = kernel(cfg.id(), || moe_decode(&cfg))?;
        let launch = LaunchConfig {
            grid: DecodeConfig::grid(l.n as u32, slots),
            block: [GEMV_THREADS, 1, 1],
            dynamic_shared_bytes: 0,
        };
        let args = DecodeParams {
            x: l.x,
            indices: plan.indices(),
            w: l.w,
            up: l.up,
            y: l.y,
            tokens: tokens as u32,
            top_k: plan.top_k() as u32,
            experts: self.experts as u32,
            n: l.n as u32,
            k: l.k as u32,
            w_stride: to_u32(op, "elements of one expert's weight", l.w_stride)?,
            up_offset: l.up_offset.map(|o| o as u32),
        };
        params::launch(stream, &kern, launch, &args.args())
    }

    /// The routed MoE block for a decode step into `out` (`[T, H]`): `input` `[T, H]` (`T ≤`
    /// [`EXPERTS_DECODE_MAX_TOKENS`]) through the experts `plan` selects, each selected expert's
    /// weights read once, and combined with the plan's weights. Three launches, no dispatch;
    /// neither allocates nor waits. Agrees with the dispatched path to rounding.
    pub fn forward_decode_into(
        &self,
        stream: &Stream,
        input: &Tensor,
        plan: &RoutingPlan,
        workspace: &ExpertsDecodeWorkspace,
        out: &Tensor,
    ) -> Result<()> {
        let op = "moe_experts_decode";
        let (t, k, h, i) = (plan.tokens(), plan.top_k(), self.hidden, self.inter);
        float_dtype(op, input)?;
        contiguous_nonempty(op, "input", input)?;
        contiguous_nonempty(op, "out", out)?;
        expect_shape(op, "input", input, &[t, h])?;
        expect_shape(op, "out", out, &[t, h])?;
        expect_dtype(op, "input", input, self.dtype())?;
        expect_dtype(op, "out", out, self.dtype())?;
        if plan.experts() != self.experts {
            return Err(MoeError::Shape {
                op,
                message: format!("the plan routes over {} experts, the experts are {}", plan.experts(), self.experts),
            });
        }
        if (workspace.tokens, workspace.top_k) != (t, k) || workspace.act.dtype() != self.dtype() {
            return Err(MoeError::Shape {
                op,
                message: format!(
                    "the workspace is for {} tokens of top {} in {}, the step is {t} of top {k} in {}",
                    workspace.tokens,
                    workspace.top_k,
                    workspace.act.dtype(),
                    self.dtype()
                ),
            });
        }
        let mut all = vec![
            ("input", input),
            ("out", out),
            ("indices", plan.indices()),
            ("weights", plan.weights()),
            ("workspace", &workspace.act),
            ("workspace", &workspace.expert_out),
        ];
        all.extend(self.weights().into_iter().map(|w| ("expert weights", w)));
        same_device(op, stream, &all)?;
        let act = &workspace.act;
        let base =
            DecodeLaunch { x: input, w: &self.down, up: None, up_offset: None, y: act, n: i, k: h, w_stride: i * h };
        let (projection, gate_up) = match &self.proj {
            Projections::Split { gate, up } => {
                (DecodeProjection::GateUp, DecodeLaunch { w: gate, up: Some(up), ..base })
            }
            Projections::Fused(gu) => (
                DecodeProjection::GateUpFused,
                DecodeLaunch { w: gu, up_offset: Some(i * h), w_stride: 2 * i * h, ..base },
            ),
        };
        self.decode_launch(stream, projection, plan, gate_up)?;
        let y = &workspace.expert_out;
        let down = DecodeLaunch { x: act, y, n: h, k: i, ..base };
        self.decode_launch(stream, DecodeProjection::Down, plan, down)?;
        let cfg =
            SlotCombineConfig { dtype: self.dtype().scalar_type(), weight_dtype: plan.weights().dtype().scalar_type() };
        let kern = kernel(cfg.id(), || moe_combine_slots(&cfg))?;
        let hidden = h as u32;
        let launch = LaunchConfig {
            grid: [hidden.div_ceil(COMBINE_THREADS), (t as u32).min(COMBINE_MAX_ROW_BLOCKS), 1],
            block: [COMBINE_THREADS, 1, 1],
            dynamic_shared_bytes: 0,
        };
        let args = SlotCombineParams {
            expert_out: y,
            weights: plan.weights(),
            out,
            tokens: t as u32,
            top_k: k as u32,
            hidden,
        };
        params::launch(stream, &kern, launch, &args.args())
    }

    /// [`SwiGluExperts::forward_decode_into`] into a new `[T, H]` tensor.
    pub fn forward_decode(&self, input: &Tensor, plan: &RoutingPlan) -> Result<Tensor> {
        let device = input.device();
        let workspace = ExpertsDecodeWorkspace::new(self, plan.tokens(), plan.top_k())?;
        let out = Tensor::empty(device, self.dtype(), &[plan.tokens(), self.hidden])?;
        self.forward_decode_into(&device.default_stream(), input, plan, &workspace, &out)?;
        Ok(out)
    }
}

/// The decode path's kernels: gate/up (split and fused) and down for every token tile with
/// vector loads, and with scalar loads at 1 and 8 tokens; the slot-order combine for every pair
/// of row and weight dtypes.
pub struct MoeDecode;

impl Family for MoeDecode {
    fn names(&self) -> &'static [&'static str] {
        &["moe_decode_gate_up", "moe_decode_gate_up_fused", "moe_decode_down", "moe_combine_slots"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            for projection in DecodeProjection::ALL {
                let name = projection.name();
                let tiles = DECODE_TOKEN_TILES.map(|m| (m, GemvLoads::Vector));
                for (m_tile, loads) in tiles.into_iter().chain([(1, GemvLoads::Scalar), (8, GemvLoads::Scalar)]) {
                    let cfg = DecodeConfig { dtype, projection, m_tile, loads };
                    out.push(Registered::new(cfg.id(), name, Some(dtype), move || moe_decode(&cfg)));
                }
            }
            for weight_dtype in FLOAT_DTYPES {
                let cfg = SlotCombineConfig { dtype, weight_dtype };
                out.push(Registered::new(cfg.id(), "moe_combine_slots", Some(dtype), move || moe_combine_slots(&cfg)));
            }
        }
        out
    }

    /// Three tokens (fewer than the tile but one, for `m8`) of top 2 over 5 experts, ids `[3,
    /// 1], [1, 7], [3, 3]`: an expert shared across tokens, one repeated within a token, one
    /// past the last (clamped); 10 output columns (a partial warp block), `k` = 40 (scalar) or
    /// 64.
    fn sample(&self, name: &str, id: &str) -> Option<Case> {
        let (tokens, top_k) = (3u32, 2u32);
        if name == "moe_combine_slots" {
            let mut c = Case::new([1, 2, 1]);
            c.scalars.extend([("tokens", tokens as u64), ("top_k", top_k as u64), ("hidden", 40)]);
            return Some(c);
        }
        let m_tile = id_number(id, 'm')?;
        let tokens = tokens.min(m_tile);
        let k = if id.contains("scalar") { 40 } else { 64 };
        let n = 10u32;
        let mut c = Case::new(DecodeConfig::grid(n, tokens * top_k));
        c.indices.insert("indices", [3, 1, 1, 7, 3, 3][..(tokens * top_k) as usize].to_vec());
        c.scalars.extend([
            ("tokens", tokens as u64),
            ("top_k", top_k as u64),
            ("experts", 5),
            ("n", n as u64),
            ("k", k),
        ]);
        if name == "moe_decode_gate_up_fused" {
            c.scalars.extend([("w_stride", 2 * n as u64 * k), ("up_offset", n as u64 * k)]);
        } else {
            c.scalars.insert("w_stride", n as u64 * k);
        }
        Some(c)
    }
}
