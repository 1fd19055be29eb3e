//! The caching allocator: device memory comes from the driver in segments, is handed out in
//! blocks, and goes back to a free list when a buffer drops, so that buffers allocated every
//! step do not call the driver. The bookkeeping is generic over [`Memory`] (host memory for the
//! CPU device, `cuMemAlloc` for a GPU), so the same logic is tested without a GPU.
//!
//! - Every block is [`ALIGNMENT`]-byte aligned and a multiple of it in size: tuning's
//!   alignment classes assume that a fresh buffer starts on a 256-byte boundary.
//! - Requests up to [`SMALL_LIMIT`] are rounded to a size class (multiples of 256 up to 1 KiB,
//!   then four classes per power of two) and carved from shared [`SMALL_SEGMENT`]-byte
//!   segments; a freed block serves later requests of its class. Larger requests get a segment
//!   of their own, rounded to 2 MiB, reused by a request at most 1/8 smaller.
//! - A block remembers the stream it was last allocated on, and at free time a fence (a CUDA
//!   event) is recorded on each stream that used it. The block is reused on a stream `S` only
//!   once every fence recorded on another stream has completed; fences on `S` itself are kept
//!   by stream order. So memory freed on one stream is never handed to another while kernels
//!   there may still touch it.
//! - Pools: the shared one, and private pools whose segments no other pool uses (what graph
//!   capture needs: the addresses baked into a graph stay reserved for it). A dropped private
//!   pool's memory is returned by the next [`Allocator::release_cached`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// Alignment and size granularity of every block, in bytes.
pub const ALIGNMENT: usize = 256;
/// Requests up to this many bytes share segments.
pub const SMALL_LIMIT: usize = 1 << 20;
/// The size of a segment that small blocks are carved from.
pub const SMALL_SEGMENT: usize = 2 << 20;
/// Large requests are rounded up to a multiple of this.
const LARGE_ROUND: usize = 2 << 20;

/// Where segments come from.
pub(crate) trait Memory: Send + Sync {
    /// Marks the point in a stream after which a freed block is no longer used there.
    type Fence: Send;
    /// `bytes` bytes of fresh memory, [`ALIGNMENT`]-aligned; its address.
    fn allocate(&self, bytes: usize) -> Result<u64, String>;
    /// Give a segment back.
    ///
    /// # Safety
    /// `address` and `bytes` are those of one earlier [`Memory::allocate`], and nothing uses
    /// the memory any more.
    unsafe fn release(&self, address: u64, bytes: usize);
    /// Whether all work before the fence has finished (`false` when that cannot be known).
    fn is_complete(&self, fence: &Self::Fence) -> bool;
    /// A fence the allocator no longer needs, for reuse (CUDA keeps its events, so that a free
    /// records an event without creating one).
    fn recycle(&self, fence: Self::Fence) {
        drop(fence);
    }
}

/// A pool's identity; [`SHARED_POOL`] is the one every allocation uses unless told otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PoolId(u64);

pub(crate) const SHARED_POOL: PoolId = PoolId(0);

/// A live block, as the allocator hands it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Allocation {
    pub id: u64,
    pub address: u64,
    /// The block's size (the request rounded up to its class).
    pub size: usize,
    /// Whether the block came from the cache (its bytes are whatever the last user left).
    pub reused: bool,
}

/// Memory counters of one pool or of a whole device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held from the driver (segments), in use or cached.
    pub reserved_bytes: u64,
    /// Bytes of live blocks (requests rounded up to their size class).
    pub in_use_bytes: u64,
    /// Bytes the live buffers asked for.
    pub requested_bytes: u64,
    /// Live blocks.
    pub live_blocks: u64,
    /// Segments obtained from the driver, ever.
    pub driver_allocations: u64,
    /// Segments given back to the driver, ever.
    pub driver_frees: u64,
    /// Allocations served from cached blocks, ever.
    pub reuses: u64,
}

