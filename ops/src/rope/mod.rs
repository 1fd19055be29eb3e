//! Rotary position embedding in Hugging Face's rotate-half form, and its fusion with the KV-cache
//! append; `cos`/`sin` from a host-computed table. Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;
