//! Hand-written PTX: instructions and forms the PTX backend does not emit but NVRTC or other
//! producers do (checked against values worked out from the PTX ISA), and every kind of error
//! a launch can end with.

use ruda_ir::interp::LaunchConfig;
use ruda_ir::Constant;
use ruda_ptx_emu::{run_ptx_with, Arg, EmuError, ErrorKind, Module, Options};

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// An entry `k(out)` whose body stores u32 results with `st.global.u32 [%out+4*i], ...`
/// (`%out` holds the output's global address, `%tid` the thread index).
fn module(body: &str) -> String {
    format!(
        "{HEADER}\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{{\n\
         \t.reg .pred %p<8>;\n\t.reg .b16 %rs<8>;\n\t.reg .b32 %r<32>;\n\t.reg .b64 %rd<16>;\n\t.reg .f32 %f<8>;\n\
         \t.reg .b64 %out;\n\t.reg .b32 %tid;\n\
         \tld.param.u64 %out, [k_param_0];\n\tcvta.to.global.u64 %out, %out;\n\tmov.u32 %tid, %tid.x;\n\
         {body}\n\tret;\n}}\n"
    )
}

fn opts() -> Options {
    Options { threads: 1, max_loops: 1000 }
}

/// Run `body` on `threads` threads of one block; the output's u32 words.
fn run(body: &str, threads: u32, words: usize) -> Result<Vec<u32>, EmuError> {
    let ptx = module(body);
    let m = Module::parse(&ptx)?;
    let mut out = vec![0u8; words * 4];
    m.launch("k", &LaunchConfig::linear(1, threads), &mut [Arg::Buffer(&mut out)], &opts())?;
    Ok(out.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

fn run_ok(body: &str, threads: u32, words: usize) -> Vec<u32> {
    run(body, threads, words).unwrap_or_else(|e| panic!("{e}\n{}", module(body)))
}

/// Store `%r<i>` for i in `regs` to words 0, 1, ... (one thread).
fn stores(regs: &[u32]) -> String {
    regs.iter().enumerate().map(|(i, r)| format!("\tst.global.u32 [%out+{}], %r{r};\n", 4 * i)).collect()
}

#[test]
fn bit_manipulation() {
    let body = "\
        mov.u32 %r1, 0x44332211;\n mov.u32 %r2, 0x88776655;\n\
        prmt.b32 %r3, %r1, %r2, 0x5140;\n prmt.b32 %r4, %r1, %r2, 0x000f;\n prmt.b32.rc8 %r5, %r1, %r2, 2;\n\
        prmt.b32.f4e %r6, %r1, %r2, 1;\n prmt.b32.ecr %r7, %r1, %r2, 2;\n\
        bfe.u32 %r8, 0x12345678, 8, 8;\n bfe.s32 %r9, 0x0000f000, 12, 4;\n bfi.b32 %r10, 0xab, 0x12345678, 8, 8;\n\
        lop3.b32 %r11, %r1, %r2, 0x0f0f0f0f, 0x96;\n lop3.b32 %r12, 0xff00ff00, 0xf0f0f0f0, 0xcccccccc, 0xe8;\n\
        shf.l.wrap.b32 %r13, 0x80000001, 1, 36;\n shf.r.clamp.b32 %r14, 0x80000001, 1, 40;\n\
        bfind.u32 %r15, 0x10000;\n bfind.shiftamt.u32 %r16, 0x10000;\n bfind.s32 %r17, -16;\n\
        brev.b32 %r18, 1;\n clz.b32 %r19, 1;\n popc.b32 %r20, 0xf0f0;\n cnot.b32 %r21, 0;\n\
        mul24.lo.u32 %r22, 0x01000003, 2;\n mul24.hi.u32 %r23, 0x00ffffff, 0x00ffffff;\n\
        add.cc.u32 %r24, 0xffffffff, 1;\n addc.u32 %r25, 7, 0;\n sub.cc.u32 %r26, 0, 1;\n subc.u32 %r27, 5, 0;\n";
    let mut regs: Vec<u32> = (3..=27).collect();
    regs.retain(|_| true);
    let got = run_ok(&format!("{body}{}", stores(&regs)), 1, regs.len());
    let want = [
        0x6622_5511,
        0x1111_11ff,
        0x3333_3333,
        0x5544_3322,
        0x3333_2211,
        0x56,
        0xffff_ffff,
        0x1234_ab78,
        0x4433_2211 ^ 0x8877_6655 ^ 0x0f0f_0f0f,
        0xf000_f000 | 0xcc00_cc00 | 0xc0c0_c0c0,
        0x18,
        1,
        16,
        15,
        3,
        0x8000_0000,
        31,
        8,
        1,
        6,
        0xffff_fe00,
        0,
        8,
        0xffff_ffff,
        4,
    ];
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(*g, w, "%r{}: got {g:#x}, want {w:#x}", regs[i]);
    }
}

#[test]
fn comparisons_selects_and_float_forms() {
    let body = "\
        mov.f32 %f1, 0fBF800000;\n mov.f32 %f2, 0f40000000;\n\
        set.lt.u32.f32 %r1, %f1, %f2;\n set.gt.f32.s32 %r2, 3, 2;\n slct.u32.s32 %r3, 10, 20, -1;\n\
        copysign.f32 %f3, %f1, %f2;\n mov.b32 %r4, %f3;\n\
        testp.subnormal.f32 %p1, 0f00000001;\n selp.u32 %r5, 1, 0, %p1;\n\
        testp.notanumber.f32 %p2, 0f7FC00000;\n selp.u32 %r6, 1, 0, %p2;\n\
        min.NaN.f32 %f4, 0f7FC00001, %f2;\n mov.b32 %r7, %f4;\n min.f32 %f5, 0f7FC00001, %f2;\n mov.b32 %r8, %f5;\n\
        cvt.rn.f16x2.f32 %r9, 0f3F800000, 0f40000000;\n cvt.rzi.s32.f64 %r10, 0dFFF8000000000000;\n\
        setp.lt.and.s32 %p3|%p4, 1, 2, %p1;\n selp.u32 %r11, 1, 0, %p3;\n selp.u32 %r12, 1, 0, %p4;\n\
        mov.b64 %rd1, {%r9, %r10};\n mov.b64 {%r13, %r14}, %rd1;\n mov.b32 {%rs1, %rs2}, %r9;\n cvt.u32.u16 %r15, %rs2;\n\
        add.sat.s32 %r16, 0x7fffffff, 1;\n mul.hi.s32 %r17, -1, 1;\n mad.wide.u32 %rd2, 0xffffffff, 2, 3;\n cvt.u32.u64 %r18, %rd2;\n\
        ex2.approx.ftz.f32 %f6, 0f3F800000;\n mov.b32 %r19, %f6;\n div.full.f32 %f7, %f2, 0f40400000;\n mov.b32 %r20, %f7;\n";
    let regs: Vec<u32> = (1..=20).collect();
    let got = run_ok(&format!("{body}{}", stores(&regs)), 1, regs.len());
    let want = [
        0xffff_ffff,
        0x3f80_0000,
        20,
        0xc000_0000,
        1,
        1,
        0x7fff_ffff,
        0x4000_0000,
        0x3c00_4000,
        0x8000_0000,
        1,
        0,
        0x3c00_4000,
        0x8000_0000,
        0x3c00,
        0x7fff_ffff,
        0xffff_ffff,
        1,
        0x4000_0000,
        (2.0f32 / 3.0).to_bits(),
    ];
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(*g, w, "%r{}: got {g:#x}, want {w:#x}", regs[i]);
    }
}

