//! The decoder stack every architecture here is built from: embedding, a list of layers (each a
//! token mixer and a feed-forward block between RMS norms), the final norm and `lm_head`:
//!
//! ```text
//! h = embed(ids)
//! per layer:  n = rms_norm(h);  h = h + mixer(n)        (mixer: attention over the layer's cache,
//!                                                         or a gated DeltaNet over its state)
//!             n' = rms_norm(h); h = h + ffn(n')          (ffn: the SwiGLU MLP)
//! logits = rms_norm(h)·Wlmᵀ
//! ```
//!
//! Each residual add is fused with the norm after it (`rms_norm_residual`, transformers'
//! rounding order). A layer's mixer and feed-forward block are enums, so hybrid models (full or
//! linear attention per layer) and MoE models (dense MLP or routed experts per layer) are new
//! variants here, not new copies of the decoder.

use ruda_ops::{api, tune};
use ruda_runtime::{DType, Device, Tensor};

use crate::cache::{Cache, KvCache, LayerCache};
use crate::config::ModelConfig;
use crate::error::LlmError;
use crate::layers::{
    Attention, AttentionScratch, AttentionShape, AttentionSpec, BatchRow, DecodeChoices, DecodeStep, Embedding,
    EmbeddingSpec, ExpectedTensor, GatedDeltaNet, GatedDeltaNetSpec, GatedDeltaScratch, KvTarget, Linear, LinearBatch,
    LinearPlan, LinearShape, LmHeadSpec, Loader, Mlp, MlpScratch, MlpSpec, Moe, MoeScratch, MoeSpec, PlannedLaunch,
    RmsNorm, RmsNormSpec, Rope, RopeSpec, StepInputs, TensorSource, WeightDType,
};
use crate::models::{CausalLm, DecodeKernels};

/// What mixes information across positions in one layer.
#[derive(Clone, Debug)]
pub enum MixerSpec {
    /// Causal softmax attention over a KV cache.
    Attention(AttentionSpec),
    /// Qwen3.5's linear attention over a conv and a recurrent state.
    GatedDeltaNet(GatedDeltaNetSpec),
}

/// The per-position feed-forward block of one layer.
#[derive(Clone, Debug)]
pub enum FfnSpec {
    Mlp(MlpSpec),
    /// Routed SwiGLU experts (Qwen3-MoE's sparse layers).
    Moe(MoeSpec),
}

/// One decoder layer: `input_layernorm`, the mixer, `post_attention_layernorm`, the ffn.
#[derive(Clone, Debug)]
pub struct LayerSpec {
    pub input_norm: RmsNormSpec,
    pub mixer: MixerSpec,
    pub post_norm: RmsNormSpec,
    pub ffn: FfnSpec,
}

impl LayerSpec {
    /// The usual layer of `model.layers.{index}`: `self_attn` (as `attention` makes it from its
    /// prefix) and `mlp`.
    pub fn standard(config: &ModelConfig, index: usize, attention: impl Fn(&str) -> AttentionSpec) -> LayerSpec {
        let p = format!("model.layers.{index}");
        let (h, eps) = (config.hidden_size, config.rms_norm_eps);
        LayerSpec {
            input_norm: RmsNormSpec::new(&format!("{p}.input_layernorm"), h, eps),
            mixer: MixerSpec::Attention(attention(&format!("{p}.self_attn"))),
            post_norm: RmsNormSpec::new(&format!("{p}.post_attention_layernorm"), h, eps),
            ffn: FfnSpec::Mlp(MlpSpec::new(&format!("{p}.mlp"), h, config.intermediate_size)),
        }
    }
}

/// A whole decoder as `config` implies it: what an architecture file builds.
#[derive(Clone, Debug)]
pub struct DecoderSpec {
    pub config: ModelConfig,
    pub embedding: EmbeddingSpec,
    pub rope: RopeSpec,
    pub layers: Vec<LayerSpec>,
    pub norm: RmsNormSpec,
    pub lm_head: LmHeadSpec,
}

