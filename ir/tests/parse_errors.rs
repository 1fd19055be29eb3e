//! Malformed text is a `ParseError` that says where (line, column, a caret under the source
//! line), what was expected and what was found, never a panic.

use ruda_ir::parse::{MAX_NESTING, MAX_VALUES};
use ruda_ir::*;

/// Parse `body` inside a kernel header (`%0 n: u32`, `%1 p: ptr<global,f32>` defined) and
/// return the error.
fn error_in_body(body: &str) -> ParseError {
    let text = format!("kernel @k(%0 n: u32, %1 p: ptr<global,f32>) {{\n{body}}}\n");
    match parse_kernel(&text) {
        Ok(k) => panic!("parsed:\n{}", print_kernel(&k)),
        Err(e) => e,
    }
}

/// The error is at `line:col` and its message contains `expected` and `found`.
fn check(e: &ParseError, line: usize, col: usize, expected: &str, found: &str) {
    assert_eq!((e.line, e.col), (line, col), "{e}");
    assert!(e.expected.contains(expected), "expected {expected:?} in {e}");
    assert!(e.found.contains(found), "found {found:?} in {e}");
}

#[test]
fn display_has_position_message_source_line_and_caret() {
    let e = error_in_body("  %2: u32 = add %0, %0\n  %3: u33 = add %2, %2\n");
    assert_eq!(e.to_string(), "3:7: expected a type, found `u33`\n  %3: u33 = add %2, %2\n      ^",);
    // Tabs in the source line stay tabs under the caret, so it lines up.
    let e = parse_kernel("kernel @k() {\n\t%0: u32 = bogus\n}\n").unwrap_err();
    assert!(e.to_string().ends_with("\t%0: u32 = bogus\n\t          ^"), "{e}");
}

#[test]
fn unknown_names() {
    check(&error_in_body("  %2: u32 = frob %0\n"), 2, 13, "an operation", "`frob`");
    check(&error_in_body("  %2: pred = cmp.lessthan %0, %0\n"), 2, 14, "an operation", "`cmp.lessthan`");
    check(&error_in_body("  %2: u32 = add.sat %0, %0\n"), 2, 13, "an operation", "`add.sat`");
    check(&error_in_body("  %2: f32 = cvt.rx %0\n"), 2, 13, "an operation", "`cvt.rx`");
    check(&error_in_body("  %2: f32 = cvt.sat.rn %0\n"), 2, 13, "an operation", "`cvt.sat.rn`");
    check(&error_in_body("  %2: u32 = special tid.w\n"), 2, 21, "special register", "`tid.w`");
    check(&error_in_body("  %2: ptr<shared,f32> = shared_base @nope\n"), 2, 37, "declared by `.shared`", "`@nope`");
    check(&error_in_body("  %2: ptr<heap,f32> = ptrcast %1\n"), 2, 11, "an address space", "`heap`");
    check(&error_in_body("  %2: v3x = load %1\n"), 2, 7, "a type", "`v3x`");
    check(&error_in_body("  %2: v99f32 = load %1\n"), 2, 7, "a type", "`v99f32`");
    check(&error_in_body("  .frob 3\n"), 2, 3, "`.launch_bounds` or `.shared`", "`.frob`");
}

#[test]
fn undefined_and_redefined_values() {
    check(&error_in_body("  %2: u32 = add %0, %9\n"), 2, 21, "a value defined earlier", "`%9`");
    // An instruction cannot use its own result.
    check(&error_in_body("  %2: u32 = add %2, %0\n"), 2, 17, "a value defined earlier", "`%2`");
    check(
        &error_in_body("  %2: u32 = add %0, %0\n  %2: u32 = add %0, %0\n"),
        3,
        3,
        "not defined before",
        "defined twice",
    );
    check(&error_in_body("  %0: u32 = add %0, %0\n"), 2, 3, "not defined before", "defined twice");
    // A loop's induction variable is not visible in its own bounds.
    check(&error_in_body("  for %2: u32 = %2 to %0 step %0 {\n  }\n"), 2, 17, "a value defined earlier", "`%2`");
    check(&error_in_body(&format!("  %{MAX_VALUES}: u32 = add %0, %0\n")), 2, 3, "a value number below", "%4194304");
    check(&error_in_body("  %99999999999: u32 = add %0, %0\n"), 2, 3, "a value number below", "%99999999999");
}

#[test]
fn malformed_constants() {
    check(&error_in_body("  %2: u8 = const 256\n"), 2, 18, "a u8 constant", "`256`");
    check(&error_in_body("  %2: u32 = const -1\n"), 2, 19, "a u32 constant", "`-1`");
    check(&error_in_body("  %2: s8 = const -129\n"), 2, 18, "a s8 constant", "`-129`");
    check(&error_in_body("  %2: s16 = const 0x10000\n"), 2, 19, "a s16 constant", "`0x10000`");
    check(&error_in_body("  %2: pred = const 1\n"), 2, 20, "a pred constant", "`1`");
    check(&error_in_body("  %2: u32 = const 1.5\n"), 2, 19, "a u32 constant", "`1.5`");
    check(&error_in_body("  %2: f32 = const\n"), 2, 18, "a f32 constant", "end of line");
    check(&error_in_body("  %2: u64 = const 99999999999999999999\n"), 2, 19, "a u64 constant", "`9999");
    check(&error_in_body("  %2: v2f32 = const 0\n"), 2, 3, "a scalar result type for `const`", "`v2f32`");
}

