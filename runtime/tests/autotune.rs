//! The autotuning cache on the CPU, with injected timings: keys, persistence, invalidation,
//! failures, eviction and corrupt files.

use std::cell::RefCell;
use std::path::PathBuf;

use ruda_runtime::{
    alignment_class, bucket, cache_dir, measure_on_stream, median, AutotuneMode, Autotuner, CacheFile, CandidateSet,
    Device, DeviceFingerprint, RuntimeError, TuneKey,
};

/// A fresh, empty folder for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ruda-autotune-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn fingerprint() -> DeviceFingerprint {
    DeviceFingerprint {
        device_name: "NVIDIA H100 80GB HBM3".into(),
        compute_capability: (9, 0),
        driver_version: "12.9".into(),
        compiler: "ptx".into(),
        compiler_version: "ruda-codegen-ptx 0.1.0".into(),
    }
}

fn key() -> TuneKey {
    TuneKey::new("gemv", "bf16", &[1, 4096, 4096], 16)
}

fn set() -> CandidateSet {
    CandidateSet::new(["splits=1", "splits=2", "splits=4", "splits=8"], 0xabc)
}

/// A measurement with fixed times per candidate name that counts its calls.
fn timings<'a>(
    calls: &'a RefCell<Vec<String>>,
    times: &'a [(&'a str, Result<f64, &'a str>)],
) -> impl FnMut(&ruda_runtime::Candidate) -> Result<f64, String> + 'a {
    move |c| {
        calls.borrow_mut().push(c.name.clone());
        let (_, t) = times.iter().find(|(n, _)| *n == c.name).expect("a timing for every candidate");
        t.map_err(str::to_string)
    }
}

const TIMES: [(&str, Result<f64, &str>); 4] =
    [("splits=1", Ok(0.040)), ("splits=2", Ok(0.021)), ("splits=4", Ok(0.012)), ("splits=8", Ok(0.015))];

#[test]
fn keys_bucket_shapes_to_powers_of_two() {
    assert_eq!([0, 1, 2, 3, 4, 5, 4095, 4096, 4097].map(bucket), [0, 1, 2, 4, 4, 8, 4096, 4096, 8192]);
    let a = TuneKey::new("gemv", "bf16", &[1, 3000, 4000], 16);
    let b = TuneKey::new("gemv", "bf16", &[1, 4096, 3500], 16);
    assert_eq!(a, b);
    assert_eq!(a.shape_bucket, vec![1, 4096, 4096]);
    assert_eq!(a.to_string(), "gemv bf16 1x4096x4096 align16");
    assert_ne!(a, TuneKey::new("gemv", "f16", &[1, 4096, 4096], 16));
    assert_ne!(a, TuneKey::new("gemv", "bf16", &[1, 4096, 4096], 8));
    assert_eq!(alignment_class(&[]), 16);
    assert_eq!(alignment_class(&[256, 8192]), 16);
    assert_eq!(alignment_class(&[256, 8194]), 2);
    assert_eq!(alignment_class(&[1024, 24]), 8);
    assert_eq!(alignment_class(&[3]), 1);
}

#[test]
fn candidate_checksum_covers_names_order_and_kernels() {
    let base = set().checksum();
    assert_eq!(base, set().checksum());
    assert_ne!(base, CandidateSet::new(["splits=1", "splits=2", "splits=4"], 0xabc).checksum());
    assert_ne!(base, CandidateSet::new(["splits=2", "splits=1", "splits=4", "splits=8"], 0xabc).checksum());
    assert_ne!(base, CandidateSet::new(["splits=1", "splits=2", "splits=4", "splits=8"], 0xabd).checksum());
}

