//! The token embedding and the output projection (`lm_head`), which tied checkpoints share.

use ruda_ops::api::{self, OpError};
use ruda_runtime::{Stream, Tensor};

use super::plan::{launch, DecodeStep, PlannedLaunch};
use super::{ExpectedTensor, Linear, LinearShape, LinearSpec, Loader};
use crate::error::LlmError;

/// The name of the embedding, which tied checkpoints reuse as `lm_head.weight`.
pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
/// The output projection.
pub const LM_HEAD: &str = "lm_head.weight";

/// `model.embed_tokens.weight [vocab, hidden]`.
#[derive(Clone, Debug)]
pub struct EmbeddingSpec {
    pub weight: ExpectedTensor,
}

impl EmbeddingSpec {
    pub fn new(vocab: usize, hidden: usize) -> EmbeddingSpec {
        EmbeddingSpec::named(EMBED_TOKENS, vocab, hidden)
    }

    /// The embedding stored as `name` (a composite checkpoint's text model has its own prefix).
    pub fn named(name: &str, vocab: usize, hidden: usize) -> EmbeddingSpec {
        EmbeddingSpec { weight: ExpectedTensor::compute(name.into(), vec![vocab, hidden]) }
    }

    /// The gather of one token's row: 16-byte accesses when a row is a multiple of 16 bytes.
    pub fn decode_launch(&self, step: &DecodeStep) -> PlannedLaunch {
        let hidden = self.weight.shape[1];
        let row = hidden as u64 * step.elem();
        let scalar = if row.is_multiple_of(16) { "" } else { ".scalar" };
        PlannedLaunch {
            weight_bytes: row,
            ..launch(
                "model.embed_tokens".into(),
                format!("embedding.{}{scalar}", step.dt()),
                format!("ids[1] → [1, {hidden}]"),
                4 + row,
                row,
                0,
            )
        }
    }

    pub fn load(&self, ld: &Loader) -> Result<Embedding, LlmError> {
        Ok(Embedding { weight: ld.tensor(&self.weight)? })
    }
}

pub struct Embedding {
    weight: Tensor,
}

impl Embedding {
    /// `out[i] = weight[ids[i]]`.
    pub fn forward(&self, s: &Stream, ids: &Tensor, out: &Tensor) -> Result<(), OpError> {
        api::embedding_into(s, ids, &self.weight, out)
    }
}

/// `lm_head.weight [vocab, hidden]`, or the embedding itself when tied (the file may still store
/// a copy, which is then not read).
#[derive(Clone, Debug)]
pub struct LmHeadSpec {
    pub weight: ExpectedTensor,
    pub tied: bool,
}

impl LmHeadSpec {
    pub fn new(vocab: usize, hidden: usize, tied: bool) -> LmHeadSpec {
        let weight = ExpectedTensor { required: !tied, ..ExpectedTensor::compute(LM_HEAD.into(), vec![vocab, hidden]) };
        LmHeadSpec { weight, tied }
    }

    /// The logits of the last row only: a one-row product whatever the chunk.
    pub fn linear_shape(&self) -> LinearShape {
        LinearShape { name: "lm_head", m: 1, n: self.weight.shape[0], k: self.weight.shape[1] }
    }

    pub fn load(&self, ld: &Loader, embedding: &Embedding) -> Result<Linear, LlmError> {
        if self.tied {
            return Ok(Linear::Dense { weight: embedding.weight.clone(), bias: None });
        }
        self.linear().load(ld)
    }

    /// The logits' GEMV in a decode step (the embedding's table when tied: the same bytes).
    pub fn decode_launches(&self, step: &DecodeStep, out: &mut Vec<PlannedLaunch>) {
        self.linear().decode_launches(step, out);
    }

    fn linear(&self) -> LinearSpec {
        LinearSpec { name: "lm_head", weights: vec![self.weight.clone()], bias: None }
    }
}