impl DecoderSpec {
    /// The embedding, rotary table, final norm and `lm_head` of `config`, around `layers`.
    pub fn new(config: &ModelConfig, layers: Vec<LayerSpec>) -> DecoderSpec {
        let (v, h) = (config.vocab_size, config.hidden_size);
        DecoderSpec {
            config: config.clone(),
            embedding: EmbeddingSpec::new(v, h),
            rope: RopeSpec {
                theta: config.rope_theta,
                scaling: config.rope_scaling.clone(),
                rotary_dim: config.rotary_dim,
                max_positions: config.max_position_embeddings,
            },
            layers,
            norm: RmsNormSpec::new("model.norm", h, config.rms_norm_eps),
            lm_head: LmHeadSpec::new(v, h, config.tie_word_embeddings),
        }
    }

    /// Every tensor of the checkpoint, in the order transformers writes them.
    pub fn tensors(&self) -> Vec<ExpectedTensor> {
        let mut out = vec![self.embedding.weight.clone()];
        for layer in &self.layers {
            out.extend([layer.input_norm.weight.clone(), layer.post_norm.weight.clone()]);
            match &layer.mixer {
                MixerSpec::Attention(a) => a.declare(&mut out),
                MixerSpec::GatedDeltaNet(g) => g.declare(&mut out),
            }
            match &layer.ffn {
                FfnSpec::Mlp(m) => m.declare(&mut out),
                FfnSpec::Moe(m) => m.declare(&mut out),
            }
        }
        out.extend([self.norm.weight.clone(), self.lm_head.weight.clone()]);
        out
    }

