//! The generator's own guarantees: every kernel verifies and runs without interpreter errors,
//! generation is deterministic, fuzzer bytes work (none, zeros, random), and the kernels
//! together cover every operation and type combination the verifier accepts.

use std::collections::BTreeSet;

use ruda_ir::gen::{generate, run_generated, run_generated_on, ArgSpec, Entropy, GenConfig, GeneratedKernel};
use ruda_ir::{
    print_kernel, verify, AddrSpace, AtomicOp, BinaryOp, CmpOp, Cvt, Kernel, KernelBuilder, Op, Rounding, ScalarType,
    ShflMode, SpecialReg, Type, UnaryOp, Value, VoteMode,
};

const DATA: [ScalarType; 12] = [
    ScalarType::I8,
    ScalarType::I16,
    ScalarType::I32,
    ScalarType::I64,
    ScalarType::U8,
    ScalarType::U16,
    ScalarType::U32,
    ScalarType::U64,
    ScalarType::F16,
    ScalarType::BF16,
    ScalarType::F32,
    ScalarType::F64,
];

fn all_scalars() -> impl Iterator<Item = ScalarType> {
    ScalarType::ALL.into_iter()
}

/// Generate, verify and run one kernel; panics with the kernel text on any failure.
fn check(g: &GeneratedKernel, what: &str) {
    if let Err(e) = verify(&g.kernel) {
        panic!("{what}: generated kernel does not verify: {e}\n{}", print_kernel(&g.kernel));
    }
    if let Err(e) = run_generated(g, &g.kernel) {
        panic!("{what}: generated kernel fails in the interpreter: {e}\n{}", print_kernel(&g.kernel));
    }
}

#[test]
fn seeded_kernels_verify_and_run() {
    let cfg = GenConfig::default();
    for seed in 0..1500 {
        check(&generate(&mut Entropy::from_seed(seed), &cfg), &format!("seed {seed}"));
    }
}

#[test]
fn other_configurations_verify_and_run() {
    let configs = [
        GenConfig { max_block_threads: 1024, max_blocks: 2, max_insts: 60, ..GenConfig::default() },
        GenConfig { max_block_threads: 5000, max_blocks: 1, max_insts: 30, ..GenConfig::default() },
        GenConfig { max_depth: 0, ..GenConfig::default() },
        GenConfig { max_depth: 6, max_insts: 400, ..GenConfig::default() },
        GenConfig { shared: false, warp: false, atomics: false, approx: false, ..GenConfig::default() },
        GenConfig { sm80_conversions: true, ..GenConfig::default() },
    ];
    for (i, cfg) in configs.iter().enumerate() {
        for seed in 0..150 {
            check(&generate(&mut Entropy::from_seed(seed), cfg), &format!("config {i}, seed {seed}"));
        }
    }
}

#[test]
fn fuzzer_bytes_verify_and_run() {
    let cfg = GenConfig::default();
    let g = generate(&mut Entropy::from_bytes(&[]), &cfg);
    check(&g, "no bytes");
    check(&generate(&mut Entropy::from_bytes(&[0; 64]), &cfg), "zeros");
    check(&generate(&mut Entropy::from_bytes(&[0xff; 4096]), &cfg), "0xff bytes");
    let mut rng = Entropy::from_seed(99);
    for case in 0..300 {
        let len = rng.below(3000) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
        check(&generate(&mut Entropy::from_bytes(&bytes), &cfg), &format!("random bytes, case {case}"));
    }
}

#[test]
fn zero_bytes_give_the_smallest_kernel() {
    let cfg = GenConfig::default();
    let empty = generate(&mut Entropy::from_bytes(&[]), &cfg);
    let seeded = generate(&mut Entropy::from_seed(1), &cfg);
    let count = |k: &Kernel| {
        let mut n = 0;
        k.walk(|_, _| n += 1);
        n
    };
    assert!(count(&empty.kernel) < 40, "{}", print_kernel(&empty.kernel));
    assert!(count(&seeded.kernel) > count(&empty.kernel));
    assert_eq!(empty.launch.block, [32, 1, 1]);
    assert_eq!(empty.launch.grid, [1, 1, 1]);
}

