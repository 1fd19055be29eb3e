//! Writes the bundle of a GPU semantics check of the PTX backend: kernels covering every
//! conversion (sm_80 and sm_90 lowerings), every exact arithmetic op on every type, control
//! flow, shuffles, votes, atomics and shared memory, with their inputs and specs.
//!
//!   cargo run -p ruda-codegen-ptx --example gpucheck -- target/ptx-gpucheck
//!   cp codegen-ptx/gpucheck/*.py target/ptx-gpucheck/
//!   # on a GPU machine (Python with ctypes, a CUDA driver), results into $OUT:
//!   python3 target/ptx-gpucheck/run.py
//!   # anywhere: compare with the exact (rational arithmetic) reference
//!   python3 target/ptx-gpucheck/check.py RESULTS_DIR

use std::fmt::Write as _;

use ruda_codegen_ptx::{emit_ptx, Arch, Target};
use ruda_ir::coverage::{arith_ops, conversions, ArithOp, ArithOperands, ARITH_TYPES, DATA_TYPES};
use ruda_ir::*;

const N: u32 = 64;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 ^ (self.0 >> 29)
    }
}

fn mask(t: ScalarType, v: u64) -> u64 {
    if t.bits() >= 64 {
        v
    } else {
        v & ((1u64 << t.bits()) - 1)
    }
}

fn inputs(t: ScalarType, rng: &mut Lcg) -> Vec<u64> {
    let mut v: Vec<u64> = vec![];
    if t.is_int() {
        let b = t.bits();
        let min = if t.is_signed_int() { 1u64 << (b - 1) } else { 0 };
        let max = if t.is_signed_int() { (1u64 << (b - 1)) - 1 } else { mask(t, u64::MAX) };
        for x in [
            0u64,
            1,
            2,
            3,
            u64::MAX,
            min,
            max,
            min.wrapping_add(1),
            max.wrapping_sub(1),
            0x7F,
            0x80,
            0xFF,
            0x100,
            0x7FFF,
            0x8000,
            0xFFFF,
            0x10000,
            0x7FFF_FFFF,
            0x8000_0000,
            0xFFFF_FFFF,
            1 << 32,
            (1 << 53) + 1,
            (1 << 24) + 1,
            (-(1i64 << 24) - 1) as u64,
            (1 << 24) + 3,
            (1 << 25) + 3,
            0xFFFF_FF80,
            -129i64 as u64,
            -200i64 as u64,
            300,
            65535 + 16,
            (1u64 << 63) + (1 << 40) + 1,
        ] {
            v.push(mask(t, x));
        }
    } else {
        let f64s = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            1.5,
            2.5,
            -2.5,
            3.5,
            -0.5,
            127.5,
            128.5,
            -128.5,
            -129.0,
            255.5,
            256.0,
            32767.5,
            65535.5,
            65536.0,
            2147483647.0,
            2147483648.0,
            -2147483649.0,
            4294967296.0,
            9.3e18,
            1.9e19,
            -9.3e18,
            1e30,
            -1e30,
            1e-30,
            6e-8,
            1e-40,
            1e-310,
            65504.0,
            65520.0,
            3.4e38,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1.0 + 1.0 / 256.0 + 1.0 / 1048576.0,
            1.0 + 1.0 / 2048.0 + 1e-9,
            -(1.0 + 1.0 / 256.0),
            1.0 / 3.0,
        ];
        match t {
            ScalarType::F64 => v.extend(f64s.iter().map(|x| x.to_bits())),
            ScalarType::F32 => v.extend(f64s.iter().map(|x| (*x as f32).to_bits() as u64)),
            ScalarType::BF16 => v.extend(f64s.iter().map(|x| ((*x as f32).to_bits() >> 16) as u64)),
            _ => v.extend([
                0x0000, 0x8000, 0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x3C01, 0x5BFF,
                0x57F8, 0x5800, 0xD7FC, 0x3800, 0x3E00, 0x4100, 0xC100, 0x4300, 0x7BFE, 0x0200, 0x8001, 0x7C01,
            ]),
        }
    }
    while v.len() < N as usize {
        v.push(mask(t, rng.next()));
    }
    v.truncate(N as usize);
    v
}

fn bytes_of(t: ScalarType, bits: u64) -> Vec<u8> {
    bits.to_le_bytes()[..t.bytes() as usize].to_vec()
}

