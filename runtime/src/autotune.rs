//! Autotuning: pick the fastest of an op's candidate configurations per GPU and problem key,
//! and remember every candidate's time (or error) in a per-device file cache.
//!
//! An op declares a [`CandidateSet`] (the heuristic default first) and a [`TuneKey`] (op,
//! dtype, shape bucketed to powers of two, alignment class). [`Autotuner::tune`] returns the
//! cached best when the entry's candidate checksum matches, else measures every candidate
//! with the caller's closure (warm-up, timed runs, median: [`measure_on_stream`]), records the
//! failures, persists the results and returns the fastest. A candidate that fails never panics:
//! its error is recorded and it is skipped. Tuning is off on the CPU device and with
//! `RUDA_AUTOTUNE=off`; then [`Autotuner::tune`] returns the heuristic default unmeasured.
//!
//! The cache file is `<cache dir>/autotune/<fingerprint>.json`, where the fingerprint digests
//! the device name, compute capability, driver version, compiler and its version
//! ([`DeviceFingerprint`]); a different GPU, driver or compiler reads a different file. Writes
//! go to a temporary file renamed over the old one, so readers never see half a file; a file
//! that does not parse is reported on stderr and replaced by a fresh cache.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::device::Device;
use crate::env::{var, AutotuneMode, RUDA_AUTOTUNE};
use crate::error::{Result, RuntimeError};
use crate::stream::Stream;

pub const RUDA_CACHE_DIR: &str = "RUDA_CACHE_DIR";

impl AutotuneMode {
    /// The mode for `device` given a `RUDA_AUTOTUNE` value: off on the CPU device whatever the
    /// value (an invalid value is still an error, so that a typo is not silently ignored).
    pub fn for_device(device: &Device, value: Option<&str>) -> Result<AutotuneMode> {
        let mode = AutotuneMode::parse(value)?;
        Ok(if device.is_cpu() { AutotuneMode::Off } else { mode })
    }

    /// [`AutotuneMode::for_device`] with `RUDA_AUTOTUNE`.
    pub fn from_env(device: &Device) -> Result<AutotuneMode> {
        AutotuneMode::for_device(device, var(RUDA_AUTOTUNE).as_deref())
    }
}

/// The cache folder: `RUDA_CACHE_DIR`, else `$XDG_CACHE_HOME/ruda`, else `$HOME/.cache/ruda`
/// (arguments are those variables' values; `None` = unset). `None` when none is set.
pub fn cache_dir(ruda_cache_dir: Option<&str>, xdg_cache_home: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    let set = |v: Option<&str>| v.filter(|s| !s.trim().is_empty()).map(PathBuf::from);
    set(ruda_cache_dir)
        .or_else(|| set(xdg_cache_home).map(|x| x.join("ruda")))
        .or_else(|| set(home).map(|h| h.join(".cache").join("ruda")))
}

/// [`cache_dir`] from the process environment; an error naming the variables when none is set.
pub fn cache_dir_from_env() -> Result<PathBuf> {
    cache_dir(var(RUDA_CACHE_DIR).as_deref(), var("XDG_CACHE_HOME").as_deref(), var("HOME").as_deref()).ok_or_else(
        || RuntimeError::InvalidEnv {
            var: RUDA_CACHE_DIR,
            value: String::new(),
            accepted:
                "a folder for RUDA's caches (unset: $XDG_CACHE_HOME/ruda, then $HOME/.cache/ruda; neither is set)"
                    .into(),
        },
    )
}

/// Round `d` up to a power of two (0 stays 0), so that nearby shapes share a tuning entry.
pub fn bucket(d: u64) -> u64 {
    if d == 0 {
        0
    } else {
        d.checked_next_power_of_two().unwrap_or(1 << 63)
    }
}

