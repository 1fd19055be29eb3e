//! Memory of a launch: global buffers shared by all blocks (relaxed atomic words, so blocks
//! may run on several CPU threads), and the per-block shared and per-thread local windows.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::decode::{LOCAL_WINDOW, MODULE_VAR_INDEX, SHARED_WINDOW};
use crate::program::Space;

/// Global buffers are `1 << BUFFER_SHIFT` bytes apart, as in the interpreter.
pub(crate) const BUFFER_SHIFT: u32 = 40;

/// One global buffer as little-endian 64-bit words.
pub(crate) struct Buffer {
    words: Box<[AtomicU64]>,
    len: u64,
}

impl Buffer {
    pub(crate) fn from_bytes(bytes: &[u8]) -> Buffer {
        let words = bytes
            .chunks(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                AtomicU64::new(u64::from_le_bytes(w))
            })
            .collect();
        Buffer { words, len: bytes.len() as u64 }
    }

    pub(crate) fn copy_to(&self, out: &mut [u8]) {
        for (chunk, w) in out.chunks_mut(8).zip(self.words.iter()) {
            let n = chunk.len();
            chunk.copy_from_slice(&w.load(Relaxed).to_le_bytes()[..n]);
        }
    }
}

#[inline(always)]
fn mask(size: u32) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (size * 8)) - 1
    }
}

/// The global buffers of a launch: the buffer arguments, then the module's variables.
pub(crate) struct Global {
    pub(crate) args: Vec<Buffer>,
    pub(crate) vars: Vec<Buffer>,
}

impl Global {
    /// The buffer and word holding `size` bytes at `addr` (aligned to `size` by the caller),
    /// and the bit shift of the value inside the word.
    fn locate(&self, addr: u64, size: u32) -> Result<(&AtomicU64, u32), String> {
        let index = (addr >> BUFFER_SHIFT).wrapping_sub(1);
        let off = addr & ((1 << BUFFER_SHIFT) - 1);
        let buf = if index < self.args.len() as u64 {
            &self.args[index as usize]
        } else if index >= MODULE_VAR_INDEX && index - MODULE_VAR_INDEX < self.vars.len() as u64 {
            &self.vars[(index - MODULE_VAR_INDEX) as usize]
        } else {
            return Err(format!("global access of {size} bytes at {addr:#x}, which is in no buffer"));
        };
        if off + size as u64 > buf.len {
            return Err(format!(
                "out-of-bounds global access: {size} bytes at offset {off} of buffer {index} ({} bytes)",
                buf.len
            ));
        }
        Ok((&buf.words[(off / 8) as usize], (off % 8) as u32 * 8))
    }

    fn load(&self, addr: u64, size: u32) -> Result<u64, String> {
        let (w, sh) = self.locate(addr, size)?;
        Ok((w.load(Relaxed) >> sh) & mask(size))
    }

    fn store(&self, addr: u64, size: u32, v: u64) -> Result<(), String> {
        let (w, sh) = self.locate(addr, size)?;
        if size == 8 {
            w.store(v, Relaxed);
        } else {
            let m = mask(size) << sh;
            let bits = (v << sh) & m;
            // Other bytes of the word may be written by other blocks at the same time.
            let _ = w.fetch_update(Relaxed, Relaxed, |old| Some((old & !m) | bits));
        }
        Ok(())
    }

    fn rmw(&self, addr: u64, size: u32, f: &mut dyn FnMut(u64) -> u64) -> Result<u64, String> {
        let (w, sh) = self.locate(addr, size)?;
        let m = mask(size);
        let mut old_value = 0;
        let _ = w.fetch_update(Relaxed, Relaxed, |old| {
            old_value = (old >> sh) & m;
            let new = f(old_value) & m;
            Some((old & !(m << sh)) | (new << sh))
        });
        Ok(old_value)
    }
}

/// Where an access lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Win {
    Global,
    Shared,
    Local,
    Param,
}