fn param_ptrs(b: &mut KernelBuilder) -> (Value, Value) {
    let i = b.param("inp", Type::Ptr(AddrSpace::Global, ScalarType::U8));
    let o = b.param("out", Type::Ptr(AddrSpace::Global, ScalarType::U8));
    (i, o)
}

/// Pointer to element `base/size + tid` of type t.
fn at(b: &mut KernelBuilder, p: Value, t: ScalarType, byte_off: u32, tid: Value) -> Value {
    let q = b.ptr_cast(p, t);
    let base = b.const_u32(byte_off / t.bytes());
    let idx = b.add(base, tid);
    b.ptr_add(q, idx)
}

fn emit(k: &Kernel, arch: Arch) -> String {
    emit_ptx(k, &Target::new(arch)).unwrap()
}

fn json_str(s: &str) -> String {
    format!("\"{s}\"")
}

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "target/ptx-gpucheck".to_string());
    let dir = dir.as_str();
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = Lcg(12345);
    let mut cases = String::from("[\n");

    // ---- inputs: one region of N*8 bytes per data type
    let mut input = vec![0u8; 12 * N as usize * 8];
    let mut in_off = std::collections::HashMap::new();
    let mut input_spec = String::from("{");
    for (k, t) in DATA_TYPES.into_iter().enumerate() {
        let off = k as u32 * N * 8;
        in_off.insert(t, off);
        let vals = inputs(t, &mut rng);
        for (i, x) in vals.iter().enumerate() {
            let bs = bytes_of(t, *x);
            let o = off as usize + i * t.bytes() as usize;
            input[o..o + bs.len()].copy_from_slice(&bs);
        }
        let _ = write!(input_spec, "{}\"{t}\": {off}", if k > 0 { ", " } else { "" });
    }
    input_spec.push('}');
    std::fs::write(format!("{dir}/input.bin"), &input).unwrap();

    // ---- conversions
    let convs = conversions();
    for arch in [Arch::Sm80, Arch::Sm90] {
        let list: Vec<(ScalarType, Cvt)> = convs
            .iter()
            .copied()
            .filter(|(from, cvt)| {
                let mut b = KernelBuilder::new("probe");
                let p = b.param("p", *from);
                let r = b.cvt_with(p, *cvt);
                let o = b.param("o", Type::Ptr(AddrSpace::Global, cvt.to));
                b.store(o, r);
                emit_ptx(&b.finish().unwrap(), &Target::new(arch)).is_ok()
            })
            .collect();
        let name = format!("cvt_{}", arch.name());
        let mut b = KernelBuilder::new(&name);
        let (inp, out) = param_ptrs(&mut b);
        let tid = b.thread_id_x();
        let mut loaded = std::collections::HashMap::new();
        for t in DATA_TYPES {
            let p = at(&mut b, inp, t, in_off[&t], tid);
            loaded.insert(t, b.load(p));
        }
        let mut spec = String::from("[");
        for (c, (from, cvt)) in list.iter().enumerate() {
            let off = c as u32 * N * 8;
            let r = b.cvt_with(loaded[from], *cvt);
            let p = at(&mut b, out, cvt.to, off, tid);
            b.store(p, r);
            let _ = write!(
                spec,
                "{}[\"{from}\", \"{}\", {}, {}, {off}]",
                if c > 0 { ",\n" } else { "" },
                cvt.to,
                cvt.rounding.map_or("null".to_string(), |r| json_str(r.name())),
                cvt.sat
            );
        }
        spec.push(']');
        let k = b.finish().unwrap();
        std::fs::write(format!("{dir}/{name}.ptx"), emit(&k, arch)).unwrap();
        std::fs::write(format!("{dir}/{name}.spec.json"), spec).unwrap();
        let _ = writeln!(
            cases,
            "{{\"name\": \"{name}\", \"ptx\": \"{name}.ptx\", \"grid\": 1, \"block\": {N}, \"dyn\": 0, \"out_bytes\": {}}},",
            list.len() as u32 * N * 8
        );
    }

    // ---- arithmetic: op list per type; a = slot i, b = slot (i*7+3)%N, c = slot (i*13+5)%N
    let mut spec = String::from("[");
    let mut b = KernelBuilder::new("arith");
    let (inp, out) = param_ptrs(&mut b);
    let tid = b.thread_id_x();
    let seven = b.const_u32(7);
    let three = b.const_u32(3);
    let thirteen = b.const_u32(13);
    let five = b.const_u32(5);
    let nmask = b.const_u32(N - 1);
    let t7 = b.fma(tid, seven, three);
    let tb = b.and(t7, nmask);
    let t13 = b.fma(tid, thirteen, five);
    let tc = b.and(t13, nmask);
    let seventy_one = b.const_u32(71);
    let amount = b.rem(t7, seventy_one);
    let mut slot = 0u32;
    let mut first = true;
    for t in ARITH_TYPES {
        let pa = at(&mut b, inp, t, in_off[&t], tid);
        let pb = at(&mut b, inp, t, in_off[&t], tb);
        let pc = at(&mut b, inp, t, in_off[&t], tc);
        let (x, y, z) = (b.load(pa), b.load(pb), b.load(pc));
        let mut record = |b: &mut KernelBuilder, v: Value, op: String, slot: &mut u32| {
            let ty = b.ty(v).elem();
            let v = if ty == ScalarType::Pred {
                let one = b.const_u32(1);
                let zero = b.const_u32(0);
                b.select(v, one, zero)
            } else {
                v
            };
            let rt = b.ty(v).elem();
            let off = *slot * N * 8;
            let p = at(b, out, rt, off, tid);
            b.store(p, v);
            let _ = write!(spec, "{}[\"{t}\", \"{op}\", \"{rt}\", {off}]", if first { "" } else { ",\n" });
            first = false;
            *slot += 1;
        };
        let o = ArithOperands { x, y, z, amount, divisor: y };
        for op in arith_ops(t) {
            // The check compares with exact arithmetic: approximate functions have no spec.
            if matches!(op, ArithOp::Unary(u) if u.is_approx()) {
                continue;
            }
            let v = op.apply(&mut b, &o);
            record(&mut b, v, op.to_string(), &mut slot);
        }
    }
    spec.push(']');
    let k = b.finish().unwrap();
    std::fs::write(format!("{dir}/arith.ptx"), emit(&k, Arch::Sm90)).unwrap();
    std::fs::write(format!("{dir}/arith.spec.json"), spec).unwrap();
    let _ = writeln!(
        cases,
        "{{\"name\": \"arith\", \"ptx\": \"arith.ptx\", \"grid\": 1, \"block\": {N}, \"dyn\": 0, \"out_bytes\": {}}},",
        slot * N * 8
    );

    // ---- control flow + memory + warp, expected values computed here: list of (offset, type, bits)
    let mut checks: Vec<(u32, ScalarType, u64)> = vec![];
    let mut b = KernelBuilder::new("misc");
    let (inp, out) = param_ptrs(&mut b);
    b.launch_bounds(64, None);
    let tid = b.thread_id_x();
    let lane = b.lane_id();
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let mut region = 0u32;
    let store_u32 = |b: &mut KernelBuilder, v: Value, region: &mut u32| -> u32 {
        let off = *region * N * 8;
        let t = b.ty(v).elem();
        let p = at(b, out, t, off, tid);
        b.store(p, v);
        *region += 1;
        off
    };
    // fib with a swap
    let r = b.for_range(zero, tid, one, &[zero, one], |b, _, c| {
        let s = b.add(c[0], c[1]);
        vec![c[1], s]
    });
    let off = store_u32(&mut b, r[0], &mut region);
    for t in 0..N {
        let (mut a, mut c) = (0u32, 1u32);
        for _ in 0..t {
            let s = a.wrapping_add(c);
            a = c;
            c = s;
        }
        checks.push((off + t * 4, ScalarType::U32, a as u64));
    }
    // nested loops with if/else results
    let seven = b.const_u32(7);
    let lim = b.rem(tid, seven);
    let fivec = b.const_u32(5);
    let threec = b.const_u32(3);
    let r = b.for_range(zero, lim, one, &[one], |b, i, acc| {
        let inner = b.for_range(i, fivec, one, &[acc[0]], |b, j, acc2| {
            let odd = b.and(j, one);
            let is_odd = b.ne(odd, zero);
            b.if_else(
                is_odd,
                |b| {
                    let m = b.mul(acc2[0], threec);
                    vec![b.add(m, j)]
                },
                |b| vec![b.add(acc2[0], i)],
            )
        });
        vec![inner[0]]
    });
    let off = store_u32(&mut b, r[0], &mut region);
    for t in 0..N {
        let mut acc = 1u32;
        for i in 0..t % 7 {
            for j in i..5 {
                acc = if j & 1 == 1 { acc.wrapping_mul(3).wrapping_add(j) } else { acc.wrapping_add(i) };
            }
        }
        checks.push((off + t * 4, ScalarType::U32, acc as u64));
    }
    // i64 loop with negative start and step 3: count and sum
    let start = b.const_i64(-10);
    let step = b.const_i64(3);
    let end = b.cvt(tid, ScalarType::I64);
    let zl = b.const_i64(0);
    let onel = b.const_i64(1);
    let r = b.for_range(start, end, step, &[zl, zl], |b, iv, c| vec![b.add(c[0], onel), b.add(c[1], iv)]);
    let prod = b.mul(r[0], r[1]);
    let off = store_u32(&mut b, prod, &mut region);
    for t in 0..N as i64 {
        let (mut cnt, mut sum) = (0i64, 0i64);
        let mut iv = -10i64;
        while iv < t {
            cnt += 1;
            sum += iv;
            iv += 3;
        }
        checks.push((off + t as u32 * 8, ScalarType::I64, (cnt * sum) as u64));
    }
    // divergent if yielding a vector and a predicate
    let m3 = b.rem(tid, threec);
    let is0 = b.eq(m3, zero);
    let yv = b.if_else(
        is0,
        |b| {
            let two = b.const_u32(2);
            let d = b.mul(tid, two);
            let v = b.make_vector(&[tid, d]);
            let t = b.const_pred(true);
            vec![v, t]
        },
        |b| {
            let s = b.const_u32(7);
            let n = b.const_u32(9);
            let v = b.make_vector(&[s, n]);
            let f = b.const_pred(false);
            vec![v, f]
        },
    );
    let e0 = b.extract(yv[0], 0);
    let e1 = b.extract(yv[0], 1);
    let hundred = b.const_u32(100);
    let mix = b.fma(e1, hundred, e0);
    let thousand = b.const_u32(100000);
    let flag = b.select(yv[1], thousand, zero);
    let mix = b.add(mix, flag);
    let off = store_u32(&mut b, mix, &mut region);
    for t in 0..N {
        let v = if t % 3 == 0 { t + 200 * t + 100000 } else { 7 + 900 };
        checks.push((off + t * 4, ScalarType::U32, v as u64));
    }
    // shuffles
    let val = b.fma(lane, threec, one);
    for (mode, arg) in [(ShflMode::Bfly, 5u32), (ShflMode::Down, 3), (ShflMode::Up, 2), (ShflMode::Idx, 7)] {
        let a = b.const_u32(arg);
        let s = b.shfl(mode, val, a);
        let off = store_u32(&mut b, s, &mut region);
        for t in 0..N {
            let l = t % 32;
            let src = match mode {
                ShflMode::Bfly => l ^ arg,
                ShflMode::Down => {
                    if l + arg <= 31 {
                        l + arg
                    } else {
                        l
                    }
                }
                ShflMode::Up => {
                    if l >= arg {
                        l - arg
                    } else {
                        l
                    }
                }
                ShflMode::Idx => arg,
            };
            checks.push((off + t * 4, ScalarType::U32, (src * 3 + 1) as u64));
        }
    }
    // f32 shuffle keeps bits
    let fv = b.cvt(val, ScalarType::F32);
    let fthree = b.const_u32(3);
    let fs = b.shfl(ShflMode::Bfly, fv, fthree);
    let off = store_u32(&mut b, fs, &mut region);
    for t in 0..N {
        checks.push((off + t * 4, ScalarType::F32, ((((t % 32) ^ 3) * 3 + 1) as f32).to_bits() as u64));
    }
    // votes
    let forty = b.const_u32(40);
    let sixteen = b.const_u32(16);
    let thirtyone = b.const_u32(31);
    let c1 = b.lt(lane, forty);
    let c2 = b.lt(lane, sixteen);
    let c3 = b.eq(lane, thirtyone);
    let oddl = b.and(lane, one);
    let c4 = b.ne(oddl, zero);
    let v1 = b.vote(VoteMode::All, c1);
    let v2 = b.vote(VoteMode::All, c2);
    let v3 = b.vote(VoteMode::Any, c3);
    let v4 = b.vote(VoteMode::Ballot, c4);
    let bits = [(v1, 1u32), (v2, 2), (v3, 4)];
    let mut acc = v4;
    for (v, w) in bits {
        let wv = b.const_u32(w);
        let s = b.select(v, wv, zero);
        acc = b.xor(acc, s);
    }
    let off = store_u32(&mut b, acc, &mut region);
    for t in 0..N {
        checks.push((off + t * 4, ScalarType::U32, (0xAAAA_AAAAu32 ^ 1 ^ 4) as u64));
    }
    // s8 load sign extension, negative ptradd index, 64-bit indices, v4.f64 / v4.f32 / v4.u8 copies
    let i8v = {
        let p = at(&mut b, inp, ScalarType::I8, in_off[&ScalarType::I8], tid);
        b.load(p)
    };
    let w = b.cvt(i8v, ScalarType::I32);
    let off = store_u32(&mut b, w, &mut region);
    checks.push((off, ScalarType::I32, u64::MAX)); // marker: checked against input in python (sext)
    let f32base = b.ptr_cast(inp, ScalarType::F32);
    let fb_off = b.const_u32(in_off[&ScalarType::F32] / 4 + 10);
    let p10 = b.ptr_add(f32base, fb_off);
    let minus3 = b.const_i32(-3);
    let p7 = b.ptr_add(p10, minus3);
    let tid64 = b.cvt(tid, ScalarType::U64);
    let p7t = b.ptr_add(p7, tid64);
    let x = b.load(p7t);
    let off = store_u32(&mut b, x, &mut region);
    checks.push((off, ScalarType::F32, u64::MAX - 1)); // marker: = input f32[7 + t]
    let f64p = b.ptr_cast(inp, ScalarType::F64);
    let base = b.const_u32(in_off[&ScalarType::F64] / 8);
    let f64p = b.ptr_add(f64p, base);
    let four = b.const_u32(4);
    let tmod = b.rem(tid, sixteen);
    let t4 = b.mul(tmod, four);
    let src = b.ptr_add(f64p, t4);
    let v = b.load_vec(src, 4);
    let o64 = b.ptr_cast(out, ScalarType::F64);
    let ob = b.const_u32(region * N);
    let o64 = b.ptr_add(o64, ob);
    let t4b = b.mul(tid, four);
    let dst = b.ptr_add(o64, t4b);
    b.store(dst, v);
    checks.push((region * N * 8, ScalarType::F64, u64::MAX - 2)); // marker: out f64[4t+k] = in f64[4(t%16)+k]
    region += 4; // 4*N*8 bytes used
                 // shared: static f64 v2 + dynamic u32 reverse + shared atomics
    let sh = b.shared_array("sh", ScalarType::F64, 2 * N);
    let shp = b.shared_ptr(sh);
    let two = b.const_u32(2);
    let t2 = b.mul(tid, two);
    let shq = b.ptr_add(shp, t2);
    let tf = b.cvt(tid, ScalarType::F64);
    let half = b.const_f64(0.5);
    let tf2 = b.add(tf, half);
    let vv = b.make_vector(&[tf, tf2]);
    b.store(shq, vv);
    let dynp = b.dyn_shared_ptr(ScalarType::U32);
    let dq = b.ptr_add(dynp, tid);
    let tt = b.mul(tid, two);
    b.store(dq, tt);
    let cnt = b.shared_array("cnt", ScalarType::U32, 4);
    let cntp = b.shared_ptr(cnt);
    let is_t0 = b.eq(tid, zero);
    b.if_then(is_t0, |b| {
        let z = b.const_u32(0);
        b.store(cntp, z);
    });
    b.barrier();
    let _ = b.atomic(AtomicOp::Add, cntp, one);
    b.barrier();
    let sixtythree = b.const_u32(N - 1);
    let rev = b.sub(sixtythree, tid);
    let rq = b.ptr_add(dynp, rev);
    let rv = b.load(rq);
    let tot = b.load(cntp);
    let hundredk = b.const_u32(1000);
    let comb = b.fma(tot, hundredk, rv);
    let off = store_u32(&mut b, comb, &mut region);
    for t in 0..N {
        checks.push((off + t * 4, ScalarType::U32, (N * 1000 + (N - 1 - t) * 2) as u64));
    }
    let rt = b.rem(rev, sixteen);
    let rt2 = b.mul(rt, two);
    let sq = b.ptr_add(shp, rt2);
    let sv = b.load_vec(sq, 2);
    let s0 = b.extract(sv, 0);
    let s1 = b.extract(sv, 1);
    let ssum = b.add(s0, s1);
    let off = store_u32(&mut b, ssum, &mut region);
    for t in 0..N {
        let r = ((N - 1 - t) % 16) as f64;
        checks.push((off + t * 8, ScalarType::F64, (r + r + 0.5).to_bits()));
    }
    // global atomics into a dedicated region (zeroed by the runner)
    let aoff = region * N * 8;
    region += 1;
    let a32 = b.ptr_cast(out, ScalarType::U32);
    let abase = b.const_u32(aoff / 4);
    let a32 = b.ptr_add(a32, abase);
    let _ = b.atomic(AtomicOp::Add, a32, one);
    let a1 = b.ptr_add(a32, one);
    let _ = b.atomic(AtomicOp::Max, a1, tid);
    let a2 = b.ptr_add(a32, two);
    let a2s = b.ptr_cast(a2, ScalarType::I32);
    let ti = b.bitcast(tid, ScalarType::I32);
    let nti = b.neg(ti);
    let _ = b.atomic(AtomicOp::Min, a2s, nti);
    let a3 = b.ptr_add(a32, threec);
    let a3f = b.ptr_cast(a3, ScalarType::F32);
    let onef = b.const_f32(1.0);
    let _ = b.atomic(AtomicOp::Add, a3f, onef);
    let a4 = b.ptr_add(a32, four);
    let a4d = b.ptr_cast(a4, ScalarType::F64);
    let _ = b.atomic(AtomicOp::Add, a4d, half);
    let six = b.const_u32(6);
    let a6 = b.ptr_add(a32, six);
    let tp1 = b.add(tid, one);
    let old = b.atomic_cas(a6, zero, tp1);
    let won = b.eq(old, zero);
    let eight = b.const_u32(8);
    let a8 = b.ptr_add(a32, eight);
    let wonu = b.select(won, one, zero);
    let _ = b.atomic(AtomicOp::Add, a8, wonu);
    let a10 = b.const_u32(10);
    let a10p = b.ptr_add(a32, a10);
    let a10l = b.ptr_cast(a10p, ScalarType::U64);
    let big = b.cvt(tid, ScalarType::U64);
    let sh32 = b.const_u32(32);
    let big = b.shl(big, sh32);
    let _ = b.atomic(AtomicOp::Add, a10l, big);
    checks.push((aoff, ScalarType::U32, N as u64));
    checks.push((aoff + 4, ScalarType::U32, (N - 1) as u64));
    checks.push((aoff + 8, ScalarType::I32, (-(N as i32 - 1)) as u32 as u64));
    checks.push((aoff + 12, ScalarType::F32, (N as f32).to_bits() as u64));
    checks.push((aoff + 16, ScalarType::F64, (N as f64 * 0.5).to_bits()));
    checks.push((aoff + 32, ScalarType::U32, 1));
    checks.push((aoff + 40, ScalarType::U64, ((N as u64 * (N as u64 - 1)) / 2) << 32));
    let k = b.finish().unwrap();
    std::fs::write(format!("{dir}/misc.ptx"), emit(&k, Arch::Sm90)).unwrap();
    let mut cs = String::from("[");
    for (i, (o, t, v)) in checks.iter().enumerate() {
        let _ = write!(cs, "{}[{o}, \"{t}\", {v}]", if i > 0 { ",\n" } else { "" });
    }
    cs.push(']');
    std::fs::write(format!("{dir}/misc.spec.json"), cs).unwrap();
    let _ = writeln!(
        cases,
        "{{\"name\": \"misc\", \"ptx\": \"misc.ptx\", \"grid\": 1, \"block\": {N}, \"dyn\": {}, \"out_bytes\": {}}}",
        N * 4,
        region * N * 8
    );
    cases.push(']');
    std::fs::write(format!("{dir}/cases.json"), cases).unwrap();
    std::fs::write(format!("{dir}/inputs.json"), input_spec).unwrap();
}
