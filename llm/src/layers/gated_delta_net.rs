//! Qwen3.5's gated DeltaNet (transformers' `Qwen3_5GatedDeltaNet`, shared with Qwen3-Next), the
//! linear-attention token mixer of its hybrid layers:
//!
//! ```text
//! qkv = x·Wqkvᵀ  (channels [q | k | v]);  z = x·Wzᵀ;  b = x·Wbᵀ;  a = x·Waᵀ
//! qkv = silu(causal_conv1d(qkv))          (depthwise, width W, over the conv state)
//! q, k = l2_norm per head;  β = sigmoid(b);  g = −exp(A_log)·softplus(a + dt_bias)
//! o = gated_delta(q·K^−½, k, v, β, g)     (chunked for prefill, recurrent for decode)
//! out = (norm_w · rmsnorm(o) · silu(z))·Woᵀ   (per value head)
//! ```
//!
//! The depthwise conv works channel by channel, so `in_proj_qkv` and the conv weight are loaded
//! as three row blocks (q, k, v) and run as three projections and three convs: each block's
//! output is then a contiguous `[T, heads, dim]` tensor without a split or a transpose. (One
//! fused projection and conv, with a strided split, would save launches.)
//!
//! The rule runs in f32 in every compute dtype, as transformers runs it (q, k and v cast to f32
//! after the conv, the output rounded once to the dtype).
//!
//! The states live in a [`LinearStatePool`] (one slot per sequence: one for a single sequence,
//! one per active sequence in a batch), and every intermediate in a [`GatedDeltaScratch`] made
//! once: a step over a packed batch of sequences (a decode step, or a prefill chunk) runs the
//! ops' `_into` and pool forms, so it allocates nothing and reads nothing back from the device.

use ruda_ops::api::{self, GatedDeltaInput};
use ruda_runtime::{DType, Device, Stream, Tensor};

use super::plan::{launch, DecodeStep, PlannedLaunch};
use super::{ExpectedTensor, Linear, LinearPlan, LinearShape, LinearSpec, Loader, WeightDType};
use crate::cache::LinearStatePool;
use crate::config::LinearAttentionConfig;
use crate::error::LlmError;

/// transformers' `l2norm` epsilon (`x · rsqrt(Σx² + 1e-6)`).
const L2_EPS: f32 = 1e-6;
/// The chunk of the chunked gated delta rule in prefill (transformers' and fla's 64).
const CHUNK: usize = 64;

/// `{prefix}.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, A_log, dt_bias, norm,
/// out_proj}`.
#[derive(Clone, Debug)]
pub struct GatedDeltaNetSpec {
    pub shape: LinearAttentionConfig,
    /// `[2·key_dim + value_dim, hidden]`, loaded as the q, k and v row blocks.
    pub in_proj_qkv: ExpectedTensor,
    pub z: LinearSpec,
    pub b: LinearSpec,
    pub a: LinearSpec,
    /// `[conv_dim, 1, W]`, in the compute dtype.
    pub conv: ExpectedTensor,
    /// `[Hv]` each, f32.
    pub a_log: ExpectedTensor,
    pub dt_bias: ExpectedTensor,
    /// The gated norm's `[value_head_dim]` weight (not zero-centred), f32.
    pub norm: ExpectedTensor,
    pub out: LinearSpec,
    pub eps: f32,
}

