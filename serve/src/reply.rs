//! Splitting a chat reply as it streams: Qwen3's thinking (`<think>…</think>`) into
//! `reasoning_content`, and Qwen's `<tool_call>{"name": …, "arguments": …}</tool_call>` blocks
//! into `tool_calls` (the Hermes format vLLM's `hermes` parser reads). One state machine serves
//! both the streamed and the whole answer, so their text is the same.

use serde_json::{json, Value};

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";
const TOOL_START: &str = "<tool_call>";
const TOOL_END: &str = "</tool_call>";

/// A piece of the reply, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
}

/// A parsed tool call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text, as OpenAI's `function.arguments` holds them.
    pub arguments: String,
}

impl ToolCall {
    /// OpenAI's `tool_calls` entry; `index` is set in streamed deltas only.
    pub fn to_json(&self, id: &str, index: Option<usize>) -> Value {
        let mut v = json!({"id": id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}});
        if let Some(i) = index {
            v["index"] = json!(i);
        }
        v
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Nothing but whitespace yet; a `<think>` here opens the reasoning.
    Start,
    Reasoning,
    Content,
    /// Inside the tool calls, which are parsed at the end.
    ToolCalls,
}

/// How a reply is read.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplyFormat {
    /// The template knows Qwen3's thinking: split it out.
    pub thinking: bool,
    /// The prompt ends inside an open `<think>` (templates that open it for the model).
    pub starts_in_reasoning: bool,
    /// Tools were offered: parse `<tool_call>` blocks.
    pub tools: bool,
}

impl ReplyFormat {
    /// The format for a chat reply to `prompt`, rendered by a template that knows thinking when
    /// `thinking`.
    pub fn for_prompt(prompt: &str, thinking: bool, tools: bool) -> ReplyFormat {
        let starts_in_reasoning = thinking && prompt.trim_end().ends_with(THINK_START);
        ReplyFormat { thinking, starts_in_reasoning, tools }
    }
}

/// The incremental splitter of one reply.
#[derive(Debug)]
pub struct ReplyParser {
    format: ReplyFormat,
    mode: Mode,
    /// Text not handed on yet: it may be the start of a tag.
    pending: String,
    /// The text from the first `<tool_call>` on.
    tool_text: String,
}

/// What is left at the end of a reply.
#[derive(Debug, Default, PartialEq)]
pub struct ReplyEnd {
    pub deltas: Vec<Delta>,
    pub tool_calls: Vec<ToolCall>,
}

impl ReplyParser {
    pub fn new(format: ReplyFormat) -> ReplyParser {
        let mode = match (format.thinking, format.starts_in_reasoning) {
            (true, true) => Mode::Reasoning,
            (true, false) => Mode::Start,
            (false, _) => Mode::Content,
        };
        ReplyParser { format, mode, pending: String::new(), tool_text: String::new() }
    }

