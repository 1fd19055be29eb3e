//! Performance estimates that need no GPU: the peaks of the GPUs we target ([`gpu`]), the
//! occupancy a kernel's resources allow ([`occupancy`]), and the roofline bound of a launch
//! ([`roofline`]). With the interpreter's counters (`ruda_ir::interp`) and the SASS opcode counts
//! of `ruda_codegen_ptx::sass` they make up what `rudac profile` reports.
//!
//! Where the inputs come from:
//!
//! - registers and static shared memory per thread block: `ptxas -v`
//!   (`ruda_codegen_ptx::ptxas::assemble`), plus the launch's dynamic shared memory and block
//!   size, feed [`occupancy::occupancy`];
//! - DRAM bytes (the distinct 32-byte sectors a launch touches) and flops: the interpreter's
//!   counters, feed [`roofline::roofline`] with the units the kernel's arithmetic runs on;
//! - the GPU: [`gpu::gpu`] by name (`a100`, `h100-sxm`, `h200`).
//!
//! Each is an estimate with stated limits:
//!
//! - [`gpu`]: datasheet and whitepaper peaks (boost clock, every SM busy), and one derived
//!   figure where NVIDIA publishes none: Hopper's `mma.sync` rate, assumed half of `wgmma`'s
//!   ([`gpu::HOPPER_MMA_SYNC_FRACTION`]). A real kernel reaches less: clocks drop under load,
//!   and no kernel keeps every unit busy.
//! - [`occupancy`]: the CUDA occupancy calculator's rules, so the theoretical occupancy: what
//!   the registers, shared memory and block size allow at the largest shared-memory carveout,
//!   not what a launch achieves (the driver may pick a smaller carveout; barriers and a grid too
//!   small to fill every SM lower it further). Occupancy is a means: a kernel with few warps
//!   and much instruction-level parallelism can still run at peak.
//! - [`roofline`]: the time a launch needs at least, `max(DRAM bytes / bandwidth, flops / peak)`.
//!   It counts each DRAM byte once (as if L2 caught every re-read), and ignores latency, launch
//!   overhead, shared-memory and L2 bandwidth, and tails, so it is a floor, never a prediction;
//!   a measured time far above it says where to look, not what is wrong.

pub mod gpu;
pub mod occupancy;
pub mod roofline;