#[test]
fn memory_spaces_and_generic_addresses() {
    // Local memory through a depot, generic local and shared addresses, cp.async, isspacep,
    // atomics inc/dec and a half add, and a vector store with a sink in a vector load.
    let ptx = format!(
        "{HEADER}\n.shared .align 8 .b8 tile[64];\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{{\n\
         \t.local .align 8 .b8 __local_depot0[16];\n\t.reg .b64 %SP;\n\t.reg .b64 %SPL;\n\
         \t.reg .pred %p<4>;\n\t.reg .b16 %rs<4>;\n\t.reg .b32 %r<16>;\n\t.reg .b64 %rd<16>;\n\
         \tmov.u64 %SPL, __local_depot0;\n\tcvta.local.u64 %SP, %SPL;\n\
         \tld.param.u64 %rd1, [k_param_0];\n\tcvta.to.global.u64 %rd1, %rd1;\n\
         \tst.local.u32 [%SPL+4], 41;\n\tld.u32 %r1, [%SP+4];\n\tadd.u32 %r1, %r1, 1;\n\
         \tmov.u64 %rd2, tile;\n\tcvta.shared.u64 %rd3, %rd2;\n\tst.u32 [%rd3+8], %r1;\n\tld.shared.u32 %r2, [tile+8];\n\
         \tisspacep.shared %p1, %rd3;\n\tselp.u32 %r3, 1, 0, %p1;\n\tisspacep.global %p2, %rd3;\n\tselp.u32 %r4, 1, 0, %p2;\n\
         \tcp.async.ca.shared.global [tile+16], [%rd1+64], 8, 4;\n\tcp.async.commit_group;\n\tcp.async.wait_group 0;\n\
         \tld.shared.v2.u32 {{%r5, _}}, [tile+16];\n\tld.shared.u32 %r6, [tile+20];\n\
         \tatom.global.inc.u32 %r7, [%rd1+72], 5;\n\tatom.global.dec.u32 %r8, [%rd1+76], 5;\n\
         \tmov.b16 %rs1, 0x3c00;\n\tatom.global.add.noftz.f16 %rs2, [%rd1+80], %rs1;\n\tcvt.u32.u16 %r9, %rs2;\n\
         \tst.global.v4.u32 [%rd1], {{%r1, %r2, %r3, %r4}};\n\tst.global.v4.u32 [%rd1+16], {{%r5, %r6, %r7, %r8}};\n\
         \tst.global.u32 [%rd1+32], %r9;\n\tret;\n}}\n"
    );
    let m = Module::parse(&ptx).unwrap_or_else(|e| panic!("{e}"));
    let mut out = vec![0u8; 96];
    out[64..68].copy_from_slice(&0xdead_beefu32.to_le_bytes());
    out[68..72].copy_from_slice(&0x1234_5678u32.to_le_bytes());
    out[72..76].copy_from_slice(&5u32.to_le_bytes());
    out[76..80].copy_from_slice(&0u32.to_le_bytes());
    out[80..82].copy_from_slice(&0x4000u16.to_le_bytes());
    m.launch("k", &LaunchConfig::linear(1, 1), &mut [Arg::Buffer(&mut out)], &opts()).unwrap_or_else(|e| panic!("{e}"));
    let w = |i: usize| u32::from_le_bytes([out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]]);
    let got: Vec<u32> = (0..9).map(w).collect();
    // inc: 5 >= 5 wraps to 0; dec: 0 becomes 5; the f16 add returns the old 2.0.
    assert_eq!(got, vec![42, 42, 1, 0, 0xdead_beef, 0, 5, 0, 0x4000]);
    assert_eq!(w(18), 0, "inc stored");
    assert_eq!(w(19), 5, "dec stored");
    assert_eq!(u16::from_le_bytes([out[80], out[81]]), 0x4200, "2.0 + 1.0 = 3.0 in f16");
}

