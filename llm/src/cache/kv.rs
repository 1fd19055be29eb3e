//! The contiguous KV cache of one full-attention layer.

use ruda_runtime::{DType, Device, Tensor};

use crate::error::LlmError;

/// Keys and values `[1, kv_heads, capacity, head_dim]` of one sequence.
pub struct KvCache {
    k: Tensor,
    v: Tensor,
}

impl KvCache {
    pub fn new(
        device: &Device,
        dtype: DType,
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
    ) -> Result<KvCache, LlmError> {
        let shape = [1, kv_heads, capacity, head_dim];
        Ok(KvCache { k: Tensor::zeros(device, dtype, &shape)?, v: Tensor::zeros(device, dtype, &shape)? })
    }

    pub fn k(&self) -> &Tensor {
        &self.k
    }

    pub fn v(&self) -> &Tensor {
        &self.v
    }
}
