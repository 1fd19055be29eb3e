//! The sparse mixture-of-experts block of Qwen3-MoE: a router `logits = x·Wgateᵀ` over `E`
//! experts, softmax top-k routing (f32, renormalised with `norm_topk_prob`), each token's rows
//! dispatched to its experts' SwiGLU, and the weighted sum of their outputs:
//!
//! ```text
//! out[t] = Σ_{e ∈ topk(t)} w[t, e] · down_e(silu(gate_e · x[t]) ⊙ up_e · x[t])
//! ```
//!
//! The experts are held as one `[E, 2I, H]` gate/up tensor (each expert's gate rows first) and
//! one `[E, H, I]` down tensor, from either checkpoint layout: per expert
//! (`experts.{e}.{gate,up,down}_proj.weight`, stacked at load in one host copy) or fused
//! (`experts.gate_up_proj`, `experts.down_proj`, uploaded as stored).
//!
//! A chunk of at most [`EXPERTS_DECODE_MAX_TOKENS`] rows (a decode step) skips the dispatch:
//! the experts run as GEMVs over the routing slots, each selected expert's weights read once,
//! then a combine in slot order ([`SwiGluExperts::forward_decode_into`]). Longer chunks dispatch
//! rows by expert and run grouped GEMMs.
//!
//! Qwen3.5-MoE adds a shared expert that every token runs, gated per token
//! ([`MoeSpec::with_shared_expert`]):
//!
//! ```text
//! out[t] += sigmoid(x[t] · w_shared_gate) · shared_expert(x[t])
//! ```

use ruda_ops::api::{
    self, DispatchedTokens, ExpertsDecodeWorkspace, ExpertsWorkspace, GroupedStrategy, RoutingOptions, RoutingPlan,
    SwiGluExperts, EXPERTS_DECODE_MAX_TOKENS,
};
use ruda_runtime::{DType, Device, Stream, Tensor};

use super::plan::{launch, DecodeStep, PlannedLaunch};
use super::{ExpectedTensor, Linear, LinearPlan, LinearShape, LinearSpec, Loader, Mlp, MlpScratch, MlpSpec};
use crate::config::ExpertsLayout;
use crate::error::LlmError;

/// `{prefix}.gate` (the router) and `{prefix}.experts`.
#[derive(Clone, Debug)]
pub struct MoeSpec {
    prefix: String,
    pub router: LinearSpec,
    pub experts: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub routing: RoutingOptions,
    /// The layout [`MoeSpec::declare`] declares (loading takes whichever the checkpoint holds).
    pub layout: ExpertsLayout,
    /// Qwen3.5-MoE's gated shared expert.
    pub shared: Option<Box<SharedExpertSpec>>,
}

/// `{prefix}.shared_expert` (a SwiGLU MLP) and its gate `{prefix}.shared_expert_gate` `[1, H]`.
#[derive(Clone, Debug)]
pub struct SharedExpertSpec {
    pub mlp: MlpSpec,
    pub gate: LinearSpec,
}

impl MoeSpec {
    pub fn new(
        prefix: &str,
        hidden: usize,
        experts: usize,
        intermediate: usize,
        routing: RoutingOptions,
        layout: ExpertsLayout,
    ) -> MoeSpec {
        MoeSpec {
            prefix: prefix.to_string(),
            router: LinearSpec::new("router", &format!("{prefix}.gate"), experts, hidden, false),
            experts,
            hidden,
            intermediate,
            routing,
            layout,
            shared: None,
        }
    }

    /// With a shared expert of `intermediate` features, gated per token.
    pub fn with_shared_expert(mut self, intermediate: usize) -> MoeSpec {
        let p = &self.prefix;
        self.shared = Some(Box::new(SharedExpertSpec {
            mlp: MlpSpec::new(&format!("{p}.shared_expert"), self.hidden, intermediate),
            gate: LinearSpec::new("shared_expert_gate", &format!("{p}.shared_expert_gate"), 1, self.hidden, false),
        }));
        self
    }

