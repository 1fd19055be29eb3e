//! The `ruda-llm` command, run as a built binary: `generate` prints exactly the examples' JSON
//! lines for every architecture, `tune` keeps its flags, and errors exit with their statuses
//! (`profile`'s own tests are in `profile.rs`), and `batch` prints one line per request then a
//! summary, each greedy request's ids those of `generate` with the same prompt.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ruda_llm::example;
use ruda_llm::ModelType;
use serde_json::{Map, Value};

use crate::common::fixture;

fn ruda_llm(args: &[OsString]) -> Output {
    Command::new(crate::common::ruda_llm()).args(args).output().expect("ruda-llm runs")
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The keys of a JSON line in the order they are printed (serde_json's map sorts them).
fn keys(line: &str) -> Vec<String> {
    let v: Map<String, Value> = serde_json::from_str(line).unwrap();
    let mut ks: Vec<(usize, String)> =
        v.keys().map(|k| (line.find(&format!("\"{k}\":")).unwrap(), k.clone())).collect();
    ks.sort();
    ks.into_iter().map(|(_, k)| k).collect()
}

/// A JSON line without its timings (they differ from run to run).
fn untimed(line: &str) -> Value {
    let mut v: Value = serde_json::from_str(line).unwrap();
    for timing in ["load_seconds", "prefill_ms", "decode_tokens_per_second"] {
        v.as_object_mut().unwrap().remove(timing);
    }
    v
}

/// `ruda-llm generate` with `args` against the example of `model_type` with the same arguments:
/// the same lines, keys in the same order, the same values but for timings.
fn same_as_example(model_type: ModelType, args: &[&str]) -> Vec<Value> {
    let out = ruda_llm(&[os(&["generate"]), os(args)].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let (mut want, mut notices) = (Vec::new(), Vec::new());
    let owned: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    example::run(model_type, &owned, &mut want, &mut notices).unwrap();
    let (got, want) = (stdout(&out), String::from_utf8(want).unwrap());
    assert_eq!(got.lines().count(), want.lines().count(), "{got}");
    for (g, w) in got.lines().zip(want.lines()) {
        assert_eq!(keys(g), keys(w));
        assert_eq!(untimed(g), untimed(w));
    }
    got.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn generate_prints_the_examples_lines_with_their_default_token_count() {
    for model_type in [ModelType::Qwen2, ModelType::Qwen3, ModelType::Qwen35] {
        let dir = example::bundled_model(model_type).display().to_string();
        let lines = same_as_example(model_type, &[&dir, "Hello"]);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["model_type"], model_type.name());
        let generated = lines[1]["generated_token_ids"].as_array().unwrap().len();
        let default = model_type.default_max_new_tokens();
        assert_eq!(default, if model_type == ModelType::Qwen35 { 8 } else { 32 });
        assert!(generated == default || lines[1]["stop_reason"] == "eos", "{generated} tokens: {}", lines[1]);
    }
}

#[test]
fn generate_runs_a_fixture_several_times() {
    let dir = fixture("qwen2-untied").display().to_string();
    let lines = same_as_example(ModelType::Qwen2, &[&dir, "Hello world", "3", "2"]);
    assert_eq!(lines.len(), 3);
    assert_eq!((lines[1]["run"].as_u64(), lines[2]["run"].as_u64()), (Some(1), Some(2)));
    assert_eq!(lines[1]["generated_token_ids"], lines[2]["generated_token_ids"]);
}

/// As in the examples, a prompt that starts with `-` (even `-h`) is a prompt, not a flag.
#[test]
fn a_prompt_may_start_with_a_dash() {
    let dir = fixture("qwen2-tied").display().to_string();
    for prompt in ["-hi", "-1"] {
        let lines = same_as_example(ModelType::Qwen2, &[&dir, prompt, "2"]);
        assert!(lines[1]["text"].as_str().unwrap().starts_with(prompt), "{}", lines[1]);
    }
}

#[test]
fn a_non_utf8_model_path_is_a_path() {
    let dir = std::env::temp_dir().join(format!("ruda-llm-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join(OsString::from_vec(b"model-\xff".to_vec()));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(fixture("qwen3"), &link).unwrap();
    let out = ruda_llm(&[os(&["generate"]), vec![link.into_os_string()], os(&["Hi", "2"])].concat());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 2);
}

#[test]
fn generate_errors_exit_1() {
    let dir = fixture("qwen2-tied").display().to_string();
    let cases: Vec<(Vec<OsString>, &str)> = vec![
        (os(&["generate"]), "MODEL_DIR"),
        (os(&["generate", &dir]), "PROMPT"),
        (os(&["generate", &dir, "Hi", "0"]), "MAX_NEW_TOKENS"),
        (os(&["generate", &dir, "Hi", "2", "x"]), "RUNS"),
        (os(&["generate", &dir, "Hi", "2", "1", "extra"]), "extra"),
        (os(&["generate", "/nonexistent/model", "Hi"]), "not a model directory"),
        (os(&["generate", &dir, ""]), "empty"),
        (vec!["generate".into(), dir.clone().into(), OsString::from_vec(b"bad \xff".to_vec())], "not valid UTF-8"),
    ];
    for (args, want) in cases {
        let out = ruda_llm(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{args:?}: expected {want:?} in {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn help_for_every_subcommand() {
    for (args, want) in [
        (os(&["--help"]), "generate"),
        (os(&["generate", "--help"]), "[MAX_NEW_TOKENS]"),
        (os(&["tune", "--help"]), "--prefill-tokens"),
        (os(&["help", "tune"]), "--context"),
        (os(&["--help"]), "profile"),
        (os(&["profile", "--help"]), "--gpu <NAME>"),
        (os(&["--help"]), "batch"),
        (os(&["batch", "--help"]), "--max-batch-tokens <N>"),
    ] {
        let out = ruda_llm(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(stdout(&out).contains(want), "{args:?}: {}", stdout(&out));
    }
}

fn bundled(model_type: ModelType) -> PathBuf {
    example::bundled_model(model_type)
}

fn tune(dir: &Path, flags: &[&str]) -> Output {
    ruda_llm(&[os(&["tune"]), vec![dir.as_os_str().to_owned()], os(flags)].concat())
}

#[test]
fn tune_keeps_its_flags_and_statuses() {
    let dir = bundled(ModelType::Qwen3);
    // Both spellings of a flag, on the interpreter (or a GPU when RUDA_DEVICE names one).
    for flags in [&["--context", "200", "--dtype", "f32"][..], &["--context=200", "--dtype=f32", "--prefill-tokens=64"]]
    {
        let out = tune(&dir, flags);
        assert_eq!(out.status.code(), Some(0), "{flags:?}: {}", stderr(&out));
        let text = stdout(&out);
        if text.starts_with("autotuning is off") {
            assert!(text.lines().any(|l| l == "attention_decode f32 1x4x2x64x200"), "{text}");
        }
    }
    for (flags, want) in [
        (&["--context", "x"][..], "--context"),
        (&["--dtype", "f64"], "f32, f16 or bf16"),
        (&["--prefill-tokens"], "--prefill-tokens"),
        (&["--bogus", "1"], "--bogus"),
        (&["--context", "0"], "context"),
    ] {
        let out = tune(&dir, flags);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{flags:?}: expected {want:?} in {}", stderr(&out));
    }
    for args in [os(&[]), os(&["tune"]), os(&["bogus"])] {
        assert_eq!(ruda_llm(&args).status.code(), Some(2), "{args:?}");
    }
}

/// `ruda-llm tune` takes a Qwen3.5 folder: the gated DeltaNet's products (its q/k/v blocks of
/// `in_proj_qkv`, `in_proj_z`, the gates, `out_proj`) and the gated attention's (a `q_proj` of
/// twice the query) besides the MLP's, and decode attention of the full-attention layers.
#[test]
fn tune_takes_a_qwen35_folder() {
    let out = tune(&bundled(ModelType::Qwen35), &["--context", "200", "--dtype", "f32"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    if text.starts_with("autotuning is off") {
        for line in ["gemv f32 1x160x48", "gemv f32 1x4x48", "gemv f32 1x192x48", "attention_decode f32 1x2x1x48x200"] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
    }
}

/// `ruda-llm batch` over `lines` (written to a file of the test's own) with `flags`.
fn batch(model_type: ModelType, name: &str, lines: &str, flags: &[&str]) -> Output {
    let file = std::env::temp_dir().join(format!("ruda-cli-batch-{}-{name}.jsonl", std::process::id()));
    std::fs::write(&file, lines).unwrap();
    let dir = bundled(model_type);
    let args =
        [os(&["batch"]), vec![dir.into_os_string(), "--prompts".into(), file.clone().into_os_string()], os(flags)];
    let out = ruda_llm(&args.concat());
    let _ = std::fs::remove_file(&file);
    out
}

#[test]
fn batch_prints_a_line_per_request_then_a_summary() {
    let prompts = ["Hello there", "The cat sat on", "A", "Hello there"];
    // A blank line is counted: the third prompt is line 3, index 3.
    let lines = format!(
        "{{\"prompt\": \"{}\"}}\n{{\"prompt\": \"{}\", \"max_new_tokens\": 3}}\n\n{{\"prompt\": \"{}\"}}\n{{\"prompt\": \"{}\"}}\n",
        prompts[0], prompts[1], prompts[2], prompts[3]
    );
    for model_type in [ModelType::Qwen2, ModelType::Qwen35] {
        let out =
            batch(model_type, "lines", &lines, &["--max-new-tokens", "5", "--max-active", "2", "--block-size", "4"]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stderr(&out).contains("4/4 done"), "progress on stderr: {}", stderr(&out));
        let text = stdout(&out);
        let got: Vec<&str> = text.lines().collect();
        assert_eq!(got.len(), 5, "{got:?}");
        let mut seen = Vec::new();
        for line in &got[..4] {
            let want = ["event", "index", "prompt_tokens", "generated_token_ids", "generated_text", "stop_reason"];
            assert_eq!(keys(line)[..6], want, "{line}");
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["event"], "request");
            let index = v["index"].as_u64().unwrap() as usize;
            seen.push(index);
            let prompt = prompts[if index > 2 { index - 1 } else { index }];
            let max_new = if index == 1 { "3" } else { "5" };
            // One request at a time through `generate`: the same greedy ids.
            let single = ruda_llm(
                &[os(&["generate"]), vec![bundled(model_type).into_os_string()], os(&[prompt, max_new])].concat(),
            );
            let single: Value = serde_json::from_str(stdout(&single).lines().last().unwrap()).unwrap();
            assert_eq!(v["generated_token_ids"], single["generated_token_ids"], "{model_type:?} line {index}");
            assert_eq!(v["generated_text"], single["generated_text"]);
            assert_eq!(v["stop_reason"], single["stop_reason"]);
        }
        seen.sort();
        assert_eq!(seen, [0, 1, 3, 4]);
        let summary: Value = serde_json::from_str(got[4]).unwrap();
        assert_eq!(keys(got[4])[..5], ["event", "requests", "generated_tokens", "seconds", "tokens_per_second"]);
        assert_eq!((summary["event"].as_str(), summary["requests"].as_u64()), (Some("summary"), Some(4)));
        let total: u64 = got[..4]
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["generated_token_ids"].as_array().unwrap().len() as u64)
            .sum();
        assert_eq!(summary["generated_tokens"].as_u64(), Some(total));
    }
}

#[test]
fn batch_stop_sequences_and_errors() {
    // The greedy reply of "Hello there" on the tiny Qwen2 is "�f<u s==": stopping at "<u" keeps "�f".
    let out = batch(
        ModelType::Qwen2,
        "stop",
        "{\"prompt\": \"Hello there\", \"stop\": [\"<u\"]}\n",
        &["--max-new-tokens", "6"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["generated_text"], "\u{fffd}f");
    for (name, lines, flags, want) in [
        ("badline", "{\"prompt\": \"a\"}\nnot json\n", &[][..], "line 2"),
        ("unknown", "{\"prompt\": \"a\", \"temprature\": 1}\n", &[][..], "line 1"),
        ("zero", "{\"prompt\": \"a\"}\n", &["--max-active", "0"][..], "--max-active"),
        ("empty", "\n", &[][..], "no prompts"),
    ] {
        let out = batch(ModelType::Qwen2, name, lines, flags);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{name}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{name}");
    }
    let missing = ruda_llm(&os(&["batch", "llm/models/tiny-qwen2", "--prompts", "/nonexistent/prompts.jsonl"]));
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("/nonexistent/prompts.jsonl"), "{}", stderr(&missing));
}

#[test]
fn batch_with_the_prefix_cache_hits_and_keeps_the_replies() {
    // The same long prompt four times, two at a time: the later pair finds the first pair's pages.
    let line = "{\"prompt\": \"The quick brown fox jumps over the lazy dog, again and again\"}\n";
    let lines = line.repeat(4);
    let flags = ["--max-new-tokens", "4", "--max-active", "2", "--block-size", "4"];
    let run = |extra: &[&str]| {
        let out = batch(ModelType::Qwen35, "prefix", &lines, &[&flags[..], extra].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        let mut replies: Vec<(u64, Value)> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["event"] == "request")
            .map(|v| (v["index"].as_u64().unwrap(), v["generated_token_ids"].clone()))
            .collect();
        replies.sort_by_key(|r| r.0);
        let summary: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        (replies, summary["prefix_hits"].as_u64().unwrap())
    };
    let (plain, no_hits) = run(&[]);
    let (cached, hits) = run(&["--prefix-cache"]);
    assert_eq!((no_hits, plain.len()), (0, 4));
    assert!(hits >= 2, "{hits} prefix hits");
    assert_eq!(plain, cached, "the prefix cache changes no reply");
}
