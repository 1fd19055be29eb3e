//! Streams a caller creates and events on the CPU device: events are complete when recorded,
//! waits are no-ops, and elapsed time is host time between the recordings.

use std::time::Duration;

use ruda_ir::interp::LaunchConfig;
use ruda_runtime::{Arg, DType, Device, Tensor};

use crate::common;

#[test]
fn created_streams_launch_read_and_write() {
    let d = Device::cpu();
    let s = d.create_stream().unwrap();
    assert!(!s.same_stream(&d.default_stream()));
    assert!(d.default_stream().same_stream(&d.clone().default_stream()));
    let x = Tensor::from_slice_on(&s, &[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let y = Tensor::zeros_on(&s, DType::F32, &[3]).unwrap();
    let k = common::scale2_kernel();
    s.launch(&k, LaunchConfig::linear(1, 32), &[Arg::Tensor(&x), Arg::Tensor(&y), Arg::scalar(3u32)]).unwrap();
    s.synchronize().unwrap();
    assert_eq!(y.to_vec_on::<f32>(&s).unwrap(), vec![2.0, 4.0, 6.0]);
    y.copy_from_slice_on(&d.default_stream(), &[5.0f32, 6.0, 7.0]).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![5.0, 6.0, 7.0]);
}

#[test]
fn cpu_events_are_complete_and_time_host_work() {
    let d = Device::cpu();
    let (a, b) = (d.default_stream(), d.create_stream().unwrap());
    let start = a.record_event().unwrap();
    assert!(start.is_complete().unwrap());
    std::thread::sleep(Duration::from_millis(20));
    let end = a.record_event().unwrap();
    b.wait_event(&end).unwrap();
    end.synchronize().unwrap();
    let ms = start.elapsed_ms(&end).unwrap();
    assert!((20.0..2000.0).contains(&ms), "{ms} ms");
    assert!(end.elapsed_ms(&start).unwrap() < 0.0, "end before start is negative");
    assert_eq!(start.device(), &d);
}

#[test]
fn measure_on_stream_times_with_events() {
    let d = Device::cpu();
    let s = d.create_stream().unwrap();
    let mut calls = 0;
    let ms = ruda_runtime::measure_on_stream(&s, 2, || {
        calls += 1;
        std::thread::sleep(Duration::from_millis(2));
        Ok(())
    })
    .unwrap();
    assert!(ms >= 2.0, "{ms} ms per launch");
    assert!(calls > 2);
    let e = ruda_runtime::measure_on_stream(&s, 1, || Err("boom".into())).unwrap_err();
    assert_eq!(e, "boom");
}

#[test]
fn handles_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ruda_runtime::Stream>();
    send_sync::<ruda_runtime::Event>();
    send_sync::<ruda_runtime::MemoryPool>();
    send_sync::<ruda_runtime::Buffer>();
    send_sync::<Tensor>();
    send_sync::<Device>();
}