#[test]
fn warp_operations_with_member_masks_and_predicates() {
    let body = "\
        shfl.sync.up.b32 %r1|%p1, %tid, 1, 0, 0xffffffff;\n selp.u32 %r2, 1, 0, %p1;\n\
        redux.sync.add.u32 %r3, %tid, 0xffffffff;\n redux.sync.max.s32 %r4, %tid, 0xffffffff;\n\
        setp.lt.u32 %p2, %tid, 16;\n vote.sync.ballot.b32 %r5, %p2, 0xffffffff;\n vote.sync.uni.pred %p3, %p2, 0xffffffff;\n\
        selp.u32 %r6, 1, 0, %p3;\n\
        @%p2 bra LOW;\n shfl.sync.idx.b32 %r7, %tid, 16, 0x1f, 0xffff0000;\n bra.uni DONE;\n\
        LOW:\n shfl.sync.idx.b32 %r7, %tid, 3, 0x1f, 0x0000ffff;\n\
        DONE:\n bar.warp.sync 0xffffffff;\n\
        mul.lo.u32 %r10, %tid, 28;\n cvt.u64.u32 %rd1, %r10;\n add.u64 %rd1, %out, %rd1;\n\
        st.global.u32 [%rd1], %r1;\n st.global.u32 [%rd1+4], %r2;\n st.global.u32 [%rd1+8], %r3;\n st.global.u32 [%rd1+12], %r4;\n\
        st.global.u32 [%rd1+16], %r5;\n st.global.u32 [%rd1+20], %r6;\n st.global.u32 [%rd1+24], %r7;\n";
    let got = run_ok(body, 32, 32 * 7);
    for lane in 0..32u32 {
        let r = &got[lane as usize * 7..][..7];
        let up = if lane == 0 { 0 } else { lane - 1 };
        let idx = if lane < 16 { 3 } else { 16 };
        assert_eq!(r, [up, (lane > 0) as u32, 496, 31, 0xffff, 0, idx], "lane {lane}");
    }
}

