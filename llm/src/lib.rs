//! `ruda-llm`: RUDA's model layer. This part loads a Hugging Face model folder, never
//! downloading anything:
//!
//! | file | read by | gives |
//! | --- | --- | --- |
//! | `config.json` | [`load_config`] | [`ModelConfig`] for `qwen2` (Qwen2, Qwen2.5) and `qwen3`, with transformers' defaults; other model types, `quantization_config`, rope scaling and enabled sliding windows are errors |
//! | `model.safetensors`, or `model.safetensors.index.json` and its shards | [`Weights::load`] | memory-mapped tensors checked against [`expected_tensors`] (names, shapes, dtypes bf16/f16/f32), uploaded by [`Weights::upload`] from slices of the mappings |
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

mod chat;
mod config;
mod error;
mod generation;
pub mod safetensors;
mod tokenizer;
mod weights;

pub use chat::{ChatMessage, ChatTemplate, CHATML_TEMPLATE};
pub use config::{load_config, parse_config, ModelConfig, ModelType};
pub use error::LoadError;
pub use generation::GenerationConfig;
pub use tokenizer::Tokenizer;
pub use weights::{expected_tensors, ExpectedTensor, WeightInfo, Weights, EMBED_TOKENS, LM_HEAD};
