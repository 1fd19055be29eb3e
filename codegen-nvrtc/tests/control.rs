//! Structured control flow as C++ `if`/`for`: results of several kinds, nesting, loops with
//! carried values (a swap needs a parallel copy), every induction type with its compare and a
//! wrapping increment, barriers, shared memory; compiled for compute_80, compute_90 and
//! compute_90a and assembled for the matching sm_*. Also determinism.

mod common;

use common::{compile_and_assemble, cuda, global, Sink};
use ruda_codegen_nvrtc::{emit_cuda, emit_cuda_module};
use ruda_codegen_ptx::Arch;
use ruda_ir::{Constant, Kernel, KernelBuilder, ScalarType, Type};

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
    // if inside, and a shared pointer carried through an if.
    let one_u = b.const_u32(1);
    let zero_f = b.const_f32(0.0);
    let one_f = b.const_f32(1.0);
    let swapped = b.for_range(zero_u, n, one_u, &[zero_f, one_f], |b, _, c| {
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
        vec![c[1], bumped]
    });
    sink.put(&mut b, swapped[0]);
    sink.put(&mut b, swapped[1]);

    // Loops over every induction type; the carried value is the induction variable itself.
    for t in [ScalarType::I32, ScalarType::U32, ScalarType::I64, ScalarType::U64] {
        let start = b.constant(Constant::new(t, 0));
        let step = b.constant(Constant::new(t, 3));
        let end = b.cvt(n, t);
        let last = b.for_range(start, end, step, &[start], |_, iv, _| vec![iv]);
        sink.put(&mut b, last[0]);
    }
    b.finish().unwrap_or_else(|e| panic!("{e}"))
}

/// `(a, b) -> (b, a + b)`: `b` must be read before `a` is overwritten with it.
fn fib_kernel() -> Kernel {
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
    b.finish().unwrap_or_else(|e| panic!("{e}"))
}

/// The lines of `text` with leading whitespace and trailing comments removed.
fn code_lines(text: &str) -> Vec<String> {
    text.lines().map(|l| l.split("  //").next().unwrap_or_default().trim().to_string()).collect()
}

#[test]
fn control_flow_is_structured_cpp() {
    let c = cuda(&control_kernel());
    let lines = code_lines(&c);
    let has = |s: &str| lines.iter().any(|l| l == s);
    // If results are declared before the `if` and assigned at the end of each branch.
    assert!(c.contains("extern \"C\" __global__ void __launch_bounds__(256) control("), "{c}");
    assert!(has("__shared__ __align__(16) float smem_tile[256];"), "{c}");
    let if_at = lines.iter().position(|l| l.starts_with("if (") && l.ends_with(") {")).expect("an if");
    for decl in ["float v", "float* v", "bool v", "ruda_vec<float, 2> v"] {
        let at = lines.iter().position(|l| l.starts_with(decl) && l.ends_with(';') && !l.contains('=')).expect(decl);
        assert!(at < if_at, "{decl} declared after the if:\n{c}");
    }
    assert!(has("} else {"), "{c}");
    // Every induction type with its own compare and a wrapping increment.
    for (t, inc) in [
        ("int", "(int)((unsigned)v"),
        ("unsigned", "v"),
        ("long long", "(long long)((unsigned long long)v"),
        ("unsigned long long", "v"),
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("for ({t} v"))
                && l.contains("; v")
                && l.contains(&format!(" = {inc}"))),
            "no {t} loop in\n{c}"
        );
    }
    assert!(has("__syncthreads();"), "{c}");
    // NVVM keeps every loop as the IR has it: the IR's passes decide unrolling.
    let loops = lines.iter().filter(|l| l.starts_with("for (")).count();
    assert_eq!(loops, 6, "{c}");
    for (i, l) in lines.iter().enumerate().filter(|(_, l)| l.starts_with("for (")) {
        assert_eq!(lines[i - 1], "#pragma unroll 1", "loop without `#pragma unroll 1`: {l}");
    }
    // Braces balance.
    assert_eq!(c.matches('{').count(), c.matches('}').count());
}

#[test]
fn loop_carried_swap_is_a_parallel_copy() {
    let c = cuda(&fib_kernel());
    let lines = code_lines(&c);
    let head = lines.iter().position(|l| l.starts_with("for (unsigned v")).expect("a loop");
    // for (...) { unsigned s = a + b; unsigned a_next = b; a = a_next; b = s; }
    let body: Vec<&String> = lines[head + 1..].iter().take_while(|l| *l != "}").collect();
    assert_eq!(body.len(), 4, "{c}");
    let words =
        |l: &str| l.split([' ', ';', '=', '+']).filter(|w| !w.is_empty()).map(str::to_string).collect::<Vec<_>>();
    let sum = words(body[0]);
    let (s, a, b) = (&sum[1], &sum[2], &sum[3]);
    assert_eq!(body[1], &format!("unsigned {a}_next = {b};"), "{c}");
    assert_eq!(body[2], &format!("{a} = {a}_next;"), "{c}");
    assert_eq!(body[3], &format!("{b} = {s};"), "{c}");
}

#[test]
fn output_is_deterministic_and_names_sources() {
    let (k1, k2) = (control_kernel(), control_kernel());
    let c = emit_cuda(&k1).expect("emits");
    assert_eq!(c, emit_cuda(&k2).expect("emits"), "two emissions differ");
    assert!(c.contains("  // codegen-nvrtc/tests/control.rs:"), "{c}");
    assert!(c.contains("  // line "), "{c}");
    // A module shares one prelude.
    let fib = fib_kernel();
    let m = emit_cuda_module(&[&k1, &fib]).expect("emits");
    assert_eq!(m.matches("struct alignas(sizeof(T) * N) ruda_vec").count(), 1);
    assert!(m.contains("// kernels: control, fib\n"));
    let twice = emit_cuda_module(&[&fib, &fib]).unwrap_err().to_string();
    assert!(twice.contains("two kernels named `fib`"), "{twice}");
}

#[test]
fn control_flow_compiles_and_assembles() {
    let (control, fib) = (control_kernel(), fib_kernel());
    compile_and_assemble("control flow", &[&control, &fib], &[Arch::Sm80, Arch::Sm90, Arch::Sm90a]);
}
