//! Performance estimates that need no GPU: the peaks of the GPUs we target ([`gpu`]), the
//! occupancy a kernel's resources allow ([`occupancy`]), and the roofline bound of a launch
//! ([`roofline`]).
//!
//! Each is an estimate with stated limits:
//!
//! - [`gpu`]: datasheet peaks (boost clock, every SM busy) and one measured or derived figure
//!   where the datasheet is silent (Hopper's `mma.sync` rate). A real kernel reaches less: clocks
//!   drop under load, and no kernel keeps every unit busy.
//! - [`roofline`]: the time a launch needs at least, `max(DRAM bytes / bandwidth, flops / peak)`.
//!   It ignores caches beyond DRAM (the bytes are the distinct sectors a launch must move at
//!   least once), latency, launch overhead and tails (a grid of a few blocks leaves SMs idle), so
//!   it is a floor, never a prediction.
//! - [`occupancy`]: the CUDA occupancy calculator's rules, so the theoretical occupancy: what
//!   the registers, shared memory and block size allow, not what a launch achieves (the
//!   carveout the driver picks, barriers and grid tails can lower it).

pub mod gpu;
pub mod occupancy;
pub mod roofline;
