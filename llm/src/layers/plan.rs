//! One decode step's kernel launches on paper: each layer spec adds the launches its forward
//! pass makes for one token (`decode_launches` beside its `load`), with the bytes each must move
//! and the flops it does, so that `ruda-llm profile` can bound the step without running it, and a
//! test can hold the list to the launches a real step makes (`tests/decode_plan.rs`).
//!
//! Bytes are what a launch must move through DRAM at least: each operand once (a vector every
//! block of a GEMV reads counts once, as L2 serves the rest), the KV cache up to the context
//! length. Flops are multiply-adds times two for the products and attention, and a nominal few
//! per element for the element-wise kernels (which never bind).

use std::collections::HashMap;

use ruda_runtime::DType;

/// One kernel launch of a decode step, as the model's specs plan it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedLaunch {
    /// What the model computes: the weight or layer it belongs to
    /// (`model.layers.0.self_attn.q_proj`, `model.norm (+ residual)`, `greedy pick`).
    pub op: String,
    /// The kernel configuration's id (`gemv.bf16.m1.bias`); the launched kernel's name is this
    /// with `_` for `.`.
    pub kernel: String,
    /// The operands' shapes, for reports.
    pub shape: String,
    /// Bytes read: weights, KV cache, activations, tables, workspaces.
    pub bytes_read: u64,
    /// Bytes written (activations, the new KV position, workspaces).
    pub bytes_written: u64,
    /// Of `bytes_read`, the model's weights.
    pub weight_bytes: u64,
    /// Of `bytes_read`, the KV cache's keys and values.
    pub kv_bytes: u64,
    pub flops: u64,
}

impl PlannedLaunch {
    /// Bytes read and written.
    pub fn bytes(&self) -> u64 {
        self.bytes_read + self.bytes_written
    }

    /// The kernel name a launch of this plan carries (`gemv_bf16_m1_bias`).
    pub fn kernel_name(&self) -> String {
        self.kernel.replace('.', "_")
    }
}

/// The choices a device makes at run time that change which kernels a decode step launches:
/// the tuned split counts. Absent ones are those of a device without tuning for
/// [`crate::DecoderSpec::decode_launches`] (unsplit GEMVs and argmax; decode attention's split
/// count from its heuristic, `ruda_ops::api::decode_splits`, for a cache of `context` positions).
#[derive(Clone, Debug, Default)]
pub struct DecodeChoices {
    /// K-splits of the decode GEMV of each weight `(N, K)`; absent: 1.
    pub gemv_splits: HashMap<(usize, usize), usize>,
    /// Column splits of the greedy pick's argmax (the pipeline's workspace); `None`: 1.
    pub argmax_splits: Option<usize>,
    /// Key splits of decode attention (the cache's workspace); `None`: the heuristic's.
    pub attention_splits: Option<usize>,
}

/// What every spec needs to plan its launches: the compute dtype, the context and the choices.
pub struct DecodeStep<'a> {
    pub dtype: DType,
    /// Keys decode attention reads: the cached positions plus the new one.
    pub context: usize,
    /// Key splits of decode attention, resolved.
    pub attention_splits: usize,
    /// Dimensions of each head that RoPE rotates (the model's rotary table).
    pub rotary_dim: usize,
    pub choices: &'a DecodeChoices,
}

impl DecodeStep<'_> {
    /// Bytes of one element in the compute dtype.
    pub fn elem(&self) -> u64 {
        self.dtype.size() as u64
    }

    /// `bf16`: the dtype as configuration ids spell it.
    pub fn dt(&self) -> String {
        self.dtype.scalar_type().to_string()
    }
}

/// A launch with its sizes; `weight_bytes` and `kv_bytes` are parts of `read`.
pub(crate) fn launch(op: String, kernel: String, shape: String, read: u64, written: u64, flops: u64) -> PlannedLaunch {
    PlannedLaunch { op, kernel, shape, bytes_read: read, bytes_written: written, weight_bytes: 0, kv_bytes: 0, flops }
}

/// `prefix.weight` → `prefix`.
pub(crate) fn prefix(weight_name: &str) -> &str {
    weight_name.strip_suffix(".weight").unwrap_or(weight_name)
}
