//! `ruda-runtime`: devices, buffers, tensors, streams, kernel launches and the module cache.
//!
//! A [`Device`] is either a CUDA GPU or the CPU, where kernels run in the IR interpreter
//! (`ruda_ir::interp`), the semantic reference. [`Tensor`]s are strided views into device
//! [`Buffer`]s from a caching allocator. A [`Stream`] launches a [`ruda_ir::Kernel`] with [`Arg`]s: on a GPU the kernel
//! is compiled to PTX (once per [`ModuleKey`]), loaded and queued; on the CPU it is
//! interpreted before `launch` returns.
//!
//! ```
//! use ruda_runtime::{DType, Device, Tensor};
//!
//! # fn main() -> Result<(), ruda_runtime::RuntimeError> {
//! let device = Device::cpu();
//! let x = Tensor::from_slice(&device, &[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! assert_eq!(x.narrow(1, 1, 1)?.to_vec::<f32>()?, vec![2.0, 4.0]);
//! assert!(Tensor::zeros(&device, DType::F32, &[3])?.to_vec::<i32>().is_err()); // wrong dtype
//! # Ok(()) }
//! ```
//!
//! # Probing before `cudarc`
//!
//! `cudarc` panics when `libcuda` is missing, so nothing touches it before
//! [`probe_driver`] has opened `libcuda.so.1` (then `libcuda.so`) itself and called
//! `cuDriverGetVersion`, `cuInit` and `cuDeviceGetCount` successfully. Without a driver,
//! asking for a GPU is an error, never a panic.
//!
//! # Streams, events and memory
//!
//! Every [`Device`] handle on one GPU shares a context, a default stream, a module cache and
//! a caching allocator. [`Device::create_stream`] makes more streams (non-blocking CUDA
//! streams of that context); work on different streams may overlap, and [`Event`]s order it
//! ([`Stream::record_event`], [`Stream::wait_event`]) and time it ([`Event::elapsed_ms`]).
//! Nothing assumes one stream: allocations ([`Tensor::empty_on`], ...), copies
//! ([`Tensor::copy_from_slice_on`]) and readbacks ([`Tensor::to_vec_on`], which synchronise the
//! stream they read on) take a stream; the forms without one use the device's default stream to
//! allocate, and the buffer's own stream ([`Buffer::stream`], where it was allocated) to copy
//! and read. Data written on one stream and read on another needs an event between them.
//!
//! Buffers come from the device's caching allocator (host memory on the CPU device, with the
//! same bookkeeping): freed blocks are kept and reused, so buffers allocated every step do not
//! call the driver. Blocks are 256-byte aligned; a block freed after use on one stream is
//! reused on another only once the events recorded at its free have completed.
//! [`Device::create_memory_pool`] gives a private pool (for graph capture),
//! [`Device::memory_stats`] the counters, [`Device::release_cached_memory`] returns the cache
//! to the driver.
//!
//! [`Stream::start_launch_record`] and [`Stream::take_launch_record`] keep a list of the kernels
//! a stream launched ([`LaunchRecord`]: name, grid, block, dynamic shared memory), off unless
//! started, so that tests can compare what ran with a plan (the model's decode step).
//!
//! [`Stream::begin_capture`] and [`Stream::end_capture`] capture the kernels a stream launches
//! into a [`Graph`] that [`Graph::launch`] replays (a CUDA graph; on the CPU, the recorded
//! launches rerun over the buffers' contents at replay time); an allocation or host
//! synchronisation during capture is an error. [`Device::counters`] counts allocations, host
//! synchronisations and launches ([`RuntimeCounters`]), so tests prove a step capturable.
//!
//! Module layers, bottom up: `context` (raw stream handles, the CPU device's state) and `cuda`
//! (a GPU's shared state) under `device`; `stream` and `event` on devices; `buffer` on streams;
//! `tensor` on buffers; `launch` on tensors and streams.
//!
//! # Environment variables
//!
//! | variable | read by | values |
//! | --- | --- | --- |
//! | `RUDA_DEVICE` | [`Device::from_env`] | `auto` (default: CUDA device 0 when a driver and a device are present, else the interpreter; the choice and its reason go to stderr once), `cuda` (= `cuda:0`), `cuda:N`, `cpu`. Anything else is an error. |
//! | `RUDA_CUDA_COMPILER` | [`Device::cuda`], [`Device::from_env`] | `ptx` (default: `ruda-codegen-ptx`), `nvrtc` (`ruda-codegen-nvrtc`: IR → CUDA C++ → NVRTC → PTX; module-cache keys then carry NVRTC's version, and NVRTC's PTX ISA label is lowered to the driver's newest when it is higher and no version is forced). Anything else is an error. |
//! | `RUDA_NVRTC` | the first kernel compiled with `nvrtc` | path to `libnvrtc`; unset: the pinned copy of `scripts/install-cuda-tools.sh`, else the system's `libnvrtc.so.12`, then `libnvrtc.so.13`. Not found: an error listing where it looked. |
//! | `RUDA_PTX_VERSION` | [`Device::cuda`], [`Device::from_env`] | a PTX ISA version such as `8.0`; unset: the lowest the target and kernel need. An error when higher than the driver accepts or lower than the architecture needs. |
//! | `RUDA_DUMP_IR` | every module-cache miss on a GPU | a folder: the emitted PTX of each compiled kernel goes to `<folder>/<kernel>-<key fingerprint>.ptx`, with `nvrtc` its CUDA C++ to `<…>.cu` beside it |
//! | `RUDA_AUTOTUNE` | [`AutotuneMode::from_env`], [`Autotuner::for_device`] | `on` (default on CUDA: the first call of a tunable op for a new key benchmarks its candidates), `off` (each op's heuristic default). Always off on the CPU device. Anything else is an error. |
//! | `RUDA_CACHE_DIR` | [`cache_dir_from_env`] | the folder for RUDA's caches; autotuning results go to `<folder>/autotune/<device fingerprint>.json`. Unset: `$XDG_CACHE_HOME/ruda`, then `$HOME/.cache/ruda`. |
//! | `RUDA_INTERP_THREADS` | each launch on the CPU device, [`Device::from_env`] | the CPU threads the interpreter runs blocks on: a positive integer; unset: all cores. Anything else is an error naming the variable. |
//! | `RUDA_CUDA_GRAPHS` | [`graph_mode`] (the decode step of batched generation) | `on` (default: capture the warmed decode step into a graph and replay it), `off` (launch its kernels one by one). Anything else is an error, on every device. |
//! | `RUDA_PAGED_ATTENTION` | [`paged_attention_mode`], when `ruda_llm`'s `new_batch_cache` makes a batch cache | `legacy` (default: gather each sequence's KV pages into contiguous buffers, then the contiguous kernels), `fused` (the paged kernels read the pages in place). Anything else is an error, on every device; an existing cache keeps its path. |
//! | `RUDA_REQUIRE_GPU` | [`require_gpu`] (tests) | `1`: a missing GPU fails GPU tests instead of skipping them |
//!
//! [`Device::from_env`] validates all of these ([`check_env`]) whichever device it picks, so a
//! bad `RUDA_CUDA_COMPILER`, `RUDA_PTX_VERSION` or `RUDA_AUTOTUNE` is an error on the CPU device
//! too, where they have no effect.
//!
//! When the driver rejects PTX, the error carries the JIT log and the path of the PTX (the
//! `RUDA_DUMP_IR` copy, else one written under the system temporary folder, `ruda-ptx/`).

