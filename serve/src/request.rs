//! Parsing and validating OpenAI request bodies by hand, so every error names its field:
//! wrong types and values, fields not supported yet, and unknown fields are all 400s.

use ruda_llm::{ChatMessage, GenerateParams, ResponseFormat, SamplingConfig, MAX_TOP_LOGPROBS};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::tools::Tools;

/// Fields clients send routinely that change nothing here.
const IGNORED: &[&str] = &["user", "store", "metadata", "parallel_tool_calls", "service_tier"];

/// A field not supported yet: its name, what is not, and whether a value is the default.
type Unsupported = (&'static str, &'static str, fn(&Value) -> bool);

/// The fields of a JSON object body, taken one by one; what is left at the end is unknown.
pub struct Fields {
    map: Map<String, Value>,
}

impl Fields {
    /// Parse `body` as a JSON object.
    pub fn parse(body: &[u8]) -> Result<Fields, ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid(format!("The request body is not valid JSON: {e}")))?;
        match value {
            Value::Object(map) => Ok(Fields { map }),
            _ => Err(ApiError::invalid("The request body must be a JSON object")),
        }
    }

    /// The field, `null` read as absent.
    pub fn take(&mut self, name: &str) -> Option<Value> {
        self.map.remove(name).filter(|v| !v.is_null())
    }

    pub fn f64(&mut self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::param(name, format!("'{name}' must be a number"))),
        }
    }

    pub fn i64(&mut self, name: &str) -> Result<Option<i64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => {
                as_integer(&v).map(Some).ok_or_else(|| ApiError::param(name, format!("'{name}' must be an integer")))
            }
        }
    }

    pub fn bool(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(_) => Err(ApiError::param(name, format!("'{name}' must be a boolean"))),
        }
    }

    /// `model`, which must be the served name when given.
    pub fn model(&mut self, served: &str) -> Result<(), ApiError> {
        match self.take("model") {
            None => Ok(()),
            Some(Value::String(m)) if m == served => Ok(()),
            Some(Value::String(m)) => Err(ApiError::model_not_found(&m)),
            Some(_) => Err(ApiError::param("model", "'model' must be a string")),
        }
    }

    /// Drop the fields we accept and ignore, refuse what is not supported yet (unless it says
    /// the default), then refuse whatever is left.
    pub fn finish(mut self) -> Result<(), ApiError> {
        for name in IGNORED {
            self.map.remove(*name);
        }
        let unsupported: [Unsupported; 3] = [
            ("echo", "", |v| v == &Value::Bool(false)),
            ("best_of", "above 1", |v| v.as_f64() == Some(1.0)),
            ("suffix", "", |v| v.as_str() == Some("")),
        ];
        for (name, what, default) in unsupported {
            if let Some(v) = self.take(name) {
                if !default(&v) {
                    return Err(ApiError::unsupported(name, what));
                }
            }
        }
        match self.map.keys().next() {
            Some(name) => Err(ApiError::unknown(name)),
            None => Ok(()),
        }
    }
}

fn as_integer(v: &Value) -> Option<i64> {
    if let Some(i) = v.as_i64() {
        return Some(i);
    }
    // `1.0` is an integer as Python's JSON clients may send it.
    v.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e15).map(|f| f as i64)
}

/// The settings every generation endpoint shares.
#[derive(Clone, Debug, PartialEq)]
pub struct Common {
    /// `max_tokens`; `None`: the endpoint's default.
    pub max_tokens: Option<usize>,
    pub params: GenerateParams,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// `n`: choices per prompt.
    pub n: usize,
    /// `response_format` other than `text`, compiled into `params.constraint` before admission.
    pub response_format: Option<ResponseFormat>,
}

/// The most choices per prompt (each is a request of its own in the engine).
pub const MAX_N: i64 = 128;

