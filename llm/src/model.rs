//! The dense Qwen decoder (Qwen2, Qwen2.5, Qwen3) built only from `ruda_ops` entry points, with
//! a KV cache, chunked prefill and single-token decode. The math is that of transformers'
//! `Qwen2DecoderLayer` / `Qwen3DecoderLayer`:
//!
//! ```text
//! h = embed(ids)
//! per layer:  n = rms_norm(h);  q, k, v = n·Wqᵀ(+b), n·Wkᵀ(+b), n·Wvᵀ(+b)
//!             (qwen3: q, k = rms_norm per head)
//!             q, k = rope(q, k);  append k, v to the cache
//!             h = h + attention(q, cache)·Woᵀ
//!             h = h + down(silu(n'·Wgateᵀ) · n'·Wupᵀ)  with n' = rms_norm(h)
//! logits = rms_norm(h)·Wlmᵀ
//! ```
//!
//! Every RMSNorm rounds in transformers' order (`rms_norm_hf`, or `rms_norm_residual` fused with
//! the residual add before it), gate and up are one projection (`gate_up`, concatenated at load)
//! followed by `swiglu`, and RoPE of `k` is fused with the cache append (`rope_kv_cache`). Norm weights are kept in `f32` (exact for
//! every checkpoint dtype), the rest in the compute dtype.

use std::collections::HashMap;

use ruda_ops::api::{self, DecodeWorkspace, GemmTile, OpError, RopeTable};
use ruda_ops::tune;
use ruda_runtime::{DType, Device, Stream, Tensor};

use crate::config::ModelConfig;
use crate::error::LlmError;
use crate::weights::{Weights, EMBED_TOKENS, LM_HEAD};

/// A linear layer: `weight [out, in]` and maybe `bias [out]`, in the compute dtype.
struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

struct Layer {
    input_norm: Tensor,
    post_attention_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// Qwen3's per-head norms of q and k (`f32 [head_dim]`).
    qk_norm: Option<(Tensor, Tensor)>,
    /// `gate_proj` and `up_proj` stacked: `[2 · intermediate, hidden]`.
    gate_up: Tensor,
    down: Tensor,
}

/// A loaded Qwen decoder on one device.
pub struct QwenModel {
    config: ModelConfig,
    device: Device,
    dtype: DType,
    embed: Tensor,
    lm_head: Tensor,
    layers: Vec<Layer>,
    final_norm: Tensor,
    rope: RopeTable,
    eps: f32,
    parameters: usize,
}

/// The keys and values of one sequence, per layer `[1, kv_heads, capacity, head_dim]`, and how
/// many positions are filled.
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    capacity: usize,
    len: usize,
    /// Split-KV decode's scratch, with the split count tuned for this capacity.
    decode: DecodeWorkspace,
}

impl KvCache {
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
}

/// Per-forward activations for `tokens` rows, allocated once per chunk size and reused (decode
/// runs every step with the same buffers).
struct Activations {
    tokens: usize,
    ids: Tensor,
    positions: Tensor,
    slots: Tensor,
    seq_lens: Tensor,
    cu_seqlens: Tensor,
    residual: [Tensor; 2],
    normed: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// Scratch: a projection before its bias is added, or (q, k) Qwen3's per-head norms of them.
    q_scratch: Tensor,
    k_scratch: Tensor,
    v_scratch: Tensor,
    q_rot: Tensor,
    attn: Tensor,
    hidden_out: Tensor,
    hidden_scratch: Tensor,
    gate_up: Tensor,
    act: Tensor,
    /// The last row's logits `[1, vocab]`.
    logits: Tensor,
    /// Decode (one row): the split-K count of each weight shape's GEMV, and their workspace.
    gemv: Option<GemvPlan>,
    /// Prefill in f16/bf16 (over 16 rows): the tensor-core tile of each weight shape `(N, K)`,
    /// autotuned on a GPU.
    gemm_tiles: HashMap<(usize, usize), GemmTile>,
}

/// Split-K GEMVs for one-row projections: the autotuned split count per weight shape `(N, K)`
/// (the heuristic's on the CPU or with `RUDA_AUTOTUNE=off`) and one workspace for the largest.
struct GemvPlan {
    splits: HashMap<(usize, usize), usize>,
    workspace: Tensor,
}

