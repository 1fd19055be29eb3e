//! print → parse → print is the identity, with and without locations, for kernels that use
//! every operation, type and constant form the printer can write.

use std::sync::Arc;

use ruda_ir::*;

fn global(t: ScalarType) -> Type {
    Type::Ptr(AddrSpace::Global, t)
}

/// Print, parse, print again (both forms) and compare; also check that value numbers and
/// their types survive.
fn round_trip(k: &Kernel) {
    for (form, print) in [("plain", print_kernel as fn(&Kernel) -> String), ("with locs", print_kernel_with_locs)] {
        let text = print(k);
        let parsed = parse_kernel(&text).unwrap_or_else(|e| panic!("{form}: does not parse: {e}\n{text}"));
        assert_eq!(print(&parsed), text, "{form}: round trip differs");
        let mut defined = vec![];
        k.walk(|_, inst| defined.extend(&inst.results));
        for v in defined.iter().chain(k.params.iter().map(|p| &p.value)) {
            assert_eq!(parsed.ty(*v), k.ty(*v), "{form}: type of {v}");
        }
        assert_eq!(parsed.name, k.name);
        assert_eq!(parsed.shared, k.shared);
        assert_eq!(parsed.launch_bounds, k.launch_bounds);
    }
}

/// Every unary, binary and comparison op on every type it applies to, plus fma and select.
#[test]
fn arithmetic_ops_round_trip() {
    let mut b = KernelBuilder::new("arith");
    b.launch_bounds(128, Some(2));
    let out = b.param("out", global(ScalarType::U32));
    for t in [ScalarType::I32, ScalarType::U32, ScalarType::I64, ScalarType::U64, ScalarType::F32, ScalarType::F64] {
        let x = b.constant(Constant::new(t, 7));
        let y = b.constant(Constant::new(t, 3));
        for op in BinaryOp::ALL {
            b.binary(*op, x, y);
        }
        for op in UnaryOp::ALL {
            b.unary(*op, x);
        }
        for op in CmpOp::ALL {
            b.cmp(*op, x, y);
        }
        b.fma(x, y, x);
        let c = b.const_pred(false);
        b.select(c, x, y);
    }
    let t = b.const_pred(true);
    let f = b.const_pred(false);
    b.and(t, f);
    let v = b.const_u32(5);
    b.store(out, v);
    round_trip(&b.finish_unverified());
}

/// Constants at the edges of every scalar type, including NaN payloads and negative zero.
#[test]
fn constants_round_trip() {
    let mut b = KernelBuilder::new("constants");
    for t in ScalarType::ALL {
        for bits in
            [0u64, 1, 0x7f, 0x80, 0xff, 0x7fff, 0x8000, 0xffff, 0x7fc0_0001, 0x8000_0000, u32::MAX as u64, u64::MAX]
        {
            b.constant(Constant::new(t, bits));
        }
    }
    b.const_f32(-0.0);
    b.const_f32(f32::INFINITY);
    b.const_f64(f64::NEG_INFINITY);
    b.const_f64(f64::MIN_POSITIVE / 3.0);
    b.const_i64(i64::MIN);
    b.const_i32(i32::MIN);
    round_trip(&b.finish_unverified());
}

/// Every conversion between the scalar types, with each rounding mode and saturation, and
/// bitcasts.
#[test]
fn conversions_round_trip() {
    let mut b = KernelBuilder::new("conversions");
    let p = b.param("p", global(ScalarType::U8));
    for from in ScalarType::ALL {
        let x = b.constant(Constant::new(from, 1));
        for to in ScalarType::ALL {
            for rounding in [None, Some(Rounding::Rn), Some(Rounding::Rz), Some(Rounding::Rm), Some(Rounding::Rp)] {
                for sat in [false, true] {
                    b.cvt_with(x, Cvt { to, rounding, sat });
                }
            }
            b.bitcast(x, to);
        }
    }
    let q = b.ptr_cast(p, ScalarType::F16);
    b.ptr_cast(q, ScalarType::BF16);
    round_trip(&b.finish_unverified());
}

/// Memory: pointer arithmetic and casts, static and dynamic shared memory, scalar and vector
/// loads and stores, every atomic (cas with its compare operand), and barriers.
#[test]
fn memory_ops_round_trip() {
    let mut b = KernelBuilder::new("memory");
    let x = b.param("x", global(ScalarType::F32));
    let n = b.param("n", Type::U32);
    let m = b.param("m", Type::I64);
    let tile = b.shared_array("tile", ScalarType::F32, 256);
    let flags = b.shared_array("flags", ScalarType::U32, 4);
    let tid = b.thread_id_x();
    let p = b.ptr_add(x, tid);
    let p = b.ptr_add(p, m);
    let v = b.load(p);
    let v2 = b.load_vec(p, 2);
    let v4 = b.load_vec(p, 4);
    b.store(p, v);
    b.store(p, v2);
    b.store(p, v4);
    let s = b.shared_ptr(tile);
    let s = b.ptr_add(s, tid);
    b.store(s, v);
    b.barrier();
    let d = b.dyn_shared_ptr(ScalarType::U64);
    let d64 = b.load(d);
    let f = b.shared_ptr(flags);
    for op in AtomicOp::ALL.iter().filter(|op| **op != AtomicOp::Cas) {
        b.atomic(*op, f, n);
    }
    b.atomic_cas(f, n, tid);
    let u = b.ptr_cast(d, ScalarType::U32);
    b.atomic(AtomicOp::Add, u, n);
    b.atomic(AtomicOp::Max, d, d64);
    round_trip(&b.finish().expect("verifies"));
}

