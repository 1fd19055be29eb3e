//! The integration tests of `ruda-llm`, one module per area, in one binary.
//! A new test file compiles only once it has a `mod` line here (the crate sets `autotests = false`).

mod bad_inputs;
mod batch_executor;
mod batch_scheduler;
mod bench_serve;
mod chat_goldens;
mod cli;
mod common;
mod constraint;
mod decode_graph;
mod decode_plan;
mod engine;
mod loading;
mod model_goldens;
mod moe;
mod pipeline;
mod profile;
mod rope_scaling;
mod text;
mod tokenizer_goldens;