/// A `cp.async` issued and not yet completed.
struct AsyncCopy {
    line: u32,
    offset: usize,
    size: usize,
    data: [u8; 16],
}

/// One thread's `cp.async` groups: the open one, then the committed ones, oldest first.
#[derive(Default)]
struct AsyncGroups {
    open: Vec<AsyncCopy>,
    committed: std::collections::VecDeque<Vec<AsyncCopy>>,
}

/// A block's pending `cp.async` copies, with the interpreter's model (`ruda_ir::Op::CpAsync`):
/// a copy's destination bytes are reserved from issue until the issuing thread's wait
/// completes its group, any shared access to them is a fault, and the data lands at the wait.
pub(crate) struct AsyncCopies {
    /// Per shared byte, 1 + the thread whose pending copy will write it, or 0.
    owner: Vec<u32>,
    pending: usize,
    threads: Vec<AsyncGroups>,
}

impl AsyncCopies {
    pub(crate) fn new(shared_bytes: usize, threads: usize) -> AsyncCopies {
        AsyncCopies {
            owner: vec![0; shared_bytes],
            pending: 0,
            threads: (0..threads).map(|_| AsyncGroups::default()).collect(),
        }
    }

    /// Forget every copy (a new block; copies pending at exit are dropped).
    pub(crate) fn reset(&mut self) {
        if self.pending > 0 {
            self.owner.fill(0);
            self.pending = 0;
        }
        for g in &mut self.threads {
            g.open.clear();
            g.committed.clear();
        }
    }

    /// Fail when a pending copy will write a byte of `offset..offset + size` (in bounds).
    pub(crate) fn check(&self, offset: u64, size: u32) -> Result<(), String> {
        if self.pending == 0 {
            return Ok(());
        }
        let (lo, hi) = (offset as usize, offset as usize + size as usize);
        let Some(i) = self.owner[lo..hi.min(self.owner.len())].iter().position(|&o| o != 0) else { return Ok(()) };
        let (byte, thread) = (lo + i, self.owner[lo + i] as usize - 1);
        let g = &self.threads[thread];
        let line = g.committed.iter().flatten().chain(&g.open).find(|c| (c.offset..c.offset + c.size).contains(&byte));
        let at = line.map_or_else(String::new, |c| format!(" (PTX line {})", c.line));
        Err(format!(
            "shared access touches byte {byte}, the destination of thread {thread}'s cp.async{at} that is still pending: \
             it lands only when that thread's cp.async.wait_group waits for its group"
        ))
    }

    /// Add thread `t`'s copy of `data` to `offset` (checked in bounds and not pending) to its
    /// open group.
    pub(crate) fn issue(&mut self, t: usize, line: u32, offset: u64, data: &[u8]) {
        let (offset, size) = (offset as usize, data.len());
        self.owner[offset..offset + size].fill(t as u32 + 1);
        self.pending += size;
        let mut bytes = [0u8; 16];
        bytes[..size].copy_from_slice(data);
        self.threads[t].open.push(AsyncCopy { line, offset, size, data: bytes });
    }

    pub(crate) fn commit(&mut self, t: usize) {
        let g = &mut self.threads[t];
        let open = std::mem::take(&mut g.open);
        g.committed.push_back(open);
    }

    /// Complete thread `t`'s committed groups but the `n` most recent: their data lands.
    pub(crate) fn wait(&mut self, t: usize, n: u32, shared: &mut [u8]) {
        while self.threads[t].committed.len() > n as usize {
            let Some(group) = self.threads[t].committed.pop_front() else { break };
            for c in group {
                shared[c.offset..c.offset + c.size].copy_from_slice(&c.data[..c.size]);
                self.owner[c.offset..c.offset + c.size].fill(0);
                self.pending -= c.size;
            }
        }
    }
}

