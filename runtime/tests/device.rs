//! Device selection. On a machine without a CUDA driver (the usual test machine) asking for
//! a GPU must be an error with a clear message, never a panic.

use ruda_runtime::{probe_driver, Device, DeviceKind, DeviceSpec, RuntimeError};

#[test]
fn cpu_device() {
    let d = Device::cpu();
    assert!(d.is_cpu() && !d.is_cuda());
    assert_eq!(d.kind(), DeviceKind::Cpu);
    assert_eq!(d, Device::from_spec(DeviceSpec::Cpu).unwrap());
    assert!(d.cuda_info().is_none() && d.compiler().is_none());
    assert!(d.target(false).is_err());
    assert_eq!(d.to_string(), "cpu");
    d.synchronize().unwrap();
}

#[test]
fn cuda_without_a_driver_is_an_error() {
    let spec = DeviceSpec::parse(Some("cuda")).unwrap();
    match probe_driver() {
        Err(RuntimeError::NoCudaDriver { reason }) => {
            assert!(!reason.is_empty());
            let err = Device::from_spec(spec).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("RUDA_DEVICE=cuda:0"), "{msg}");
            assert!(msg.contains("no CUDA driver"), "{msg}");
            assert!(msg.contains("RUDA_DEVICE=cpu"), "{msg}");
            let err = Device::cuda(0).unwrap_err();
            assert!(err.to_string().contains("CUDA device 0 is not available"), "{err}");
            let err = Device::cuda(7).unwrap_err();
            assert!(err.to_string().contains("no CUDA driver"), "{err}");
        }
        Err(other) => panic!("the probe failed with an unexpected error: {other}"),
        Ok(probe) => {
            // A GPU machine: the same requests succeed or fail on the device count.
            eprintln!("driver found: {probe:?}");
            let outcome = Device::from_spec(spec);
            assert_eq!(outcome.is_ok(), probe.device_count > 0, "{outcome:?}");
            let missing = probe.device_count;
            let err = Device::cuda(missing).unwrap_err();
            assert!(err.to_string().contains(&format!("CUDA device {missing} does not exist")), "{err}");
        }
    }
}

#[test]
fn auto_falls_back_to_the_interpreter_without_a_driver() {
    let d = Device::from_spec(DeviceSpec::Auto).unwrap();
    match probe_driver() {
        Ok(p) if p.device_count > 0 => assert!(d.is_cuda(), "{d:?}"),
        _ => assert!(d.is_cpu(), "{d:?}"),
    }
}

#[test]
fn handles_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Device>();
    send_sync::<ruda_runtime::Stream>();
    send_sync::<ruda_runtime::Tensor>();
    send_sync::<ruda_runtime::Buffer>();
    send_sync::<ruda_runtime::HashedKernel>();
    send_sync::<RuntimeError>();
}
