//! First-order router training: the continuous weights of a fixed selection of experts and
//! their gradient with respect to the router logits (ruDNN section 12). Top-k and group
//! decisions and the correction bias are not differentiated: the selection is an input.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::api::{logits_shape, RoutingPlan};
use super::kernel::route_threads;
use super::training_kernel::{
    moe_router_backward, moe_router_weights, RouterBackwardParams, RouterTrainConfig, RouterWeightsParams,
    MAX_TRAINING_TOP_K,
};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// How the router's logits become scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterScoring {
    /// `softmax(z)` over all experts (Qwen3-MoE, Mixtral).
    Softmax,
    /// `sigmoid(z)` per expert (DeepSeek-V3).
    Sigmoid,
}

/// The weights of a selection: scores, optionally renormalised over the selection, times a
/// scale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouterWeightOptions {
    pub scoring: RouterScoring,
    /// Divide each selected score by the selection's sum (repeats counted).
    pub renormalize: bool,
    /// Finite and positive.
    pub scale: f32,
}

impl Default for RouterWeightOptions {
    fn default() -> RouterWeightOptions {
        RouterWeightOptions { scoring: RouterScoring::Softmax, renormalize: false, scale: 1.0 }
    }
}

const OP_WEIGHTS: &str = "selected_router_weights";
const OP_BACKWARD: &str = "selected_router_backward";

/// `(T, E, top_k)` of logits `[T, E]` and indices `[T, top_k]`, checked.
fn check_inputs(
    op: &'static str,
    logits: &Tensor,
    indices: &Tensor,
    options: &RouterWeightOptions,
) -> Result<(usize, usize, usize)> {
    let (tokens, experts) = logits_shape(op, logits)?;
    contiguous_nonempty(op, "indices", indices)?;
    let top_k = match indices.shape() {
        &[t, k] if t == tokens => k,
        shape => {
            return Err(OpError::Shape {
                op,
                message: format!("`indices` must be [{tokens}, top_k] (the logits' tokens), is {shape:?}"),
            })
        }
    };
    let most = experts.min(MAX_TRAINING_TOP_K as usize);
    if !(1..=most).contains(&top_k) {
        return Err(OpError::InvalidArgument {
            op,
            message: format!("top_k = {top_k} must be in 1..={most} (at most the {experts} experts and 64)"),
        });
    }
    if !matches!(indices.dtype(), DType::U32 | DType::I32 | DType::I64) {
        return Err(OpError::DType {
            op,
            message: format!("`indices` must be u32, i32 or i64, is {:?}", indices.dtype()),
        });
    }
    if !(options.scale.is_finite() && options.scale > 0.0) {
        return Err(OpError::InvalidArgument {
            op,
            message: format!("scale = {} must be finite and positive", options.scale),
        });
    }
    Ok((tokens, experts, top_k))
}

fn config(logits: &Tensor, indices: &Tensor) -> RouterTrainConfig {
    RouterTrainConfig { dtype: logits.dtype().scalar_type(), index: indices.dtype().scalar_type() }
}

/// The weights (`f32 [T, top_k]`, into `weights`) of the experts `indices` (`[T, top_k]`,
/// u32/i32/i64, `1 ≤ top_k ≤ min(E, 64)`) select from `logits` (`[T, E]`, f32/f16/bf16,
/// contiguous, `E ≤ 1024`): per row, in `f32`, scores `softmax(z)` over all `E` or `sigmoid(z)`,
/// slot `k`'s score `s[i_k]` (an id may repeat), divided by the selection's sum with
/// `renormalize`, times `scale`. A row with an index outside `0..E` gets NaN weights (the index
/// is never used to address memory); NaN logits give NaN as the arithmetic does. Neither
/// allocates nor waits.
pub fn selected_router_weights_into(
    stream: &Stream,
    logits: &Tensor,
    indices: &Tensor,
    options: &RouterWeightOptions,
    weights: &Tensor,
) -> Result<()> {
    let op = OP_WEIGHTS;
    let (tokens, experts, top_k) = check_inputs(op, logits, indices, options)?;
    expect_tensor(op, "weights", weights, DType::F32, &[tokens, top_k])?;
    same_device(op, stream, &[("logits", logits), ("indices", indices), ("weights", weights)])?;
    let cfg = config(logits, indices);
    let k = kernel(cfg.weights_id(), || moe_router_weights(&cfg))?;
    let args = RouterWeightsParams {
        logits,
        indices,
        weights,
        experts: experts as u32,
        top_k: top_k as u32,
        sigmoid: (options.scoring == RouterScoring::Sigmoid) as u32,
        renormalize: options.renormalize as u32,
        scale: options.scale,
    };
    params::launch(stream, &k, LaunchConfig::linear(tokens as u32, route_threads(experts as u32)), &args.args())
}

