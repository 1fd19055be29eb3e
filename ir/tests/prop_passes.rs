//! Every pass in `all_passes()`, and the default pipeline, on generated kernels
//! (`ruda_ir::gen`): the result still verifies and the interpreter's outputs are bit-identical
//! before and after. Two runs: 256 cases per pipeline (`PROPTEST_CASES` overrides) from a
//! fixed seed (`PROPTEST_RNG_SEED` overrides), the same every time; and 4096 cases per pipeline
//! (`RUDA_PROP_CASES` overrides) from a seed drawn afresh on every run and printed, so that
//! coverage grows from run to run (`RUDA_PROP_SEED=<printed>` replays it). Each case is a byte
//! string the generator reads, so proptest's shrinking of the bytes shrinks the kernel. Every
//! pipeline sees the same cases, so each case generates and runs its kernel once and checks
//! every pipeline on it; a run's cases are split into four shards with seeds derived from the
//! run's, on every core.
//!
//! A failure writes the shrunk kernel as a `test optimize` file test to
//! `ir/filetests/regressions/` (where the file-test harness keeps checking it after the
//! generator has changed, which makes proptest seeds stale), prints its path and text, and the
//! test fails.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestError, TestRunner};
use ruda_ir::gen::{filetest, generate, run_generated_on, Entropy, GenConfig, GeneratedKernel};
use ruda_ir::passes::{all_passes, default_pipeline, run_pipeline, Pass};
use ruda_ir::{fnv1a64, print_kernel, verify, verify_form, BinaryOp, Kernel, Op};

/// The generator's input: proptest shrinks it toward fewer and smaller bytes, which the
/// generator reads as simpler choices.
fn entropy() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..2048)
}

fn config() -> Config {
    let mut cfg = Config { failure_persistence: None, ..Config::default() };
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        cfg.rng_seed = RngSeed::Fixed(0x5275_6461);
    }
    cfg
}

/// The drawn run's seed: `RUDA_PROP_SEED`, or a fresh one from the clock and the process id.
fn drawn_seed() -> u64 {
    if let Ok(s) = std::env::var("RUDA_PROP_SEED") {
        return s.trim().parse().unwrap_or_else(|_| panic!("RUDA_PROP_SEED must be a number, got {s:?}"));
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    fnv1a64(format!("{nanos} {}", std::process::id()).as_bytes())
}

/// The drawn run's configuration: fewer cases than the fixed run, sized to CI's time budget.
fn drawn_config(seed: u64) -> Config {
    let cases = match std::env::var("RUDA_PROP_CASES") {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("RUDA_PROP_CASES must be a number, got {s:?}")),
        Err(_) => 4096,
    };
    Config { failure_persistence: None, cases, rng_seed: RngSeed::Fixed(seed), ..Config::default() }
}

fn kernel_from(bytes: &[u8]) -> GeneratedKernel {
    generate(&mut Entropy::from_bytes(bytes), &GenConfig::default())
}

/// The property for one pipeline on one generated kernel.
fn preserves(bytes: &[u8], passes: &[Box<dyn Pass>]) -> Result<(), String> {
    let (g, before) = generated(bytes)?;
    preserved(&g, &before, passes)
}

/// The property for every pipeline on one generated kernel, which is generated and run once
/// (most of a case's time): the first failing pipeline's name and why.
fn preserves_all(bytes: &[u8], pipelines: &[(String, Vec<Box<dyn Pass>>)]) -> Result<(), String> {
    let (g, before) = generated(bytes)?;
    for (name, passes) in pipelines {
        preserved(&g, &before, passes).map_err(|why| format!("pipeline `{name}`: {why}"))?;
    }
    Ok(())
}

/// Each case runs its kernels on one interpreter thread: the shards already keep every core
/// busy, and a thread pool per run of a kernel this small costs more than it runs (blocks are
/// independent, so how they are scheduled is `prop_gen`'s test, not this one's).
const INTERP_THREADS: Option<usize> = Some(1);

/// The kernel `bytes` generate, and its outputs before optimization.
fn generated(bytes: &[u8]) -> Result<(GeneratedKernel, Vec<Vec<u8>>), String> {
    let g = kernel_from(bytes);
    verify(&g.kernel).map_err(|e| format!("generator bug: the kernel does not verify: {e}"))?;
    let before = run_generated_on(&g, &g.kernel, INTERP_THREADS)
        .map_err(|e| format!("generator bug: the kernel fails to run: {e}"))?;
    Ok((g, before))
}

