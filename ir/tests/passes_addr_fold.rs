//! `addr-fold`: constant offsets end as the last `ptradd`, combined; a 32-bit `add` moves out
//! of a 64-bit address only when it provably does not wrap.

use crate::passes_support;

use passes_support::*;
use ruda_ir::interp::LaunchConfig;
use ruda_ir::*;

use ScalarType::*;

/// The address of the last load: (its index is a constant, its base is a `ptradd`).
fn address_shape(k: &Kernel) -> (bool, bool) {
    let def = |v: Value| k.insts.iter().find(|i| i.results.first() == Some(&v)).map(|i| i.op.clone());
    let mut out = None;
    k.walk(|_, i| {
        let Op::Load { ptr, .. } = i.op else { return };
        if let Some(Op::PtrAdd(p, idx)) = def(ptr) {
            out = Some((matches!(def(idx), Some(Op::Const(_))), matches!(def(p), Some(Op::PtrAdd(..)))));
        }
    });
    out.expect("a load through a ptradd")
}

/// `out[tid] = x[index(tid)]` with `x` of 64 `u32`s.
fn gather(space: AddrSpace, index: impl FnOnce(&mut KernelBuilder, Value, Value) -> Value) -> Kernel {
    let mut b = KernelBuilder::new("gather");
    let x = b.param("x", gptr(U32));
    let out = b.param("out", gptr(U32));
    let n = b.param("n", Type::U32);
    let tid = b.thread_id_x();
    let src = match space {
        AddrSpace::Shared => {
            let s = b.shared_array("copy", U32, 64);
            let s = b.shared_ptr(s);
            // Stage x into shared memory first.
            let c64 = b.const_u32(64);
            let ok = b.lt(tid, c64);
            b.if_then(ok, |b| {
                let p = b.ptr_add(x, tid);
                let v = b.load(p);
                let q = b.ptr_add(s, tid);
                b.store(q, v);
            });
            b.barrier();
            s
        }
        _ => x,
    };
    let i = index(&mut b, tid, n);
    let p = b.ptr_add(src, i);
    let v = b.load(p);
    let q = b.ptr_add(out, tid);
    b.store(q, v);
    b.finish().unwrap()
}

fn gather_args(n: u32) -> Vec<Arg> {
    let x: Vec<u64> = (0..64).map(|v| v * 10 + 1).collect();
    vec![Arg::Buffer(bytes_of(&x, 4)), Arg::Buffer(vec![0; 4 * 32]), Arg::Scalar(Constant::u32(n))]
}

fn folded(k: &Kernel, n: u32) -> Kernel {
    check(k, "addr-fold", LaunchConfig::linear(1, 32), &gather_args(n))
}

#[test]
fn constant_offsets_combine() {
    for idx in [U32, I32, U64, I64] {
        let mut b = KernelBuilder::new("offsets");
        let x = b.param("x", gptr(U32));
        let out = b.param("out", gptr(U32));
        let tid = b.thread_id_x();
        let c1 = b.constant(Constant::new(idx, 5));
        // -3 for signed indices; 3 for unsigned ones (-3 would zero-extend to a huge index).
        let c2 = if idx.is_signed_int() { -3i64 } else { 3 };
        let c2 = b.constant(Constant::new(idx, c2 as u64));
        let p = b.ptr_add(x, tid);
        let p = b.ptr_add(p, c1);
        let p = b.ptr_add(p, c2);
        let v = b.load(p);
        let q = b.ptr_add(out, tid);
        b.store(q, v);
        let k = b.finish().unwrap();
        let after = check(&k, "addr-fold", LaunchConfig::linear(1, 32), &gather_args(0)[..2]);
        let text = print_kernel(&after);
        assert_eq!(address_shape(&after), (true, true), "{idx}:\n{text}");
        let sum = if idx.is_signed_int() { 2 } else { 8 };
        assert!(text.contains(&format!("{idx} = const {sum}")), "{idx}:\n{text}");
    }
}