/// The tuned tensor-core tile of each weight shape for `tokens`-row products (none where the
/// tensor cores do not apply: f32, `K % 8 != 0`).
fn gemm_tiles(
    model: &QwenModel,
    stream: &Stream,
    tokens: usize,
) -> Result<HashMap<(usize, usize), GemmTile>, LlmError> {
    let mut tiles = HashMap::new();
    if tokens <= api::GEMV_MAX_M || !matches!(model.dtype, DType::F16 | DType::BF16) {
        return Ok(tiles);
    }
    // The last-row logits are a GEMV: `lm_head` has no prefill GEMM.
    for (_, _, n, k) in model.linear_shapes(tokens).into_iter().filter(|s| s.0 != "lm_head") {
        if tiles.contains_key(&(n, k)) || !k.is_multiple_of(8) {
            continue;
        }
        let x = Tensor::zeros(&model.device, model.dtype, &[tokens, k])?;
        let w =
            model.weight_of_shape(n, k).ok_or_else(|| LlmError::InvalidArgument(format!("no [{n}, {k}] weight")))?;
        let tile = tune::tuned_gemm_tile(stream, &x, w).map_err(|e| LlmError::op("tuning the prefill GEMM", e))?;
        tiles.insert((n, k), tile);
    }
    Ok(tiles)
}

impl GemvPlan {
    fn new(model: &QwenModel, stream: &Stream) -> Result<GemvPlan, LlmError> {
        let mut splits = HashMap::new();
        let mut longest = 1;
        for (_, _, n, k) in model.linear_shapes(1) {
            if splits.contains_key(&(n, k)) {
                continue;
            }
            let x = Tensor::zeros(&model.device, model.dtype, &[1, k])?;
            let w = model
                .weight_of_shape(n, k)
                .ok_or_else(|| LlmError::InvalidArgument(format!("no [{n}, {k}] weight")))?;
            let s = tune::tuned_gemv_splits(stream, &x, w).map_err(|e| LlmError::op("tuning the decode GEMV", e))?;
            if s > 1 {
                longest = longest.max(s * n);
            }
            splits.insert((n, k), s);
        }
        Ok(GemvPlan { splits, workspace: Tensor::empty(&model.device, DType::F32, &[longest])? })
    }
}

impl Activations {
    fn new(model: &QwenModel, tokens: usize) -> Result<Activations, LlmError> {
        let c = &model.config;
        let (dev, dt) = (&model.device, model.dtype);
        let (q_dim, kv_dim) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
        let empty = |shape: &[usize]| Tensor::empty(dev, dt, shape);
        let u32s = |n: usize| Tensor::zeros(dev, DType::U32, &[n]);
        Ok(Activations {
            tokens,
            ids: u32s(tokens)?,
            positions: u32s(tokens)?,
            slots: u32s(tokens)?,
            seq_lens: u32s(1)?,
            cu_seqlens: u32s(2)?,
            residual: [empty(&[tokens, c.hidden_size])?, empty(&[tokens, c.hidden_size])?],
            normed: empty(&[tokens, c.hidden_size])?,
            q: empty(&[tokens, q_dim])?,
            k: empty(&[tokens, kv_dim])?,
            v: empty(&[tokens, kv_dim])?,
            q_scratch: empty(&[tokens, q_dim])?,
            k_scratch: empty(&[tokens, kv_dim])?,
            v_scratch: empty(&[tokens, kv_dim])?,
            q_rot: empty(&[tokens, c.num_attention_heads, c.head_dim])?,
            attn: empty(&[tokens, q_dim])?,
            hidden_out: empty(&[tokens, c.hidden_size])?,
            hidden_scratch: empty(&[tokens, c.hidden_size])?,
            gate_up: empty(&[tokens, 2 * c.intermediate_size])?,
            act: empty(&[tokens, c.intermediate_size])?,
            logits: empty(&[1, c.vocab_size])?,
            gemv: if tokens == 1 { Some(GemvPlan::new(model, &model.device.default_stream())?) } else { None },
            gemm_tiles: gemm_tiles(model, &model.device.default_stream(), tokens)?,
        })
    }
}

/// Reads tensors out of validated weights, converting to the compute dtype on the device.
struct Loader<'a> {
    weights: &'a Weights,
    device: &'a Device,
    dtype: DType,
}

