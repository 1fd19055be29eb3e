//! Structured control flow as C++ `if`/`for`: results of several kinds, nesting, loops with
//! carried values (a swap needs a parallel copy), every induction type with its compare and a
//! wrapping increment, barriers, shared memory; compiled for compute_80, compute_90 and
//! compute_90a and assembled for the matching sm_*. Also determinism.

use crate::common;

use common::{compile_and_assemble, cuda};
use ruda_codegen_nvrtc::{emit_cuda, emit_cuda_module};
use ruda_codegen_ptx::Arch;
use ruda_ir::coverage;
use ruda_ir::Kernel;

fn control_kernel() -> Kernel {
    coverage::control_kernel().unwrap_or_else(|e| panic!("{e}"))
}

fn fib_kernel() -> Kernel {
    coverage::fib_kernel().unwrap_or_else(|e| panic!("{e}"))
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
    assert!(c.contains("  // ir/src/coverage.rs:"), "{c}");
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
