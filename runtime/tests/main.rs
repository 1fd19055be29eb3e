//! The runtime's integration tests in one binary. Tests that set environment variables or
//! count per-device state (module-cache hits, allocator statistics of a GPU) have binaries of
//! their own: `cuda_cache`, `cuda_dump`, `cuda_alloc` and `env_process`.
//! A new test file compiles only once it has a `mod` line here (the crate sets `autotests = false`).

mod common;

mod alloc;
mod autotune;
mod cache;
mod counters;
mod cuda;
mod device;
mod env;
mod events;
mod graphs;
mod launch_cpu;
mod nvrtc;
mod target;
mod tensor;
