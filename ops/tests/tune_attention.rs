//! Decode attention's split-KV autotuning on the CPU with injected timings, its shape-file
//! lines, and that the allocating op is unchanged where tuning is off.

use crate::common::{fingerprint, temp_dir};
use ruda_ops::api;
use ruda_ops::kernels::attention::Geometry;
use ruda_ops::tune::{
    decode_candidates, decode_key, parse_shapes, tune_decode_with, tune_shape, tuned_decode_splits, DecodeShape,
    TuneShape, DECODE_SPLIT_CANDIDATES,
};
use ruda_runtime::{AutotuneMode, Autotuner, DType, Device, Tensor};

/// Zero-filled `q [b, hq, d]` and caches `[b, hkv, s, d]` (tuning looks at shapes only).
fn operands(dev: &Device, dtype: DType, [b, hq, hkv, d, s]: [usize; 5]) -> (Tensor, Tensor, Tensor) {
    let z = |shape: &[usize]| Tensor::zeros(dev, dtype, shape).unwrap();
    (z(&[b, hq, d]), z(&[b, hkv, s, d]), z(&[b, hkv, s, d]))
}

#[test]
fn decode_tunes_with_injected_timings_and_caches_the_choice() {
    let dev = Device::cpu();
    let dims = [1, 16, 8, 128, 4096];
    let (q, k, v) = operands(&dev, DType::BF16, dims);
    let dir = temp_dir("tune-attention-inject");
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    let heuristic = api::decode_splits(1, 16, 8, 128, 4096);
    let mut measured = Vec::new();
    let choice = tune_decode_with(&tuner, &q, &k, &v, |s| {
        measured.push(s);
        match s {
            8 => Ok(0.020),
            64 => Err("launch failed".to_string()),
            s => Ok(0.1 / s as f64 + 0.02),
        }
    })
    .unwrap();
    // The heuristic first, then every other candidate once (4096 keys leave them all a tile).
    let mut want = vec![heuristic];
    want.extend(DECODE_SPLIT_CANDIDATES.into_iter().filter(|&s| s != heuristic));
    assert_eq!(measured, want);
    assert_eq!(choice.value, 8);
    assert!(!choice.choice.cached);
    let again = tune_decode_with(&tuner, &q, &k, &v, |_| panic!("measured a cached key")).unwrap();
    assert!(again.choice.cached);
    assert_eq!(again.value, 8);
    // A nearby shape shares the bucket and the entry.
    let (q2, k2, v2) = operands(&dev, DType::BF16, [1, 14, 7, 128, 3000]);
    assert_eq!(decode_key(&q2, &k2, &v2).unwrap().shape_bucket, vec![1, 16, 8, 128, 4096]);
    let entry = tuner.snapshot().entries.remove("attention_decode bf16 1x16x8x128x4096 align16").expect("entry");
    let failed = entry.results.iter().find(|r| r.candidate == "splits=64").expect("splits=64 recorded");
    assert_eq!(failed.error.as_deref(), Some("launch failed"));
    assert_eq!(entry.best, "splits=8");
    // Persisted: a new tuner on the same folder reads the choice back.
    let reopened = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    assert!(tune_decode_with(&reopened, &q, &k, &v, |_| panic!("measured")).unwrap().choice.cached);
    // Off: the heuristic, unmeasured.
    let off = Autotuner::open(&dir, fingerprint(), AutotuneMode::Off);
    let c = tune_decode_with(&off, &q, &k, &v, |_| panic!("measured")).unwrap();
    assert_eq!(c.value, heuristic);
}

#[test]
fn every_candidate_failing_is_an_error_listing_them() {
    let dev = Device::cpu();
    let (q, k, v) = operands(&dev, DType::F16, [2, 4, 4, 64, 256]);
    let tuner = Autotuner::open(&temp_dir("tune-attention-fail"), fingerprint(), AutotuneMode::On);
    let e = tune_decode_with(&tuner, &q, &k, &v, |s| Err(format!("no {s}"))).unwrap_err().to_string();
    assert!(e.contains("every candidate failed") && e.contains("splits=1: no 1"), "{e}");
}

