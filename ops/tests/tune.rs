//! GEMV autotuning on the CPU with injected timings.

use crate::common::{fingerprint, temp_dir};
use ruda_ops::api;
use ruda_ops::tune::{gemv_key, parse_shapes, tune_gemv_with, tuned_gemv_splits, TuneShape};
use ruda_runtime::{AutotuneMode, Autotuner, DType, Device, Tensor};

fn operands(dev: &Device, m: usize, n: usize, k: usize) -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..m * k).map(|i| ((i % 7) as f32 - 3.0) * 0.25).collect();
    let w: Vec<f32> = (0..n * k).map(|i| ((i % 5) as f32 - 2.0) * 0.5).collect();
    (Tensor::from_slice(dev, &x, &[m, k]).unwrap(), Tensor::from_slice(dev, &w, &[n, k]).unwrap())
}

#[test]
fn gemv_tunes_with_injected_timings_and_caches_the_choice() {
    let dev = Device::cpu();
    let (x, w) = operands(&dev, 1, 8, 4096);
    let dir = temp_dir("tune-inject");
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    let mut measured = Vec::new();
    let time = |s: usize| match s {
        4 => Ok(0.010),
        16 => Err("launch failed".to_string()),
        s => Ok(0.05 / s as f64 + 0.01),
    };
    let choice = tune_gemv_with(&tuner, &dev, &x, &w, |s| {
        measured.push(s);
        time(s)
    })
    .unwrap();
    // The heuristic (1 on the CPU device) comes first, then the others.
    assert_eq!(measured, vec![1, 2, 4, 8, 16]);
    assert_eq!(choice.value, 4);
    let again = tune_gemv_with(&tuner, &dev, &x, &w, |_| panic!("measured a cached key")).unwrap();
    assert!(again.choice.cached);
    assert_eq!(again.value, 4);
    // A nearby shape shares the bucket.
    let (x2, w2) = operands(&dev, 1, 7, 4000);
    assert_eq!(gemv_key(&x2, &w2).unwrap().shape_bucket, vec![1, 8, 4096]);
    let entry = tuner.snapshot().entries.remove("gemv f32 1x8x4096 align16").expect("entry");
    assert_eq!(entry.results[4].error.as_deref(), Some("launch failed"));
    // Off: the heuristic, unmeasured.
    let off = Autotuner::open(&dir, fingerprint(), AutotuneMode::Off);
    assert_eq!(tune_gemv_with(&off, &dev, &x, &w, |_| panic!("measured")).unwrap().value, 1);
}

#[test]
fn gemv_keys_carry_the_alignment_class() {
    let dev = Device::cpu();
    let (x, w) = operands(&dev, 2, 4, 64);
    assert_eq!(gemv_key(&x, &w).unwrap().to_string(), "gemv f32 2x4x64 align16");
    // One float in: 4-byte aligned first element.
    let x_off = Tensor::from_slice(&dev, &vec![1.0f32; 2 * 64 + 1], &[2 * 64 + 1])
        .unwrap()
        .narrow(0, 1, 128)
        .unwrap()
        .reshape(&[2, 64])
        .unwrap();
    assert_eq!(gemv_key(&x_off, &w).unwrap().alignment, 4);
    // An odd K of halves: 2-byte row strides.
    let xh = Tensor::zeros(&dev, DType::BF16, &[1, 17]).unwrap();
    let wh = Tensor::zeros(&dev, DType::BF16, &[3, 17]).unwrap();
    assert_eq!(gemv_key(&xh, &wh).unwrap().to_string(), "gemv bf16 1x4x32 align2");
    assert!(gemv_key(&Tensor::zeros(&dev, DType::F32, &[4]).unwrap(), &w).is_none());
}

#[test]
fn on_the_cpu_gemv_is_untuned_and_unchanged() {
    let dev = Device::cpu();
    let (x, w) = operands(&dev, 2, 5, 40);
    let stream = dev.default_stream();
    assert_eq!(tuned_gemv_splits(&stream, &x, &w).unwrap(), 1);
    let out = Tensor::empty(&dev, DType::F32, &[2, 5]).unwrap();
    api::gemv_into(&stream, &x, &w, &out, None).unwrap();
    assert_eq!(api::gemv(&x, &w).unwrap().to_vec::<f32>().unwrap(), out.to_vec::<f32>().unwrap());
    // Errors still come from the op.
    let bad = Tensor::zeros(&dev, DType::F32, &[5, 41]).unwrap();
    assert!(api::gemv(&x, &bad).unwrap_err().to_string().contains("inner dimensions differ"));
}

