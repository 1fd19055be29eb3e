//! Memory: global buffers shared by all blocks, and one block's shared memory with race
//! detection.

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};

/// Buffer `i` (the `i`-th buffer argument) lives at global address `(i + 1) << 40`.
pub(crate) const BUFFER_SHIFT: u32 = 40;

/// One buffer: host memory at least 8-byte aligned (the launcher stages others).
struct Buffer {
    ptr: *mut u8,
    len: u64,
}

/// The global buffers of a launch.
pub(crate) struct Global {
    bufs: Vec<Buffer>,
}

// SAFETY: the buffers are borrowed mutably for the whole launch and, while blocks run, only
// accessed through atomic operations (see `read`, `write`, `rmw`), which may race.
unsafe impl Sync for Global {}
unsafe impl Send for Global {}

impl Global {
    /// # Safety
    /// Each `(ptr, len)` must be valid for reads and writes of `len` bytes, 8-byte aligned, not
    /// aliased by anything else while the `Global` is used.
    pub(crate) unsafe fn new(bufs: impl IntoIterator<Item = (*mut u8, usize)>) -> Global {
        Global { bufs: bufs.into_iter().map(|(ptr, len)| Buffer { ptr, len: len as u64 }).collect() }
    }

    /// The host pointer of an access of `size` bytes at `addr`, checked to lie inside one
    /// buffer and to be aligned to `size`.
    #[inline]
    pub(crate) fn locate(&self, addr: u64, size: u32, access: &str) -> Result<*mut u8, String> {
        self.locate_span(addr, size, size, access)
    }

    /// The host pointer of `size` bytes at `addr` (any count, 0 included), checked to lie
    /// inside one buffer, with `addr` aligned to `align` (a power of two).
    #[inline]
    pub(crate) fn locate_span(&self, addr: u64, size: u32, align: u32, access: &str) -> Result<*mut u8, String> {
        let size = size as u64;
        let index = (addr >> BUFFER_SHIFT).wrapping_sub(1);
        let offset = addr & ((1 << BUFFER_SHIFT) - 1);
        let Some(buf) = usize::try_from(index).ok().and_then(|i| self.bufs.get(i)) else {
            return Err(format!(
                "out of bounds: global {access} of {size} bytes at address {addr:#x}, which is in no buffer \
                 (buffer i starts at (i+1)<<{BUFFER_SHIFT}; the launch passes {})",
                self.bufs.len()
            ));
        };
        if offset + size > buf.len {
            return Err(format!(
                "out of bounds: global {access} of {size} bytes at address {addr:#x} (buffer {index}, offset {offset}) \
                 but buffer {index} has {} bytes",
                buf.len
            ));
        }
        if addr & (align as u64 - 1) != 0 {
            return Err(format!(
                "misaligned: global {access} of {size} bytes at address {addr:#x} (buffer {index}, offset {offset}) \
                 must be {align}-byte aligned"
            ));
        }
        // SAFETY: offset + size <= len, so the pointer stays inside the buffer.
        Ok(unsafe { buf.ptr.add(offset as usize) })
    }
}

/// Little-endian load of `bytes` (1, 2, 4 or 8) bytes.
///
/// # Safety
/// `p` must come from [`Global::locate`] for an access covering these bytes, aligned to them.
#[inline]
pub(crate) unsafe fn read(p: *mut u8, bytes: u32) -> u64 {
    match bytes {
        1 => AtomicU8::from_ptr(p).load(Relaxed) as u64,
        2 => u16::from_le(AtomicU16::from_ptr(p.cast()).load(Relaxed)) as u64,
        4 => u32::from_le(AtomicU32::from_ptr(p.cast()).load(Relaxed)) as u64,
        _ => u64::from_le(AtomicU64::from_ptr(p.cast()).load(Relaxed)),
    }
}

/// Little-endian store of the low `bytes` bytes of `v`.
///
/// # Safety
/// As for [`read`].
#[inline]
pub(crate) unsafe fn write(p: *mut u8, bytes: u32, v: u64) {
    match bytes {
        1 => AtomicU8::from_ptr(p).store(v as u8, Relaxed),
        2 => AtomicU16::from_ptr(p.cast()).store((v as u16).to_le(), Relaxed),
        4 => AtomicU32::from_ptr(p.cast()).store((v as u32).to_le(), Relaxed),
        _ => AtomicU64::from_ptr(p.cast()).store(v.to_le(), Relaxed),
    }
}

/// Atomic read-modify-write of a 4- or 8-byte little-endian value; returns the old value.
///
/// # Safety
/// As for [`read`].
#[inline]
pub(crate) unsafe fn rmw(p: *mut u8, bytes: u32, f: impl Fn(u64) -> u64) -> u64 {
    if bytes == 4 {
        let a = AtomicU32::from_ptr(p.cast());
        let mut cur = a.load(Relaxed);
        loop {
            let old = u32::from_le(cur) as u64;
            match a.compare_exchange_weak(cur, (f(old) as u32).to_le(), Relaxed, Relaxed) {
                Ok(_) => return old,
                Err(seen) => cur = seen,
            }
        }
    } else {
        let a = AtomicU64::from_ptr(p.cast());
        let mut cur = a.load(Relaxed);
        loop {
            let old = u64::from_le(cur);
            match a.compare_exchange_weak(cur, f(old).to_le(), Relaxed, Relaxed) {
                Ok(_) => return old,
                Err(seen) => cur = seen,
            }
        }
    }
}

const NO_THREAD: u16 = u16::MAX;