impl GatedDeltaNetSpec {
    pub fn new(prefix: &str, hidden: usize, shape: LinearAttentionConfig, eps: f64) -> GatedDeltaNetSpec {
        let (c, vd, hv) = (shape.conv_dim(), shape.value_dim(), shape.num_value_heads);
        let f32_tensor = |name: &str, shape: Vec<usize>| ExpectedTensor {
            name: format!("{prefix}.{name}"),
            shape,
            dtype: WeightDType::F32,
            required: true,
        };
        GatedDeltaNetSpec {
            shape,
            in_proj_qkv: ExpectedTensor::compute(format!("{prefix}.in_proj_qkv.weight"), vec![c, hidden]),
            z: LinearSpec::new("in_proj_z", &format!("{prefix}.in_proj_z"), vd, hidden, false),
            b: LinearSpec::new("in_proj_b", &format!("{prefix}.in_proj_b"), hv, hidden, false),
            a: LinearSpec::new("in_proj_a", &format!("{prefix}.in_proj_a"), hv, hidden, false),
            conv: ExpectedTensor::compute(format!("{prefix}.conv1d.weight"), vec![c, 1, shape.conv_kernel_dim]),
            a_log: f32_tensor("A_log", vec![hv]),
            dt_bias: f32_tensor("dt_bias", vec![hv]),
            norm: f32_tensor("norm.weight", vec![shape.value_head_dim]),
            out: LinearSpec::new("out_proj", &format!("{prefix}.out_proj"), hidden, vd, false),
            eps: eps as f32,
        }
    }

    /// The row blocks `(offset, rows)` of q, k and v in `in_proj_qkv` and the conv.
    fn blocks(&self) -> [(usize, usize); 3] {
        let (kd, vd) = (self.shape.key_dim(), self.shape.value_dim());
        [(0, kd), (kd, kd), (2 * kd, vd)]
    }

    fn hidden(&self) -> usize {
        self.in_proj_qkv.shape[1]
    }

    pub fn declare(&self, out: &mut Vec<ExpectedTensor>) {
        out.extend([
            self.in_proj_qkv.clone(),
            self.z.weights[0].clone(),
            self.b.weights[0].clone(),
            self.a.weights[0].clone(),
            self.conv.clone(),
            self.a_log.clone(),
            self.dt_bias.clone(),
            self.norm.clone(),
            self.out.weights[0].clone(),
        ]);
    }

    pub fn linear_shapes(&self, tokens: usize) -> Vec<LinearShape> {
        let blocks = self.block_linears();
        blocks.iter().chain([&self.z, &self.b, &self.a, &self.out]).map(|l| l.linear_shape(tokens)).collect()
    }