    /// The products of a forward over `tokens` rows, each distinct one once, in the order they
    /// run (`lm_head` last, over the last row).
    pub fn linear_shapes(&self, tokens: usize) -> Vec<LinearShape> {
        let mut out: Vec<LinearShape> = Vec::new();
        for layer in &self.layers {
            let mut shapes = Vec::new();
            match &layer.mixer {
                MixerSpec::Attention(a) => shapes.extend(a.linear_shapes(tokens)),
                MixerSpec::GatedDeltaNet(g) => shapes.extend(g.linear_shapes(tokens)),
            }
            match &layer.ffn {
                FfnSpec::Mlp(m) => shapes.extend(m.linear_shapes(tokens)),
                FfnSpec::Moe(m) => shapes.extend(m.linear_shapes(tokens)),
            }
            for s in shapes {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
        out.push(self.lm_head.linear_shape());
        out
    }

    /// The distinct attention shapes of the layers.
    pub fn attention_shapes(&self) -> Vec<AttentionShape> {
        let mut out = Vec::new();
        for a in self.attention_layers() {
            if !out.contains(&a.shape) {
                out.push(a.shape);
            }
        }
        out
    }

    /// The full-attention layers' specs, in order.
    fn attention_layers(&self) -> impl Iterator<Item = &AttentionSpec> {
        self.layers.iter().filter_map(|l| match &l.mixer {
            MixerSpec::Attention(a) => Some(a),
            MixerSpec::GatedDeltaNet(_) => None,
        })
    }

    /// The kernel launches of one decode step in `dtype`, in order, as [`CausalLm::decode_step`]
    /// and the pipeline's greedy pick make them on a device without tuning: the new token at
    /// position `context - 1` of a cache of `context` positions, so that attention reads
    /// `context` keys. See [`DecoderSpec::decode_launches_with`] for a device's own choices.
    pub fn decode_launches(&self, context: usize, dtype: DType) -> Result<Vec<PlannedLaunch>, LlmError> {
        self.decode_launches_with(context, dtype, &DecodeChoices::default())
    }

    /// [`DecoderSpec::decode_launches`] with the split counts a device chose. Each layer's spec
    /// adds its own launches, in the order `forward_chunk` runs them (a new mixer or ffn kind
    /// adds its launches in its own `decode_launches`).
    pub fn decode_launches_with(
        &self,
        context: usize,
        dtype: DType,
        choices: &DecodeChoices,
    ) -> Result<Vec<PlannedLaunch>, LlmError> {
        let max = self.config.max_position_embeddings;
        if context == 0 || context > max {
            return Err(LlmError::InvalidArgument(format!(
                "a context of {context} positions: the model supports 1 to {max} (max_position_embeddings)"
            )));
        }
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(LlmError::InvalidArgument(format!("the compute dtype must be f32, f16 or bf16, not {dtype}")));
        }
        let first = self.layers.first().ok_or_else(|| LlmError::InvalidArgument("a model without layers".into()))?;
        // One decode workspace serves every attention layer, made for the first one's shape
        // (`new_cache`); a model without attention layers has none (1: unused).
        let attention_splits = match (choices.attention_splits, self.attention_layers().next()) {
            (Some(splits), _) => splits,
            (None, Some(a)) => {
                let AttentionShape { q_heads, kv_heads, head_dim } = a.shape;
                api::decode_splits(1, q_heads, kv_heads, head_dim, context)
            }
            (None, None) => 1,
        };
        let step = DecodeStep { dtype, context, attention_splits, rotary_dim: self.rope.rotary_dim, choices };
        let mut out = vec![self.embedding.decode_launch(&step)];
        first.input_norm.decode_launches(&step, 1, false, &mut out);
        for (l, layer) in self.layers.iter().enumerate() {
            match &layer.mixer {
                MixerSpec::Attention(a) => a.decode_launches(&step, &mut out),
                MixerSpec::GatedDeltaNet(g) => g.decode_launches(&step, &mut out),
            }
            layer.post_norm.decode_launches(&step, 1, true, &mut out);
            match &layer.ffn {
                FfnSpec::Mlp(m) => m.decode_launches(&step, &mut out),
                FfnSpec::Moe(m) => m.decode_launches(&step, &mut out),
            }
            let next_norm = self.layers.get(l + 1).map_or(&self.norm, |n| &n.input_norm);
            next_norm.decode_launches(&step, 1, true, &mut out);
        }
        self.lm_head.decode_launches(&step, &mut out);
        out.extend(greedy_pick(&step, self.config.vocab_size, choices.argmax_splits.unwrap_or(1)));
        Ok(out)
    }

    /// Bytes of every weight the model holds on a device in `dtype` (norm gammas in f32; a
    /// tied `lm_head` is the embedding, counted once).
    pub fn weight_bytes(&self, dtype: DType) -> u64 {
        self.tensors()
            .iter()
            .filter(|t| t.required)
            .map(|t| {
                let size = match t.dtype {
                    WeightDType::Compute => dtype.size(),
                    WeightDType::F32 => 4,
                };
                (t.shape.iter().product::<usize>() * size) as u64
            })
            .sum()
    }

    /// Upload the layers from `source` (validated against [`DecoderSpec::tensors`]) to `device`
    /// in `dtype` (f32, f16 or bf16).
    pub fn load(self, source: &dyn TensorSource, device: &Device, dtype: DType) -> Result<Decoder, LlmError> {
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(LlmError::InvalidArgument(format!("the compute dtype must be f32, f16 or bf16, not {dtype}")));
        }
        // A model whose shapes no kernel serves is refused here, naming the shape, rather than
        // at its first forward.
        for shape in self.attention_shapes() {
            api::attention_supports(dtype, shape.q_heads, shape.kv_heads, shape.head_dim, shape.head_dim)
                .map_err(|e| LlmError::op("the model's attention shape", e))?;
        }
        let ld = Loader { source, device, dtype };
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            layers.push(Layer {
                input_norm: layer.input_norm.load(&ld)?,
                mixer: match &layer.mixer {
                    MixerSpec::Attention(a) => Mixer::Attention(a.load(&ld)?),
                    MixerSpec::GatedDeltaNet(g) => Mixer::GatedDeltaNet(g.load(&ld)?),
                },
                post_norm: layer.post_norm.load(&ld)?,
                ffn: match &layer.ffn {
                    FfnSpec::Mlp(m) => Ffn::Mlp(m.load(&ld)?),
                    FfnSpec::Moe(m) => Ffn::Moe(m.load(&ld)?),
                },
            });
        }
        let embedding = self.embedding.load(&ld)?;
        let lm_head = self.lm_head.load(&ld, &embedding)?;
        // A tied checkpoint may store `lm_head.weight` too; it is the embedding, counted once.
        let parameters = self.tensors().iter().filter(|t| t.required).map(|t| t.shape.iter().product::<usize>()).sum();
        Ok(Decoder {
            device: device.clone(),
            dtype,
            embedding,
            rope: self.rope.load(device)?,
            layers,
            norm: self.norm.load(&ld)?,
            lm_head,
            parameters,
            spec: self,
        })
    }
}