/// The alignment class of a launch: the largest power of two, at most 16, dividing every byte
/// address and byte stride in `values` (16 when `values` is empty).
pub fn alignment_class(values: &[u64]) -> u32 {
    let mut a = 16u64;
    for &v in values {
        while a > 1 && v % a != 0 {
            a /= 2;
        }
    }
    a as u32
}

/// What a tuning result applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TuneKey {
    pub op: String,
    pub dtype: String,
    /// Each dimension rounded up to a power of two ([`bucket`]).
    pub shape_bucket: Vec<u64>,
    /// [`alignment_class`] of the inputs.
    pub alignment: u32,
}

impl TuneKey {
    /// The key of `op` on `dtype` tensors of `shape`, bucketing each dimension.
    pub fn new(op: &str, dtype: &str, shape: &[u64], alignment: u32) -> TuneKey {
        TuneKey {
            op: op.into(),
            dtype: dtype.into(),
            shape_bucket: shape.iter().map(|&d| bucket(d)).collect(),
            alignment,
        }
    }
}

impl fmt::Display for TuneKey {
    /// `gemv bf16 1x4096x4096 align16`: also the key's name in the cache file.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.shape_bucket.iter().map(u64::to_string).collect();
        write!(f, "{} {} {} align{}", self.op, self.dtype, dims.join("x"), self.alignment)
    }
}

/// One configuration an op can run in, named as the op parses it back (`splits=4`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Candidate {
    pub name: String,
}

impl Candidate {
    pub fn new(name: impl Into<String>) -> Candidate {
        Candidate { name: name.into() }
    }
}

/// An op's candidates, its heuristic default first, and a digest of the kernels they run (the
/// IR hashes), so that a changed candidate list or changed kernels invalidate cached choices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CandidateSet {
    pub candidates: Vec<Candidate>,
    pub ir_hash: u64,
}

impl CandidateSet {
    pub fn new(names: impl IntoIterator<Item = impl Into<String>>, ir_hash: u64) -> CandidateSet {
        CandidateSet { candidates: names.into_iter().map(Candidate::new).collect(), ir_hash }
    }

    /// FNV-1a over the candidate names (each ending in a newline) and the IR hash.
    pub fn checksum(&self) -> u64 {
        let mut text = String::new();
        for c in &self.candidates {
            text.push_str(&c.name);
            text.push('\n');
        }
        text.push_str(&format!("ir={:016x}", self.ir_hash));
        ruda_ir::fnv1a64(text.as_bytes())
    }
}

/// Everything about the device and compiler that makes a tuning result valid.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFingerprint {
    pub device_name: String,
    pub compute_capability: (u32, u32),
    pub driver_version: String,
    pub compiler: String,
    /// [`crate::Compiler::identity`].
    pub compiler_version: String,
}

impl DeviceFingerprint {
    /// The fingerprint of a GPU as it compiles now; `None` on the CPU device.
    pub fn of(device: &Device) -> Result<Option<DeviceFingerprint>> {
        let (Some(info), Some(compiler)) = (device.cuda_info(), device.compiler()) else { return Ok(None) };
        Ok(Some(DeviceFingerprint {
            device_name: info.name.clone(),
            compute_capability: info.compute_capability,
            driver_version: info.driver_version.to_string(),
            compiler: compiler.name().into(),
            compiler_version: compiler.identity()?,
        }))
    }

    /// FNV-1a 64 of the canonical text: names the cache file.
    pub fn digest(&self) -> u64 {
        let text = format!(
            "device={}\ncc={}.{}\ndriver={}\ncompiler={}\ncompiler_version={}\n",
            self.device_name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.driver_version,
            self.compiler,
            self.compiler_version
        );
        ruda_ir::fnv1a64(text.as_bytes())
    }

    /// `<cache dir>/autotune/<digest as 16 hex digits>.json`.
    pub fn cache_file(&self, cache_dir: &Path) -> PathBuf {
        cache_dir.join("autotune").join(format!("{:016x}.json", self.digest()))
    }
}