    /// Take the next text of the reply; what can be handed on now.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.mode {
                Mode::Start => {
                    let trimmed = self.pending.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(THINK_START) {
                        self.pending = rest.to_string();
                        self.mode = Mode::Reasoning;
                    } else if THINK_START.starts_with(trimmed) {
                        return out;
                    } else {
                        self.mode = Mode::Content;
                    }
                }
                Mode::Reasoning => match self.pending.find(THINK_END) {
                    Some(at) => {
                        push_delta(&mut out, Delta::Reasoning(self.pending[..at].to_string()));
                        self.pending.drain(..at + THINK_END.len());
                        self.mode = Mode::Content;
                    }
                    None => {
                        let keep = partial_tag_len(&self.pending, THINK_END);
                        let ready: String = self.pending.drain(..self.pending.len() - keep).collect();
                        push_delta(&mut out, Delta::Reasoning(ready));
                        return out;
                    }
                },
                Mode::Content if !self.format.tools => {
                    push_delta(&mut out, Delta::Content(std::mem::take(&mut self.pending)));
                    return out;
                }
                Mode::Content => match self.pending.find(TOOL_START) {
                    Some(at) => {
                        push_delta(&mut out, Delta::Content(self.pending[..at].to_string()));
                        self.tool_text = self.pending.split_off(at);
                        self.pending.clear();
                        self.mode = Mode::ToolCalls;
                    }
                    None => {
                        let keep = partial_tag_len(&self.pending, TOOL_START);
                        let ready: String = self.pending.drain(..self.pending.len() - keep).collect();
                        push_delta(&mut out, Delta::Content(ready));
                        return out;
                    }
                },
                Mode::ToolCalls => {
                    self.tool_text.push_str(&std::mem::take(&mut self.pending));
                    return out;
                }
            }
        }
    }

    /// The end of the reply: what was held back, and the tool calls. Tool call text that does
    /// not parse is handed on as content, as vLLM's parser does.
    pub fn finish(mut self) -> ReplyEnd {
        let mut end = ReplyEnd::default();
        let rest = std::mem::take(&mut self.pending);
        match self.mode {
            Mode::Reasoning => push_delta(&mut end.deltas, Delta::Reasoning(rest)),
            Mode::Start | Mode::Content => push_delta(&mut end.deltas, Delta::Content(rest)),
            Mode::ToolCalls => match parse_tool_calls(&self.tool_text) {
                Some(calls) => end.tool_calls = calls,
                None => push_delta(&mut end.deltas, Delta::Content(std::mem::take(&mut self.tool_text))),
            },
        }
        end
    }
}

fn push_delta(out: &mut Vec<Delta>, delta: Delta) {
    match &delta {
        Delta::Reasoning(t) | Delta::Content(t) if t.is_empty() => {}
        _ => out.push(delta),
    }
}