#[test]
fn ops_that_take_their_type_from_the_result() {
    check(&error_in_body("  cvt %0\n"), 2, 3, "exactly one value", "0 definitions");
    check(&error_in_body("  %2: f32, %3: f32 = load %1\n"), 2, 22, "exactly one value", "2 definitions");
    check(&error_in_body("  %2: u32 = ptrcast %1\n"), 2, 3, "a pointer result type for `ptrcast`", "`u32`");
    check(&error_in_body("  %2: ptr<global,f32> = load %1\n"), 2, 3, "a scalar or vector result", "`ptr<global,f32>`");
}

#[test]
fn structure_errors() {
    check(&error_in_body("  %2: u32 = add %0 %0\n"), 2, 20, "`,`", "`%0`");
    check(&error_in_body("  %2: u32 = add %0, %0 %0\n"), 2, 24, "end of line", "`%0`");
    check(&error_in_body("  %2 u32 = add %0, %0\n"), 2, 6, "`:`", "`u32`");
    check(&error_in_body("  yield %0\n"), 2, 3, "only `if` and `for` regions yield", "`yield`");
    check(
        &error_in_body("  %2: pred = cmp.lt %0, %0\n  if %2 {\n    yield %0\n    barrier\n  }\n"),
        5,
        5,
        "`}` after `yield`",
        "`barrier`",
    );
    check(&error_in_body("  barrier\n  .launch_bounds 32\n"), 3, 3, "directives come before", "`.launch_bounds`");
    check(&error_in_body("  .launch_bounds 32\n  .launch_bounds 64\n"), 3, 3, "one `.launch_bounds`", "a second one");
    check(&error_in_body("  .shared @t: f32[4]\n"), 2, 21, "`align`", "end of line");
    check(&error_in_body("  %2: u32 = add %0, %0 !loc \"f.rs\":1\n"), 2, 37, "`:`", "end of line");
    check(&error_in_body("  %2: u32 = add %0, %0 !loc \"\\q\":1:2\n"), 2, 29, "escapes it", "`\"\\q\"`");
    check(&error_in_body("  %2: u32 = add %0, %0 # x\n"), 2, 24, "end of line", "invalid character `#`");
    check(&error_in_body("  %2: pred = cmp.lt %0, %0\n  if %2 {\n"), 5, 1, "an instruction or `}`", "end of input");
    let e = parse_kernel("kernel @k() {\n").unwrap_err();
    check(&e, 2, 1, "an instruction or `}`", "end of input");
    let e = parse_kernel("kernel @k() {\n}\nkernel @j() {\n}\n").unwrap_err();
    check(&e, 3, 1, "end of input after the kernel", "`kernel`");
    let e = parse_kernel("").unwrap_err();
    check(&e, 1, 1, "`kernel`", "end of input");
    let e = parse_kernel("kernel k() {\n}\n").unwrap_err();
    check(&e, 1, 8, "a kernel name", "`k`");
}

#[test]
fn nesting_is_bounded() {
    let deep = |n: usize| {
        let mut body = String::from("  %2: pred = cmp.lt %0, %0\n");
        body.push_str(&"  if %2 {\n".repeat(n));
        body.push_str(&"  }\n".repeat(n));
        body
    };
    let text = format!("kernel @k(%0 n: u32) {{\n{}}}\n", deep(MAX_NESTING));
    parse_kernel(&text).unwrap_or_else(|e| panic!("{e}"));
    let e = error_in_body(&deep(MAX_NESTING + 1));
    check(&e, MAX_NESTING + 3, 3, "nested regions", "one more");
    // Far deeper than any stack allows to recurse: still an error.
    let e = error_in_body(&deep(1_000_000));
    assert!(e.expected.contains("nested regions"), "{e}");
}

#[test]
fn the_parser_does_not_judge_types() {
    // Ill-typed but well-formed text parses; the verifier rejects it.
    let text = "kernel @k(%0 n: u32) {\n  %1: f32 = add %0, %0\n}\n";
    let k = parse_kernel(text).unwrap_or_else(|e| panic!("{e}"));
    let e = verify(&k).unwrap_err();
    assert!(e.message.contains("result %1 has type f32, expected u32"), "{e}");
}

#[test]
fn truncations_and_byte_flips_of_a_real_kernel_never_panic() {
    let mut b = KernelBuilder::new("k");
    let x = b.param("x", Type::Ptr(AddrSpace::Global, ScalarType::F32));
    let n = b.param("n", Type::U32);
    let t = b.shared_array("t", ScalarType::F32, 32);
    b.launch_bounds(64, None);
    let i = b.global_thread_id_x();
    let c = b.lt(i, n);
    let z = b.const_u32(0);
    let one = b.const_u32(1);
    let acc = b.const_f32(0.0);
    let r = b.for_range(z, n, one, &[acc], |b, j, a| {
        let p = b.ptr_add(x, j);
        let v = b.load(p);
        vec![b.add(a[0], v)]
    });
    b.if_then(c, |b| {
        let s = b.shared_ptr(t);
        b.store(s, r[0]);
    });
    let text = print_kernel_with_locs(&b.finish().expect("verifies"));
    let bytes = text.as_bytes();
    for cut in 0..bytes.len() {
        if let Ok(prefix) = std::str::from_utf8(&bytes[..cut]) {
            let _ = parse_kernel(prefix);
        }
    }
    for i in 0..bytes.len() {
        for replacement in [b'%', b'{', b'}', b'\n', b'9', b'.', b'"', b'@', b'x', b' '] {
            let mut mutated = bytes.to_vec();
            mutated[i] = replacement;
            if let Ok(s) = std::str::from_utf8(&mutated) {
                if let Ok(k) = parse_kernel(s) {
                    // Whatever parses prints and re-parses to the same text.
                    let printed = print_kernel_with_locs(&k);
                    let again = parse_kernel(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
                    assert_eq!(print_kernel_with_locs(&again), printed);
                }
            }
        }
    }
}
