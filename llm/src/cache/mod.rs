//! Per-sequence model state between forward passes. A model's [`Cache`] holds one
//! [`LayerCache`] per layer, by the kind of that layer's token mixer: the contiguous
//! [`KvCache`] of full attention, or the [`LinearStatePool`] of Qwen3.5's gated DeltaNet, side by side
//! in hybrid models; a paged cache (block tables) is a further kind.

mod kv;

pub use kv::KvCache;

use ruda_runtime::{Stream, Tensor};

use ruda_ops::api::DecodeWorkspace;

use crate::error::LlmError;

/// One layer's state.
pub enum LayerCache {
    /// Keys and values of every position so far (full attention).
    Kv(KvCache),
    /// The conv and recurrent states after the last position (linear attention), in a pool of
    /// one slot.
    Linear(LinearStatePool),
}

/// What a gated DeltaNet layer carries from one position to the next, for `slots` sequences
/// (one in a single-sequence [`Cache`], one per active sequence in a batch), each in its slot.
/// A slot is only read while its sequence holds positions: a fresh sequence's slot is zeroed
/// by the layer first (so [`Cache::clear`] needs not zero it).
pub struct LinearStatePool {
    /// The last `W − 1` conv inputs `[slots, channels, W − 1]` of the q, k and v channel
    /// blocks, in the compute dtype.
    pub conv: [Tensor; 3],
    /// f32 `[slots, Hv, K, V]`.
    pub recurrent: Tensor,
}

impl LinearStatePool {
    pub fn slots(&self) -> usize {
        self.recurrent.shape()[0]
    }

    /// Zero `slot`'s states on `stream`: host-to-device copies of zeros (no allocation on the
    /// device, no synchronisation).
    pub fn zero_slot(&self, stream: &Stream, slot: usize) -> Result<(), LlmError> {
        for pool in self.conv.iter().chain([&self.recurrent]) {
            let t = pool.narrow(0, slot, 1)?;
            let size = t.dtype().size();
            t.buffer().write_on(stream, t.offset() * size, &vec![0u8; t.numel() * size])?;
        }
        Ok(())
    }
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
    pub fn linear(&self) -> Result<&LinearStatePool, LlmError> {
        match self {
            LayerCache::Linear(pool) => Ok(pool),
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