#[test]
fn generation_is_deterministic() {
    let cfg = GenConfig::default();
    for seed in [0, 1, 12345, u64::MAX] {
        let a = generate(&mut Entropy::from_seed(seed), &cfg);
        let b = generate(&mut Entropy::from_seed(seed), &cfg);
        assert_eq!(print_kernel(&a.kernel), print_kernel(&b.kernel));
        assert_eq!(a.inputs, b.inputs);
        assert_eq!(a.launch, b.launch);
        assert!(run_generated(&a, &a.kernel) == run_generated(&b, &b.kernel), "seed {seed}: the outputs differ");
    }
    let bytes: Vec<u8> = (0..2000u32).map(|i| (i * 7919 % 251) as u8).collect();
    let a = generate(&mut Entropy::from_bytes(&bytes), &cfg);
    let b = generate(&mut Entropy::from_bytes(&bytes), &cfg);
    assert_eq!(print_kernel(&a.kernel), print_kernel(&b.kernel));
}

/// Run on `threads` interpreter threads (blocks then run in different orders and overlap).
fn run_on(g: &GeneratedKernel, threads: usize) -> Vec<Vec<u8>> {
    run_generated_on(g, &g.kernel, Some(threads)).expect("runs")
}

#[test]
fn results_do_not_depend_on_scheduling() {
    // Atomics of different kinds on one word would make this fail now and then (it did).
    let cfg = GenConfig { max_blocks: 8, ..GenConfig::default() };
    for seed in 0..150 {
        let g = generate(&mut Entropy::from_seed(seed), &cfg);
        let one = run_on(&g, 1);
        for _ in 0..2 {
            assert!(run_on(&g, 4) == one, "seed {seed}: the result depends on how blocks are scheduled");
        }
    }
}

#[test]
fn each_kind_of_atomic_has_its_own_bytes() {
    // Different atomic operations (or 32- and 64-bit views) on one word do not commute; the
    // generator gives each kind 16 bytes of its own: `ptradd(ptradd(ptrcast(base), first), i)`
    // with `i` masked below 16 bytes. Atomics on the thread's own output slot
    // (`ptradd(ptrcast(own), constant)`) are the only others: no other thread touches those.
    let cfg = GenConfig::default();
    let (mut atomics, mut own) = (0, 0);
    for seed in 0..300 {
        let g = generate(&mut Entropy::from_seed(seed), &cfg);
        let k = &g.kernel;
        let mut defs = std::collections::HashMap::new();
        k.walk(|_, inst| {
            for r in &inst.results {
                defs.insert(*r, inst.op.clone());
            }
        });
        let mut owner: std::collections::HashMap<(String, u64), String> = Default::default();
        k.walk(|_, inst| {
            let Op::Atomic { op, ptr, .. } = &inst.op else { return };
            atomics += 1;
            let elem = k.ty(*ptr).elem();
            let (Some(Op::PtrAdd(p1, _)), kind) = (defs.get(ptr), format!("{op}.{elem}")) else {
                panic!("seed {seed}: unexpected atomic address")
            };
            if let Some(Op::PtrCast(slot, _)) = defs.get(p1) {
                let out = k.params.iter().find(|p| p.name == "out").map(|p| p.value);
                let Some(Op::PtrAdd(root, _)) = defs.get(slot) else { panic!("seed {seed}: unexpected slot") };
                assert_eq!(Some(*root), out, "seed {seed}: an atomic on a cast pointer that is not the own slot");
                own += 1;
                return;
            }
            let Some(Op::PtrAdd(p0, first)) = defs.get(p1) else { panic!("seed {seed}: no first word") };
            let Some(Op::Const(first)) = defs.get(first) else { panic!("seed {seed}: first word not constant") };
            let Some(Op::PtrCast(base, _)) = defs.get(p0) else { panic!("seed {seed}: no cast") };
            let root = match defs.get(base) {
                Some(Op::SharedBase(id)) => format!("shared {id}"),
                _ => format!("{base}"),
            };
            let byte = first.bits * elem.bytes() as u64;
            assert_eq!(byte % 16, 0, "seed {seed}");
            let previous = owner.entry((root, byte)).or_insert_with(|| kind.clone());
            assert_eq!(*previous, kind, "seed {seed}: two kinds of atomics on the same bytes");
        });
    }
    assert!(atomics > 100 && own > 50, "{atomics} atomics, {own} on own slots");
}

#[test]
fn large_blocks_fit_the_limits() {
    // 1024 threads at most, and at most 48 KiB of shared memory (a GPU's default limit).
    let cfg = GenConfig { max_block_threads: 4096, max_insts: 20, ..GenConfig::default() };
    let mut arrays = 0;
    for seed in 0..200 {
        let g = generate(&mut Entropy::from_seed(seed), &cfg);
        let threads: u32 = g.launch.block.iter().product();
        assert!(threads <= 1024, "{:?}", g.launch);
        let shared = g.kernel.static_shared_bytes().next_multiple_of(16) + g.launch.dynamic_shared_bytes;
        assert!(shared <= 48 * 1024, "seed {seed}: {shared} bytes of shared memory");
        if let Some(lb) = g.kernel.launch_bounds {
            assert!(lb.min_blocks.unwrap_or(1) * lb.max_threads <= 2048, "seed {seed}: {lb:?}");
        }
        arrays += g.kernel.shared.len();
    }
    assert!(arrays > 100, "{arrays}");
}

