//! The same checks on a GPU. Without a CUDA device each test says SKIPPED on stderr and passes,
//! unless RUDA_REQUIRE_GPU=1.

use crate::common;

use half::{bf16, f16};
use ruda_ir::interp::LaunchConfig;
use ruda_ir::{AddrSpace, KernelBuilder, ScalarType, Type};
use ruda_runtime::{Arg, DType, Device, Element, Tensor};

fn round_trip<T: Element + PartialEq>(d: &Device, values: &[T]) {
    let t = Tensor::from_slice(d, values, &[values.len()]).unwrap();
    assert_eq!(t.to_vec::<T>().unwrap(), values, "{}", T::DTYPE);
    let z = Tensor::zeros(d, T::DTYPE, &[3, 5]).unwrap();
    assert!(z.to_bytes().unwrap().iter().all(|&b| b == 0), "{}", T::DTYPE);
}

#[test]
fn cuda_device_info_and_round_trips() {
    let Some(d) = common::cuda_or_skip("cuda_device_info_and_round_trips") else { return };
    let info = d.cuda_info().unwrap();
    eprintln!("{} : {info:?}", d.description());
    assert!(info.compute_capability.0 >= 8);
    assert!(info.total_memory > 1 << 30);
    assert!(info.max_shared_memory_per_block_optin >= 48 * 1024);
    assert!(d.target(false).is_ok());
    assert_eq!(Device::cuda(0).unwrap(), d);

    round_trip(&d, &[1.5f32, -0.0, f32::MAX, f32::INFINITY]);
    round_trip(&d, &[f16::from_f32(1.5), f16::MAX]);
    round_trip(&d, &[bf16::from_f32(1.5), bf16::MIN]);
    round_trip(&d, &[1.5f64, -1e300]);
    round_trip(&d, &[i8::MIN, i8::MAX]);
    round_trip(&d, &[i16::MIN, i16::MAX]);
    round_trip(&d, &[i32::MIN, -1, i32::MAX]);
    round_trip(&d, &[i64::MIN, i64::MAX]);
    round_trip(&d, &[0u8, 255, 7]);
    round_trip(&d, &[0u16, u16::MAX]);
    round_trip(&d, &[0u32, u32::MAX]);
    round_trip(&d, &[0u64, u64::MAX]);

    let data: Vec<i32> = (0..24).collect();
    let t = Tensor::from_slice(&d, &data, &[6, 4]).unwrap();
    assert_eq!(t.narrow(1, 2, 1).unwrap().to_vec::<i32>().unwrap(), vec![2, 6, 10, 14, 18, 22]);
    assert_eq!(t.to_device(&Device::cpu()).unwrap().to_vec::<i32>().unwrap(), data);
    let e = Tensor::zeros(&d, DType::F32, &[0]).unwrap();
    assert!(e.to_vec::<f32>().unwrap().is_empty());
    let u = Tensor::empty(&d, DType::U8, &[1 << 20]).unwrap();
    assert_eq!(u.to_bytes().unwrap().len(), 1 << 20);
}

/// `y[i] = x[i]` staged through `len` f32s of dynamic shared memory (more than 48 KiB).
#[test]
fn cuda_large_dynamic_shared_memory() {
    let Some(d) = common::cuda_or_skip("cuda_large_dynamic_shared_memory") else { return };
    let mut b = KernelBuilder::new("stage_through_smem");
    let x = b.param("x", Type::Ptr(AddrSpace::Global, ScalarType::F32));
    let y = b.param("y", Type::Ptr(AddrSpace::Global, ScalarType::F32));
    let smem = b.dyn_shared_ptr(ScalarType::F32);
    let t = b.thread_id_x();
    // Use the far end of the window, so that a too-small window faults.
    let far = b.const_u32(16 * 1024);
    let slot = b.add(t, far);
    let src = b.ptr_add(x, t);
    let v = b.load(src);
    let p = b.ptr_add(smem, slot);
    b.store(p, v);
    b.barrier();
    let v = b.load(p);
    let dst = b.ptr_add(y, t);
    b.store(dst, v);
    let k = b.finish().expect("verifies");
    let xs: Vec<f32> = (0..256).map(|i| i as f32).collect();
    let x = Tensor::from_slice(&d, &xs, &[256]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[256]).unwrap();
    let bytes = (16 * 1024 + 256) * 4; // 65 KiB
    let cfg = LaunchConfig { grid: [1, 1, 1], block: [256, 1, 1], dynamic_shared_bytes: bytes };
    d.default_stream().launch(&k, cfg, &[Arg::Tensor(&x), Arg::Tensor(&y)]).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), xs);
    let too_much = LaunchConfig { dynamic_shared_bytes: 1 << 20, ..cfg };
    assert!(d.default_stream().launch(&k, too_much, &[Arg::Tensor(&x), Arg::Tensor(&y)]).is_err());
}

