//! SwiGLU on a fused gate/up projection `[T, 2I]` → `[T, I]`, in `f32` rounded to the dtype.
//! Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;
