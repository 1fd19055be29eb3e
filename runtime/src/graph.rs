//! Graph capture: record the kernels a stream launches once, replay them many times with one
//! call (a CUDA graph: `cuStreamBeginCapture_v2` in thread-local mode, `cuStreamEndCapture`,
//! `cuGraphInstantiateWithFlags`, `cuGraphLaunch`). On the CPU device the capture keeps each
//! launch (kernel, grid, scalars, buffer arguments by handle) without running it, and a replay
//! runs them in order, reading the buffers' contents at replay time, as a GPU replay does.
//!
//! While a stream captures, whatever a graph cannot hold is an error that ends the capture (CUDA
//! would invalidate it), on every device: an allocation on that stream, a synchronisation of
//! it, a read from it (which synchronises), a copy from host memory on it (a graph would copy
//! from that host address again at every replay), and a device or event synchronisation of its
//! device. The error names the call; [`Stream::end_capture`] then reports it too.

use std::fmt;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext};

use crate::buffer::Buffer;
use crate::context::{ActiveCapture, Capture, Replay, StreamCore};
use crate::cuda::describe;
use crate::device::Device;
use crate::error::{Result, RuntimeError};
use crate::stream::Stream;

impl Stream {
    /// Start capturing: kernels launched on this stream from now on are recorded into a graph
    /// instead of running, until [`Stream::end_capture`]. Kernels must be compiled (launched
    /// once) and tuned before, and buffers allocated before: see the module documentation.
    pub fn begin_capture(&self) -> Result<()> {
        let op = || format!("beginning a graph capture on {self:?}");
        let mut c = self.core().capture();
        match &*c {
            Capture::Active(_) => {
                return Err(RuntimeError::GraphCapture { op: op(), message: "the stream is capturing already".into() })
            }
            Capture::Invalidated(reason) => {
                return Err(RuntimeError::GraphCapture {
                    op: op(),
                    message: format!("the last capture was ended by {reason} and not closed with end_capture yet"),
                })
            }
            Capture::Idle => {}
        }
        if let Some(s) = self.cuda() {
            s.context().bind_to_thread().map_err(|e| RuntimeError::driver(op(), describe(e)))?;
            // SAFETY: a live stream of this context. Thread-local mode: this thread's calls that
            // could not be captured fail instead of being silently run.
            unsafe {
                result::stream::begin_capture(
                    s.cu_stream(),
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            }
            .map_err(|e| RuntimeError::driver(op(), describe(e)))?;
        }
        *c = Capture::Active(ActiveCapture::default());
        drop(c);
        self.device().counters_core().capturing().push(Arc::clone(self.core()));
        Ok(())
    }

    /// Stop capturing and return the graph of the kernels launched since
    /// [`Stream::begin_capture`]. An error when no capture was begun, or when a forbidden call
    /// ended it (the error names that call).
    pub fn end_capture(&self) -> Result<Graph> {
        let op = || format!("ending a graph capture on {self:?}");
        let state = std::mem::take(&mut *self.core().capture());
        self.forget_capture();
        let active = match state {
            Capture::Active(a) => a,
            Capture::Idle => {
                return Err(RuntimeError::GraphCapture { op: op(), message: "no capture was begun".into() })
            }
            Capture::Invalidated(reason) => {
                return Err(RuntimeError::GraphCapture {
                    op: op(),
                    message: format!("the capture was ended by {reason}, which a graph cannot contain"),
                })
            }
        };
        let ActiveCapture { replays, kernels, buffers, deferred } = active;
        let body = match self.cuda() {
            None => GraphBody::Cpu(replays),
            Some(s) => {
                let ctx = Arc::clone(s.context());
                let ended = ctx.bind_to_thread().and_then(|()| {
                    // SAFETY: the stream is live and capturing (begun above).
                    unsafe { result::stream::end_capture(s.cu_stream()) }
                });
                deferred.into_iter().for_each(|f| f());
                let graph = ended.map_err(|e| RuntimeError::driver(op(), describe(e)))?;
                if graph.is_null() {
                    return Err(RuntimeError::GraphCapture {
                        op: op(),
                        message: "the driver invalidated the capture (a call on this thread it cannot capture)".into(),
                    });
                }
                // SAFETY: a graph the driver just handed to us.
                let exec = match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
                    Ok(exec) => exec,
                    Err(e) => {
                        // SAFETY: ours, not instantiated, destroyed once.
                        ctx.record_err(unsafe { result::graph::destroy(graph) });
                        return Err(RuntimeError::driver(
                            format!("instantiating the graph captured on {self:?}"),
                            describe(e),
                        ));
                    }
                };
                GraphBody::Cuda(Mutex::new(CudaGraph { ctx, graph, exec }))
            }
        };
        let mut kept: Vec<Buffer> = Vec::new();
        for b in buffers.into_iter().filter_map(|b| b.downcast::<Buffer>().ok()) {
            if !kept.iter().any(|k| k.same_memory(&b)) {
                kept.push(*b);
            }
        }
        Ok(Graph { device: self.device().clone(), kernels, body, buffers: kept })
    }

