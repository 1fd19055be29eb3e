//! The layer under devices, streams and buffers: the raw handle of a stream and the state one
//! CPU device shares among its handles. [`crate::Device`] holds these (with
//! [`crate::cuda::CudaCore`] for a GPU); streams and buffers are built on devices, tensors on
//! buffers and launches on tensors, so the modules depend on each other in one direction.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, CudaStream};

use crate::alloc::{Allocator, HostMemory};
use crate::error::Result;

/// A stream without its device: an identity (unique in the process, what the allocator keys
/// blocks by) and, on a GPU, the driver's stream.
pub(crate) struct StreamCore {
    pub id: u64,
    pub cuda: Option<Arc<CudaStream>>,
    /// Whether launches are being recorded: checked on every launch, so that the record costs
    /// one relaxed load while it is off.
    pub recording: AtomicBool,
    pub record: Mutex<Vec<LaunchRecord>>,
    /// Graph capture on this stream ([`crate::Stream::begin_capture`]).
    pub capture: Mutex<Capture>,
}

/// A launch recorded by a capture on the CPU device: runs the kernel over the buffers it was
/// given, reading their contents when it runs.
pub(crate) type Replay = Box<dyn Fn() -> Result<()> + Send + Sync>;

/// Where a stream stands with graph capture.
#[derive(Default)]
pub(crate) enum Capture {
    #[default]
    Idle,
    Active(ActiveCapture),
    /// A forbidden call ended the capture; `end_capture` reports it.
    Invalidated(String),
}

/// What a capture in progress has collected.
#[derive(Default)]
pub(crate) struct ActiveCapture {
    /// The CPU device's recorded launches, in order (empty on a GPU, where the driver records).
    pub replays: Vec<Replay>,
    /// Kernels captured so far.
    pub kernels: usize,
    /// The buffers the captured kernels use, kept alive by the graph: it replays their
    /// addresses, so nobody else may be handed their blocks while it lives.
    pub buffers: Vec<Box<dyn std::any::Any + Send + Sync>>,
    /// Work that cannot run while the stream captures (a GPU buffer's free records a fence on
    /// its streams): done once the capture ends.
    pub deferred: Vec<Box<dyn FnOnce() + Send>>,
}

impl StreamCore {
    pub fn new(cuda: Option<Arc<CudaStream>>) -> Arc<StreamCore> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Arc::new(StreamCore {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            cuda,
            recording: AtomicBool::new(false),
            record: Mutex::new(Vec::new()),
            capture: Mutex::new(Capture::Idle),
        })
    }

    pub fn capture(&self) -> std::sync::MutexGuard<'_, Capture> {
        self.capture.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_capturing(&self) -> bool {
        matches!(*self.capture(), Capture::Active(_))
    }

    /// End the capture in progress because of `reason` (what CUDA does by invalidating it): on
    /// a GPU the driver's capture is ended and its graph destroyed; deferred work runs; the
    /// stream then works normally and `end_capture` reports `reason`. Whether one was active.
    pub fn abort_capture(&self, reason: &str) -> bool {
        let active = {
            let mut c = self.capture();
            if !matches!(*c, Capture::Active(_)) {
                return false;
            }
            std::mem::replace(&mut *c, Capture::Invalidated(reason.to_string()))
        };
        if let Some(s) = &self.cuda {
            let ctx = s.context();
            ctx.record_err(ctx.bind_to_thread());
            // SAFETY: the stream is live and capturing (begun by `begin_capture`).
            match unsafe { result::stream::end_capture(s.cu_stream()) } {
                // SAFETY: the graph was just handed to us and nothing else holds it.
                Ok(graph) if !graph.is_null() => ctx.record_err(unsafe { result::graph::destroy(graph) }),
                Ok(_) => {}
                Err(e) => ctx.record_err(Err::<(), _>(e)),
            }
        }
        if let Capture::Active(a) = active {
            a.deferred.into_iter().for_each(|f| f());
        }
        true
    }
}

/// One kernel launch a stream's launch record kept ([`crate::Stream::start_launch_record`]):
/// what tests compare with a plan of launches (the model's decode step, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchRecord {
    /// The kernel's name (an op configuration's id with `.` written `_`).
    pub kernel: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
}

/// What the runtime did on one device so far ([`crate::Device::counters`]): what a captured
/// CUDA graph cannot contain (allocations, host synchronisations) and what it replays
/// (launches). Monotone; compare two readings with [`RuntimeCounters::since`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeCounters {
    /// Buffers handed out, whether the caching allocator reused a block or called the driver:
    /// a graph replays fixed addresses, so even a reuse from the pool is a new address.
    pub allocations: u64,
    /// Times the host waited for the device: stream, device and event synchronisations and
    /// every device-to-host read (which synchronises its stream). Counted on the CPU device
    /// too, where they return at once, so that CPU tests find what would block on a GPU.
    pub host_syncs: u64,
    /// Kernels queued for execution, including each kernel a graph replay runs; a launch
    /// recorded into a graph under capture is not counted until the graph runs.
    pub launches: u64,
}

impl RuntimeCounters {
    /// What happened between the reading `earlier` and this one.
    pub fn since(&self, earlier: &RuntimeCounters) -> RuntimeCounters {
        RuntimeCounters {
            allocations: self.allocations.saturating_sub(earlier.allocations),
            host_syncs: self.host_syncs.saturating_sub(earlier.host_syncs),
            launches: self.launches.saturating_sub(earlier.launches),
        }
    }
}

/// The live counters behind [`RuntimeCounters`], one set per device (shared by its handles),
/// and the device's streams that are capturing a graph.
#[derive(Default)]
pub(crate) struct Counters {
    allocations: AtomicU64,
    host_syncs: AtomicU64,
    launches: AtomicU64,
    pub capturing: Mutex<Vec<Arc<StreamCore>>>,
}

impl Counters {
    pub fn allocation(&self) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn host_sync(&self) {
        self.host_syncs.fetch_add(1, Ordering::Relaxed);
    }

    pub fn launched(&self, kernels: u64) {
        self.launches.fetch_add(kernels, Ordering::Relaxed);
    }

    /// The streams of this device capturing a graph now.
    pub fn capturing(&self) -> std::sync::MutexGuard<'_, Vec<Arc<StreamCore>>> {
        self.capturing.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn read(&self) -> RuntimeCounters {
        RuntimeCounters {
            allocations: self.allocations.load(Ordering::Relaxed),
            host_syncs: self.host_syncs.load(Ordering::Relaxed),
            launches: self.launches.load(Ordering::Relaxed),
        }
    }
}

/// What the clones of one [`crate::Device::cpu`] share: its caching allocator over host memory,
/// its default stream and its counters.
pub(crate) struct CpuCore {
    pub memory: Arc<Allocator<HostMemory>>,
    pub default_stream: Arc<StreamCore>,
    pub counters: Counters,
}

impl CpuCore {
    pub fn new() -> CpuCore {
        CpuCore {
            memory: Arc::new(Allocator::new(HostMemory)),
            default_stream: StreamCore::new(None),
            counters: Counters::default(),
        }
    }
}