#[test]
fn an_add_of_a_constant_moves_out_of_64_bit_and_shared_indices() {
    // 64-bit index in a 64-bit space: always.
    let k = gather(AddrSpace::Global, |b, tid, n| {
        let i = b.add(tid, n);
        let i = b.cvt(i, U64);
        let c = b.const_u64(3);
        b.add(i, c)
    });
    assert_eq!(address_shape(&folded(&k, 2)), (true, true));
    // Any 32-bit index into shared memory: addresses wrap at 32 bits anyway.
    let k = gather(AddrSpace::Shared, |b, tid, n| {
        let i = b.add(tid, n);
        let c = b.const_u32(u32::MAX - 1);
        b.add(i, c)
    });
    assert_eq!(address_shape(&folded(&k, 5)), (true, true));
}

#[test]
fn a_32_bit_add_moves_out_of_a_64_bit_address_only_without_wrapping() {
    // tid < 1024, so tid + 3 cannot wrap.
    let k = gather(AddrSpace::Global, |b, tid, _| {
        let c = b.const_u32(3);
        b.add(tid, c)
    });
    assert_eq!(address_shape(&folded(&k, 0)), (true, true));
    // n + 3 may wrap (n = 2^32 - 2 gives index 1): the add stays.
    let k = gather(AddrSpace::Global, |b, _, n| {
        let c = b.const_u32(3);
        b.add(n, c)
    });
    assert_eq!(address_shape(&folded(&k, u32::MAX - 1)), (false, false));
    // A signed index: tid - 1 in i32 stays in range, so it moves (and reads x[-1]... for
    // thread 0, which fails in both versions alike).
    let k = gather(AddrSpace::Global, |b, tid, _| {
        let t = b.cvt(tid, I32);
        let c = b.const_i32(-1);
        let t = b.add(t, c);
        let one = b.const_i32(1);
        b.max(t, one)
    });
    folded(&k, 0);
    let k = gather(AddrSpace::Global, |b, tid, _| {
        let t = b.cvt(tid, I32);
        let c = b.const_i32(7);
        b.add(t, c)
    });
    assert_eq!(address_shape(&folded(&k, 0)), (true, true));
    // A u32 "minus one" is a huge add: it may wrap, and stays.
    let k = gather(AddrSpace::Global, |b, tid, _| {
        let c = b.const_u32(u32::MAX);
        let one = b.const_u32(1);
        let t = b.add(tid, one);
        b.add(t, c)
    });
    let after = folded(&k, 0);
    assert_eq!(address_shape(&after), (false, false), "{}", print_kernel(&after));
}

#[test]
fn a_constant_offset_moves_after_a_variable_one() {
    let mut b = KernelBuilder::new("reorder");
    let x = b.param("x", gptr(U32));
    let out = b.param("out", gptr(U32));
    let tid = b.thread_id_x();
    let c = b.const_u32(4);
    let p = b.ptr_add(x, c);
    let p = b.ptr_add(p, tid);
    let v = b.load(p);
    let q = b.ptr_add(out, tid);
    b.store(q, v);
    let k = b.finish().unwrap();
    let after = folded(&k, 0);
    assert_eq!(address_shape(&after), (true, true), "{}", print_kernel(&after));
}

#[test]
fn accesses_at_constant_offsets_share_one_base_after_cse() {
    // out[tid] = sum of x[2 * tid + k] for k in 0..4, with the adds written out.
    let mut b = KernelBuilder::new("window");
    let x = b.param("x", gptr(U32));
    let out = b.param("out", gptr(U32));
    let tid = b.thread_id_x();
    let two = b.const_u32(2);
    let base = b.mul(tid, two);
    let mut acc = b.const_u32(0);
    for k in 0..4 {
        let c = b.const_u32(k);
        let i = b.add(base, c);
        let p = b.ptr_add(x, i);
        let v = b.load(p);
        acc = b.add(acc, v);
    }
    let q = b.ptr_add(out, tid);
    b.store(q, acc);
    let k = b.finish().unwrap();
    let after = check(&k, "simplify,addr-fold,cse,dce", LaunchConfig::linear(1, 32), &gather_args(0)[..2]);
    let variable = count(
        &after,
        |o| matches!(o, Op::PtrAdd(_, i) if !matches!(after.insts.iter().find(|d| d.results.first() == Some(i)).map(|d| &d.op), Some(Op::Const(_)))),
    );
    // x + 2 tid and out + tid.
    assert_eq!(variable, 2, "{}", print_kernel(&after));
}
