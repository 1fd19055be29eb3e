//! The pipeline API: load a Hugging Face Qwen2 / Qwen2.5 / Qwen3 folder, render
//! chats, encode and decode, and generate text greedily or by sampling, whole or streamed.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ruda_ops::api::{self, SamplingParams};
use ruda_runtime::{DType, Device, Tensor};
use serde_json::{Map, Value};

use crate::cache::Cache;
use crate::chat::{ChatMessage, ChatTemplate};
use crate::config::{load_config, ModelConfig, ModelType};
use crate::constraint::{Constraint, ConstraintState};
use crate::error::LlmError;
use crate::generate::{
    GenerateParams, GeneratedText, GreedyGenerationConfig, SamplingConfig, SamplingGenerationConfig, StopReason,
    StreamControl, TextStream, TokenLogprobs,
};
use crate::generation::GenerationConfig;
use crate::models::{architecture, Architecture, CausalLm};
use crate::tokenizer::Tokenizer;
use crate::weights::{check_weights_from_env, Weights};

/// The Hugging Face-style names of the pipeline, its error and its chat types, kept for callers
/// written against them.
pub type HuggingFaceQwen2Pipeline = Pipeline;
pub type HuggingFaceQwen3Pipeline = Pipeline;
/// The Qwen3.5 pipeline ([`load_huggingface_qwen35_pipeline`]).
pub type HuggingFaceQwen35Pipeline = Pipeline;
/// The state a Qwen3.5 model carries between [`CausalLm::forward_cached_last`] calls: per layer
/// the KV cache of full attention or the conv and recurrent states of the gated DeltaNet.
pub type Qwen35Cache = Cache;
pub type HuggingFaceLoadError = LlmError;
pub type Qwen2ChatMessage = ChatMessage;
pub type Qwen2ChatRole = ChatRole;

/// The roles of a plain-text chat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatRole {
    System,
    User,
    Assistant,
}

impl From<ChatRole> for String {
    fn from(role: ChatRole) -> String {
        match role {
            ChatRole::System => "system",
            ChatRole::User => "user",
            ChatRole::Assistant => "assistant",
        }
        .to_string()
    }
}

/// The default KV-cache capacity of a pipeline (and of `ruda-llm tune --context`).
pub const DEFAULT_CONTEXT: usize = 4096;

/// How to load a pipeline.
#[derive(Clone, Debug, Default)]
pub struct PipelineOptions {
    /// `None`: [`Device::from_env`] (`RUDA_DEVICE`, a GPU when there is one).
    pub device: Option<Device>,
    /// The compute dtype; `None`: `RUDA_DTYPE` when set, else bf16 on CUDA and f32 on the CPU.
    pub dtype: Option<DType>,
    /// Prompt tokens per prefill chunk; `None`: 512.
    pub prefill_chunk: Option<usize>,
    /// Positions of the KV cache kept between generations; `None`: 4096 (at most
    /// `max_position_embeddings`). A longer request grows it. Decode attention is tuned for this
    /// capacity (`ruda-llm tune --context` pre-tunes the same).
    pub context: Option<usize>,
    /// Refuse weights holding NaN or infinities ([`Weights::set_check_finite`]); `None`:
    /// `RUDA_CHECK_WEIGHTS` (`on` unless it says `off`).
    pub check_weights: Option<bool>,
}

/// What was loaded, and the defaults it offers.
#[derive(Clone, Debug)]
pub struct LoadedModel {
    pub directory: PathBuf,
    pub config: ModelConfig,
    pub generation_config: GenerationConfig,
    /// `generation_config.json`'s EOS ids (else `config.json`'s, else the tokenizer's
    /// `<|im_end|>` and `<|endoftext|>`).
    pub default_eos_token_ids: Vec<u32>,
    pub dtype: DType,
    /// Parameters in the checkpoint.
    pub parameters: usize,
    pub load_seconds: f64,
}

