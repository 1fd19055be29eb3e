//! Repetition penalty over logits, in place (Hugging Face's `RepetitionPenaltyLogitsProcessor`).
//! Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;
