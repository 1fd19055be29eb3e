//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the same checks the
//! `cargo fuzz` targets run (`fuzz/src/lib.rs`, included here), so every input a campaign kept,
//! and every crash once fixed, stays a regression test without libFuzzer. The ignored test
//! `write_seed_corpus` (re)writes the seed inputs; see `docs/fuzzing.md`.

#[path = "../../fuzz/src/lib.rs"]
mod checks;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use ruda_ir::{print_kernel, print_kernel_with_locs};

/// `fuzz/corpus`: where the sources were built, else under the current folder (bundled test
/// executables run from the project root).
fn corpus_dir() -> PathBuf {
    let built = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus"));
    if built.is_dir() {
        built.to_path_buf()
    } else {
        PathBuf::from("fuzz/corpus")
    }
}

/// The inputs of one target, sorted (hidden files, such as libFuzzer's temporaries, skipped).
fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = corpus_dir().join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    files.sort();
    files
}

/// Run `check` on every input of `target`; fail listing every input that panicked.
fn replay(target: &str, check: fn(&[u8])) {
    let files = inputs(target);
    assert!(!files.is_empty(), "no corpus for `{target}`");
    let mut failures = vec![];
    for path in &files {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| check(&data))) {
            let what = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("--- {}\n{what}", path.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} `{target}` inputs fail:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn parse_corpus_replays() {
    replay("parse", checks::check_parse);
}

#[test]
fn pipeline_corpus_replays() {
    replay("pipeline", checks::check_pipeline);
}

/// Seeds longer than this are left out (libFuzzer's `-max_len` in docs/fuzzing.md; it also
/// keeps the committed corpus small).
const MAX_SEED_BYTES: usize = 16 * 1024;

/// Seeds: for `parse`, the first registered kernel of each family, plain and with locations
/// (each if at most [`MAX_SEED_BYTES`]), and the `interpret` and `compile` file tests
/// (`seed-ft-*`); for `pipeline`, a few pseudo-random byte strings (each
/// a different generated kernel).
/// `cargo test -p ruda-ops --test main fuzz_corpus -- --ignored` rewrites them.
#[test]
#[ignore = "writes the seed corpus into fuzz/corpus"]
fn write_seed_corpus() {
    let dir = corpus_dir();
    let parse = dir.join("parse");
    std::fs::create_dir_all(&parse).expect("create fuzz/corpus/parse");
    let mut families = std::collections::HashSet::new();
    for r in ruda_ops::registry::registry() {
        if !families.insert(r.family) {
            continue;
        }
        let k = r.build().unwrap_or_else(|e| panic!("{}: {e}", r.id));
        for (suffix, text) in [("rir", print_kernel(&k)), ("locs.rir", print_kernel_with_locs(&k))] {
            if text.len() <= MAX_SEED_BYTES {
                std::fs::write(parse.join(format!("seed-{}.{suffix}", r.id)), text).expect("write seed");
            }
        }
    }
    let filetests = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../ir/filetests"));
    for kind in ["interpret", "compile"] {
        for entry in std::fs::read_dir(filetests.join(kind)).expect("ir/filetests").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            std::fs::copy(entry.path(), parse.join(format!("seed-ft-{kind}-{name}"))).expect("copy a file test");
        }
    }
    let pipeline = dir.join("pipeline");
    std::fs::create_dir_all(&pipeline).expect("create fuzz/corpus/pipeline");
    // SplitMix64, so the seeds do not depend on a random-number crate.
    let mut state = 0x5eed_u64;
    for i in 0..12 {
        let bytes: Vec<u8> = (0..64 * (i + 1))
            .map(|_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                (z ^ (z >> 31)) as u8
            })
            .collect();
        std::fs::write(pipeline.join(format!("seed-{i:02}")), bytes).expect("write seed");
    }
}