#[test]
fn seeds_give_different_kernels() {
    let cfg = GenConfig::default();
    let texts: BTreeSet<String> =
        (0..50).map(|s| print_kernel(&generate(&mut Entropy::from_seed(s), &cfg).kernel)).collect();
    assert_eq!(texts.len(), 50);
}

#[test]
fn outputs_depend_on_the_kernel() {
    // A kernel whose outputs equal its initial buffers would make every comparison vacuous.
    let cfg = GenConfig::default();
    let changed = (0..50)
        .filter(|&seed| {
            let g = generate(&mut Entropy::from_seed(seed), &cfg);
            let before: Vec<Vec<u8>> = g
                .inputs
                .iter()
                .filter_map(|a| match a {
                    ArgSpec::Buffer { bytes, .. } => Some(bytes.clone()),
                    ArgSpec::Scalar(_) => None,
                })
                .collect();
            run_generated(&g, &g.kernel).expect("runs") != before
        })
        .count();
    assert_eq!(changed, 50);
}

#[test]
fn the_name_and_the_approx_flag() {
    let cfg = GenConfig { name: "fuzz_7".into(), ..GenConfig::default() };
    let mut with_approx = 0;
    for seed in 0..300 {
        let g = generate(&mut Entropy::from_seed(seed), &cfg);
        assert_eq!(g.kernel.name, "fuzz_7");
        assert!(g.kernel.shared.iter().all(|s| s.name.starts_with("fuzz_7_")));
        let mut approx = false;
        g.kernel.walk(|_, i| approx |= matches!(i.op, Op::Unary(op, _) if op.is_approx()));
        assert_eq!(g.uses_approx, approx, "seed {seed}");
        with_approx += approx as u32;
    }
    assert!(with_approx > 30, "{with_approx}");
    let cfg = GenConfig { approx: false, ..GenConfig::default() };
    for seed in 0..300 {
        assert!(!generate(&mut Entropy::from_seed(seed), &cfg).uses_approx);
    }
}

#[test]
fn launches_fit_the_configuration() {
    let cfg = GenConfig { max_block_threads: 96, max_blocks: 3, ..GenConfig::default() };
    let mut shapes = BTreeSet::new();
    for seed in 0..300 {
        let g = generate(&mut Entropy::from_seed(seed), &cfg);
        let threads: u32 = g.launch.block.iter().product();
        let blocks: u32 = g.launch.grid.iter().product();
        assert!(threads.is_multiple_of(32) && (32..=96).contains(&threads), "{:?}", g.launch);
        assert!((1..=3).contains(&blocks), "{:?}", g.launch);
        shapes.insert((threads, blocks, g.launch.block[1] > 1));
    }
    assert_eq!(shapes.len(), 3 * 3 * 2, "{shapes:?}");
}

// ---- coverage -------------------------------------------------------------------------------

/// Whether the verifier accepts `op` on fresh parameters of the given types.
fn accepts(param_types: &[Type], op: impl FnOnce(&mut KernelBuilder, &[Value])) -> bool {
    let mut b = KernelBuilder::new("probe");
    let params: Vec<Value> = param_types.iter().enumerate().map(|(i, t)| b.param(format!("p{i}"), *t)).collect();
    op(&mut b, &params);
    b.finish().is_ok()
}

/// Scalar kernel parameters cannot be predicates: probe predicates through a comparison.
fn probe_types(t: ScalarType) -> Option<Type> {
    (t != ScalarType::Pred).then_some(Type::Scalar(t))
}

