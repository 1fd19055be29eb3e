//! Rotary position embedding (rotate-half form) and its fusion with the KV-cache append.
//!
//! `cos`/`sin` come from a [`RopeTable`] computed once on the host, not in the kernel: the
//! table reproduces Hugging Face's values (its `inv_freq` formula in `f32`, `freqs = pos ·
//! inv_freq` in `f32`, then an accurate cosine and sine) to within the last bit of `f32`, and
//! the kernel then rounds them to the model dtype as Hugging Face does. In-kernel `sin.approx` /
//! `cos.approx` lose accuracy fast outside `[-π, π]` (`freqs` reach the position count, tens of
//! thousands of radians), so they would need a range reduction and still differ from Hugging
//! Face in bf16 roundings; a table also serves every RoPE scaling variant (linear, dynamic,
//! YaRN's attention factor) through [`RopeTable::from_inv_freq`].

use ruda_runtime::{DType, Device, LaunchConfig, Stream, Tensor};

use super::kernel::{RopeConfig, RopeKvCacheParams, RopeParams, ROPE_THREADS};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// Hugging Face's default `inv_freq`: `1 / theta^(2i / rotary_dim)` for `i < rotary_dim / 2`,
/// computed as it does in `f32` (`theta` rounded to `f32`, the exponent an `f32` division, the
/// power rounded to `f32`, then an `f32` reciprocal).
pub fn rope_inv_freq(theta: f64, rotary_dim: usize) -> Vec<f32> {
    let base = theta as f32;
    (0..rotary_dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / rotary_dim as f32;
            let power = (base as f64).powf(exponent as f64) as f32;
            1.0 / power
        })
        .collect()
}

/// `cos` and `sin` tables `[max_positions, inv_freq.len()]`, row `p` holding
/// `cos(p · inv_freq[i]) · attention_scaling` with `p · inv_freq[i]` an `f32` product (as Hugging
/// Face's `inv_freq @ position_ids` in `f32`), the cosine evaluated in `f64` and rounded to
/// `f32`, then scaled in `f32`.
pub fn rope_cos_sin(inv_freq: &[f32], attention_scaling: f32, max_positions: usize) -> (Vec<f32>, Vec<f32>) {
    let n = inv_freq.len() * max_positions;
    let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for p in 0..max_positions {
        for &f in inv_freq {
            let freq = (p as f32 * f) as f64;
            cos.push(freq.cos() as f32 * attention_scaling);
            sin.push(freq.sin() as f32 * attention_scaling);
        }
    }
    (cos, sin)
}

/// The `cos`/`sin` tables of one rotary embedding on a device (`f32 [max_positions,
/// rotary_dim / 2]` each). Build once per model; positions index its rows.
#[derive(Clone, Debug)]
pub struct RopeTable {
    cos: Tensor,
    sin: Tensor,
    rotary_dim: usize,
    max_positions: usize,
}

impl RopeTable {
    /// Hugging Face's default RoPE (`rope_type: default`) for `theta` (`rope_theta`).
    pub fn new(device: &Device, theta: f64, rotary_dim: usize, max_positions: usize) -> Result<RopeTable> {
        if !(theta.is_finite() && theta > 0.0) {
            return Err(OpError::InvalidArgument {
                op: "rope",
                message: format!("theta must be finite and positive, got {theta}"),
            });
        }
        if rotary_dim == 0 || rotary_dim % 2 == 1 {
            return Err(OpError::InvalidArgument {
                op: "rope",
                message: format!("rotary_dim must be even and positive, got {rotary_dim}"),
            });
        }
        RopeTable::from_inv_freq(device, &rope_inv_freq(theta, rotary_dim), 1.0, max_positions)
    }

    /// A table from any inverse frequencies (`rotary_dim / 2` of them: scaled variants compute
    /// their own) and the attention scaling Hugging Face multiplies `cos`/`sin` by.
    pub fn from_inv_freq(
        device: &Device,
        inv_freq: &[f32],
        attention_scaling: f32,
        max_positions: usize,
    ) -> Result<RopeTable> {
        if inv_freq.is_empty() || max_positions == 0 {
            return Err(OpError::Shape {
                op: "rope",
                message: format!("an empty table ({} frequencies, {max_positions} positions)", inv_freq.len()),
            });
        }
        to_u32("rope", "table entries", inv_freq.len() * max_positions)?;
        let (cos, sin) = rope_cos_sin(inv_freq, attention_scaling, max_positions);
        let shape = [max_positions, inv_freq.len()];
        Ok(RopeTable {
            cos: Tensor::from_slice(device, &cos, &shape)?,
            sin: Tensor::from_slice(device, &sin, &shape)?,
            rotary_dim: 2 * inv_freq.len(),
            max_positions,
        })
    }

    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// `f32 [max_positions, rotary_dim / 2]`.
    pub fn cos(&self) -> &Tensor {
        &self.cos
    }

    /// `f32 [max_positions, rotary_dim / 2]`.
    pub fn sin(&self) -> &Tensor {
        &self.sin
    }
}

/// Check a `[T, H, D]` input against the table; returns `(dtype, T, H, D)`.
fn check_heads(
    name: &'static str,
    what: &str,
    t: &Tensor,
    table: &RopeTable,
) -> Result<(ruda_ir::ScalarType, u32, u32, u32)> {
    let dtype = float_dtype(name, t)?;
    contiguous_nonempty(name, what, t)?;
    if t.rank() != 3 {
        return Err(OpError::Shape {
            op: name,
            message: format!("`{what}` must be [tokens, heads, head_dim], is {:?}", t.shape()),
        });
    }
    let d = t.shape()[2];
    if d % 2 == 1 {
        return Err(OpError::Shape { op: name, message: format!("head_dim must be even, `{what}` has {d}") });
    }
    if table.rotary_dim > d {
        return Err(OpError::Shape {
            op: name,
            message: format!("the table rotates {} dimensions but heads have {d}", table.rotary_dim),
        });
    }
    to_u32(name, &format!("elements of `{what}` per token"), t.shape()[1] * d)?;
    Ok((
        dtype,
        to_u32(name, "tokens", t.shape()[0])?,
        to_u32(name, "heads", t.shape()[1])?,
        to_u32(name, "head_dim", d)?,
    ))
}