mod alloc;
mod autotune;
mod buffer;
mod cache;
mod context;
mod cuda;
mod device;
mod dtype;
mod env;
mod error;
mod event;
mod graph;
mod launch;
mod probe;
mod stream;
mod target;
mod tensor;

pub use alloc::MemoryStats;
pub use autotune::{
    alignment_class, bucket, cache_dir, cache_dir_from_env, measure_on_stream, median, Autotuner, CacheFile, Candidate,
    CandidateResult, CandidateSet, Choice, DeviceFingerprint, TuneEntry, TuneKey, RUDA_CACHE_DIR,
};
pub use buffer::Buffer;
pub use cache::{CacheStats, ModuleCache, ModuleKey};
pub use context::{LaunchRecord, RuntimeCounters};
pub use cuda::CudaDeviceInfo;
pub use device::{Device, DeviceKind, MemoryPool};
pub use dtype::{DType, Element};
pub use env::{
    check_env, graph_mode, paged_attention_mode, parse_interp_threads, parse_ptx_version, require_gpu, AutotuneMode,
    Compiler, DeviceSpec, GraphMode, PagedAttentionMode, RUDA_AUTOTUNE, RUDA_CUDA_GRAPHS, RUDA_INTERP_THREADS,
    RUDA_PAGED_ATTENTION,
};
pub use error::{ModuleLoadError, Result, RuntimeError};
pub use event::Event;
pub use graph::Graph;
pub use launch::{Arg, HashedKernel, Launchable};
pub use probe::{probe_driver, DriverProbe};
pub use stream::Stream;
pub use target::{max_ptx_for_driver, ptx_text_version, select_arch, select_target, CudaVersion};
pub use tensor::Tensor;

