//! Device memory: a block of the device's caching allocator (host memory on the CPU device).
//!
//! A buffer is allocated on a stream, its home: operations without a stream argument (copies,
//! readbacks) use that one. When it drops, its block goes back to the allocator with a fence
//! recorded on its home stream and on every other stream a kernel used it on, so that the
//! block is reused elsewhere only once that work is done.

use std::ops::{Deref, DerefMut, Range};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{result, CudaEvent};

use crate::alloc::{Allocation, Allocator, HostMemory};
use crate::context::StreamCore;
use crate::cuda::{describe, DeviceMemory};
use crate::device::{pool_id, Device, MemoryPool};
use crate::error::{Result, RuntimeError};
use crate::stream::Stream;

/// A block of memory on one device. Cheap to clone (the clones share the memory); tensors are
/// views into a buffer.
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<BufferInner>,
}

struct BufferInner {
    device: Device,
    len: usize,
    /// The stream it was allocated on.
    stream: Arc<StreamCore>,
    /// Other streams kernels used it on: each gets a fence when the buffer drops.
    used_on: Mutex<Vec<Arc<StreamCore>>>,
    block: Allocation,
    storage: Storage,
}

enum Storage {
    /// `lock` is held by a CPU launch for the duration of the interpreter run, and by copies.
    Host {
        memory: Arc<Allocator<HostMemory>>,
        lock: Mutex<()>,
    },
    Cuda {
        memory: Arc<Allocator<DeviceMemory>>,
    },
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes on {})", self.inner.len, self.inner.device)
    }
}

/// Exclusive access to a CPU buffer's bytes.
pub(crate) struct HostGuard<'a> {
    _lock: MutexGuard<'a, ()>,
    bytes: &'a mut [u8],
}

impl Deref for HostGuard<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl DerefMut for HostGuard<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.bytes
    }
}

impl Buffer {
    /// `len` zero bytes, on the device's default stream.
    pub fn zeros(device: &Device, len: usize) -> Result<Buffer> {
        Buffer::zeros_on(&device.default_stream(), len)
    }

    /// `len` bytes of unspecified content (zeros on the CPU), on the device's default stream:
    /// for outputs a kernel overwrites.
    pub fn uninit(device: &Device, len: usize) -> Result<Buffer> {
        Buffer::uninit_on(&device.default_stream(), len)
    }

    /// A buffer holding a copy of `bytes`, on the device's default stream.
    pub fn from_bytes(device: &Device, bytes: &[u8]) -> Result<Buffer> {
        Buffer::from_bytes_on(&device.default_stream(), bytes)
    }

    /// `len` zero bytes, allocated and zeroed in `stream`'s order.
    pub fn zeros_on(stream: &Stream, len: usize) -> Result<Buffer> {
        Buffer::alloc(stream, None, len, true)
    }

    /// `len` bytes of unspecified content (zeros on the CPU), usable in `stream`'s order.
    pub fn uninit_on(stream: &Stream, len: usize) -> Result<Buffer> {
        Buffer::alloc(stream, None, len, false)
    }

    /// [`Buffer::uninit_on`] in a private pool of the stream's device.
    pub fn uninit_in(pool: &MemoryPool, stream: &Stream, len: usize) -> Result<Buffer> {
        Buffer::alloc(stream, Some(pool), len, false)
    }

    /// A buffer holding a copy of `bytes`, copied in `stream`'s order.
    pub fn from_bytes_on(stream: &Stream, bytes: &[u8]) -> Result<Buffer> {
        let b = Buffer::alloc(stream, None, bytes.len(), false)?;
        b.write_on(stream, 0, bytes)?;
        Ok(b)
    }