#[test]
fn scopes_labels_pragmas_and_named_barriers() {
    let body = "\
        mov.u32 %r1, 5;\n { .reg .b32 %r1;\n mov.u32 %r1, 9;\n $L: \n add.u32 %r2, %r1, 0;\n }\n\
        .pragma \"nounroll\";\n\
        mov.u32 %r3, 0;\n $L:\n add.u32 %r3, %r3, 1;\n setp.lt.u32 %p1, %r3, 4;\n @%p1 bra.uni $L;\n\
        bar.arrive 1, 64;\n bar.sync 1, 64;\n barrier.sync.aligned 0;\n\
        mul.lo.u32 %r10, %tid, 12;\n cvt.u64.u32 %rd1, %r10;\n add.u64 %rd1, %out, %rd1;\n\
        st.global.u32 [%rd1], %r1;\n st.global.u32 [%rd1+4], %r2;\n st.global.u32 [%rd1+8], %r3;\n";
    let got = run_ok(body, 64, 64 * 3);
    assert_eq!(&got[..3], [5, 9, 4]);
    assert_eq!(&got[63 * 3..], [5, 9, 4]);
}

fn expect_runtime(body: &str, threads: u32, kind: ErrorKind, parts: &[&str]) {
    match run(body, threads, 64) {
        Err(e @ EmuError::Runtime { kind: k, .. }) if k == kind => {
            let msg = e.to_string();
            for p in parts {
                assert!(msg.contains(p), "{msg:?} lacks {p:?}");
            }
        }
        other => panic!("expected a {kind:?} error, got {other:?}"),
    }
}

#[test]
fn runtime_errors_name_the_line_block_and_thread() {
    // Threads 16.. exit before the barrier.
    expect_runtime(
        "setp.ge.u32 %p1, %tid, 16;\n@%p1 ret;\nbar.sync 0;\n",
        32,
        ErrorKind::Deadlock,
        &[
            "deadlock: barrier 0 waits for 32 threads, 16 of the block's 32 arrived",
            "thread [16, 0, 0] has exited (line 20)",
            "at PTX line 21 (`bar.sync 0;`)",
        ],
    );
    // A full member mask in a block of 16 threads.
    expect_runtime(
        "shfl.sync.bfly.b32 %r1, %tid, 1, 0x1f, 0xffffffff;\n",
        16,
        ErrorKind::Deadlock,
        &["names lane 16, which does not exist"],
    );
    // Half a warp at a shuffle, the other half at a barrier.
    expect_runtime(
        "setp.lt.u32 %p1, %tid, 16;\n@%p1 bra S;\nbar.sync 0;\nbra.uni E;\nS:\nshfl.sync.bfly.b32 %r1, %tid, 1, 0x1f, 0xffffffff;\nE:\n",
        32,
        ErrorKind::Deadlock,
        &["deadlock"],
    );
    expect_runtime(
        "st.global.u32 [%out+4096], %tid;\n",
        4,
        ErrorKind::Memory,
        &[
            "out-of-bounds global access: 4 bytes at offset 4096 of buffer 0 (256 bytes)",
            "line 19",
            "`st.global.u32 [%out+4096], %tid;`",
            "block [0, 0, 0] thread [0, 0, 0]",
        ],
    );
    expect_runtime("ld.global.u32 %r1, [%out+2];\n", 1, ErrorKind::Memory, &["misaligned global load of 4 bytes"]);
    expect_runtime("ld.global.u32 %r1, [%tid];\n", 1, ErrorKind::Memory, &["in no buffer"]);
    expect_runtime("div.u32 %r1, 1, %tid;\n", 1, ErrorKind::Arithmetic, &["integer division by zero"]);
    expect_runtime("setp.eq.u32 %p1, %tid, 3;\n@%p1 trap;\n", 8, ErrorKind::Trap, &["trap", "thread [3, 0, 0]"]);
    expect_runtime("L:\nbra.uni L;\n", 1, ErrorKind::NonTermination, &["more than 1000 backward branches"]);
}

