//! Every operation, type and conversion the verifier accepts, lowered by the PTX backend and
//! run in the emulator on edge-case and random inputs, against the interpreter bit for bit.
//! Combinations come from `ruda_ir::coverage`, which asks the verifier, so one the IR starts to
//! accept is covered without editing this file.

use crate::common;

use common::{bytes_of, check, values, Input, Rng};
use ruda_codegen_ptx::Arch;
use ruda_ir::coverage::{
    apply_atomic, arith_ops, atomic_ops, bitcasts, conversions, cvt_needs_sm90, edge_constants, global, ArithOp,
    ArithOperands, ARITH_TYPES, DATA_TYPES,
};
use ruda_ir::interp::LaunchConfig;
use ruda_ir::{AddrSpace, AtomicOp, Constant, Cvt, Kernel, KernelBuilder, ScalarType, ShflMode, Type, Value, VoteMode};

/// Threads per launch: two blocks of 128.
const N: u32 = 256;
const BLOCK: u32 = 128;

fn launch() -> LaunchConfig {
    LaunchConfig::linear(N / BLOCK, BLOCK)
}

/// Results go to 8-byte slots: slot `k` of thread `gid` at `out[k * N + gid]`.
struct Out {
    out: Value,
    gid: Value,
    next: u32,
}

impl Out {
    fn new(b: &mut KernelBuilder) -> Out {
        let out = b.param("out", global(ScalarType::U64));
        let gid = b.global_thread_id_x();
        Out { out, gid, next: 0 }
    }

    fn put(&mut self, b: &mut KernelBuilder, v: Value) {
        let v = if b.ty(v) == Type::PRED {
            let one = b.const_u32(1);
            let zero = b.const_u32(0);
            b.select(v, one, zero)
        } else {
            v
        };
        let base = b.const_u32(self.next * N);
        let i = b.add(base, self.gid);
        let p = b.ptr_add(self.out, i);
        let p = b.ptr_cast(p, b.ty(v).elem());
        b.store(p, v);
        self.next += 1;
    }
}

fn finish(b: KernelBuilder) -> Kernel {
    b.finish().unwrap_or_else(|e| panic!("test kernel does not verify: {e}"))
}

fn load_gid(b: &mut KernelBuilder, ptr: Value, gid: Value) -> Value {
    let p = b.ptr_add(ptr, gid);
    b.load(p)
}

/// All unary, binary, fma, compare and select operations on one arithmetic type.
fn arith_kernel(t: ScalarType) -> (Kernel, u32) {
    let mut b = KernelBuilder::new(format!("arith_{t}"));
    let (xp, yp, zp) = (b.param("x", global(t)), b.param("y", global(t)), b.param("z", global(t)));
    let ap = b.param("amount", global(ScalarType::U32));
    let mut out = Out::new(&mut b);
    let gid = out.gid;
    let (x, y, z) = (load_gid(&mut b, xp, gid), load_gid(&mut b, yp, gid), load_gid(&mut b, zp, gid));
    let amount = load_gid(&mut b, ap, gid);
    // Integer division by zero is an error in the interpreter: divide by y | 1 there.
    let divisor = if t.is_int() {
        let one = b.constant(Constant::new(t, 1));
        b.or(y, one)
    } else {
        y
    };
    let o = ArithOperands { x, y, z, amount, divisor };
    for op in arith_ops(t) {
        let v = op.apply(&mut b, &o);
        out.put(&mut b, v);
        if matches!(op, ArithOp::Cmp(_)) {
            let v = b.select(v, x, z);
            out.put(&mut b, v);
        }
    }
    let slots = out.next;
    (finish(b), slots)
}

#[test]
fn arithmetic_on_every_type_matches_the_interpreter() {
    let mut rng = Rng(1);
    for t in ARITH_TYPES {
        let (k, slots) = arith_kernel(t);
        assert!(slots >= 12, "{t}: only {slots} operations");
        let x = values(t, N as usize, &mut rng);
        // y and z: the edge cases again in another order, so that pairs of them meet.
        let mut y = values(t, N as usize, &mut rng);
        y.rotate_left(7);
        let mut z = values(t, N as usize, &mut rng);
        z.rotate_left(13);
        let amounts: Vec<u64> = (0..N as u64).map(|i| if i < 70 { i } else { rng.next() % 200 }).collect();
        let inputs = vec![
            Input::Buffer(bytes_of(t, &x)),
            Input::Buffer(bytes_of(t, &y)),
            Input::Buffer(bytes_of(t, &z)),
            Input::Buffer(bytes_of(ScalarType::U32, &amounts)),
            Input::Buffer(vec![0; (slots * N * 8) as usize]),
        ];
        check(&k, &launch(), &inputs, &[Arch::Sm80]);
    }
}

