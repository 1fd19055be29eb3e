//! Constrained decoding: masks of small grammars against expectations computed from the
//! tokenizer's own decoding, JSON replies of the bundled tiny model (greedy and sampled) that
//! parse and validate against their schema, the forced-tool-call grammar on the real Qwen
//! vocabulary (`<tool_call>` is one token there) and on the tiny model, and the errors that keep
//! it failing closed, in the pipeline and in the engine.

use std::time::Duration;

use ruda_llm::constraint::{lark_json, lark_literal};
use ruda_llm::{
    example, load_pipeline, BatchOptions, ConstraintCompiler, Engine, EngineConfig, EngineEvent, EngineRequest,
    GenerateParams, LlmError, ModelType, Pipeline, PipelineOptions, ResponseFormat, SamplingConfig, StopReason,
    StreamControl, Tokenizer,
};
use ruda_runtime::Device;
use serde_json::{json, Value};

use crate::tokenizer_goldens::real_tokenizer;

fn pipeline() -> Pipeline {
    let options = PipelineOptions { device: Some(Device::cpu()), ..Default::default() };
    load_pipeline(example::bundled_model(ModelType::Qwen2), &options).unwrap()
}

fn lark(text: &str) -> ResponseFormat {
    ResponseFormat::Lark(text.to_string())
}

/// The ids whose own decoded text satisfies `allowed` (special tokens decode to their names).
fn expected(tok: &Tokenizer, vocab: usize, allowed: impl Fn(&str) -> bool) -> Vec<bool> {
    (0..vocab as u32)
        .map(|id| tok.decode(&[id], false).map(|t| !t.is_empty() && allowed(&t)).unwrap_or(false))
        .collect()
}

fn allowed_ids(mask: &[bool]) -> Vec<u32> {
    mask.iter().enumerate().filter(|(_, &m)| m).map(|(i, _)| i as u32).collect()
}

#[test]
fn masks_of_literal_grammars_match_the_vocabulary() {
    let p = pipeline();
    let tok = p.tokenizer();
    let vocab = p.model().config().vocab_size;
    let compiler = ConstraintCompiler::for_pipeline(&p).unwrap();
    let c = compiler.compile(&lark(r#"start: "yes" | "no""#)).unwrap();
    let mut s = c.start().unwrap();
    let want = expected(tok, vocab, |t| "yes".starts_with(t) || "no".starts_with(t));
    assert_eq!(allowed_ids(s.mask().unwrap()), allowed_ids(&want));
    let y = tok.token_to_id("y").unwrap();
    s.consume(y).unwrap();
    assert!(!s.is_finished());
    assert_eq!(allowed_ids(s.mask().unwrap()), allowed_ids(&expected(tok, vocab, |t| "es".starts_with(t))));
    for id in tok.encode("es", false).unwrap() {
        assert!(!s.is_finished());
        s.consume(id).unwrap();
    }
    // Complete, and nothing may follow: the generation ends here, without an EOS.
    assert!(s.is_finished());
    assert!(s.mask().is_err());

    // A grammar that may go on: once it accepts, the generation config's EOS ids are allowed.
    let c = compiler.compile(&lark(r#"start: "a"+"#)).unwrap();
    let mut s = c.start().unwrap();
    assert!(!s.is_accepting().unwrap());
    s.consume(tok.token_to_id("a").unwrap()).unwrap();
    assert!(s.is_accepting().unwrap() && !s.is_finished());
    let mut want = expected(tok, vocab, |t| t.chars().all(|c| c == 'a'));
    for &eos in &p.loaded.default_eos_token_ids {
        want[eos as usize] = true;
    }
    assert_eq!(allowed_ids(s.mask().unwrap()), allowed_ids(&want));
    let eos = p.loaded.default_eos_token_ids[0];
    s.consume(eos).unwrap();
    assert!(s.is_finished());
    // A token the grammar does not allow is an error, not a silent pass.
    let mut s = c.start().unwrap();
    s.mask().unwrap();
    let err = s.consume(tok.token_to_id("b").unwrap()).unwrap_err();
    assert!(matches!(err, LlmError::Constraint(_)), "{err}");
}

#[test]
fn ids_past_the_tokenizer_are_never_allowed() {
    let p = pipeline();
    let vocab = p.model().config().vocab_size;
    let eos = &p.loaded.default_eos_token_ids;
    // A model whose logits are wider than its tokenizer (padding rows).
    let compiler = ConstraintCompiler::new(p.tokenizer(), eos, vocab + 7).unwrap();
    let c = compiler.compile(&ResponseFormat::JsonObject).unwrap();
    let mut s = c.start().unwrap();
    let mask = s.mask().unwrap();
    assert_eq!(mask.len(), vocab + 7);
    assert!(mask[vocab..].iter().all(|m| !m));
    assert_eq!(allowed_ids(mask), allowed_ids(&expected(p.tokenizer(), vocab + 7, |t| t.starts_with('{'))));
}

/// The schema of the JSON tests: bounded strings and numbers, so every reply completes in well
/// under 140 tokens however the model spells it.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "kind": {"enum": ["cat", "dog"]}
        },
        "required": ["name", "age", "kind"],
        "additionalProperties": false
    })
}

