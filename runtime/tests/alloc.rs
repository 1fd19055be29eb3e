//! The caching allocator on the CPU device, which keeps the same books over host memory:
//! reuse without new segments, 256-byte alignment, reuse across streams, private pools,
//! statistics and releasing the cache. Each `Device::cpu()` has its own allocator, so these
//! counts are not disturbed by other tests.

use ruda_runtime::{Buffer, DType, Device, MemoryStats, Tensor};

#[test]
fn freed_buffers_are_reused_without_new_segments() {
    let d = Device::cpu();
    assert_eq!(d.memory_stats(), MemoryStats::default());
    let first = Tensor::empty(&d, DType::F32, &[1000]).unwrap();
    let address = first.buffer().address();
    let after_first = d.memory_stats();
    assert_eq!((after_first.driver_allocations, after_first.live_blocks), (1, 1));
    assert_eq!(after_first.requested_bytes, 4000);
    assert_eq!(after_first.in_use_bytes, 4096, "4000 bytes round up to the 4 KiB class");
    drop(first);
    for step in 0..100 {
        let t = Tensor::zeros(&d, DType::F32, &[1000]).unwrap();
        assert_eq!(t.buffer().address(), address, "step {step}");
    }
    let s = d.memory_stats();
    assert_eq!((s.driver_allocations, s.reuses, s.live_blocks, s.in_use_bytes), (1, 100, 0, 0));
    assert!(s.reserved_bytes >= 4096);
}

#[test]
fn every_buffer_is_256_byte_aligned_and_reused_memory_is_zeroed() {
    let d = Device::cpu();
    let sizes = [1usize, 3, 255, 256, 257, 1000, 4097, 65_537, 1 << 20, (1 << 20) + 1, 5 << 20];
    let held: Vec<Buffer> = sizes.iter().map(|&n| Buffer::uninit(&d, n).unwrap()).collect();
    for (b, n) in held.iter().zip(sizes) {
        assert_eq!(b.address() % 256, 0, "{n} bytes at {:#x}", b.address());
        assert_eq!(b.len(), n);
    }
    // Dirty a block, free it, and get it back: `uninit` on the CPU still reads as zeros.
    let t = Tensor::from_slice(&d, &[7u8; 300], &[300]).unwrap();
    let address = t.buffer().address();
    drop(t);
    let again = Tensor::empty(&d, DType::U8, &[300]).unwrap();
    assert_eq!(again.buffer().address(), address);
    assert!(again.to_vec::<u8>().unwrap().iter().all(|&b| b == 0));
    // Live buffers never overlap.
    let mut ranges: Vec<(u64, u64)> = held.iter().map(|b| (b.address(), b.address() + b.len() as u64)).collect();
    ranges.sort();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{ranges:x?}");
}

#[test]
fn a_block_freed_on_one_stream_serves_another_once_its_event_completed() {
    // CPU events complete when recorded, so the other stream may take the block at once.
    let d = Device::cpu();
    let (a, b) = (d.default_stream(), d.create_stream().unwrap());
    assert!(!a.same_stream(&b));
    let t = Tensor::empty_on(&a, DType::F32, &[64]).unwrap();
    assert!(t.buffer().stream().same_stream(&a));
    let address = t.buffer().address();
    drop(t);
    let u = Tensor::empty_on(&b, DType::F32, &[64]).unwrap();
    assert_eq!(u.buffer().address(), address);
    assert!(u.buffer().stream().same_stream(&b));
    assert_eq!(d.memory_stats().driver_allocations, 1);
}

#[test]
fn private_pools_do_not_share_blocks_and_go_back_when_dropped() {
    let d = Device::cpu();
    let s = d.default_stream();
    let pool = d.create_memory_pool();
    let p = Tensor::empty_in(&pool, &s, DType::F32, &[256]).unwrap();
    let shared = Tensor::empty(&d, DType::F32, &[256]).unwrap();
    let private_address = p.buffer().address();
    drop(p);
    // The shared pool does not take the private block...
    let other = Tensor::empty(&d, DType::F32, &[256]).unwrap();
    assert_ne!(other.buffer().address(), private_address);
    // ...the private pool does.
    let q = Tensor::empty_in(&pool, &s, DType::F32, &[256]).unwrap();
    assert_eq!(q.buffer().address(), private_address);
    assert_eq!(pool.stats().live_blocks, 1);
    assert_eq!(pool.stats().driver_allocations, 1);
    assert_eq!(d.memory_stats().live_blocks, 3);
    // A pool of another CPU device is refused.
    let foreign = Device::cpu().default_stream();
    assert!(Tensor::empty_in(&pool, &foreign, DType::F32, &[4]).is_err());
    let reserved = d.memory_stats().reserved_bytes;
    drop(pool);
    drop(q);
    drop((shared, other));
    let released = d.release_cached_memory().unwrap();
    assert_eq!(released, reserved, "everything is free, so everything goes back");
    let s = d.memory_stats();
    assert_eq!((s.reserved_bytes, s.live_blocks), (0, 0));
    assert!(s.driver_frees >= 1);
}

#[test]
fn release_keeps_live_buffers() {
    let d = Device::cpu();
    let keep = Tensor::from_slice(&d, &[1.0f32, 2.0, 3.0], &[3]).unwrap();
    drop(Tensor::zeros(&d, DType::F32, &[3 << 20]).unwrap());
    assert_eq!(d.release_cached_memory().unwrap(), 12 << 20);
    assert_eq!(keep.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(d.memory_stats().live_blocks, 1);
}