/// A loaded model with its tokenizer and chat template, ready to generate. Generation takes
/// `&self`; concurrent calls run one at a time (they share the KV cache).
pub struct Pipeline {
    pub loaded: LoadedModel,
    model: Box<dyn CausalLm>,
    tokenizer: Tokenizer,
    chat: ChatTemplate,
    prefill_chunk: usize,
    context: usize,
    cache: Mutex<Option<Cache>>,
}

/// Load `dir`, which must hold a `qwen2` model (Qwen2 or Qwen2.5), on `device`.
pub fn load_huggingface_qwen2_pipeline(dir: impl AsRef<Path>, device: &Device) -> Result<Pipeline, LlmError> {
    load_expecting(dir.as_ref(), ModelType::Qwen2, device)
}

/// Load `dir`, which must hold a `qwen3` model, on `device`.
pub fn load_huggingface_qwen3_pipeline(dir: impl AsRef<Path>, device: &Device) -> Result<Pipeline, LlmError> {
    load_expecting(dir.as_ref(), ModelType::Qwen3, device)
}

/// Load `dir`, which must hold a Qwen3.5 model (`qwen3_5_text`, or the composite `qwen3_5` for
/// its text), on `device`.
pub fn load_huggingface_qwen35_pipeline(dir: impl AsRef<Path>, device: &Device) -> Result<Pipeline, LlmError> {
    load_expecting(dir.as_ref(), ModelType::Qwen35, device)
}

fn load_expecting(dir: &Path, expected: ModelType, device: &Device) -> Result<Pipeline, LlmError> {
    let options = PipelineOptions { device: Some(device.clone()), ..Default::default() };
    Pipeline::load_expecting(dir, Some(expected), &options)
}

/// Load any supported model in `dir` (dispatching on its `model_type`).
pub fn load_pipeline(dir: impl AsRef<Path>, options: &PipelineOptions) -> Result<Pipeline, LlmError> {
    Pipeline::load_expecting(dir.as_ref(), None, options)
}

/// The architecture of the model in `dir`: its `config.json`'s `model_type` through the table.
pub fn architecture_of(dir: &Path) -> Result<&'static dyn Architecture, LlmError> {
    check_model_dir(dir)?;
    Ok(architecture(load_config(dir)?.model_type))
}

pub(crate) fn check_model_dir(dir: &Path) -> Result<(), LlmError> {
    if !dir.is_dir() {
        return Err(LlmError::InvalidArgument(format!("{}: not a model directory", dir.display())));
    }
    Ok(())
}

/// The dtype `RUDA_DTYPE` names, if set.
fn dtype_from_env() -> Result<Option<DType>, LlmError> {
    match std::env::var("RUDA_DTYPE") {
        Err(_) => Ok(None),
        Ok(s) => match DType::from_name(s.trim()) {
            Some(d @ (DType::F32 | DType::F16 | DType::BF16)) => Ok(Some(d)),
            _ => Err(LlmError::InvalidArgument(format!("RUDA_DTYPE={s}: expected f32, f16 or bf16"))),
        },
    }
}

impl Pipeline {
    /// Load `dir`, which must hold a `model_type` model.
    pub fn load_expecting_type(
        dir: &Path,
        model_type: ModelType,
        options: &PipelineOptions,
    ) -> Result<Pipeline, LlmError> {
        Pipeline::load_expecting(dir, Some(model_type), options)
    }