pub use ruda_codegen_ptx::{Arch, PtxVersion, Target};
pub use ruda_ir::interp::LaunchConfig;

#[cfg(test)]
mod layering {
    /// Every module of the crate with its source.
    const MODULES: &[(&str, &str)] = &[
        ("alloc", include_str!("alloc.rs")),
        ("autotune", include_str!("autotune.rs")),
        ("buffer", include_str!("buffer.rs")),
        ("cache", include_str!("cache.rs")),
        ("context", include_str!("context.rs")),
        ("cuda", include_str!("cuda.rs")),
        ("device", include_str!("device.rs")),
        ("dtype", include_str!("dtype.rs")),
        ("env", include_str!("env.rs")),
        ("error", include_str!("error.rs")),
        ("event", include_str!("event.rs")),
        ("graph", include_str!("graph.rs")),
        ("launch", include_str!("launch.rs")),
        ("probe", include_str!("probe.rs")),
        ("stream", include_str!("stream.rs")),
        ("target", include_str!("target.rs")),
        ("tensor", include_str!("tensor.rs")),
    ];

    /// The modules `source` names as `crate::<module>` outside comments.
    fn imports(source: &str) -> Vec<&'static str> {
        let code: Vec<&str> = source.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
        MODULES
            .iter()
            .map(|(name, _)| *name)
            .filter(|name| {
                let needle = format!("crate::{name}");
                code.iter().any(|l| {
                    l.match_indices(&needle).any(|(i, _)| {
                        !l[i + needle.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                    })
                })
            })
            .collect()
    }

    /// Dependencies point one way: `device` does not import `stream`, `stream` not `tensor`...
    #[test]
    fn modules_import_each_other_without_a_cycle() {
        let graph: Vec<(&str, Vec<&str>)> = MODULES.iter().map(|(name, src)| (*name, imports(src))).collect();
        let edges = |m: &str| graph.iter().find(|(n, _)| *n == m).map(|(_, e)| e.clone()).unwrap_or_default();
        // Depth-first search from each module, failing on a path back to a module on the stack.
        fn visit<'a>(m: &'a str, stack: &mut Vec<&'a str>, edges: &dyn Fn(&str) -> Vec<&'a str>) {
            if let Some(i) = stack.iter().position(|s| *s == m) {
                panic!("import cycle: {} -> {m}", stack[i..].join(" -> "));
            }
            stack.push(m);
            for next in edges(m) {
                visit(next, stack, edges);
            }
            stack.pop();
        }
        for (name, _) in MODULES {
            visit(name, &mut Vec::new(), &edges);
        }
        assert!(imports("use crate::device::Device;\n// crate::stream\n").contains(&"device"));
        assert_eq!(imports("// use crate::stream::Stream;\nuse crate::devices;\n"), Vec::<&str>::new());
        assert!(edges("tensor").contains(&"buffer") && !edges("device").contains(&"stream"));
    }
}