#[test]
fn shapes_files_parse_with_line_numbers() {
    let text = "# decode GEMVs of a small model\n\ngemv bf16 m=1 n=4096 k=4096\ngemv f16 k=128 n=3 m=16  # any order\n\
                gemm bf16 m=512 n=4096 k=4096\n";
    assert_eq!(
        parse_shapes("s.txt", text).unwrap(),
        vec![
            TuneShape::Gemv { dtype: DType::BF16, m: 1, n: 4096, k: 4096 },
            TuneShape::Gemv { dtype: DType::F16, m: 16, n: 3, k: 128 },
            TuneShape::Gemm { dtype: DType::BF16, m: 512, n: 4096, k: 4096 },
        ]
    );
    assert_eq!(parse_shapes("s.txt", text).unwrap()[2].to_string(), "gemm bf16 512x4096x4096");
    assert_eq!(parse_shapes("s.txt", text).unwrap()[0].to_string(), "gemv bf16 1x4096x4096");
    // The routed experts' line: keys in any order, displayed in the line's own form.
    let moe = "moe_experts bf16 tokens=512 experts=128 top_k=8 hidden=2048 inter=768\n\
               moe_experts f16 inter=8 hidden=16 top_k=3 experts=3 tokens=1\n";
    let parsed = parse_shapes("m.txt", moe).unwrap();
    assert_eq!(
        parsed[..],
        [
            TuneShape::MoeExperts { dtype: DType::BF16, tokens: 512, experts: 128, top_k: 8, hidden: 2048, inter: 768 },
            TuneShape::MoeExperts { dtype: DType::F16, tokens: 1, experts: 3, top_k: 3, hidden: 16, inter: 8 },
        ]
    );
    let shown = parsed[0].to_string();
    assert_eq!(shown, "moe_experts bf16 tokens=512 experts=128 top_k=8 hidden=2048 inter=768");
    assert_eq!(parse_shapes("m.txt", &shown).unwrap(), parsed[..1]);
    for (bad, want) in [
        ("moe_experts f32 tokens=8 experts=4 top_k=2 hidden=16 inter=8", "m.txt:1: f32: the tensor-core grouped GEMM"),
        ("moe_experts bf16 tokens=8 experts=4 top_k=5 hidden=16 inter=8", "m.txt:1: top_k=5 of experts=4"),
        ("moe_experts bf16 tokens=8 experts=2000 top_k=5 hidden=16 inter=8", "m.txt:1: top_k=5 of experts=2000"),
        ("moe_experts bf16 tokens=8 experts=4 top_k=2 hidden=20 inter=8", "m.txt:1: hidden=20, inter=8"),
        ("moe_experts bf16 tokens=8 experts=4 top_k=2 hidden=16", "m.txt:1: missing `inter=`"),
    ] {
        let e = parse_shapes("m.txt", bad).expect_err(bad);
        assert!(e.starts_with(want), "{bad}: {e}");
        assert!(e.contains("moe_experts DTYPE tokens=T experts=E top_k=K hidden=H inter=I"), "{e}");
    }
    for (bad, want) in [
        ("gemv bf16 m=1 n=8 k=8\ngemm bf16 m=1 n=8 k=8", "s.txt:2: m=1: up to 16 rows run on the GEMV"),
        ("gemm f32 m=64 n=8 k=8", "s.txt:1: f32: the tensor-core GEMM takes f16 or bf16"),
        ("gemv bf16 m=1 n=8 k=8\nconv bf16 m=1 n=8 k=8", "s.txt:2: unknown op `conv`"),
        ("\n\ngemv u32 m=1 n=8 k=8", "s.txt:3: `u32` is not f32, f16 or bf16"),
        ("gemv bf16 m=1 n=8", "s.txt:1: missing `k=`"),
        ("gemv bf16 m=17 n=8 k=8", "s.txt:1: m=17: GEMV takes at most 16 rows"),
        ("gemv bf16 m=1 n=0 k=8", "s.txt:1: `n=0`: must be between 1"),
        ("gemv bf16 m=1 n=x k=8", "s.txt:1: `n=x`: not a positive integer"),
        ("gemv bf16 m=1 m=2 n=8 k=8", "s.txt:1: `m` given twice"),
        ("gemv bf16 m=1 n=8 k=8 q=3", "s.txt:1: unknown dimension `q`"),
        ("gemv", "s.txt:1: missing the dtype"),
    ] {
        let e = parse_shapes("s.txt", bad).expect_err(bad);
        assert!(e.starts_with(want), "{bad}: {e}");
        assert!(e.contains("gemv DTYPE m=M n=N k=K"), "{e}");
    }
}