/// Read the shared fields (the endpoint reads its own before or after). `max_token_fields` are
/// the names `max_tokens` goes by, the first given wins.
pub fn common(f: &mut Fields, max_token_fields: &[&str]) -> Result<Common, ApiError> {
    let mut max_tokens = None;
    for name in max_token_fields {
        if let Some(n) = f.i64(name)? {
            if n < 1 {
                return Err(ApiError::param(*name, format!("'{name}' must be at least 1, got {n}")));
            }
            max_tokens = max_tokens.or(Some(usize::try_from(n).unwrap_or(usize::MAX)));
        }
    }
    let temperature = f.f64("temperature")?.unwrap_or(1.0);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::param("temperature", format!("'temperature' must be at least 0, got {temperature}")));
    }
    let top_p = f.f64("top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::param("top_p", format!("'top_p' must be in (0, 1], got {top_p}")));
    }
    let min_p = f.f64("min_p")?.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::param("min_p", format!("'min_p' must be in [0, 1], got {min_p}")));
    }
    let top_k = f.i64("top_k")?.unwrap_or(-1);
    if top_k < -1 || top_k > i64::from(u32::MAX) {
        return Err(ApiError::param("top_k", format!("'top_k' must be -1 (off), 0 (off) or positive, got {top_k}")));
    }
    let seed = f.i64("seed")?.map(|s| s as u64);
    let repetition_penalty = f.f64("repetition_penalty")?.unwrap_or(1.0);
    if !(repetition_penalty.is_finite() && repetition_penalty > 0.0) {
        return Err(ApiError::param(
            "repetition_penalty",
            format!("'repetition_penalty' must be positive, got {repetition_penalty}"),
        ));
    }
    let mut penalty = |name: &str| -> Result<f32, ApiError> {
        let v = f.f64(name)?.unwrap_or(0.0);
        if !(-2.0..=2.0).contains(&v) {
            return Err(ApiError::param(name, format!("'{name}' must be in [-2, 2], got {v}")));
        }
        Ok(v as f32)
    };
    let (presence_penalty, frequency_penalty) = (penalty("presence_penalty")?, penalty("frequency_penalty")?);
    let logit_bias = match f.take("logit_bias") {
        None => Vec::new(),
        Some(Value::Object(map)) => {
            let mut bias = Vec::with_capacity(map.len());
            for (id, v) in map {
                let id = id.parse::<u32>().map_err(|_| {
                    ApiError::param("logit_bias", format!("'logit_bias' keys must be token ids, got {id:?}"))
                })?;
                match v.as_f64() {
                    Some(b) if (-100.0..=100.0).contains(&b) => bias.push((id, b as f32)),
                    _ => {
                        return Err(ApiError::param(
                            "logit_bias",
                            format!("'logit_bias' of token {id} must be a number in [-100, 100], got {v}"),
                        ))
                    }
                }
            }
            bias
        }
        Some(_) => return Err(ApiError::param("logit_bias", "'logit_bias' must be an object of token id to bias")),
    };
    let stop_sequences = match f.take("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => {
            if items.len() > 4 {
                return Err(ApiError::param("stop", "'stop' takes at most 4 sequences"));
            }
            items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(ApiError::param("stop", "'stop' must be a string or an array of strings")),
                })
                .collect::<Result<_, _>>()?
        }
        Some(_) => return Err(ApiError::param("stop", "'stop' must be a string or an array of strings")),
    };
    if stop_sequences.iter().any(String::is_empty) {
        return Err(ApiError::param("stop", "'stop' sequences must not be empty"));
    }
    let n = match f.i64("n")?.unwrap_or(1) {
        n @ 1..=MAX_N => n as usize,
        n => return Err(ApiError::param("n", format!("'n' must be from 1 to {MAX_N}, got {n}"))),
    };
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.take("stream_options") {
        None => false,
        Some(Value::Object(mut o)) => {
            let usage = match o.remove("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => b,
                Some(_) => return Err(ApiError::param("stream_options", "'include_usage' must be a boolean")),
            };
            // `continuous_usage_stats` (vLLM) is accepted as false only.
            if let Some(k) = o.keys().find(|k| *k != "continuous_usage_stats") {
                return Err(ApiError::param("stream_options", format!("Unrecognized stream option: {k}")));
            }
            usage
        }
        Some(_) => return Err(ApiError::param("stream_options", "'stream_options' must be an object")),
    };
    if include_usage && !stream {
        return Err(ApiError::param("stream_options", "'stream_options' is only allowed when 'stream' is true"));
    }
    let response_format = match f.take("response_format") {
        None => None,
        Some(v) => response_format(v)?,
    };
    let sampling = (temperature > 0.0).then(|| SamplingConfig {
        temperature: temperature as f32,
        top_k: top_k.max(0) as usize,
        top_p: top_p as f32,
        seed,
        min_p: min_p as f32,
    });
    Ok(Common {
        max_tokens,
        params: GenerateParams {
            max_new_tokens: 0,
            eos_token_ids: Vec::new(),
            sampling,
            stop_sequences,
            repetition_penalty: repetition_penalty as f32,
            presence_penalty,
            frequency_penalty,
            logit_bias,
            logprobs: None,
            constraint: None,
        },
        ignore_eos,
        stream,
        include_usage,
        n,
        response_format,
    })
}