    /// The experts' tensors in `layout`, in the order transformers writes them.
    fn expert_tensors(&self, layout: ExpertsLayout) -> Vec<ExpectedTensor> {
        let (p, e, h, i) = (&self.prefix, self.experts, self.hidden, self.intermediate);
        match layout {
            ExpertsLayout::PerExpert => (0..e)
                .flat_map(|x| {
                    [("gate_proj", [i, h]), ("up_proj", [i, h]), ("down_proj", [h, i])].map(|(name, shape)| {
                        ExpectedTensor::compute(format!("{p}.experts.{x}.{name}.weight"), shape.to_vec())
                    })
                })
                .collect(),
            ExpertsLayout::Fused => vec![
                ExpectedTensor::compute(format!("{p}.experts.gate_up_proj"), vec![e, 2 * i, h]),
                ExpectedTensor::compute(format!("{p}.experts.down_proj"), vec![e, h, i]),
            ],
        }
    }

    pub fn declare(&self, out: &mut Vec<ExpectedTensor>) {
        out.extend(self.router.weights.iter().cloned());
        out.extend(self.expert_tensors(self.layout));
        if let Some(shared) = &self.shared {
            shared.mlp.declare(out);
            out.extend(shared.gate.weights.iter().cloned());
        }
    }

    /// The router's product and the shared expert's (the routed experts run grouped GEMMs,
    /// which the linear shapes do not cover).
    pub fn linear_shapes(&self, tokens: usize) -> Vec<LinearShape> {
        let mut out = vec![self.router.linear_shape(tokens)];
        if let Some(shared) = &self.shared {
            out.extend(shared.mlp.linear_shapes(tokens));
            out.push(shared.gate.linear_shape(tokens));
        }
        out
    }

    /// The launches of [`Moe::forward`] for one row: the router, routing, the decode path's
    /// gate/up (with SwiGLU), down and combine; then the shared expert's MLP, its gate and the
    /// gated add.
    pub fn decode_launches(&self, step: &DecodeStep, out: &mut Vec<PlannedLaunch>) {
        self.router.decode_launches(step, out);
        let (e, k, h, i) =
            (self.experts as u64, self.routing.top_k as u64, self.hidden as u64, self.intermediate as u64);
        let (el, dt) = (step.elem(), step.dt());
        let p = &self.prefix;
        out.push(launch(
            format!("{p}.route"),
            format!("moe_route.{dt}"),
            format!("[1, {e}] → top {k}"),
            e * el,
            k * (4 + el),
            5 * e,
        ));
        // One row: the decode path (see the module docs), its loads 16 bytes wide where the
        // hidden and intermediate sizes are whole chunks.
        let chunk = 16 / el;
        let loads = if h % chunk == 0 && i % chunk == 0 { "" } else { ".scalar" };
        let gate_up = k * 2 * i * h * el;
        out.push(PlannedLaunch {
            weight_bytes: gate_up,
            ..launch(
                format!("{p}.experts.gate_up_proj (silu · up)"),
                format!("moe_decode_gate_up_fused.{dt}.m1{loads}"),
                format!("[1, {h}] · [{k} of {e}, {}, {h}]ᵀ → [{k}, {i}]", 2 * i),
                gate_up + h * el + k * 4,
                k * i * el,
                2 * k * 2 * i * h + 5 * k * i,
            )
        });
        let down = k * h * i * el;
        out.push(PlannedLaunch {
            weight_bytes: down,
            ..launch(
                format!("{p}.experts.down_proj"),
                format!("moe_decode_down.{dt}.m1{loads}"),
                format!("[{k}, {i}] · [{k} of {e}, {h}, {i}]ᵀ"),
                down + k * i * el + k * 4,
                k * h * el,
                2 * k * h * i,
            )
        });
        out.push(launch(
            format!("{p}.combine"),
            format!("moe_combine_slots.{dt}.w{dt}"),
            format!("[{k}, {h}] → [1, {h}]"),
            k * h * el + k * el,
            h * el,
            2 * k * h,
        ));
        if let Some(shared) = &self.shared {
            shared.mlp.decode_launches(step, out);
            shared.gate.decode_launches(step, out);
            out.push(launch(
                format!("{p}.shared_expert (gated add)"),
                format!("moe_shared_expert_add.{dt}"),
                format!("[1, {h}] + sigmoid([1, 1]) · [1, {h}]"),
                (2 * h + 1) * el,
                h * el,
                h + 5,
            ));
        }
    }

