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
        let dir =
            std::env::temp_dir().join(format!("ruda-llm-text-{}-{tag}-{n}", std::process::id()));
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

const QWEN_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

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
    assert_eq!(
        tok.encode("hello world", false).unwrap(),
        vec![259, 260, 111, 114, 108, 100]
    );
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
    assert!(
        e.contains("tokenizer.json") && e.contains("<|nope|>"),
        "{e}"
    );
    let e = tok.decode(&[1, 9999], false).unwrap_err().to_string();
    assert!(
        e.contains("token id 9999 is not in the vocabulary (264 tokens)"),
        "{e}"
    );
}

#[test]
fn bad_tokenizer_files_are_errors() {
    let dir = TempDir::new("badtok");
    assert!(matches!(
        Tokenizer::load(dir.path()),
        Err(LoadError::Io { .. })
    ));
    dir.write("tokenizer.json", "{\"model\": 3}");
    let e = Tokenizer::load(dir.path()).err().unwrap();
    assert!(
        matches!(e, LoadError::Tokenizer { .. })
            && e.to_string()
                .contains("tokenizer.json: tokenizer: cannot load"),
        "{e}"
    );
}

const QWEN25_TEMPLATE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"##;

const QWEN3_TEMPLATE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"##;

fn msgs(list: &[(&str, &str)]) -> Vec<ChatMessage> {
    list.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
}

fn extra(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn model_dir(template: &str) -> TempDir {
    let dir = TempDir::new("tpl");
    let config = json!({"bos_token": null, "eos_token": "<|im_end|>", "chat_template": template});
    dir.write("tokenizer_config.json", &config.to_string());
    dir
}

#[test]
fn qwen25_template() {
    let dir = model_dir(QWEN25_TEMPLATE);
    let t = ChatTemplate::load(dir.path()).unwrap();
    assert_eq!(t.source(), QWEN25_TEMPLATE);
    let none = Map::new();
    assert_eq!(
        t.render(&msgs(&[("user", "Hi")]), true, &none).unwrap(),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let conv = msgs(&[
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello!"),
        ("user", "Bye"),
    ]);
    assert_eq!(
        t.render(&conv, false, &none).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    );
    let tools = extra(
        json!({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]}),
    );
    let text = t
        .render(
            &msgs(&[("user", "Hi"), ("tool", "22C"), ("tool", "sunny")]),
            true,
            &tools,
        )
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n\
         You may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
         {\"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}, \"type\": \"function\"}\n</tools>\n\n\
         For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n\
         <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>user\n<tool_response>\n22C\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn qwen3_template_thinking() {
    let dir = model_dir(QWEN3_TEMPLATE);
    let t = ChatTemplate::load(dir.path()).unwrap();
    let hi = msgs(&[("user", "Hi")]);
    assert_eq!(
        t.render(&hi, true, &Map::new()).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&hi, true, &extra(json!({"enable_thinking": false})))
            .unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    assert_eq!(
        t.render(&hi, true, &extra(json!({"enable_thinking": true})))
            .unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    // Reasoning of earlier turns is dropped; the system message is rendered once.
    let conv = msgs(&[
        ("system", "S"),
        ("user", "Q1"),
        ("assistant", "<think>\nr1\n</think>\n\nA1"),
        ("user", "Q2"),
    ]);
    assert_eq!(
        t.render(&conv, true, &Map::new()).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n\
         <|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n"
    );
    // ... but kept for the turn after the last query.
    let conv = msgs(&[("user", "Q"), ("assistant", "<think>\nr\n</think>\n\nA")]);
    assert_eq!(
        t.render(&conv, false, &Map::new()).unwrap(),
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA<|im_end|>\n"
    );
    // A tool response is not a query: the assistant turn before it keeps its reasoning.
    let conv = msgs(&[
        ("user", "Q"),
        ("assistant", "<think>t</think>call"),
        ("user", "<tool_response>1</tool_response>"),
    ]);
    assert_eq!(
        t.render(&conv, true, &Map::new()).unwrap(),
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nt\n</think>\n\ncall<|im_end|>\n\
         <|im_start|>user\n<tool_response>1</tool_response><|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn template_sources_and_fallbacks() {
    // A list of named templates: "default" is taken.
    let dir = TempDir::new("list");
    let config = json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ eos_token }}"}],
                        "eos_token": {"content": "<|im_end|>", "special": true}});
    dir.write("tokenizer_config.json", &config.to_string());
    assert_eq!(
        ChatTemplate::load(dir.path())
            .unwrap()
            .render(&[], false, &Map::new())
            .unwrap(),
        "D<|im_end|>"
    );
    // No template in the config: chat_template.jinja beside it.
    dir.write("tokenizer_config.json", "{\"eos_token\": \"E\"}");
    dir.write(
        "chat_template.jinja",
        "J{{ messages|length }}{{ eos_token }}",
    );
    assert_eq!(
        ChatTemplate::load(dir.path())
            .unwrap()
            .render(&msgs(&[("user", "x")]), false, &Map::new())
            .unwrap(),
        "J1E"
    );
    // Nothing: ChatML.
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    let t = ChatTemplate::load(dir.path()).unwrap();
    assert_eq!(t.source(), ruda_llm::CHATML_TEMPLATE);
    let text = t
        .render(&msgs(&[("system", "S"), ("user", "U")]), true, &Map::new())
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
    dir.write("tokenizer_config.json", "{\"chat_template\": 3}");
    let e = ChatTemplate::load(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("neither a string nor a list"),
        "{e}"
    );
}

#[test]
fn template_errors() {
    let t = ChatTemplate::new("{% if %}", "test")
        .unwrap_err()
        .to_string();
    assert!(t.starts_with("chat template (test):"), "{t}");
    let t = ChatTemplate::new("{%- if messages|length == 0 %}{{ raise_exception('No user query found in messages.') }}{% endif %}ok", "test")
        .unwrap();
    let e = t.render(&[], false, &Map::new()).unwrap_err().to_string();
    assert!(e.contains("No user query found in messages."), "{e}");
    assert_eq!(
        t.render(&msgs(&[("user", "x")]), false, &Map::new())
            .unwrap(),
        "ok"
    );
    let e = t
        .render(&[], false, &extra(json!({"messages": []})))
        .unwrap_err()
        .to_string();
    assert!(e.contains("would replace the argument"), "{e}");
}

#[test]
fn tojson_and_python_string_methods() {
    // Booleans print as Python prints them (`True`), as in Jinja2.
    let t = ChatTemplate::new(
        "{{ x | tojson }}|{{ {'z': 1, 'a': [2.5, none]} | tojson }}|{{ '<t>' | tojson }}|{{ x.b | tojson(indent=2) }}|\
         {{ '  a,b  '.strip().split(',') | join('+') }}|{{ 'Hello'.startswith('He') }}|{{ 'x\\n\\n'.rstrip('\\n') }}|{{ 'ab'.upper() }}",
        "test",
    )
    .unwrap();
    let x = extra(json!({"x": {"b": [1, 2.5, "é\"\n"], "a": null, "t": true}}));
    assert_eq!(
        t.render(&[], false, &x).unwrap(),
        "{\"a\": null, \"b\": [1, 2.5, \"é\\\"\\n\"], \"t\": true}|{\"z\": 1, \"a\": [2.5, null]}|\"<t>\"|\
         [\n  1,\n  2.5,\n  \"é\\\"\\n\"\n]|a+b|True|x|AB"
    );
}
