//! MoE routing entry points: softmax top-k ([`route`]) and group-limited sigmoid top-k
//! ([`route_sigmoid_grouped`]), each with an `_into` form that neither allocates nor waits.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{
    moe_route, moe_route_grouped, route_threads, GroupedRouteConfig, GroupedRouteParams, RouteConfig, RouteParams,
    MAX_EXPERTS, MAX_GROUPS,
};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// The error of the MoE entry points (the same type as every op's).
pub type MoeError = OpError;

/// The most experts [`route_sigmoid_grouped`] selects per token.
pub const MAX_GROUPED_TOP_K: usize = 64;

/// Softmax top-k routing (Qwen3-MoE, Mixtral).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutingOptions {
    /// Experts per token, `1..=E`.
    pub top_k: usize,
    /// Divide the selected weights by their sum (Hugging Face's `norm_topk_prob`).
    pub renormalize: bool,
}

/// Group-limited sigmoid top-k routing (DeepSeek-V3's `noaux_tc`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupRoutingOptions {
    /// Experts per token, `1..=64` and at most `selected_groups · E / groups`.
    pub top_k: usize,
    /// Expert groups (`n_group`), `1..=128`, dividing `E`.
    pub groups: usize,
    /// Groups kept per token (`topk_group`), `1..=groups`.
    pub selected_groups: usize,
    /// Score a group by the sum of its two largest corrected scores (DeepSeek-V3) instead of
    /// its largest; needs at least two experts per group.
    pub group_top_two: bool,
    /// Divide the selected scores by their sum (`norm_topk_prob`; plus `1e-20`, as DeepSeek-V3).
    pub renormalize: bool,
    /// Multiplies the weights (`routed_scaling_factor`), finite and positive.
    pub scale: f32,
}

/// Which experts each token goes to, and with what weights.
#[derive(Debug)]
pub struct RoutingPlan {
    indices: Tensor,
    weights: Tensor,
    top_k: usize,
    experts: usize,
}

impl RoutingPlan {
    /// Expert ids, `u32 [T, top_k]`, best first.
    pub fn indices(&self) -> &Tensor {
        &self.indices
    }

    /// Weights, `[T, top_k]` in the logits' dtype, in the order of [`RoutingPlan::indices`].
    pub fn weights(&self) -> &Tensor {
        &self.weights
    }

    /// Experts per token.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Experts of the router (`E`).
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Tokens routed (`T`).
    pub fn tokens(&self) -> usize {
        self.indices.shape()[0]
    }

    /// The indices and weights.
    pub fn into_tensors(self) -> (Tensor, Tensor) {
        (self.indices, self.weights)
    }

    /// A plan from a selection made elsewhere: `indices` (`u32 [T, top_k]`, ids below
    /// `experts`; an id may repeat within a token, each slot then dispatching its own row) and
    /// `weights` (`[T, top_k]`, a float dtype), contiguous, on one device, `1 ≤ top_k ≤ experts
    /// ≤ 1024`. The ids are not read here; the dispatch clamps an id past the last expert to it.
    /// Nothing is allocated or launched, so a model can make one over buffers that
    /// [`route_into`] fills every step (under graph capture too).
    pub fn from_selection(indices: Tensor, weights: Tensor, experts: usize) -> Result<RoutingPlan> {
        let op = "moe_routing_plan";
        contiguous_nonempty(op, "indices", &indices)?;
        contiguous_nonempty(op, "weights", &weights)?;
        expect_dtype(op, "indices", &indices, DType::U32)?;
        float_dtype(op, &weights)?;
        let &[t, k] = indices.shape() else {
            return Err(OpError::Shape {
                op,
                message: format!("`indices` must be [tokens, top_k], is {:?}", indices.shape()),
            });
        };
        expect_shape(op, "weights", &weights, &[t, k])?;
        same_device(op, &indices.device().default_stream(), &[("indices", &indices), ("weights", &weights)])?;
        if !(1..=MAX_EXPERTS as usize).contains(&experts) || !(1..=experts).contains(&k) {
            return Err(OpError::InvalidArgument {
                op,
                message: format!("top_k = {k} of {experts} experts: need 1 <= top_k <= experts <= {MAX_EXPERTS}"),
            });
        }
        Ok(RoutingPlan::from_parts(indices, weights, experts))
    }

    /// A plan of `indices` (`u32 [T, top_k]`) and `weights` (`[T, top_k]`) over `experts`.
    pub(super) fn from_parts(indices: Tensor, weights: Tensor, experts: usize) -> RoutingPlan {
        let top_k = indices.shape()[1];
        RoutingPlan { indices, weights, top_k, experts }
    }
}