/// `passes` on `g` still verify and give the outputs `before`.
fn preserved(g: &GeneratedKernel, before: &[Vec<u8>], passes: &[Box<dyn Pass>]) -> Result<(), String> {
    let mut optimized = g.kernel.clone();
    run_pipeline(&mut optimized, passes, None).map_err(|e| e.to_string())?;
    verify_form(&optimized).map_err(|e| format!("the optimized kernel does not verify: {e}"))?;
    let after = run_generated_on(g, &optimized, INTERP_THREADS)
        .map_err(|e| format!("the optimized kernel fails to run: {e}"))?;
    if let Some(i) = (0..before.len()).find(|&i| before[i] != after[i]) {
        let param = &g.kernel.params.iter().filter(|p| g.kernel.ty(p.value).is_ptr()).nth(i);
        let name = param.map_or("?".to_string(), |p| format!("{} {}", p.value, p.name));
        let first = before[i].iter().zip(&after[i]).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "buffer `{name}` differs after optimization, first at byte {first}\noptimized kernel:\n{}",
            print_kernel(&optimized)
        ));
    }
    Ok(())
}

/// Shrink a failing input further than proptest's generic shrinking does: zero bytes are
/// the generator's simplest choices, so find the shortest failing prefix (the rest reads as
/// zeros), then zero the remaining bytes one by one where the failure persists.
fn minimize(bytes: &[u8], fails: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut best = bytes.to_vec();
    let mut len = 0;
    while len < best.len() && !fails(&best[..len]) {
        len = (len * 2).max(1);
    }
    if len < best.len() {
        // Binary search below the first failing power of two (a heuristic: failing is not
        // monotone in the length, so check the result).
        let (mut lo, mut hi) = (len / 2, len);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if fails(&best[..mid]) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        if fails(&best[..hi]) {
            best.truncate(hi);
        } else {
            best.truncate(len);
        }
    }
    // Zeroing one byte can enable zeroing an earlier one: repeat while it helps.
    for _ in 0..3 {
        let mut changed = false;
        for i in 0..best.len() {
            if best[i] != 0 {
                let old = std::mem::replace(&mut best[i], 0);
                if fails(&best) {
                    changed = true;
                } else {
                    best[i] = old;
                }
            }
        }
        if !changed {
            break;
        }
    }
    best
}

/// The shrunk kernel as a file test.
fn regression(pipeline: &str, bytes: &[u8], why: &str) -> Result<String, String> {
    let g = kernel_from(bytes);
    let comment = format!("Found by ir/tests/prop_passes.rs: {}", why.lines().next().unwrap_or(""));
    filetest(&g, pipeline, &comment).map_err(|e| format!("(no file test: the kernel fails to run: {e})"))
}

/// Where shrunk failures go: the folder the file-test harness runs in full.
fn regressions_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/filetests/regressions"))
}

/// Write a failure's file test to `dir` as `<pipeline>-<hash of its text>.rir`.
fn persist(dir: &std::path::Path, pipeline: &str, text: &str) -> std::io::Result<PathBuf> {
    let file = dir.join(format!("{}-{:016x}.rir", pipeline.replace(',', "+"), fnv1a64(text.as_bytes())));
    std::fs::create_dir_all(dir)?;
    std::fs::write(&file, text)?;
    Ok(file)
}

/// The failure report: the shrunk kernel as a file test, written to `dir`.
fn report(dir: &std::path::Path, pipeline: &str, bytes: &[u8], why: &str) -> String {
    let text = match regression(pipeline, bytes, why) {
        Ok(text) => text,
        Err(e) => return format!("pipeline `{pipeline}`: {why}\n{e}"),
    };
    let mut out = format!("pipeline `{pipeline}`: {why}\n");
    match persist(dir, pipeline, &text) {
        Ok(file) => {
            out.push_str(&format!("written to {} (commit it with the fix; the file tests run it):\n", file.display()))
        }
        Err(e) => out.push_str(&format!("could not write it to {}: {e}\n", dir.display())),
    }
    out.push_str(&text);
    out
}