/// The pipeline's greedy pick of the next token (`argmax` over the logits, split over `splits`
/// blocks with a reduction when the device gives it a workspace).
fn greedy_pick(step: &DecodeStep, vocab: usize, splits: usize) -> Vec<PlannedLaunch> {
    let (e, dt) = (step.elem(), step.dt());
    let logits = vocab as u64 * e;
    // `argmax_into`'s rounding: equal column ranges, none empty.
    let per_split = vocab.div_ceil(splits.max(1));
    let splits = vocab.div_ceil(per_split) as u64;
    let pick = |kernel: String, read: u64, written: u64, flops: u64| PlannedLaunch {
        op: "greedy pick (argmax)".into(),
        kernel,
        shape: format!("[1, {vocab}]"),
        bytes_read: read,
        bytes_written: written,
        weight_bytes: 0,
        kv_bytes: 0,
        flops,
    };
    if splits == 1 {
        return vec![pick(format!("argmax.{dt}"), logits, 4, vocab as u64)];
    }
    vec![
        pick(format!("argmax.{dt}.partial"), logits, 8 * splits, vocab as u64),
        pick("argmax.u64.reduce".into(), 8 * splits, 4, splits),
    ]
}

// One per layer, made once at load and never moved after: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Mixer {
    Attention(Attention),
    GatedDeltaNet(GatedDeltaNet),
}

enum Ffn {
    Mlp(Mlp),
    Moe(Moe),
}

pub(super) struct Layer {
    input_norm: RmsNorm,
    pub(super) mixer: Mixer,
    post_norm: RmsNorm,
    ffn: Ffn,
}

impl Layer {
    fn linears(&self) -> Vec<&Linear> {
        let mut out: Vec<&Linear> = match &self.mixer {
            Mixer::Attention(a) => a.linears().into_iter().collect(),
            Mixer::GatedDeltaNet(g) => g.linears().collect(),
        };
        match &self.ffn {
            Ffn::Mlp(m) => out.extend(m.linears()),
            Ffn::Moe(m) => out.extend(m.linears()),
        }
        out
    }
}

/// A loaded decoder on one device.
pub struct Decoder {
    pub(super) spec: DecoderSpec,
    pub(super) device: Device,
    pub(super) dtype: DType,
    embedding: Embedding,
    pub(super) rope: Rope,
    pub(super) layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    parameters: usize,
}

/// The buffers of a forward over `tokens` rows, made once per chunk size and reused (decode runs
/// every step with the same ones, so a step allocates nothing).
pub struct Workspace {
    tokens: usize,
    sequences: usize,
    ids: Tensor,
    step: StepInputs,
    /// The residual stream alternates between two buffers (the CPU device forbids an op writing
    /// a tensor it also reads).
    residual: [Tensor; 2],
    normed: Tensor,
    /// A mixer's or ffn's output, before the residual add.
    block_out: Tensor,
    /// `None` without attention layers.
    attention: Option<AttentionScratch>,
    /// `None` without gated DeltaNet layers.
    linear: Option<GatedDeltaScratch>,
    /// `None` without dense MLP layers.
    mlp: Option<MlpScratch>,
    /// `None` without MoE layers.
    moe: Option<MoeScratch>,
    /// With more rows than sequences: each sequence's last row gathered `[sequences, hidden]`.
    last_normed: Option<Tensor>,
    /// Each sequence's last row's logits `[sequences, vocab]`.
    logits: Tensor,
    plan: LinearPlan,
}