/// Features a kernel exercises, as comparable strings.
fn features(k: &Kernel) -> BTreeSet<String> {
    let mut f = BTreeSet::new();
    let ty = |v: Value| k.ty(v);
    k.walk(|_, inst| {
        let key = match &inst.op {
            Op::Unary(op, a) => format!("{op}.{}", ty(*a)),
            Op::Binary(op, a, _) => format!("{op}.{}", ty(*a)),
            Op::Fma(a, ..) => format!("fma.{}", ty(*a)),
            Op::Cmp(op, a, _) => format!("cmp.{op}.{}", ty(*a)),
            Op::Select(_, a, _) => format!("select.{}", ty(*a)),
            Op::Cvt(a, c) => cvt_key(ty(*a).elem(), *c),
            Op::Bitcast(a, to) => format!("bitcast.{}.{to}", ty(*a)),
            Op::Special(r) => format!("special.{}", r.name()),
            Op::Load { ptr, lanes } => format!("load.{}.{lanes}", ptr_key(ty(*ptr))),
            Op::Store { ptr, value } => format!("store.{}.{}", ptr_key(ty(*ptr)), ty(*value).lanes()),
            Op::Atomic { op, ptr, .. } => format!("atomic.{op}.{}", ptr_key(ty(*ptr))),
            Op::Shfl { mode, value, .. } => format!("shfl.{mode}.{}", ty(*value)),
            Op::Vote { mode, .. } => format!("vote.{mode}"),
            Op::Extract(v, _) => format!("extract.{}", ty(*v)),
            Op::MakeVector(vs) => format!("vector.{}.{}", ty(vs[0]), vs.len()),
            Op::If { then_region, .. } => format!("if.yields.{}", k.region(*then_region).yields.len().min(1)),
            Op::For { start, init, .. } => format!("for.{}.carried.{}", ty(*start), init.len().min(1)),
            Op::DynSharedBase(_) => "dyn_shared".into(),
            other => other.mnemonic(),
        };
        f.insert(key);
        if let Op::PtrAdd(_, i) = &inst.op {
            f.insert(format!("ptradd.{}", ty(*i)));
        }
    });
    f
}

fn ptr_key(t: Type) -> String {
    match t {
        Type::Ptr(space, elem) => format!("{space}.{elem}"),
        other => format!("{other}"),
    }
}

fn cvt_key(from: ScalarType, c: Cvt) -> String {
    let r = c.rounding.map_or("none".to_string(), |r| r.to_string());
    format!("cvt.{from}.{}.{r}.{}", c.to, if c.sat { "sat" } else { "nosat" })
}

/// Every combination the verifier accepts, probed (so new ones show up here unasked).
fn accepted() -> BTreeSet<String> {
    let mut want = BTreeSet::new();
    let pred_param = |b: &mut KernelBuilder, p: &[Value]| {
        let zero = b.const_u32(0);
        b.eq(p[0], zero)
    };
    for t in all_scalars() {
        let Some(ty) = probe_types(t) else { continue };
        for &op in UnaryOp::ALL {
            if accepts(&[ty], |b, p| {
                b.unary(op, p[0]);
            }) {
                want.insert(format!("{op}.{t}"));
            }
        }
        for &op in BinaryOp::ALL {
            let rhs = if matches!(op, BinaryOp::Shl | BinaryOp::Shr) { Type::U32 } else { ty };
            if accepts(&[ty, rhs], |b, p| {
                b.binary(op, p[0], p[1]);
            }) {
                want.insert(format!("{op}.{t}"));
            }
        }
        if accepts(&[ty, ty, ty], |b, p| {
            b.fma(p[0], p[1], p[2]);
        }) {
            want.insert(format!("fma.{t}"));
        }
        for &op in CmpOp::ALL {
            if accepts(&[ty, ty], |b, p| {
                b.cmp(op, p[0], p[1]);
            }) {
                want.insert(format!("cmp.{op}.{t}"));
            }
        }
        want.insert(format!("select.{t}"));
        for to in all_scalars() {
            if accepts(&[ty], |b, p| {
                b.bitcast(p[0], to);
            }) {
                want.insert(format!("bitcast.{t}.{to}"));
            }
            let roundings: Vec<Option<Rounding>> =
                std::iter::once(None).chain(Rounding::ALL.iter().copied().map(Some)).collect();
            for rounding in roundings {
                for sat in [false, true] {
                    let c = Cvt { to, rounding, sat };
                    if accepts(&[ty], |b, p| {
                        b.cvt_with(p[0], c);
                    }) {
                        want.insert(cvt_key(t, c));
                    }
                }
            }
        }
    }
    // Predicates: logic and equality.
    for (op, key) in [(BinaryOp::And, "and"), (BinaryOp::Or, "or"), (BinaryOp::Xor, "xor")] {
        assert!(accepts(&[Type::U32], |b, p| {
            let c = pred_param(b, p);
            b.binary(op, c, c);
        }));
        want.insert(format!("{key}.pred"));
    }
    want.insert("not.pred".into());
    want.insert("cmp.eq.pred".into());
    want.insert("cmp.ne.pred".into());
    want.insert("select.pred".into());
    for t in DATA {
        for lanes in [1, 2, 4] {
            for space in [AddrSpace::Global, AddrSpace::Shared] {
                want.insert(format!("load.{space}.{t}.{lanes}"));
                want.insert(format!("store.{space}.{t}.{lanes}"));
            }
        }
        for n in [2, 4] {
            want.insert(format!("vector.{t}.{n}"));
            want.insert(format!("extract.v{n}{t}"));
        }
    }
    for (op, t) in [
        (AtomicOp::Add, "u32"),
        (AtomicOp::Add, "s32"),
        (AtomicOp::Add, "u64"),
        (AtomicOp::Min, "u32"),
        (AtomicOp::Min, "s32"),
        (AtomicOp::Min, "u64"),
        (AtomicOp::Min, "s64"),
        (AtomicOp::Max, "u32"),
        (AtomicOp::Max, "s32"),
        (AtomicOp::Max, "u64"),
        (AtomicOp::Max, "s64"),
    ] {
        for space in ["global", "shared"] {
            want.insert(format!("atomic.{op}.{space}.{t}"));
        }
    }
    for op in [AtomicOp::Exch, AtomicOp::Cas] {
        for t in ["u32", "s32", "u64", "s64", "f32", "f64"] {
            want.insert(format!("atomic.{op}.global.{t}"));
        }
    }
    for size in [4, 8, 16] {
        want.insert(format!("cp.async.{size}"));
    }
    for count in [1, 2, 4] {
        want.insert(format!("ldmatrix.x{count}"));
        want.insert(format!("ldmatrix.x{count}.trans"));
    }
    for x in ["cp.async.commit_group", "cp.async.wait_group", "mma.m16n8k16.f16", "mma.m16n8k16.bf16"] {
        want.insert(x.into());
    }
    for &mode in ShflMode::ALL {
        for t in ["u32", "s32", "f32"] {
            want.insert(format!("shfl.{mode}.{t}"));
        }
    }
    for &mode in VoteMode::ALL {
        want.insert(format!("vote.{mode}"));
    }
    for r in SpecialReg::ALL {
        want.insert(format!("special.{}", r.name()));
    }
    for t in ["s32", "u32", "s64", "u64"] {
        want.insert(format!("for.{t}.carried.0"));
        want.insert(format!("for.{t}.carried.1"));
        want.insert(format!("ptradd.{t}"));
    }
    for x in ["if.yields.0", "if.yields.1", "barrier", "dyn_shared", "ptrcast", "shared_base", "const"] {
        want.insert(x.into());
    }
    want
}

