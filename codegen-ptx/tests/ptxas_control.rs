//! Structured control flow: if/else with results, loops with carried values (including a swap,
//! which needs a parallel copy), nesting, every induction type, uniform and divergent branches,
//! barriers in uniform loops, shared memory; assembled for sm_80, sm_90 and sm_90a.

mod common;

use common::{assemble_for, global, Sink};
use ruda_codegen_ptx::Arch;
use ruda_ir::{Kernel, KernelBuilder, ScalarType, Type};

fn control_kernel() -> Kernel {
    let mut b = KernelBuilder::new("control");
    let mut sink = Sink::new(&mut b);
    let n = b.param("n", Type::U32);
    let x = b.param("x", Type::F32);
    let data = b.param("data", global(ScalarType::F32));
    b.launch_bounds(256, None);
    let tile = b.shared_array("tile", ScalarType::F32, 256);
    let tid = b.thread_id_x();

    // A divergent if with results of several kinds: scalar, pointer, predicate, vector.
    let divergent = b.lt(tid, n);
    let results = b.if_else(
        divergent,
        |b| {
            let v = b.add(x, x);
            let p = b.ptr_add(data, tid);
            let t = b.const_pred(true);
            let vec = b.make_vector(&[v, v]);
            vec![v, p, t, vec]
        },
        |b| {
            let f = b.const_pred(false);
            let vec = b.make_vector(&[x, x]);
            vec![x, data, f, vec]
        },
    );
    b.store(results[1], results[0]);
    sink.put(&mut b, results[2]);
    let lane = b.extract(results[3], 1);
    sink.put(&mut b, lane);

    // An if without else, nested in an if.
    let zero_u = b.const_u32(0);
    let uniform = b.gt(n, zero_u);
    b.if_then(uniform, |b| {
        b.if_then(divergent, |b| {
            let p = b.ptr_add(data, tid);
            b.store(p, x);
        });
    });

    // A uniform loop carrying a swapped pair, with a barrier, a nested divergent loop and an
    // if inside.
    let one_u = b.const_u32(1);
    let zero_f = b.const_f32(0.0);
    let one_f = b.const_f32(1.0);
    let swapped = b.for_range(zero_u, n, one_u, &[zero_f, one_f], |b, i, c| {
        let base = b.shared_ptr(tile);
        let slot = b.ptr_add(base, tid);
        b.store(slot, c[0]);
        b.barrier();
        let inner = b.for_range(tid, n, one_u, &[c[1]], |b, j, d| {
            let odd = b.and(j, one_u);
            let is_odd = b.ne(odd, zero_u);
            let r = b.if_else(is_odd, |b| vec![b.mul(d[0], x)], |_| vec![d[0]]);
            vec![r[0]]
        });
        let bumped = b.add(inner[0], c[0]);
        let _ = i;
        vec![c[1], bumped]
    });
    sink.put(&mut b, swapped[0]);
    sink.put(&mut b, swapped[1]);

    // Loops over every induction type; the carried value is the induction variable itself.
    for t in [ScalarType::I32, ScalarType::U32, ScalarType::I64, ScalarType::U64] {
        let start = b.constant(ruda_ir::Constant::new(t, 0));
        let step = b.constant(ruda_ir::Constant::new(t, 3));
        let end = b.cvt(n, t);
        let last = b.for_range(start, end, step, &[start], |_, iv, _| vec![iv]);
        sink.put(&mut b, last[0]);
    }
    b.finish().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn control_flow_emits_structured_branches() {
    let k = control_kernel();
    let ptx = common::emit(&k, Arch::Sm80);
    let flat = common::squash(&ptx);
    // The divergent if uses a plain branch, the uniform one and the uniform loop `bra.uni`.
    for expected in [
        "@!%p1 bra $L_if0_else;",
        "bra.uni $L_if0_end;",
        "bra.uni $L_if1_end;",
        "bra $L_if2_end;",
        "bra.uni $L_for3_end;",
        "bra $L_for4_end;",
    ] {
        assert!(flat.contains(expected), "no `{expected}` in\n{ptx}");
    }
    assert!(
        !flat.contains("bra.uni $L_if2_end;") && !flat.contains("bra.uni $L_for4_end;"),
        "divergent branches marked uniform"
    );
    for t in ["s32", "u32", "s64", "u64"] {
        assert!(ptx.contains(&format!("setp.lt.{t}")), "loop compare on {t}");
    }
    // Every label is defined once and every branch target exists.
    let labels: Vec<&str> = ptx.lines().filter(|l| l.starts_with("$L")).map(|l| l.trim_end_matches(':')).collect();
    let mut unique = labels.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), labels.len(), "labels defined twice");
    for line in ptx.lines().filter(|l| l.contains("bra")) {
        let target = line.split_whitespace().last().unwrap_or_default().trim_end_matches(';');
        assert!(labels.contains(&target), "branch to undefined {target}");
    }
    assemble_for(&k, &[Arch::Sm80, Arch::Sm90, Arch::Sm90a]);
}

/// The swap `(a, b) -> (b, a + b)` must read `b` before overwriting `a`'s register with it and
/// overwrite `b` only after `a + b` was computed from the old values.
#[test]
fn loop_carried_swap_is_a_parallel_copy() {
    let mut b = KernelBuilder::new("fib");
    let out = b.param("out", global(ScalarType::U32));
    let n = b.param("n", Type::U32);
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let r = b.for_range(zero, n, one, &[zero, one], |b, _, c| {
        let s = b.add(c[0], c[1]);
        vec![c[1], s]
    });
    b.store(out, r[0]);
    let k = b.finish().unwrap_or_else(|e| panic!("{e}"));
    let ptx = common::emit(&k, Arch::Sm80);
    let body: Vec<&str> = ptx
        .lines()
        .skip_while(|l| !l.starts_with("$L_for0_head"))
        .take_while(|l| !l.starts_with("$L_for0_end"))
        .map(str::trim)
        .filter(|l| !l.starts_with('.'))
        .collect();
    // head, setp, branch, add, tmp <- b, a <- tmp, b <- sum, iv += step, back edge.
    let words: Vec<Vec<&str>> = body
        .iter()
        .map(|l| l.split(|c: char| c.is_whitespace() || c == ',' || c == ';').filter(|w| !w.is_empty()).collect())
        .collect();
    let find = |m: &str| {
        words.iter().position(|w| w.first() == Some(&m)).unwrap_or_else(|| panic!("no {m}:\n{}", body.join("\n")))
    };
    let add = &words[find("add.u32")];
    let (sum, a, bb) = (add[1], add[2], add[3]);
    let movs: Vec<&Vec<&str>> = words.iter().filter(|w| w[0] == "mov.b32").collect();
    assert_eq!(movs.len(), 3, "tmp <- b, a <- tmp, b <- sum:\n{}", body.join("\n"));
    let tmp = movs[0][1];
    assert_eq!(movs[0][2], bb);
    assert_eq!((movs[1][1], movs[1][2]), (a, tmp));
    assert_eq!((movs[2][1], movs[2][2]), (bb, sum));
    assemble_for(&k, &[Arch::Sm80]);
}