/// Chat's `logprobs` (a boolean) and `top_logprobs` (0 to 20, only with `logprobs`): how many
/// top tokens each generated token reports, `None` when off.
pub fn chat_logprobs(f: &mut Fields) -> Result<Option<usize>, ApiError> {
    let on = f.bool("logprobs")?.unwrap_or(false);
    let top = f.i64("top_logprobs")?;
    match top {
        Some(n) if !(0..=MAX_TOP_LOGPROBS as i64).contains(&n) => {
            Err(ApiError::param("top_logprobs", format!("'top_logprobs' must be in [0, {MAX_TOP_LOGPROBS}], got {n}")))
        }
        Some(n) if n > 0 && !on => {
            Err(ApiError::param("top_logprobs", "'top_logprobs' is only allowed when 'logprobs' is true"))
        }
        _ => Ok(on.then_some(top.unwrap_or(0) as usize)),
    }
}

/// The most top tokens `/v1/completions`' `logprobs` asks for (OpenAI's limit).
pub const MAX_COMPLETION_LOGPROBS: i64 = 5;

/// Completions' `logprobs`: an integer 0 to 5 (the top tokens per generated token), `None`
/// when absent.
pub fn completion_logprobs(f: &mut Fields) -> Result<Option<usize>, ApiError> {
    match f.i64("logprobs")? {
        None => Ok(None),
        Some(n) if (0..=MAX_COMPLETION_LOGPROBS).contains(&n) => Ok(Some(n as usize)),
        Some(n) => {
            Err(ApiError::param("logprobs", format!("'logprobs' must be in [0, {MAX_COMPLETION_LOGPROBS}], got {n}")))
        }
    }
}

/// `response_format` in OpenAI's shapes: `{"type": "text"}` (no constraint), `{"type":
/// "json_object"}`, `{"type": "json_schema", "json_schema": {"name", "schema", "strict",
/// "description"}}` (`name` required; no `schema` means any JSON).
fn response_format(v: Value) -> Result<Option<ResponseFormat>, ApiError> {
    let bad = |m: String| ApiError::param("response_format", m);
    let Value::Object(mut o) = v else {
        return Err(bad("'response_format' must be an object with a 'type'".into()));
    };
    let kind = match o.remove("type") {
        Some(Value::String(t)) => t,
        _ => return Err(bad("'response_format.type' is required and must be a string".into())),
    };
    let format = match kind.as_str() {
        "text" => None,
        "json_object" => Some(ResponseFormat::JsonObject),
        "json_schema" => {
            let Some(Value::Object(mut js)) = o.remove("json_schema") else {
                return Err(bad("'response_format.json_schema' is required and must be an object".into()));
            };
            match js.remove("name") {
                Some(Value::String(n))
                    if !n.is_empty()
                        && n.len() <= 64
                        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') => {}
                _ => {
                    return Err(bad(
                        "'response_format.json_schema.name' is required: 1 to 64 of a-z, A-Z, 0-9, '_' and '-'".into(),
                    ))
                }
            }
            if !matches!(js.remove("description"), None | Some(Value::Null) | Some(Value::String(_))) {
                return Err(bad("'response_format.json_schema.description' must be a string".into()));
            }
            let strict = match js.remove("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => b,
                Some(_) => return Err(bad("'response_format.json_schema.strict' must be a boolean".into())),
            };
            let schema = match js.remove("schema") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(s @ Value::Object(_)) => s,
                Some(_) => return Err(bad("'response_format.json_schema.schema' must be a JSON Schema object".into())),
            };
            if let Some(k) = js.keys().next() {
                return Err(bad(format!("Unrecognized field 'response_format.json_schema.{k}'")));
            }
            Some(ResponseFormat::JsonSchema { schema, strict })
        }
        other => {
            return Err(bad(format!(
                "'response_format.type' must be 'text', 'json_object' or 'json_schema', got '{other}'"
            )))
        }
    };
    if let Some(k) = o.keys().next() {
        return Err(bad(format!("Unrecognized field 'response_format.{k}' for type '{kind}'")));
    }
    Ok(format)
}

