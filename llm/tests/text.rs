//! tokenizer.json and chat templates, on a hand-built byte-level BPE tokenizer and Qwen2.5 /
//! Qwen3 style templates, compared with strings written by hand from the templates' logic.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use ruda_llm::{ChatMessage, ChatTemplate, LoadError, Tokenizer};
use serde_json::{json, Map, Value};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ruda-llm-text-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.0.join(name), text).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// GPT-2's byte-to-character map of byte-level BPE: byte `b` is token id `b`.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut by_byte = vec![' '; 256];
    for (b, c) in printable.iter().zip(chars) {
        by_byte[*b as usize] = char::from_u32(c).unwrap();
    }
    by_byte
}

const QWEN_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A Qwen-shaped tokenizer.json: NFC, the Qwen split regex (look-ahead: needs fancy-regex),
/// byte-level BPE over all 256 bytes plus five merges, and three special tokens.
fn tokenizer_json() -> Value {
    let chars = byte_chars();
    let mut vocab = Map::new();
    for (b, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), json!(b));
    }
    let g = chars[b' ' as usize];
    let merges = ["h e", "l l", "he ll", "hell o", &format!("{g} w")];
    for (i, m) in merges.iter().enumerate() {
        vocab.insert(m.replace(' ', ""), json!(256 + i));
    }
    let special = |id: usize, content: &str| json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(261, "<|endoftext|>"), special(262, "<|im_start|>"), special(263, "<|im_end|>")],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": false},
            byte_level
        ]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    })
}

#[test]
fn byte_level_bpe_tokenizer() {
    let dir = TempDir::new("tok");
    dir.write("tokenizer.json", &tokenizer_json().to_string());
    let tok = Tokenizer::load(dir.path()).unwrap();
    assert_eq!(tok.vocab_size(), 264);
    assert_eq!(tok.encode("hello world", false).unwrap(), vec![259, 260, 111, 114, 108, 100]);
    // `\s+(?!\S)` leaves the last space of a run to the next word.
    assert_eq!(tok.encode("a  b", false).unwrap(), vec![97, 32, 32, 98]);
    let chat = "<|im_start|>user\nhi<|im_end|>";
    let ids = tok.encode(chat, true).unwrap();
    assert_eq!(ids, vec![262, 117, 115, 101, 114, 10, 104, 105, 263]);
    assert_eq!(tok.decode(&ids, false).unwrap(), chat);
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\nhi");
    // Non-ASCII text goes through bytes and back (NFC: a decomposed é comes back composed).
    let ids = tok.encode("cafe\u{301} 😀", false).unwrap();
    assert_eq!(&ids[..5], &[99, 97, 102, 0xc3, 0xa9]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "café 😀");
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(263));
    assert_eq!(tok.id_to_token(259).as_deref(), Some("hello"));
    assert_eq!(tok.special_id("<|endoftext|>").unwrap(), 261);
    let e = tok.special_id("<|nope|>").unwrap_err().to_string();
    assert!(e.contains("tokenizer.json") && e.contains("<|nope|>"), "{e}");
    let e = tok.decode(&[1, 9999], false).unwrap_err().to_string();
    assert!(e.contains("token id 9999 is not in the vocabulary (264 tokens)"), "{e}");
    // What a model produced: an id past the tokenizer (a padding row) has no text.
    assert_eq!(tok.decode_generated(&[104, 9999, 105, 264], false).unwrap(), "hi");
    assert_eq!(tok.decode_generated(&ids, false).unwrap(), "café 😀");
}

#[test]
fn bad_tokenizer_files_are_errors() {
    let dir = TempDir::new("badtok");
    assert!(matches!(Tokenizer::load(dir.path()), Err(LoadError::Io { .. })));
    dir.write("tokenizer.json", "{\"model\": 3}");
    let e = Tokenizer::load(dir.path()).err().unwrap();
    assert!(
        matches!(e, LoadError::Tokenizer { .. }) && e.to_string().contains("tokenizer.json: tokenizer: cannot load"),
        "{e}"
    );
}

fn msgs(list: &[(&str, &str)]) -> Vec<ChatMessage> {
    list.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
}

