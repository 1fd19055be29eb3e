//! `ruda-ops`: RUDA's kernel library, written once in the IR.
//!
//! - [`kernels`]: the kernel builders, one function per op family, configured by a struct;
//! - [`registry`]: every registered configuration (`rudac list`);
//! - [`sample`]: a small valid problem for each configuration (`rudac run`, differential tests).
//!
//! The `rudac` and `ruda-bench` tools live in `ruda-tools`.

pub mod api;
pub mod kernels;
pub mod registry;
pub mod sample;
pub mod tune;
