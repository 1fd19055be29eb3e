//! `tools`, `tool_choice` and `parallel_tool_calls` of a chat request.

use ruda_llm::constraint::{lark_json, lark_literal};
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::request::Fields;

/// What the model may or must do with the tools.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// The tools are not shown to the model and its reply is not parsed for calls.
    None,
    /// The model decides; `<tool_call>` blocks in the reply become `tool_calls`.
    Auto,
    /// The model must call one of the tools (decoding is constrained to a call).
    Required,
    /// The model must call this function.
    Function(String),
}

/// The tools of a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    /// The `tools` as the template receives them (`{"type": "function", "function": {...}}`).
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls`: more than one call per reply (default true).
    pub parallel: bool,
}

impl Tools {
    /// Whether the template is given the tools and the reply parsed for calls.
    pub fn active(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// With `required` or a named function: the JSON schema of one call, `{"name", "arguments"}`,
    /// for the decoder's constraint.
    pub fn forced_call_schema(&self) -> Option<Value> {
        let call = |tool: &Value| {
            let f = &tool["function"];
            let parameters = match f.get("parameters") {
                Some(p @ Value::Object(_)) => p.clone(),
                _ => json!({"type": "object"}),
            };
            json!({
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        };
        match &self.choice {
            ToolChoice::None | ToolChoice::Auto => None,
            ToolChoice::Required => Some(json!({"anyOf": self.tools.iter().map(call).collect::<Vec<_>>()})),
            ToolChoice::Function(name) => self.tools.iter().find(|t| t["function"]["name"] == name.as_str()).map(call),
        }
    }
}

impl Tools {
    /// With `required` or a named function: the Lark grammar the reply must follow, Qwen's
    /// `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` (one call, or with
    /// `parallel_tool_calls` one or more separated by newlines, as Qwen's template writes them).
    pub fn forced_call_grammar(&self) -> Option<String> {
        let schema = self.forced_call_schema()?;
        let call =
            format!("{} {} {}", lark_literal("<tool_call>\n"), lark_json(&schema), lark_literal("\n</tool_call>"));
        let more = matches!(self.choice, ToolChoice::Required) && self.parallel;
        Some(if more {
            format!("start: call ({} call)*\ncall: {call}", lark_literal("\n"))
        } else {
            format!("start: {call}")
        })
    }
}

/// Read `tools`, `tool_choice` and `parallel_tool_calls`.
pub fn tools(f: &mut Fields) -> Result<Tools, ApiError> {
    let tools = match f.take("tools") {
        None => Vec::new(),
        Some(Value::Array(items)) => {
            items.into_iter().enumerate().map(|(i, t)| tool(i, t)).collect::<Result<_, _>>()?
        }
        Some(_) => return Err(ApiError::param("tools", "'tools' must be an array of tools")),
    };
    let names: Vec<&str> = tools.iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    if let Some(dup) = names.iter().enumerate().find(|(i, n)| names[..*i].contains(n)).map(|(_, n)| n) {
        return Err(ApiError::param("tools", format!("'tools' names the function '{dup}' twice")));
    }
    let choice = match f.take("tool_choice") {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::param(
                    "tool_choice",
                    format!(
                        "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function, got \"{other}\""
                    ),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => ToolChoice::Function(name.to_string()),
                _ => {
                    return Err(ApiError::param(
                        "tool_choice",
                        "a named 'tool_choice' is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    ))
                }
            }
        }
        Some(_) => return Err(ApiError::param("tool_choice", "'tool_choice' must be a string or an object")),
    };
    match &choice {
        ToolChoice::Required | ToolChoice::Function(_) if tools.is_empty() => {
            return Err(ApiError::param("tool_choice", "'tool_choice' other than \"none\" or \"auto\" needs 'tools'"))
        }
        ToolChoice::Function(name) if !names.contains(&name.as_str()) => {
            return Err(ApiError::param(
                "tool_choice",
                format!("'tool_choice' names '{name}', which is not in 'tools'"),
            ))
        }
        _ => {}
    }
    let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
    Ok(Tools { tools, choice, parallel })
}

/// One tool: `{"type": "function", "function": {"name", "description"?, "parameters"?,
/// "strict"?}}`, checked and passed on as given.
fn tool(i: usize, t: Value) -> Result<Value, ApiError> {
    let at = format!("tools[{i}]");
    let bad = |what: &str| ApiError::param(at.clone(), format!("{at}: {what}"));
    let Value::Object(o) = &t else { return Err(bad("a tool must be an object")) };
    if o.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad("'type' must be \"function\""));
    }
    let Some(Value::Object(function)) = o.get("function") else { return Err(bad("'function' must be an object")) };
    match function.get("name").and_then(Value::as_str) {
        Some(name)
            if !name.is_empty()
                && name.len() <= 64
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') => {}
        _ => return Err(bad("'function.name' must be 1 to 64 letters, digits, '_' or '-'")),
    }
    match function.get("parameters") {
        None | Some(Value::Object(_)) => {}
        Some(_) => return Err(bad("'function.parameters' must be a JSON schema object")),
    }
    if let Some(k) = o.keys().find(|k| !matches!(k.as_str(), "type" | "function")) {
        return Err(bad(&format!("unknown field '{k}'")));
    }
    let known = ["name", "description", "parameters", "strict"];
    if let Some(k) = function.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(bad(&format!("unknown field 'function.{k}'")));
    }
    Ok(t)
}

