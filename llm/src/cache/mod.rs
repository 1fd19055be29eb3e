//! Per-sequence model state between forward passes. A model's [`Cache`] holds one
//! [`LayerCache`] per layer, by the kind of that layer's token mixer: the contiguous
//! [`KvCache`] of full attention, or the [`LinearState`] of Qwen3.5's gated DeltaNet, side by side
//! in hybrid models; a paged cache (block tables) is a further kind.

mod kv;

pub use kv::KvCache;

use ruda_runtime::Tensor;

use ruda_ops::api::DecodeWorkspace;

use crate::error::LlmError;

/// One layer's state.
pub enum LayerCache {
    /// Keys and values of every position so far (full attention).
    Kv(KvCache),
    /// The conv and recurrent states after the last position (linear attention).
    Linear(LinearState),
}

/// What a gated DeltaNet layer carries from one position to the next. It is only read when the
/// cache holds positions: a sequence's first chunk starts from zeros and overwrites it (so
/// [`Cache::clear`] needs not zero it).
pub struct LinearState {
    /// The last `W − 1` conv inputs `[channels, W − 1]` of the q, k and v channel blocks.
    pub conv: [Tensor; 3],
    /// f32 `[1, Hv, K, V]`.
    pub recurrent: Tensor,
}

impl LayerCache {
    /// The KV cache of a full-attention layer.
    pub fn kv(&self) -> Result<&KvCache, LlmError> {
        match self {
            LayerCache::Kv(kv) => Ok(kv),
            LayerCache::Linear(_) => Err(LlmError::InvalidArgument(
                "a linear-attention layer's cache where full attention needs a KV cache: it was made by another model"
                    .into(),
            )),
        }
    }

    /// The state of a linear-attention layer.
    pub fn linear_mut(&mut self) -> Result<&mut LinearState, LlmError> {
        match self {
            LayerCache::Linear(state) => Ok(state),
            LayerCache::Kv(_) => Err(LlmError::InvalidArgument(
                "a KV cache where a linear-attention layer needs its state: it was made by another model".into(),
            )),
        }
    }
}

/// The state of one sequence across all layers, and how many positions are filled.
pub struct Cache {
    layers: Vec<LayerCache>,
    capacity: usize,
    len: usize,
    /// Split-KV decode's scratch, shared by the attention layers (one shape), with the split
    /// count tuned for this capacity (`None` for a model without attention layers).
    decode: Option<DecodeWorkspace>,
}

impl Cache {
    pub(crate) fn new(layers: Vec<LayerCache>, capacity: usize, decode: Option<DecodeWorkspace>) -> Cache {
        Cache { layers, capacity, len: 0, decode }
    }

    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forget the sequence (the memory is kept).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn layers(&self) -> &[LayerCache] {
        &self.layers
    }

    /// The layers' states and the decode attention workspace, borrowed together.
    pub(crate) fn parts_mut(&mut self) -> (&mut [LayerCache], Option<&DecodeWorkspace>) {
        (&mut self.layers, self.decode.as_ref())
    }

    /// Count `tokens` more positions as filled (after every layer appended them).
    pub(crate) fn advance(&mut self, tokens: usize) {
        self.len += tokens;
    }
}