    /// The q, k and v row blocks of `in_proj_qkv` as projections (their shapes and plans).
    fn block_linears(&self) -> [LinearSpec; 3] {
        let (name, h) = (&self.in_proj_qkv.name, self.hidden());
        let [q, k, v] = self.blocks().map(|(_, rows)| rows);
        let block = |label: &'static str, rows: usize| LinearSpec {
            name: label,
            weights: vec![ExpectedTensor::compute(name.clone(), vec![rows, h])],
            bias: None,
        };
        [block("in_proj_q", q), block("in_proj_k", k), block("in_proj_v", v)]
    }

    /// The launches of [`GatedDeltaNet::forward`] for one token after a prefill: per q, k and v
    /// block its GEMV and the conv's rolling update of the pooled state; the casts to f32 (unless f32), the q and k
    /// l2 norms, the `a` and `b` GEMVs and the gates, the recurrent rule over the state, the `z`
    /// GEMV, the cast back, the gated norm and `out_proj`.
    pub fn decode_launches(&self, step: &DecodeStep, out: &mut Vec<PlannedLaunch>) {
        let LinearAttentionConfig {
            conv_kernel_dim: w,
            num_key_heads: hk,
            num_value_heads: hv,
            key_head_dim: kd,
            value_head_dim: vd,
        } = self.shape;
        let (e, dt) = (step.elem(), step.dt());
        let p = self.in_proj_qkv.name.trim_end_matches(".in_proj_qkv.weight").to_string();
        let at = |what: &str| format!("{p}.{what}");
        let row_owner = |cols: usize| if cols as u32 <= api::ROW_NORM_WARP_MAX_COLS { "warp" } else { "block" };
        let blocks = self.block_linears();
        for (lin, what) in blocks.iter().zip(["q", "k", "v"]) {
            lin.decode_launches(step, out);
            let c = lin.shape().0 as u64;
            let (weights, state) = (c * w as u64 * e, c * (w as u64 - 1) * e);
            out.push(PlannedLaunch {
                weight_bytes: weights,
                ..launch(
                    at(&format!("conv1d ({what}, rolling update)")),
                    format!("causal_conv1d_update_slots.{dt}.w{w}.silu"),
                    format!("[1, {c}], state [{c}, {}] of a pool", w - 1),
                    // The input, the weight, the state and the slot (u32).
                    c * e + weights + state + 4,
                    c * e + state,
                    2 * c * w as u64,
                )
            });
        }
        let (q, v) = ((hk * kd) as u64, (hv * vd) as u64);
        if step.dtype != DType::F32 {
            for (what, n) in [("q", q), ("k", q), ("v", v)] {
                out.push(launch(
                    at(&format!("{what} to f32")),
                    format!("cast.{dt}.f32"),
                    format!("[1, {n}]"),
                    n * e,
                    4 * n,
                    n,
                ));
            }
        }
        for what in ["q", "k"] {
            let kernel = format!("l2_norm.f32.{}", row_owner(kd));
            out.push(launch(at(&format!("{what} l2 norm")), kernel, format!("[{hk}, {kd}]"), 4 * q, 4 * q, 3 * q));
        }
        self.a.decode_launches(step, out);
        self.b.decode_launches(step, out);
        let heads = hv as u64;
        out.push(PlannedLaunch {
            weight_bytes: 8 * heads,
            ..launch(
                at("gates"),
                format!("gated_delta_gates.{dt}.f32"),
                format!("a, b [1, {hv}]"),
                2 * heads * e + 8 * heads,
                8 * heads,
                10 * heads,
            )
        });
        let state = (hv * kd * vd) as u64 * 4;
        out.push(PlannedLaunch {
            kv_bytes: state,
            ..launch(
                at("gated delta rule (recurrent)"),
                format!("gated_delta_slots.f32.k{kd}.v{vd}"),
                format!("q, k [1, {hk}, {kd}], v [1, {hv}, {vd}], state [{hv}, {kd}, {vd}] f32 of a pool"),
                // q, k, v, the gates, the state and the slot (u32).
                4 * (2 * q + v) + 8 * heads + state + 4,
                4 * v + state,
                // Decay, Sᵀk, the rank-one update and Sᵀq: about 7 flops per state element.
                7 * state / 4,
            )
        });
        self.z.decode_launches(step, out);
        if step.dtype != DType::F32 {
            out.push(launch(at("output from f32"), format!("cast.f32.{dt}"), format!("[1, {v}]"), 4 * v, v * e, v));
        }
        let gamma = 4 * vd as u64;
        out.push(PlannedLaunch {
            weight_bytes: gamma,
            ..launch(
                at("norm (gated)"),
                format!("gated_rms_norm.{dt}.{}", row_owner(vd)),
                format!("[{hv}, {vd}]"),
                2 * v * e + gamma,
                v * e,
                6 * v,
            )
        });
        self.out.decode_launches(step, out);
    }

    pub fn load(&self, ld: &Loader) -> Result<GatedDeltaNet, LlmError> {
        let qkv = self.blocks().map(|(start, rows)| ld.rows(&self.in_proj_qkv, start, rows));
        let conv = self.blocks().map(|(start, rows)| ld.rows(&self.conv, start, rows));
        let [q, k, v] = qkv;
        let [cq, ck, cv] = conv;
        let dense = |w: Tensor| Linear::Dense { weight: w, bias: None };
        Ok(GatedDeltaNet {
            shape: self.shape,
            qkv: [dense(q?), dense(k?), dense(v?)],
            z: self.z.load(ld)?,
            b: self.b.load(ld)?,
            a: self.a.load(ld)?,
            conv: [cq?, ck?, cv?],
            a_log: ld.tensor(&self.a_log)?,
            dt_bias: ld.tensor(&self.dt_bias)?,
            norm: ld.tensor(&self.norm)?,
            out: self.out.load(ld)?,
            eps: self.eps,
        })
    }
}

