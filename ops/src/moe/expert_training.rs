//! The experts' first-order training chain (ruDNN section 12):
//! [`SwiGluExperts::forward_dispatched_training`] keeps what the backward needs
//! ([`ExpertsTrainingCache`]); [`DispatchedTokens::combine_backward`] gives the expert rows'
//! and the routing weights' gradients; [`ExpertsTrainingCache::backward`] the dispatched rows'
//! and the expert weights' ([`ExpertGradients`]); [`DispatchedTokens::dispatch_backward`] sums
//! each token's rows back. The routing weights' gradient goes on to the router's backward
//! ([`super::training::RouterTrainingPlan::backward`]). Kernels in
//! [`super::expert_training_kernel`] and, for the experts' backward on tensor cores,
//! [`super::expert_training_tc`].

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::api::MoeError;
use super::dispatch::{moe_combine, CombineConfig, CombineParams, COMBINE_MAX_ROW_BLOCKS, COMBINE_THREADS};
use super::expert_training_kernel::*;
use super::expert_training_tc::*;
use super::experts::{DispatchedTokens, ExpertsWorkspace, GroupedStrategy, Projections, SwiGluExperts};
use super::tune::deepest_stages;
use crate::error::Result;
use crate::gemm::kernels::tc::GemmTcConfig;
use crate::host::*;
use crate::params;

/// How [`DispatchedTokens::combine_backward_with_strategy`] computes the routing weights'
/// gradient (dot products over `H`); the expert rows' gradient is the same either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CombineGradientStrategy {
    /// One thread per weight sums `h = 0, 1, ...` in order.
    #[default]
    Serial,
    /// One warp (plane) per weight: each lane sums every 32nd `h`, then a butterfly
    /// reduction across the warp (a different, equally fixed order).
    Plane,
}

/// What [`ExpertsTrainingCache::backward`] returns: the dispatched rows' gradient (`[T · top_k,
/// H]`, dispatched order, the experts' dtype) and the expert weights' (`f32`: gate and up
/// `[E, I, H]`, down `[E, H, I]`, for split and fused experts alike).
#[derive(Debug)]
pub struct ExpertGradients {
    pub input: Tensor,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

/// What the experts' backward needs from [`SwiGluExperts::forward_dispatched_training`]: the
/// dispatched rows and expert offsets, the gate/up pre-activations (`[N, 2I]`) and the
/// activation (`[N, I]`) the forward computed, and the weights (shared handles; keep their
/// values unchanged until the backward has run).
#[derive(Debug)]
pub struct ExpertsTrainingCache {
    rows: Tensor,
    offsets: Tensor,
    workspace: ExpertsWorkspace,
    proj: Projections,
    down: Tensor,
    experts: usize,
    hidden: usize,
    inter: usize,
    tc_obstacle: Option<MoeError>,
}

const OP_COMBINE: &str = "moe_combine_backward";
const OP_DISPATCH: &str = "moe_dispatch_backward";
const OP_EXPERTS: &str = "moe_experts_backward";

/// The forward's tensor-core obstacle again (a `DType` or `InvalidArgument` error).
fn copy_error(e: &MoeError) -> MoeError {
    match e {
        MoeError::DType { op, message } => MoeError::DType { op, message: message.clone() },
        MoeError::InvalidArgument { op, message } => MoeError::InvalidArgument { op, message: message.clone() },
        other => MoeError::InvalidArgument { op: OP_EXPERTS, message: other.to_string() },
    }
}

/// `(ceil(cols / 256), min(rows, 65535))` blocks of [`GRAD_THREADS`].
fn row_launch(cols: u32, rows: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [cols.div_ceil(GRAD_THREADS), rows.min(GRAD_MAX_ROW_BLOCKS), 1],
        block: [GRAD_THREADS, 1, 1],
        dynamic_shared_bytes: 0,
    }
}