    fn load_expecting(
        dir: &Path,
        expected: Option<ModelType>,
        options: &PipelineOptions,
    ) -> Result<Pipeline, LlmError> {
        let start = Instant::now();
        check_model_dir(dir)?;
        if let Some(expected) = expected {
            // Read model_type alone first, so a wrong architecture is named as such rather
            // than as whatever it lacks.
            let path = dir.join("config.json");
            let found = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|j| j.get("model_type").and_then(Value::as_str).map(str::to_string));
            if let Some(found) = found.filter(|f| !expected.accepts(f)) {
                return Err(LlmError::WrongModelType { path, expected: expected.name(), found });
            }
        }
        let config = load_config(dir)?;
        let device = match &options.device {
            Some(d) => d.clone(),
            None => Device::from_env()?,
        };
        let dtype = match options.dtype.or(dtype_from_env()?) {
            Some(d) => d,
            None if device.is_cuda() => DType::BF16,
            None => DType::F32,
        };
        let check_weights = options.check_weights.unwrap_or(check_weights_from_env()?);
        let tokenizer = Tokenizer::load(dir)?;
        tokenizer.check_fits(config.vocab_size)?;
        let chat = ChatTemplate::load(dir)?;
        let generation_config = GenerationConfig::load_for_vocab(dir, config.vocab_size)?;
        let mut weights = Weights::load(dir, &config)?;
        // Checked as each tensor is read for upload, not in a pass of its own.
        weights.set_check_finite(check_weights);
        let model = architecture(config.model_type).load(&config, &weights, &device, dtype)?;
        let mut eos = generation_config.eos_token_ids.clone();
        if eos.is_empty() {
            eos = ["<|im_end|>", "<|endoftext|>"].iter().filter_map(|t| tokenizer.token_to_id(t)).collect();
        }
        device.synchronize()?;
        let loaded = LoadedModel {
            directory: dir.to_path_buf(),
            config,
            generation_config,
            default_eos_token_ids: eos,
            dtype,
            parameters: model.parameters(),
            load_seconds: start.elapsed().as_secs_f64(),
        };
        let context = options.context.unwrap_or(DEFAULT_CONTEXT).clamp(1, loaded.config.max_position_embeddings);
        Ok(Pipeline {
            loaded,
            model,
            tokenizer,
            chat,
            prefill_chunk: options.prefill_chunk.unwrap_or(512).max(1),
            context,
            cache: Mutex::new(None),
        })
    }

    pub fn model(&self) -> &dyn CausalLm {
        self.model.as_ref()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn device(&self) -> &Device {
        self.model.device()
    }

    /// The chat prompt of `messages` in the model's own template (ChatML when it has none).
    pub fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, LlmError> {
        Ok(self.chat.render(messages, add_generation_prompt, &Map::new())?)
    }

    /// [`Pipeline::render_chat`] with Qwen3's `enable_thinking` (`false` asks for a reply without
    /// a reasoning block).
    pub fn render_chat_thinking(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> Result<String, LlmError> {
        let extra: Map<String, Value> =
            [("enable_thinking".to_string(), Value::Bool(enable_thinking))].into_iter().collect();
        Ok(self.chat.render(messages, add_generation_prompt, &extra)?)
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, LlmError> {
        Ok(self.tokenizer.encode(text, add_special_tokens)?)
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, LlmError> {
        Ok(self.tokenizer.decode(ids, skip_special_tokens)?)
    }

    /// `generation_config.json`'s sampling values (temperature, top-k, top-p), with
    /// transformers' defaults (1.0, 50, 1.0) for those it does not set.
    pub fn default_sampling(&self) -> SamplingConfig {
        let g = &self.loaded.generation_config;
        SamplingConfig {
            temperature: g.temperature.unwrap_or(1.0) as f32,
            top_k: g.top_k.unwrap_or(50),
            top_p: g.top_p.unwrap_or(1.0) as f32,
            seed: None,
            min_p: 0.0,
        }
    }

    /// Settings from `generation_config.json`: its EOS ids, its sampling values when it says
    /// `do_sample`, its repetition penalty and `max_new_tokens` (else 32).
    pub fn default_generate_params(&self) -> GenerateParams {
        let g = &self.loaded.generation_config;
        GenerateParams {
            max_new_tokens: g.max_new_tokens.unwrap_or(32),
            eos_token_ids: self.loaded.default_eos_token_ids.clone(),
            sampling: g.do_sample.unwrap_or(false).then(|| self.default_sampling()),
            repetition_penalty: g.repetition_penalty.unwrap_or(1.0) as f32,
            ..Default::default()
        }
    }

    /// Greedy generation after `prompt`.
    pub fn generate_text(
        &self,
        prompt: &str,
        config: GreedyGenerationConfig,
        add_special_tokens: bool,
        skip_special_tokens: bool,
    ) -> Result<GeneratedText, LlmError> {
        self.generate(prompt, &config.into(), add_special_tokens, skip_special_tokens, |_, _| StreamControl::Continue)
    }

    /// Sampled generation after `prompt`.
    pub fn generate_text_sampled(
        &self,
        prompt: &str,
        config: SamplingGenerationConfig,
        add_special_tokens: bool,
        skip_special_tokens: bool,
    ) -> Result<GeneratedText, LlmError> {
        self.generate(prompt, &config.into(), add_special_tokens, skip_special_tokens, |_, _| StreamControl::Continue)
    }

    /// Generate after `prompt` with every setting, calling `on_token(id, piece)` for each
    /// generated token with the piece of reply text it completes: pieces end at character
    /// boundaries and never reveal part of a stop sequence, so a piece may be empty and a later
    /// one carry several tokens' text (the last call gets the rest, so the pieces add up to
    /// `generated_text`). Returning [`StreamControl::Stop`] ends generation after that token;
    /// text still held back then is in `generated_text` but was never handed out.
    pub fn generate(
        &self,
        prompt: &str,
        params: &GenerateParams,
        add_special_tokens: bool,
        skip_special_tokens: bool,
        on_token: impl FnMut(u32, &str) -> StreamControl,
    ) -> Result<GeneratedText, LlmError> {
        let ids = self.encode(prompt, add_special_tokens)?;
        if ids.is_empty() {
            return Err(LlmError::InvalidArgument("the prompt is empty (it encodes to no tokens)".into()));
        }
        self.generate_from_ids(&ids, params, skip_special_tokens, on_token)
    }

    /// [`Pipeline::generate`] from prompt token ids.
    pub fn generate_from_ids(
        &self,
        prompt_ids: &[u32],
        params: &GenerateParams,
        skip_special_tokens: bool,
        mut on_token: impl FnMut(u32, &str) -> StreamControl,
    ) -> Result<GeneratedText, LlmError> {
        params.validate_for(self.loaded.config.vocab_size)?;
        if prompt_ids.is_empty() {
            return Err(LlmError::InvalidArgument("the prompt has no tokens".into()));
        }
        let max_positions = self.loaded.config.max_position_embeddings;
        let needed = prompt_ids.len() + params.max_new_tokens;
        if needed > max_positions {
            return Err(LlmError::InvalidArgument(format!(
                "{} prompt tokens + {} new tokens exceed the model's {max_positions} positions",
                prompt_ids.len(),
                params.max_new_tokens
            )));
        }
        let mut cache = self.cache_for(needed)?;
        let cache = cache.as_mut().ok_or_else(|| LlmError::InvalidArgument("no KV cache".into()))?;
        let device = self.device().clone();
        let mut picker = TokenPicker::new(&device, params)?;

        let workspace = if params.max_new_tokens > 1 { Some(self.model.decode_workspace()?) } else { None };
        let start = Instant::now();
        let mut logits = self.model.forward(cache, prompt_ids, self.prefill_chunk, false)?;
        let mut history: Vec<u32> = prompt_ids.to_vec();
        let mut generated = Vec::new();
        let mut logprobs = Vec::new();
        let mut stream = TextStream::new(&params.stop_sequences);
        let mut reply;
        let (mut prefill_ms, mut decode_start) = (0.0, start);
        let stop = loop {
            let id = picker.pick(&logits, &history, generated.len())?;
            if let Some(lp) = picker.logprobs(&logits, id)? {
                logprobs.push(lp);
            }
            if generated.is_empty() {
                prefill_ms = start.elapsed().as_secs_f64() * 1e3;
                decode_start = Instant::now();
            }
            generated.push(id);
            history.push(id);
            reply = self.tokenizer.decode_generated(&generated, skip_special_tokens)?;
            let cut = stream.stop_at(&reply);
            if let Some(end) = cut {
                reply.truncate(end);
            }
            let ending = if cut.is_some() {
                Some(StopReason::StopSequence)
            } else if params.eos_token_ids.contains(&id) {
                Some(StopReason::Eos)
            } else if picker.grammar_finished() {
                Some(StopReason::Grammar)
            } else if generated.len() == params.max_new_tokens {
                Some(StopReason::Length)
            } else {
                None
            };
            // The last call also gets whatever text was held back.
            let control = on_token(id, stream.next(&reply, ending.is_some()));
            if let Some(reason) = ending.or((control == StreamControl::Stop).then_some(StopReason::Callback)) {
                break reason;
            }
            let workspace =
                workspace.as_ref().ok_or_else(|| LlmError::InvalidArgument("decoding without buffers".into()))?;
            logits = self.model.decode_step(cache, id, workspace)?;
        };
        let decode_seconds = decode_start.elapsed().as_secs_f64();
        let text = if stop == StopReason::StopSequence {
            self.tokenizer.decode_generated(prompt_ids, skip_special_tokens)? + &reply
        } else {
            self.tokenizer.decode_generated(&history, skip_special_tokens)?
        };
        let decoded_after_first = generated.len() - 1;
        Ok(GeneratedText {
            text,
            generated_text: reply,
            prompt_token_ids: prompt_ids.to_vec(),
            stopped_on_eos: stop == StopReason::Eos,
            stop_reason: stop,
            generated_token_ids: generated,
            prefill_ms,
            decode_tokens_per_second: if decoded_after_first == 0 || decode_seconds <= 0.0 {
                0.0
            } else {
                decoded_after_first as f64 / decode_seconds
            },
            logprobs,
        })
    }

    /// The logits (`f32`, row-major `[ids.len(), vocab]`) of every position of `ids` run from an
    /// empty cache, prefilled in chunks of `chunk` tokens: for checking against references.
    pub fn logits(&self, ids: &[u32], chunk: usize) -> Result<Vec<f32>, LlmError> {
        let mut cache = self.cache_for(ids.len())?;
        let cache = cache.as_mut().ok_or_else(|| LlmError::InvalidArgument("no KV cache".into()))?;
        Ok(self.model.forward(cache, ids, chunk, true)?.to_f32_vec()?)
    }

    /// The shared cache, emptied, with room for `positions`.
    fn cache_for(&self, positions: usize) -> Result<MutexGuard<'_, Option<Cache>>, LlmError> {
        let mut guard = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            Some(c) if c.capacity() >= positions => c.clear(),
            _ => {
                *guard = None;
                *guard = Some(self.model.new_cache_with_capacity(positions.max(self.context))?);
            }
        }
        Ok(guard)
    }
}

/// Chooses each next token on the device: repetition penalty, then argmax or sampling.
pub(crate) struct TokenPicker {
    sampling: Option<SamplingParams>,
    penalty: f32,
    presence: f32,
    frequency: f32,
    logit_bias: Vec<(u32, f32)>,
    /// With a penalty or a bias, the logits in f32 (transformers penalises its f32 copy of bf16
    /// logits).
    penalised: Option<Tensor>,
    /// With presence/frequency penalties, a logit bias or a constraint: the dense f32 `[vocab]`
    /// adjustment of this step, and the adjusted logits.
    adjustment: Option<(Tensor, Tensor)>,
    /// The response format's matcher: its mask is `-inf` in the adjustment, and it consumes
    /// each token picked.
    constraint: Option<ConstraintState>,
    chosen: Tensor,
    offsets: Tensor,
    argmax_workspace: Option<Tensor>,
    /// With logprobs requested: how many top tokens, and the `(chosen, ids, values)` buffers.
    logprobs: Option<usize>,
    logprob_buffers: Option<(Tensor, Tensor, Tensor)>,
}

impl TokenPicker {
    /// Greedy without a repetition penalty: a plain argmax of the logits.
    pub(crate) fn is_plain_greedy(&self) -> bool {
        self.sampling.is_none() && self.penalty == 1.0 && !self.adjusts()
    }

    /// Whether presence/frequency penalties, a logit bias or a constraint change the logits.
    fn adjusts(&self) -> bool {
        self.presence != 0.0 || self.frequency != 0.0 || !self.logit_bias.is_empty() || self.constraint.is_some()
    }

    /// Whether the constraint's grammar is complete: the generation must end after the token
    /// just picked.
    pub(crate) fn grammar_finished(&self) -> bool {
        self.constraint.as_ref().is_some_and(ConstraintState::is_finished)
    }

    pub(crate) fn new(device: &Device, params: &GenerateParams) -> Result<TokenPicker, LlmError> {
        let sampling = params.sampling.map(|s| SamplingParams {
            temperature: s.temperature,
            top_k: s.top_k as u32,
            top_p: s.top_p,
            seed: s.seed.unwrap_or_else(clock_seed),
            min_p: s.min_p,
        });
        Ok(TokenPicker {
            sampling,
            penalty: params.repetition_penalty,
            presence: params.presence_penalty,
            frequency: params.frequency_penalty,
            logit_bias: params.logit_bias.clone(),
            penalised: None,
            adjustment: None,
            constraint: params.constraint.as_ref().map(Constraint::start).transpose()?,
            chosen: Tensor::zeros(device, DType::U32, &[1])?,
            offsets: Tensor::zeros(device, DType::U64, &[1])?,
            argmax_workspace: None,
            logprobs: params.logprobs,
            logprob_buffers: None,
        })
    }

    /// With logprobs requested, those of `id` and the top tokens after `logits` (`[1, vocab]`,
    /// the model's raw logits of the step `id` was picked from); `None` (and no work) otherwise.
    pub(crate) fn logprobs(&mut self, logits: &Tensor, id: u32) -> Result<Option<TokenLogprobs>, LlmError> {
        let Some(n) = self.logprobs else { return Ok(None) };
        let device = logits.device().clone();
        // A vocabulary smaller than `n` offers all of it.
        let n = n.min(logits.shape()[1]);
        if self.logprob_buffers.as_ref().is_none_or(|(_, ids, _)| ids.shape()[1] != 1 + n) {
            self.logprob_buffers = Some((
                Tensor::zeros(&device, DType::U32, &[1])?,
                Tensor::zeros(&device, DType::U32, &[1, 1 + n])?,
                Tensor::zeros(&device, DType::F32, &[1, 1 + n])?,
            ));
        }
        let (chosen, ids, values) =
            self.logprob_buffers.as_ref().ok_or_else(|| LlmError::InvalidArgument("no logprobs buffers".into()))?;
        chosen.copy_from_slice(&[id])?;
        api::logprobs_into(&device.default_stream(), logits, chosen, n, ids, values)
            .map_err(|e| LlmError::op("logprobs", e))?;
        let (ids, values) = (ids.to_vec::<u32>()?, values.to_vec::<f32>()?);
        Ok(Some(TokenLogprobs {
            token: id,
            logprob: values[0],
            top: ids[1..].iter().copied().zip(values[1..].iter().copied()).collect(),
        }))
    }

    /// The token after `logits` (`[1, vocab]`), with `history` (prompt and reply so far)
    /// penalised; `step` numbers the draws of one generation.
    pub(crate) fn pick(&mut self, logits: &Tensor, history: &[u32], step: usize) -> Result<u32, LlmError> {
        let device = logits.device().clone();
        let stream = device.default_stream();
        let op = |what: &'static str| move |e| LlmError::op(what, e);
        // vLLM's order: the repetition penalty, then presence and frequency penalties, then the
        // logit bias (then temperature, top-k and top-p in the sampler), in f32.
        let logits = if self.penalty != 1.0 || self.adjusts() {
            if self.penalised.as_ref().is_none_or(|p| p.shape() != logits.shape()) {
                self.penalised = Some(Tensor::empty(&device, DType::F32, logits.shape())?);
            }
            let penalised =
                self.penalised.as_ref().ok_or_else(|| LlmError::InvalidArgument("no logits buffer".into()))?;
            api::cast_into(&stream, logits, penalised).map_err(op("logits to f32"))?;
            if self.penalty != 1.0 {
                let mut seen = HashSet::new();
                let unique: Vec<u32> = history.iter().copied().filter(|id| seen.insert(*id)).collect();
                let ids = Tensor::from_slice(&device, &unique, &[1, unique.len()])?;
                api::repetition_penalty_into(&stream, penalised, &ids, self.penalty)
                    .map_err(op("repetition penalty"))?;
            }
            if self.adjusts() {
                let vocab = logits.shape()[1];
                let mut delta = vec![0f32; vocab];
                let mut counts: HashMap<u32, u32> = HashMap::new();
                for &id in &history[history.len().saturating_sub(step)..] {
                    *counts.entry(id).or_default() += 1;
                }
                for (&id, &n) in &counts {
                    if let Some(d) = delta.get_mut(id as usize) {
                        *d -= self.presence + self.frequency * n as f32;
                    }
                }
                for &(id, bias) in &self.logit_bias {
                    let d = delta.get_mut(id as usize).ok_or_else(|| {
                        LlmError::InvalidArgument(format!(
                            "logit_bias: token id {id} is outside the vocabulary ({vocab})"
                        ))
                    })?;
                    *d += bias;
                }
                if let Some(c) = &mut self.constraint {
                    c.apply_mask(&mut delta)?;
                }
                if self.adjustment.as_ref().is_none_or(|(d, _)| d.numel() != vocab) {
                    self.adjustment = Some((
                        Tensor::zeros(&device, DType::F32, &[vocab])?,
                        Tensor::empty(&device, DType::F32, logits.shape())?,
                    ));
                }
                let (d, adjusted) =
                    self.adjustment.as_ref().ok_or_else(|| LlmError::InvalidArgument("no adjustment buffer".into()))?;
                d.copy_from_slice(&delta)?;
                api::add_bias_into(&stream, penalised, d, adjusted)
                    .map_err(op("presence/frequency penalty, logit bias"))?;
                adjusted
            } else {
                penalised
            }
        } else {
            logits
        };
        match &self.sampling {
            Some(params) => {
                self.offsets.copy_from_slice(&[step as u64])?;
                api::sample_into(&stream, logits, params, &self.offsets, &self.chosen)
                    .map_err(|e| LlmError::op("sampling", e))?;
            }
            None => {
                if self.argmax_workspace.is_none() {
                    let len = api::argmax_workspace_len(&device, 1, logits.shape()[1]);
                    self.argmax_workspace = (len > 0)
                        .then(|| Tensor::zeros(&device, DType::U64, &[len]).map_err(LlmError::from))
                        .transpose()?;
                }
                api::argmax_into(&stream, logits, &self.chosen, self.argmax_workspace.as_ref())
                    .map_err(|e| LlmError::op("argmax", e))?;
            }
        }
        let id = self.chosen.to_vec::<u32>()?[0];
        if let Some(c) = &mut self.constraint {
            c.consume(id)?;
        }
        Ok(id)
    }
}

/// A seed from the clock, for sampling without one.
fn clock_seed() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0x5eed)
}
