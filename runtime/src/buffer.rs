//! Device memory: host bytes for the CPU device, a `cudarc` allocation for a GPU.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, DevicePtr};

use crate::cuda::describe;
use crate::device::Device;
use crate::error::{Result, RuntimeError};

/// A block of memory on one device. Cheap to clone (the clones share the memory); tensors are
/// views into a buffer.
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<BufferInner>,
}

struct BufferInner {
    device: Device,
    len: usize,
    storage: Storage,
}

enum Storage {
    /// Locked by a CPU launch for the duration of the interpreter run.
    Host(Mutex<Vec<u8>>),
    /// At least one byte long (CUDA rejects empty allocations); `len` is the usable size.
    Cuda(CudaSlice<u8>),
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes on {})", self.inner.len, self.inner.device)
    }
}

impl Buffer {
    /// `len` zero bytes.
    pub fn zeros(device: &Device, len: usize) -> Result<Buffer> {
        Buffer::alloc(device, len, true)
    }

    /// `len` bytes of unspecified content (zeros on the CPU): for outputs a kernel overwrites.
    pub fn uninit(device: &Device, len: usize) -> Result<Buffer> {
        Buffer::alloc(device, len, false)
    }

    fn alloc(device: &Device, len: usize, zeroed: bool) -> Result<Buffer> {
        let storage =
            match device.cuda_core() {
                None => Storage::Host(Mutex::new(vec![0; len])),
                Some(core) => {
                    let n = len.max(1);
                    let slice = if zeroed {
                        core.stream.alloc_zeros::<u8>(n)
                    } else {
                        // SAFETY: u8 has no invalid bit patterns, and device memory is only read
                        // back by copies, never referenced as Rust values.
                        unsafe { core.stream.alloc::<u8>(n) }
                    };
                    Storage::Cuda(slice.map_err(|e| {
                        RuntimeError::driver(format!("allocating {len} bytes on {device}"), describe(e))
                    })?)
                }
            };
        Ok(Buffer { inner: Arc::new(BufferInner { device: device.clone(), len, storage }) })
    }

    /// A buffer holding a copy of `bytes`.
    pub fn from_bytes(device: &Device, bytes: &[u8]) -> Result<Buffer> {
        let storage = match device.cuda_core() {
            None => Storage::Host(Mutex::new(bytes.to_vec())),
            Some(core) => {
                let copy =
                    if bytes.is_empty() { core.stream.alloc_zeros::<u8>(1) } else { core.stream.clone_htod(bytes) };
                Storage::Cuda(copy.map_err(|e| {
                    RuntimeError::driver(format!("copying {} bytes to {device}", bytes.len()), describe(e))
                })?)
            }
        };
        Ok(Buffer { inner: Arc::new(BufferInner { device: device.clone(), len: bytes.len(), storage }) })
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

    /// Whether two handles share the same memory.
    pub fn same_memory(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Copy `range` out to the host. On CUDA this waits for all work queued on the device's
    /// stream, so it sees every earlier launch's writes.
    pub fn read(&self, range: Range<usize>) -> Result<Vec<u8>> {
        if range.start > range.end || range.end > self.inner.len {
            return Err(RuntimeError::Shape(format!(
                "reading bytes {}..{} of a {}-byte buffer",
                range.start, range.end, self.inner.len
            )));
        }
        match &self.inner.storage {
            Storage::Host(m) => Ok(lock(m)[range].to_vec()),
            Storage::Cuda(slice) => {
                let core =
                    self.inner.device.cuda_core().ok_or_else(|| {
                        RuntimeError::driver("reading a buffer", "a CUDA buffer on a non-CUDA device")
                    })?;
                let mut out = vec![0u8; range.len()];
                if !out.is_empty() {
                    let view = slice.slice(range.clone());
                    core.stream.memcpy_dtoh(&view, &mut out).map_err(|e| {
                        RuntimeError::driver(format!("copying bytes {range:?} from {}", self.inner.device), describe(e))
                    })?;
                }
                core.stream.synchronize().map_err(|e| {
                    RuntimeError::driver(
                        format!("synchronising {} (an earlier kernel may have failed)", self.inner.device),
                        describe(e),
                    )
                })?;
                Ok(out)
            }
        }
    }

    /// Copy `bytes` from the host into the buffer at byte `offset`. On CUDA the copy is queued
    /// on the device's stream, after every earlier launch.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        let end = offset.checked_add(bytes.len()).filter(|&e| e <= self.inner.len).ok_or_else(|| {
            RuntimeError::Shape(format!(
                "writing {} bytes at {offset} into a {}-byte buffer",
                bytes.len(),
                self.inner.len
            ))
        })?;
        match &self.inner.storage {
            Storage::Host(m) => lock(m)[offset..end].copy_from_slice(bytes),
            Storage::Cuda(slice) => {
                let core =
                    self.inner.device.cuda_core().ok_or_else(|| {
                        RuntimeError::driver("writing a buffer", "a CUDA buffer on a non-CUDA device")
                    })?;
                if bytes.is_empty() {
                    return Ok(());
                }
                // Event tracking is off (see `cuda::open`), so the guard records nothing.
                let (ptr, _guard) = slice.device_ptr(&core.stream);
                // SAFETY: `offset..end` lies inside the allocation (checked above). A copy from
                // pageable memory returns once `bytes` are staged, so they may be dropped after.
                unsafe {
                    cudarc::driver::result::memcpy_htod_async(ptr + offset as u64, bytes, core.stream.cu_stream())
                }
                .map_err(|e| {
                    RuntimeError::driver(format!("copying {} bytes to {}", bytes.len(), self.inner.device), describe(e))
                })?;
            }
        }
        Ok(())
    }

    /// The host bytes, locked (CPU buffers only).
    pub(crate) fn host(&self) -> Option<&Mutex<Vec<u8>>> {
        match &self.inner.storage {
            Storage::Host(m) => Some(m),
            Storage::Cuda(_) => None,
        }
    }

    /// The device address of byte 0 (CUDA buffers only).
    pub(crate) fn device_address(&self) -> Option<u64> {
        match (&self.inner.storage, self.inner.device.cuda_core()) {
            (Storage::Cuda(slice), Some(core)) => {
                // Event tracking is off (see `cuda::open`), so the guard records nothing.
                let (ptr, _guard) = slice.device_ptr(&core.stream);
                Some(ptr)
            }
            _ => None,
        }
    }

    /// A stable identity for ordering locks.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }
}

/// Lock host bytes; a poisoned lock still guards valid bytes (they have no invariants).
pub(crate) fn lock(m: &Mutex<Vec<u8>>) -> MutexGuard<'_, Vec<u8>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