pub struct GatedDeltaNet {
    shape: LinearAttentionConfig,
    /// The q, k and v row blocks of `in_proj_qkv`.
    qkv: [Linear; 3],
    z: Linear,
    b: Linear,
    a: Linear,
    /// The q, k and v channel blocks of the conv weight, `[channels, W]` each.
    conv: [Tensor; 3],
    a_log: Tensor,
    dt_bias: Tensor,
    norm: Tensor,
    out: Linear,
    eps: f32,
}

impl GatedDeltaNet {
    pub fn linears(&self) -> impl Iterator<Item = &Linear> + Clone {
        self.qkv.iter().chain([&self.z, &self.b, &self.a, &self.out])
    }

    /// Zeroed states of `slots` sequences: the conv states `[slots, channels, W − 1]` of the q,
    /// k and v blocks in the compute dtype, the recurrent states f32 `[slots, Hv, K, V]`.
    pub fn new_state_pool(&self, device: &Device, dtype: DType, slots: usize) -> Result<LinearStatePool, LlmError> {
        let LinearAttentionConfig {
            conv_kernel_dim: w, num_value_heads: hv, key_head_dim: kd, value_head_dim: vd, ..
        } = self.shape;
        let conv = |c: &Tensor| Tensor::zeros(device, dtype, &[slots, c.shape()[0], w - 1]);
        Ok(LinearStatePool {
            conv: [conv(&self.conv[0])?, conv(&self.conv[1])?, conv(&self.conv[2])?],
            recurrent: Tensor::zeros(device, DType::F32, &[slots, hv, kd, vd])?,
        })
    }

    /// The intermediates of [`GatedDeltaNet::forward`] over up to `tokens` rows in `dtype`.
    pub fn scratch(&self, device: &Device, dtype: DType, tokens: usize) -> Result<GatedDeltaScratch, LlmError> {
        GatedDeltaScratch::new(device, dtype, tokens, self.shape, self.qkv.each_ref().map(|l| l.shape().0))
    }