impl DispatchedTokens {
    /// The combine's backward into `grad_rows` (`[T · top_k, H]`, dispatched order, the rows'
    /// dtype) and `grad_weights` (`f32 [T, top_k]`), from the experts' output `expert_out`
    /// (`[T · top_k, H]`, what [`DispatchedTokens::combine`] took) and the combined output's
    /// gradient `grad_output` (`[T, H]`), both in the rows' dtype: `grad_rows[row(t, s)] = w[t,
    /// s] · grad_output[t]` (one rounding) and `grad_weights[t, s] = ⟨expert_out[row(t, s)],
    /// grad_output[t]⟩` in `f32`, summed as `strategy` says. Neither allocates nor waits.
    pub fn combine_backward_into(
        &self,
        stream: &Stream,
        expert_out: &Tensor,
        grad_output: &Tensor,
        strategy: CombineGradientStrategy,
        grad_rows: &Tensor,
        grad_weights: &Tensor,
    ) -> Result<()> {
        let op = OP_COMBINE;
        let dtype = float_dtype(op, expert_out)?;
        let (n, h) = (self.len(), self.hidden());
        for (name, t, shape) in [
            ("expert_output", expert_out, [n, h]),
            ("grad_output", grad_output, [self.tokens(), h]),
            ("grad_rows", grad_rows, [n, h]),
        ] {
            contiguous_nonempty(op, name, t)?;
            expect_shape(op, name, t, &shape)?;
            expect_dtype(op, name, t, self.dtype())?;
        }
        expect_tensor(op, "grad_weights", grad_weights, DType::F32, &[self.tokens(), self.top_k()])?;
        same_device(
            op,
            stream,
            &[
                ("expert_output", expert_out),
                ("grad_output", grad_output),
                ("grad_rows", grad_rows),
                ("grad_weights", grad_weights),
                ("dispatched rows", &self.rows),
            ],
        )?;
        let (entries, hidden) = (to_u32(op, "rows", n)?, to_u32(op, "hidden", h)?);
        let top_k = self.top_k() as u32;
        let cfg = ExpertGradConfig { dtype };
        let k = kernel(cfg.rows_id(), || moe_combine_grad_rows(&cfg))?;
        let args = CombineGradRowsParams {
            grad_output,
            slot_rows: &self.slot_rows,
            slot_weights: &self.weights,
            grad_rows,
            entries,
            top_k,
            hidden,
        };
        params::launch(stream, &k, row_launch(hidden, entries), &args.args())?;
        let plane = strategy == CombineGradientStrategy::Plane;
        let cfg = CombineGradWeightsConfig { dtype, plane };
        let k = kernel(cfg.id(), || moe_combine_grad_weights(&cfg))?;
        let blocks = if plane { entries.div_ceil(PLANE_WARPS) } else { entries.div_ceil(GRAD_THREADS) };
        let args = CombineGradWeightsParams {
            expert_out,
            grad_output,
            slot_rows: &self.slot_rows,
            grad_weights,
            entries,
            top_k,
            hidden,
        };
        params::launch(stream, &k, LaunchConfig::linear(blocks, GRAD_THREADS), &args.args())
    }

    /// The combine's backward with `strategy` (see [`DispatchedTokens::combine_backward_into`]):
    /// `(grad_rows [T · top_k, H], grad_weights f32 [T, top_k])`.
    pub fn combine_backward_with_strategy(
        &self,
        expert_out: &Tensor,
        grad_output: &Tensor,
        strategy: CombineGradientStrategy,
    ) -> Result<(Tensor, Tensor)> {
        let device = self.rows.device();
        let grad_rows = Tensor::empty(device, self.dtype(), &[self.len(), self.hidden()])?;
        let grad_weights = Tensor::empty(device, DType::F32, &[self.tokens(), self.top_k()])?;
        let stream = device.default_stream();
        self.combine_backward_into(&stream, expert_out, grad_output, strategy, &grad_rows, &grad_weights)?;
        Ok((grad_rows, grad_weights))
    }

    /// The combine's backward with [`CombineGradientStrategy::Serial`].
    pub fn combine_backward(&self, expert_out: &Tensor, grad_output: &Tensor) -> Result<(Tensor, Tensor)> {
        self.combine_backward_with_strategy(expert_out, grad_output, CombineGradientStrategy::Serial)
    }

