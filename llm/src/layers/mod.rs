//! The layers architectures are made of. Each comes in two forms: a *spec*, which is what a
//! config implies (its tensors' names, shapes and device dtypes, its projection shapes), and the
//! loaded layer (device tensors and a forward pass from `ruda_ops` entry points). A layer
//! declares its tensors once, in its spec; loading validates the checkpoint against that
//! declaration and uploads from it, and tuning reads the projection shapes from the same specs.

mod attention;
mod embedding;
mod gated_delta_net;
mod linear;
mod mlp;
mod moe;
mod norm;
mod plan;
mod rope;

pub use attention::{
    Attention, AttentionScratch, AttentionShape, AttentionSpec, BatchRow, KvTarget, PagedKv, PagedRead, StepInputs,
};
pub use embedding::{Embedding, EmbeddingSpec, LmHeadSpec, EMBED_TOKENS, LM_HEAD};
pub use gated_delta_net::{GatedDeltaNet, GatedDeltaNetSpec, GatedDeltaScratch, LinearBatch};
pub use linear::{Linear, LinearPlan, LinearShape, LinearSpec};
pub use mlp::{Mlp, MlpScratch, MlpSpec};
pub use moe::{Moe, MoeScratch, MoeSpec};
pub use norm::{RmsNorm, RmsNormSpec};
pub use plan::{DecodeChoices, DecodeStep, PlannedLaunch};
pub use rope::{Rope, RopeSpec};

use ruda_ops::api;
use ruda_runtime::{DType, Device, Tensor};

use crate::error::{LlmError, LoadError};

/// The dtype a layer holds a tensor in on the device (the checkpoint may store bf16, f16 or f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDType {
    /// The model's compute dtype.
    Compute,
    /// Always f32: norm gammas (the ops take f32 gammas; every checkpoint dtype converts exactly).
    F32,
}

/// A tensor a model needs, as a layer declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedTensor {
    pub name: String,
    /// PyTorch's layout (`[out, in]` for linear weights).
    pub shape: Vec<usize>,
    pub dtype: WeightDType,
    /// False only for `lm_head.weight` of a model with tied embeddings.
    pub required: bool,
}

impl ExpectedTensor {
    /// A required tensor held in the compute dtype.
    pub(crate) fn compute(name: String, shape: Vec<usize>) -> ExpectedTensor {
        ExpectedTensor { name, shape, dtype: WeightDType::Compute, required: true }
    }
}

/// Where loaded layers read a checkpoint's tensors: the validated weights (a trait so that the
/// layers do not depend on how the files are found and mapped).
pub trait TensorSource {
    /// The stored dtype, shape and bytes of tensor `name`.
    fn stored(&self, name: &str) -> Option<(DType, &[usize], &[u8])>;

    /// Refuse tensor `name`'s values, naming it, when they must not reach the device (for
    /// [`crate::Weights`]: a NaN or an infinity, unless that check is off). The [`Loader`] calls
    /// it on every tensor it reads, as it reads it.
    fn check(&self, name: &str) -> Result<(), LoadError>;
}

/// Uploads declared tensors to a device, converting them to the dtype their declaration asks.
pub struct Loader<'a> {
    pub(crate) source: &'a dyn TensorSource,
    pub(crate) device: &'a Device,
    /// The compute dtype.
    pub(crate) dtype: DType,
}

impl Loader<'_> {
    fn target(&self, t: &ExpectedTensor) -> DType {
        match t.dtype {
            WeightDType::Compute => self.dtype,
            WeightDType::F32 => DType::F32,
        }
    }

    /// Tensor `name` as stored, once [`TensorSource::check`] accepts it.
    fn stored(&self, name: &str) -> Result<(DType, &[usize], &[u8]), LlmError> {
        let stored = self.source.stored(name).ok_or_else(|| LlmError::missing_tensor(name))?;
        self.source.check(name)?;
        Ok(stored)
    }

    /// The device tensor of `t`.
    pub(crate) fn tensor(&self, t: &ExpectedTensor) -> Result<Tensor, LlmError> {
        let (dtype, shape, bytes) = self.stored(&t.name)?;
        let tensor = Tensor::from_bytes(self.device, dtype, shape, bytes)
            .map_err(|e| LlmError::upload(&t.name, self.device, e))?;
        convert(tensor, self.target(t), &t.name)
    }

    /// Rows `start..start + rows` of `t` (its first axis; the rest flattened into columns) as a
    /// `[rows, columns]` tensor in the dtype of `t`'s declaration (one host copy of those rows).
    pub(crate) fn rows(&self, t: &ExpectedTensor, start: usize, rows: usize) -> Result<Tensor, LlmError> {
        let (dtype, shape, bytes) = self.stored(&t.name)?;
        let cols: usize = shape.iter().skip(1).product();
        let row_bytes = cols * dtype.size();
        if start + rows > shape.first().copied().unwrap_or(0) {
            return Err(LlmError::InvalidArgument(format!("rows {start}..{} of {} {shape:?}", start + rows, t.name)));
        }
        let part = &bytes[start * row_bytes..(start + rows) * row_bytes];
        let tensor = Tensor::from_bytes(self.device, dtype, &[rows, cols], part)
            .map_err(|e| LlmError::upload(&t.name, self.device, e))?;
        convert(tensor, self.target(t), &t.name)
    }

    /// Several `[rows_i, K]` tensors of one stored dtype stacked into `[Σ rows_i, K]` (one host
    /// copy of these tensors only), in the dtype of the first one's declaration.
    pub(crate) fn stacked(&self, parts: &[ExpectedTensor]) -> Result<Tensor, LlmError> {
        let first = parts.first().ok_or_else(|| LlmError::InvalidArgument("stacking no tensors".into()))?;
        let (dtype, shape, _) = self.source.stored(&first.name).ok_or_else(|| LlmError::missing_tensor(&first.name))?;
        let cols = shape.get(1).copied().unwrap_or(1);
        let (mut bytes, mut rows) = (Vec::new(), 0);
        // Each part is checked once, as it is copied.
        for part in parts {
            let (d, shape, b) = self.stored(&part.name)?;
            if d != dtype {
                let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
                return Err(LlmError::InvalidArgument(format!(
                    "{} are stored in different dtypes; they must match to be fused",
                    names.join(" and ")
                )));
            }
            bytes.extend_from_slice(b);
            rows += shape[0];
        }
        let t = Tensor::from_bytes(self.device, dtype, &[rows, cols], &bytes)
            .map_err(|e| LlmError::upload(&first.name, self.device, e))?;
        convert(t, self.target(first), &first.name)
    }
}

fn convert(t: Tensor, dtype: DType, name: &str) -> Result<Tensor, LlmError> {
    if t.dtype() == dtype {
        return Ok(t);
    }
    api::cast(&t, dtype).map_err(|e| LlmError::op(format!("converting {name} to {dtype}"), e))
}
