//! The pipeline API on the fixture models through the interpreter: streaming, stop sequences,
//! sampling, the examples' output, and clear errors for bad input.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{device, fixture};

use ruda_llm::example::{self, ExampleArgs};
use ruda_llm::{
    load_huggingface_qwen2_pipeline, load_huggingface_qwen3_pipeline, load_pipeline, ChatMessage, ChatRole,
    GenerateParams, GreedyGenerationConfig, LlmError, ModelType, Pipeline, PipelineOptions, SamplingConfig,
    SamplingGenerationConfig, StopReason, StreamControl,
};
use serde_json::Value;

fn pipeline(name: &str) -> Pipeline {
    let options = PipelineOptions { device: Some(device()), ..Default::default() };
    load_pipeline(fixture(name), &options).unwrap()
}

fn greedy(max_new_tokens: usize) -> GenerateParams {
    GenerateParams { max_new_tokens, ..Default::default() }
}

/// A copy of a fixture folder in a fresh temp dir, removed when dropped.
struct Copy(PathBuf);

impl Copy {
    fn of(name: &str) -> Copy {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ruda-llm-pipeline-{}-{name}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(fixture(name)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
        Copy(dir)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn load(&self) -> Result<Pipeline, LlmError> {
        load_pipeline(&self.0, &PipelineOptions { device: Some(device()), ..Default::default() })
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load_err(c: &Copy) -> String {
    match c.load() {
        Ok(_) => panic!("loading {} should fail", c.0.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn streaming_matches_the_whole_reply_and_can_stop() {
    let p = pipeline("qwen2-tied");
    let whole = p.generate("Hello world!", &greedy(10), false, false, |_, _| StreamControl::Continue).unwrap();
    assert_eq!(whole.generated_token_ids.len(), 10);
    assert_eq!(whole.stop_reason, StopReason::Length);
    assert!(!whole.stopped_on_eos);
    assert!(whole.text.starts_with("Hello world!") && whole.text.ends_with(&whole.generated_text));

    let (mut pieces, mut ids) = (Vec::new(), Vec::new());
    let streamed = p
        .generate("Hello world!", &greedy(10), false, false, |id, piece| {
            ids.push(id);
            pieces.push(piece.to_string());
            StreamControl::Continue
        })
        .unwrap();
    assert_eq!((&streamed.text, &streamed.generated_token_ids), (&whole.text, &whole.generated_token_ids));
    assert_eq!(pieces.concat(), whole.generated_text);
    assert_eq!(ids, whole.generated_token_ids, "one call per token");

    let mut calls = 0;
    let stopped = p
        .generate("Hello world!", &greedy(10), false, false, |_, _| {
            calls += 1;
            if calls == 2 {
                StreamControl::Stop
            } else {
                StreamControl::Continue
            }
        })
        .unwrap();
    assert_eq!(stopped.stop_reason, StopReason::Callback);
    assert_eq!(stopped.generated_token_ids.len(), 2);
    assert_eq!(stopped.generated_token_ids[..], whole.generated_token_ids[..stopped.generated_token_ids.len()]);
}

#[test]
fn stop_sequences_cut_the_reply() {
    let p = pipeline("qwen2-tied");
    let whole = p.generate("Hello world!", &greedy(12), false, false, |_, _| StreamControl::Continue).unwrap();
    // A stop sequence taken from the middle of the greedy reply.
    let chars: Vec<char> = whole.generated_text.chars().collect();
    assert!(chars.len() >= 6, "reply too short: {:?}", whole.generated_text);
    let stop: String = chars[3..5].iter().collect();
    let cut = whole.generated_text.find(&stop).unwrap();
    let params = GenerateParams { stop_sequences: vec![stop.clone()], ..greedy(12) };
    let mut streamed = String::new();
    let out = p
        .generate("Hello world!", &params, false, false, |_, piece| {
            streamed.push_str(piece);
            StreamControl::Continue
        })
        .unwrap();
    assert_eq!(out.stop_reason, StopReason::StopSequence);
    assert_eq!(out.generated_text, whole.generated_text[..cut]);
    assert_eq!(streamed, out.generated_text, "the stream never shows the stop sequence");
    assert_eq!(out.text, format!("Hello world!{}", out.generated_text));
}

#[test]
fn eos_stops_generation() {
    let p = pipeline("qwen3");
    let whole = p.generate("Hello world!", &greedy(6), false, false, |_, _| StreamControl::Continue).unwrap();
    // Declare the third generated token an EOS: generation ends right after it.
    let eos = whole.generated_token_ids[2];
    let first = whole.generated_token_ids.iter().position(|&t| t == eos).unwrap();
    let params = GreedyGenerationConfig { max_new_tokens: 6, eos_token_ids: vec![eos] };
    let out = p.generate_text("Hello world!", params, false, false).unwrap();
    assert!(out.stopped_on_eos);
    assert_eq!(out.stop_reason, StopReason::Eos);
    assert_eq!(out.generated_token_ids, whole.generated_token_ids[..=first]);
}

#[test]
fn sampling_is_reproducible_per_seed() {
    let p = pipeline("qwen2-untied");
    let config = |seed| SamplingGenerationConfig {
        max_new_tokens: 8,
        eos_token_ids: vec![],
        sampling: SamplingConfig { temperature: 1.5, top_k: 0, top_p: 1.0, seed: Some(seed), min_p: 0.0 },
    };
    let a = p.generate_text_sampled("Hello", config(7), false, true).unwrap();
    let b = p.generate_text_sampled("Hello", config(7), false, true).unwrap();
    assert_eq!(a.generated_token_ids, b.generated_token_ids);
    let others: Vec<Vec<u32>> = (8..12)
        .map(|s| p.generate_text_sampled("Hello", config(s), false, true).unwrap().generated_token_ids)
        .collect();
    assert!(others.iter().any(|o| *o != a.generated_token_ids), "every seed drew the same tokens");
    // top_k = 1 is the greedy reply.
    let top1 = SamplingGenerationConfig { sampling: SamplingConfig { top_k: 1, ..config(3).sampling }, ..config(3) };
    let greedy_ids =
        p.generate("Hello", &greedy(8), false, true, |_, _| StreamControl::Continue).unwrap().generated_token_ids;
    assert_eq!(p.generate_text_sampled("Hello", top1, false, true).unwrap().generated_token_ids, greedy_ids);
}

#[test]
fn chat_rendering_and_defaults_come_from_the_model_folder() {
    let p = load_huggingface_qwen3_pipeline(fixture("qwen3"), &device()).unwrap();
    let messages = [ChatMessage::new(ChatRole::User, "Hi")];
    let thinking_off = p.render_chat_thinking(&messages, true, false).unwrap();
    assert!(thinking_off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{thinking_off:?}");
    assert!(p.render_chat(&messages, true).unwrap().ends_with("<|im_start|>assistant\n"));
    assert_eq!(p.loaded.default_eos_token_ids, vec![399, 397]);
    let sampling = p.default_sampling();
    assert_eq!((sampling.temperature, sampling.top_k, sampling.top_p), (0.6, 20, 0.95));
    let params = p.default_generate_params();
    assert!(params.sampling.is_some(), "generation_config.json says do_sample");
}

#[test]
fn bad_input_is_a_clear_error() {
    let p = pipeline("qwen2-tied");
    let err = |r: Result<ruda_llm::GeneratedText, LlmError>| r.unwrap_err().to_string();
    assert!(err(p.generate("", &greedy(4), false, false, |_, _| StreamControl::Continue)).contains("empty"));
    assert!(err(p.generate("Hi", &greedy(0), false, false, |_, _| StreamControl::Continue)).contains("max_new_tokens"));
    assert!(
        err(p.generate("Hi", &greedy(1000), false, false, |_, _| StreamControl::Continue)).contains("256 positions")
    );
    assert!(err(p.generate_from_ids(&[5000], &greedy(1), false, |_, _| StreamControl::Continue))
        .contains("outside the vocabulary"));
    let hot =
        GenerateParams { sampling: Some(SamplingConfig { temperature: -1.0, ..Default::default() }), ..greedy(2) };
    assert!(err(p.generate("Hi", &hot, false, false, |_, _| StreamControl::Continue)).contains("temperature"));

    // The wrong loader for the folder's architecture.
    let wrong = load_huggingface_qwen3_pipeline(fixture("qwen2-tied"), &device()).err().unwrap().to_string();
    assert!(wrong.contains("model_type \"qwen2\"") && wrong.contains("qwen3"), "{wrong}");
    assert!(load_huggingface_qwen2_pipeline(fixture("qwen2-tied"), &device()).is_ok());
}

#[test]
fn broken_model_folders_are_clear_errors() {
    let c = Copy::of("qwen2-tied");
    std::fs::remove_file(c.file("tokenizer.json")).unwrap();
    assert!(load_err(&c).contains("tokenizer.json"), "{}", load_err(&c));

    let c = Copy::of("qwen2-tied");
    let bytes = std::fs::read(c.file("model.safetensors")).unwrap();
    std::fs::write(c.file("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    assert!(load_err(&c).contains("model.safetensors"), "{}", load_err(&c));

    let c = Copy::of("qwen2-tied");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(c.file("config.json")).unwrap()).unwrap();
    config["hidden_size"] = Value::from(96);
    std::fs::write(c.file("config.json"), config.to_string()).unwrap();
    let e = load_err(&c);
    assert!(e.contains("shape") || e.contains("hidden"), "{e}");

    let c = Copy::of("qwen2-tied");
    std::fs::write(c.file("config.json"), "{ not json").unwrap();
    assert!(load_err(&c).contains("config.json"), "{}", load_err(&c));

    let missing =
        load_pipeline("/nonexistent/model", &PipelineOptions { device: Some(device()), ..Default::default() });
    assert!(missing.err().unwrap().to_string().contains("not a model directory"));
}

#[test]
fn example_arguments() {
    let args = |a: &[&str]| ExampleArgs::parse(ModelType::Qwen2, &a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    let bundled = args(&[]).unwrap();
    assert_eq!(bundled.model_dir, example::bundled_model(ModelType::Qwen2));
    assert_eq!((bundled.max_new_tokens, bundled.runs), (32, 1));
    let full = args(&["dir", "Hello", "8", "3"]).unwrap();
    assert_eq!((full.prompt.as_str(), full.max_new_tokens, full.runs), ("Hello", 8, 3));
    assert!(args(&["dir", "Hello", "8", "0"]).unwrap_err().to_string().contains("RUNS must be a positive integer"));
    assert!(args(&["dir", "Hello", "x"]).unwrap_err().to_string().contains("MAX_NEW_TOKENS"));
    assert!(args(&["dir"]).unwrap_err().to_string().contains("usage: qwen2_generate"));
    let qwen35 = ExampleArgs::parse(ModelType::Qwen35, &[] as &[&str]).unwrap();
    assert!(qwen35.model_dir.ends_with("tiny-qwen35"), "{}", qwen35.model_dir.display());
    assert_eq!(qwen35.max_new_tokens, 8, "qwen35_generate MODEL_DIR PROMPT [MAX_NEW_TOKENS=8]");
    let given = ExampleArgs::parse(ModelType::Qwen35, &["dir", "Hello"]).unwrap();
    assert_eq!((given.max_new_tokens, given.runs), (8, 1));
    let usage = ExampleArgs::parse(ModelType::Qwen35, &["dir"]).unwrap_err().to_string();
    assert!(usage.contains("usage: qwen35_generate") && usage.contains("MAX_NEW_TOKENS=8"), "{usage}");
}

/// The README's main command: the bundled model through the interpreter, JSON lines only on
/// standard output with the contract's keys in order, a notice on standard error.
#[test]
fn examples_print_the_json_contract_for_the_bundled_models() {
    for model_type in [ModelType::Qwen2, ModelType::Qwen3, ModelType::Qwen35] {
        let (mut out, mut notices) = (Vec::new(), Vec::new());
        let args: Vec<String> =
            [example::bundled_model(model_type).display().to_string(), "Hello".into(), "5".into(), "2".into()].into();
        example::run(model_type, &args, &mut out, &mut notices).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let keys = |line: &str| -> Vec<String> {
            let v: serde_json::Map<String, Value> = serde_json::from_str(line).unwrap();
            // serde_json sorts keys; recover the printed order from the text.
            let mut ks: Vec<(usize, String)> =
                v.keys().map(|k| (line.find(&format!("\"{k}\":")).unwrap(), k.clone())).collect();
            ks.sort();
            ks.into_iter().map(|(_, k)| k).collect()
        };
        assert_eq!(
            keys(lines[0]),
            ["event", "model_type", "load_seconds", "device", "dtype", "compiler", "parameters"]
        );
        for (run, line) in lines[1..].iter().enumerate() {
            assert_eq!(
                keys(line),
                [
                    "event",
                    "run",
                    "text",
                    "generated_text",
                    "generated_token_ids",
                    "stopped_on_eos",
                    "stop_reason",
                    "prompt_tokens",
                    "prefill_ms",
                    "decode_tokens_per_second"
                ]
            );
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["run"], run + 1);
            assert!(v["generated_token_ids"].as_array().unwrap().len() <= 5);
        }
        let load: Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(load["model_type"], model_type.name());
        if load["compiler"] == "interpreter" {
            assert_eq!(load["dtype"], "f32");
            assert!(String::from_utf8(notices).unwrap().contains("CPU"));
        }

        let wrong = if model_type == ModelType::Qwen2 { ModelType::Qwen3 } else { ModelType::Qwen2 };
        let err = example::run(wrong, &args, &mut Vec::new(), &mut Vec::new()).unwrap_err().to_string();
        assert!(err.contains("model_type"), "{err}");
    }
}

/// The model behind a pipeline through its `CausalLm` trait: a decode step gives the logits a
/// prefill of the same tokens gives, a cache is refused by a model it was not made for, and a
/// full cache is an error.
#[test]
fn the_causal_lm_trait_decodes_as_it_prefills() {
    let p = pipeline("qwen2-tied");
    let m = p.model();
    let ids = p.encode("Hello world!", false).unwrap();
    let mut whole = m.new_cache_with_capacity(ids.len()).unwrap();
    let want = m.forward(&mut whole, &ids, 4, false).unwrap().to_f32_vec().unwrap();
    assert_eq!(whole.len(), ids.len());

    let mut cache = m.new_cache_with_capacity(ids.len()).unwrap();
    m.forward(&mut cache, &ids[..ids.len() - 1], 4, false).unwrap();
    let workspace = m.decode_workspace().unwrap();
    let got = m.decode_step(&mut cache, ids[ids.len() - 1], &workspace).unwrap().to_f32_vec().unwrap();
    let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-4, "decode and prefill logits differ by {worst}");
    let full = m.decode_step(&mut cache, 1, &workspace).unwrap_err().to_string();
    assert!(full.contains("full"), "{full}");

    let other = pipeline("qwen2-untied");
    let mut foreign = other.model().new_cache_with_capacity(8).unwrap();
    let err = m.forward(&mut foreign, &ids, 4, false).unwrap_err().to_string();
    assert!(err.contains("another model"), "{err}");
}

/// OpenAI's presence and frequency penalties and logit bias, after the repetition penalty and
/// before the pick: each greedy choice is the argmax of the plain logits (all positions run
/// from an empty cache) with `presence + frequency · count` subtracted from every token of the
/// reply so far and the bias added; the bias bans a token at -100.
#[test]
fn presence_frequency_penalties_and_logit_bias_move_the_greedy_pick() {
    let p = pipeline("qwen2-tied");
    let prompt = p.encode("The quick brown fox", true).unwrap();
    let vocab = p.model().config().vocab_size;
    let plain = p.generate_from_ids(&prompt, &greedy(6), true, |_, _| StreamControl::Continue).unwrap();
    let first = plain.generated_token_ids[0];
    let params = GenerateParams {
        presence_penalty: 1.5,
        frequency_penalty: 0.75,
        logit_bias: vec![(first, -100.0), (7, 0.5)],
        ..greedy(6)
    };
    let got = p.generate_from_ids(&prompt, &params, true, |_, _| StreamControl::Continue).unwrap();
    assert_ne!(got.generated_token_ids[0], first, "a bias of -100 bans the plain first choice");
    let mut history = prompt.clone();
    for (step, &id) in got.generated_token_ids.iter().enumerate() {
        let logits = p.logits(&history, 64).unwrap();
        let mut last: Vec<f64> = logits[logits.len() - vocab..].iter().map(|&x| x as f64).collect();
        let reply = &got.generated_token_ids[..step];
        let mut counts = std::collections::HashMap::new();
        for &t in reply {
            *counts.entry(t).or_insert(0.0) += 1.0;
        }
        for (&t, &count) in &counts {
            last[t as usize] -= 1.5 + 0.75 * count;
        }
        last[first as usize] -= 100.0;
        last[7] += 0.5;
        let want = (0..vocab).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap() as u32;
        assert_eq!(id, want, "step {step}");
        history.push(id);
    }
    let bad = GenerateParams { logit_bias: vec![(vocab as u32 + 3, 1.0)], ..greedy(2) };
    let e = p.generate_from_ids(&prompt, &bad, true, |_, _| StreamControl::Continue).unwrap_err().to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
}

/// A host log-softmax in f64 of one row.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f64::NEG_INFINITY, |m, &z| m.max(z as f64));
    let lse = m + row.iter().map(|&z| (z as f64 - m).exp()).sum::<f64>().ln();
    row.iter().map(|&z| z as f64 - lse).collect()
}

#[test]
fn logprobs_are_the_log_softmax_of_the_raw_logits() {
    let p = pipeline("qwen2-tied");
    let prompt = p.encode("The quick brown fox", true).unwrap();
    let vocab = p.model().config().vocab_size;
    let off = p.generate_from_ids(&prompt, &greedy(5), true, |_, _| StreamControl::Continue).unwrap();
    assert!(off.logprobs.is_empty(), "no logprobs unless asked");
    // Greedy, and sampled with penalties: the values are the raw logits' either way.
    let sampled = GenerateParams {
        sampling: Some(SamplingConfig { temperature: 0.7, seed: Some(3), ..Default::default() }),
        repetition_penalty: 1.3,
        logit_bias: vec![(7, 5.0)],
        logprobs: Some(5),
        ..greedy(5)
    };
    for (params, is_greedy) in [(GenerateParams { logprobs: Some(20), ..greedy(5) }, true), (sampled, false)] {
        let got = p.generate_from_ids(&prompt, &params, true, |_, _| StreamControl::Continue).unwrap();
        let n = params.logprobs.unwrap();
        assert_eq!(got.logprobs.len(), got.generated_token_ids.len());
        let mut history = prompt.clone();
        for (step, (lp, &id)) in got.logprobs.iter().zip(&got.generated_token_ids).enumerate() {
            let logits = p.logits(&history, 64).unwrap();
            let want = log_softmax(&logits[logits.len() - vocab..]);
            let close = |g: f32, w: f64| (g as f64 - w).abs() < 1e-3;
            assert_eq!(lp.token, id);
            assert!(close(lp.logprob, want[id as usize]), "step {step}: {} vs {}", lp.logprob, want[id as usize]);
            assert_eq!(lp.top.len(), n);
            for w in lp.top.windows(2) {
                assert!(w[0].1 >= w[1].1, "step {step}: top sorted: {:?}", lp.top);
            }
            for &(t, v) in &lp.top {
                assert!(close(v, want[t as usize]) && v <= 0.0, "step {step}: token {t}: {v} vs {}", want[t as usize]);
            }
            let mass: f64 = lp.top.iter().map(|&(_, v)| (v as f64).exp()).sum();
            assert!(mass <= 1.0 + 1e-5, "step {step}: {mass}");
            // The top token is the host's argmax (margins of the tiny model are wide enough).
            let best = (0..vocab).max_by(|&a, &b| want[a].total_cmp(&want[b]).then(b.cmp(&a))).unwrap() as u32;
            assert_eq!(lp.top[0].0, best, "step {step}");
            if is_greedy {
                assert_eq!((lp.top[0].0, lp.top[0].1), (id, lp.logprob), "step {step}: greedy picks the top-1");
            }
            history.push(id);
        }
    }
    let e = p
        .generate_from_ids(&prompt, &GenerateParams { logprobs: Some(21), ..greedy(2) }, true, |_, _| {
            StreamControl::Continue
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("logprobs"), "{e}");
}

#[test]
fn min_p_filters_relative_to_the_most_likely_token() {
    let p = pipeline("qwen2-tied");
    let prompt = p.encode("Once upon a time", true).unwrap();
    let run = |min_p: f32, seed: u64| {
        let sampling = SamplingConfig { temperature: 1.5, seed: Some(seed), min_p, ..Default::default() };
        let params = GenerateParams { sampling: Some(sampling), logprobs: Some(0), ..greedy(8) };
        p.generate_from_ids(&prompt, &params, true, |_, _| StreamControl::Continue).unwrap()
    };
    let greedy_ids = p.generate_from_ids(&prompt, &greedy(8), true, |_, _| StreamControl::Continue).unwrap();
    // min_p = 1 keeps only the maximum: greedy, whatever the seed.
    for seed in [1, 2, 3] {
        assert_eq!(run(1.0, seed).generated_token_ids, greedy_ids.generated_token_ids, "seed {seed}");
    }
    // min_p = 0.2 never draws a token below 0.2 × the top probability (at temperature 1.5,
    // ln(p_token / p_max) × 1/1.5 ≥ ln 0.2 on the raw logprobs).
    let mut varied = false;
    for seed in 0..6 {
        let got = run(0.2, seed);
        varied |= got.generated_token_ids != greedy_ids.generated_token_ids;
        let mut history = prompt.clone();
        let vocab = p.model().config().vocab_size;
        for (step, &id) in got.generated_token_ids.iter().enumerate() {
            let logits = p.logits(&history, 64).unwrap();
            let row = &logits[logits.len() - vocab..];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &z| m.max(z));
            let ratio = ((row[id as usize] - max) as f64 / 1.5).exp();
            assert!(ratio >= 0.2 - 1e-4, "seed {seed} step {step}: token {id} at {ratio} of the top");
            assert_eq!(got.logprobs[step].top.len(), 0);
            history.push(id);
        }
    }
    assert!(varied, "min_p 0.2 at temperature 1.5 still samples");
}