impl MemoryStats {
    fn add(&mut self, o: &MemoryStats) {
        self.reserved_bytes += o.reserved_bytes;
        self.in_use_bytes += o.in_use_bytes;
        self.requested_bytes += o.requested_bytes;
        self.live_blocks += o.live_blocks;
        self.driver_allocations += o.driver_allocations;
        self.driver_frees += o.driver_frees;
        self.reuses += o.reuses;
    }
}

/// The size class of a request: a multiple of [`ALIGNMENT`] up to 1 KiB, then four steps per
/// power of two up to [`SMALL_LIMIT`], then a multiple of 2 MiB.
pub(crate) fn size_class(bytes: usize) -> Option<usize> {
    let n = bytes.max(1).checked_next_multiple_of(ALIGNMENT)?;
    if n <= 1024 {
        return Some(n);
    }
    if n <= SMALL_LIMIT {
        let step = n.next_power_of_two() / 8;
        return n.checked_next_multiple_of(step);
    }
    n.checked_next_multiple_of(LARGE_ROUND)
}

struct Block<F> {
    segment: u64,
    address: u64,
    size: usize,
    requested: usize,
    live: bool,
    /// The stream it was last allocated on.
    stream: u64,
    /// (stream, fence) recorded when it was freed.
    fences: Vec<(u64, F)>,
}

struct Segment {
    pool: PoolId,
    address: u64,
    bytes: usize,
    /// Blocks carved from it so far (small segments), or its one block.
    blocks: Vec<u64>,
    /// Bytes carved so far.
    cursor: usize,
    live_blocks: usize,
}

#[derive(Default)]
struct Pool {
    /// Free small blocks by size class, most recently freed last.
    small: HashMap<usize, Vec<u64>>,
    /// Free large blocks by size.
    large: BTreeMap<usize, Vec<u64>>,
    /// The small segment new blocks are carved from.
    current: Option<u64>,
    stats: MemoryStats,
    /// Dropped by its owner: nothing new is allocated in it, and its memory goes back to the
    /// driver once free.
    retired: bool,
}

struct State<F> {
    blocks: HashMap<u64, Block<F>>,
    segments: HashMap<u64, Segment>,
    pools: BTreeMap<PoolId, Pool>,
    next_id: u64,
}

/// The caching allocator of one device.
pub(crate) struct Allocator<M: Memory> {
    memory: M,
    state: Mutex<State<M::Fence>>,
}

impl<M: Memory> Allocator<M> {
    pub fn new(memory: M) -> Allocator<M> {
        let mut pools = BTreeMap::new();
        pools.insert(SHARED_POOL, Pool::default());
        Allocator {
            memory,
            state: Mutex::new(State { blocks: HashMap::new(), segments: HashMap::new(), pools, next_id: 1 }),
        }
    }