fn cvt_kernel(name: &str, convs: &[(ScalarType, Cvt)]) -> (Kernel, u32) {
    let mut b = KernelBuilder::new(name);
    let srcs: Vec<Value> = DATA_TYPES.iter().map(|t| b.param(format!("src_{t}"), global(*t))).collect();
    let mut out = Out::new(&mut b);
    let gid = out.gid;
    let inputs: Vec<(ScalarType, Value)> =
        DATA_TYPES.iter().zip(&srcs).map(|(t, p)| (*t, load_gid(&mut b, *p, gid))).collect();
    for (from, cvt) in convs {
        let v = inputs.iter().find(|(t, _)| t == from).map(|(_, v)| *v).expect("an input of every type");
        let r = b.cvt_with(v, *cvt);
        out.put(&mut b, r);
    }
    let slots = out.next;
    (finish(b), slots)
}

fn cvt_inputs(slots: u32) -> Vec<Input> {
    let mut rng = Rng(2);
    let mut inputs: Vec<Input> =
        DATA_TYPES.iter().map(|t| Input::Buffer(bytes_of(*t, &values(*t, N as usize, &mut rng)))).collect();
    inputs.push(Input::Buffer(vec![0; (slots * N * 8) as usize]));
    inputs
}

/// Conversions that keep a NaN's payload (everywhere: the interpreter, and the backends' `mov`
/// and shift): a float converted to its own type without rounding, and bf16 to f32.
fn keeps_nan_payload(from: ScalarType, cvt: Cvt) -> bool {
    (from.is_float() && from == cvt.to && cvt.rounding.is_none())
        || (from == ScalarType::BF16 && cvt.to == ScalarType::F32)
}

#[test]
fn every_conversion_matches_the_interpreter() {
    let convs = conversions();
    assert!(convs.len() > 400, "only {} conversions", convs.len());
    let sm80: Vec<_> = convs.iter().copied().filter(|(f, c)| !cvt_needs_sm90(*f, *c)).collect();
    let (k, slots) = cvt_kernel("cvt_sm80", &sm80);
    check(&k, &launch(), &cvt_inputs(slots), &[Arch::Sm80, Arch::Sm90]);
    let (k, slots) = cvt_kernel("cvt_sm90", &convs);
    check(&k, &launch(), &cvt_inputs(slots), &[Arch::Sm90]);
}

#[test]
fn bitcasts_and_constants_match() {
    let mut b = KernelBuilder::new("bits");
    let srcs: Vec<Value> = DATA_TYPES.iter().map(|t| b.param(format!("src_{t}"), global(*t))).collect();
    let mut out = Out::new(&mut b);
    let gid = out.gid;
    let pairs = bitcasts();
    for (from, p) in DATA_TYPES.iter().zip(&srcs) {
        let v = load_gid(&mut b, *p, gid);
        for &(_, to) in pairs.iter().filter(|(f, _)| f == from) {
            let r = b.bitcast(v, to);
            out.put(&mut b, r);
        }
    }
    for c in edge_constants() {
        let v = b.constant(c);
        out.put(&mut b, v);
    }
    let slots = out.next;
    let k = finish(b);
    check(&k, &launch(), &cvt_inputs(slots), &[Arch::Sm80]);
}