    /// The router and the experts, from whichever layout the checkpoint holds.
    pub fn load(&self, ld: &Loader) -> Result<Moe, LlmError> {
        let router = self.router.load(ld)?;
        let fused = &self.expert_tensors(ExpertsLayout::Fused);
        let layout =
            if ld.source.stored(&fused[0].name).is_some() { ExpertsLayout::Fused } else { ExpertsLayout::PerExpert };
        let (e, h, i) = (self.experts, self.hidden, self.intermediate);
        let op = |e| LlmError::op(format!("the experts of {}", self.prefix), e);
        let (gate_up, down) = match layout {
            ExpertsLayout::Fused => (ld.tensor(&fused[0])?, ld.tensor(&fused[1])?),
            ExpertsLayout::PerExpert => {
                // [gate_0; up_0; gate_1; up_1; ...] is [E, 2I, H] with each expert's gate rows
                // first; the downs stacked are [E, H, I].
                let all = self.expert_tensors(ExpertsLayout::PerExpert);
                let (gate_up, down): (Vec<_>, Vec<_>) =
                    all.into_iter().partition(|t| !t.name.ends_with("down_proj.weight"));
                (ld.stacked(&gate_up)?.reshape(&[e, 2 * i, h])?, ld.stacked(&down)?.reshape(&[e, h, i])?)
            }
        };
        let experts = SwiGluExperts::from_fused(gate_up, down).map_err(op)?;
        let shared = match &self.shared {
            Some(s) => Some(Box::new(SharedExpert {
                mlp: s.mlp.load(ld)?,
                gate: s.gate.load(ld)?,
                intermediate: s.mlp.intermediate(),
            })),
            None => None,
        };
        Ok(Moe { router, experts, routing: self.routing, prefix: self.prefix.clone(), shared })
    }
}

pub struct Moe {
    router: Linear,
    experts: SwiGluExperts,
    routing: RoutingOptions,
    prefix: String,
    shared: Option<Box<SharedExpert>>,
}

struct SharedExpert {
    mlp: Mlp,
    gate: Linear,
    intermediate: usize,
}

/// The shared expert's buffers: the routed experts' combined rows (before the add), its MLP's,
/// its output and its gate's logit per row.
struct SharedScratch {
    routed: Tensor,
    mlp: MlpScratch,
    out: Tensor,
    gate: Tensor,
}

/// An MoE block's buffers for a chunk of `tokens` rows (every sparse layer of a model has the
/// same shapes, so one serves them all).
pub struct MoeScratch {
    logits: Tensor,
    /// The routing's indices and weights `[tokens, top_k]`, which `route_into` fills.
    routing: RoutingPlan,
    experts: ExpertsScratch,
    shared: Option<SharedScratch>,
}

/// The routed experts' buffers: the decode path's for a few rows, else the dispatch's and the
/// grouped GEMMs'.
enum ExpertsScratch {
    Decode(ExpertsDecodeWorkspace),
    Dispatched(Box<DispatchedScratch>),
}

struct DispatchedScratch {
    dispatched: DispatchedTokens,
    workspace: ExpertsWorkspace,
    expert_out: Tensor,
}

impl Moe {
    pub fn linears(&self) -> Vec<&Linear> {
        let mut out = vec![&self.router];
        if let Some(shared) = &self.shared {
            out.extend(shared.mlp.linears());
            out.push(&shared.gate);
        }
        out
    }

