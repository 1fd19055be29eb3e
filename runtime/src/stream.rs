//! Streams: ordered queues of work on one device. A device has a default stream, and callers
//! create more ([`Device::create_stream`]); work on different streams may overlap, and events
//! ([`crate::Event`]) order it across streams.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::context::{LaunchRecord, StreamCore};
use crate::cuda::describe;
use crate::device::Device;
use crate::error::{Result, RuntimeError};

/// An ordered queue of work on one device. Cheap to clone; clones are the same stream.
///
/// CUDA: a non-blocking stream of the device's context: it does not synchronise with the
/// legacy default stream or with other streams. CPU: every operation (a launch, a copy) runs
/// to completion before it returns, so CPU streams are ordered by the calling threads.
#[derive(Clone)]
pub struct Stream {
    device: Device,
    core: Arc<StreamCore>,
}

impl Device {
    /// The stream every handle on this device shares: what operations without a stream
    /// argument use. Nothing requires it; see [`Device::create_stream`].
    pub fn default_stream(&self) -> Stream {
        Stream { device: self.clone(), core: Arc::clone(self.default_stream_core()) }
    }

    /// A new stream on this device (CUDA: a new non-blocking stream on the device's context).
    pub fn create_stream(&self) -> Result<Stream> {
        let cuda = match self.cuda_core() {
            None => None,
            Some(core) => Some(
                core.ctx
                    .new_stream()
                    .map_err(|e| RuntimeError::driver(format!("creating a stream on {self}"), describe(e)))?,
            ),
        };
        Ok(Stream { device: self.clone(), core: StreamCore::new(cuda) })
    }
}

impl Stream {
    pub(crate) fn from_core(device: Device, core: Arc<StreamCore>) -> Stream {
        Stream { device, core }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether two handles are the same stream.
    pub fn same_stream(&self, other: &Stream) -> bool {
        self.core.id == other.core.id
    }

    pub(crate) fn core(&self) -> &Arc<StreamCore> {
        &self.core
    }

    /// The driver's stream (GPU streams only).
    pub(crate) fn cuda(&self) -> Option<&Arc<CudaStream>> {
        self.core.cuda.as_ref()
    }

    /// Wait for all work queued on this stream. Errors of earlier launches (illegal addresses,
    /// ...) surface here.
    pub fn synchronize(&self) -> Result<()> {
        self.forbid_in_capture(|| format!("synchronising {self:?}"))?;
        self.device.counters_core().host_sync();
        match self.cuda() {
            None => Ok(()),
            Some(s) => s.synchronize().map_err(|e| {
                RuntimeError::driver(
                    format!("synchronising a stream of {} (an earlier kernel may have failed)", self.device),
                    describe(e),
                )
            }),
        }
    }

    /// Start recording the kernels launched on this stream (through any handle of it), dropping
    /// an earlier record. Off unless started: a launch then pays one atomic load for it.
    pub fn start_launch_record(&self) {
        self.core.record.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.core.recording.store(true, Ordering::Release);
    }

    /// Stop recording and return the launches made since [`Stream::start_launch_record`], in
    /// the order they were queued (empty when it was not started).
    pub fn take_launch_record(&self) -> Vec<LaunchRecord> {
        self.core.recording.store(false, Ordering::Release);
        std::mem::take(&mut *self.core.record.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Add a launch to the record when one is being kept.
    pub(crate) fn note_launch(&self, launch: impl FnOnce() -> LaunchRecord) {
        if self.core.recording.load(Ordering::Acquire) {
            let launch = launch();
            self.core.record.lock().unwrap_or_else(|e| e.into_inner()).push(launch);
        }
    }

    /// An error naming `op` unless `device` is this stream's device (data and stream must match).
    pub(crate) fn check_device(&self, op: &str, device: &Device) -> Result<()> {
        if self.device.same_device(device) {
            return Ok(());
        }
        Err(RuntimeError::DeviceMismatch {
            op: op.into(),
            message: format!("the data is on {device}, the stream on {}", self.device),
        })
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream(#{} on {})", self.core.id, self.device)
    }
}
