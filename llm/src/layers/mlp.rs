//! The SwiGLU feed-forward block: `down(silu(x·Wgateᵀ) · x·Wupᵀ)`, with gate and up stacked at
//! load into one `[2·I, H]` product.

use ruda_ops::api;
use ruda_runtime::{DType, Device, Stream, Tensor};

use super::plan::{launch, DecodeStep, PlannedLaunch};
use super::{ExpectedTensor, Linear, LinearPlan, LinearShape, LinearSpec, Loader};
use crate::error::LlmError;

/// `{prefix}.gate_proj`, `{prefix}.up_proj` and `{prefix}.down_proj`, without biases.
#[derive(Clone, Debug)]
pub struct MlpSpec {
    pub gate_up: LinearSpec,
    pub down: LinearSpec,
}

impl MlpSpec {
    pub fn new(prefix: &str, hidden: usize, intermediate: usize) -> MlpSpec {
        let (gate, up) = (format!("{prefix}.gate_proj"), format!("{prefix}.up_proj"));
        MlpSpec {
            gate_up: LinearSpec::stacked("gate_up_proj", &[gate.as_str(), up.as_str()], intermediate, hidden),
            down: LinearSpec::new("down_proj", &format!("{prefix}.down_proj"), hidden, intermediate, false),
        }
    }

    pub fn declare(&self, out: &mut Vec<ExpectedTensor>) {
        out.extend(self.gate_up.weights.iter().chain(&self.down.weights).cloned());
    }

    pub fn linear_shapes(&self, tokens: usize) -> [LinearShape; 2] {
        [self.gate_up.linear_shape(tokens), self.down.linear_shape(tokens)]
    }

    /// Features between the two products.
    pub fn intermediate(&self) -> usize {
        self.down.shape().1
    }

    /// The launches of [`Mlp::forward`] for one row: gate/up, the activation, down.
    pub fn decode_launches(&self, step: &DecodeStep, out: &mut Vec<PlannedLaunch>) {
        self.gate_up.decode_launches(step, out);
        let (i, e) = (self.intermediate() as u64, step.elem());
        let label = self.gate_up.label();
        let parent = label.rsplit_once('.').map_or("mlp", |(p, _)| p);
        out.push(launch(
            format!("{parent}.act (silu · up)"),
            format!("swiglu.{}", step.dt()),
            format!("[1, {}] → [1, {i}]", 2 * i),
            2 * i * e,
            i * e,
            5 * i,
        ));
        self.down.decode_launches(step, out);
    }

    pub fn load(&self, ld: &Loader) -> Result<Mlp, LlmError> {
        Ok(Mlp { gate_up: self.gate_up.load(ld)?, down: self.down.load(ld)? })
    }
}

pub struct Mlp {
    gate_up: Linear,
    down: Linear,
}

/// An MLP's intermediate buffers for a chunk of `tokens` rows.
pub struct MlpScratch {
    gate_up: Tensor,
    act: Tensor,
}

impl MlpScratch {
    pub fn new(device: &Device, dtype: DType, tokens: usize, intermediate: usize) -> Result<MlpScratch, LlmError> {
        Ok(MlpScratch {
            gate_up: Tensor::empty(device, dtype, &[tokens, 2 * intermediate])?,
            act: Tensor::empty(device, dtype, &[tokens, intermediate])?,
        })
    }
}

impl Mlp {
    pub fn linears(&self) -> [&Linear; 2] {
        [&self.gate_up, &self.down]
    }

    /// `out = mlp(x)`.
    pub fn forward(
        &self,
        s: &Stream,
        plan: &LinearPlan,
        x: &Tensor,
        a: &MlpScratch,
        out: &Tensor,
    ) -> Result<(), LlmError> {
        // Neither product has a bias: no scratch is needed.
        self.gate_up.forward(s, plan, x, &a.gate_up).map_err(|e| LlmError::op("gate/up projection", e))?;
        api::swiglu_into(s, &a.gate_up, &a.act).map_err(|e| LlmError::op("swiglu", e))?;
        self.down.forward(s, plan, &a.act, out).map_err(|e| LlmError::op("down projection", e))
    }
}