    pub fn scratch(&self, device: &Device, dtype: DType, tokens: usize) -> Result<MoeScratch, LlmError> {
        let (e, k, h) = (self.experts.experts(), self.routing.top_k, self.experts.hidden());
        let op = |e| LlmError::op("the MoE buffers", e);
        let shared = match &self.shared {
            Some(s) => Some(SharedScratch {
                routed: Tensor::empty(device, dtype, &[tokens, h])?,
                mlp: MlpScratch::new(device, dtype, tokens, s.intermediate)?,
                out: Tensor::empty(device, dtype, &[tokens, h])?,
                gate: Tensor::empty(device, dtype, &[tokens, 1])?,
            }),
            None => None,
        };
        Ok(MoeScratch {
            logits: Tensor::empty(device, dtype, &[tokens, e])?,
            routing: RoutingPlan::from_selection(
                Tensor::empty(device, DType::U32, &[tokens, k])?,
                Tensor::empty(device, dtype, &[tokens, k])?,
                e,
            )
            .map_err(op)?,
            experts: if tokens <= EXPERTS_DECODE_MAX_TOKENS {
                ExpertsScratch::Decode(ExpertsDecodeWorkspace::new(&self.experts, tokens, k).map_err(op)?)
            } else {
                ExpertsScratch::Dispatched(Box::new(DispatchedScratch {
                    dispatched: DispatchedTokens::new(device, dtype, tokens, k, e, h).map_err(op)?,
                    // Tiles tuned on a GPU (measured once per shape, before any capture).
                    workspace: ExpertsWorkspace::tuned(&device.default_stream(), &self.experts, tokens * k)
                        .map_err(op)?,
                    expert_out: Tensor::empty(device, dtype, &[tokens * k, h])?,
                }))
            },
            shared,
        })
    }

    /// `out = moe(x)` for `x` `[T, H]` (`T` the scratch's rows), in `a`'s buffers: allocates
    /// nothing and waits for nothing (so a decode step can be captured).
    pub fn forward(
        &self,
        s: &Stream,
        plan: &LinearPlan,
        x: &Tensor,
        a: &MoeScratch,
        out: &Tensor,
    ) -> Result<(), LlmError> {
        let p = &self.prefix;
        let op = |what: &'static str| move |e| LlmError::op(format!("{p} {what}"), e);
        self.router.forward(s, plan, x, &a.logits).map_err(op("router"))?;
        let r = &a.routing;
        api::route_into(s, &a.logits, &self.routing, r.indices(), r.weights()).map_err(op("routing"))?;
        // The routed experts' sum goes to `out`, or before the shared expert's add to `routed`.
        let routed = a.shared.as_ref().map_or(out, |b| &b.routed);
        match &a.experts {
            ExpertsScratch::Decode(ws) => {
                self.experts.forward_decode_into(s, x, r, ws, routed).map_err(op("experts"))?;
            }
            ExpertsScratch::Dispatched(d) => {
                let DispatchedScratch { dispatched, workspace, expert_out } = &**d;
                r.dispatch_into(s, x, dispatched).map_err(op("dispatch"))?;
                self.experts
                    .forward_dispatched_into(s, dispatched, GroupedStrategy::Auto, workspace, expert_out)
                    .map_err(op("experts"))?;
                dispatched.combine_into(s, expert_out, routed).map_err(op("combine"))?;
            }
        }
        let (Some(shared), Some(b)) = (&self.shared, &a.shared) else {
            return Ok(());
        };
        shared.mlp.forward(s, plan, x, &b.mlp, &b.out)?;
        shared.gate.forward(s, plan, x, &b.gate).map_err(op("shared expert gate"))?;
        api::shared_expert_add_into(s, &b.routed, &b.out, &b.gate, out).map_err(op("shared expert"))
    }
}