#[test]
fn short_caches_try_only_splits_that_keep_a_key_tile_each() {
    let keys = Geometry::new(64, 64).keys as usize;
    let s_max = 4 * keys; // four tiles (a power of two, as keys bucket it): at most 4 useful splits
    let set = decode_candidates(DType::F32, [4, 8, 8, 64, s_max], 64).unwrap();
    let names: Vec<&str> = set.candidates.iter().map(|c| c.name.as_str()).collect();
    let first = format!("splits={}", api::decode_splits(4, 8, 8, 64, s_max));
    assert_eq!(names[0], first);
    for n in &names[1..] {
        let s: usize = n.strip_prefix("splits=").unwrap().parse().unwrap();
        assert!(s <= 4, "{names:?}");
    }
    assert!(names.contains(&"splits=2"), "{names:?}");
    // The kernels' IR hashes are part of the set: another head dim is another checksum.
    let other = decode_candidates(DType::F32, [4, 8, 8, 128, s_max], 128).unwrap();
    assert_ne!(set.ir_hash, other.ir_hash);
    // Shapes the kernel does not take are errors naming the op.
    let e = decode_candidates(DType::F32, [1, 2, 2, 1025, 64], 1025).unwrap_err().to_string();
    assert!(e.contains("attention_decode") && e.contains("head dim 1025"), "{e}");
    let e = decode_candidates(DType::F32, [1, 2, 2, 64, 64], 0).unwrap_err().to_string();
    assert!(e.contains("value head dim 0"), "{e}");
    // Any head dim up to 1024 is served, with a value head dim of its own.
    let d96 = decode_candidates(DType::F32, [1, 2, 2, 96, 64], 96).unwrap();
    assert_ne!(d96.ir_hash, decode_candidates(DType::F32, [1, 2, 2, 96, 64], 32).unwrap().ir_hash);
    assert!(decode_candidates(DType::U32, [1, 2, 2, 64, 64], 64).is_err());
}

#[test]
fn decode_keys_carry_dtype_and_alignment() {
    let dev = Device::cpu();
    let (q, k, v) = operands(&dev, DType::F32, [3, 4, 2, 64, 100]);
    assert_eq!(decode_key(&q, &k, &v).unwrap().to_string(), "attention_decode f32 4x4x2x64x128 align16");
    // A query starting one float into its buffer: 4-byte alignment.
    let q_off = Tensor::zeros(&dev, DType::F32, &[3 * 4 * 64 + 1])
        .unwrap()
        .narrow(0, 1, 3 * 4 * 64)
        .unwrap()
        .reshape(&[3, 4, 64])
        .unwrap();
    assert_eq!(decode_key(&q_off, &k, &v).unwrap().alignment, 4);
    assert!(decode_key(&Tensor::zeros(&dev, DType::F32, &[4, 64]).unwrap(), &k, &v).is_none());
    // A V cache of another head dim is another key (the same one's dims stay five).
    let v32 = Tensor::zeros(&dev, DType::F32, &[3, 2, 100, 32]).unwrap();
    assert_eq!(decode_key(&q, &k, &v32).unwrap().to_string(), "attention_decode f32 4x4x2x64x128x32 align16");
}

fn filled(dev: &Device, dtype: DType, shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| (((i * 7 + seed * 13) % 23) as f32 - 11.0) / 16.0).collect();
    let t = Tensor::from_slice(dev, &data, shape).unwrap();
    if dtype == DType::F32 {
        t
    } else {
        api::cast(&t, dtype).unwrap()
    }
}

#[test]
fn on_the_cpu_decode_is_untuned_and_unchanged() {
    let dev = Device::cpu();
    let stream = dev.default_stream();
    let (b, hq, hkv, d, s) = (2, 4, 2, 64, 600);
    let q = filled(&dev, DType::BF16, &[b, hq, d], 1);
    let k = filled(&dev, DType::BF16, &[b, hkv, s, d], 2);
    let v = filled(&dev, DType::BF16, &[b, hkv, s, d], 3);
    let lens = Tensor::from_slice(&dev, &[600u32, 257], &[b]).unwrap();
    let heuristic = api::decode_splits(b, hq, hkv, d, s);
    assert!(heuristic > 1, "the check below wants a split decode");
    assert_eq!(tuned_decode_splits(&stream, &q, &k, &v).unwrap(), heuristic);
    let ws = api::DecodeWorkspace::new(&q, heuristic).unwrap();
    let out = Tensor::empty(&dev, DType::BF16, &[b, hq, d]).unwrap();
    api::attention_decode_into(&stream, &q, &k, &v, &lens, None, &ws, &out).unwrap();
    let got = api::attention_decode(&q, &k, &v, &lens, None).unwrap();
    assert_eq!(got.to_bytes().unwrap(), out.to_bytes().unwrap());
    // Operands the op rejects get the heuristic here and the op's own error there.
    let bad_v = filled(&dev, DType::BF16, &[b, hkv, s - 1, d], 4);
    assert_eq!(tuned_decode_splits(&stream, &q, &k, &bad_v).unwrap(), heuristic);
    let e = api::attention_decode(&q, &k, &bad_v, &lens, None).unwrap_err().to_string();
    assert!(e.contains("v_cache"), "{e}");
    // And `tune_shape` has nothing to tune on the CPU.
    let shape = TuneShape::AttentionDecode(DecodeShape {
        dtype: DType::F16,
        batch: 1,
        q_heads: 2,
        kv_heads: 1,
        head_dim: 64,
        s_max: 64,
    });
    assert!(tune_shape(&stream, &shape).unwrap().is_none());
}