    /// The dispatch's backward into `grad_input` (`[T, H]`): `grad_input[t] = Σ_s
    /// grad_rows[row(t, s)]` for `grad_rows` `[T · top_k, H]` in dispatched order (both in the
    /// rows' dtype), `f32` sums in slot order, rounded once; the routing weights are not applied
    /// again. It is the combine's kernel with the unit weights `ones` (`f32 [T, top_k]`, every
    /// element 1, so each fused multiply-add is an exact add). Neither allocates nor waits.
    pub fn dispatch_backward_into(
        &self,
        stream: &Stream,
        grad_rows: &Tensor,
        ones: &Tensor,
        grad_input: &Tensor,
    ) -> Result<()> {
        let op = OP_DISPATCH;
        let dtype = float_dtype(op, grad_rows)?;
        contiguous_nonempty(op, "grad_rows", grad_rows)?;
        contiguous_nonempty(op, "grad_input", grad_input)?;
        contiguous_nonempty(op, "ones", ones)?;
        expect_shape(op, "grad_rows", grad_rows, &[self.len(), self.hidden()])?;
        expect_shape(op, "grad_input", grad_input, &[self.tokens(), self.hidden()])?;
        expect_shape(op, "ones", ones, &[self.tokens(), self.top_k()])?;
        expect_dtype(op, "grad_rows", grad_rows, self.dtype())?;
        expect_dtype(op, "grad_input", grad_input, self.dtype())?;
        expect_dtype(op, "ones", ones, DType::F32)?;
        same_device(
            op,
            stream,
            &[("grad_rows", grad_rows), ("grad_input", grad_input), ("ones", ones), ("dispatched rows", &self.rows)],
        )?;
        let cfg = CombineConfig { dtype };
        let k = kernel(cfg.id(), || moe_combine(&cfg))?;
        let hidden = to_u32(op, "hidden", self.hidden())?;
        let tokens = to_u32(op, "tokens", self.tokens())?;
        let launch = LaunchConfig {
            grid: [hidden.div_ceil(COMBINE_THREADS), tokens.min(COMBINE_MAX_ROW_BLOCKS), 1],
            block: [COMBINE_THREADS, 1, 1],
            dynamic_shared_bytes: 0,
        };
        let args = CombineParams {
            expert_out: grad_rows,
            slot_rows: &self.slot_rows,
            slot_weights: ones,
            out: grad_input,
            tokens,
            top_k: self.top_k() as u32,
            hidden,
        };
        params::launch(stream, &k, launch, &args.args())
    }

    /// The dispatch's backward (see [`DispatchedTokens::dispatch_backward_into`]): `[T, H]`.
    pub fn dispatch_backward(&self, grad_rows: &Tensor) -> Result<Tensor> {
        let device = self.rows.device();
        let stream = device.default_stream();
        let ones = Tensor::from_slice_on(&stream, &vec![1.0f32; self.len()], &[self.tokens(), self.top_k()])?;
        let grad_input = Tensor::empty(device, self.dtype(), &[self.tokens(), self.hidden()])?;
        self.dispatch_backward_into(&stream, grad_rows, &ones, &grad_input)?;
        Ok(grad_input)
    }
}

impl SwiGluExperts {
    /// [`SwiGluExperts::forward_dispatched_with_strategy`], keeping what the backward needs:
    /// `(expert output [T · top_k, H], cache)`.
    pub fn forward_dispatched_training(
        &self,
        dispatched: &DispatchedTokens,
        strategy: GroupedStrategy,
    ) -> Result<(Tensor, ExpertsTrainingCache)> {
        self.check_dispatched("moe_experts", dispatched)?;
        let device = dispatched.rows.device();
        let out = Tensor::empty(device, self.dtype(), &[dispatched.len(), self.hidden])?;
        let workspace = ExpertsWorkspace::new(self, dispatched.len())?;
        self.forward_dispatched_into(&device.default_stream(), dispatched, strategy, &workspace, &out)?;
        let cache = ExpertsTrainingCache {
            rows: dispatched.rows.clone(),
            offsets: dispatched.offsets.clone(),
            workspace,
            proj: self.proj.clone(),
            down: self.down.clone(),
            experts: self.experts,
            hidden: self.hidden,
            inter: self.inter,
            tc_obstacle: self.tensor_core_obstacle(device),
        };
        Ok((out, cache))
    }
}