/// A hand-written check of [`person_schema`].
fn validate_person(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    if let Some(k) = o.keys().find(|k| !["name", "age", "kind"].contains(&k.as_str())) {
        return Err(format!("unexpected key {k}"));
    }
    let name = o.get("name").and_then(Value::as_str).ok_or("name is not a string")?;
    if name.chars().count() > 8 {
        return Err(format!("name {name:?} is longer than 8"));
    }
    let age = o.get("age").ok_or("no age")?;
    match age.as_i64() {
        Some(a) if age.is_i64() && (0..=150).contains(&a) => {}
        _ => return Err(format!("age {age} is not an integer in 0..=150")),
    }
    match o.get("kind").and_then(Value::as_str) {
        Some("cat" | "dog") => Ok(()),
        other => Err(format!("kind {other:?} is not cat or dog")),
    }
}

/// Whether `text` is a prefix of some JSON text: serde_json stops at the end of the input, not at
/// a syntax error.
fn is_json_prefix(text: &str) -> bool {
    match serde_json::from_str::<Value>(text) {
        Ok(_) => true,
        Err(e) => e.is_eof(),
    }
}

fn prompt_ids(p: &Pipeline) -> Vec<u32> {
    p.encode("<|im_start|>user\nA pet as JSON<|im_end|>\n<|im_start|>assistant\n", false).unwrap()
}

#[test]
fn json_schema_replies_parse_and_validate_greedy_and_sampled() {
    let p = pipeline();
    let compiler = ConstraintCompiler::for_pipeline(&p).unwrap();
    let format = ResponseFormat::JsonSchema { schema: person_schema(), strict: true };
    let constraint = compiler.compile(&format).unwrap();
    let prompt = prompt_ids(&p);
    let base = GenerateParams {
        max_new_tokens: 140,
        eos_token_ids: p.loaded.default_eos_token_ids.clone(),
        constraint: Some(constraint),
        ..Default::default()
    };
    let sampled = |seed| GenerateParams {
        sampling: Some(SamplingConfig { seed: Some(seed), ..p.default_sampling() }),
        ..base.clone()
    };
    let mut replies = Vec::new();
    for params in [base.clone(), sampled(1), sampled(2)] {
        let mut streamed = String::new();
        let out = p
            .generate_from_ids(&prompt, &params, true, |_, piece| {
                streamed.push_str(piece);
                StreamControl::Continue
            })
            .unwrap();
        assert_eq!(out.stop_reason, StopReason::Grammar, "{:?}", out.generated_text);
        assert_eq!(streamed, out.generated_text);
        let v: Value =
            serde_json::from_str(&out.generated_text).unwrap_or_else(|e| panic!("{e}: {}", out.generated_text));
        validate_person(&v).unwrap_or_else(|e| panic!("{e}: {}", out.generated_text));
        replies.push(out.generated_text);
    }
    // The same constraint without sampling is deterministic.
    let again = p.generate_from_ids(&prompt, &base, true, |_, _| StreamControl::Continue).unwrap();
    assert_eq!(again.generated_text, replies[0]);
}

