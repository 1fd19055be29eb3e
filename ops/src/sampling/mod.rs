//! Sampling one token per row with temperature, top-k and top-p, reproducibly per seed (the
//! algorithm is documented in [`kernel`]). Entry points in [`api`].

pub mod api;
pub mod kernel;