#[test]
fn cuda_rejects_cpu_tensors() {
    let Some(d) = common::cuda_or_skip("cuda_rejects_cpu_tensors") else { return };
    let k = common::scale2_kernel();
    let x = Tensor::zeros(&Device::cpu(), DType::F32, &[4]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[4]).unwrap();
    let err = d
        .default_stream()
        .launch(&k, LaunchConfig::linear(1, 32), &[Arg::Tensor(&x), Arg::Tensor(&y), Arg::scalar(4u32)])
        .unwrap_err();
    assert!(err.to_string().contains("the tensor is on cpu, the launch on cuda:0"), "{err}");
}

/// Two created streams ordered by an event: the second stream's kernel reads what the first
/// one's wrote; events time the work; streams and events of the CPU device are refused.
#[test]
fn cuda_streams_ordered_by_events() {
    let Some(d) = common::cuda_or_skip("cuda_streams_ordered_by_events") else { return };
    let (s1, s2) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    assert!(!s1.same_stream(&s2) && !s1.same_stream(&d.default_stream()));
    let k = common::scale2_kernel();
    let n = 1u32 << 22;
    let xs: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let x = Tensor::from_slice_on(&s1, &xs, &[n as usize]).unwrap();
    let y = Tensor::empty_on(&s1, DType::F32, &[n as usize]).unwrap();
    let z = Tensor::empty_on(&s2, DType::F32, &[n as usize]).unwrap();
    let cfg = LaunchConfig::linear(n.div_ceil(256), 256);
    let start = s1.record_event().unwrap();
    // Several launches so that s2 would overtake s1 without the event.
    for _ in 0..20 {
        s1.launch(&k, cfg, &[Arg::Tensor(&x), Arg::Tensor(&y), Arg::scalar(n)]).unwrap();
    }
    let done = s1.record_event().unwrap();
    s2.wait_event(&done).unwrap();
    s2.launch(&k, cfg, &[Arg::Tensor(&y), Arg::Tensor(&z), Arg::scalar(n)]).unwrap();
    let want: Vec<f32> = xs.iter().map(|v| v * 4.0).collect();
    assert_eq!(z.to_vec_on::<f32>(&s2).unwrap(), want);
    done.synchronize().unwrap();
    assert!(done.is_complete().unwrap());
    let ms = start.elapsed_ms(&done).unwrap();
    assert!(ms > 0.0 && ms < 10_000.0, "{ms} ms");
    assert_eq!(x.buffer().address() % 256, 0);
    assert_eq!(z.buffer().address() % 256, 0);

    let cpu = Device::cpu();
    let cpu_event = cpu.default_stream().record_event().unwrap();
    assert!(matches!(s1.wait_event(&cpu_event), Err(ruda_runtime::RuntimeError::DeviceMismatch { .. })));
    assert!(cpu.default_stream().wait_event(&done).is_err());
    assert!(cpu_event.elapsed_ms(&done).is_err());
    assert!(x.to_vec_on::<f32>(&cpu.default_stream()).is_err());
    d.synchronize().unwrap();
}
