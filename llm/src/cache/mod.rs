//! Per-sequence model state between forward passes. A model's [`Cache`] holds one
//! [`LayerCache`] per layer, by the kind of that layer's token mixer: the contiguous
//! [`KvCache`] of full attention today; a paged cache (block tables) and the recurrent state of
//! linear attention are further kinds, side by side in hybrid models.

mod kv;

pub use kv::KvCache;

use ruda_ops::api::DecodeWorkspace;

use crate::error::LlmError;

/// One layer's state.
pub enum LayerCache {
    /// Keys and values of every position so far (full attention).
    Kv(KvCache),
}

impl LayerCache {
    /// The KV cache of a full-attention layer.
    pub fn kv(&self) -> Result<&KvCache, LlmError> {
        match self {
            LayerCache::Kv(kv) => Ok(kv),
        }
    }
}

/// The state of one sequence across all layers, and how many positions are filled.
pub struct Cache {
    layers: Vec<LayerCache>,
    capacity: usize,
    len: usize,
    /// Split-KV decode's scratch, shared by the attention layers (one shape), with the split
    /// count tuned for this capacity.
    decode: DecodeWorkspace,
}

impl Cache {
    pub(crate) fn new(layers: Vec<LayerCache>, capacity: usize, decode: DecodeWorkspace) -> Cache {
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

    pub(crate) fn decode_workspace(&self) -> &DecodeWorkspace {
        &self.decode
    }

    /// Count `tokens` more positions as filled (after every layer appended them).
    pub(crate) fn advance(&mut self, tokens: usize) {
        self.len += tokens;
    }
}