/// A prompt as given: text, or token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// `prompt` of `/v1/completions`: a string, an array of strings, token ids, or an array of
/// token id arrays.
pub fn prompts(f: &mut Fields) -> Result<Vec<Prompt>, ApiError> {
    let bad = || {
        ApiError::param("prompt", "'prompt' must be a string, an array of strings, or token ids (an array of integers)")
    };
    let ids = |items: &[Value]| -> Option<Vec<u32>> {
        items.iter().map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok())).collect()
    };
    let prompts = match f.take("prompt") {
        None => return Err(ApiError::param("prompt", "'prompt' is required")),
        Some(Value::String(s)) => vec![Prompt::Text(s)],
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_number) => {
            vec![Prompt::Ids(ids(&items).ok_or_else(bad)?)]
        }
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(Prompt::Text(s)),
                Value::Array(a) if a.iter().all(Value::is_number) => ids(&a).map(Prompt::Ids).ok_or_else(bad),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if prompts.is_empty() {
        return Err(ApiError::param("prompt", "'prompt' must not be an empty array"));
    }
    Ok(prompts)
}

/// `messages`: roles `system` (or `developer`), `user`, `assistant` (with `tool_calls` and
/// `reasoning_content`) and `tool` (with `tool_call_id`); string content or an array of text
/// parts (joined).
pub fn messages(f: &mut Fields) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(value) = f.take("messages") else {
        return Err(ApiError::param("messages", "'messages' is required"));
    };
    let Value::Array(items) = value else {
        return Err(ApiError::param("messages", "'messages' must be an array"));
    };
    if items.is_empty() {
        return Err(ApiError::param("messages", "'messages' must not be empty"));
    }
    items.into_iter().enumerate().map(|(i, m)| message(i, m)).collect()
}

fn message(i: usize, m: Value) -> Result<ChatMessage, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let Value::Object(mut o) = m else {
        return Err(ApiError::param(format!("messages[{i}]"), format!("messages[{i}] must be an object")));
    };
    let role = match o.remove("role") {
        Some(Value::String(r)) => match r.as_str() {
            "system" | "developer" => "system".to_string(),
            "user" | "assistant" | "tool" => r,
            other => {
                return Err(ApiError::param(
                    at("role"),
                    format!(
                        "{}: role '{other}' is not supported (system, developer, user, assistant, tool)",
                        at("role")
                    ),
                ))
            }
        },
        _ => return Err(ApiError::param(at("role"), format!("{} is required and must be a string", at("role")))),
    };
    let content = match o.remove("content") {
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.into_iter().enumerate() {
                let path = format!("messages[{i}].content[{j}]");
                match part {
                    Value::Object(p) if p.get("type") == Some(&Value::from("text")) => match p.get("text") {
                        Some(Value::String(t)) => text.push_str(t),
                        _ => return Err(ApiError::param(path.clone(), format!("{path}.text must be a string"))),
                    },
                    _ => return Err(ApiError::unsupported(&path, "(content parts other than {\"type\": \"text\"})")),
                }
            }
            text
        }
        None | Some(Value::Null) if role == "assistant" => String::new(),
        _ => {
            return Err(ApiError::param(
                at("content"),
                format!("{} must be a string or an array of text parts", at("content")),
            ))
        }
    };
    let mut message = ChatMessage::new(role.as_str(), content);
    for (key, value) in o {
        if value.is_null() {
            continue;
        }
        let string = |value: Value| match value {
            Value::String(s) => Ok(Value::String(s)),
            _ => Err(ApiError::param(at(&key), format!("{} must be a string", at(&key)))),
        };
        let value = match (role.as_str(), key.as_str()) {
            (_, "name") => string(value)?,
            ("assistant", "tool_calls") => crate::tools::message_tool_calls(&at("tool_calls"), value)?,
            // vLLM's newer spelling of the same.
            ("assistant", "reasoning_content" | "reasoning") => {
                message = message.with("reasoning_content", string(value)?);
                continue;
            }
            ("tool", "tool_call_id") => string(value)?,
            _ if value.as_array().is_some_and(Vec::is_empty) => continue,
            _ => return Err(ApiError::unsupported(&at(&key), "")),
        };
        message = message.with(key, value);
    }
    Ok(message)
}

