//! `cp.async` on the interpreter: a double-buffered pipeline (the coverage kernel) computes
//! the right sums, zero-fill and group accounting follow the ISA, and the bug class the model
//! exists for is caught: reading or writing a pending destination, a missing or too-loose
//! wait, a barrier mistaken for a wait; plus misaligned and out-of-bounds copies, the
//! verifier's rules and the text form.

use ruda_ir::coverage::{cp_async_expected, cp_async_kernel, global, CP_ASYNC_TILE};
use ruda_ir::interp::{run, InterpError, KernelArg, LaunchConfig};
use ruda_ir::{parse_kernel, print_kernel, Kernel, KernelBuilder, ScalarType::*};

fn words(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn unwords(b: &[u8]) -> Vec<u32> {
    b.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn launch(k: &Kernel, threads: u32, x: &[u32], out_words: usize) -> Result<Vec<u32>, InterpError> {
    let (mut xb, mut ob) = (words(x), vec![0u8; 4 * out_words]);
    run(k, &LaunchConfig::linear(1, threads), &mut [KernelArg::Buffer(&mut xb), KernelArg::Buffer(&mut ob)])?;
    Ok(unwords(&ob))
}

fn input(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| i.wrapping_mul(0x9e37_79b9) ^ (i << 3)).collect()
}

#[test]
fn double_buffered_pipeline_sums_every_tile() {
    for tiles in [1, 2, 5] {
        let k = cp_async_kernel(tiles).unwrap();
        let x = input((tiles * CP_ASYNC_TILE) as usize);
        let got = launch(&k, 32, &x, 128).unwrap();
        assert_eq!(got, cp_async_expected(&x, tiles), "{tiles} tiles");
    }
}

/// One thread per word: copy `x[tid]` to `tile[tid]` with `cp.async.4`, then `body` decides
/// how (and whether) to wait before thread `tid` reads `tile[(tid + 1) % n]` into `out`.
fn neighbour_kernel(body: impl FnOnce(&mut KernelBuilder)) -> Kernel {
    let mut b = KernelBuilder::new("neighbour");
    let x = b.param("x", global(U32));
    let out = b.param("out", global(U32));
    let tile = b.shared_array("tile", U32, 32);
    let s = b.shared_ptr(tile);
    let tid = b.thread_id_x();
    let src = b.ptr_add(x, tid);
    let dst = b.ptr_add(s, tid);
    b.cp_async(dst, src, 4);
    body(&mut b);
    let (one, mask) = (b.const_u32(1), b.const_u32(31));
    let j = b.add(tid, one);
    let j = b.and(j, mask);
    let p = b.ptr_add(s, j);
    let v = b.load(p);
    let q = b.ptr_add(out, tid);
    b.store(q, v);
    b.cp_async_wait_all();
    b.finish().unwrap()
}

#[test]
fn waiting_then_a_barrier_publishes_the_copies() {
    let k = neighbour_kernel(|b| {
        b.cp_async_commit();
        b.cp_async_wait(0);
        b.barrier();
    });
    let x = input(32);
    let want: Vec<u32> = (0..32).map(|t| x[(t + 1) % 32]).collect();
    assert_eq!(launch(&k, 32, &x, 32).unwrap(), want);
}

fn fails_with(k: &Kernel, threads: u32, parts: &[&str]) -> InterpError {
    let e = launch(k, threads, &input(64), 64).expect_err("the launch must fail");
    let text = e.to_string();
    for p in parts {
        assert!(text.contains(p), "`{p}` not in: {text}");
    }
    e
}

/// Instructions a case inserts between the copy and the read.
type Between = Box<dyn Fn(&mut KernelBuilder)>;

#[test]
fn reading_a_pending_destination_is_an_error() {
    // No wait at all; a barrier alone; a wait for the wrong group count; and no commit (a
    // wait covers committed groups only).
    let cases: [(&str, Between); 4] = [
        ("no wait", Box::new(|_b: &mut KernelBuilder| {})),
        (
            "barrier only",
            Box::new(|b: &mut KernelBuilder| {
                b.cp_async_commit();
                b.barrier();
            }),
        ),
        (
            "wait_group 1 with one group",
            Box::new(|b: &mut KernelBuilder| {
                b.cp_async_commit();
                b.cp_async_wait(1);
                b.barrier();
            }),
        ),
        (
            "uncommitted",
            Box::new(|b: &mut KernelBuilder| {
                b.cp_async_wait(0);
                b.barrier();
            }),
        ),
    ];
    for (what, body) in cases {
        let k = neighbour_kernel(body);
        let e = fails_with(&k, 32, &["`load`", "still pending", "`cp.async.4` at ", "tests/cp_async.rs"]);
        assert_eq!(e.op, "load", "{what}");
        assert!(e.loc.is_some(), "{what}");
    }
}

#[test]
fn writing_a_pending_destination_is_an_error() {
    let mut b = KernelBuilder::new("overwrite");
    let x = b.param("x", global(U32));
    let _out = b.param("out", global(U32));
    let tile = b.shared_array("tile", U32, 32);
    let s = b.shared_ptr(tile);
    let tid = b.thread_id_x();
    let src = b.ptr_add(x, tid);
    let dst = b.ptr_add(s, tid);
    b.cp_async(dst, src, 4);
    b.store(dst, tid);
    b.cp_async_wait_all();
    let k = b.finish().unwrap();
    fails_with(&k, 1, &["`store`", "still pending", "thread [0, 0, 0]"]);

    // A second copy to the same bytes before the first completed.
    let mut b = KernelBuilder::new("twice");
    let x = b.param("x", global(U32));
    let _out = b.param("out", global(U32));
    let tile = b.shared_array("tile", U32, 4);
    let s = b.shared_ptr(tile);
    b.cp_async(s, x, 16);
    b.cp_async_commit();
    b.cp_async(s, x, 8);
    b.cp_async_wait_all();
    let k = b.finish().unwrap();
    fails_with(&k, 1, &["`cp.async.8`", "still pending", "`cp.async.16`"]);
}

#[test]
fn wait_group_keeps_the_newest_groups_pending() {
    // Thread 0 copies word 0 (group 1) and word 1 (group 2); `wait_group 1` lands only word 0.
    let build = |read_second: bool| {
        let mut b = KernelBuilder::new("groups");
        let x = b.param("x", global(U32));
        let out = b.param("out", global(U32));
        let tile = b.shared_array("tile", U32, 2);
        let s = b.shared_ptr(tile);
        let one = b.const_u32(1);
        let (s1, x1) = (b.ptr_add(s, one), b.ptr_add(x, one));
        b.cp_async(s, x, 4);
        b.cp_async_commit();
        b.cp_async(s1, x1, 4);
        b.cp_async_commit();
        b.cp_async_wait(1);
        let v = b.load(if read_second { s1 } else { s });
        b.store(out, v);
        b.cp_async_wait(0);
        b.finish().unwrap()
    };
    let x = input(2);
    assert_eq!(launch(&build(false), 1, &x, 1).unwrap(), vec![x[0]]);
    fails_with(&build(true), 1, &["`load`", "still pending"]);
}

#[test]
fn bad_addresses_and_source_sizes_are_errors() {
    let build = |dst_word: u32, src_word: u32, size: u8, src_size: Option<u32>| {
        let mut b = KernelBuilder::new("bad");
        let x = b.param("x", global(U32));
        let _out = b.param("out", global(U32));
        let tile = b.shared_array("tile", U32, 8);
        let s = b.shared_ptr(tile);
        // Through a runtime value, so the verifier cannot see the offset.
        let tid = b.thread_id_x();
        let dw = b.const_u32(dst_word);
        let dw = b.add(dw, tid);
        let dst = b.ptr_add(s, dw);
        let sw = b.const_u32(src_word);
        let src = b.ptr_add(x, sw);
        match src_size {
            Some(n) => {
                let n = b.const_u32(n);
                let n = b.add(n, tid);
                b.cp_async_zfill(dst, src, size, n);
            }
            None => b.cp_async(dst, src, size),
        }
        b.cp_async_wait_all();
        b.finish().unwrap()
    };
    fails_with(&build(1, 0, 8, None), 1, &["misaligned", "shared cp.async destination"]);
    fails_with(&build(0, 1, 16, None), 1, &["misaligned", "cp.async source"]);
    fails_with(&build(6, 0, 16, None), 1, &["out of bounds", "shared"]);
    fails_with(&build(0, 64, 16, None), 1, &["out of bounds", "cp.async source"]);
    fails_with(&build(0, 0, 8, Some(9)), 1, &["source size 9 exceeds the copy size 8"]);
    // Only `src_size` bytes of the source must exist (x has 62 words here: the last 16-byte
    // window is half outside); none at all for 0.
    let e = launch(&build(0, 60, 16, None), 1, &input(62), 64).unwrap_err();
    assert!(e.to_string().contains("out of bounds"), "{e}");
    launch(&build(0, 60, 16, Some(8)), 1, &input(62), 64).unwrap();
    launch(&build(0, 1 << 20, 16, Some(0)), 1, &input(62), 64).unwrap();
}

#[test]
fn the_verifier_checks_spaces_sizes_and_static_alignment() {
    let check = |f: &dyn Fn(&mut KernelBuilder, [ruda_ir::Value; 3]), want: &str| {
        let mut b = KernelBuilder::new("v");
        let g = b.param("g", global(U32));
        let tile = b.shared_array("tile", U32, 16);
        let s = b.shared_ptr(tile);
        let n = b.const_u32(4);
        f(&mut b, [g, s, n]);
        match b.finish() {
            Ok(_) => assert!(want.is_empty(), "accepted; expected `{want}`"),
            Err(e) => assert!(!want.is_empty() && e.to_string().contains(want), "{e}\nexpected `{want}`"),
        }
    };
    check(&|b, [g, s, _]| b.cp_async(s, g, 16), "");
    check(&|b, [g, s, n]| b.cp_async_zfill(s, g, 8, n), "");
    check(&|b, [g, s, _]| b.cp_async(s, g, 12), "copies 4, 8 or 16 bytes, not 12");
    check(&|b, [g, _, _]| b.cp_async(g, g, 4), "destination %0 must be a shared pointer");
    check(&|b, [_, s, _]| b.cp_async(s, s, 4), "must be a global pointer");
    check(&|b, [g, s, n]| b.cp_async_zfill(s, g, 4, n), "");
    check(
        &|b, [g, s, _]| {
            let big = b.const_u32(5);
            b.cp_async_zfill(s, g, 4, big)
        },
        "source size 5 exceeds the copy size 4",
    );
    check(
        &|b, [g, s, _]| {
            let one = b.const_u32(1);
            let p = b.ptr_add(s, one);
            b.cp_async(p, g, 8)
        },
        "at shared offset 4, not aligned to the copy size 8",
    );
    check(
        &|b, [g, s, _]| {
            let two = b.const_u32(2);
            let p = b.ptr_add(s, two);
            b.cp_async(p, g, 8)
        },
        "",
    );
}

#[test]
fn text_form_round_trips() {
    let k = cp_async_kernel(2).unwrap();
    let text = print_kernel(&k);
    for want in [
        "cp.async.16 %",
        "cp.async.8 %",
        "cp.async.4 %",
        "cp.async.commit_group\n",
        "cp.async.wait_group 1\n",
        "cp.async.wait_group 0\n",
    ] {
        assert!(text.contains(want), "no `{want}` in\n{text}");
    }
    let back = parse_kernel(&text).unwrap();
    assert_eq!(print_kernel(&back), text);
    let x = input((2 * CP_ASYNC_TILE) as usize);
    assert_eq!(launch(&back, 32, &x, 128).unwrap(), cp_async_expected(&x, 2));
}
