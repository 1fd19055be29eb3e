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
//! Every intermediate is allocated per call (the ops' allocating forms; the gated delta rule has
//! no `_into` form yet): a decode step of this layer allocates, unlike attention's. Prefill runs
//! the packed rule, which reads its `cu_seqlens` back (a synchronisation per layer and chunk);
//! decode runs the dense one, which does not.

use ruda_ops::api::{self, GatedDeltaInput};
use ruda_runtime::{DType, Device, Stream, Tensor};

use super::plan::{launch, DecodeStep, PlannedLaunch};
use super::{ExpectedTensor, Linear, LinearPlan, LinearShape, LinearSpec, Loader, WeightDType};
use crate::cache::LinearState;
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
    /// block its GEMV and the conv's rolling update; the casts to f32 (unless f32), the q and k
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
                    format!("causal_conv1d_update.{dt}.w{w}.silu"),
                    format!("[1, {c}], state [{c}, {}]", w - 1),
                    c * e + weights + state,
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
                format!("gated_delta.f32.k{kd}.v{vd}"),
                format!("q, k [1, {hk}, {kd}], v [1, {hv}, {vd}], state [{hv}, {kd}, {vd}] f32"),
                4 * (2 * q + v) + 8 * heads + state,
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

    /// An empty state (zeros) of one sequence: the conv states `[channels, W − 1]` of the q, k
    /// and v blocks in the compute dtype, the recurrent state f32 `[1, Hv, K, V]`.
    pub fn new_state(&self, device: &Device, dtype: DType) -> Result<LinearState, LlmError> {
        let LinearAttentionConfig {
            conv_kernel_dim: w, num_value_heads: hv, key_head_dim: kd, value_head_dim: vd, ..
        } = self.shape;
        let conv = |c: &Tensor| Tensor::zeros(device, dtype, &[c.shape()[0], w - 1]);
        Ok(LinearState {
            conv: [conv(&self.conv[0])?, conv(&self.conv[1])?, conv(&self.conv[2])?],
            recurrent: Tensor::zeros(device, DType::F32, &[1, hv, kd, vd])?,
        })
    }

    /// `out = gated_delta_net(x)` for the `T` rows of `x [T, hidden]`, continuing `state` (or
    /// starting from zeros when `fresh`: the sequence's first positions) and leaving in it the
    /// state after the last row. One row after a prefill is a decode step (the conv's rolling
    /// update and the recurrent rule); anything else runs the prefill forms (the chunked rule).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        s: &Stream,
        plan: &LinearPlan,
        x: &Tensor,
        cu_seqlens: &Tensor,
        state: &mut LinearState,
        fresh: bool,
        out: &Tensor,
    ) -> Result<(), LlmError> {
        let op = |what: &'static str| move |e| LlmError::op(what, e);
        let LinearAttentionConfig {
            num_key_heads: hk, num_value_heads: hv, key_head_dim: kd, value_head_dim: vd, ..
        } = self.shape;
        let t = x.shape()[0];
        let (device, dtype) = (x.device(), x.dtype());
        let project = |lin: &Linear| -> Result<Tensor, LlmError> {
            let y = Tensor::empty(device, dtype, &[t, lin.shape().0])?;
            // No bias: the scratch is unused.
            lin.forward(s, plan, x, &y, &y).map_err(op("projection"))?;
            Ok(y)
        };
        let decode = t == 1 && !fresh;
        let mut mixed = Vec::with_capacity(3);
        for ((lin, weight), conv_state) in self.qkv.iter().zip(&self.conv).zip(state.conv.iter_mut()) {
            let y = project(lin)?;
            if decode {
                mixed.push(api::causal_conv1d_update(&y, weight, conv_state, true).map_err(op("causal conv1d"))?);
            } else {
                let initial = (!fresh).then_some(&*conv_state);
                let (y, last) = api::causal_conv1d(&y, weight, initial, true).map_err(op("causal conv1d"))?;
                *conv_state = last;
                mixed.push(y);
            }
        }
        // transformers runs the rule in f32 whatever the model's dtype (q and k normalised in f32,
        // the output rounded once to the dtype); so does this layer.
        let cast = |x: &Tensor, to: DType| -> Result<Tensor, LlmError> {
            match x.dtype() == to {
                true => Ok(x.clone()),
                false => api::cast(x, to).map_err(op("gated delta in f32")),
            }
        };
        let (q, k, v) = (cast(&mixed[0], DType::F32)?, cast(&mixed[1], DType::F32)?, cast(&mixed[2], DType::F32)?);
        let q = api::l2_norm(&q.reshape(&[t * hk, kd])?, L2_EPS).map_err(op("q l2 norm"))?;
        let k = api::l2_norm(&k.reshape(&[t * hk, kd])?, L2_EPS).map_err(op("k l2 norm"))?;
        let (a, b) = (project(&self.a)?, project(&self.b)?);
        let (beta, g) = api::gated_delta_gates(&a, &b, &self.a_log, &self.dt_bias).map_err(op("gated delta gates"))?;
        let query_scale = 1.0 / (kd as f32).sqrt();
        let initial_state = (!fresh).then_some(&state.recurrent);
        let rule = if decode {
            // One token is the dense layout `[1, H, 1, ·]` as it is: the recurrent rule without
            // the packed form's read-back of `cu_seqlens`.
            let (q, k, v) = (q.reshape(&[1, hk, 1, kd])?, k.reshape(&[1, hk, 1, kd])?, v.reshape(&[1, hv, 1, vd])?);
            let (beta, g) = (beta.reshape(&[1, hv, 1])?, g.reshape(&[1, hv, 1])?);
            let input = GatedDeltaInput {
                query: &q,
                key: &k,
                value: &v,
                beta: &beta,
                log_decay: &g,
                initial_state,
                query_scale,
            };
            api::gated_delta_rule(input)
        } else {
            // Prefill: the chunk as one packed sequence `[T, H, ·]` (no transpose to `[1, H, T, ·]`).
            let (q, k, v) = (q.reshape(&[t, hk, kd])?, k.reshape(&[t, hk, kd])?, v.reshape(&[t, hv, vd])?);
            let input = GatedDeltaInput {
                query: &q,
                key: &k,
                value: &v,
                beta: &beta,
                log_decay: &g,
                initial_state,
                query_scale,
            };
            api::chunk_gated_delta_rule_varlen(input, cu_seqlens, CHUNK)
        };
        let rule = rule.map_err(op("gated delta rule"))?;
        state.recurrent = rule.final_state;
        let z = project(&self.z)?;
        let output = cast(&rule.output, dtype)?;
        let normed =
            api::gated_rms_norm(&output.reshape(&[t * hv, vd])?, &z.reshape(&[t * hv, vd])?, &self.norm, self.eps)
                .map_err(op("gated rms norm"))?;
        // No bias: the scratch is unused.
        self.out.forward(s, plan, &normed.reshape(&[t, hv * vd])?, out, out).map_err(op("projection"))
    }
}