/// An assistant message's `tool_calls`, for the template: each `{"id", "type": "function",
/// "function": {"name", "arguments"}}` with `arguments` parsed from its JSON text into an object,
/// as vLLM hands them to Qwen's templates.
pub fn message_tool_calls(at: &str, calls: Value) -> Result<Value, ApiError> {
    let Value::Array(calls) = calls else {
        return Err(ApiError::param(at, format!("{at} must be an array of tool calls")));
    };
    let mut out = Vec::with_capacity(calls.len());
    for (j, call) in calls.into_iter().enumerate() {
        let at = format!("{at}[{j}]");
        let bad = |what: &str| ApiError::param(at.clone(), format!("{at}: {what}"));
        let Value::Object(mut call) = call else { return Err(bad("a tool call must be an object")) };
        let Some(Value::Object(mut function)) = call.remove("function") else {
            return Err(bad("'function' must be an object"));
        };
        let name = match function.remove("name") {
            Some(Value::String(n)) => n,
            _ => return Err(bad("'function.name' must be a string")),
        };
        let arguments = match function.remove("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
                Ok(v @ Value::Object(_)) => v,
                _ => return Err(bad("'function.arguments' must be a JSON object in a string")),
            },
            Some(v @ Value::Object(_)) => v,
            Some(_) => return Err(bad("'function.arguments' must be a JSON object in a string")),
        };
        let mut entry = Map::new();
        if let Some(id) = call.remove("id") {
            entry.insert("id".into(), id);
        }
        entry.insert("type".into(), json!("function"));
        entry.insert("function".into(), json!({"name": name, "arguments": arguments}));
        out.push(Value::Object(entry));
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &str) -> Result<Tools, ApiError> {
        tools(&mut Fields::parse(body.as_bytes()).unwrap())
    }

    const WEATHER: &str = r#"{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}"#;

    #[test]
    fn choices_and_defaults() {
        assert_eq!(read("{}").unwrap().choice, ToolChoice::None);
        let t = read(&format!(r#"{{"tools":[{WEATHER}]}}"#)).unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert!(t.active() && t.parallel && t.forced_call_schema().is_none());
        let t = read(&format!(r#"{{"tools":[{WEATHER}],"tool_choice":"none"}}"#)).unwrap();
        assert!(!t.active());
        let t = read(&format!(
            r#"{{"tools":[{WEATHER}],"tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}},"parallel_tool_calls":false}}"#
        ))
        .unwrap();
        assert_eq!(t.choice, ToolChoice::Function("get_weather".into()));
        assert!(!t.parallel);
        let schema = t.forced_call_schema().unwrap();
        assert_eq!(schema["properties"]["name"]["const"], "get_weather");
        assert_eq!(schema["properties"]["arguments"]["properties"]["city"]["type"], "string");
        let t = read(&format!(r#"{{"tools":[{WEATHER}],"tool_choice":"required"}}"#)).unwrap();
        assert_eq!(t.forced_call_schema().unwrap()["anyOf"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn bad_tools_are_named() {
        for (body, param) in [
            (r#"{"tools":{}}"#.to_string(), "tools"),
            (r#"{"tools":[{"type":"retrieval"}]}"#.into(), "tools[0]"),
            (r#"{"tools":[{"type":"function","function":{"name":"a b"}}]}"#.into(), "tools[0]"),
            (r#"{"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]}"#.into(), "tools[0]"),
            (r#"{"tools":[{"type":"function","function":{"name":"f","frob":1}}]}"#.into(), "tools[0]"),
            (format!(r#"{{"tools":[{WEATHER},{WEATHER}]}}"#), "tools"),
            (r#"{"tool_choice":"required"}"#.into(), "tool_choice"),
            (format!(r#"{{"tools":[{WEATHER}],"tool_choice":"always"}}"#), "tool_choice"),
            (
                format!(r#"{{"tools":[{WEATHER}],"tool_choice":{{"type":"function","function":{{"name":"other"}}}}}}"#),
                "tool_choice",
            ),
            (format!(r#"{{"tools":[{WEATHER}],"parallel_tool_calls":"yes"}}"#), "parallel_tool_calls"),
        ] {
            assert_eq!(read(&body).unwrap_err().param.as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn message_tool_calls_parse_their_arguments() {
        let calls = serde_json::json!([
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"city\": \"Paris\"}"}},
            {"type": "function", "function": {"name": "g", "arguments": {"x": 1}}},
        ]);
        let v = message_tool_calls("messages[1].tool_calls", calls).unwrap();
        assert_eq!(
            v[0],
            json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"city": "Paris"}}})
        );
        assert_eq!(v[1]["function"]["arguments"], json!({"x": 1}));
        let bad = json!([{"function": {"name": "f", "arguments": "not json"}}]);
        let e = message_tool_calls("messages[1].tool_calls", bad).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].tool_calls[0]"));
    }
}