/// Special registers, warp shuffles and votes, and vectors.
#[test]
fn warp_and_vector_ops_round_trip() {
    let mut b = KernelBuilder::new("warp");
    let out = b.param("out", global(ScalarType::F32));
    for reg in SpecialReg::ALL {
        b.special(reg);
    }
    let lane = b.lane_id();
    let x = b.cvt(lane, ScalarType::F32);
    for mode in ShflMode::ALL {
        b.shfl(*mode, x, lane);
    }
    let c16 = b.const_u32(16);
    let p = b.lt(lane, c16);
    for mode in VoteMode::ALL {
        b.vote(*mode, p);
    }
    let v2 = b.make_vector(&[x, x]);
    let v4 = b.make_vector(&[x, x, x, x]);
    let e = b.extract(v4, 3);
    b.extract(v2, 1);
    let dst = b.ptr_add(out, lane);
    b.store(dst, e);
    b.store(dst, v4);
    round_trip(&b.finish().expect("verifies"));
}

/// Nested ifs and loops with carried values and yields, if-results defined after their
/// regions (so their numbers are higher than the values inside), empty regions.
#[test]
fn control_flow_round_trips() {
    let mut b = KernelBuilder::new("control");
    let out = b.param("out", global(ScalarType::F32));
    let n = b.param("n", Type::U32);
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let acc0 = b.const_f32(0.0);
    let idx0 = b.const_i64(-3);
    let tid = b.thread_id_x();
    let c = b.lt(tid, n);
    b.if_then(c, |_| {});
    let finals = b.for_range(zero, n, one, &[acc0, idx0], |b, i, carried| {
        let odd = b.and(i, one);
        let is_odd = b.ne(odd, zero);
        let picked = b.if_else(
            is_odd,
            |b| {
                let x = b.cvt(i, ScalarType::F32);
                let s = b.add(carried[0], x);
                vec![s, carried[1]]
            },
            |b| {
                let inner = b.for_range(zero, i, one, &[carried[0]], |b, _j, c| {
                    let h = b.const_f32(0.5);
                    vec![b.mul(c[0], h)]
                });
                vec![inner[0], carried[1]]
            },
        );
        b.for_each(zero, one, one, |b, _| b.barrier());
        vec![picked[0], picked[1]]
    });
    let dst = b.ptr_add(out, tid);
    b.if_then(c, |b| b.store(dst, finals[0]));
    let k = b.finish().expect("verifies");
    round_trip(&k);
    // The printed form nests as the builder did.
    let text = print_kernel(&k);
    assert!(text.contains(" iter(") && text.contains("} else {") && text.contains("yield "), "{text}");
}

/// Locations whose file names need escaping, and instructions without a location.
#[test]
fn locations_with_odd_file_names_round_trip() {
    let mut b = KernelBuilder::new("locs");
    let n = b.param("n", Type::U32);
    let c = b.const_u32(1);
    let p = b.lt(c, n);
    b.if_then(p, |b| {
        b.add(n, c);
    });
    b.for_each(c, n, c, |b, i| {
        b.mul(i, i);
    });
    let mut k = b.finish().expect("verifies");
    let names = ["dir with space/a \"quoted\" file.rs", "back\\slash\ttab\nnewline", "ünï\u{200b}code", ""];
    for (i, inst) in k.insts.iter_mut().enumerate() {
        inst.loc = match i % 5 {
            4 => None,
            j => Some(Loc { file: Arc::from(names[j]), line: i as u32 * 1000, col: u32::MAX - i as u32 }),
        };
    }
    round_trip(&k);
}

/// A kernel whose values are numbered sparsely and out of textual order (as after passes):
/// numbers are kept, gaps become placeholders.
#[test]
fn sparse_value_numbers_round_trip() {
    let text = "\
kernel @sparse(%40 x: ptr<global,f32>, %2 n: u32) {
  .shared @a: f16[3] align 2
  %90: u32 = special tid.x
  %7: pred = cmp.lt %90, %2
  %1000: f32 = if %7 {
    %5: ptr<global,f32> = ptradd %40, %90
    %3: f32 = load %5
    yield %3
  } else {
    %6: f32 = const 0x3f800000
    yield %6
  }
}
";
    let k = parse_kernel(text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print_kernel(&k), text);
    assert_eq!(k.values.len(), 1001);
    verify(&k).unwrap_or_else(|e| panic!("{e}"));
}

/// What the printer does not write but the parser accepts: comments, blank lines, decimal
/// floats, hex integers, an `if` without `else`.
#[test]
fn conveniences_parse_to_the_canonical_form() {
    let text = "\
; a comment before the kernel

kernel @k(%0 n: u32) {   ; trailing comment
  %1: f32 = const 1.5

  %2: f64 = const -2e-3
  %3: f16 = const 1.0
  %4: bf16 = const -1
  %5: u32 = const 0xff
  %6: s8 = const 0x80
  %7: pred = cmp.lt %0, %5
  if %7 {
    barrier
  }
}
";
    let k = parse_kernel(text).unwrap_or_else(|e| panic!("{e}"));
    let expected = "\
kernel @k(%0 n: u32) {
  %1: f32 = const 0x3fc00000
  %2: f64 = const 0xbf60624dd2f1a9fc
  %3: f16 = const 0x3c00
  %4: bf16 = const 0xbf80
  %5: u32 = const 255
  %6: s8 = const -128
  %7: pred = cmp.lt %0, %5
  if %7 {
    barrier
  } else {
  }
}
";
    assert_eq!(print_kernel(&k), expected);
}
