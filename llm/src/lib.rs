//! `ruda-llm`: RUDA's model layer. It loads a Hugging Face Qwen2 / Qwen2.5 / Qwen3 folder (never
//! downloading anything), runs the model from `ruda_ops` kernels (an architecture file over shared
//! layers behind [`CausalLm`], picked by `model_type` in [`architecture`]; a [`Cache`] per
//! sequence, chunked prefill, decode) and generates text through the [`Pipeline`] API: greedy,
//! sampled and streamed, with stop sequences and a repetition penalty.
//!
//! The files of a model folder:
//!
//! | file | read by | gives |
//! | --- | --- | --- |
//! | `config.json` | [`load_config`] | [`ModelConfig`] for `qwen2` (Qwen2, Qwen2.5) and `qwen3`, with transformers' defaults; other model types, `quantization_config`, rope scaling other than linear, dynamic and YaRN, and enabled sliding windows are errors |
//! | `model.safetensors`, or `model.safetensors.index.json` and its shards | [`Weights::load`] | memory-mapped tensors checked against [`expected_tensors`] (names, shapes, dtypes bf16/f16/f32), uploaded by the layers (through [`TensorSource`]) from slices of the mappings, each tensor refused as it is read if it holds NaN or infinities (`RUDA_CHECK_WEIGHTS`) |
//! | `tokenizer.json` | [`Tokenizer::load`] | encode / decode through the `tokenizers` crate (pure Rust) |
//! | `generation_config.json` | [`GenerationConfig::load`] | EOS ids and sampling defaults |
//! | `tokenizer_config.json` (or `chat_template.jinja`) | [`ChatTemplate::load`] | the model's Jinja chat template through minijinja, ChatML when there is none |
//!
//! Every failure is a [`LoadError`] naming the file (or tensor, or template) and what is wrong.
//!
//! ```
//! use ruda_llm::{ChatMessage, ChatTemplate};
//!
//! let chatml = ChatTemplate::chatml();
//! let text = chatml.render(&[ChatMessage::new("user", "Hi")], true, &Default::default()).unwrap();
//! assert_eq!(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
//! ```

pub mod batch;
pub mod bench_serve;
mod cache;
mod chat;
mod config;
pub mod constraint;
pub mod engine;
mod error;
pub mod example;
mod generate;
mod generation;
mod layers;
mod models;
mod pipeline;
pub mod profile;
pub mod safetensors;
mod tokenizer;
pub mod tune;
mod weights;

pub use batch::{
    BatchEvent, BatchKind, BatchOptions, BatchOutput, BatchRequest, BatchRunner, BatchSummary, ContinuousBatchConfig,
    ContinuousBatchScheduler, FinishedRequest, PageCopy, PagedKvCacheConfig, PrefixCacheBounds, PrefixCacheConfig,
    RequestId, RunnerEvent, ScheduledBatch, ScheduledSequence, SchedulerStats, SnapshotId,
};
pub use cache::{Cache, KvCache, LayerCache, LinearStatePool};
pub use chat::{ChatMessage, ChatTemplate, CHATML_TEMPLATE};
pub use config::{load_config, parse_config, ExpertsLayout, ModelConfig, ModelType, MoeConfig};
pub use constraint::{Constraint, ConstraintCompiler, ConstraintState, ResponseFormat};
pub use engine::{
    Engine, EngineConfig, EngineError, EngineEvent, EngineInfo, EngineMetrics, EngineOutput, EngineRequest,
    RequestHandle, Shutdown,
};
pub use error::{LlmError, LoadError};
pub use generate::{
    GenerateParams, GeneratedText, GreedyGenerationConfig, SamplingConfig, SamplingGenerationConfig, StopReason,
    StreamControl, TokenLogprobs, MAX_TOP_LOGPROBS,
};
pub use generation::GenerationConfig;
pub use layers::{
    AttentionShape, DecodeChoices, ExpectedTensor, LinearShape, PlannedLaunch, TensorSource, WeightDType, EMBED_TOKENS,
    LM_HEAD,
};
pub use models::{
    architecture, decode_bucket, Architecture, BatchCache, CausalLm, DecodeKernels, DecoderSpec, Qwen35BatchCache,
    Workspace,
};
pub use pipeline::{
    architecture_of, load_huggingface_qwen2_pipeline, load_huggingface_qwen35_pipeline,
    load_huggingface_qwen3_pipeline, load_pipeline, ChatRole, HuggingFaceLoadError, HuggingFaceQwen2Pipeline,
    HuggingFaceQwen35Pipeline, HuggingFaceQwen3Pipeline, LoadedModel, Pipeline, PipelineOptions, Qwen2ChatMessage,
    Qwen2ChatRole, Qwen35Cache, DEFAULT_CONTEXT,
};
pub use tokenizer::Tokenizer;
pub use weights::{expected_tensors, WeightInfo, Weights};