impl Workspace {
    /// `(rows, sequences)`.
    pub(super) fn shape(&self) -> (usize, usize) {
        (self.tokens, self.sequences)
    }

    /// The token ids buffer `[rows]`.
    pub(super) fn ids(&self) -> &Tensor {
        &self.ids
    }

    /// The logits buffer `[sequences, vocab]`.
    pub(super) fn logits(&self) -> &Tensor {
        &self.logits
    }

    pub(super) fn step(&self) -> &StepInputs {
        &self.step
    }

    pub(super) fn plan(&self) -> &LinearPlan {
        &self.plan
    }

    /// Write a batch's token ids and rows (host-to-device copies).
    pub(super) fn write_inputs(&self, ids: &[u32], rows: &[BatchRow]) -> Result<(), LlmError> {
        self.ids.copy_from_slice(ids)?;
        self.step.write_batch(rows)
    }

    pub(super) fn attention(&self) -> Result<&AttentionScratch, LlmError> {
        self.attention
            .as_ref()
            .ok_or_else(|| LlmError::InvalidArgument("an attention layer without its workspace".into()))
    }

    pub(super) fn linear(&self) -> Result<&GatedDeltaScratch, LlmError> {
        self.linear
            .as_ref()
            .ok_or_else(|| LlmError::InvalidArgument("a gated DeltaNet layer without its workspace".into()))
    }
}

impl Decoder {
    /// The buffers of a forward over `tokens` rows of `sequences` sequences.
    pub(super) fn workspace(&self, tokens: usize, sequences: usize) -> Result<Workspace, LlmError> {
        let c = &self.spec.config;
        let (dev, dt) = (&self.device, self.dtype);
        let empty = |shape: &[usize]| -> Result<Tensor, LlmError> { Ok(Tensor::empty(dev, dt, shape)?) };
        if self.layers.is_empty() {
            return Err(LlmError::InvalidArgument("a model without layers".into()));
        }
        let mlp = match self.spec.layers.iter().find_map(|l| match &l.ffn {
            FfnSpec::Mlp(m) => Some(m),
            FfnSpec::Moe(_) => None,
        }) {
            Some(m) => Some(MlpScratch::new(dev, dt, tokens, m.intermediate())?),
            None => None,
        };
        let moe = match self.layers.iter().find_map(|l| match &l.ffn {
            Ffn::Moe(m) => Some(m),
            Ffn::Mlp(_) => None,
        }) {
            Some(m) => Some(m.scratch(dev, dt, tokens)?),
            None => None,
        };
        let attention = match self.spec.attention_layers().next() {
            Some(a) => Some(AttentionScratch::new(dev, dt, tokens, a.shape, a.output_gate)?),
            None => None,
        };
        let linear = match self.layers.iter().find_map(|l| match &l.mixer {
            Mixer::GatedDeltaNet(g) => Some(g),
            Mixer::Attention(_) => None,
        }) {
            Some(g) => Some(g.scratch(dev, dt, tokens)?),
            None => None,
        };
        let shapes = self.spec.linear_shapes(tokens);
        let linears = self.layers.iter().flat_map(Layer::linears).chain([&self.lm_head]);
        Ok(Workspace {
            linear,
            tokens,
            sequences,
            ids: Tensor::zeros(dev, DType::U32, &[tokens])?,
            step: StepInputs::new(dev, tokens, sequences)?,
            residual: [empty(&[tokens, c.hidden_size])?, empty(&[tokens, c.hidden_size])?],
            normed: empty(&[tokens, c.hidden_size])?,
            block_out: empty(&[tokens, c.hidden_size])?,
            attention,
            mlp,
            moe,
            last_normed: if tokens > sequences { Some(empty(&[sequences, c.hidden_size])?) } else { None },
            logits: empty(&[sequences, c.vocab_size])?,
            plan: LinearPlan::new(dev, dt, tokens, &shapes, linears)?,
        })
    }

