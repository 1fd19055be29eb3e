//! The layer under devices, streams and buffers: the raw handle of a stream and the state one
//! CPU device shares among its handles. [`crate::Device`] holds these (with
//! [`crate::cuda::CudaCore`] for a GPU); streams and buffers are built on devices, tensors on
//! buffers and launches on tensors, so the modules depend on each other in one direction.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream;

use crate::alloc::{Allocator, HostMemory};

/// A stream without its device: an identity (unique in the process, what the allocator keys
/// blocks by) and, on a GPU, the driver's stream.
pub(crate) struct StreamCore {
    pub id: u64,
    pub cuda: Option<Arc<CudaStream>>,
    /// Whether launches are being recorded: checked on every launch, so that the record costs
    /// one relaxed load while it is off.
    pub recording: AtomicBool,
    pub record: Mutex<Vec<LaunchRecord>>,
}

impl StreamCore {
    pub fn new(cuda: Option<Arc<CudaStream>>) -> Arc<StreamCore> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Arc::new(StreamCore {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            cuda,
            recording: AtomicBool::new(false),
            record: Mutex::new(Vec::new()),
        })
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

/// What the clones of one [`crate::Device::cpu`] share: its caching allocator over host memory
/// and its default stream.
pub(crate) struct CpuCore {
    pub memory: Arc<Allocator<HostMemory>>,
    pub default_stream: Arc<StreamCore>,
}

impl CpuCore {
    pub fn new() -> CpuCore {
        CpuCore { memory: Arc::new(Allocator::new(HostMemory)), default_stream: StreamCore::new(None) }
    }
}
