//! RMSNorm fused with the residual add before it, and RMSNorm alone, in Hugging Face's order of
//! roundings (`Qwen2RMSNorm`). Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;
