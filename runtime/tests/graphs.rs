//! Graph capture and replay: on the CPU device (recorded launches rerun over the buffers'
//! contents at replay time) and, when there is one, on a GPU (a CUDA graph).

use crate::common;

use ruda_ir::interp::LaunchConfig;
use ruda_runtime::{Arg, DType, Device, RuntimeCounters, RuntimeError, Stream, Tensor};

/// `y = 2x`, then `z = 2y`, on `s`.
fn two_scales(s: &Stream, x: &Tensor, y: &Tensor, z: &Tensor) -> Result<(), RuntimeError> {
    let k = common::scale2_kernel();
    let n = x.numel() as u32;
    let cfg = LaunchConfig::linear(n.div_ceil(32), 32);
    s.launch(&k, cfg, &[x.into(), y.into(), Arg::scalar(n)])?;
    s.launch(&k, cfg, &[y.into(), z.into(), Arg::scalar(n)])
}

fn capture_and_replay(d: &Device) {
    let s = d.create_stream().unwrap();
    let x = Tensor::from_slice_on(&s, &[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let y = Tensor::zeros_on(&s, DType::F32, &[3]).unwrap();
    let z = Tensor::zeros_on(&s, DType::F32, &[3]).unwrap();
    s.begin_capture().unwrap();
    two_scales(&s, &x, &y, &z).unwrap();
    let graph = s.end_capture().unwrap();
    assert_eq!(graph.launches(), 2);
    assert_eq!(z.to_vec_on::<f32>(&s).unwrap(), [0.0; 3], "capture runs nothing");
    for round in 1..=3 {
        let xs: Vec<f32> = (0..3).map(|i| (i * round) as f32 - 0.5).collect();
        x.copy_from_slice_on(&s, &xs).unwrap();
        let before = d.counters();
        graph.launch(&s).unwrap();
        assert_eq!(
            d.counters().since(&before),
            RuntimeCounters { allocations: 0, host_syncs: 0, launches: 2 },
            "a replay allocates and waits for nothing"
        );
        let want: Vec<f32> = xs.iter().map(|v| v * 4.0).collect();
        assert_eq!(z.to_vec_on::<f32>(&s).unwrap(), want, "replay {round} reads the new input");
    }
    // Another stream of the device replays it too.
    let other = d.create_stream().unwrap();
    other.wait_event(&s.record_event().unwrap()).unwrap();
    graph.launch(&other).unwrap();
    other.synchronize().unwrap();
}

#[test]
fn captured_kernels_replay_over_the_buffers_contents_on_the_cpu() {
    capture_and_replay(&Device::cpu());
}

#[test]
fn captured_kernels_replay_on_a_gpu() {
    if let Some(d) = common::cuda_or_skip("captured_kernels_replay_on_a_gpu") {
        capture_and_replay(&d);
    }
}

/// Begin a capture with one kernel in it, run `forbidden`, and check it fails naming `what`,
/// that it ended the capture and that `end_capture` says why.
fn forbidden_in_capture(what: &str, forbidden: impl FnOnce(&Stream, &Tensor) -> Result<(), RuntimeError>) {
    let d = Device::cpu();
    let s = d.default_stream();
    let x = Tensor::from_slice(&d, &[1.0f32, 2.0], &[2]).unwrap();
    let (y, z) = (Tensor::zeros(&d, DType::F32, &[2]).unwrap(), Tensor::zeros(&d, DType::F32, &[2]).unwrap());
    s.begin_capture().unwrap();
    two_scales(&s, &x, &y, &z).unwrap();
    let e = forbidden(&s, &x).expect_err(what);
    assert!(matches!(e, RuntimeError::GraphCapture { .. }), "{what}: {e}");
    assert!(e.to_string().contains(what) && e.to_string().contains("capture"), "{e}");
    // The capture is over: launching into it fails until end_capture, which reports the call.
    let relaunch = two_scales(&s, &x, &y, &z).unwrap_err();
    assert!(relaunch.to_string().contains(what), "{relaunch}");
    let end = s.end_capture().unwrap_err();
    assert!(end.to_string().contains(what), "{end}");
    // Then the stream works as before.
    two_scales(&s, &x, &y, &z).unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), [4.0, 8.0]);
}