    pub(super) fn check_ids(&self, ids: &[u32]) -> Result<(), LlmError> {
        let vocab = self.spec.config.vocab_size;
        match ids.iter().find(|&&id| id as usize >= vocab) {
            Some(bad) => {
                Err(LlmError::InvalidArgument(format!("token id {bad} is outside the vocabulary ({vocab} ids)")))
            }
            None => Ok(()),
        }
    }

    fn forward_chunk(
        &self,
        cache: &mut Cache,
        ids: &[u32],
        w: &Workspace,
        all_logits: bool,
    ) -> Result<Tensor, LlmError> {
        w.ids.copy_from_slice(ids)?;
        w.step.write(cache.len(), ids.len())?;
        self.run_chunk(cache, ids.len(), w, all_logits)
    }

    /// The kernels of a chunk of `t` tokens whose ids and positions are in `w` already: no host
    /// copy, so that a decode step can be captured into a graph.
    fn run_chunk(&self, cache: &mut Cache, t: usize, w: &Workspace, all_logits: bool) -> Result<Tensor, LlmError> {
        let start = cache.len();
        let (layer_caches, decode) = cache.parts_mut();
        if layer_caches.len() != self.layers.len() {
            return Err(LlmError::InvalidArgument(format!(
                "the cache has {} layers, the model {}: it was made by another model",
                layer_caches.len(),
                self.layers.len()
            )));
        }
        let cu_seqlens = [0, t as u32];
        self.run_layers(w, |l, s, x, out| match &self.layers[l].mixer {
            Mixer::Attention(a) => {
                let (Some(decode), Some(scratch)) = (decode, &w.attention) else {
                    return Err(LlmError::InvalidArgument("an attention layer without its workspace".into()));
                };
                let kv = KvTarget::Contiguous { cache: layer_caches[l].kv()?, decode };
                a.forward(s, &w.plan, &self.rope, &w.step, x, kv, scratch, out)
            }
            Mixer::GatedDeltaNet(g) => {
                let Some(scratch) = &w.linear else {
                    return Err(LlmError::InvalidArgument("a gated DeltaNet layer without its workspace".into()));
                };
                let batch = LinearBatch {
                    cu_seqlens: w.step.cu_seqlens(),
                    cu_seqlens_host: &cu_seqlens,
                    slots: w.step.sequence_slots(),
                    slots_host: &[0],
                    fresh: &[start == 0],
                };
                g.forward(s, &w.plan, x, &batch, layer_caches[l].linear()?, scratch, out)
            }
        })?;
        cache.advance(t);
        let vocab = self.spec.config.vocab_size;
        let (rows, logits) = if all_logits {
            (w.normed.clone(), Tensor::empty(&self.device, self.dtype, &[t, vocab])?)
        } else {
            (w.normed.narrow(0, t - 1, 1)?, w.logits.clone())
        };
        let s = self.device.default_stream();
        self.lm_head.forward(&s, &w.plan, &rows, &logits).map_err(|e| LlmError::op("lm_head", e))?;
        Ok(logits)
    }

    /// Embedding, every layer and the final norm over `w`'s rows, on the default stream:
    /// `mix(layer, stream, normed input, output)` runs layer `layer`'s token mixer over its
    /// cache; the final norm's output is left in `w.normed`.
    pub(super) fn run_layers(
        &self,
        w: &Workspace,
        mut mix: impl FnMut(usize, &ruda_runtime::Stream, &Tensor, &Tensor) -> Result<(), LlmError>,
    ) -> Result<(), LlmError> {
        let stream = self.device.default_stream();
        let s = &stream;
        let op = |what: &'static str| move |e| LlmError::op(what, e);
        let mut cur = 0;
        self.embedding.forward(s, &w.ids, &w.residual[cur]).map_err(op("embedding"))?;
        let first = self.layers.first().ok_or_else(|| LlmError::InvalidArgument("a model without layers".into()))?;
        first.input_norm.forward(s, &w.residual[cur], &w.normed).map_err(op("input norm"))?;
        for (l, layer) in self.layers.iter().enumerate() {
            mix(l, s, &w.normed, &w.block_out)?;
            layer
                .post_norm
                .forward_residual(s, &w.block_out, &w.residual[cur], &w.normed, &w.residual[1 - cur])
                .map_err(op("residual + post-attention norm"))?;
            cur = 1 - cur;
            match &layer.ffn {
                Ffn::Mlp(m) => {
                    let scratch = w
                        .mlp
                        .as_ref()
                        .ok_or_else(|| LlmError::InvalidArgument("an MLP without its workspace".into()))?;
                    m.forward(s, &w.plan, &w.normed, scratch, &w.block_out)?
                }
                Ffn::Moe(m) => {
                    let scratch = w
                        .moe
                        .as_ref()
                        .ok_or_else(|| LlmError::InvalidArgument("an MoE block without its workspace".into()))?;
                    m.forward(s, &w.plan, &w.normed, scratch, &w.block_out)?
                }
            }
            let next_norm = self.layers.get(l + 1).map_or(&self.norm, |n| &n.input_norm);
            next_norm
                .forward_residual(s, &w.block_out, &w.residual[cur], &w.normed, &w.residual[1 - cur])
                .map_err(op("residual + norm"))?;
            cur = 1 - cur;
        }
        Ok(())
    }