#[test]
fn json_object_replies_are_objects_or_their_prefixes_and_beat_the_penalties() {
    let p = pipeline();
    let compiler = ConstraintCompiler::for_pipeline(&p).unwrap();
    let constraint = compiler.compile(&ResponseFormat::JsonObject).unwrap();
    let prompt = prompt_ids(&p);
    let x = p.tokenizer().token_to_id("x").unwrap();
    // A bias of +100 all but forces "x" unconstrained: the mask still wins.
    let params = GenerateParams {
        max_new_tokens: 24,
        eos_token_ids: p.loaded.default_eos_token_ids.clone(),
        repetition_penalty: 1.3,
        presence_penalty: 0.5,
        logit_bias: vec![(x, 100.0)],
        constraint: Some(constraint),
        ..Default::default()
    };
    let unconstrained = GenerateParams { constraint: None, ..params.clone() };
    let free = p.generate_from_ids(&prompt, &unconstrained, true, |_, _| StreamControl::Continue).unwrap();
    assert_eq!(free.generated_token_ids[0], x, "the bias test needs the bias to matter");
    for params in [
        params.clone(),
        GenerateParams { sampling: Some(SamplingConfig { seed: Some(5), ..p.default_sampling() }), ..params },
    ] {
        let out = p.generate_from_ids(&prompt, &params, true, |_, _| StreamControl::Continue).unwrap();
        let text = &out.generated_text;
        assert!(text.starts_with('{'), "{text:?}");
        match out.stop_reason {
            StopReason::Grammar => assert!(serde_json::from_str::<Value>(text).unwrap().is_object(), "{text:?}"),
            // A random model need not close the object in 24 tokens: what holds is a prefix.
            StopReason::Length => assert!(is_json_prefix(text), "{text:?}"),
            other => panic!("{other:?}: {text:?}"),
        }
    }
}

/// A forced tool call as the lead builds it: the literal opening, a JSON schema, the closing.
fn tool_call_grammar(schema: &Value) -> ResponseFormat {
    let grammar =
        format!("start: {} {} {}", lark_literal("<tool_call>\n"), lark_json(schema), lark_literal("\n</tool_call>"));
    ResponseFormat::Lark(grammar)
}

fn get_time_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"const": "get_time"},
            "arguments": {
                "type": "object",
                "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
                "required": ["hour"],
                "additionalProperties": false
            }
        },
        "required": ["name", "arguments"],
        "additionalProperties": false
    })
}

