//! Chat templates against transformers' `apply_chat_template` (scripts/fixtures/make_fixtures.py):
//! the real Qwen2.5 and Qwen3 templates shipped in the fixtures' tokenizer_config.json, rendered
//! by `ChatTemplate` byte for byte as transformers rendered them.

use std::path::{Path, PathBuf};

use ruda_llm::{ChatMessage, ChatTemplate};
use serde_json::{Map, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .expect("a message list")
        .iter()
        .map(|m| {
            let content = m["content"].as_str().expect("content");
            let mut message = ChatMessage::new(m["role"].as_str().expect("role"), content);
            for (key, value) in m.as_object().expect("a message object") {
                if !matches!(key.as_str(), "role" | "content") {
                    message = message.with(key.as_str(), value.clone());
                }
            }
            message
        })
        .collect()
}

fn object(v: &Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

/// Render one golden case and describe a mismatch (None when equal).
fn check(
    template: &ChatTemplate,
    label: &str,
    case: &Value,
    messages_key: &str,
    extra_key: &str,
    want_key: &str,
) -> Option<String> {
    let add_gen = case["add_generation_prompt"].as_bool().expect("add_generation_prompt");
    let want = case[want_key].as_str().expect("the rendered text");
    match template.render(&messages(&case[messages_key]), add_gen, &object(&case[extra_key])) {
        Ok(got) if got == want => None,
        Ok(got) => Some(format!("{label}:\n  ours:         {got:?}\n  transformers: {want:?}")),
        Err(e) => Some(format!("{label}: {e}")),
    }
}

#[test]
fn fixture_templates_match_transformers() {
    let goldens = read_json(&fixtures().join("chat_goldens.json"));
    let cases = goldens["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    let mut templates = std::collections::BTreeMap::new();
    for case in cases {
        let fixture = case["fixture"].as_str().unwrap();
        let template = templates.entry(fixture.to_string()).or_insert_with(|| {
            let dir = fixtures().join(fixture);
            let t = ChatTemplate::load(&dir).unwrap();
            let config = read_json(&dir.join("tokenizer_config.json"));
            assert_eq!(Some(t.source()), config["chat_template"].as_str(), "{fixture}");
            t
        });
        let label = format!(
            "{} {} add_generation_prompt={} extra={}",
            case["template"].as_str().unwrap(),
            case["conversation"].as_str().unwrap(),
            case["add_generation_prompt"],
            case["extra"]
        );
        failures.extend(check(template, &label, case, "messages", "extra", "rendered"));
    }
    assert!(cases.len() >= 100, "{} cases", cases.len());
    let with_tools = cases.iter().filter(|c| c["extra"].get("tools").is_some()).count();
    assert!(with_tools >= 20, "{with_tools} cases with tools");
    assert!(failures.is_empty(), "{} of {} differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn real_chat_prompts_match_transformers() {
    let goldens = read_json(&fixtures().join("qwen-real/goldens.json"));
    let mut failures = Vec::new();
    let mut n = 0;
    for case in goldens["cases"].as_array().unwrap() {
        if case.get("messages").is_none() {
            continue;
        }
        n += 1;
        let variant = case["variant"].as_str().unwrap();
        let template = ChatTemplate::load(fixtures().join("qwen-real").join(variant)).unwrap();
        let label = format!("{variant} {}", case["name"].as_str().unwrap());
        failures.extend(check(&template, &label, case, "messages", "extra", "text"));
    }
    assert!(n >= 6, "{n} chat cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn model_golden_chat_prompts_match_transformers() {
    for model in ["qwen2-tied", "qwen2-untied", "qwen3"] {
        let dir = fixtures().join(model);
        let template = ChatTemplate::load(&dir).unwrap();
        let goldens = read_json(&dir.join("goldens.json"));
        let chats: Vec<&Value> =
            goldens["prompts"].as_array().unwrap().iter().filter(|p| p["kind"] == "chat").collect();
        assert!(!chats.is_empty(), "{model}: a chat prompt");
        for prompt in chats {
            let label = format!("{model} {}", prompt["name"].as_str().unwrap());
            if let Some(failure) = check(&template, &label, prompt, "messages", "chat_kwargs", "rendered") {
                panic!("{failure}");
            }
        }
    }
}