    fn alloc(stream: &Stream, pool: Option<&MemoryPool>, len: usize, zeroed: bool) -> Result<Buffer> {
        let device = stream.device();
        if let Some(p) = pool {
            if !p.device().shares_allocator(device) {
                return Err(RuntimeError::DeviceMismatch {
                    op: "allocating a buffer".into(),
                    message: format!("the memory pool is on another device than the stream ({device})"),
                });
            }
        }
        let oom = |e: String| RuntimeError::driver(format!("allocating {len} bytes on {device}"), e);
        let id = stream.core().id;
        let (block, storage) = match (device.cpu_core(), device.cuda_core()) {
            (Some(cpu), _) => {
                let block = cpu.memory.allocate(pool_id(pool), len, id).map_err(oom)?;
                (block, Storage::Host { memory: Arc::clone(&cpu.memory), lock: Mutex::new(()) })
            }
            (None, Some(core)) => {
                let block = core.memory.allocate(pool_id(pool), len, id).map_err(oom)?;
                (block, Storage::Cuda { memory: Arc::clone(&core.memory) })
            }
            (None, None) => return Err(oom("the device has neither host nor GPU memory".into())),
        };
        let buffer = Buffer {
            inner: Arc::new(BufferInner {
                device: device.clone(),
                len,
                stream: Arc::clone(stream.core()),
                used_on: Mutex::new(Vec::new()),
                block,
                storage,
            }),
        };
        match &buffer.inner.storage {
            // The CPU promises zeros even for `uninit`; fresh host segments are zeroed already.
            Storage::Host { lock, .. } if block.reused => buffer.lock_host(lock).fill(0),
            Storage::Cuda { .. } if zeroed && len > 0 => {
                let s = stream.cuda().ok_or_else(|| oom("a CUDA buffer on a CPU stream".into()))?;
                // SAFETY: the block holds at least `len` bytes and is ours alone.
                unsafe { result::memset_d8_async(block.address, 0, len, s.cu_stream()) }
                    .map_err(|e| RuntimeError::driver(format!("zeroing {len} bytes on {device}"), describe(e)))?;
            }
            _ => {}
        }
        Ok(buffer)
    }

    pub fn len(&self) -> usize {
        self.inner.len
    }

    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The stream it was allocated on, which copies and readbacks without a stream use.
    pub fn stream(&self) -> Stream {
        Stream::from_core(self.inner.device.clone(), Arc::clone(&self.inner.stream))
    }

    /// The address of byte 0: a device address on a GPU, a host address on the CPU. A multiple
    /// of 256 for every buffer the allocator hands out.
    pub fn address(&self) -> u64 {
        self.inner.block.address
    }

    /// Whether another live handle (a clone of this buffer, or a tensor over it) shares this
    /// allocation: an op that takes a tensor by value and writes it in place copies it first
    /// when this holds, so no other handle sees the write.
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    /// Whether two handles share the same memory.
    pub fn same_memory(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Copy `range` out to the host, on the buffer's own stream ([`Buffer::stream`]), which it
    /// synchronises.
    pub fn read(&self, range: Range<usize>) -> Result<Vec<u8>> {
        self.read_on(&self.stream(), range)
    }

    /// Copy `range` out to the host in `stream`'s order, then synchronise `stream`, so the
    /// copy sees every earlier write on that stream.
    pub fn read_on(&self, stream: &Stream, range: Range<usize>) -> Result<Vec<u8>> {
        stream.check_device("reading a buffer", self.device())?;
        if range.start > range.end || range.end > self.inner.len {
            return Err(RuntimeError::Shape(format!(
                "reading bytes {}..{} of a {}-byte buffer",
                range.start, range.end, self.inner.len
            )));
        }
        match &self.inner.storage {
            Storage::Host { lock, .. } => Ok(self.lock_host(lock)[range].to_vec()),
            Storage::Cuda { .. } => {
                let s = stream.cuda().ok_or_else(|| RuntimeError::driver("reading a buffer", "a CPU stream"))?;
                self.note_use(stream);
                let mut out = vec![0u8; range.len()];
                if !out.is_empty() {
                    // SAFETY: `range` lies inside the block (checked above); `out` stays
                    // alive until the stream is synchronised below.
                    unsafe { result::memcpy_dtoh_async(&mut out, self.address() + range.start as u64, s.cu_stream()) }
                        .map_err(|e| {
                            RuntimeError::driver(
                                format!("copying bytes {range:?} from {}", self.inner.device),
                                describe(e),
                            )
                        })?;
                }
                stream.synchronize()?;
                Ok(out)
            }
        }
    }

    /// Copy `bytes` from the host into the buffer at byte `offset`, on the buffer's own stream.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.write_on(&self.stream(), offset, bytes)
    }