#[test]
fn shapes_files_take_attention_decode_lines() {
    let text =
        "gemv bf16 m=1 n=896 k=896\nattention_decode bf16 batch=1 q_heads=14 kv_heads=2 head_dim=64 s_max=32768\n\
                attention_decode f16 s_max=4096 head_dim=128 kv_heads=8 q_heads=16 batch=16 # any order\n";
    let shapes = parse_shapes("s.txt", text).unwrap();
    assert_eq!(shapes[0], TuneShape::Gemv { dtype: DType::BF16, m: 1, n: 896, k: 896 });
    assert_eq!(
        shapes[1],
        TuneShape::AttentionDecode(DecodeShape {
            dtype: DType::BF16,
            batch: 1,
            q_heads: 14,
            kv_heads: 2,
            head_dim: 64,
            s_max: 32768
        })
    );
    assert_eq!(shapes[2].to_string(), "attention_decode f16 16x16x8x128x4096");
    for (bad, want) in [
        (
            "attention_decode bf16 batch=1 q_heads=14 kv_heads=4 head_dim=64 s_max=8",
            "s.txt:1: q_heads=14 is not a multiple of kv_heads=4",
        ),
        ("\nattention_decode bf16 batch=1 q_heads=2 kv_heads=1 head_dim=1025 s_max=8", "s.txt:2: attention_decode"),
        ("attention_decode bf16 batch=1 q_heads=2 kv_heads=1 head_dim=64", "s.txt:1: missing `s_max=`"),
        (
            "attention_decode bf16 batch=1 q_heads=2 kv_heads=1 head_dim=64 s_max=8 m=1",
            "s.txt:1: unknown dimension `m`",
        ),
        (
            "attention_decode bf16 batch=0 q_heads=2 kv_heads=1 head_dim=64 s_max=8",
            "s.txt:1: `batch=0`: must be between 1",
        ),
        ("gemv bf16 m=1 n=8 k=8 s_max=4", "s.txt:1: unknown dimension `s_max`"),
        (
            "attention_prefill bf16",
            "s.txt:1: unknown op `attention_prefill`; tunable ops: gemv, gemm, attention_decode",
        ),
    ] {
        let e = parse_shapes("s.txt", bad).expect_err(bad);
        assert!(e.starts_with(want), "{bad}: {e}");
        assert!(e.contains("attention_decode DTYPE batch=B q_heads=H kv_heads=G head_dim=D s_max=S"), "{e}");
    }
    let e =
        parse_shapes("s.txt", "attention_decode bf16 batch=1 q_heads=2 kv_heads=1 head_dim=1025 s_max=8").unwrap_err();
    assert!(e.contains("head dim 1025") && e.contains("D 1 to 1024"), "{e}");
    // Every head dim up to 1024 is a decode shape.
    for d in [1, 48, 96, 1024] {
        let line = format!("attention_decode bf16 batch=1 q_heads=2 kv_heads=1 head_dim={d} s_max=8");
        parse_shapes("s.txt", &line).unwrap();
    }
}

/// Capacities of one bucket (a pipeline's 768 and 1024) get one candidate set.
#[test]
fn capacities_of_one_bucket_share_a_candidate_set() {
    let a = decode_candidates(DType::BF16, [1, 16, 8, 128, 768], 128).unwrap();
    let b = decode_candidates(DType::BF16, [1, 16, 8, 128, 1024], 128).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, decode_candidates(DType::BF16, [1, 16, 8, 128, 4096], 128).unwrap());
}