/// `(T, E)` of `[T, E]` logits, checked: a float dtype, contiguous, non-empty, `E ≤ 1024`.
pub(super) fn logits_shape(op: &'static str, logits: &Tensor) -> Result<(usize, usize)> {
    float_dtype(op, logits)?;
    contiguous_nonempty(op, "logits", logits)?;
    let &[tokens, experts] = logits.shape() else {
        return Err(OpError::Shape {
            op,
            message: format!("`logits` must be [tokens, experts], is {:?}", logits.shape()),
        });
    };
    if experts > MAX_EXPERTS as usize {
        return Err(OpError::Shape {
            op,
            message: format!("`logits` has {experts} experts; the routing kernel takes at most {MAX_EXPERTS}"),
        });
    }
    to_u32(op, "tokens", tokens)?;
    Ok((tokens, experts))
}

/// The outputs' checks: `indices` `u32 [T, top_k]`, `weights` `[T, top_k]` in the logits'
/// dtype, both contiguous and on the stream's device with the logits.
fn check_outputs(
    op: &'static str,
    stream: &Stream,
    logits: &Tensor,
    indices: &Tensor,
    weights: &Tensor,
    shape: &[usize],
) -> Result<()> {
    for (name, t) in [("indices", indices), ("weights", weights)] {
        contiguous_nonempty(op, name, t)?;
        expect_shape(op, name, t, shape)?;
    }
    expect_dtype(op, "indices", indices, DType::U32)?;
    expect_dtype(op, "weights", weights, logits.dtype())?;
    same_device(op, stream, &[("logits", logits), ("indices", indices), ("weights", weights)])
}

fn invalid(op: &'static str, message: String) -> OpError {
    OpError::InvalidArgument { op, message }
}

/// The checks of [`RoutingOptions`] for `experts` experts: `top_k` in `1..=experts`.
fn check_top_k(op: &'static str, experts: usize, options: &RoutingOptions) -> Result<usize> {
    let top_k = options.top_k;
    if !(1..=experts).contains(&top_k) {
        return Err(invalid(op, format!("`top_k` = {top_k} must be in 1..={experts} (the experts)")));
    }
    Ok(top_k)
}

/// The checks of [`GroupRoutingOptions`] for `experts` experts.
fn check_group_options(op: &'static str, experts: usize, options: &GroupRoutingOptions) -> Result<()> {
    let GroupRoutingOptions { top_k, groups, selected_groups, group_top_two, scale, .. } = *options;
    if !(1..=MAX_GROUPS as usize).contains(&groups) {
        return Err(invalid(op, format!("`groups` = {groups} must be in 1..={MAX_GROUPS}")));
    }
    if !experts.is_multiple_of(groups) {
        return Err(invalid(op, format!("`groups` = {groups} does not divide the {experts} experts")));
    }
    let per_group = experts / groups;
    if !(1..=groups).contains(&selected_groups) {
        return Err(invalid(op, format!("`selected_groups` = {selected_groups} must be in 1..={groups} (the groups)")));
    }
    if group_top_two && per_group < 2 {
        return Err(invalid(
            op,
            format!("`group_top_two` needs at least 2 experts per group, the groups have {per_group}"),
        ));
    }
    let reachable = selected_groups * per_group;
    if !(1..=MAX_GROUPED_TOP_K.min(reachable)).contains(&top_k) {
        return Err(invalid(
            op,
            format!(
                "`top_k` = {top_k} must be in 1..={} (at most {MAX_GROUPED_TOP_K}, and the {reachable} experts of the selected groups)",
                MAX_GROUPED_TOP_K.min(reachable)
            ),
        ));
    }
    if !(scale.is_finite() && scale > 0.0) {
        return Err(invalid(op, format!("`scale` = {scale} must be finite and positive")));
    }
    Ok(())
}

/// Softmax top-k routing of `logits` (`[T, E]`, f32/f16/bf16, contiguous, `E ≤ 1024`) into
/// `indices` (`u32 [T, top_k]`) and `weights` (`[T, top_k]`, the logits' dtype). Per row: the
/// softmax over all `E` experts in `f32`, the `top_k` largest probabilities in descending order
/// (ties: lower expert id first), divided by their sum with `renormalize`, then rounded to the
/// dtype. A row containing NaN or `+inf`, or only `-inf`, gets NaN weights and the indices
/// `0..top_k`.
pub fn route_into(
    stream: &Stream,
    logits: &Tensor,
    options: &RoutingOptions,
    indices: &Tensor,
    weights: &Tensor,
) -> Result<()> {
    let op = "moe_route";
    let (tokens, experts) = logits_shape(op, logits)?;
    let top_k = check_top_k(op, experts, options)?;
    check_outputs(op, stream, logits, indices, weights, &[tokens, top_k])?;
    let cfg = RouteConfig { dtype: logits.dtype().scalar_type() };
    let k = kernel(cfg.id(), || moe_route(&cfg))?;
    let args = RouteParams {
        logits,
        indices,
        weights,
        experts: experts as u32,
        top_k: top_k as u32,
        renormalize: options.renormalize as u32,
    };
    let launch = LaunchConfig::linear(tokens as u32, route_threads(experts as u32));
    params::launch(stream, &k, launch, &args.args())
}

