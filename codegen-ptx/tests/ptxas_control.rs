//! Structured control flow: if/else with results, loops with carried values (including a swap,
//! which needs a parallel copy), nesting, every induction type, uniform and divergent branches,
//! barriers in uniform loops, shared memory; assembled for sm_80, sm_90 and sm_90a.

use crate::common;

use common::assemble_for;
use ruda_codegen_ptx::Arch;
use ruda_ir::coverage::{control_kernel, fib_kernel};

#[test]
fn control_flow_emits_structured_branches() {
    let k = control_kernel().unwrap_or_else(|e| panic!("{e}"));
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
    let k = fib_kernel().unwrap_or_else(|e| panic!("{e}"));
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
