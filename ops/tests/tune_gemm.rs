//! Tensor-core GEMM tile autotuning on the CPU with injected timings, and the untuned path.

use crate::common::{fingerprint, temp_dir};
use ruda_ops::api::{self, heuristic_gemm_tile, GemmTile};
use ruda_ops::kernels::gemm_tc::TcTile;
use ruda_ops::tune::{gemm_candidates, gemm_key, gemm_tuned_into, tune_gemm_shape, tune_gemm_with, tuned_gemm_tile};
use ruda_runtime::{AutotuneMode, Autotuner, DType, Device, Tensor};

fn operands(dev: &Device, dtype: DType, m: usize, n: usize, k: usize) -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..m * k).map(|i| ((i % 7) as f32 - 3.0) * 0.25).collect();
    let w: Vec<f32> = (0..n * k).map(|i| ((i % 5) as f32 - 2.0) * 0.5).collect();
    let x = Tensor::from_slice(dev, &x, &[m, k]).unwrap();
    let w = Tensor::from_slice(dev, &w, &[n, k]).unwrap();
    (api::cast(&x, dtype).unwrap(), api::cast(&w, dtype).unwrap())
}

#[test]
fn gemm_tiles_tune_with_injected_timings_and_cache_the_choice() {
    let dev = Device::cpu();
    let (x, w) = operands(&dev, DType::BF16, 40, 24, 64);
    let dir = temp_dir("tune-gemm-inject");
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    let heuristic = heuristic_gemm_tile(&dev, 40, 24);
    assert_eq!(heuristic, GemmTile { tile: TcTile::T64x64, stages: 3 });
    let fastest = GemmTile { tile: TcTile::T128x64, stages: 2 };
    let broken = GemmTile { tile: TcTile::T128x128W4, stages: 3 };
    let mut measured = Vec::new();
    let choice = tune_gemm_with(&tuner, &dev, &x, &w, |t| {
        measured.push(t);
        if t == broken {
            Err("launch failed".to_string())
        } else if t == fastest {
            Ok(0.5)
        } else {
            Ok(1.0 + t.stages as f64)
        }
    })
    .unwrap();
    // The heuristic's tile first, then every other tile and depth once.
    assert_eq!(measured[0], heuristic);
    assert_eq!(measured.len(), GemmTile::all().len());
    assert!(GemmTile::all().iter().all(|t| measured.contains(t)));
    assert_eq!(choice.value, fastest);
    let again = tune_gemm_with(&tuner, &dev, &x, &w, |_| panic!("measured a cached key")).unwrap();
    assert!(again.choice.cached);
    assert_eq!(again.value, fastest);
    // A nearby shape shares the bucket; the entry records the failure.
    let (x2, w2) = operands(&dev, DType::BF16, 33, 20, 48);
    assert_eq!(gemm_key(&x2, &w2).unwrap().to_string(), "gemm bf16 64x32x64 align16");
    let entry = tuner.snapshot().entries.remove("gemm bf16 64x32x64 align16").expect("entry");
    let failed = entry.results.iter().find(|r| r.candidate == broken.name()).expect("measured");
    assert_eq!(failed.error.as_deref(), Some("launch failed"));
    // Off: the heuristic, unmeasured.
    let off = Autotuner::open(&dir, fingerprint(), AutotuneMode::Off);
    let c = tune_gemm_with(&off, &dev, &x, &w, |_| panic!("measured")).unwrap();
    assert_eq!(c.value, heuristic);
    // Only tensor-core dtypes have candidates.
    let (xf, wf) = operands(&dev, DType::F32, 40, 24, 64);
    assert!(tune_gemm_with(&tuner, &dev, &xf, &wf, |_| Ok(1.0))
        .unwrap_err()
        .to_string()
        .contains("tensor cores take f16 or bf16"));
}

#[test]
fn on_the_cpu_the_gemm_is_untuned_and_matches_the_heuristic_launch() {
    let dev = Device::cpu();
    let stream = dev.default_stream();
    let (x, w) = operands(&dev, DType::F16, 150, 140, 32);
    assert_eq!(tuned_gemm_tile(&stream, &x, &w).unwrap(), heuristic_gemm_tile(&dev, 150, 140));
    let bias = api::cast(
        &Tensor::from_slice(&dev, &(0..140).map(|i| i as f32 * 0.01).collect::<Vec<_>>(), &[140]).unwrap(),
        DType::F16,
    )
    .unwrap();
    let a = Tensor::empty(&dev, DType::F16, &[150, 140]).unwrap();
    let b = Tensor::empty(&dev, DType::F16, &[150, 140]).unwrap();
    gemm_tuned_into(&stream, &x, &w, Some(&bias), None, &a).unwrap();
    api::linear_bias_into(&stream, &x, &w, Some(&bias), None, &b).unwrap();
    assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap());
    // Shape-file tuning does not apply on the CPU.
    assert!(tune_gemm_shape(&stream, DType::BF16, 256, 128, 64).unwrap().is_none());
    // The allocating wrapper takes the same path.
    assert_eq!(api::linear_bias(&x, &w, Some(&bias), None).unwrap().to_bytes().unwrap(), a.to_bytes().unwrap());
}

#[test]
fn the_heuristic_prefers_large_tiles_only_when_they_fill_the_gpu() {
    let dev = Device::cpu();
    let h = |m, n| heuristic_gemm_tile(&dev, m, n).tile;
    // 108 SMs assumed without a GPU.
    assert_eq!(h(4096, 4096), TcTile::T128x128W4);
    assert_eq!(h(2048, 896), TcTile::T128x128W4);
    assert_eq!(h(1024, 896), TcTile::T128x64);
    assert_eq!(h(100, 8192), TcTile::T64x128);
    assert_eq!(h(128, 896), TcTile::T64x64);
    assert_eq!(h(17, 33), TcTile::T64x64);
}

/// Shapes of one tuning key get one candidate set (else each would invalidate the other's cached
/// choice): the set follows the bucketed shape, not the exact one.
#[test]
fn shapes_of_one_key_share_a_candidate_set() {
    let dev = Device::cpu();
    // On the CPU device's assumed 108 SMs the exact shapes pick different tiles: 64x64 for
    // n = 6000 (94 blocks of 128x64 would not fill it), 128x64 for n = 8000.
    assert_ne!(heuristic_gemm_tile(&dev, 128, 6000), heuristic_gemm_tile(&dev, 128, 8000));
    let sets: Vec<_> = [(128, 6000), (128, 8000), (100, 8192)]
        .iter()
        .map(|&(m, n)| {
            let (x, w) = operands(&dev, DType::BF16, m, n, 64);
            let key = gemm_key(&x, &w).unwrap();
            (key.to_string(), gemm_candidates(&dev, &key, m, n).unwrap())
        })
        .collect();
    assert!(sets.iter().all(|s| *s == sets[0]), "{sets:#?}");
}