impl Loader<'_> {
    fn upload(&self, name: &str, dtype: DType) -> Result<Tensor, LlmError> {
        let info = self.weights.get(name).ok_or_else(|| LlmError::missing_tensor(name))?;
        let bytes = self.weights.bytes(name).ok_or_else(|| LlmError::missing_tensor(name))?;
        let t = Tensor::from_bytes(self.device, info.dtype, &info.shape, bytes)
            .map_err(|e| LlmError::upload(name, self.device, e))?;
        convert(t, dtype, name)
    }

    fn tensor(&self, name: &str) -> Result<Tensor, LlmError> {
        self.upload(name, self.dtype)
    }

    /// Norm weights stay `f32` (the ops take `f32` gammas; every checkpoint dtype converts exactly).
    fn norm(&self, name: &str) -> Result<Tensor, LlmError> {
        self.upload(name, DType::F32)
    }

    fn linear(&self, prefix: &str, bias: bool) -> Result<Linear, LlmError> {
        Ok(Linear {
            weight: self.tensor(&format!("{prefix}.weight"))?,
            bias: if bias { Some(self.tensor(&format!("{prefix}.bias"))?) } else { None },
        })
    }

    /// Several `[rows_i, K]` weights of one dtype stacked into `[Σ rows_i, K]` (one host copy of
    /// these tensors only).
    fn stacked(&self, names: &[String]) -> Result<Tensor, LlmError> {
        let mut bytes = Vec::new();
        let (mut rows, mut cols, mut dtype) = (0, 0, None);
        for name in names {
            let info = self.weights.get(name).ok_or_else(|| LlmError::missing_tensor(name))?;
            bytes.extend_from_slice(self.weights.bytes(name).ok_or_else(|| LlmError::missing_tensor(name))?);
            rows += info.shape[0];
            cols = info.shape[1];
            if dtype.is_some_and(|d| d != info.dtype) {
                return Err(LlmError::InvalidArgument(format!(
                    "{} are stored in different dtypes; they must match to be fused",
                    names.join(" and ")
                )));
            }
            dtype = Some(info.dtype);
        }
        let dtype = dtype.unwrap_or(self.dtype);
        let t = Tensor::from_bytes(self.device, dtype, &[rows, cols], &bytes)
            .map_err(|e| LlmError::upload(&names[0], self.device, e))?;
        convert(t, self.dtype, &names[0])
    }
}

fn convert(t: Tensor, dtype: DType, name: &str) -> Result<Tensor, LlmError> {
    if t.dtype() == dtype {
        return Ok(t);
    }
    api::cast(&t, dtype)
        .map_err(|e| LlmError::Op { context: format!("converting {name} to {dtype}"), source: Box::new(e) })
}

