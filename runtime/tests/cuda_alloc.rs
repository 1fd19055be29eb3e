//! The caching allocator on a GPU: per-step buffers do not call the driver, blocks are
//! 256-byte aligned, a block freed on a busy stream is not handed to another stream before
//! that stream's work is done, private pools are isolated, and the cache can be released. Its
//! own test binary: the counters are per device, so concurrent tests would disturb them.

mod common;

use ruda_ir::interp::LaunchConfig;
use ruda_runtime::{Arg, DType, HashedKernel, Tensor};

#[test]
fn cuda_caching_allocator() {
    let Some(d) = common::cuda_or_skip("cuda_caching_allocator") else { return };
    let s = d.default_stream();

    // Per-step buffers: after the first step, no driver allocation.
    drop(Tensor::empty(&d, DType::F16, &[4096]).unwrap());
    drop(Tensor::zeros(&d, DType::F32, &[3 << 20]).unwrap());
    let before = d.memory_stats();
    for _ in 0..100 {
        let a = Tensor::empty(&d, DType::F16, &[4096]).unwrap();
        let b = Tensor::zeros(&d, DType::F32, &[3 << 20]).unwrap();
        assert_eq!(a.buffer().address() % 256, 0);
        assert_eq!(b.buffer().address() % 256, 0);
    }
    let after = d.memory_stats();
    assert_eq!(after.driver_allocations, before.driver_allocations, "{before:?} -> {after:?}");
    assert_eq!(after.reuses, before.reuses + 200);
    // Reused zeros are zeros.
    let dirty = Tensor::from_slice(&d, &vec![1.0f32; 1000], &[1000]).unwrap();
    let address = dirty.buffer().address();
    drop(dirty);
    let clean = Tensor::zeros(&d, DType::F32, &[1000]).unwrap();
    assert_eq!(clean.buffer().address(), address);
    assert!(clean.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));

    // A block freed while its stream is busy is not reused on another stream until the fence
    // recorded at its free has completed.
    let busy = d.create_stream().unwrap();
    let other = d.create_stream().unwrap();
    let k = HashedKernel::new(common::scale2_kernel());
    let n = 1u32 << 24;
    let x = Tensor::zeros_on(&busy, DType::F32, &[n as usize]).unwrap();
    let y = Tensor::empty_on(&busy, DType::F32, &[n as usize]).unwrap();
    let y_address = y.buffer().address();
    busy.synchronize().unwrap();
    for _ in 0..500 {
        busy.launch(
            &k,
            LaunchConfig::linear(n.div_ceil(256), 256),
            &[Arg::Tensor(&x), Arg::Tensor(&y), Arg::scalar(n)],
        )
        .unwrap();
    }
    drop(y);
    let elsewhere = Tensor::empty_on(&other, DType::F32, &[n as usize]).unwrap();
    assert_ne!(elsewhere.buffer().address(), y_address, "taken while the busy stream may still write it");
    busy.synchronize().unwrap();
    let again = Tensor::empty_on(&other, DType::F32, &[n as usize]).unwrap();
    assert_eq!(again.buffer().address(), y_address, "once the busy stream is done, the other may take it");
    drop((elsewhere, again));

    // A private pool keeps its blocks to itself.
    let pool = d.create_memory_pool();
    let p = Tensor::empty_in(&pool, &s, DType::F32, &[1000]).unwrap();
    let private_address = p.buffer().address();
    drop(p);
    let shared = Tensor::empty(&d, DType::F32, &[1000]).unwrap();
    assert_ne!(shared.buffer().address(), private_address);
    assert_eq!(Tensor::empty_in(&pool, &s, DType::F32, &[1000]).unwrap().buffer().address(), private_address);
    assert_eq!(pool.stats().driver_allocations, 1);
    drop(pool);

    // Releasing the cache returns every segment without live buffers.
    drop((shared, clean, x));
    let reserved = d.memory_stats().reserved_bytes;
    let released = d.release_cached_memory().unwrap();
    assert!(released > 0 && released <= reserved, "{released} of {reserved}");
    let s = d.memory_stats();
    assert_eq!(s.reserved_bytes, reserved - released);
}