    /// Copy `bytes` from the host into the buffer at byte `offset`, queued on `stream` after
    /// its earlier work.
    pub fn write_on(&self, stream: &Stream, offset: usize, bytes: &[u8]) -> Result<()> {
        stream.check_device("writing a buffer", self.device())?;
        let end = offset.checked_add(bytes.len()).filter(|&e| e <= self.inner.len).ok_or_else(|| {
            RuntimeError::Shape(format!(
                "writing {} bytes at {offset} into a {}-byte buffer",
                bytes.len(),
                self.inner.len
            ))
        })?;
        match &self.inner.storage {
            Storage::Host { lock, .. } => self.lock_host(lock)[offset..end].copy_from_slice(bytes),
            Storage::Cuda { .. } => {
                if bytes.is_empty() {
                    return Ok(());
                }
                let s = stream.cuda().ok_or_else(|| RuntimeError::driver("writing a buffer", "a CPU stream"))?;
                self.note_use(stream);
                // SAFETY: `offset..end` lies inside the block (checked above). A copy from
                // pageable memory returns once `bytes` are staged, so they may be dropped after.
                unsafe { result::memcpy_htod_async(self.address() + offset as u64, bytes, s.cu_stream()) }.map_err(
                    |e| {
                        RuntimeError::driver(
                            format!("copying {} bytes to {}", bytes.len(), self.inner.device),
                            describe(e),
                        )
                    },
                )?;
            }
        }
        Ok(())
    }

    /// The bytes of a CPU buffer, locked; `None` for GPU memory.
    pub(crate) fn try_host_lock(&self) -> Option<HostGuard<'_>> {
        match &self.inner.storage {
            Storage::Host { lock, .. } => Some(self.lock_host(lock)),
            Storage::Cuda { .. } => None,
        }
    }

    /// `lock` is this buffer's host lock.
    fn lock_host<'a>(&'a self, lock: &'a Mutex<()>) -> HostGuard<'a> {
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the allocator gave this buffer its block alone (live blocks never overlap),
        // the block's segment lives while the block is live, and the lock makes this the only
        // reference to the bytes until the guard drops.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.inner.block.address as *mut u8, self.inner.len) };
        HostGuard { _lock: guard, bytes }
    }

    /// Note that work on `stream` uses the buffer, so that its drop fences that stream too.
    pub(crate) fn note_use(&self, stream: &Stream) {
        let core = stream.core();
        if core.id == self.inner.stream.id {
            return;
        }
        let mut used = self.inner.used_on.lock().unwrap_or_else(|p| p.into_inner());
        if !used.iter().any(|s| s.id == core.id) {
            used.push(Arc::clone(core));
        }
    }

    /// A stable identity for ordering locks.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        match &self.storage {
            Storage::Host { memory, .. } => memory.free(self.block.id, Vec::new()),
            Storage::Cuda { memory } => {
                let used = std::mem::take(self.used_on.get_mut().unwrap_or_else(|p| p.into_inner()));
                let fences =
                    std::iter::once(&self.stream).chain(&used).filter_map(|s| fence(memory.memory(), s)).collect();
                memory.free(self.block.id, fences);
            }
        }
    }
}

/// An event after the work queued on `stream` so far. When it cannot be recorded (a broken
/// context), wait for the stream instead, so that the block is safe to reuse without one.
fn fence(memory: &DeviceMemory, stream: &StreamCore) -> Option<(u64, CudaEvent)> {
    let s = stream.cuda.as_ref()?;
    match memory.fence(s) {
        Ok(e) => Some((stream.id, e)),
        Err(_) => {
            s.context().record_err(s.synchronize());
            None
        }
    }
}
