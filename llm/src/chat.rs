//! Chat templates: the Jinja `chat_template` a model ships in `tokenizer_config.json` (or
//! `chat_template.jinja`), rendered with minijinja configured as transformers configures Jinja2
//! (`trim_blocks`, `lstrip_blocks`, loop controls, Python string methods, `raise_exception`,
//! and a `tojson` that writes what Python's `json.dumps` writes), ChatML when there is none.

use std::collections::BTreeMap;
use std::path::Path;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

use crate::error::{read_json, read_text, LoadError};

/// The template used when a model has none: plain ChatML, as Qwen's templates produce for
/// messages without tools.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const NAME: &str = "chat_template";

/// One message of a conversation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
    /// Further fields the template reads as they are, in this order: an assistant's
    /// `tool_calls` (`[{"id", "type": "function", "function": {"name", "arguments"}}]`) and
    /// `reasoning_content`, a tool message's `tool_call_id`, a `name`.
    pub fields: serde_json::Map<String, Json>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into(), fields: serde_json::Map::new() }
    }

    /// The message with the field `name` set to `value`.
    pub fn with(mut self, name: impl Into<String>, value: Json) -> ChatMessage {
        self.fields.insert(name.into(), value);
        self
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    source: String,
    /// Where the template came from, for error messages.
    origin: String,
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("origin", &self.origin).finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compile `source`; `origin` names it in error messages.
    pub fn new(source: impl Into<String>, origin: impl Into<String>) -> Result<ChatTemplate, LoadError> {
        let (source, origin) = (source.into(), origin.into());
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
        env.set_syntax(syntax.map_err(|e| template_error(&origin, &e))?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.clone()).map_err(|e| template_error(&origin, &e))?;
        Ok(ChatTemplate { source, origin, env, bos_token: None, eos_token: None })
    }

    /// The ChatML fallback.
    pub fn chatml() -> ChatTemplate {
        // The constant compiles (tested); an error here would be a bug in this file.
        ChatTemplate::new(CHATML_TEMPLATE, "built-in ChatML").expect("the built-in ChatML template compiles")
    }

    /// The template of the model in `dir`: `chat_template` of `tokenizer_config.json` (a string,
    /// or a list of `{name, template}` of which `default` is taken, else the first), else
    /// `chat_template.jinja`, else ChatML. `bos_token` and `eos_token` of
    /// `tokenizer_config.json` are passed to the template as transformers does.
    pub fn load(dir: impl AsRef<Path>) -> Result<ChatTemplate, LoadError> {
        let dir = dir.as_ref();
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.exists() { Some(read_json(&config_path)?) } else { None };
        let mut template = match config.as_ref().map(|c| template_source(&config_path, c)).transpose()?.flatten() {
            Some(source) => ChatTemplate::new(source, config_path.display().to_string())?,
            None => {
                let jinja = dir.join("chat_template.jinja");
                if jinja.exists() {
                    ChatTemplate::new(read_text(&jinja)?, jinja.display().to_string())?
                } else {
                    ChatTemplate::chatml()
                }
            }
        };
        if let Some(config) = &config {
            template.bos_token = special_token(&config_path, config, "bos_token")?;
            template.eos_token = special_token(&config_path, config, "eos_token")?;
        }
        Ok(template)
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render `messages`. `add_generation_prompt` opens an assistant turn; `extra` holds further
    /// template variables (`enable_thinking`, `tools`, ...). Object keys of `extra` reach the
    /// template in their insertion order, as a Python dict's would.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, Json>,
    ) -> Result<String, LoadError> {
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        for (key, value) in extra {
            if matches!(key.as_str(), "messages" | "add_generation_prompt") {
                return Err(LoadError::Template {
                    source_name: self.origin.clone(),
                    message: format!("extra variable \"{key}\" would replace the argument of the same name"),
                });
            }
            ctx.insert(key.clone(), from_json(value));
        }
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let fixed = [("role", Value::from(m.role.as_str())), ("content", Value::from(m.content.as_str()))];
                let fields = m.fields.iter().filter(|(k, _)| !matches!(k.as_str(), "role" | "content"));
                Value::from_pairs(fixed.into_iter().chain(fields.map(|(k, v)| (k.as_str(), from_json(v)))))
            })
            .collect();
        ctx.insert("messages".into(), Value::from(messages));
        ctx.insert("add_generation_prompt".into(), Value::from(add_generation_prompt));
        for (key, token) in [("bos_token", &self.bos_token), ("eos_token", &self.eos_token)] {
            if let Some(token) = token {
                ctx.entry(key.to_string()).or_insert_with(|| Value::from(token.as_str()));
            }
        }
        let template = self.env.get_template(NAME).map_err(|e| template_error(&self.origin, &e))?;
        template.render(Value::from_object(ctx)).map_err(|e| template_error(&self.origin, &e))
    }
}