    /// `out = gated_delta_net(x)` for the rows of `x [T, hidden]`: a packed batch of the
    /// sequences of `batch`, each continuing from its slot of `pool` (zeroed first when fresh)
    /// and leaving there its state after its last row. A batch of one row per sequence, none
    /// fresh, is a decode step (the conv's rolling update and the recurrent rule); anything
    /// else runs the prefill forms (the packed conv and the chunked rule). Every intermediate
    /// is a view of `scratch`, so a step allocates nothing, and nothing is read back from the
    /// device (zeroing a fresh slot is a host-to-device copy of zeros).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        s: &Stream,
        plan: &LinearPlan,
        x: &Tensor,
        batch: &LinearBatch<'_>,
        pool: &LinearStatePool,
        scratch: &GatedDeltaScratch,
        out: &Tensor,
    ) -> Result<(), LlmError> {
        let op = |what: &'static str| move |e| LlmError::op(what, e);
        let LinearAttentionConfig {
            num_key_heads: hk, num_value_heads: hv, key_head_dim: kd, value_head_dim: vd, ..
        } = self.shape;
        let t = x.shape()[0];
        batch.check(t, pool.slots())?;
        if t > scratch.tokens {
            return Err(LlmError::InvalidArgument(format!(
                "{t} rows for a gated DeltaNet scratch of {} rows",
                scratch.tokens
            )));
        }
        let rows = |x: &Tensor| x.narrow(0, 0, t);
        for (slot, _) in batch.slots_host.iter().zip(batch.fresh).filter(|(_, &f)| f) {
            pool.zero_slot(s, *slot as usize)?;
        }
        let decode = batch.cu_seqlens_host.windows(2).all(|w| w[1] - w[0] == 1) && batch.fresh.iter().all(|f| !f);
        let project = |lin: &Linear, y: &Tensor| -> Result<Tensor, LlmError> {
            let y = rows(y)?;
            // No bias: the scratch is unused.
            lin.forward(s, plan, x, &y).map_err(op("projection"))?;
            Ok(y)
        };
        let mut mixed = Vec::with_capacity(3);
        for (i, lin) in self.qkv.iter().enumerate() {
            let y = project(lin, &scratch.proj[i])?;
            let m = rows(&scratch.mixed[i])?;
            let (weight, states) = (&self.conv[i], &pool.conv[i]);
            if decode {
                api::causal_conv1d_update_slots_into(s, &y, weight, states, batch.slots, true, &m)
            } else {
                api::causal_conv1d_varlen_into(s, &y, weight, batch.cu_seqlens, states, batch.slots, true, &m)
            }
            .map_err(op("causal conv1d"))?;
            mixed.push(m);
        }
        // transformers runs the rule in f32 whatever the model's dtype (q and k normalised in f32,
        // the output rounded once to the dtype); so does this layer.
        let f32s = match &scratch.f32s {
            Some(f32s) => {
                let mut out = Vec::with_capacity(3);
                for (m, f) in mixed.iter().zip(f32s) {
                    let f = rows(f)?;
                    api::cast_into(s, m, &f).map_err(op("gated delta in f32"))?;
                    out.push(f);
                }
                out
            }
            None => mixed,
        };
        let (q, k) = (rows(&scratch.q)?.reshape(&[t * hk, kd])?, rows(&scratch.k)?.reshape(&[t * hk, kd])?);
        api::l2_norm_into(s, &f32s[0].reshape(&[t * hk, kd])?, L2_EPS, &q).map_err(op("q l2 norm"))?;
        api::l2_norm_into(s, &f32s[1].reshape(&[t * hk, kd])?, L2_EPS, &k).map_err(op("k l2 norm"))?;
        let (a, b) = (project(&self.a, &scratch.a)?, project(&self.b, &scratch.b)?);
        let (beta, g) = (rows(&scratch.beta)?, rows(&scratch.g)?);
        api::gated_delta_gates_into(s, &a, &b, &self.a_log, &self.dt_bias, &beta, &g)
            .map_err(op("gated delta gates"))?;
        let (q, k, v) = (q.reshape(&[t, hk, kd])?, k.reshape(&[t, hk, kd])?, f32s[2].reshape(&[t, hv, vd])?);
        let input = GatedDeltaInput {
            query: &q,
            key: &k,
            value: &v,
            beta: &beta,
            log_decay: &g,
            initial_state: None,
            query_scale: 1.0 / (kd as f32).sqrt(),
        };
        let rule = rows(&scratch.rule)?;
        if decode {
            api::gated_delta_rule_slots_into(s, input, &pool.recurrent, batch.slots, &rule)
        } else {
            api::chunk_gated_delta_rule_varlen_slots_into(
                s,
                input,
                batch.cu_seqlens,
                batch.cu_seqlens_host,
                CHUNK,
                &pool.recurrent,
                batch.slots,
                &rule,
            )
        }
        .map_err(op("gated delta rule"))?;
        let z = project(&self.z, &scratch.z)?;
        let output = match &scratch.rule_out {
            Some(o) => {
                let o = rows(o)?.reshape(&[t, hv, vd])?;
                api::cast_into(s, &rule, &o).map_err(op("gated delta in f32"))?;
                o
            }
            None => rule,
        };
        let normed = rows(&scratch.normed)?.reshape(&[t * hv, vd])?;
        api::gated_rms_norm_into(
            s,
            &output.reshape(&[t * hv, vd])?,
            &z.reshape(&[t * hv, vd])?,
            &self.norm,
            self.eps,
            &normed,
        )
        .map_err(op("gated rms norm"))?;
        // No bias: the scratch is unused.
        self.out.forward(s, plan, &normed.reshape(&[t, hv * vd])?, out).map_err(op("projection"))
    }
}