impl QwenModel {
    /// Upload `weights` (validated against `config`) to `device` in `dtype` (f32, f16 or bf16).
    pub fn load(config: &ModelConfig, weights: &Weights, device: &Device, dtype: DType) -> Result<QwenModel, LlmError> {
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(LlmError::InvalidArgument(format!("the compute dtype must be f32, f16 or bf16, not {dtype}")));
        }
        let ld = Loader { weights, device, dtype };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let attn = format!("{p}.self_attn");
            layers.push(Layer {
                input_norm: ld.norm(&format!("{p}.input_layernorm.weight"))?,
                post_attention_norm: ld.norm(&format!("{p}.post_attention_layernorm.weight"))?,
                q: ld.linear(&format!("{attn}.q_proj"), config.qkv_bias)?,
                k: ld.linear(&format!("{attn}.k_proj"), config.qkv_bias)?,
                v: ld.linear(&format!("{attn}.v_proj"), config.qkv_bias)?,
                o: ld.linear(&format!("{attn}.o_proj"), config.o_proj_bias)?,
                qk_norm: if config.qk_norm {
                    Some((ld.norm(&format!("{attn}.q_norm.weight"))?, ld.norm(&format!("{attn}.k_norm.weight"))?))
                } else {
                    None
                },
                gate_up: ld.stacked(&[format!("{p}.mlp.gate_proj.weight"), format!("{p}.mlp.up_proj.weight")])?,
                down: ld.tensor(&format!("{p}.mlp.down_proj.weight"))?,
            });
        }
        let embed = ld.tensor(EMBED_TOKENS)?;
        let lm_head = if weights.lm_head_is_embedding() { embed.clone() } else { ld.tensor(LM_HEAD)? };
        let rope = RopeTable::new(device, config.rope_theta, config.head_dim, config.max_position_embeddings)
            .map_err(|e| LlmError::op("building the rotary table", e))?;
        // A tied checkpoint may store `lm_head.weight` too; it is the embedding, counted once.
        let tied_copy = |name: &str| weights.lm_head_is_embedding() && name == LM_HEAD;
        let parameters = weights
            .tensors()
            .iter()
            .filter(|(name, _)| !tied_copy(name))
            .map(|(_, t)| t.shape.iter().product::<usize>())
            .sum();
        Ok(QwenModel {
            config: config.clone(),
            device: device.clone(),
            dtype,
            embed,
            lm_head,
            layers,
            final_norm: ld.norm("model.norm.weight")?,
            rope,
            eps: config.rms_norm_eps as f32,
            parameters,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Parameters in the checkpoint (a tied `lm_head` counted once).
    pub fn parameters(&self) -> usize {
        self.parameters
    }

    /// An empty cache for up to `capacity` positions (at most `max_position_embeddings`).
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache, LlmError> {
        let c = &self.config;
        if capacity == 0 || capacity > c.max_position_embeddings {
            return Err(LlmError::InvalidArgument(format!(
                "a KV cache of {capacity} positions: the model supports 1 to {} (max_position_embeddings)",
                c.max_position_embeddings
            )));
        }
        let shape = [1, c.num_key_value_heads, capacity, c.head_dim];
        let mut k = Vec::with_capacity(c.num_hidden_layers);
        let mut v = Vec::with_capacity(c.num_hidden_layers);
        for _ in 0..c.num_hidden_layers {
            k.push(Tensor::zeros(&self.device, self.dtype, &shape)?);
            v.push(Tensor::zeros(&self.device, self.dtype, &shape)?);
        }
        // Decode attention's split count is measured here on a GPU (once per shape; cached), so
        // that no decode step pays for it.
        let q = Tensor::zeros(&self.device, self.dtype, &[1, c.num_attention_heads, c.head_dim])?;
        let stream = self.device.default_stream();
        let op = |what: &'static str| move |e| LlmError::op(what, e);
        let splits = tune::tuned_decode_splits(&stream, &q, &k[0], &v[0]).map_err(op("tuning decode attention"))?;
        let decode = DecodeWorkspace::new(&q, splits).map_err(op("decode workspace"))?;
        Ok(KvCache { k, v, capacity, len: 0, decode })
    }

    /// Run `ids` at positions `cache.len()..` (appending them to the cache) and return the
    /// logits `[rows, vocab]` in the compute dtype: of the last token only, or of every token
    /// with `all_logits`. Long inputs run in chunks of `chunk` tokens.
    pub fn forward(
        &self,
        cache: &mut KvCache,
        ids: &[u32],
        chunk: usize,
        all_logits: bool,
    ) -> Result<Tensor, LlmError> {
        if ids.is_empty() {
            return Err(LlmError::InvalidArgument("forward needs at least one token".into()));
        }
        if cache.len + ids.len() > cache.capacity {
            return Err(LlmError::InvalidArgument(format!(
                "{} tokens after {} cached exceed the cache's {} positions",
                ids.len(),
                cache.len,
                cache.capacity
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.config.vocab_size) {
            return Err(LlmError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary ({} ids)",
                self.config.vocab_size
            )));
        }
        let chunk = chunk.max(1);
        let gather = all_logits && ids.len() > chunk;
        let (mut scratch, mut gathered, mut last) = (None::<Activations>, Vec::new(), None);
        for part in ids.chunks(chunk) {
            let acts = match scratch.take() {
                Some(a) if a.tokens == part.len() => a,
                _ => Activations::new(self, part.len())?,
            };
            let logits = self.forward_chunk(cache, part, &acts, all_logits)?;
            if gather {
                // Every position's logits of several chunks: gathered on the host (tests and
                // scoring only).
                gathered.extend(logits.to_bytes()?);
            }
            last = Some(logits);
            scratch = Some(acts);
        }
        if gather {
            return Ok(Tensor::from_bytes(&self.device, self.dtype, &[ids.len(), self.config.vocab_size], &gathered)?);
        }
        last.ok_or_else(|| LlmError::InvalidArgument("forward needs at least one token".into()))
    }

    /// The buffers of [`QwenModel::decode_step`], made once per generation: on a GPU the first
    /// ones for a model measure the decode GEMVs' split counts.
    pub fn decode_activations(&self) -> Result<DecodeActivations, LlmError> {
        Ok(DecodeActivations(Activations::new(self, 1)?))
    }

    /// One decode step: the logits `[1, vocab]` after appending `id`, in `acts`' buffer (valid
    /// until the next step).
    pub fn decode_step(&self, cache: &mut KvCache, id: u32, acts: &DecodeActivations) -> Result<Tensor, LlmError> {
        let acts = &acts.0;
        if cache.len + 1 > cache.capacity {
            return Err(LlmError::InvalidArgument(format!("the KV cache is full ({} positions)", cache.capacity)));
        }
        if id as usize >= self.config.vocab_size {
            return Err(LlmError::InvalidArgument(format!("token id {id} is outside the vocabulary")));
        }
        self.forward_chunk(cache, &[id], acts, false)
    }

    fn forward_chunk(
        &self,
        cache: &mut KvCache,
        ids: &[u32],
        a: &Activations,
        all_logits: bool,
    ) -> Result<Tensor, LlmError> {
        let c = &self.config;
        let stream = self.device.default_stream();
        let s = &stream;
        let t = ids.len();
        let start = cache.len;
        let positions: Vec<u32> = (start..start + t).map(|p| p as u32).collect();
        a.ids.copy_from_slice(ids)?;
        a.positions.copy_from_slice(&positions)?;
        a.seq_lens.copy_from_slice(&[(start + t) as u32])?;
        a.cu_seqlens.copy_from_slice(&[0, t as u32])?;
        let (hq, hkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let op = |what: &'static str| move |e| LlmError::op(what, e);

        // The residual stream alternates between two buffers (the CPU device forbids an op
        // writing a tensor it also reads).
        let mut cur = 0;
        api::embedding_into(s, &a.ids, &self.embed, &a.residual[cur]).map_err(op("embedding"))?;
        api::rms_norm_hf_into(s, &a.residual[cur], &self.layers[0].input_norm, self.eps, &a.normed)
            .map_err(op("input norm"))?;
        for (l, layer) in self.layers.iter().enumerate() {
            self.project(s, a, &a.normed, &layer.q, &a.q, &a.q_scratch)?;
            self.project(s, a, &a.normed, &layer.k, &a.k, &a.k_scratch)?;
            self.project(s, a, &a.normed, &layer.v, &a.v, &a.v_scratch)?;
            let (q, k) = match &layer.qk_norm {
                Some((qn, kn)) => {
                    api::rms_norm_hf_into(
                        s,
                        &a.q.reshape(&[t * hq, d])?,
                        qn,
                        self.eps,
                        &a.q_scratch.reshape(&[t * hq, d])?,
                    )
                    .map_err(op("q norm"))?;
                    api::rms_norm_hf_into(
                        s,
                        &a.k.reshape(&[t * hkv, d])?,
                        kn,
                        self.eps,
                        &a.k_scratch.reshape(&[t * hkv, d])?,
                    )
                    .map_err(op("k norm"))?;
                    (&a.q_scratch, &a.k_scratch)
                }
                None => (&a.q, &a.k),
            };
            let (q3, k3, v3) = (q.reshape(&[t, hq, d])?, k.reshape(&[t, hkv, d])?, a.v.reshape(&[t, hkv, d])?);
            api::rope_into(s, &q3, &a.positions, &self.rope, &a.q_rot).map_err(op("rope"))?;
            api::rope_kv_cache_into(s, &k3, &v3, &a.positions, &a.slots, &self.rope, &cache.k[l], &cache.v[l])
                .map_err(op("rope + cache append"))?;
            let attn = a.attn.reshape(&[t, hq, d])?;
            match t {
                1 => api::attention_decode_into(
                    s,
                    &a.q_rot.reshape(&[1, hq, d])?,
                    &cache.k[l],
                    &cache.v[l],
                    &a.seq_lens,
                    None,
                    &cache.decode,
                    &attn.reshape(&[1, hq, d])?,
                )
                .map_err(op("decode attention"))?,
                _ => api::attention_prefill_cache_into(
                    s,
                    &a.q_rot,
                    &a.cu_seqlens,
                    t,
                    &cache.k[l],
                    &cache.v[l],
                    &a.seq_lens,
                    None,
                    true,
                    &attn,
                )
                .map_err(op("prefill attention"))?,
            }
            self.project(s, a, &a.attn, &layer.o, &a.hidden_out, &a.hidden_scratch)?;
            api::rms_norm_residual_into(
                s,
                &a.hidden_out,
                &a.residual[cur],
                &layer.post_attention_norm,
                self.eps,
                &a.normed,
                &a.residual[1 - cur],
            )
            .map_err(op("residual + post-attention norm"))?;
            cur = 1 - cur;
            self.linear(s, a, &a.normed, &layer.gate_up, None, &a.gate_up, &a.gate_up)
                .map_err(op("gate/up projection"))?;
            api::swiglu_into(s, &a.gate_up, &a.act).map_err(op("swiglu"))?;
            self.linear(s, a, &a.act, &layer.down, None, &a.hidden_out, &a.hidden_out)
                .map_err(op("down projection"))?;
            let next_norm = self.layers.get(l + 1).map_or(&self.final_norm, |n| &n.input_norm);
            api::rms_norm_residual_into(
                s,
                &a.hidden_out,
                &a.residual[cur],
                next_norm,
                self.eps,
                &a.normed,
                &a.residual[1 - cur],
            )
            .map_err(op("residual + norm"))?;
            cur = 1 - cur;
        }
        cache.len += t;
        let (rows, logits) = if all_logits {
            (a.normed.clone(), Tensor::empty(&self.device, self.dtype, &[t, c.vocab_size])?)
        } else {
            (a.normed.narrow(0, t - 1, 1)?, a.logits.clone())
        };
        self.linear(s, a, &rows, &self.lm_head, None, &logits, &logits).map_err(op("lm_head"))?;
        Ok(logits)
    }

    #[allow(clippy::too_many_arguments)]
    /// `out = x·wᵀ (+ bias)`: a decode step's GEMV with its tuned split count and the bias in its
    /// epilogue, a prefill chunk's tensor-core GEMM with its tuned tile and the bias in its
    /// epilogue, else `linear` (GEMV or GEMM by rows) and `add_bias` through `scratch`.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        s: &Stream,
        a: &Activations,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        scratch: &Tensor,
    ) -> Result<(), OpError> {
        let shape = (w.shape()[0], w.shape()[1]);
        if let (Some(&tile), true) = (a.gemm_tiles.get(&shape), x.shape()[0] == a.tokens) {
            return api::linear_tile_into(s, x, w, bias, None, out, tile);
        }
        let decode = a
            .gemv
            .as_ref()
            .filter(|_| x.shape()[0] == 1)
            .map(|g| (g.splits.get(&shape).copied().unwrap_or(1), &g.workspace));
        match (decode, bias) {
            (Some((splits, workspace)), Some(b)) => api::gemv_bias_into(s, x, w, b, out, Some(workspace), splits),
            (Some((splits, workspace)), None) if splits > 1 => api::gemv_split_k_into(s, x, w, out, workspace, splits),
            (_, None) => api::linear_into(s, x, w, out),
            (None, Some(b)) => {
                api::linear_into(s, x, w, scratch)?;
                api::add_bias_into(s, scratch, b, out)
            }
        }
    }

    /// A weight of shape `[n, k]`, for tuning.
    fn weight_of_shape(&self, n: usize, k: usize) -> Option<&Tensor> {
        let layer = self.layers.first()?;
        [&layer.q.weight, &layer.k.weight, &layer.v.weight, &layer.o.weight, &layer.gate_up, &layer.down, &self.lm_head]
            .into_iter()
            .find(|w| w.shape() == [n, k])
    }

    /// `out = x·Wᵀ + bias` (through `scratch` when the bias cannot be fused).
    fn project(
        &self,
        s: &Stream,
        a: &Activations,
        x: &Tensor,
        lin: &Linear,
        out: &Tensor,
        scratch: &Tensor,
    ) -> Result<(), LlmError> {
        self.linear(s, a, x, &lin.weight, lin.bias.as_ref(), out, scratch).map_err(|e| LlmError::op("projection", e))
    }

    /// The shapes every `linear` of a forward over `tokens` rows runs: `(name, m, n, k)`.
    pub fn linear_shapes(&self, tokens: usize) -> Vec<(&'static str, usize, usize, usize)> {
        let c = &self.config;
        let (h, q, kv, i) = (
            c.hidden_size,
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
            c.intermediate_size,
        );
        vec![
            ("q_proj", tokens, q, h),
            ("k_proj", tokens, kv, h),
            ("v_proj", tokens, kv, h),
            ("o_proj", tokens, h, q),
            ("gate_up_proj", tokens, 2 * i, h),
            ("down_proj", tokens, h, i),
            ("lm_head", 1, c.vocab_size, h),
        ]
    }
}

/// The buffers [`QwenModel::decode_step`] reuses across steps.
pub struct DecodeActivations(Activations);