impl ExpertsTrainingCache {
    /// The experts' backward with [`GroupedStrategy::Scalar`] (whatever the forward ran).
    pub fn backward(&self, grad_out: &Tensor) -> Result<ExpertGradients> {
        self.backward_with_strategy(grad_out, GroupedStrategy::Scalar)
    }

    /// The experts' backward from their output's gradient `grad_out` (`[T · top_k, H]`,
    /// dispatched order, the experts' dtype).
    ///
    /// Scalar: four kinds of launch, each an `f32` sum in a fixed order rounded once: the gate
    /// and up pre-activations' gradient (`f32 [N, 2I]`, through `down` and `dsilu(g) = σ(g)(1 +
    /// g(1 − σ(g)))`), the rows' gradient through gate and up, and per expert the weight
    /// gradients `Σ_rows` of outer products (gate, up, down; zeros for an expert without rows).
    ///
    /// TensorCore (f16/bf16): the same gradients from grouped GEMMs on tensor cores
    /// ([`super::expert_training_tc`]), `f32` accumulation: the activation's gradient (`f32`),
    /// the pre-activations' (rounded to the dtype: the operand of the next GEMMs, as in a
    /// half-precision autograd), the rows' gradient, and the weight gradients over each expert's
    /// rows. It needs what the tensor-core forward needs (f16/bf16 experts, hidden and
    /// intermediate sizes multiples of 8, 16-byte aligned weights, sm_80 or newer) and a
    /// 16-byte aligned `grad_out`; where one is missing TensorCore is an error naming it and
    /// Auto runs Scalar (and only then: a failure to compile or launch is an error either way).
    pub fn backward_with_strategy(&self, grad_out: &Tensor, strategy: GroupedStrategy) -> Result<ExpertGradients> {
        let op = OP_EXPERTS;
        let dtype = self.down.dtype();
        let (n, h, i, e) = (self.rows.shape()[0], self.hidden, self.inter, self.experts);
        float_dtype(op, grad_out)?;
        expect_tensor(op, "grad_out", grad_out, dtype, &[n, h])?;
        let device = self.rows.device();
        let stream = device.default_stream();
        same_device(op, &stream, &[("grad_out", grad_out), ("dispatched rows", &self.rows)])?;
        // Every element index of every buffer is a u32 in the kernels.
        to_u32(op, "elements of the gate_up gradient", n * 2 * i)?;
        to_u32(op, "elements of the rows' gradient", n * h)?;
        to_u32(op, "elements of the expert weights", e * 2 * i * h)?;
        let obstacle = self.tc_obstacle.as_ref().map(copy_error).or_else(|| misaligned("grad_out", grad_out));
        let tensor_cores = match strategy {
            GroupedStrategy::Scalar => false,
            GroupedStrategy::Auto => obstacle.is_none(),
            GroupedStrategy::TensorCore => match obstacle {
                Some(e) => return Err(e),
                None => true,
            },
        };
        if tensor_cores {
            self.backward_tensor_cores(&stream, grad_out)
        } else {
            self.backward_scalar(&stream, grad_out)
        }
    }

