//! The runtime's counters of allocations, host synchronisations and launches, on the CPU device.

use crate::common;

use ruda_ir::interp::LaunchConfig;
use ruda_runtime::{Arg, DType, Device, RuntimeCounters, Tensor};

#[test]
fn allocations_count_every_buffer_reused_or_not() {
    let d = Device::cpu();
    let start = d.counters();
    let a = Tensor::zeros(&d, DType::F32, &[4]).unwrap();
    drop(a);
    // Served from the cache (no driver call), still a new buffer.
    let _b = Tensor::zeros(&d, DType::F32, &[4]).unwrap();
    assert_eq!(d.memory_stats().reuses, 1);
    let _c = Tensor::empty_on(&d.create_stream().unwrap(), DType::F16, &[3]).unwrap();
    let views = _b.narrow(0, 1, 2).unwrap().reshape(&[2, 1]).unwrap(); // views allocate nothing
    drop(views);
    assert_eq!(d.counters().since(&start), RuntimeCounters { allocations: 3, host_syncs: 0, launches: 0 });
}

#[test]
fn host_syncs_count_synchronisations_and_reads() {
    let d = Device::cpu();
    let x = Tensor::from_slice(&d, &[1.0f32, 2.0], &[2]).unwrap();
    let start = d.counters();
    x.to_vec::<f32>().unwrap();
    x.buffer().read(0..4).unwrap();
    d.default_stream().synchronize().unwrap();
    d.synchronize().unwrap();
    let s = d.create_stream().unwrap();
    let (e0, e1) = (s.record_event().unwrap(), s.record_event().unwrap());
    e1.synchronize().unwrap();
    e0.elapsed_ms(&e1).unwrap();
    assert!(e1.is_complete().unwrap(), "a query does not block");
    // Writes are stream-ordered and do not wait.
    x.copy_from_slice(&[3.0f32, 4.0]).unwrap();
    assert_eq!(d.counters().since(&start), RuntimeCounters { allocations: 0, host_syncs: 6, launches: 0 });
}

#[test]
fn launches_count_kernels_that_ran_and_counters_are_per_device() {
    let d = Device::cpu();
    let other = Device::cpu();
    let k = common::scale2_kernel();
    let x = Tensor::from_slice(&d, &[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[3]).unwrap();
    let start = d.counters();
    let s = d.create_stream().unwrap();
    for stream in [d.default_stream(), s.clone(), d.clone().default_stream()] {
        stream.launch(&k, LaunchConfig::linear(1, 32), &[(&x).into(), (&y).into(), Arg::scalar(3u32)]).unwrap();
    }
    // A launch the checks refuse is not counted.
    s.launch(&k, LaunchConfig::linear(1, 32), &[(&x).into(), (&x).into(), Arg::scalar(3u32)]).unwrap_err();
    s.launch(&k, LaunchConfig::linear(0, 32), &[(&x).into(), (&y).into(), Arg::scalar(3u32)]).unwrap_err();
    assert_eq!(d.counters().since(&start), RuntimeCounters { allocations: 0, host_syncs: 0, launches: 3 });
    assert_eq!(other.counters(), RuntimeCounters::default(), "another CPU device counts on its own");
}

#[test]
fn since_subtracts_and_saturates() {
    let a = RuntimeCounters { allocations: 5, host_syncs: 2, launches: 9 };
    let b = RuntimeCounters { allocations: 3, host_syncs: 2, launches: 1 };
    assert_eq!(a.since(&b), RuntimeCounters { allocations: 2, host_syncs: 0, launches: 8 });
    assert_eq!(b.since(&a), RuntimeCounters { allocations: 0, host_syncs: 0, launches: 0 });
}
