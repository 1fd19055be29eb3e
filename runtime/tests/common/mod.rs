//! Helpers shared by the runtime's integration tests.
#![allow(dead_code)] // each test binary uses a different subset

use ruda_ir::{AddrSpace, Kernel, KernelBuilder, ScalarType, Type};
use ruda_runtime::{require_gpu, Device};

/// `y[i] = x[i] * 2` for `i < n`, one thread per element.
pub fn scale2_kernel() -> Kernel {
    let mut b = KernelBuilder::new("scale2");
    let x = b.param("x", Type::Ptr(AddrSpace::Global, ScalarType::F32));
    let y = b.param("y", Type::Ptr(AddrSpace::Global, ScalarType::F32));
    let n = b.param("n", Type::U32);
    let i = b.global_thread_id_x();
    let in_range = b.lt(i, n);
    b.if_then(in_range, |b| {
        let src = b.ptr_add(x, i);
        let v = b.load(src);
        let two = b.const_f32(2.0);
        let v = b.mul(v, two);
        let dst = b.ptr_add(y, i);
        b.store(dst, v);
    });
    b.finish().expect("scale2 verifies")
}

/// CUDA device 0, or `None` after saying SKIPPED on stderr; with `RUDA_REQUIRE_GPU=1` a
/// missing device fails the test instead.
pub fn cuda_or_skip(test: &str) -> Option<Device> {
    match Device::cuda(0) {
        Ok(d) => Some(d),
        Err(e) if require_gpu() => panic!("{test}: RUDA_REQUIRE_GPU=1 but no CUDA device: {e}"),
        Err(e) => {
            eprintln!("SKIPPED: no CUDA device ({test}: {e})");
            None
        }
    }
}