/// `chat_template_kwargs`: further template variables (`enable_thinking`, ...).
fn template_kwargs(f: &mut Fields) -> Result<Map<String, Value>, ApiError> {
    let name = "chat_template_kwargs";
    let kwargs = match f.take(name) {
        None => Map::new(),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(ApiError::param(name, format!("'{name}' must be an object"))),
    };
    if let Some(k) = kwargs.keys().find(|k| matches!(k.as_str(), "messages" | "add_generation_prompt" | "tools")) {
        return Err(ApiError::param(name, format!("'{name}' must not set '{k}', which the request sets")));
    }
    if kwargs.get("enable_thinking").is_some_and(|v| !v.is_boolean()) {
        return Err(ApiError::param(name, format!("'{name}.enable_thinking' must be a boolean")));
    }
    Ok(kwargs)
}

/// The template's variables besides the messages: `chat_template_kwargs`, and `tools` when
/// they are shown to the model.
pub fn template_variables(f: &mut Fields, tools: &Tools) -> Result<Map<String, Value>, ApiError> {
    let mut extra = template_kwargs(f)?;
    if tools.active() {
        extra.insert("tools".into(), Value::Array(tools.tools.clone()));
    }
    Ok(extra)
}

/// `POST /tokenize`'s body.
pub enum TokenizeInput {
    Prompt {
        text: String,
        add_special_tokens: bool,
    },
    Messages {
        messages: Vec<ChatMessage>,
        add_generation_prompt: bool,
        add_special_tokens: bool,
        /// `tools` and `chat_template_kwargs`, as a chat request gives them.
        extra: Map<String, Value>,
    },
}

pub fn tokenize(mut f: Fields, served: &str) -> Result<TokenizeInput, ApiError> {
    f.model(served)?;
    let input = if f.map.contains_key("messages") {
        let messages = messages(&mut f)?;
        let tools = crate::tools::tools(&mut f)?;
        TokenizeInput::Messages {
            messages,
            add_generation_prompt: f.bool("add_generation_prompt")?.unwrap_or(true),
            add_special_tokens: f.bool("add_special_tokens")?.unwrap_or(false),
            extra: template_variables(&mut f, &tools)?,
        }
    } else {
        let text = match f.take("prompt") {
            Some(Value::String(s)) => s,
            Some(_) => return Err(ApiError::param("prompt", "'prompt' must be a string")),
            None => return Err(ApiError::param("prompt", "'prompt' or 'messages' is required")),
        };
        TokenizeInput::Prompt { text, add_special_tokens: f.bool("add_special_tokens")?.unwrap_or(true) }
    };
    f.finish()?;
    Ok(input)
}