/// The sequences of one [`GatedDeltaNet::forward`]: `N` sequences packed in the rows of `x`.
pub struct LinearBatch<'a> {
    /// `u32 [N + 1]` on the device: sequence `n` owns rows `cu_seqlens[n]..cu_seqlens[n + 1]`
    /// (read by the prefill kernels; a decode step does not use it).
    pub cu_seqlens: &'a Tensor,
    /// The same offsets on the host (checked here; never read back from the device).
    pub cu_seqlens_host: &'a [u32],
    /// `u32 [N]` on the device: each sequence's slot of the pool, distinct.
    pub slots: &'a Tensor,
    /// The same slots on the host (to zero the fresh ones).
    pub slots_host: &'a [u32],
    /// Per sequence: it starts at position 0, so its slot is zeroed before the step.
    pub fresh: &'a [bool],
}

impl LinearBatch<'_> {
    /// Whether the host copies agree with each other, `t` rows and a pool of `slots`, with
    /// distinct slots.
    fn check(&self, t: usize, slots: usize) -> Result<(), LlmError> {
        let n = self.slots_host.len();
        let bad = |m: String| Err(LlmError::InvalidArgument(format!("gated DeltaNet batch: {m}")));
        if n == 0 || self.fresh.len() != n || self.cu_seqlens_host.len() != n + 1 {
            return bad(format!(
                "{n} slots, {} fresh flags and {} cu_seqlens entries: expected N ≥ 1, N and N + 1",
                self.fresh.len(),
                self.cu_seqlens_host.len()
            ));
        }
        if self.cu_seqlens_host.last().copied() != Some(t as u32) {
            return bad(format!("cu_seqlens {:?} does not end at the {t} rows", self.cu_seqlens_host));
        }
        if let Some(w) = self.cu_seqlens_host.windows(2).find(|w| w[1] < w[0]) {
            return bad(format!("cu_seqlens {:?} decreases ({} then {})", self.cu_seqlens_host, w[0], w[1]));
        }
        for (i, &s) in self.slots_host.iter().enumerate() {
            if s as usize >= slots {
                return bad(format!("slot {s} is outside the pool of {slots}"));
            }
            if self.slots_host[..i].contains(&s) {
                return bad(format!("slot {s} is given to two sequences (their updates would race)"));
            }
        }
        Ok(())
    }
}

/// The intermediates of [`GatedDeltaNet::forward`], `tokens` rows each, made once and reused.
pub struct GatedDeltaScratch {
    tokens: usize,
    /// The q, k and v projections `[T, channels]`, then after the conv.
    proj: [Tensor; 3],
    mixed: [Tensor; 3],
    /// Their f32 copies (`None` in f32).
    f32s: Option<[Tensor; 3]>,
    /// l2-normalised q and k, f32 `[T, Hk · K]`.
    q: Tensor,
    k: Tensor,
    /// The gate projections `[T, Hv]`, and the gates (f32).
    a: Tensor,
    b: Tensor,
    beta: Tensor,
    g: Tensor,
    /// The rule's output, f32 `[T, Hv, V]`, and rounded to the dtype (`None` in f32).
    rule: Tensor,
    rule_out: Option<Tensor>,
    /// `z` and the gated norm `[T, Hv · V]`.
    z: Tensor,
    normed: Tensor,
}