    pub fn memory(&self) -> &M {
        &self.memory
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<M::Fence>> {
        // Every update leaves the maps consistent before anything can panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new private pool.
    pub fn create_pool(&self) -> PoolId {
        let mut s = self.state();
        let id = PoolId(s.next_id);
        s.next_id += 1;
        s.pools.insert(id, Pool::default());
        id
    }

    /// The pool's owner dropped it: its memory is released by the next
    /// [`Allocator::release_cached`] once its blocks are free.
    pub fn retire_pool(&self, pool: PoolId) {
        if pool != SHARED_POOL {
            if let Some(p) = self.state().pools.get_mut(&pool) {
                p.retired = true;
            }
        }
    }

    /// A block of at least `bytes` bytes in `pool`, usable on `stream` now.
    pub fn allocate(&self, pool: PoolId, bytes: usize, stream: u64) -> Result<Allocation, String> {
        let size = size_class(bytes).ok_or_else(|| format!("{bytes} bytes is more than the device can address"))?;
        let mut guard = self.state();
        let s = &mut *guard;
        let p = s.pools.get_mut(&pool).filter(|p| !p.retired).ok_or("the memory pool was dropped")?;
        // Most recently freed first; large blocks smallest first.
        let picked = if size <= SMALL_LIMIT {
            p.small.get(&size).and_then(|v| self.pick(&mut s.blocks, v.iter().rev(), stream))
        } else {
            let fits = p.large.range(size..=size.saturating_add(size / 8));
            self.pick(&mut s.blocks, fits.flat_map(|(_, v)| v.iter().rev()), stream)
        };
        if let Some(id) = picked {
            let b = s.blocks.get_mut(&id).ok_or("allocator: a free list names a missing block")?;
            let (address, block_size) = (b.address, b.size);
            b.live = true;
            b.stream = stream;
            b.requested = bytes;
            for (_, f) in b.fences.drain(..) {
                self.memory.recycle(f);
            }
            let list =
                if block_size <= SMALL_LIMIT { p.small.get_mut(&block_size) } else { p.large.get_mut(&block_size) };
            if let Some(list) = list {
                list.retain(|&x| x != id);
            }
            if let Some(seg) = s.segments.get_mut(&b.segment) {
                seg.live_blocks += 1;
            }
            p.stats.reuses += 1;
            p.stats.in_use_bytes += block_size as u64;
            p.stats.requested_bytes += bytes as u64;
            p.stats.live_blocks += 1;
            return Ok(Allocation { id, address, size: block_size, reused: true });
        }
        drop(guard);
        self.carve(pool, size, bytes, stream)
    }

    /// The first candidate usable on `stream`: one without fences on other streams, else one
    /// whose other streams' fences have all completed (completed fences are dropped).
    fn pick<'a>(
        &self,
        blocks: &mut HashMap<u64, Block<M::Fence>>,
        candidates: impl Iterator<Item = &'a u64> + Clone,
        stream: u64,
    ) -> Option<u64> {
        let clean = |b: &Block<M::Fence>| b.fences.iter().all(|(s, _)| *s == stream);
        if let Some(&id) = candidates.clone().find(|id| blocks.get(id).is_some_and(clean)) {
            return Some(id);
        }
        for &id in candidates {
            let b = blocks.get_mut(&id)?;
            for (s, f) in std::mem::take(&mut b.fences) {
                if s == stream || !self.memory.is_complete(&f) {
                    b.fences.push((s, f));
                } else {
                    self.memory.recycle(f);
                }
            }
            if clean(b) {
                return Some(id);
            }
        }
        None
    }

    /// A new block from the pool's current small segment, a new segment, or (when the driver
    /// is out of memory) after releasing cached segments.
    fn carve(&self, pool: PoolId, size: usize, requested: usize, stream: u64) -> Result<Allocation, String> {
        let small = size <= SMALL_LIMIT;
        let mut guard = self.state();
        let room = |s: &State<M::Fence>| {
            let current = s.pools.get(&pool).and_then(|p| p.current)?;
            s.segments.get(&current).filter(|g| small && g.cursor + size <= g.bytes).map(|_| current)
        };
        let seg_id = match room(&guard) {
            Some(c) => c,
            None => {
                let bytes = if small { SMALL_SEGMENT } else { size };
                let address = match self.memory.allocate(bytes) {
                    Ok(a) => a,
                    Err(first) => {
                        drop(guard);
                        let freed = self.release_cached();
                        let retry = self.memory.allocate(bytes);
                        guard = self.state();
                        retry.map_err(|e| {
                            if freed > 0 {
                                format!("{e} (also after returning {freed} cached bytes to the driver)")
                            } else {
                                first
                            }
                        })?
                    }
                };
                let s = &mut *guard;
                let id = s.next_id;
                s.next_id += 1;
                s.segments.insert(id, Segment { pool, address, bytes, blocks: vec![], cursor: 0, live_blocks: 0 });
                let p = s.pools.get_mut(&pool).ok_or("the memory pool was dropped")?;
                p.stats.driver_allocations += 1;
                p.stats.reserved_bytes += bytes as u64;
                if small {
                    p.current = Some(id);
                }
                id
            }
        };
        let s = &mut *guard;
        let id = s.next_id;
        s.next_id += 1;
        let seg = s.segments.get_mut(&seg_id).ok_or("allocator: a pool names a missing segment")?;
        let address = seg.address + seg.cursor as u64;
        seg.cursor += size;
        seg.blocks.push(id);
        seg.live_blocks += 1;
        s.blocks.insert(id, Block { segment: seg_id, address, size, requested, live: true, stream, fences: vec![] });
        let p = s.pools.get_mut(&pool).ok_or("the memory pool was dropped")?;
        p.stats.in_use_bytes += size as u64;
        p.stats.requested_bytes += requested as u64;
        p.stats.live_blocks += 1;
        Ok(Allocation { id, address, size, reused: false })
    }

    /// Return a block to its pool's free list, with the fences recorded on every stream that
    /// used it.
    pub fn free(&self, id: u64, fences: Vec<(u64, M::Fence)>) {
        let mut guard = self.state();
        let s = &mut *guard;
        let Some(b) = s.blocks.get_mut(&id).filter(|b| b.live) else { return };
        b.live = false;
        b.fences = fences;
        let (size, requested) = (b.size, b.requested);
        let Some(seg) = s.segments.get_mut(&b.segment) else { return };
        seg.live_blocks -= 1;
        let Some(p) = s.pools.get_mut(&seg.pool) else { return };
        p.stats.in_use_bytes -= size as u64;
        p.stats.requested_bytes -= requested as u64;
        p.stats.live_blocks -= 1;
        if size <= SMALL_LIMIT {
            p.small.entry(size).or_default().push(id);
        } else {
            p.large.entry(size).or_default().push(id);
        }
    }

    /// Give every segment without live blocks, whose fences have all completed, back to the
    /// driver; the bytes released.
    pub fn release_cached(&self) -> u64 {
        let mut guard = self.state();
        let s = &mut *guard;
        let mut released = 0;
        let ids: Vec<u64> = s.segments.iter().filter(|(_, g)| g.live_blocks == 0).map(|(&id, _)| id).collect();
        for seg_id in ids {
            let Some(seg) = s.segments.get(&seg_id) else { continue };
            let done = seg
                .blocks
                .iter()
                .all(|b| s.blocks.get(b).is_none_or(|b| b.fences.iter().all(|(_, f)| self.memory.is_complete(f))));
            if !done {
                continue;
            }
            let Some(seg) = s.segments.remove(&seg_id) else { continue };
            for b in &seg.blocks {
                if let Some(block) = s.blocks.remove(b) {
                    block.fences.into_iter().for_each(|(_, f)| self.memory.recycle(f));
                }
            }
            if let Some(p) = s.pools.get_mut(&seg.pool) {
                for list in p.small.values_mut().chain(p.large.values_mut()) {
                    list.retain(|b| !seg.blocks.contains(b));
                }
                p.small.retain(|_, l| !l.is_empty());
                p.large.retain(|_, l| !l.is_empty());
                if p.current == Some(seg_id) {
                    p.current = None;
                }
                p.stats.reserved_bytes -= seg.bytes as u64;
                p.stats.driver_frees += 1;
            }
            // SAFETY: the segment came from `allocate`, has no live block, and every stream
            // that used one of its blocks has passed the fence recorded at its free.
            unsafe { self.memory.release(seg.address, seg.bytes) };
            released += seg.bytes as u64;
        }
        let empty: Vec<PoolId> = s
            .pools
            .iter()
            .filter(|(id, p)| p.retired && !s.segments.values().any(|g| g.pool == **id))
            .map(|(&id, _)| id)
            .collect();
        for id in empty {
            s.pools.remove(&id);
        }
        released
    }

    /// The counters of one pool (all zero for a pool that no longer exists).
    pub fn pool_stats(&self, pool: PoolId) -> MemoryStats {
        self.state().pools.get(&pool).map(|p| p.stats).unwrap_or_default()
    }

    /// The counters of every pool together (the driver counters of released pools excluded).
    pub fn stats(&self) -> MemoryStats {
        let mut total = MemoryStats::default();
        for p in self.state().pools.values() {
            total.add(&p.stats);
        }
        total
    }
}

impl<M: Memory> Drop for Allocator<M> {
    fn drop(&mut self) {
        // Buffers hold the allocator alive, so nothing is live now; fences may still pend on a
        // GPU, so only what has completed goes back (the rest goes with the context).
        self.release_cached();
    }
}

/// Host memory for the CPU device: zero-filled, [`ALIGNMENT`]-aligned.
pub(crate) struct HostMemory;

impl Memory for HostMemory {
    /// CPU streams run each operation before returning, so there is nothing to wait for.
    type Fence = ();