impl fmt::Display for DeviceFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (compute capability {}.{}, driver CUDA {}, compiler {})",
            self.device_name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.driver_version,
            self.compiler_version
        )
    }
}

/// One candidate's measurement: its median time, or why it could not run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateResult {
    pub candidate: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The cached outcome of tuning one key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneEntry {
    pub key: TuneKey,
    /// [`CandidateSet::checksum`] as 16 hex digits (JSON numbers lose 64-bit precision).
    pub candidate_checksum: String,
    /// In the order of the candidate set.
    pub results: Vec<CandidateResult>,
    pub best: String,
}

impl TuneEntry {
    /// The candidates that ran, fastest first (ties keep the candidate order).
    pub fn ranking(&self) -> Vec<(&str, f64)> {
        let mut ok: Vec<(&str, f64)> =
            self.results.iter().filter_map(|r| r.median_ms.map(|ms| (r.candidate.as_str(), ms))).collect();
        ok.sort_by(|a, b| a.1.total_cmp(&b.1));
        ok
    }
}

/// The on-disk form of one device's cache.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CacheFile {
    pub fingerprint: DeviceFingerprint,
    /// By [`TuneKey`]'s text.
    pub entries: BTreeMap<String, TuneEntry>,
}

impl CacheFile {
    /// Read and parse a cache file (an error for a missing or unparsable one).
    pub fn read(path: &Path) -> std::result::Result<CacheFile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: not a RUDA autotune cache: {e}", path.display()))
    }

    /// A human-readable listing: the device, then per key the best and every candidate.
    pub fn render(&self) -> String {
        let mut s = format!("{}\n", self.fingerprint);
        for (name, e) in &self.entries {
            s.push_str(&format!("  {name}: best {}\n", e.best));
            for r in &e.results {
                match (&r.median_ms, &r.error) {
                    (Some(ms), _) => s.push_str(&format!("    {:<12} {ms:.4} ms\n", r.candidate)),
                    (None, Some(err)) => s.push_str(&format!("    {:<12} failed: {err}\n", r.candidate)),
                    (None, None) => s.push_str(&format!("    {:<12} not measured\n", r.candidate)),
                }
            }
        }
        s
    }
}

/// What [`Autotuner::tune`] chose.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The chosen candidate's index in the candidate set, and the candidate.
    pub index: usize,
    pub candidate: Candidate,
    /// Its median time; `None` when tuning is off.
    pub median_ms: Option<f64>,
    /// Whether the choice came from the cache (no measurement).
    pub cached: bool,
}

/// One device's autotuning cache, loaded once and written through on every change.
pub struct Autotuner {
    mode: AutotuneMode,
    path: PathBuf,
    file: Mutex<CacheFile>,
    /// Why the file on disk was not used, when it existed and was unusable.
    load_warning: Option<String>,
}

impl Autotuner {
    /// The cache of the GPU `fingerprint` describes, under `cache_dir`. A missing file starts
    /// empty; an unreadable, corrupt or foreign one is reported on stderr and started afresh.
    pub fn open(cache_dir: &Path, fingerprint: DeviceFingerprint, mode: AutotuneMode) -> Autotuner {
        let path = fingerprint.cache_file(cache_dir);
        let fresh = CacheFile { fingerprint: fingerprint.clone(), entries: BTreeMap::new() };
        let (file, load_warning) = if !path.exists() {
            (fresh, None)
        } else {
            match CacheFile::read(&path) {
                Ok(f) if f.fingerprint == fingerprint => (f, None),
                Ok(f) => (fresh, Some(format!("{}: written for {}, not {fingerprint}", path.display(), f.fingerprint))),
                Err(e) => (fresh, Some(e)),
            }
        };
        if let Some(w) = &load_warning {
            eprintln!("ruda: autotune cache ignored, starting afresh: {w}");
        }
        Autotuner { mode, path, file: Mutex::new(file), load_warning }
    }