/// Who touched a byte of shared memory in the current epoch (between two barriers): the last
/// writer and up to two distinct readers (two suffice to find a reader other than any writer).
#[derive(Clone, Copy)]
struct Shadow {
    epoch: u32,
    writer: u16,
    readers: [u16; 2],
}

const FRESH: Shadow = Shadow { epoch: 0, writer: NO_THREAD, readers: [NO_THREAD; 2] };

/// Two threads touched the same byte since the last barrier, at least one writing.
pub(crate) struct Conflict {
    pub offset: usize,
    pub other: u16,
    pub other_wrote: bool,
}

/// One block's shared memory (zero-filled at block start), its race-detection shadow, and the
/// bytes pending `cp.async` copies will write.
pub(crate) struct SharedMem {
    bytes: Vec<u8>,
    shadow: Vec<Shadow>,
    epoch: u32,
    /// Per byte, the thread whose pending `cp.async` will write it, or `NO_THREAD`.
    pending: Vec<u16>,
    /// How many bytes are pending (0: accesses skip the check).
    pending_bytes: usize,
}

impl SharedMem {
    pub(crate) fn new(size: usize) -> SharedMem {
        SharedMem { bytes: vec![0; size], shadow: vec![FRESH; size], epoch: 0, pending: vec![], pending_bytes: 0 }
    }

    pub(crate) fn start_block(&mut self) {
        self.bytes.fill(0);
        if self.pending_bytes > 0 {
            self.pending.fill(NO_THREAD);
            self.pending_bytes = 0;
        }
        self.next_epoch();
    }

    /// The first byte of `offset..offset + bytes` a pending `cp.async` will write, and the
    /// thread that issued it.
    #[inline]
    pub(crate) fn pending_at(&self, offset: usize, bytes: u32) -> Option<(usize, u16)> {
        if self.pending_bytes == 0 {
            return None;
        }
        let span = &self.pending[offset..offset + bytes as usize];
        span.iter().position(|&t| t != NO_THREAD).map(|i| (offset + i, span[i]))
    }

    /// Mark located bytes as the destination of `thread`'s pending copy (none may be pending).
    pub(crate) fn reserve(&mut self, offset: usize, bytes: u32, thread: u16) {
        if self.pending.is_empty() {
            self.pending = vec![NO_THREAD; self.bytes.len()];
        }
        self.pending[offset..offset + bytes as usize].fill(thread);
        self.pending_bytes += bytes as usize;
    }

    /// A pending copy lands: its bytes are written and no longer reserved.
    pub(crate) fn land(&mut self, offset: usize, data: &[u8]) {
        self.bytes[offset..offset + data.len()].copy_from_slice(data);
        self.pending[offset..offset + data.len()].fill(NO_THREAD);
        self.pending_bytes -= data.len();
    }

    pub(crate) fn barrier(&mut self) {
        self.next_epoch();
    }

    fn next_epoch(&mut self) {
        if self.epoch == u32::MAX {
            self.shadow.fill(FRESH);
            self.epoch = 0;
        }
        self.epoch += 1;
    }

    /// The offset of an access of `size` bytes through the 32-bit shared address `addr`,
    /// checked for bounds and alignment.
    #[inline]
    pub(crate) fn locate(&self, addr: u64, size: u32, access: &str) -> Result<usize, String> {
        let (offset, size) = (addr as u32 as u64, size as u64);
        if offset + size > self.bytes.len() as u64 {
            return Err(format!(
                "out of bounds: shared {access} of {size} bytes at offset {offset} but the block has {} bytes of shared memory",
                self.bytes.len()
            ));
        }
        if offset & (size - 1) != 0 {
            return Err(format!(
                "misaligned: shared {access} of {size} bytes at offset {offset} must be {size}-byte aligned"
            ));
        }
        Ok(offset as usize)
    }

    /// Little-endian read of `bytes` bytes at a located offset.
    #[inline]
    pub(crate) fn read(&self, offset: usize, bytes: u32) -> u64 {
        let mut buf = [0u8; 8];
        buf[..bytes as usize].copy_from_slice(&self.bytes[offset..offset + bytes as usize]);
        u64::from_le_bytes(buf)
    }

    #[inline]
    pub(crate) fn write(&mut self, offset: usize, bytes: u32, v: u64) {
        self.bytes[offset..offset + bytes as usize].copy_from_slice(&v.to_le_bytes()[..bytes as usize]);
    }

    /// Record a plain (non-atomic) access by `thread`, failing on a conflict with another
    /// thread's access since the last barrier.
    #[inline]
    pub(crate) fn track(&mut self, offset: usize, bytes: u32, thread: u16, write: bool) -> Result<(), Conflict> {
        let epoch = self.epoch;
        for (i, s) in self.shadow[offset..offset + bytes as usize].iter_mut().enumerate() {
            if s.epoch != epoch {
                *s = Shadow { epoch, ..FRESH };
            }
            if s.writer != NO_THREAD && s.writer != thread {
                return Err(Conflict { offset: offset + i, other: s.writer, other_wrote: true });
            }
            if write {
                if let Some(&r) = s.readers.iter().find(|&&r| r != NO_THREAD && r != thread) {
                    return Err(Conflict { offset: offset + i, other: r, other_wrote: false });
                }
                s.writer = thread;
            } else if s.readers[0] == NO_THREAD {
                s.readers[0] = thread;
            } else if s.readers[0] != thread && s.readers[1] == NO_THREAD {
                s.readers[1] = thread;
            }
        }
        Ok(())
    }
}