/// The selection's weights (see [`selected_router_weights_into`]), on the logits' default
/// stream.
pub fn selected_router_weights(logits: &Tensor, indices: &Tensor, options: RouterWeightOptions) -> Result<Tensor> {
    let (tokens, _, top_k) = check_inputs(OP_WEIGHTS, logits, indices, &options)?;
    let weights = Tensor::empty(logits.device(), DType::F32, &[tokens, top_k])?;
    selected_router_weights_into(&logits.device().default_stream(), logits, indices, &options, &weights)?;
    Ok(weights)
}

/// The gradient of the logits (`[T, E]` in their dtype, into `grad_logits`) from
/// `grad_weights` (`f32 [T, top_k]`), the gradient of [`selected_router_weights_into`]'s
/// output for the same logits, indices and options. Rows with an index outside `0..E` are NaN.
/// Neither allocates nor waits.
pub fn selected_router_backward_into(
    stream: &Stream,
    logits: &Tensor,
    indices: &Tensor,
    grad_weights: &Tensor,
    options: &RouterWeightOptions,
    grad_logits: &Tensor,
) -> Result<()> {
    let op = OP_BACKWARD;
    let (tokens, experts, top_k) = check_inputs(op, logits, indices, options)?;
    expect_tensor(op, "grad_weights", grad_weights, DType::F32, &[tokens, top_k])?;
    expect_tensor(op, "grad_logits", grad_logits, logits.dtype(), &[tokens, experts])?;
    same_device(
        op,
        stream,
        &[("logits", logits), ("indices", indices), ("grad_weights", grad_weights), ("grad_logits", grad_logits)],
    )?;
    let cfg = config(logits, indices);
    let k = kernel(cfg.backward_id(), || moe_router_backward(&cfg))?;
    let args = RouterBackwardParams {
        logits,
        indices,
        grad_weights,
        grad_logits,
        experts: experts as u32,
        top_k: top_k as u32,
        sigmoid: (options.scoring == RouterScoring::Sigmoid) as u32,
        renormalize: options.renormalize as u32,
        scale: options.scale,
    };
    params::launch(stream, &k, LaunchConfig::linear(tokens as u32, route_threads(experts as u32)), &args.args())
}

/// The logits' gradient (see [`selected_router_backward_into`]), on the logits' default stream.
pub fn selected_router_backward(
    logits: &Tensor,
    indices: &Tensor,
    grad_weights: &Tensor,
    options: RouterWeightOptions,
) -> Result<Tensor> {
    let (tokens, experts, _) = check_inputs(OP_BACKWARD, logits, indices, &options)?;
    let grad = Tensor::empty(logits.device(), logits.dtype(), &[tokens, experts])?;
    selected_router_backward_into(&logits.device().default_stream(), logits, indices, grad_weights, &options, &grad)?;
    Ok(grad)
}

/// A routing kept for training: its selection, the weights recomputed from the logits for it,
/// and what the backward needs.
#[derive(Debug)]
pub struct RouterTrainingPlan {
    routing: RoutingPlan,
    logits: Tensor,
    options: RouterWeightOptions,
    weights: Tensor,
}

impl RoutingPlan {
    /// Keep this plan's selection and recompute its weights from `logits` (the logits it was
    /// routed from: the caller keeps their values unchanged until the backward) with `options`.
    pub fn into_training(self, logits: &Tensor, options: RouterWeightOptions) -> Result<RouterTrainingPlan> {
        let op = "RoutingPlan::into_training";
        if logits.shape() != [self.tokens(), self.experts()] {
            return Err(OpError::Shape {
                op,
                message: format!(
                    "`logits` is {:?}, the plan routed [{}, {}]",
                    logits.shape(),
                    self.tokens(),
                    self.experts()
                ),
            });
        }
        let weights = selected_router_weights(logits, self.indices(), options)?;
        let (indices, plan_weights) = self.into_tensors();
        crate::api::cast_into(&logits.device().default_stream(), &weights, &plan_weights)?;
        let routing = RoutingPlan::from_parts(indices, plan_weights, logits.shape()[1]);
        Ok(RouterTrainingPlan { routing, logits: logits.clone(), options, weights })
    }
}

impl RouterTrainingPlan {
    /// The routing for dispatch: the selection, with the recomputed weights in the logits' dtype.
    pub fn routing(&self) -> &RoutingPlan {
        &self.routing
    }

    /// The recomputed weights, `f32 [T, top_k]`.
    pub fn weights(&self) -> &Tensor {
        &self.weights
    }

    /// The logits' gradient from the weights' (`f32 [T, top_k]`).
    pub fn backward(&self, grad_weights: &Tensor) -> Result<Tensor> {
        selected_router_backward(&self.logits, self.routing.indices(), grad_weights, self.options)
    }
}