/// Run the property for every pass and the default pipeline under `config`; the reports of
/// the failing ones, their shrunk kernels written to `dir`.
fn check_pipelines(config: Config, dir: &std::path::Path) -> Vec<String> {
    let mut pipelines: Vec<(String, Vec<Box<dyn Pass>>)> =
        all_passes().into_iter().map(|p| (p.name().to_string(), vec![p])).collect();
    pipelines.push(("default".to_string(), default_pipeline()));
    check(&pipelines, config, dir)
}

/// The cases of a run are split into this many shards, each from its own seed derived from the
/// run's, run on as many cores as there are: a fixed count, so that a seed replays the same
/// cases on any machine.
const SHARDS: u64 = 4;

/// Shard `i` of the run `config`: its share of the cases, and a seed derived from the run's (a
/// random run stays random).
fn shard(config: &Config, i: u64) -> Config {
    let rng_seed = match config.rng_seed {
        RngSeed::Fixed(seed) => RngSeed::Fixed(fnv1a64(format!("{seed} shard {i}").as_bytes())),
        random => random,
    };
    Config { cases: config.cases.div_ceil(SHARDS as u32), rng_seed, ..config.clone() }
}

/// Every pipeline on the same cases under `config` (every case checks them all on one generated
/// kernel); the reports of the failing pipelines, each failure shrunk for its pipeline and
/// written to `dir`.
fn check(pipelines: &[(String, Vec<Box<dyn Pass>>)], config: Config, dir: &std::path::Path) -> Vec<String> {
    let next = AtomicU64::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(SHARDS as usize);
    // Per shard that fails: its shrunk input, or the runner's own error.
    let mut outcomes: Vec<(u64, Result<Vec<u8>, String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut failed = vec![];
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= SHARDS {
                            break failed;
                        }
                        let mut runner = TestRunner::new(shard(&config, i));
                        let property = |bytes: Vec<u8>| preserves_all(&bytes, pipelines).map_err(TestCaseError::fail);
                        match runner.run(&entropy(), property) {
                            Ok(()) => {}
                            Err(TestError::Fail(_, bytes)) => failed.push((i, Ok(bytes))),
                            Err(e) => failed.push((i, Err(format!("the property run (shard {i}): {e}")))),
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a property thread panicked")).collect()
    });
    outcomes.sort_by_key(|o| o.0);
    let mut failures = vec![];
    let mut reported = vec![false; pipelines.len()];
    for (_, outcome) in outcomes {
        let bytes = match outcome {
            Ok(bytes) => bytes,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        // Every pipeline that fails on this input, each shrunk on its own.
        for ((name, passes), reported) in pipelines.iter().zip(&mut reported) {
            if *reported || preserves(&bytes, passes).is_ok() {
                continue;
            }
            let bytes = minimize(&bytes, |b| preserves(b, passes).is_err());
            let why = preserves(&bytes, passes).err().unwrap_or_else(|| "(passes after minimizing)".to_string());
            failures.push(report(dir, name, &bytes, &why));
            *reported = true;
        }
    }
    failures
}

#[test]
fn passes_preserve_interpreter_results() {
    let failures = check_pipelines(config(), &regressions_dir());
    assert!(failures.is_empty(), "{} pipeline(s) failed:\n\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn passes_preserve_interpreter_results_on_a_drawn_seed() {
    let seed = drawn_seed();
    // Printed first, so that a run killed by a hang can be replayed too, and straight to
    // stderr (not through `eprintln!`, which the test harness captures), so that every CI log
    // shows it.
    let line = format!("prop_passes: drawn seed {seed} (replay with RUDA_PROP_SEED={seed})\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    let failures = check_pipelines(drawn_config(seed), &regressions_dir());
    assert!(
        failures.is_empty(),
        "{} pipeline(s) failed on the drawn seed (replay with RUDA_PROP_SEED={seed}):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn a_file_test_for_a_generated_kernel_parses() {
    let g = generate(&mut Entropy::from_seed(3), &GenConfig::default());
    let text = filetest(&g, "default", "a comment").expect("runs");
    let header: Vec<&str> = text.lines().take_while(|l| l.starts_with(';')).collect();
    assert_eq!(header[0], "; test optimize");
    assert_eq!(header[1], "; passes: default");
    assert!(header[2].starts_with("; launch grid="), "{}", header[2]);
    let args = header.iter().filter(|l| l.starts_with("; arg ")).count();
    assert_eq!(args, g.kernel.params.len());
    // The output buffer always changes.
    assert!(header.iter().any(|l| l.starts_with("; expect ")));
    assert!(header.contains(&";; a comment"));
    let parsed = ruda_ir::parse_kernel(&text).expect("the file parses as a kernel");
    assert_eq!(print_kernel(&parsed), print_kernel(&g.kernel));
}

/// Turns the first integer `add` into `sub`: a pass these tests must catch.
struct Broken;

impl Pass for Broken {
    fn name(&self) -> &'static str {
        "broken"
    }
    fn description(&self) -> &'static str {
        "a deliberately wrong pass"
    }
    fn run(&self, k: &mut Kernel) -> bool {
        let mut first = None;
        k.walk(|id, inst| {
            if let Op::Binary(BinaryOp::Add, a, _) = inst.op {
                if first.is_none() && k.ty(a).elem().is_int() {
                    first = Some(id);
                }
            }
        });
        let Some(id) = first else { return false };
        if let Op::Binary(op, ..) = &mut k.insts[id.index()].op {
            *op = BinaryOp::Sub;
        }
        true
    }
}

#[test]
fn a_wrong_pass_is_caught_and_shrunk() {
    let passes: Vec<Box<dyn Pass>> = vec![Box::new(Broken)];
    let mut runner = TestRunner::new(Config { cases: 64, ..config() });
    let result = runner.run(&entropy(), |bytes| preserves(&bytes, &passes).map_err(TestCaseError::fail));
    let Err(TestError::Fail(_, bytes)) = result else { panic!("the wrong pass went unnoticed: {result:?}") };
    let bytes = minimize(&bytes, |b| preserves(b, &passes).is_err());
    let why = preserves(&bytes, &passes).expect_err("the minimized input still fails");
    assert!(why.contains("differs after optimization") || why.contains("optimized kernel fails to run"), "{why}");
    let text = regression("broken", &bytes, &why).expect("the shrunk kernel runs");
    // Shrinking leaves little beyond the thread ids, the zeroing of shared memory and the
    // final stores (about 75 instructions).
    let kernel = ruda_ir::parse_kernel(&text).expect("parses");
    let mut insts = 0;
    kernel.walk(|_, _| insts += 1);
    assert!(insts < 120, "{insts} instructions after shrinking:\n{text}");
    assert!(text.len() < 30_000, "{} bytes:\n{text}", text.len());
    assert!(text.starts_with("; test optimize\n; passes: broken\n; launch grid="), "{text}");
    // One warp per block, and at most two blocks.
    let launch = text.lines().nth(2).unwrap_or_default();
    assert!(launch.ends_with(" block=32,1,1") && ["=1,1,1 ", "=2,1,1 "].iter().any(|g| launch.contains(g)), "{launch}");
}

#[test]
fn a_failure_is_written_as_a_file_test_and_reported() {
    let dir = std::env::temp_dir().join(format!("ruda-prop-regressions-{}", std::process::id()));
    let pipelines: Vec<(String, Vec<Box<dyn Pass>>)> = vec![("broken".to_string(), vec![Box::new(Broken)])];
    let failures = check(&pipelines, Config { cases: 64, ..config() }, &dir);
    assert_eq!(failures.len(), 1, "{failures:?}");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir).expect("the folder exists").flatten().map(|e| e.path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    assert!(name.starts_with("broken-") && name.ends_with(".rir"), "{name}");
    assert!(failures[0].contains(&format!("written to {}", file.display())), "{}", failures[0]);
    let text = std::fs::read_to_string(file).expect("readable");
    // The report carries the file's whole text, and the file is a kernel the harness parses.
    assert!(failures[0].ends_with(&text), "{}", failures[0]);
    assert!(text.starts_with("; test optimize\n; passes: broken\n"), "{text}");
    ruda_ir::parse_kernel(&text).expect("the file parses as a kernel");
    std::fs::remove_dir_all(&dir).expect("removed");
}
