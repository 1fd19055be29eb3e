use crate::common;

use common::{check, Input};
use ruda_codegen_ptx::Arch;
use ruda_ir::interp::LaunchConfig;
use ruda_ir::{AddrSpace, Constant, KernelBuilder, ScalarType, Type};

#[test]
fn a_block_reduction_matches() {
    let mut b = KernelBuilder::new("sum_rows");
    let x = b.param("x", Type::Ptr(AddrSpace::Global, ScalarType::F32));
    let out = b.param("out", Type::Ptr(AddrSpace::Global, ScalarType::F32));
    let n = b.param("n", Type::U32);
    let tid = b.thread_id_x();
    let row = b.block_id_x();
    let idx = b.mul(row, n);
    let idx = b.add(idx, tid);
    let p = b.ptr_add(x, idx);
    let v = b.load(p);
    let mut v = v;
    for m in [16, 8, 4, 2, 1] {
        let o = b.shfl_xor(v, m);
        v = b.add(v, o);
    }
    let zero = b.const_u32(0);
    let lane0 = b.eq(tid, zero);
    b.if_then(lane0, |b| {
        let q = b.ptr_add(out, row);
        b.store(q, v);
    });
    let k = b.finish().expect("verifies");
    let xs: Vec<u8> = (0..64).flat_map(|i| (i as f32 * 0.37).to_le_bytes()).collect();
    check(
        &k,
        &LaunchConfig::linear(2, 32),
        &[Input::Buffer(xs), Input::Buffer(vec![0; 8]), Input::Scalar(Constant::u32(32))],
        &[Arch::Sm80],
    );
}