fn check_positions(name: &'static str, what: &str, t: &Tensor, tokens: u32) -> Result<()> {
    contiguous_nonempty(name, what, t)?;
    expect_dtype(name, what, t, DType::U32)?;
    expect_shape(name, what, t, &[tokens as usize])
}

fn check_table(name: &'static str, stream: &Stream, table: &RopeTable) -> Result<()> {
    same_device(name, stream, &[("cos", &table.cos), ("sin", &table.sin)])
}

/// RoPE (rotate-half, Hugging Face's `apply_rotary_pos_emb`) of `x [T, H, D]` into `out` (same
/// shape and dtype) at absolute `positions` (`u32 [T]`). The first `table.rotary_dim()` ≤ `D`
/// dimensions of each head rotate, the rest are copied. Rounding follows Hugging Face in the
/// model dtype: `cos`/`sin` rounded to it, each product rounded, then the sum. A position
/// `≥ table.max_positions()` (which the host cannot see without a sync) makes that token's
/// rotated dimensions NaN. On CUDA `out` may be `x` itself; the CPU device rejects aliasing.
pub fn rope_into(stream: &Stream, x: &Tensor, positions: &Tensor, table: &RopeTable, out: &Tensor) -> Result<()> {
    let name = "rope";
    let (dtype, tokens, heads, d) = check_heads(name, "x", x, table)?;
    check_positions(name, "positions", positions, tokens)?;
    expect_tensor(name, "out", out, x.dtype(), x.shape())?;
    same_device(name, stream, &[("x", x), ("positions", positions), ("out", out)])?;
    check_table(name, stream, table)?;
    let cfg = RopeConfig { dtype, head_dim: d, rotary_dim: table.rotary_dim as u32 };
    let k = kernel(cfg.id(), || crate::kernels::rope::rope(&cfg))?;
    let args = RopeParams {
        x,
        cos: &table.cos,
        sin: &table.sin,
        positions,
        out,
        heads,
        n_positions: table.max_positions as u32,
    };
    params::launch(stream, &k, LaunchConfig::linear(tokens, ROPE_THREADS), &args.args())?;
    Ok(())
}

/// RoPE of `x [T, H, D]` (see [`rope_into`]).
pub fn rope(x: &Tensor, positions: &Tensor, table: &RopeTable) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    rope_into(&x.device().default_stream(), x, positions, table, &out)?;
    Ok(out)
}

/// The KV-cache append fused with RoPE: for each token `t`, `k[t]` (`[T, Hkv, D]`) rotated as
/// [`rope_into`] does is written to `k_cache[slots[t], :, positions[t], :]` and `v[t]` copied to
/// `v_cache` at the same place (caches `[B, Hkv, S, D]`, the dtype of `k`). `positions` and
/// `slots` are `u32 [T]`; the table must cover `S` positions. A token whose slot is `≥ B` or whose
/// position is `≥ S` (unknown to the host without a sync) writes nothing.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_cache_into(
    stream: &Stream,
    k: &Tensor,
    v: &Tensor,
    positions: &Tensor,
    slots: &Tensor,
    table: &RopeTable,
    k_cache: &Tensor,
    v_cache: &Tensor,
) -> Result<()> {
    let name = "rope_kv_cache";
    let (dtype, tokens, heads, d) = check_heads(name, "k", k, table)?;
    expect_tensor(name, "v", v, k.dtype(), k.shape())?;
    check_positions(name, "positions", positions, tokens)?;
    check_positions(name, "slots", slots, tokens)?;
    for (what, c) in [("k_cache", k_cache), ("v_cache", v_cache)] {
        contiguous_nonempty(name, what, c)?;
        expect_dtype(name, what, c, k.dtype())?;
        if c.rank() != 4 || c.shape()[1] != heads as usize || c.shape()[3] != d as usize {
            return Err(OpError::Shape {
                op: name,
                message: format!("`{what}` is {:?}, expected [batch, {heads}, max_seq, {d}]", c.shape()),
            });
        }
    }
    expect_shape(name, "v_cache", v_cache, k_cache.shape())?;
    let (batch, max_seq) = (k_cache.shape()[0], k_cache.shape()[2]);
    if max_seq > table.max_positions {
        return Err(OpError::Shape {
            op: name,
            message: format!("the cache holds {max_seq} positions but the table only {}", table.max_positions),
        });
    }
    same_device(
        name,
        stream,
        &[("k", k), ("v", v), ("positions", positions), ("slots", slots), ("k_cache", k_cache), ("v_cache", v_cache)],
    )?;
    check_table(name, stream, table)?;
    let cfg = RopeConfig { dtype, head_dim: d, rotary_dim: table.rotary_dim as u32 };
    let kern = kernel(cfg.kv_cache_id(), || crate::kernels::rope::rope_kv_cache(&cfg))?;
    let args = RopeKvCacheParams {
        k,
        v,
        cos: &table.cos,
        sin: &table.sin,
        positions,
        slots,
        k_cache,
        v_cache,
        heads,
        batch: to_u32(name, "batch", batch)?,
        max_seq: to_u32(name, "max_seq", max_seq)?,
    };
    params::launch(stream, &kern, LaunchConfig::linear(tokens, ROPE_THREADS), &args.args())?;
    Ok(())
}