    /// The logits `[sequences, vocab]` of each sequence's last row after [`Decoder::run_layers`]
    /// (gathered first when a sequence has several rows), in `w`'s buffer.
    pub(super) fn last_row_logits(&self, w: &Workspace) -> Result<Tensor, LlmError> {
        let s = self.device.default_stream();
        let rows = match &w.last_normed {
            Some(gathered) => {
                api::embedding_into(&s, w.step.last_rows(), &w.normed, gathered)
                    .map_err(|e| LlmError::op("gathering the last rows", e))?;
                gathered
            }
            None => &w.normed,
        };
        self.lm_head.forward(&s, &w.plan, rows, &w.logits).map_err(|e| LlmError::op("lm_head", e))?;
        Ok(w.logits.clone())
    }
}

impl CausalLm for Decoder {
    fn config(&self) -> &ModelConfig {
        &self.spec.config
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn parameters(&self) -> usize {
        self.parameters
    }

    fn linear_shapes(&self, tokens: usize) -> Vec<LinearShape> {
        self.spec.linear_shapes(tokens)
    }

    fn new_cache_with_capacity(&self, capacity: usize) -> Result<Cache, LlmError> {
        let max = self.spec.config.max_position_embeddings;
        if capacity == 0 || capacity > max {
            return Err(LlmError::InvalidArgument(format!(
                "a KV cache of {capacity} positions: the model supports 1 to {max} (max_position_embeddings)"
            )));
        }
        let mut layers = Vec::with_capacity(self.layers.len());
        let mut first_attention = None;
        for layer in &self.layers {
            layers.push(match &layer.mixer {
                Mixer::Attention(a) => {
                    let shape = a.shape();
                    let kv = KvCache::new(&self.device, self.dtype, shape.kv_heads, capacity, shape.head_dim)?;
                    first_attention.get_or_insert((shape, kv.k().clone(), kv.v().clone()));
                    LayerCache::Kv(kv)
                }
                Mixer::GatedDeltaNet(g) => LayerCache::Linear(g.new_state_pool(&self.device, self.dtype, 1)?),
            });
        }
        if layers.is_empty() {
            return Err(LlmError::InvalidArgument("a model without layers".into()));
        }
        // Decode attention's split count is measured here on a GPU (once per shape; cached), so
        // that no decode step pays for it.
        let decode = match first_attention {
            None => None,
            Some((shape, k, v)) => {
                let q = Tensor::zeros(&self.device, self.dtype, &[1, shape.q_heads, shape.head_dim])?;
                let stream = self.device.default_stream();
                let op = |what: &'static str| move |e| LlmError::op(what, e);
                let splits = tune::tuned_decode_splits(&stream, &q, &k, &v).map_err(op("tuning decode attention"))?;
                Some(api::DecodeWorkspace::new(&q, splits).map_err(op("decode workspace"))?)
            }
        };
        Ok(Cache::new(layers, capacity, decode))
    }

    fn forward(&self, cache: &mut Cache, ids: &[u32], chunk: usize, all_logits: bool) -> Result<Tensor, LlmError> {
        if ids.is_empty() {
            return Err(LlmError::InvalidArgument("forward needs at least one token".into()));
        }
        if cache.len() + ids.len() > cache.capacity() {
            return Err(LlmError::InvalidArgument(format!(
                "{} tokens after {} cached exceed the cache's {} positions",
                ids.len(),
                cache.len(),
                cache.capacity()
            )));
        }
        self.check_ids(ids)?;
        let chunk = chunk.max(1);
        let gather = all_logits && ids.len() > chunk;
        let (mut scratch, mut gathered, mut last) = (None::<Workspace>, Vec::new(), None);
        for part in ids.chunks(chunk) {
            let w = match scratch.take() {
                Some(w) if w.tokens == part.len() => w,
                _ => self.workspace(part.len(), 1)?,
            };
            let logits = self.forward_chunk(cache, part, &w, all_logits)?;
            if gather {
                // Every position's logits of several chunks: gathered on the host (tests and
                // scoring only).
                gathered.extend(logits.to_bytes()?);
            }
            last = Some(logits);
            scratch = Some(w);
        }
        if gather {
            let shape = [ids.len(), self.spec.config.vocab_size];
            return Ok(Tensor::from_bytes(&self.device, self.dtype, &shape, &gathered)?);
        }
        last.ok_or_else(|| LlmError::InvalidArgument("forward needs at least one token".into()))
    }

    fn new_batch_cache_with(
        &self,
        kv: crate::batch::PagedKvCacheConfig,
        max_active: usize,
        mode: ruda_runtime::PagedAttentionMode,
    ) -> Result<super::BatchCache, LlmError> {
        self.batch_cache(kv, max_active, mode, ruda_runtime::graph_mode()?)
    }

    fn forward_batch(
        &self,
        batch: &crate::batch::ScheduledBatch,
        cache: &mut super::BatchCache,
    ) -> Result<Tensor, LlmError> {
        Decoder::forward_batch(self, batch, cache)
    }

    fn decode_workspace(&self) -> Result<Workspace, LlmError> {
        self.workspace(1, 1)
    }

    fn decode_step(&self, cache: &mut Cache, id: u32, workspace: &Workspace) -> Result<Tensor, LlmError> {
        self.write_decode_inputs(cache, id, workspace)?;
        self.run_decode_step(cache, workspace, DecodeKernels::Launch)
    }

    fn write_decode_inputs(&self, cache: &Cache, id: u32, workspace: &Workspace) -> Result<(), LlmError> {
        decode_room(cache, workspace)?;
        if id as usize >= self.spec.config.vocab_size {
            return Err(LlmError::InvalidArgument(format!("token id {id} is outside the vocabulary")));
        }
        workspace.ids.copy_from_slice(&[id])?;
        workspace.step.write(cache.len(), 1)?;
        Ok(())
    }

    fn run_decode_step(
        &self,
        cache: &mut Cache,
        workspace: &Workspace,
        kernels: DecodeKernels<'_>,
    ) -> Result<Tensor, LlmError> {
        decode_room(cache, workspace)?;
        match kernels {
            DecodeKernels::Launch => self.run_chunk(cache, 1, workspace, false),
            DecodeKernels::Replay(graph) => {
                graph.launch(&self.device.default_stream())?;
                cache.advance(1);
                Ok(workspace.logits.clone())
            }
        }
    }
}

/// An error unless `cache` has room for one more position and `workspace` is a decode one.
fn decode_room(cache: &Cache, workspace: &Workspace) -> Result<(), LlmError> {
    if cache.len() + 1 > cache.capacity() {
        return Err(LlmError::InvalidArgument(format!(
            "the KV cache is full ({} positions; new_cache_with_capacity makes a larger one)",
            cache.capacity()
        )));
    }
    if workspace.tokens != 1 || workspace.sequences != 1 {
        return Err(LlmError::InvalidArgument("a decode step needs the decode workspace (one row)".into()));
    }
    Ok(())
}