    fn backward_scalar(&self, stream: &Stream, grad_out: &Tensor) -> Result<ExpertGradients> {
        let op = OP_EXPERTS;
        let dtype = self.down.dtype();
        let (n, h, i, e) = (self.rows.shape()[0], self.hidden, self.inter, self.experts);
        let (rows, experts) = (to_u32(op, "rows", n)?, e as u32);
        let (hidden, inter) = (h as u32, i as u32);

        let grad_gate_up = Tensor::empty_on(stream, DType::F32, &[n, 2 * i])?;
        let cfg = ExpertGradConfig { dtype: dtype.scalar_type() };
        let k = kernel(cfg.act_id(), || moe_expert_grad_act(&cfg))?;
        let args = ExpertGradActParams {
            grad_out,
            gate_up: &self.workspace.gate_up,
            down: &self.down,
            offsets: &self.offsets,
            grad_gate_up: &grad_gate_up,
            rows,
            experts,
            hidden,
            inter,
        };
        params::launch(stream, &k, row_launch(inter, rows), &args.args())?;

        let input = Tensor::empty_on(stream, dtype, &[n, h])?;
        let fused = matches!(self.proj, Projections::Fused(_));
        let cfg = ExpertGradInputConfig { dtype: dtype.scalar_type(), fused };
        let k = kernel(cfg.id(), || moe_expert_grad_input(&cfg))?;
        let args = match &self.proj {
            Projections::Split { gate, up } => ExpertGradInputParams {
                grad_gate_up: &grad_gate_up,
                gate,
                up,
                offsets: &self.offsets,
                grad_input: &input,
                rows,
                experts,
                hidden,
                inter,
                w_stride: inter * hidden,
                up_offset: 0,
            }
            .args(),
            Projections::Fused(gate_up) => ExpertGradInputFusedParams {
                grad_gate_up: &grad_gate_up,
                gate_up,
                offsets: &self.offsets,
                grad_input: &input,
                rows,
                experts,
                hidden,
                inter,
                w_stride: 2 * inter * hidden,
                up_offset: inter * hidden,
            }
            .args(),
        };
        params::launch(stream, &k, row_launch(hidden, rows), &args)?;

        let weight_grad = |a: &Tensor, b: &Tensor, (p, q): (u32, u32), (lda, ldb): (u32, u32), a_offset: u32| {
            let out = Tensor::empty_on(stream, DType::F32, &[e, p as usize, q as usize])?;
            let cfg = ExpertGradWeightConfig { a: a.dtype().scalar_type(), b: b.dtype().scalar_type() };
            let k = kernel(cfg.id(), || moe_expert_grad_weight(&cfg))?;
            let launch = LaunchConfig {
                grid: [q.div_ceil(GRAD_THREADS), p.min(GRAD_MAX_ROW_BLOCKS), experts],
                block: [GRAD_THREADS, 1, 1],
                dynamic_shared_bytes: 0,
            };
            let args = ExpertGradWeightParams {
                a,
                b,
                offsets: &self.offsets,
                out: &out,
                p,
                q,
                lda,
                ldb,
                a_offset,
                b_offset: 0,
            };
            params::launch(stream, &k, launch, &args.args())?;
            Ok::<Tensor, MoeError>(out)
        };
        let gate = weight_grad(&grad_gate_up, &self.rows, (inter, hidden), (2 * inter, hidden), 0)?;
        let up = weight_grad(&grad_gate_up, &self.rows, (inter, hidden), (2 * inter, hidden), inter)?;
        let down = weight_grad(grad_out, &self.workspace.act, (hidden, inter), (hidden, inter), 0)?;
        Ok(ExpertGradients { input, gate, up, down })
    }