#[test]
fn kernels_cover_everything_the_verifier_accepts() {
    let want = accepted();
    // Sanity of the probe: every cvt pair of data types, and the arithmetic.
    assert!(want.len() > 700, "{}", want.len());
    assert!(want.contains("cvt.f16.bf16.rm.nosat") && want.contains("add.s16") && want.contains("tanh.f32"));
    let cfg = GenConfig::default();
    let mut got = BTreeSet::new();
    for seed in 0..2500 {
        let g = generate(&mut Entropy::from_seed(seed), &cfg);
        verify(&g.kernel).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", print_kernel(&g.kernel)));
        got.extend(features(&g.kernel));
    }
    let missing: Vec<&String> = want.difference(&got).collect();
    assert!(missing.is_empty(), "never generated ({}): {missing:?}", missing.len());
    // Nothing the generator makes is outside what the probe enumerates (keys stay in sync).
    let mut extra: Vec<&String> = got.difference(&want).collect();
    extra.retain(|k| !k.starts_with("ptradd") && !k.starts_with("select.ptr"));
    assert!(extra.is_empty(), "generated but not probed: {extra:?}");
}

#[test]
fn sm80_conversions_leave_out_sm90_only_bf16_conversions() {
    let cfg = GenConfig { sm80_conversions: true, ..GenConfig::default() };
    let mut to_bf16 = BTreeSet::new();
    for seed in 0..800 {
        let g = generate(&mut Entropy::from_seed(seed), &cfg);
        g.kernel.walk(|_, inst| {
            if let Op::Cvt(a, c) = &inst.op {
                let from = g.kernel.ty(*a).elem();
                if c.to == ScalarType::BF16 && from != ScalarType::BF16 {
                    let sm90 = matches!(c.rounding, Some(Rounding::Rm | Rounding::Rp))
                        || from == ScalarType::F64
                        || (from.is_int() && from.bits() >= 32);
                    assert!(!sm90, "seed {seed}: cvt {from} -> bf16 {:?}", c.rounding);
                    to_bf16.insert((from, c.rounding.map(|r| r.name())));
                }
            }
        });
    }
    // The sm_80 forms are all still there: rn and rz from f32, f16 and 8/16-bit integers.
    assert_eq!(to_bf16.len(), 6 * 2, "{to_bf16:?}");
}