#[test]
fn forced_tool_calls_on_the_real_qwen_vocabulary() {
    let tok = real_tokenizer("qwen2.5");
    // Qwen2.5's embedding has 151936 rows for 151665 tokens: the rest are padding.
    let (vocab, im_end, endoftext) = (151_936, 151_645, 151_643);
    let compiler = ConstraintCompiler::new(tok, &[im_end, endoftext], vocab).unwrap();
    let c = compiler.compile(&tool_call_grammar(&get_time_schema())).unwrap();
    let (open, close) = (tok.token_to_id("<tool_call>").unwrap(), tok.token_to_id("</tool_call>").unwrap());
    assert_eq!((open, close), (151_657, 151_658));
    let mut s = c.start().unwrap();
    let mask = s.mask().unwrap().to_vec();
    assert_eq!(mask.len(), vocab);
    // Text the grammar forces is spelled as the tokenizer spells it, one token a step: here the
    // one token `<tool_call>` (a non-special added token, so text), not "<" and the rest.
    assert_eq!(tok.encode("<tool_call>\n", false).unwrap()[0], open);
    assert_eq!(allowed_ids(&mask), vec![open]);
    assert!(mask[151_665..].iter().all(|m| !m));

    // The model's own spelling of a valid call is accepted token by token, and ends it.
    let text = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"hour\": 7}}\n</tool_call>";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!((ids[0], *ids.last().unwrap()), (open, close));
    for (i, &id) in ids.iter().enumerate() {
        assert!(!s.is_finished(), "finished before token {i}");
        assert!(s.mask().unwrap()[id as usize], "token {i} ({id}) of {ids:?} is not allowed");
        s.consume(id).unwrap();
    }
    assert!(s.is_finished());

    // A wrong function name is refused at its first differing character.
    let mut s = c.start().unwrap();
    for id in tok.encode("<tool_call>\n{\"name\": \"get_", false).unwrap() {
        s.consume(id).unwrap();
    }
    let mask = s.mask().unwrap();
    assert!(mask[tok.token_to_id("time").unwrap() as usize]);
    assert!(!mask[tok.token_to_id("date").unwrap() as usize]);

    // Special tokens: `<|im_end|>` unquoted is the token; `<tool_call>` unquoted names a special
    // token Qwen does not have (it is text), which is a compile error.
    let c = compiler.compile(&lark(r#"start: "ok" <|im_end|>"#)).unwrap();
    let mut s = c.start().unwrap();
    s.consume(tok.token_to_id("ok").unwrap()).unwrap();
    assert_eq!(allowed_ids(s.mask().unwrap()), vec![im_end]);
    let err = compiler.compile(&lark("start: <tool_call>")).unwrap_err().to_string();
    assert!(err.contains("special token"), "{err}");
}

#[test]
fn forced_tool_calls_generate_a_valid_call() {
    let p = pipeline();
    let compiler = ConstraintCompiler::for_pipeline(&p).unwrap();
    let c = compiler.compile(&tool_call_grammar(&get_time_schema())).unwrap();
    let params = GenerateParams {
        // The call is at most 70 bytes, so at most 70 tokens.
        max_new_tokens: 80,
        eos_token_ids: p.loaded.default_eos_token_ids.clone(),
        constraint: Some(c),
        ..Default::default()
    };
    let out = p.generate_from_ids(&prompt_ids(&p), &params, true, |_, _| StreamControl::Continue).unwrap();
    assert_eq!(out.stop_reason, StopReason::Grammar, "{:?}", out.generated_text);
    let body = out
        .generated_text
        .strip_prefix("<tool_call>\n")
        .and_then(|t| t.strip_suffix("\n</tool_call>"))
        .unwrap_or_else(|| panic!("{:?}", out.generated_text));
    let call: Value = serde_json::from_str(body).unwrap();
    assert_eq!(call["name"], "get_time");
    let hour = call["arguments"]["hour"].as_i64().unwrap();
    assert!((0..=23).contains(&hour), "{call}");
    assert_eq!(call["arguments"].as_object().unwrap().len(), 1);
}

#[test]
fn formats_that_cannot_compile_are_errors() {
    let p = pipeline();
    let compiler = ConstraintCompiler::for_pipeline(&p).unwrap();
    let schema = |s: Value| ResponseFormat::JsonSchema { schema: s, strict: false };
    for (format, says) in [
        (schema(json!("string")), "must be a JSON object"),
        (schema(json!({"type": "integer", "minimum": 5, "maximum": 1})), ""),
        (schema(json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})), ""),
        (schema(json!({"type": "frobnicate"})), ""),
        (schema(json!({"type": "array", "uniqueItems": true})), ""),
        (lark("start: ("), ""),
        (lark("start: missing_rule"), ""),
    ] {
        let err = compiler.compile(&format).unwrap_err();
        assert!(matches!(err, LlmError::Constraint(_)), "{err}");
        let text = err.to_string();
        assert!(text.starts_with("response format: ") && text.contains(says), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }
    // References within the schema work (llguidance's `referencing` feature is off).
    let defs =
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"type": "integer"}}});
    compiler.compile(&schema(defs)).unwrap();
    // Bad compiler settings are errors too.
    assert!(ConstraintCompiler::new(p.tokenizer(), &[], 400).is_err());
    assert!(ConstraintCompiler::new(p.tokenizer(), &[400], 400).is_err());
}