    /// The tensor-core backward (see [`ExpertsTrainingCache::backward_with_strategy`]): seven
    /// launches, none of which allocates beyond its output or waits.
    fn backward_tensor_cores(&self, stream: &Stream, grad_out: &Tensor) -> Result<ExpertGradients> {
        let op = OP_EXPERTS;
        let dtype = self.down.dtype();
        let ty = GemmTcConfig::mma_type(dtype.scalar_type())
            .ok_or_else(|| MoeError::DType { op, message: format!("{dtype}: tensor cores take f16 or bf16") })?;
        let (n, h, i, e) = (self.rows.shape()[0], self.hidden, self.inter, self.experts);
        let (rows, experts) = (to_u32(op, "rows", n)?, e as u32);
        let (hidden, inter) = (h as u32, i as u32);
        let stages = deepest_stages();

        // One grouped GEMM `y[r] = x[r] · w[e]` (`w [E, k, cols]`, or `w` then `w2` along `k`).
        let grouped = |x: &Tensor, (w, w2): (&Tensor, Option<&Tensor>), y: &Tensor, (cols, k): (u32, u32)| {
            let split = w2.is_some();
            let tile = super::grouped::grouped_tc_tile(n, e, cols as usize);
            let cfg = GroupedTcNnConfig { ty, tile, stages, out: y.dtype().scalar_type(), split };
            let grid = cfg.grid(rows, experts, cols);
            if grid[1] > 65535 {
                return Err(MoeError::InvalidArgument {
                    op,
                    message: format!("{n} dispatched rows need {} row tiles; one launch takes at most 65535", grid[1]),
                });
            }
            let kern = kernel(cfg.id(), || moe_grouped_tc_nn(&cfg))?;
            let launch = LaunchConfig { grid, block: [cfg.threads(), 1, 1], dynamic_shared_bytes: 0 };
            let w_stride = if split { (k / 2) * cols } else { k * cols };
            let args = GroupedTcNnParams {
                x,
                w,
                w2,
                y,
                offsets: &self.offsets,
                experts,
                n: cols,
                k,
                ldy: cols,
                w_stride,
                split_k: split.then_some(k / 2),
            };
            params::launch(stream, &kern, launch, &args.args())
        };

        let grad_act = Tensor::empty_on(stream, DType::F32, &[n, i])?;
        grouped(grad_out, (&self.down, None), &grad_act, (inter, hidden))?;
        let grad_gate_up = Tensor::empty_on(stream, dtype, &[n, 2 * i])?;
        let cfg = ExpertGradConfig { dtype: dtype.scalar_type() };
        let k = kernel(cfg.swiglu_id(), || moe_expert_grad_swiglu(&cfg))?;
        let args = ExpertGradSwiGluParams {
            grad_act: &grad_act,
            gate_up: &self.workspace.gate_up,
            grad_gate_up: &grad_gate_up,
            rows,
            inter,
        };
        params::launch(stream, &k, row_launch(inter, rows), &args.args())?;
        let input = Tensor::empty_on(stream, dtype, &[n, h])?;
        let weights = match &self.proj {
            Projections::Split { gate, up } => (gate, Some(up)),
            Projections::Fused(gate_up) => (gate_up, None),
        };
        grouped(&grad_gate_up, weights, &input, (hidden, 2 * inter))?;

        // `out[e] = a_eᵀ · b_e` over each expert's rows: `f32 [E, m, cols]`.
        let weight_grad = |a: &Tensor, b: &Tensor, (m, cols): (u32, u32), (lda, ldb): (u32, u32), a_offset: u32| {
            let out = Tensor::empty_on(stream, DType::F32, &[e, m as usize, cols as usize])?;
            let cfg = ExpertWeightGradTcConfig { ty, tile: backward_tile(m as usize, cols as usize), stages };
            let kern = kernel(cfg.id(), || moe_expert_grad_weight_tc(&cfg))?;
            let launch = LaunchConfig {
                grid: cfg.grid(m, cols, experts),
                block: [cfg.threads(), 1, 1],
                dynamic_shared_bytes: 0,
            };
            let args =
                ExpertWeightGradTcParams { a, b, offsets: &self.offsets, out: &out, m, n: cols, lda, ldb, a_offset };
            params::launch(stream, &kern, launch, &args.args())?;
            Ok::<Tensor, MoeError>(out)
        };
        let gate = weight_grad(&grad_gate_up, &self.rows, (inter, hidden), (2 * inter, hidden), 0)?;
        let up = weight_grad(&grad_gate_up, &self.rows, (inter, hidden), (2 * inter, hidden), inter)?;
        let down = weight_grad(grad_out, &self.workspace.act, (hidden, inter), (hidden, inter), 0)?;
        Ok(ExpertGradients { input, gate, up, down })
    }
}

/// Why a tensor the tensor-core backward reads directly cannot be its operand: a start that is
/// not 16-byte aligned.
fn misaligned(name: &str, t: &Tensor) -> Option<MoeError> {
    let start = t.offset() * t.dtype().size();
    (!start.is_multiple_of(16)).then(|| MoeError::InvalidArgument {
        op: OP_EXPERTS,
        message: format!("`{name}` starts {start} bytes into its buffer; the tensor-core backward needs 16 bytes"),
    })
}