    /// An error naming `op` when this stream is capturing (the capture is ended first), since
    /// a graph cannot contain it: allocations, synchronisations, host copies on the stream.
    pub(crate) fn forbid_in_capture(&self, op: impl FnOnce() -> String) -> Result<()> {
        if !self.core().is_capturing() {
            return Ok(());
        }
        let op = op();
        let ended = self.core().abort_capture(&op);
        self.forget_capture();
        if !ended {
            return Ok(()); // another thread ended the capture meanwhile
        }
        Err(RuntimeError::GraphCapture {
            op,
            message: format!(
                "not allowed while {self:?} captures a graph (CUDA would invalidate the capture); the capture is ended: \
                 allocate, copy from the host and read back before begin_capture or between replays"
            ),
        })
    }

    /// Drop this stream from its device's list of capturing streams.
    fn forget_capture(&self) {
        let id = self.core().id;
        self.device().counters_core().capturing().retain(|s| s.id != id);
    }
}

impl Device {
    /// An error naming `op` when a stream of this device is capturing (each such capture is
    /// ended first): for what waits on the whole device or on an event.
    pub(crate) fn forbid_in_capture(&self, op: impl FnOnce() -> String) -> Result<()> {
        let streams: Vec<Arc<StreamCore>> = std::mem::take(&mut *self.counters_core().capturing());
        if streams.is_empty() {
            return Ok(());
        }
        let op = op();
        let ids: Vec<String> = streams.iter().map(|s| format!("#{}", s.id)).collect();
        streams.iter().for_each(|s| {
            s.abort_capture(&op);
        });
        Err(RuntimeError::GraphCapture {
            op,
            message: format!(
                "not allowed while stream(s) {} of {self} capture a graph (CUDA would invalidate the capture); the capture is ended",
                ids.join(", ")
            ),
        })
    }
}

/// Kernels captured on a stream ([`Stream::end_capture`]), replayed by [`Graph::launch`] on any
/// stream of the same device. It keeps the buffers they use alive, since it replays their
/// addresses; what they hold is read at each replay, so write new inputs into the same buffers
/// (stream-ordered, before the replay) to run the graph on them.
pub struct Graph {
    device: Device,
    kernels: usize,
    body: GraphBody,
    /// Each buffer its kernels use, once.
    buffers: Vec<Buffer>,
}

enum GraphBody {
    Cpu(Vec<Replay>),
    /// CUDA graph objects are not internally synchronised: one launch at a time.
    Cuda(Mutex<CudaGraph>),
}

struct CudaGraph {
    ctx: Arc<CudaContext>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: the handles are used from one thread at a time (behind the mutex), each use binding
// the context first, as the driver's thread-safety rules for graphs require.
unsafe impl Send for CudaGraph {}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: both were created by `end_capture`, are ours alone and are destroyed once.
        self.ctx.record_err(unsafe { result::graph::exec_destroy(self.exec) });
        self.ctx.record_err(unsafe { result::graph::destroy(self.graph) });
    }
}

impl Graph {
    /// Replay the graph on `stream` (queued after its earlier work on a GPU; run before this
    /// returns on the CPU). Counts its kernels as launches; allocates and synchronises nothing.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        stream.check_device("Graph::launch", &self.device)?;
        if !matches!(*stream.core().capture(), Capture::Idle) {
            return Err(RuntimeError::GraphCapture {
                op: format!("launching a graph on {stream:?}"),
                message:
                    "the stream is capturing (or its capture was ended and not closed); replay it after end_capture"
                        .into(),
            });
        }
        match (&self.body, stream.cuda()) {
            (GraphBody::Cpu(replays), None) => {
                for replay in replays {
                    replay()?;
                }
            }
            (GraphBody::Cuda(g), Some(s)) => {
                // Their blocks are then fenced on this stream too when they are freed.
                self.buffers.iter().for_each(|b| b.note_use(stream));
                let g = g.lock().unwrap_or_else(|p| p.into_inner());
                let fail = |e| RuntimeError::driver(format!("launching a graph on {stream:?}"), describe(e));
                g.ctx.bind_to_thread().map_err(fail)?;
                // SAFETY: an instantiated graph of this context on a live stream of it; the
                // buffers its kernels use are kept alive by `self`.
                unsafe { result::graph::launch(g.exec, s.cu_stream()) }.map_err(fail)?;
            }
            _ => {
                return Err(RuntimeError::DeviceMismatch {
                    op: "Graph::launch".into(),
                    message: "a graph and a stream of different kinds of device".into(),
                })
            }
        }
        self.device.counters_core().launched(self.kernels as u64);
        Ok(())
    }

    /// The kernels it holds.
    pub fn launches(&self) -> usize {
        self.kernels
    }

    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Graph({} kernels on {})", self.kernels, self.device)
    }
}