/// Vector and scalar loads and stores of every type through global, static and dynamic
/// shared memory; atomics of every accepted kind on global and shared memory (each block on
/// its own words, one atomic per word per barrier phase, so the order is the thread order in
/// every engine); barriers in a loop.
#[test]
fn memory_atomics_and_barriers_match() {
    let mut b = KernelBuilder::new("memory");
    let srcs: Vec<Value> = DATA_TYPES.iter().map(|t| b.param(format!("src_{t}"), global(*t))).collect();
    let atom_buf = b.param("atoms", global(ScalarType::U64));
    let mut out = Out::new(&mut b);
    let gid = out.gid;
    let tid = b.thread_id_x();
    let bid = b.block_id_x();
    let tile = b.shared_array("tile", ScalarType::U64, 4 * BLOCK);
    let s = b.shared_ptr(tile);
    let d = b.dyn_shared_ptr(ScalarType::U64);
    let mut region = 0u32;
    for (t, p) in DATA_TYPES.iter().zip(&srcs) {
        let t = *t;
        // Scalar and vector loads from global; vectors at the thread's own aligned quad.
        let v = load_gid(&mut b, *p, gid);
        out.put(&mut b, v);
        let four = b.const_u32(4);
        let quad = b.div(gid, four);
        let quad = b.mul(quad, four);
        let q = b.ptr_add(*p, quad);
        let v4 = b.load_vec(q, 4);
        let v2 = b.load_vec(q, 2);
        for lane in [0u8, 3] {
            let e = b.extract(v4, lane);
            out.put(&mut b, e);
        }
        let e = b.extract(v2, 1);
        out.put(&mut b, e);
        // Through shared memory: store a vector at the thread's slot, read a neighbour's.
        for base in [s, d] {
            let sp = b.ptr_cast(base, t);
            let four = b.const_u32(4);
            let at = b.mul(tid, four);
            let mine = b.ptr_add(sp, at);
            b.store(mine, v4);
            b.barrier();
            let one = b.const_u32(1);
            let next = b.add(tid, one);
            let mask = b.const_u32(BLOCK - 1);
            let next = b.and(next, mask);
            let at = b.mul(next, four);
            let theirs = b.ptr_add(sp, at);
            let w = b.load_vec(theirs, 2);
            let e = b.extract(w, 1);
            out.put(&mut b, e);
            b.barrier();
        }
        // Atomics: global words per block, shared words; old values are stored.
        let accepted = [atomic_ops(t, AddrSpace::Global), atomic_ops(t, AddrSpace::Shared)];
        for &op in AtomicOp::ALL {
            for (space, ops) in [AddrSpace::Global, AddrSpace::Shared].into_iter().zip(&accepted) {
                if !ops.contains(&op) {
                    continue;
                }
                // Eight threads share each word.
                let eight = b.const_u32(8);
                let word = b.div(tid, eight);
                let ptr = if space == AddrSpace::Global {
                    let words = b.const_u32(BLOCK / 8);
                    let base = b.mul(bid, words);
                    let r = b.const_u32(region * (N / 8));
                    let base = b.add(base, r);
                    let at = b.add(base, word);
                    let q = b.ptr_add(atom_buf, at);
                    b.ptr_cast(q, t)
                } else {
                    let q = b.ptr_add(s, word);
                    b.ptr_cast(q, t)
                };
                // A compare-and-swap compares with the value some thread of the word's group
                // will have left.
                let old = apply_atomic(&mut b, op, ptr, v);
                out.put(&mut b, old);
                b.barrier();
                if space == AddrSpace::Shared {
                    let back = b.load(ptr);
                    out.put(&mut b, back);
                    b.barrier();
                }
                region += 1;
            }
        }
    }
    // A barrier inside a loop whose trip count is block-uniform.
    let zero = b.const_u32(0);
    let n = b.const_u32(3);
    let one = b.const_u32(1);
    let acc = b.const_u64(0);
    let sum = b.for_range(zero, n, one, &[acc], |b, i, acc| {
        let p = b.ptr_add(s, tid);
        let i64v = b.cvt(i, ScalarType::U64);
        b.store(p, i64v);
        b.barrier();
        let bm = b.const_u32(BLOCK - 1);
        let other = b.sub(bm, tid);
        let q = b.ptr_add(s, other);
        let v = b.load(q);
        b.barrier();
        vec![b.add(acc[0], v)]
    })[0];
    out.put(&mut b, sum);
    let slots = out.next;
    let k = finish(b);
    let mut inputs = cvt_inputs(slots);
    let out_buf = inputs.pop().expect("the output buffer");
    inputs.push(Input::Buffer(vec![0; (region * N / 8 * 8) as usize]));
    inputs.push(out_buf);
    let cfg = LaunchConfig { grid: [N / BLOCK, 1, 1], block: [BLOCK, 1, 1], dynamic_shared_bytes: 4 * BLOCK * 8 };
    check(&k, &cfg, &inputs, &[Arch::Sm80, Arch::Sm90]);
}

/// Shuffles in every mode with lane operands of every size (also above 31), and votes.
#[test]
fn shuffles_and_votes_match() {
    let mut b = KernelBuilder::new("warp");
    let xp = b.param("x", global(ScalarType::U32));
    let fp = b.param("f", global(ScalarType::F32));
    let mut out = Out::new(&mut b);
    let gid = out.gid;
    let x = load_gid(&mut b, xp, gid);
    let f = load_gid(&mut b, fp, gid);
    let lane = b.lane_id();
    for &mode in ShflMode::ALL {
        for v in [x, f] {
            let s = b.shfl(mode, v, x);
            out.put(&mut b, s);
            let s = b.shfl(mode, v, lane);
            out.put(&mut b, s);
            for c in [1u32, 5, 31, 33] {
                let c = b.const_u32(c);
                let s = b.shfl(mode, v, c);
                out.put(&mut b, s);
            }
        }
    }
    let seven = b.const_u32(7);
    let odd = b.and(x, seven);
    let zero = b.const_u32(0);
    for p in [b.ne(odd, zero), b.eq(odd, zero), b.lt(lane, seven)] {
        for &mode in VoteMode::ALL {
            let v = b.vote(mode, p);
            out.put(&mut b, v);
        }
    }
    let slots = out.next;
    let k = finish(b);
    let mut rng = Rng(3);
    let inputs = vec![
        Input::Buffer(bytes_of(ScalarType::U32, &values(ScalarType::U32, N as usize, &mut rng))),
        Input::Buffer(bytes_of(ScalarType::F32, &values(ScalarType::F32, N as usize, &mut rng))),
        Input::Buffer(vec![0; (slots * N * 8) as usize]),
    ];
    check(&k, &launch(), &inputs, &[Arch::Sm80]);
}

#[test]
fn nan_payloads_of_moves_and_bf16_widening() {
    let convs: Vec<_> = conversions().into_iter().filter(|(f, c)| keeps_nan_payload(*f, *c)).collect();
    assert_eq!(convs.len(), 5);
    let (k, slots) = cvt_kernel("cvt_same", &convs);
    check(&k, &launch(), &cvt_inputs(slots), &[Arch::Sm80]);
}