/// `POST /detokenize`'s token ids.
pub fn detokenize(mut f: Fields, served: &str) -> Result<Vec<u32>, ApiError> {
    f.model(served)?;
    let bad = || ApiError::param("tokens", "'tokens' must be an array of token ids");
    let tokens = match f.take("tokens") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok()).ok_or_else(bad))
            .collect::<Result<Vec<u32>, _>>()?,
        _ => return Err(bad()),
    };
    f.finish()?;
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(s: &str) -> Fields {
        Fields::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn common_fields_map_to_generate_params() {
        let mut f =
            fields(r#"{"temperature":0.5,"top_k":-1,"top_p":0.9,"seed":7,"stop":["a","b"],"max_tokens":3,"user":"x"}"#);
        let c = common(&mut f, &["max_tokens"]).unwrap();
        f.finish().unwrap();
        assert_eq!(c.max_tokens, Some(3));
        assert_eq!(
            c.params.sampling,
            Some(SamplingConfig { temperature: 0.5, top_k: 0, top_p: 0.9, seed: Some(7), min_p: 0.0 })
        );
        assert_eq!(c.params.stop_sequences, vec!["a", "b"]);
        let mut f = fields(r#"{"temperature":0}"#);
        assert_eq!(common(&mut f, &["max_tokens"]).unwrap().params.sampling, None);
    }

    #[test]
    fn bad_fields_are_named() {
        for (body, param) in [
            (r#"{"max_tokens":0}"#, "max_tokens"),
            (r#"{"max_tokens":"3"}"#, "max_tokens"),
            (r#"{"temperature":-1}"#, "temperature"),
            (r#"{"top_p":0}"#, "top_p"),
            (r#"{"top_p":1.5}"#, "top_p"),
            (r#"{"top_k":-2}"#, "top_k"),
            (r#"{"n":129}"#, "n"),
            (r#"{"n":0}"#, "n"),
            (r#"{"stop":["a","b","c","d","e"]}"#, "stop"),
            (r#"{"presence_penalty":2.5}"#, "presence_penalty"),
            (r#"{"frequency_penalty":"x"}"#, "frequency_penalty"),
            (r#"{"logit_bias":{"x":1}}"#, "logit_bias"),
            (r#"{"logit_bias":{"1":101}}"#, "logit_bias"),
            (r#"{"logit_bias":[1]}"#, "logit_bias"),
            (r#"{"min_p":-0.1}"#, "min_p"),
            (r#"{"min_p":1.5}"#, "min_p"),
            (r#"{"min_p":"x"}"#, "min_p"),
        ] {
            let mut f = fields(body);
            let e = common(&mut f, &["max_tokens"]).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
        let body = r#"{"presence_penalty":0.5,"frequency_penalty":-1,"logit_bias":{"5":-100,"7":2.5}}"#;
        let c = common(&mut fields(body), &["max_tokens"]).unwrap();
        assert_eq!((c.params.presence_penalty, c.params.frequency_penalty), (0.5, -1.0));
        let mut bias = c.params.logit_bias.clone();
        bias.sort_by_key(|b| b.0);
        assert_eq!(bias, [(5, -100.0), (7, 2.5)]);
        let c = common(&mut fields(r#"{"min_p":0.25}"#), &["max_tokens"]).unwrap();
        assert_eq!(c.params.sampling.map(|s| s.min_p), Some(0.25));
        for (body, want) in [
            (r#"{}"#, None),
            (r#"{"logprobs":false}"#, None),
            (r#"{"logprobs":false,"top_logprobs":0}"#, None),
            (r#"{"logprobs":true}"#, Some(0)),
            (r#"{"logprobs":true,"top_logprobs":20}"#, Some(20)),
        ] {
            assert_eq!(chat_logprobs(&mut fields(body)).unwrap(), want, "{body}");
        }
        for (body, param) in [
            (r#"{"logprobs":1}"#, "logprobs"),
            (r#"{"logprobs":true,"top_logprobs":21}"#, "top_logprobs"),
            (r#"{"logprobs":true,"top_logprobs":-1}"#, "top_logprobs"),
            (r#"{"top_logprobs":3}"#, "top_logprobs"),
            (r#"{"logprobs":false,"top_logprobs":3}"#, "top_logprobs"),
        ] {
            assert_eq!(chat_logprobs(&mut fields(body)).unwrap_err().param.as_deref(), Some(param), "{body}");
        }
        assert_eq!(completion_logprobs(&mut fields(r#"{"logprobs":5}"#)).unwrap(), Some(5));
        assert_eq!(completion_logprobs(&mut fields(r#"{"logprobs":0}"#)).unwrap(), Some(0));
        for body in [r#"{"logprobs":6}"#, r#"{"logprobs":-1}"#, r#"{"logprobs":true}"#] {
            let e = completion_logprobs(&mut fields(body)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("logprobs"), "{body}");
        }
        for (body, param) in [
            (r#"{"tools":[{"type":"function"}]}"#, "tools"),
            (r#"{"tool_choice":"none"}"#, "tool_choice"),
            (r#"{"echo":true}"#, "echo"),
            (r#"{"best_of":2}"#, "best_of"),
            (r#"{"suffix":"x"}"#, "suffix"),
            (r#"{"frobnicate":1}"#, "frobnicate"),
        ] {
            let e = fields(body).finish().unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
        fields(r#"{"echo":false,"best_of":1,"store":false,"metadata":{}}"#).finish().unwrap();
    }

    #[test]
    fn response_formats() {
        let format = |body: &str| common(&mut fields(body), &["max_tokens"]).map(|c| c.response_format);
        assert_eq!(format(r#"{"response_format":{"type":"text"}}"#).unwrap(), None);
        assert_eq!(format(r#"{"response_format":{"type":"json_object"}}"#).unwrap(), Some(ResponseFormat::JsonObject));
        let schema = r#"{"response_format":{"type":"json_schema","json_schema":{"name":"a-b_1","description":"d","strict":true,"schema":{"type":"object"}}}}"#;
        assert_eq!(
            format(schema).unwrap(),
            Some(ResponseFormat::JsonSchema { schema: serde_json::json!({"type": "object"}), strict: true })
        );
        let any = r#"{"response_format":{"type":"json_schema","json_schema":{"name":"x"}}}"#;
        assert_eq!(
            format(any).unwrap(),
            Some(ResponseFormat::JsonSchema { schema: serde_json::json!({}), strict: false })
        );
        for body in [
            r#"{"response_format":"json"}"#,
            r#"{"response_format":{}}"#,
            r#"{"response_format":{"type":"xml"}}"#,
            r#"{"response_format":{"type":"text","json_schema":{}}}"#,
            r#"{"response_format":{"type":"json_schema"}}"#,
            r#"{"response_format":{"type":"json_schema","json_schema":{"schema":{}}}}"#,
            r#"{"response_format":{"type":"json_schema","json_schema":{"name":"a b"}}}"#,
            r#"{"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":"yes"}}}"#,
            r#"{"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":[1]}}}"#,
            r#"{"response_format":{"type":"json_schema","json_schema":{"name":"x","extra":1}}}"#,
        ] {
            let e = format(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("response_format"), "{body}");
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn prompts_and_messages() {
        let p = prompts(&mut fields(r#"{"prompt":["a","b"]}"#)).unwrap();
        assert_eq!(p, vec![Prompt::Text("a".into()), Prompt::Text("b".into())]);
        assert_eq!(prompts(&mut fields(r#"{"prompt":[1,2]}"#)).unwrap(), vec![Prompt::Ids(vec![1, 2])]);
        let m = messages(&mut fields(
            r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        ))
        .unwrap();
        assert_eq!(m, vec![ChatMessage::new("system", "s"), ChatMessage::new("user", "ab")]);
        assert!(messages(&mut fields(r#"{"messages":[{"role":"function","content":"x"}]}"#)).is_err());
        let m = messages(&mut fields(
            r#"{"messages":[{"role":"assistant","content":null,"reasoning_content":"r","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]}"#,
        ))
        .unwrap();
        assert_eq!(m[0].fields["reasoning_content"], "r");
        assert_eq!(m[0].fields["tool_calls"][0]["function"]["arguments"], serde_json::json!({}));
        assert_eq!(m[1], ChatMessage::new("tool", "ok").with("tool_call_id", "c".into()));
        let e = messages(&mut fields(r#"{"messages":[{"role":"tool","content":"x","tool_calls":[]}]}"#));
        assert!(e.is_ok(), "an empty array is nothing");
        let e =
            messages(&mut fields(r#"{"messages":[{"role":"user","content":"x","tool_call_id":"c"}]}"#)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_call_id"));
    }
}