#[test]
fn measures_once_then_uses_the_cache_across_processes() {
    let dir = temp_dir("roundtrip");
    let calls = RefCell::new(Vec::new());
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    assert!(tuner.load_warning().is_none());
    let choice = tuner.tune(&key(), &set(), timings(&calls, &TIMES)).unwrap();
    assert_eq!((choice.index, choice.candidate.name.as_str(), choice.cached), (2, "splits=4", false));
    assert_eq!(choice.median_ms, Some(0.012));
    assert_eq!(calls.borrow().len(), 4);

    // The same tuner, and a new one reading the file: no measurement.
    let again = tuner.tune(&key(), &set(), timings(&calls, &TIMES)).unwrap();
    assert!(again.cached);
    assert_eq!(again.candidate.name, "splits=4");
    let reopened = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    let cached = reopened.tune(&key(), &set(), timings(&calls, &TIMES)).unwrap();
    assert_eq!((cached.index, cached.cached, cached.median_ms), (2, true, Some(0.012)));
    assert_eq!(calls.borrow().len(), 4);

    // The file holds every candidate's time, and renders them.
    let path = fingerprint().cache_file(&dir);
    assert_eq!(reopened.path(), path);
    assert!(path.starts_with(dir.join("autotune")));
    let file = CacheFile::read(&path).unwrap();
    let entry = &file.entries["gemv bf16 1x4096x4096 align16"];
    assert_eq!(entry.best, "splits=4");
    assert_eq!(entry.results.iter().filter_map(|r| r.median_ms).collect::<Vec<_>>(), vec![0.040, 0.021, 0.012, 0.015]);
    let shown = file.render();
    assert!(shown.contains("gemv bf16 1x4096x4096 align16: best splits=4"), "{shown}");
    assert!(shown.contains("splits=8     0.0150 ms"), "{shown}");
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.join("autotune")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn a_changed_candidate_set_compiler_or_driver_measures_again() {
    let dir = temp_dir("invalidate");
    let calls = RefCell::new(Vec::new());
    Autotuner::open(&dir, fingerprint(), AutotuneMode::On).tune(&key(), &set(), timings(&calls, &TIMES)).unwrap();
    assert_eq!(calls.borrow().len(), 4);

    // Other kernels (IR hash) under the same names: measured again, and the entry replaced.
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    let changed = CandidateSet::new(["splits=1", "splits=2", "splits=4", "splits=8"], 0xdef);
    assert!(!tuner.tune(&key(), &changed, timings(&calls, &TIMES)).unwrap().cached);
    assert_eq!(calls.borrow().len(), 8);
    assert!(tuner.tune(&key(), &changed, timings(&calls, &TIMES)).unwrap().cached);

    let mut compiler = fingerprint();
    compiler.compiler_version = "ruda-codegen-nvrtc 0.1.0 with NVRTC 12.9".into();
    let mut driver = fingerprint();
    driver.driver_version = "13.0".into();
    let mut gpu = fingerprint();
    gpu.compute_capability = (8, 0);
    for fp in [compiler, driver, gpu] {
        assert_ne!(fp.cache_file(&dir), fingerprint().cache_file(&dir));
        let t = Autotuner::open(&dir, fp, AutotuneMode::On);
        assert!(!t.tune(&key(), &changed, timings(&calls, &TIMES)).unwrap().cached);
    }
    assert_eq!(calls.borrow().len(), 20);
}

#[test]
fn failing_candidates_are_recorded_and_skipped() {
    let dir = temp_dir("failing");
    let calls = RefCell::new(Vec::new());
    let times = [
        ("splits=1", Ok(0.040)),
        ("splits=2", Err("kernel `gemv_bf16_m1_splitk`: launch failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")),
        ("splits=4", Ok(f64::NAN)),
        ("splits=8", Ok(0.015)),
    ];
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    let choice = tuner.tune(&key(), &set(), timings(&calls, &times)).unwrap();
    assert_eq!(choice.candidate.name, "splits=8");
    let entry = tuner.snapshot().entries.remove("gemv bf16 1x4096x4096 align16").unwrap();
    assert!(entry.results[1].error.as_deref().unwrap().contains("OUT_OF_RESOURCES"));
    assert_eq!(entry.results[1].median_ms, None);
    assert_eq!(entry.results[2].error.as_deref(), Some("measured NaN ms"));
    let shown = tuner.snapshot().render();
    assert!(shown.contains("splits=2     failed: kernel `gemv_bf16_m1_splitk`"), "{shown}");
}

#[test]
fn every_candidate_failing_is_a_clear_error_and_is_not_cached() {
    let dir = temp_dir("allfail");
    let calls = RefCell::new(Vec::new());
    let times =
        [("splits=1", Err("no 1")), ("splits=2", Err("no 2")), ("splits=4", Err("no 4")), ("splits=8", Err("no 8"))];
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    let err = tuner.tune(&key(), &set(), timings(&calls, &times)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, RuntimeError::Launch { .. }));
    assert!(msg.contains("autotuning gemv bf16 1x4096x4096 align16: every candidate failed"), "{msg}");
    assert!(msg.contains("splits=1: no 1; splits=2: no 2; splits=4: no 4; splits=8: no 8"), "{msg}");
    assert!(tuner.snapshot().entries.is_empty());
    // An empty set is an error too, not a panic.
    let empty = CandidateSet::new(Vec::<String>::new(), 0);
    assert!(tuner.tune(&key(), &empty, timings(&calls, &times)).unwrap_err().to_string().contains("no candidates"));
}