#[test]
fn unsupported_and_malformed_text_name_the_line() {
    for (body, what) in [
        ("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2}, {%r5}, {%f1,%f2,%f3,%f4};", "instruction `mma.sync.aligned.m16n8k8"),
        ("add.rz.f32 %f1, %f2, %f3;", "rounding .rz"),
        ("ld.global.b128 %rd1, [%out];", "not modelled"),
        ("ld.global.L2::cache_hint.evict_unchanged.u32 %r1, [%out], %rd1;", "modifier .evict_unchanged"),
        ("mov.u32 %r1, %clock;", "special register `%clock`"),
        ("add.f16x2 %r1, %r2, %r3;", "packed and half"),
    ] {
        match Module::parse(&module(body)) {
            Err(EmuError::Unsupported { line, message, text }) => {
                assert_eq!(line, 19, "{body}");
                assert!(message.contains(what), "{message:?} lacks {what:?}");
                assert_eq!(text, body);
            }
            other => panic!("{body}: expected unsupported, got {other:?}"),
        }
    }
    // Declarations too large to emulate are refused, not allocated.
    for (decl, what) in [
        (".local .align 4 .b8 big[1048576];", "bytes of local memory per thread"),
        (".reg .b32 %many<2000000>;", "registers"),
    ] {
        match Module::parse(&module(decl)) {
            Err(EmuError::Unsupported { message, .. }) => assert!(message.contains(what), "{message:?}"),
            other => panic!("{decl}: expected unsupported, got {other:?}"),
        }
    }
    match Module::parse(&module("add.u32 %r1, %r2;")) {
        Err(EmuError::Parse { line: 19, message }) => assert!(message.contains("takes 3 operands"), "{message}"),
        other => panic!("{other:?}"),
    }
    match Module::parse(&module("add.u32 %r1, %nope, 1;")) {
        Err(EmuError::Parse { line: 19, message }) => {
            assert!(message.contains("undeclared register `%nope`"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    match Module::parse(&module("bra NOWHERE;")) {
        Err(EmuError::Parse { message, .. }) => assert!(message.contains("undefined label `NOWHERE`"), "{message}"),
        other => panic!("{other:?}"),
    }
    let e = Module::parse(&module("add.u32 %r1, %r2, 1 # 2;")).unwrap_err().to_string();
    assert!(e.starts_with("PTX line 19: unexpected text \"#"), "{e}");
}

#[test]
fn launches_that_do_not_fit_are_rejected_before_running() {
    let ptx = format!(
        "{HEADER}\n.visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .f32 k_param_1\n)\n.maxntid 64, 1, 1\n{{\n\tret;\n}}\n\
         .visible .entry r()\n.reqntid 32\n{{\n\tret;\n}}\n"
    );
    let m = Module::parse(&ptx).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.entries().collect::<Vec<_>>(), ["k", "r"]);
    assert_eq!(m.params("k").expect("k").iter().map(|p| p.ty.as_str()).collect::<Vec<_>>(), ["u64", "f32"]);
    let mut buf = vec![0u8; 4];
    let one = LaunchConfig::linear(1, 32);
    let cases: Vec<(&str, LaunchConfig, Vec<Arg<'_>>, &str)> = vec![
        ("k", one, vec![], "0 arguments given, the entry has 2 parameters"),
        (
            "k",
            one,
            vec![Arg::Scalar(Constant::u32(1)), Arg::Scalar(Constant::f32(1.0))],
            "a buffer needs|is .u64 (8 bytes), the argument is u32",
        ),
        (
            "k",
            one,
            vec![Arg::Buffer(&mut buf), Arg::Scalar(Constant::u32(1))],
            "parameter `k_param_1` is .f32, the argument is u32",
        ),
        ("k", LaunchConfig::linear(1, 128), vec![], "more than the entry's .maxntid [64, 1, 1]"),
        ("r", LaunchConfig::linear(1, 64), vec![], "differs from the entry's .reqntid [32, 1, 1]"),
        ("k", LaunchConfig::linear(0, 32), vec![], "must have no zero dimension"),
        ("x", one, vec![], "no such entry; the module has [\"k\", \"r\"]"),
    ];
    for (entry, cfg, mut args, want) in cases {
        match m.launch(entry, &cfg, &mut args, &opts()) {
            Err(e @ EmuError::Launch { .. }) => {
                let msg = e.to_string();
                assert!(want.split('|').any(|w| msg.contains(w)), "{msg:?} lacks {want:?}");
            }
            other => panic!("{entry}: expected a launch error, got {other:?}"),
        }
    }
    // Scalars as raw bytes, and run_ptx with the interpreter's argument types.
    let mut out = vec![0u8; 4];
    let bytes = 2.5f32.to_le_bytes();
    let mut args = [Arg::Buffer(&mut out), Arg::Bytes(&bytes)];
    m.launch("k", &one, &mut args, &opts()).unwrap_or_else(|e| panic!("{e}"));
    let mut out = vec![0u8; 4];
    let mut kargs =
        [ruda_ir::interp::KernelArg::Buffer(&mut out), ruda_ir::interp::KernelArg::Scalar(Constant::f32(1.0))];
    run_ptx_with(&ptx, "k", &one, &mut kargs, &opts()).unwrap_or_else(|e| panic!("{e}"));
}

/// `__byte_perm(x, y, s)` as the CUDA documentation defines it.
fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
    let bytes = ((y as u64) << 32) | x as u64;
    (0..4).fold(0, |acc, i| acc | ((((bytes >> (((s >> (4 * i)) & 7) * 8)) & 0xff) as u32) << (8 * i)))
}

/// NVRTC's own PTX of idiomatic CUDA (tests/fixtures/nvrtc_mix.cu), against a Rust
/// transcription of the C++.
#[test]
fn nvrtc_output_of_idiomatic_cuda_runs() {
    let ptx = include_str!("fixtures/nvrtc_mix.sm_80.ptx");
    let (blocks, threads, n, m) = (2u32, 64u32, 100i32, -123_456_789_012i64);
    let x: Vec<u16> = (0..97u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 16) as u16).collect();
    let mut xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0u8; 1001 * 4];
    let module = Module::parse(ptx).unwrap_or_else(|e| panic!("{e}"));
    let mut args =
        [Arg::Buffer(&mut xb), Arg::Buffer(&mut out), Arg::Scalar(Constant::i32(n)), Arg::Scalar(Constant::i64(m))];
    module.launch("mix", &LaunchConfig::linear(blocks, threads), &mut args, &opts()).unwrap_or_else(|e| panic!("{e}"));
    let got: Vec<u32> = out.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();

    let mut want = vec![0u32; 1001];
    for block in 0..blocks {
        let gid = |t: u32| (block * threads + t) as i32;
        let loc = |i: i32| -> [u32; 8] { std::array::from_fn(|j| x[((i + j as i32 * n) % 97) as usize] as u32) };
        let s: Vec<u32> = (0..threads).map(|t| loc(gid(t))[(gid(t) & 7) as usize].wrapping_mul(3)).collect();
        let v0: Vec<u32> = (0..threads).map(|t| s[((t + 1) % 64) as usize]).collect();
        let v: Vec<u32> = (0..threads).map(|t| v0[t as usize].wrapping_add(v0[(t ^ 3) as usize])).collect();
        for t in 0..threads {
            let i = gid(t);
            let warp = (t / 32 * 32) as usize;
            let b = (0..32).fold(0u32, |acc, l| acc | ((v[warp + l] & 1) << l));
            let q = (i >> 3) / (n | 1);
            let r = byte_perm(b, q as u32, (0x3210 + n) as u32);
            let mm = m >> (n & 63);
            let vt = v[t as usize];
            let c = (vt.leading_zeros() + b.count_ones()).wrapping_add(r.reverse_bits());
            let f = f32::from_bits(0x3f80_0000 | (vt & 0x7f_ffff));
            let tt = f.sqrt() + f / 3.0;
            if i < n {
                want[i as usize] = vt ^ r ^ (mm as u32) ^ c ^ tt.to_bits();
            }
        }
    }
    want[1000] = blocks * threads;
    assert_eq!(got, want);
}
