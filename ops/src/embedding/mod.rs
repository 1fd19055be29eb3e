//! Embedding gather `out[t, :] = table[ids[t], :]` (bits copied; an id past the vocabulary
//! yields zeros). Builders in [`kernel`], entry points in [`api`].

pub mod api;
pub mod kernel;