#[test]
fn a_failing_cached_choice_is_evicted_and_the_next_best_used() {
    let dir = temp_dir("evict");
    let calls = RefCell::new(Vec::new());
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    assert_eq!(tuner.tune(&key(), &set(), timings(&calls, &TIMES)).unwrap().candidate.name, "splits=4");
    let next = tuner.evict_and_fall_back(&key(), &set(), "splits=4").unwrap();
    assert_eq!((next.candidate.name.as_str(), next.index, next.median_ms), ("splits=8", 3, Some(0.015)));
    // Evicted on disk too: the next tune measures again.
    assert!(Autotuner::open(&dir, fingerprint(), AutotuneMode::On).snapshot().entries.is_empty());
    assert!(!tuner.tune(&key(), &set(), timings(&calls, &TIMES)).unwrap().cached);
    assert_eq!(calls.borrow().len(), 8);
    // Without an entry: the first other candidate; with one candidate only: an error.
    tuner.evict(&key()).unwrap();
    assert_eq!(tuner.evict_and_fall_back(&key(), &set(), "splits=1").unwrap().candidate.name, "splits=2");
    let single = CandidateSet::new(["splits=1"], 0);
    assert!(tuner
        .evict_and_fall_back(&key(), &single, "splits=1")
        .unwrap_err()
        .to_string()
        .contains("no other candidate"));
}

#[test]
fn a_corrupt_or_foreign_file_starts_afresh() {
    let dir = temp_dir("corrupt");
    let path = fingerprint().cache_file(&dir);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "{\"fingerprint\": tru").unwrap();
    let calls = RefCell::new(Vec::new());
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    assert!(tuner.load_warning().unwrap().contains("not a RUDA autotune cache"), "{:?}", tuner.load_warning());
    assert!(tuner.snapshot().entries.is_empty());
    tuner.tune(&key(), &set(), timings(&calls, &TIMES)).unwrap();
    assert_eq!(CacheFile::read(&path).unwrap().entries.len(), 1, "the corrupt file was replaced");

    // A well-formed file whose fingerprint is another device's (a digest collision or a copy).
    let mut other = CacheFile::read(&path).unwrap();
    other.fingerprint.device_name = "NVIDIA A100".into();
    std::fs::write(&path, serde_json::to_string(&other).unwrap()).unwrap();
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::On);
    assert!(tuner.load_warning().unwrap().contains("written for NVIDIA A100"));
    assert!(tuner.snapshot().entries.is_empty());
}

#[test]
fn off_uses_the_heuristic_default_without_measuring() {
    let dir = temp_dir("off");
    let tuner = Autotuner::open(&dir, fingerprint(), AutotuneMode::Off);
    let choice = tuner.tune(&key(), &set(), |_| panic!("measured with tuning off")).unwrap();
    assert_eq!((choice.index, choice.median_ms, choice.cached), (0, None, false));
    assert!(!tuner.path().exists(), "nothing written when off");
}

#[test]
fn ruda_autotune_parses_and_is_off_on_the_cpu() {
    assert_eq!(AutotuneMode::parse(None).unwrap(), AutotuneMode::On);
    assert_eq!(AutotuneMode::parse(Some("")).unwrap(), AutotuneMode::On);
    assert_eq!(AutotuneMode::parse(Some("on")).unwrap(), AutotuneMode::On);
    assert_eq!(AutotuneMode::parse(Some(" off ")).unwrap(), AutotuneMode::Off);
    let err = AutotuneMode::parse(Some("yes")).unwrap_err().to_string();
    assert!(err.contains("RUDA_AUTOTUNE=\"yes\" is not valid") && err.contains("off"), "{err}");
    let cpu = Device::cpu();
    assert_eq!(AutotuneMode::for_device(&cpu, Some("on")).unwrap(), AutotuneMode::Off);
    assert_eq!(AutotuneMode::for_device(&cpu, None).unwrap(), AutotuneMode::Off);
    assert!(AutotuneMode::for_device(&cpu, Some("maybe")).is_err());
    assert!(DeviceFingerprint::of(&cpu).unwrap().is_none());
    assert!(Autotuner::for_device(&cpu).unwrap().is_none());
}

#[test]
fn cache_dir_falls_back_through_xdg_and_home() {
    assert_eq!(cache_dir(Some("/c"), Some("/x"), Some("/h")), Some(PathBuf::from("/c")));
    assert_eq!(cache_dir(None, Some("/x"), Some("/h")), Some(PathBuf::from("/x/ruda")));
    assert_eq!(cache_dir(Some(" "), None, Some("/h")), Some(PathBuf::from("/h/.cache/ruda")));
    assert_eq!(cache_dir(None, None, None), None);
}

#[test]
fn median_and_host_timing() {
    assert_eq!(median(&[]), None);
    assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    let stream = Device::cpu().default_stream();
    let mut launches = 0;
    let ms = measure_on_stream(&stream, 2, || {
        launches += 1;
        Ok(())
    })
    .unwrap();
    assert!(ms >= 0.0);
    assert_eq!(launches, 3 + 5 * 2, "warm-up plus samples");
    let mut n = 0;
    let err = measure_on_stream(&stream, 2, || {
        n += 1;
        if n == 4 {
            Err("launch failed".into())
        } else {
            Ok(())
        }
    });
    assert_eq!(err, Err("launch failed".into()));
}