/// Softmax top-k routing (see [`route_into`]), on the logits' default stream.
pub fn route(logits: &Tensor, options: RoutingOptions) -> Result<RoutingPlan> {
    let (tokens, experts) = logits_shape("moe_route", logits)?;
    check_top_k("moe_route", experts, &options)?;
    let shape = [tokens, options.top_k];
    let indices = Tensor::empty(logits.device(), DType::U32, &shape)?;
    let weights = Tensor::empty(logits.device(), logits.dtype(), &shape)?;
    route_into(&logits.device().default_stream(), logits, &options, &indices, &weights)?;
    Ok(RoutingPlan { indices, weights, top_k: options.top_k, experts })
}

/// Group-limited sigmoid top-k routing (DeepSeek-V3) of `logits` (`[T, E]`, f32/f16/bf16,
/// contiguous, `E` in `1..=1024`) into `indices` (`u32 [T, top_k]`) and `weights` (`[T,
/// top_k]`, the logits' dtype). Per row, in `f32`: scores `s = sigmoid(z)`; corrected scores
/// `c = s + bias` (`bias`: `f32 [E]`, selection only); a group's score is its largest `c`, or
/// with `group_top_two` the sum of its two largest; the `selected_groups` best groups are kept
/// (ties: lower group id), then the `top_k` largest `c` among their experts (ties: lower id),
/// in descending `c` order. Weights are the chosen experts' `s`, divided by `Σs + 1e-20` with
/// `renormalize`, times `scale`, rounded to the dtype. A row containing NaN or `+inf`, or only
/// `-inf`, or a NaN corrected score, gets NaN weights and the indices `0..top_k`.
pub fn route_sigmoid_grouped_into(
    stream: &Stream,
    logits: &Tensor,
    bias: Option<&Tensor>,
    options: &GroupRoutingOptions,
    indices: &Tensor,
    weights: &Tensor,
) -> Result<()> {
    let op = "moe_route_grouped";
    let (tokens, experts) = logits_shape(op, logits)?;
    let GroupRoutingOptions { top_k, groups, selected_groups, group_top_two, renormalize, scale } = *options;
    check_group_options(op, experts, options)?;
    if let Some(bias) = bias {
        expect_tensor(op, "bias", bias, DType::F32, &[experts])?;
        same_device(op, stream, &[("bias", bias)])?;
    }
    check_outputs(op, stream, logits, indices, weights, &[tokens, top_k])?;
    let cfg = GroupedRouteConfig { dtype: logits.dtype().scalar_type(), bias: bias.is_some() };
    let k = kernel(cfg.id(), || moe_route_grouped(&cfg))?;
    let args = GroupedRouteParams {
        logits,
        bias,
        indices,
        weights,
        experts: experts as u32,
        top_k: top_k as u32,
        groups: groups as u32,
        selected_groups: selected_groups as u32,
        group_top_two: group_top_two as u32,
        renormalize: renormalize as u32,
        scale,
    };
    let launch = LaunchConfig::linear(tokens as u32, route_threads(experts as u32));
    params::launch(stream, &k, launch, &args.args())
}

/// Group-limited sigmoid top-k routing (see [`route_sigmoid_grouped_into`]), on the logits'
/// default stream.
pub fn route_sigmoid_grouped(
    logits: &Tensor,
    bias: Option<&Tensor>,
    options: GroupRoutingOptions,
) -> Result<RoutingPlan> {
    let (tokens, experts) = logits_shape("moe_route_grouped", logits)?;
    check_group_options("moe_route_grouped", experts, &options)?;
    let shape = [tokens, options.top_k];
    let indices = Tensor::empty(logits.device(), DType::U32, &shape)?;
    let weights = Tensor::empty(logits.device(), logits.dtype(), &shape)?;
    route_sigmoid_grouped_into(&logits.device().default_stream(), logits, bias, &options, &indices, &weights)?;
    Ok(RoutingPlan { indices, weights, top_k: options.top_k, experts })
}
