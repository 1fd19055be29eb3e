//! `ruda-ops`: RUDA's kernel library, written once in the IR.
//!
//! - [`kernels`]: the kernel builders, one function per op family, configured by a struct;
//! - [`registry`]: every registered configuration (`rudac list`);
//! - [`sample`]: a small valid problem for each configuration (`rudac run`, differential tests);
//! - the `rudac` binary (src/bin/rudac.rs): list, emit, check and run the registered kernels.

pub mod api;
pub mod compile_bench;
pub mod driver;
pub mod kernels;
pub mod registry;
pub mod sample;
pub mod tune;