/// The memory one thread sees.
pub(crate) struct Mem<'a> {
    pub(crate) global: &'a Global,
    pub(crate) shared: &'a mut [u8],
    pub(crate) local: &'a mut [u8],
    pub(crate) params: &'a [u8],
    pub(crate) copies: &'a mut AsyncCopies,
}

fn read(buf: &[u8], off: u64, size: u32, what: &str) -> Result<u64, String> {
    let end = off.checked_add(size as u64).filter(|&e| e <= buf.len() as u64);
    let Some(end) = end else {
        return Err(format!("out-of-bounds {what} access: {size} bytes at offset {off} of {} bytes", buf.len()));
    };
    let mut b = [0u8; 8];
    b[..size as usize].copy_from_slice(&buf[off as usize..end as usize]);
    Ok(u64::from_le_bytes(b))
}

fn write(buf: &mut [u8], off: u64, size: u32, v: u64, what: &str) -> Result<(), String> {
    let end = off.checked_add(size as u64).filter(|&e| e <= buf.len() as u64);
    let Some(end) = end else {
        return Err(format!("out-of-bounds {what} access: {size} bytes at offset {off} of {} bytes", buf.len()));
    };
    buf[off as usize..end as usize].copy_from_slice(&v.to_le_bytes()[..size as usize]);
    Ok(())
}

impl Mem<'_> {
    fn target(space: Space, addr: u64) -> (Win, u64) {
        match space {
            Space::Global => (Win::Global, addr),
            Space::Shared => (Win::Shared, addr),
            Space::Local => (Win::Local, addr),
            Space::Param => (Win::Param, addr),
            Space::Generic if addr >= LOCAL_WINDOW => (Win::Local, addr - LOCAL_WINDOW),
            Space::Generic if addr >= SHARED_WINDOW => (Win::Shared, addr - SHARED_WINDOW),
            Space::Generic => (Win::Global, addr),
        }
    }

    pub(crate) fn load(&mut self, space: Space, addr: u64, size: u32) -> Result<u64, String> {
        match Self::target(space, addr) {
            (Win::Global, a) => self.global.load(a, size),
            (Win::Shared, a) => {
                let v = read(self.shared, a, size, "shared")?;
                self.copies.check(a, size)?;
                Ok(v)
            }
            (Win::Local, a) => read(self.local, a, size, "local"),
            (Win::Param, a) => read(self.params, a, size, "param"),
        }
    }

    pub(crate) fn store(&mut self, space: Space, addr: u64, size: u32, v: u64) -> Result<(), String> {
        match Self::target(space, addr) {
            (Win::Global, a) => self.global.store(a, size, v),
            (Win::Shared, a) => {
                self.copies.check(a.min(self.shared.len() as u64), size)?;
                write(self.shared, a, size, v, "shared")
            }
            (Win::Local, a) => write(self.local, a, size, v, "local"),
            (Win::Param, _) => Err("stores to the parameter space are not allowed in an entry".into()),
        }
    }

    /// An atomic read-modify-write; returns the old value.
    pub(crate) fn rmw(
        &mut self,
        space: Space,
        addr: u64,
        size: u32,
        f: &mut dyn FnMut(u64) -> u64,
    ) -> Result<u64, String> {
        match Self::target(space, addr) {
            (Win::Global, a) => self.global.rmw(a, size, f),
            (Win::Shared, a) => {
                let old = read(self.shared, a, size, "shared")?;
                self.copies.check(a, size)?;
                write(self.shared, a, size, f(old), "shared")?;
                Ok(old)
            }
            (win, _) => Err(format!("atomic access to {} memory", if win == Win::Local { "local" } else { "param" })),
        }
    }
}

/// Whether a generic address lies in `space`'s window (`isspacep`).
pub(crate) fn in_space(space: Space, addr: u64) -> bool {
    let (win, _) = Mem::target(Space::Generic, addr);
    matches!((space, win), (Space::Global, Win::Global) | (Space::Shared, Win::Shared) | (Space::Local, Win::Local))
}
