//! Rotary position embedding (rotate-half form) and its fusion with the KV-cache append.
//!
//! `cos`/`sin` come from a [`RopeTable`] computed once on the host, not in the kernel: the
//! table reproduces Hugging Face's values (its `inv_freq` formula in `f32`, `freqs = pos ·
//! inv_freq` in `f32`, then an accurate cosine and sine) to within the last bit of `f32`, and
//! the kernel then rounds them to the model dtype as Hugging Face does. In-kernel `sin.approx` /
//! `cos.approx` lose accuracy fast outside `[-π, π]` (`freqs` reach the position count, tens of
//! thousands of radians), so they would need a range reduction and still differ from Hugging
//! Face in bf16 roundings. A table also serves the scaled variants: [`RopeScaling`] (linear and
//! YaRN, with YaRN's attention factor) through [`RopeTable::scaled`], any other through
//! [`RopeTable::from_inv_freq`].

use ruda_runtime::{DType, Device, LaunchConfig, Stream, Tensor};

use super::kernel::{RopeConfig, RopeKvCacheParams, RopeParams, ROPE_THREADS};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// `theta^(2i / rotary_dim)` for `i < rotary_dim / 2`, computed as Hugging Face does in `f32`
/// (`theta` rounded to `f32`, the exponent an `f32` division, the power rounded to `f32`).
fn rope_powers(theta: f64, rotary_dim: usize) -> Vec<f32> {
    let base = theta as f32;
    (0..rotary_dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / rotary_dim as f32;
            (base as f64).powf(exponent as f64) as f32
        })
        .collect()
}

/// Hugging Face's default `inv_freq`: `1 / theta^(2i / rotary_dim)` for `i < rotary_dim / 2`,
/// computed as it does in `f32` (the powers of `rope_powers`, then an `f32` reciprocal).
pub fn rope_inv_freq(theta: f64, rotary_dim: usize) -> Vec<f32> {
    rope_powers(theta, rotary_dim).into_iter().map(|p| 1.0 / p).collect()
}

/// How a checkpoint scales its rotary frequencies (`rope_scaling` or `rope_parameters` in its
/// `config.json`), with every default already resolved: the variants of Hugging Face's
/// `ROPE_INIT_FUNCTIONS` that keep one table for every position.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `rope_type: default`: `inv_freq` as [`rope_inv_freq`].
    None,
    /// `rope_type: linear` (position interpolation): every frequency divided by `factor`.
    Linear { factor: f64 },
    /// `rope_type: yarn`: see [`YarnScaling`].
    Yarn(YarnScaling),
}

/// YaRN (arXiv 2309.00071) as Hugging Face's `_compute_yarn_parameters` computes it: the
/// frequencies that turn fewer than `beta_slow` times over `original_max_position_embeddings`
/// positions are divided by `factor`, those that turn more than `beta_fast` times are kept, a
/// linear ramp over the dimensions between blends the two, and `cos`/`sin` are multiplied by
/// `attention_factor`.
#[derive(Clone, Debug, PartialEq)]
pub struct YarnScaling {
    pub factor: f64,
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// Already resolved: given, or `mscale(factor, mscale) / mscale(factor, mscale_all_dim)`,
    /// or `mscale(factor)` with `mscale(s, m) = 0.1 · m · ln(s) + 1` (1 for `s ≤ 1`).
    pub attention_factor: f64,
    /// Round the ramp's ends outwards to whole dimensions (Hugging Face's default, true).
    pub truncate: bool,
}

impl YarnScaling {
    /// The paper's `mscale` (its equation 21): `0.1 · mscale · ln(scale) + 1`, 1 for `scale ≤ 1`.
    pub fn mscale(scale: f64, mscale: f64) -> f64 {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * mscale * scale.ln() + 1.0
        }
    }

    /// The inverse frequencies, in Hugging Face's `f32` order of operations.
    fn inv_freq(&self, theta: f64, rotary_dim: usize) -> Vec<f32> {
        let dim = rotary_dim as f64;
        // The dimension at which a frequency turns `rotations` times over the original context.
        let correction_dim = |rotations: f64| {
            dim * (self.original_max_position_embeddings / (rotations * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (correction_dim(self.beta_fast), correction_dim(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
        if low == high {
            high += 0.001; // Hugging Face's guard against a zero-width ramp.
        }
        let (low32, width32) = (low as f32, (high - low) as f32);
        let factor = self.factor as f32;
        rope_powers(theta, rotary_dim)
            .into_iter()
            .enumerate()
            .map(|(i, power)| {
                let extrapolation = 1.0 / power;
                let interpolation = 1.0 / (factor * power);
                let ramp = ((i as f32 - low32) / width32).clamp(0.0, 1.0);
                let keep = 1.0 - ramp;
                interpolation * (1.0 - keep) + extrapolation * keep
            })
            .collect()
    }
}

impl RopeScaling {
    /// The inverse frequencies for `theta` over `rotary_dim` dimensions, and the factor
    /// `cos`/`sin` are multiplied by.
    pub fn inv_freq(&self, theta: f64, rotary_dim: usize) -> (Vec<f32>, f32) {
        match self {
            RopeScaling::None => (rope_inv_freq(theta, rotary_dim), 1.0),
            RopeScaling::Linear { factor } => {
                let factor = *factor as f32;
                (rope_inv_freq(theta, rotary_dim).into_iter().map(|f| f / factor).collect(), 1.0)
            }
            RopeScaling::Yarn(y) => (y.inv_freq(theta, rotary_dim), y.attention_factor as f32),
        }
    }

    /// Every parameter finite and positive (`beta_fast` at least `beta_slow`).
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(OpError::InvalidArgument { op: "rope", message });
        let positive = |x: f64| x.is_finite() && x > 0.0;
        match self {
            RopeScaling::None => Ok(()),
            RopeScaling::Linear { factor } if !positive(*factor) => {
                bad(format!("the linear scaling factor must be finite and positive, got {factor}"))
            }
            RopeScaling::Linear { .. } => Ok(()),
            RopeScaling::Yarn(y) => {
                for (name, v) in [
                    ("factor", y.factor),
                    ("original_max_position_embeddings", y.original_max_position_embeddings),
                    ("beta_fast", y.beta_fast),
                    ("beta_slow", y.beta_slow),
                    ("attention_factor", y.attention_factor),
                ] {
                    if !positive(v) {
                        return bad(format!("YaRN's {name} must be finite and positive, got {v}"));
                    }
                }
                if y.beta_fast < y.beta_slow {
                    return bad(format!("YaRN's beta_fast {} is below its beta_slow {}", y.beta_fast, y.beta_slow));
                }
                Ok(())
            }
        }
    }
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
        RopeTable::scaled(device, theta, rotary_dim, max_positions, &RopeScaling::None)
    }

    /// The RoPE of `theta` with its frequencies scaled as `scaling` says.
    pub fn scaled(
        device: &Device,
        theta: f64,
        rotary_dim: usize,
        max_positions: usize,
        scaling: &RopeScaling,
    ) -> Result<RopeTable> {
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
        scaling.validate()?;
        let (inv_freq, attention_scaling) = scaling.inv_freq(theta, rotary_dim);
        RopeTable::from_inv_freq(device, &inv_freq, attention_scaling, max_positions)
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