#[test]
fn an_allocation_during_capture_is_an_error_that_ends_it() {
    forbidden_in_capture("allocating 16 bytes", |s, _| Tensor::empty_on(s, DType::F32, &[4]).map(drop));
}

#[test]
fn a_read_back_during_capture_is_an_error_that_ends_it() {
    forbidden_in_capture("reading 8 bytes back", |_, x| x.to_vec::<f32>().map(drop));
}

#[test]
fn a_host_copy_during_capture_is_an_error_that_ends_it() {
    forbidden_in_capture("copying 8 bytes from the host", |_, x| x.copy_from_slice(&[5.0f32, 6.0]));
}

#[test]
fn synchronisations_during_capture_are_errors_that_end_it() {
    forbidden_in_capture("synchronising Stream", |s, _| s.synchronize());
    forbidden_in_capture("synchronising cpu", |s, _| s.device().synchronize());
    forbidden_in_capture("waiting for an event", |s, _| s.record_event()?.synchronize());
}

#[test]
fn other_streams_work_while_one_captures() {
    let d = Device::cpu();
    let (s, other) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    s.begin_capture().unwrap();
    let x = Tensor::from_slice_on(&other, &[1.0f32, 2.0], &[2]).unwrap();
    let (y, z) =
        (Tensor::zeros_on(&other, DType::F32, &[2]).unwrap(), Tensor::zeros_on(&other, DType::F32, &[2]).unwrap());
    two_scales(&other, &x, &y, &z).unwrap();
    assert_eq!(z.to_vec_on::<f32>(&other).unwrap(), [4.0, 8.0]);
    assert_eq!(s.end_capture().unwrap().launches(), 0);
}

#[test]
fn capture_misuse_is_an_error() {
    let d = Device::cpu();
    let s = d.default_stream();
    assert!(s.end_capture().unwrap_err().to_string().contains("no capture was begun"));
    let x = Tensor::zeros(&d, DType::F32, &[2]).unwrap();
    s.begin_capture().unwrap();
    assert!(s.begin_capture().unwrap_err().to_string().contains("capturing already"));
    // Arguments the interpreter refuses are refused at capture, not at a replay.
    let overlap =
        s.launch(&common::scale2_kernel(), LaunchConfig::linear(1, 32), &[(&x).into(), (&x).into(), Arg::scalar(2u32)]);
    assert!(overlap.unwrap_err().to_string().contains("overlap"));
    let graph = s.end_capture().unwrap();
    assert_eq!(graph.launches(), 0);
    // Not on a stream that is capturing.
    s.begin_capture().unwrap();
    assert!(graph.launch(&s).unwrap_err().to_string().contains("capturing"));
    s.end_capture().unwrap();
}

#[test]
fn buffers_dropped_after_capture_stay_alive_for_the_graph() {
    let d = Device::cpu();
    let s = d.default_stream();
    let x = Tensor::from_slice(&d, &[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let z = Tensor::zeros(&d, DType::F32, &[3]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[3]).unwrap();
    let y_address = y.buffer().address();
    s.begin_capture().unwrap();
    two_scales(&s, &x, &y, &z).unwrap();
    let graph = s.end_capture().unwrap();
    drop(y);
    // A new buffer of y's size does not get y's block while the graph holds it.
    let w = Tensor::from_slice(&d, &[9.0f32, 9.0, 9.0], &[3]).unwrap();
    assert_ne!(w.buffer().address(), y_address);
    graph.launch(&s).unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), [4.0, 8.0, 12.0]);
    assert_eq!(w.to_vec::<f32>().unwrap(), [9.0; 3]);
}