fn extra(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

/// Qwen2.5's own template (the fixture folders hold it) with `tools`: the function definitions
/// are rendered by `tojson` in their insertion order, as transformers' `apply_chat_template`
/// renders this conversation (its output, verbatim). Conversations without tools are checked
/// against transformers in `chat_goldens.rs`.
#[test]
fn qwen25_template_with_tools() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2-tied");
    let t = ChatTemplate::load(&dir).unwrap();
    let tools = extra(
        json!({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]}),
    );
    let text = t.render(&msgs(&[("user", "Hi"), ("tool", "22C"), ("tool", "sunny")]), true, &tools).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n\
         You may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
         {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}}\n</tools>\n\n\
         For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n\
         <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>user\n<tool_response>\n22C\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn template_sources_and_fallbacks() {
    // A list of named templates: "default" is taken.
    let dir = TempDir::new("list");
    let config = json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ eos_token }}"}],
                        "eos_token": {"content": "<|im_end|>", "special": true}});
    dir.write("tokenizer_config.json", &config.to_string());
    assert_eq!(ChatTemplate::load(dir.path()).unwrap().render(&[], false, &Map::new()).unwrap(), "D<|im_end|>");
    // No template in the config: chat_template.jinja beside it.
    dir.write("tokenizer_config.json", "{\"eos_token\": \"E\"}");
    dir.write("chat_template.jinja", "J{{ messages|length }}{{ eos_token }}");
    assert_eq!(
        ChatTemplate::load(dir.path()).unwrap().render(&msgs(&[("user", "x")]), false, &Map::new()).unwrap(),
        "J1E"
    );
    // Nothing: ChatML.
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    let t = ChatTemplate::load(dir.path()).unwrap();
    assert_eq!(t.source(), ruda_llm::CHATML_TEMPLATE);
    let text = t.render(&msgs(&[("system", "S"), ("user", "U")]), true, &Map::new()).unwrap();
    assert_eq!(text, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
    dir.write("tokenizer_config.json", "{\"chat_template\": 3}");
    let e = ChatTemplate::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tokenizer_config.json") && e.contains("neither a string nor a list"), "{e}");
}

#[test]
fn template_errors() {
    let t = ChatTemplate::new("{% if %}", "test").unwrap_err().to_string();
    assert!(t.starts_with("chat template (test):"), "{t}");
    let t = ChatTemplate::new(
        "{%- if messages|length == 0 %}{{ raise_exception('No user query found in messages.') }}{% endif %}ok",
        "test",
    )
    .unwrap();
    let e = t.render(&[], false, &Map::new()).unwrap_err().to_string();
    assert!(e.contains("No user query found in messages."), "{e}");
    assert_eq!(t.render(&msgs(&[("user", "x")]), false, &Map::new()).unwrap(), "ok");
    let e = t.render(&[], false, &extra(json!({"messages": []}))).unwrap_err().to_string();
    assert!(e.contains("would replace the argument"), "{e}");
}

#[test]
fn tojson_and_python_string_methods() {
    // Booleans print as Python prints them (`True`), as in Jinja2; objects keep their key order,
    // as Python's `json.dumps` of a dict does.
    let t = ChatTemplate::new(
        "{{ x | tojson }}|{{ {'z': 1, 'a': [2.5, none]} | tojson }}|{{ '<t>' | tojson }}|{{ x.b | tojson(indent=2) }}|\
         {{ '  a,b  '.strip().split(',') | join('+') }}|{{ 'Hello'.startswith('He') }}|{{ 'x\\n\\n'.rstrip('\\n') }}|{{ 'ab'.upper() }}",
        "test",
    )
    .unwrap();
    let x = extra(json!({"x": {"b": [1, 2.5, "é\"\n"], "a": null, "t": true}}));
    assert_eq!(
        t.render(&[], false, &x).unwrap(),
        "{\"b\": [1, 2.5, \"é\\\"\\n\"], \"a\": null, \"t\": true}|{\"z\": 1, \"a\": [2.5, null]}|\"<t>\"|\
         [\n  1,\n  2.5,\n  \"é\\\"\\n\"\n]|a+b|True|x|AB"
    );
}

/// The incremental decoder of batched replies: after every token its text is a prefix of the
/// whole reply decoded at once, it settles as characters complete, and `finish` gives exactly
/// the whole decode; on the bundled tiny model's byte-level tokenizer, over random ids (bytes
/// that split UTF-8 characters, invalid sequences, special tokens) and over real text.
#[test]
fn incremental_decoding_matches_decoding_the_whole_reply() {
    use ruda_llm::batch::IncrementalDecoder;
    let tok = Tokenizer::load(ruda_llm::example::bundled_model(ruda_llm::ModelType::Qwen2)).unwrap();
    let vocab = tok.vocab_size() as u64;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) % vocab) as u32
    };
    let text_ids = tok.encode("naïve café — 日本語 🙂 done", false).unwrap();
    let replies: Vec<Vec<u32>> = vec![(0..300).map(|_| random()).collect(), text_ids];
    for (r, ids) in replies.iter().enumerate() {
        for skip in [true, false] {
            let mut dec = IncrementalDecoder::new(skip);
            for (i, &id) in ids.iter().enumerate() {
                let whole = tok.decode(&ids[..=i], skip).unwrap();
                let text = dec.push(&tok, id).unwrap();
                assert!(whole.starts_with(text), "reply {r}, token {i}: {text:?} is not a prefix of {whole:?}");
            }
            let whole = tok.decode(ids, skip).unwrap();
            if r == 1 {
                assert_eq!(dec.text(), whole, "valid text settles completely");
            }
            assert_eq!(dec.finish(&tok).unwrap(), whole);
        }
    }
}
