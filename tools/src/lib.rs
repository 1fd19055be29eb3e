//! `ruda-tools`: RUDA's command-line tools, apart from the libraries so that nothing the model
//! layer links carries them (or the PTX emulator `rudac run --engine ptx-emu` uses).
//!
//! - [`driver`]: the `rudac` command line (src/bin/rudac.rs): list, emit, check, run and tune
//!   the registered kernels;
//! - [`compile_bench`]: `rudac bench-compile`;
//! - [`profile`]: `rudac profile`, a kernel's counters, resources and roofline on the CPU;
//! - the `ruda-bench` binary (src/bin/ruda-bench.rs): op timings on a device, as JSON lines.

pub mod compile_bench;
pub mod driver;
pub mod profile;