/// A grammar that only allows token 450 of a 500-id vocabulary: it compiles, but the model's
/// 400 logits hold no allowed token, so every step would be unconstrained; it must fail instead.
fn impossible(p_tok: &Tokenizer, eos: &[u32]) -> GenerateParams {
    let compiler = ConstraintCompiler::new(p_tok, eos, 500).unwrap();
    let c = compiler.compile(&lark("start: <[450]>")).unwrap();
    GenerateParams { max_new_tokens: 4, eos_token_ids: eos.to_vec(), constraint: Some(c), ..Default::default() }
}

#[test]
fn a_grammar_that_allows_no_token_fails_the_generation() {
    let p = pipeline();
    let params = impossible(p.tokenizer(), &p.loaded.default_eos_token_ids);
    let err = p.generate_from_ids(&prompt_ids(&p), &params, true, |_, _| StreamControl::Continue).unwrap_err();
    assert!(matches!(&err, LlmError::Constraint(m) if m.contains("allows no token")), "{err}");
}

#[test]
fn the_engine_fails_only_the_request_whose_grammar_allows_no_token() {
    let p = pipeline();
    let prompt = prompt_ids(&p);
    let eos = p.loaded.default_eos_token_ids.clone();
    let batch = BatchOptions { max_active: 4, block_size: 4, ..Default::default() };
    let engine = Engine::start(p, EngineConfig { batch, max_model_len: Some(200), max_pending: 8 }).unwrap();
    let compiler = engine.constraints().unwrap();
    let format = ResponseFormat::JsonSchema { schema: person_schema(), strict: true };
    let good = GenerateParams {
        max_new_tokens: 140,
        eos_token_ids: eos.clone(),
        constraint: Some(compiler.compile(&format).unwrap()),
        ..Default::default()
    };
    let bad = impossible(engine.tokenizer(), &eos);
    let mut handles: Vec<_> = [good.clone(), bad, good]
        .into_iter()
        .map(|params| engine.submit(EngineRequest { prompt: prompt.clone(), params }).unwrap())
        .collect();
    let mut outcomes = Vec::new();
    for h in &mut handles {
        let mut text = String::new();
        let end = loop {
            match h.recv_timeout(Duration::from_secs(120)).expect("an event within two minutes") {
                Some(EngineEvent::Token { text: t, .. }) => text.push_str(&t),
                other => break other,
            }
        };
        outcomes.push((text, end));
    }
    let mut replies = Vec::new();
    for (i, (text, end)) in outcomes.into_iter().enumerate() {
        match (i, end) {
            (1, Some(EngineEvent::Failed(m))) => assert!(m.contains("allows no token"), "{m}"),
            (0 | 2, Some(EngineEvent::Finished { text: rest, output })) => {
                let text = text + &rest;
                assert_eq!(output.stop_reason, StopReason::Grammar);
                assert_eq!(text, output.generated_text);
                validate_person(&serde_json::from_str(&text).unwrap()).unwrap();
                replies.push(text);
            }
            (i, other) => panic!("request {i}: {other:?}"),
        }
    }
    // Greedy and batched: the two good requests agree.
    assert_eq!(replies[0], replies[1]);
    let m = engine.metrics();
    assert_eq!((m.requests_failed, m.requests_finished), (1, 2));
    assert!(engine.is_serving());
}