impl GatedDeltaScratch {
    fn new(
        device: &Device,
        dtype: DType,
        tokens: usize,
        shape: LinearAttentionConfig,
        channels: [usize; 3],
    ) -> Result<GatedDeltaScratch, LlmError> {
        let t = |dtype: DType, cols: usize| Tensor::empty(device, dtype, &[tokens, cols]);
        let three = |dtype: DType| -> Result<[Tensor; 3], LlmError> {
            Ok([t(dtype, channels[0])?, t(dtype, channels[1])?, t(dtype, channels[2])?])
        };
        let (qk, hv, v) = (shape.key_dim(), shape.num_value_heads, shape.value_dim());
        let rounded = dtype != DType::F32;
        Ok(GatedDeltaScratch {
            tokens,
            proj: three(dtype)?,
            mixed: three(dtype)?,
            f32s: if rounded { Some(three(DType::F32)?) } else { None },
            q: t(DType::F32, qk)?,
            k: t(DType::F32, qk)?,
            a: t(dtype, hv)?,
            b: t(dtype, hv)?,
            beta: t(DType::F32, hv)?,
            g: t(DType::F32, hv)?,
            rule: Tensor::empty(device, DType::F32, &[tokens, hv, shape.value_head_dim])?,
            rule_out: if rounded {
                Some(Tensor::empty(device, dtype, &[tokens, hv, shape.value_head_dim])?)
            } else {
                None
            },
            z: t(dtype, v)?,
            normed: t(dtype, v)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small layer with deterministic weights in f32 (hidden 16, Hk 1, Hv 2, K = V = 8, W 4).
    fn layer(device: &Device) -> GatedDeltaNet {
        let shape = LinearAttentionConfig {
            conv_kernel_dim: 4,
            num_key_heads: 1,
            num_value_heads: 2,
            key_head_dim: 8,
            value_head_dim: 8,
        };
        let mut seed = 1u32;
        let mut t = |dims: &[usize], scale: f32| {
            let n: usize = dims.iter().product();
            let xs: Vec<f32> = (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    ((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * scale
                })
                .collect();
            Tensor::from_slice(device, &xs, dims).expect("weight")
        };
        let dense = |w: Tensor| Linear::Dense { weight: w, bias: None };
        GatedDeltaNet {
            shape,
            qkv: [dense(t(&[8, 16], 0.5)), dense(t(&[8, 16], 0.5)), dense(t(&[16, 16], 0.5))],
            z: dense(t(&[16, 16], 0.5)),
            b: dense(t(&[2, 16], 0.5)),
            a: dense(t(&[2, 16], 0.5)),
            conv: [t(&[8, 4], 1.0), t(&[8, 4], 1.0), t(&[16, 4], 1.0)],
            a_log: t(&[2], 1.0),
            dt_bias: t(&[2], 1.0),
            norm: t(&[8], 2.0),
            out: dense(t(&[16, 16], 0.5)),
            eps: 1e-6,
        }
    }

    /// `layer.forward` over `x` (rows of the sequences `lengths`, on `slots` of `pool`).
    fn run(
        layer: &GatedDeltaNet,
        x: &[f32],
        lengths: &[usize],
        slots: &[u32],
        fresh: bool,
        pool: &LinearStatePool,
    ) -> Vec<f32> {
        let device = pool.recurrent.device();
        let t: usize = lengths.iter().sum();
        let mut cu = vec![0u32];
        lengths.iter().for_each(|&n| cu.push(cu[cu.len() - 1] + n as u32));
        let shapes: Vec<LinearShape> =
            layer.linears().map(|l| LinearShape { name: "test", m: t, n: l.shape().0, k: l.shape().1 }).collect();
        let plan = LinearPlan::new(device, DType::F32, t, &shapes, layer.linears()).expect("plan");
        let scratch = layer.scratch(device, DType::F32, t).expect("scratch");
        let xt = Tensor::from_slice(device, x, &[t, 16]).expect("x");
        let out = Tensor::zeros(device, DType::F32, &[t, 16]).expect("out");
        let cut = Tensor::from_slice(device, &cu, &[cu.len()]).expect("cu_seqlens");
        let st = Tensor::from_slice(device, slots, &[slots.len()]).expect("slots");
        let fresh = vec![fresh; slots.len()];
        let batch =
            LinearBatch { cu_seqlens: &cut, cu_seqlens_host: &cu, slots: &st, slots_host: slots, fresh: &fresh };
        let stream = device.default_stream();
        layer.forward(&stream, &plan, &xt, &batch, pool, &scratch, &out).expect("forward");
        out.to_vec::<f32>().expect("read")
    }

    fn close(what: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-5 + 1e-5 * w.abs(), "{what}: element {i} is {g}, alone {w}");
        }
    }

    /// Two sequences packed in one batch, on slots 2 and 0 of a pool of 3, equal each alone in a
    /// pool of one: a prefill of 5 and 3 rows (fresh slots, whatever they held before), then a
    /// decode step of one row each. Slot 1 is left alone.
    #[test]
    fn a_packed_batch_of_two_sequences_equals_each_alone() {
        let device = Device::cpu();
        let layer = layer(&device);
        let rows = |n: usize, k: f32| -> Vec<f32> { (0..n * 16).map(|i| (i as f32 * 0.37 + k).sin()).collect() };
        let (a, b) = (rows(5, 0.0), rows(3, 1.0));
        let (a1, b1) = (rows(1, 2.0), rows(1, 3.0));
        let pool = layer.new_state_pool(&device, DType::F32, 3).expect("pool");
        // Garbage in every slot: a fresh sequence's slot must be zeroed by the layer.
        let junk = vec![0.75f32; pool.recurrent.numel()];
        pool.recurrent.copy_from_slice(&junk).expect("junk");
        let prefill = run(&layer, &[a.clone(), b.clone()].concat(), &[5, 3], &[2, 0], true, &pool);
        let decode = run(&layer, &[a1.clone(), b1.clone()].concat(), &[1, 1], &[2, 0], false, &pool);
        for (what, first, next, row) in [("a", &a, &a1, 0), ("b", &b, &b1, 5)] {
            let alone = layer.new_state_pool(&device, DType::F32, 1).expect("pool");
            let n = first.len() / 16;
            let p = run(&layer, first, &[n], &[0], true, &alone);
            close(&format!("{what}: prefill"), &prefill[row * 16..(row + n) * 16], &p);
            let d = run(&layer, next, &[1], &[0], false, &alone);
            let at = if row == 0 { 0 } else { 1 };
            close(&format!("{what}: decode"), &decode[at * 16..(at + 1) * 16], &d);
        }
        let recurrent = pool.recurrent.to_vec::<f32>().expect("pool");
        let per_slot = recurrent.len() / 3;
        assert!(recurrent[per_slot..2 * per_slot].iter().all(|&x| x == 0.75), "slot 1 was written");
    }

    #[test]
    fn inconsistent_batches_are_errors() {
        let device = Device::cpu();
        let (cu, slots) =
            (Tensor::zeros(&device, DType::U32, &[3]).unwrap(), Tensor::zeros(&device, DType::U32, &[2]).unwrap());
        let batch = |cu_host: &'static [u32], slots_host: &'static [u32], fresh: &'static [bool]| LinearBatch {
            cu_seqlens: &cu,
            cu_seqlens_host: cu_host,
            slots: &slots,
            slots_host,
            fresh,
        };
        for (b, needle) in [
            (batch(&[0, 1, 2], &[0, 0], &[false, false]), "given to two sequences"),
            (batch(&[0, 1, 2], &[0, 3], &[false, false]), "outside the pool of 3"),
            (batch(&[0, 1, 3], &[0, 1], &[false, false]), "does not end at the 2 rows"),
            (batch(&[0, 3, 2], &[0, 1], &[false, false]), "decreases"),
            (batch(&[0, 2], &[0, 1], &[false, false]), "expected N"),
        ] {
            let message = b.check(2, 3).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(message.contains(needle), "`{message}` does not mention `{needle}`");
        }
        batch(&[0, 1, 2], &[2, 0], &[true, false]).check(2, 3).expect("a valid batch");
    }
}