    fn allocate(&self, bytes: usize) -> Result<u64, String> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), ALIGNMENT).map_err(|e| e.to_string())?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(format!("out of host memory allocating {bytes} bytes"));
        }
        Ok(ptr as u64)
    }

    unsafe fn release(&self, address: u64, bytes: usize) {
        if let Ok(layout) = std::alloc::Layout::from_size_align(bytes.max(1), ALIGNMENT) {
            // SAFETY: allocated by `allocate` with this layout (the caller's contract).
            unsafe { std::alloc::dealloc(address as *mut u8, layout) };
        }
    }

    fn is_complete(&self, _: &()) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    /// Address space only (nothing is dereferenced), with fences the test completes by hand.
    #[derive(Default)]
    struct Fake {
        next: AtomicU64,
        fail: AtomicBool,
    }

    impl Memory for Fake {
        type Fence = Arc<AtomicBool>;
        fn allocate(&self, bytes: usize) -> Result<u64, String> {
            if self.fail.load(Ordering::Relaxed) {
                return Err("out of memory".into());
            }
            // Segments 1 GiB apart, starting at 4 GiB.
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            assert!(bytes <= 1 << 30);
            Ok((n + 4) << 30)
        }
        unsafe fn release(&self, _: u64, _: usize) {}
        fn is_complete(&self, f: &Arc<AtomicBool>) -> bool {
            f.load(Ordering::Relaxed)
        }
    }

    fn fence(done: bool) -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(done))
    }

    #[test]
    fn size_classes_are_aligned_and_bounded() {
        assert_eq!(size_class(0), Some(256));
        assert_eq!(size_class(1), Some(256));
        assert_eq!(size_class(257), Some(512));
        assert_eq!(size_class(1025), Some(1280));
        assert_eq!(size_class(4097), Some(5120));
        assert_eq!(size_class(SMALL_LIMIT), Some(SMALL_LIMIT));
        assert_eq!(size_class(SMALL_LIMIT + 1), Some(2 << 20));
        assert_eq!(size_class(usize::MAX), None);
        let mut last = 0;
        for n in (1..3 << 20).step_by(997) {
            let c = size_class(n).unwrap();
            assert!(c >= n && c.is_multiple_of(ALIGNMENT), "{n} -> {c}");
            assert!(c as f64 <= (n as f64 * 1.25).max(1024.0) || c > SMALL_LIMIT, "{n} -> {c}: over 25 % waste");
            assert!(c >= last);
            last = c;
        }
    }

    #[test]
    fn a_freed_block_is_reused_on_its_stream_without_the_driver() {
        let a = Allocator::new(Fake::default());
        let x = a.allocate(SHARED_POOL, 1000, 1).unwrap();
        let y = a.allocate(SHARED_POOL, 1000, 1).unwrap();
        assert_eq!(x.address % ALIGNMENT as u64, 0);
        assert_eq!(y.address, x.address + 1024, "carved from one segment");
        assert_eq!(a.stats().driver_allocations, 1);
        // A pending fence on the same stream does not matter: stream order covers it.
        a.free(x.id, vec![(1, fence(false))]);
        let z = a.allocate(SHARED_POOL, 900, 1).unwrap();
        assert_eq!((z.address, z.reused), (x.address, true));
        let s = a.stats();
        assert_eq!((s.driver_allocations, s.reuses, s.live_blocks), (1, 1, 2));
        assert_eq!((s.in_use_bytes, s.requested_bytes, s.reserved_bytes), (2048, 1900, SMALL_SEGMENT as u64));
    }

    #[test]
    fn another_stream_reuses_a_block_only_after_its_fences_complete() {
        let a = Allocator::new(Fake::default());
        let x = a.allocate(SHARED_POOL, 4096, 1).unwrap();
        let done = fence(false);
        a.free(x.id, vec![(1, done.clone())]);
        let y = a.allocate(SHARED_POOL, 4096, 2).unwrap();
        assert_ne!(y.address, x.address, "stream 1 may still use it");
        done.store(true, Ordering::Relaxed);
        let z = a.allocate(SHARED_POOL, 4096, 2).unwrap();
        assert_eq!(z.address, x.address);
        // Used on streams 2 and 3, freed: stream 2 waits for 3's fence, and 3 for 2's.
        let (f2, f3) = (fence(false), fence(false));
        a.free(z.id, vec![(2, f2.clone()), (3, f3.clone())]);
        assert_ne!(a.allocate(SHARED_POOL, 4096, 2).unwrap().address, x.address);
        f3.store(true, Ordering::Relaxed);
        assert_eq!(a.allocate(SHARED_POOL, 4096, 2).unwrap().address, x.address);
    }

    #[test]
    fn private_pools_are_isolated_and_released_after_being_dropped() {
        let a = Allocator::new(Fake::default());
        let private = a.create_pool();
        let x = a.allocate(private, 512, 1).unwrap();
        let y = a.allocate(SHARED_POOL, 512, 1).unwrap();
        assert_ne!(x.address >> 30, y.address >> 30, "separate segments");
        a.free(x.id, vec![]);
        assert_ne!(a.allocate(SHARED_POOL, 512, 1).unwrap().address, x.address);
        assert_eq!(a.allocate(private, 512, 1).unwrap().address, x.address);
        assert_eq!(a.pool_stats(private).live_blocks, 1);
        assert_eq!(a.stats().live_blocks, 3);
        let live = a.allocate(private, 512, 1).unwrap();
        a.retire_pool(private);
        assert!(a.allocate(private, 512, 1).is_err());
        assert_eq!(a.release_cached(), 0, "the private segment still has live blocks");
        a.free(x.id, vec![]);
        a.free(live.id, vec![]);
        assert_eq!(a.release_cached(), SMALL_SEGMENT as u64);
        assert_eq!(a.pool_stats(private), MemoryStats::default(), "the retired pool is gone");
    }

    #[test]
    fn large_blocks_fit_within_an_eighth_and_release_waits_for_fences() {
        let a = Allocator::new(Fake::default());
        let big = a.allocate(SHARED_POOL, 10 << 20, 1).unwrap();
        assert_eq!(big.size, 10 << 20);
        let f = fence(false);
        a.free(big.id, vec![(1, f.clone())]);
        assert_eq!(a.allocate(SHARED_POOL, 9 << 20, 1).unwrap().address, big.address, "within 1/8");
        let other = a.allocate(SHARED_POOL, 4 << 20, 1).unwrap();
        assert_ne!(other.address, big.address);
        a.free(other.id, vec![(1, f.clone())]);
        assert_eq!(a.release_cached(), 0, "its fence is pending");
        f.store(true, Ordering::Relaxed);
        assert_eq!(a.release_cached(), 4 << 20);
        let s = a.stats();
        assert_eq!((s.driver_allocations, s.driver_frees, s.reserved_bytes), (2, 1, 10 << 20));
    }

    #[test]
    fn out_of_memory_releases_the_cache_and_then_reports() {
        let a = Allocator::new(Fake::default());
        let x = a.allocate(SHARED_POOL, 3 << 20, 1).unwrap();
        a.free(x.id, vec![]);
        a.memory().fail.store(true, Ordering::Relaxed);
        let e = a.allocate(SHARED_POOL, 64 << 20, 1).unwrap_err();
        assert!(e.contains("out of memory") && e.contains("cached bytes"), "{e}");
        assert_eq!(a.stats().reserved_bytes, 0);
    }
}