/// The length of the longest end of `text` that starts `tag` (a tag that may still come).
fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// `<tool_call>{json}</tool_call>` blocks (the last one may be unterminated), each
/// `{"name": string, "arguments": object}`; `None` when any block is not one.
pub fn parse_tool_calls(text: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(TOOL_START) {
        let body = &rest[at + TOOL_START.len()..];
        let (inner, next) = match body.find(TOOL_END) {
            Some(end) => (&body[..end], &body[end + TOOL_END.len()..]),
            None => (body, ""),
        };
        let value: Value = serde_json::from_str(inner.trim()).ok()?;
        let name = value.get("name")?.as_str()?.to_string();
        let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
            None | Some(Value::Null) => "{}".to_string(),
            Some(Value::Object(o)) => serde_json::to_string(o).ok()?,
            // Some models write the arguments as a JSON string already.
            Some(Value::String(s)) if serde_json::from_str::<Value>(s).is_ok_and(|v| v.is_object()) => s.clone(),
            Some(_) => return None,
        };
        calls.push(ToolCall { name, arguments });
        rest = next;
    }
    (!calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `pieces` one by one; the deltas merged by kind, and the end.
    fn run(format: ReplyFormat, pieces: &[&str]) -> (Vec<Delta>, Vec<ToolCall>) {
        let mut p = ReplyParser::new(format);
        let mut deltas: Vec<Delta> = pieces.iter().flat_map(|t| p.push(t)).collect();
        let end = p.finish();
        deltas.extend(end.deltas);
        let mut merged: Vec<Delta> = Vec::new();
        for d in deltas {
            match (merged.last_mut(), d) {
                (Some(Delta::Reasoning(a)), Delta::Reasoning(b)) | (Some(Delta::Content(a)), Delta::Content(b)) => {
                    a.push_str(&b)
                }
                (_, d) => merged.push(d),
            }
        }
        (merged, end.tool_calls)
    }

    fn every_split(text: &str) -> Vec<Vec<&str>> {
        let mut splits = vec![vec![text]];
        for i in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            splits.push(vec![&text[..i], &text[i..]]);
        }
        // One character at a time.
        splits.push(text.char_indices().map(|(i, c)| &text[i..i + c.len_utf8()]).collect());
        splits
    }

    const THINKING: ReplyFormat = ReplyFormat { thinking: true, starts_in_reasoning: false, tools: false };
    const TOOLS: ReplyFormat = ReplyFormat { thinking: true, starts_in_reasoning: false, tools: true };

    #[test]
    fn thinking_is_split_out_however_the_text_arrives() {
        let text = "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4 — <b>four</b>.";
        for pieces in every_split(text) {
            let (deltas, calls) = run(THINKING, &pieces);
            assert_eq!(
                deltas,
                [Delta::Reasoning("\nLet me see: 2+2.\n".into()), Delta::Content("\n\nIt is 4 — <b>four</b>.".into())],
                "{pieces:?}"
            );
            assert!(calls.is_empty());
        }
    }

    #[test]
    fn thinking_edge_cases() {
        // No thinking in the template: the tags are text.
        let plain = ReplyFormat::default();
        assert_eq!(run(plain, &["<think>x</think>y"]).0, [Delta::Content("<think>x</think>y".into())]);
        // Content first: a later <think> is text.
        assert_eq!(run(THINKING, &["a <think>x"]).0, [Delta::Content("a <think>x".into())]);
        // Truncated inside the thinking: all of it is reasoning, the partial tag included.
        assert_eq!(run(THINKING, &["<think>abc</thi"]).0, [Delta::Reasoning("abc</thi".into())]);
        // A template that opened <think> for the model.
        let opened = ReplyFormat::for_prompt("<|im_start|>assistant\n<think>\n", true, false);
        assert!(opened.starts_in_reasoning);
        assert_eq!(run(opened, &["r</think>c"]).0, [Delta::Reasoning("r".into()), Delta::Content("c".into())]);
        let closed = ReplyFormat::for_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n", true, false);
        assert!(!closed.starts_in_reasoning);
        // Only whitespace: content.
        assert_eq!(run(THINKING, &["  "]).0, [Delta::Content("  ".into())]);
        // A prefix of <think> that turns out not to be one.
        assert_eq!(run(THINKING, &["<thi", "s"]).0, [Delta::Content("<this".into())]);
    }

    #[test]
    fn tool_calls_are_parsed_however_the_text_arrives() {
        let text = "<think>use the tool</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        for pieces in every_split(text) {
            let (deltas, calls) = run(TOOLS, &pieces);
            assert_eq!(deltas, [Delta::Reasoning("use the tool".into()), Delta::Content("\n\n".into())], "{pieces:?}");
            assert_eq!(
                calls,
                [
                    ToolCall { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() },
                    ToolCall { name: "now".into(), arguments: "{}".into() },
                ]
            );
        }
    }

    #[test]
    fn tool_call_edge_cases() {
        let no_think = ReplyFormat { tools: true, ..ReplyFormat::default() };
        // Content before the call; an unterminated last call still parses.
        let (deltas, calls) =
            run(no_think, &["Checking. <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}"]);
        assert_eq!(deltas, [Delta::Content("Checking. ".into())]);
        assert_eq!(calls, [ToolCall { name: "f".into(), arguments: r#"{"a":[1,2]}"#.into() }]);
        // Text that does not parse is content, whole.
        let bad = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": </tool_call>";
        assert_eq!(run(no_think, &[bad]), (vec![Delta::Content(bad.into())], vec![]));
        assert_eq!(run(no_think, &["<tool_call>{\"arguments\": {}}</tool_call>"]).1, []);
        // Arguments given as a JSON string.
        let (_, calls) = run(no_think, &[r#"<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>"#]);
        assert_eq!(calls, [ToolCall { name: "f".into(), arguments: r#"{"x": 1}"#.into() }]);
        // Without tools the tag is text; a partial tag at the end is handed on at the finish.
        assert_eq!(run(ReplyFormat::default(), &["<tool_call>{}"]).0, [Delta::Content("<tool_call>{}".into())]);
        assert_eq!(run(no_think, &["a <tool_"]).0, [Delta::Content("a <tool_".into())]);
    }

    #[test]
    fn partial_tags_respect_char_boundaries() {
        assert_eq!(partial_tag_len("abc<too", TOOL_START), 4);
        assert_eq!(partial_tag_len("abc<tool_call", TOOL_START), 10);
        assert_eq!(partial_tag_len("é", TOOL_START), 0);
        assert_eq!(partial_tag_len("", TOOL_START), 0);
    }
}