    /// The tuner for `device`: `None` on the CPU device (tuning is off there); on a GPU its
    /// cache under [`cache_dir_from_env`], in the mode `RUDA_AUTOTUNE` says.
    pub fn for_device(device: &Device) -> Result<Option<Autotuner>> {
        let mode = AutotuneMode::from_env(device)?;
        let Some(fp) = DeviceFingerprint::of(device)? else { return Ok(None) };
        Ok(Some(Autotuner::open(&cache_dir_from_env()?, fp, mode)))
    }

    pub fn mode(&self) -> AutotuneMode {
        self.mode
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the existing file was discarded when opening, if it was.
    pub fn load_warning(&self) -> Option<&str> {
        self.load_warning.as_deref()
    }

    /// A copy of the cache as it stands.
    pub fn snapshot(&self) -> CacheFile {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheFile> {
        // The map is replaced whole on every change, so a poisoned lock still holds a valid one.
        self.file.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The best candidate of `set` for `key`. Off: the first (heuristic) candidate. On: the
    /// cached best when the entry was made with this candidate set, else `measure` runs each
    /// candidate (returning its median in ms, or an error message), errors are recorded, and
    /// the fastest wins and is persisted. An error when the set is empty, when every candidate
    /// fails (listing each failure), or when the cache cannot be written.
    pub fn tune(
        &self,
        key: &TuneKey,
        set: &CandidateSet,
        mut measure: impl FnMut(&Candidate) -> std::result::Result<f64, String>,
    ) -> Result<Choice> {
        let Some(first) = set.candidates.first() else {
            return Err(RuntimeError::InvalidLaunch {
                kernel: key.op.clone(),
                message: format!("autotuning {key}: no candidates"),
            });
        };
        if self.mode == AutotuneMode::Off {
            return Ok(Choice { index: 0, candidate: first.clone(), median_ms: None, cached: false });
        }
        let checksum = format!("{:016x}", set.checksum());
        let name = key.to_string();
        if let Some(e) = self.lock().entries.get(&name).filter(|e| e.candidate_checksum == checksum) {
            if let Some(choice) = choose(set, &e.best, e.ranking().first().map(|r| r.1), true) {
                return Ok(choice);
            }
        }
        let results: Vec<CandidateResult> = set
            .candidates
            .iter()
            .map(|c| match measure(c) {
                Ok(ms) if ms.is_finite() && ms >= 0.0 => {
                    CandidateResult { candidate: c.name.clone(), median_ms: Some(ms), error: None }
                }
                Ok(ms) => CandidateResult {
                    candidate: c.name.clone(),
                    median_ms: None,
                    error: Some(format!("measured {ms} ms")),
                },
                Err(e) => CandidateResult { candidate: c.name.clone(), median_ms: None, error: Some(e) },
            })
            .collect();
        let mut entry = TuneEntry { key: key.clone(), candidate_checksum: checksum, results, best: String::new() };
        let Some((best, ms)) = entry.ranking().first().map(|&(b, ms)| (b.to_string(), ms)) else {
            let failures: Vec<String> = entry
                .results
                .iter()
                .map(|r| format!("{}: {}", r.candidate, r.error.as_deref().unwrap_or("?")))
                .collect();
            return Err(RuntimeError::Launch {
                kernel: key.op.clone(),
                message: format!("autotuning {key}: every candidate failed ({})", failures.join("; ")),
            });
        };
        entry.best = best.clone();
        self.update(|f| {
            f.entries.insert(name, entry);
        })?;
        // `best` came from `set`, so it is found.
        choose(set, &best, Some(ms), false).ok_or_else(|| RuntimeError::InvalidLaunch {
            kernel: key.op.clone(),
            message: format!("autotuning {key}: the best candidate `{best}` is not in the set"),
        })
    }

    /// A cached choice failed to launch: evict `key`'s entry (persisted) and return the next
    /// candidate of its ranking after `failed`, or the first candidate of `set` that is not
    /// `failed` when the entry had no other. The next [`Autotuner::tune`] measures afresh.
    pub fn evict_and_fall_back(&self, key: &TuneKey, set: &CandidateSet, failed: &str) -> Result<Choice> {
        let name = key.to_string();
        let evicted = self.lock().entries.get(&name).cloned();
        self.evict(key)?;
        let next = evicted
            .as_ref()
            .and_then(|e| {
                e.ranking().into_iter().find(|(c, _)| *c != failed).and_then(|(c, ms)| choose(set, c, Some(ms), false))
            })
            .or_else(|| {
                set.candidates
                    .iter()
                    .position(|c| c.name != failed)
                    .and_then(|i| choose(set, &set.candidates[i].name, None, false))
            });
        next.ok_or_else(|| RuntimeError::Launch {
            kernel: key.op.clone(),
            message: format!("autotuning {key}: `{failed}` failed to launch and there is no other candidate"),
        })
    }

    /// Remove `key`'s entry, if any, and persist.
    pub fn evict(&self, key: &TuneKey) -> Result<()> {
        let name = key.to_string();
        if !self.lock().entries.contains_key(&name) {
            return Ok(());
        }
        self.update(|f| {
            f.entries.remove(&name);
        })
    }

    /// Apply `change` and write the file atomically (temporary file, then rename).
    fn update(&self, change: impl FnOnce(&mut CacheFile)) -> Result<()> {
        let mut file = self.lock();
        change(&mut file);
        let io = |path: &Path, source: std::io::Error| RuntimeError::Io { path: path.to_path_buf(), source };
        let text = serde_json::to_string_pretty(&*file).map_err(|e| io(&self.path, std::io::Error::other(e)))?;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        }
        let tmp = self.path.with_extension(format!("json.tmp.{}", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(&self.path, e)
        })
    }
}

fn choose(set: &CandidateSet, name: &str, median_ms: Option<f64>, cached: bool) -> Option<Choice> {
    let index = set.candidates.iter().position(|c| c.name == name)?;
    Some(Choice { index, candidate: set.candidates[index].clone(), median_ms, cached })
}

/// The median of `samples` (the mean of the middle two for an even count); `None` when empty.
pub fn median(samples: &[f64]) -> Option<f64> {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(s[n / 2]),
        _ => Some((s[n / 2 - 1] + s[n / 2]) / 2.0),
    }
}

/// Warm-up runs before timing: the first launch compiles and loads the module.
const WARMUP_RUNS: usize = 3;
/// Timed samples; their median is the result.
const SAMPLES: usize = 5;

/// Time `launch` on `stream`: [`WARMUP_RUNS`] untimed launches, then [`SAMPLES`] samples of
/// `iters` launches each, timed by events recorded on `stream` before and after them (on the
/// GPU, so host overheads between launches count only where they starve the GPU); the result is the median of the samples' per-launch milliseconds. An error (the
/// launch's or the synchronisation's, as text) as soon as anything fails. On the CPU device
/// events are host timestamps, so it times the interpreter, which is only meaningful for tests.
pub fn measure_on_stream(
    stream: &Stream,
    iters: usize,
    mut launch: impl FnMut() -> std::result::Result<(), String>,
) -> std::result::Result<f64, String> {
    let iters = iters.max(1);
    let err = |e: RuntimeError| e.to_string();
    for _ in 0..WARMUP_RUNS {
        launch()?;
    }
    stream.synchronize().map_err(err)?;
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let start = stream.record_event().map_err(err)?;
        for _ in 0..iters {
            launch()?;
        }
        let end = stream.record_event().map_err(err)?;
        samples.push(start.elapsed_ms(&end).map_err(err)? / iters as f64);
    }
    median(&samples).ok_or_else(|| "no samples".to_string())
}