fn template_error(origin: &str, e: &dyn std::fmt::Display) -> LoadError {
    LoadError::Template { source_name: origin.to_string(), message: e.to_string() }
}

/// `chat_template` of a tokenizer config: absent, a string, or a list of named templates.
fn template_source(path: &Path, config: &Json) -> Result<Option<String>, LoadError> {
    match config.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(list)) => {
            let named = |want: Option<&str>| {
                list.iter().find(|t| match want {
                    None => true,
                    Some(w) => t.get("name").and_then(Json::as_str) == Some(w),
                })
            };
            let chosen = named(Some("default")).or_else(|| named(None));
            match chosen.and_then(|t| t.get("template")).and_then(Json::as_str) {
                Some(s) => Ok(Some(s.to_string())),
                None if list.is_empty() => Ok(None),
                None => {
                    Err(LoadError::invalid(path, "chat_template is a list without a {name, template} string entry"))
                }
            }
        }
        Some(_) => Err(LoadError::invalid(path, "chat_template is neither a string nor a list of named templates")),
    }
}

/// `bos_token` / `eos_token`: a string, an added-token object `{"content": ...}`, or null.
fn special_token(path: &Path, config: &Json, key: &str) -> Result<Option<String>, LoadError> {
    match config.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(obj) => match obj.get("content").and_then(Json::as_str) {
            Some(s) => Ok(Some(s.to_string())),
            None => Err(LoadError::invalid(path, format!("{key} is neither a string nor a token with \"content\""))),
        },
    }
}

fn from_json(v: &Json) -> Value {
    match v {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(a) => Value::from(a.iter().map(from_json).collect::<Vec<_>>()),
        // In insertion order, as a Python dict: serde_json and minijinja both `preserve_order`.
        Json::Object(o) => Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), from_json(v)))),
    }
}

/// `raise_exception(message)`, which transformers provides to templates.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`, not HTML-escaped (unlike minijinja's own).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be (item, key)")),
        // Python's defaults: no space before a newline when indenting.
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = JsonStyle { indent, sort_keys: sort_keys.unwrap_or(false), item_sep, key_sep };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonStyle {
    indent: Option<usize>,
    sort_keys: bool,
    item_sep: String,
    key_sep: String,
}

fn write_json(out: &mut String, value: &Value, style: &JsonStyle, depth: usize) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = style.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&python_float(f64::try_from(value.clone())?)),
        ValueKind::String => write_json_string(out, value.as_str().unwrap_or_default()),
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, depth + 1);
                write_json_string(out, &key.to_string());
                out.push_str(&style.key_sep);
                write_json(out, &value.get_item(key)?, style, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, style, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialise a value of kind {kind}"),
            ))
        }
    }
    Ok(())
}

/// A float as `json.dumps` writes it (`1.0`, `0.5`, `NaN`, `Infinity`).
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's shortest round-trip form; Python's agrees outside exponent notation.
    format!("{x:?}")
}

/// A JSON string with `ensure_ascii=False`: only quotes, backslashes and control characters
/// are escaped.
fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}