#[test]
fn the_progress_bar_fills() {
    use ruda_ops::tune::progress_bar;
    assert_eq!(progress_bar(0, 4), "[....................] 0/4");
    assert_eq!(progress_bar(2, 4), "[##########..........] 2/4");
    assert_eq!(progress_bar(4, 4), "[####################] 4/4");
}

/// A cache entry written under the old candidate checksum (IR hashed with source locations) is
/// re-measured, not taken: the old best (16 splits) loses to the new timings.
#[test]
fn an_old_format_cache_entry_is_ignored() {
    use ruda_runtime::CandidateSet;
    let dev = Device::cpu();
    let (x, w) = operands(&dev, 1, 8, 4096);
    let dir = temp_dir("tune-old-format");
    let key = gemv_key(&x, &w).unwrap();
    {
        let old = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
        let names = ["splits=1", "splits=2", "splits=4", "splits=8", "splits=16"];
        let set = CandidateSet::new(names, 0x0123_4567_89ab_cdef);
        let c = old.tune(&key, &set, |c| Ok(if c.name == "splits=16" { 0.001 } else { 1.0 })).unwrap();
        assert_eq!(c.candidate.name, "splits=16");
    }
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    let mut measured = 0;
    let t = tune_gemv_with(&tuner, &dev, &x, &w, |s| {
        measured += 1;
        Ok(if s == 2 { 0.01 } else { 1.0 })
    })
    .unwrap();
    assert!(!t.choice.cached);
    assert_eq!(measured, 5);
    assert_eq!(t.value, 2);
}

/// The candidate checksum follows the IR, not where its builder's lines are: two builds of one
/// kernel from different source lines have different IR hashes but one digest.
#[test]
fn the_candidate_digest_ignores_source_locations() {
    use ruda_ir::{AddrSpace, KernelBuilder, ScalarType, Type};
    use ruda_runtime::{HashedKernel, Launchable};
    use std::sync::Arc;
    // One builder, called from two source lines.
    #[track_caller]
    fn build() -> HashedKernel {
        let mut b = KernelBuilder::new("k");
        let p = b.param("p", Type::Ptr(AddrSpace::Global, ScalarType::F32));
        let i = b.thread_id_x();
        let v = b.const_f32(1.0);
        let q = b.ptr_add(p, i);
        b.store(q, v);
        HashedKernel::new(b.finish().unwrap())
    }
    let a = build();
    let b = build();
    assert_ne!(a.ir_hash(), b.ir_hash(), "the locations differ");
    let digest = |k: HashedKernel| ruda_ops::tune::flow::ir_digest(&[Arc::new(k)]);
    assert_eq!(digest(a), digest(b));
}

/// A writer that is not a terminal's standard error gets one plain line per shape.
#[test]
fn progress_to_a_writer_is_plain_lines() {
    use ruda_ops::tune::Progress;
    let mut buf: Vec<u8> = Vec::new();
    let shape = TuneShape::Gemv { dtype: DType::BF16, m: 1, n: 8, k: 8 };
    let mut p = Progress::new(&mut buf, 2);
    assert!(matches!(p, Progress::Lines(_)));
    p.shape(1, 2, &shape, "best splits=1").unwrap();
    p.finish();
    assert_eq!(String::from_utf8(buf).unwrap(), "[##########..........] 1/2 gemv bf16 1x8x8: best splits=1\n");
}
