//! The endpoints.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ruda_llm::{
    Constraint, Engine, EngineError, EngineEvent, EngineOutput, EngineRequest, RequestHandle, ResponseFormat,
    StopReason, TokenLogprobs, Tokenizer,
};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};

use crate::error::ApiError;
use crate::reply::{Delta, ReplyFormat, ReplyParser, ToolCall};
use crate::request::{self, Common, Fields, Prompt, TokenizeInput};
use crate::tools;
use crate::AppState;

type Result<T, E = ApiError> = std::result::Result<T, E>;

pub async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

pub async fn ready(State(s): State<AppState>) -> Response {
    if s.is_ready() {
        Json(json!({"status": "ready"})).into_response()
    } else {
        ApiError::unavailable("The engine is not serving").into_response()
    }
}

pub async fn metrics(State(s): State<AppState>) -> Response {
    let m = s.with_engine(|e| Ok(e.metrics())).unwrap_or_default();
    let text = crate::metrics::render(&m, &s.options().served_model_name);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

pub async fn models(State(s): State<AppState>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.options().served_model_name,
            "object": "model",
            "created": s.created(),
            "owned_by": "ruda",
            "root": s.info().model_name,
            "max_model_len": s.info().max_model_len,
        }],
    }))
    .into_response()
}

pub async fn not_found(uri: Uri) -> Response {
    ApiError::not_found(uri.path()).into_response()
}

/// The body, at most `--max-body-bytes` (413 past it).
async fn read_body(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Fields> {
    let limit = s.options().max_body_bytes;
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    if declared.is_some_and(|n: usize| n > limit) {
        return Err(ApiError::too_large(limit));
    }
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| ApiError::too_large(limit))?;
    Fields::parse(&bytes)
}

fn respond(r: Result<Response>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

pub async fn tokenize(State(s): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(
        async {
            let input = request::tokenize(read_body(&s, &headers, body).await?, &s.options().served_model_name)?;
            let tokens = s.with_engine(|e| match input {
                TokenizeInput::Prompt { text, add_special_tokens } => encode(e, &text, add_special_tokens, "prompt"),
                TokenizeInput::Messages { messages, add_generation_prompt, add_special_tokens, extra } => {
                    let text = e
                        .chat_template()
                        .render(&messages, add_generation_prompt, &extra)
                        .map_err(|err| ApiError::param("messages", format!("The chat template failed: {err}")))?;
                    encode(e, &text, add_special_tokens, "messages")
                }
            })?;
            let count = tokens.len();
            Ok(Json(json!({"tokens": tokens, "count": count, "max_model_len": s.info().max_model_len})).into_response())
        }
        .await,
    )
}

pub async fn detokenize(State(s): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(
        async {
            let tokens = request::detokenize(read_body(&s, &headers, body).await?, &s.options().served_model_name)?;
            let prompt = s.with_engine(|e| {
                let vocab = e.tokenizer().vocab_size().min(s.info().vocab_size);
                if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
                    return Err(ApiError::param(
                        "tokens",
                        format!("Token id {bad} is outside the vocabulary of {vocab}"),
                    ));
                }
                e.tokenizer().decode(&tokens, false).map_err(|err| ApiError::param("tokens", err.to_string()))
            })?;
            Ok(Json(json!({"prompt": prompt})).into_response())
        }
        .await,
    )
}

fn encode(e: &Engine, text: &str, add_special_tokens: bool, param: &str) -> Result<Vec<u32>> {
    e.tokenizer().encode(text, add_special_tokens).map_err(|err| ApiError::param(param, err.to_string()))
}

/// Which endpoint a generation request came to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

/// A generation request ready to submit.
struct Generation {
    kind: Kind,
    prompts: Vec<Vec<u32>>,
    common: Common,
    /// How a chat reply is split into reasoning, content and tool calls.
    format: ReplyFormat,
    /// Whether a reply may hold more than one tool call.
    parallel_tool_calls: bool,
    /// The request field a constraint that cannot be compiled is blamed on.
    constraint_field: &'static str,
}

pub async fn completions(State(s): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(
        async {
            let mut f = read_body(&s, &headers, body).await?;
            f.model(&s.options().served_model_name)?;
            let prompts = request::prompts(&mut f)?;
            let mut common = request::common(&mut f, &["max_tokens"])?;
            common.params.logprobs = request::completion_logprobs(&mut f)?;
            f.finish()?;
            let ids = s.with_engine(|e| {
                prompts
                    .into_iter()
                    .map(|p| match p {
                        Prompt::Text(t) => encode(e, &t, true, "prompt"),
                        Prompt::Ids(ids) => Ok(ids),
                    })
                    .collect::<Result<Vec<_>>>()
            })?;
            let g = Generation {
                kind: Kind::Completion,
                prompts: ids,
                common,
                format: ReplyFormat::default(),
                parallel_tool_calls: true,
                constraint_field: "response_format",
            };
            generate(&s, g).await
        }
        .await,
    )
}

pub async fn chat_completions(State(s): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(
        async {
            let mut f = read_body(&s, &headers, body).await?;
            f.model(&s.options().served_model_name)?;
            let messages = request::messages(&mut f)?;
            let mut common = request::common(&mut f, &["max_completion_tokens", "max_tokens"])?;
            common.params.logprobs = request::chat_logprobs(&mut f)?;
            let tools = tools::tools(&mut f)?;
            let extra = request::template_variables(&mut f, &tools)?;
            f.finish()?;
            // `required` or a named function: decoding follows the call's grammar.
            let forced_grammar = tools.forced_call_grammar();
            let forced = forced_grammar.is_some();
            if let Some(grammar) = forced_grammar {
                if common.response_format.is_some() {
                    return Err(ApiError::param(
                        "tool_choice",
                        "'tool_choice' \"required\" or a named function cannot be combined with a 'response_format'",
                    ));
                }
                common.response_format = Some(ResponseFormat::Lark(grammar));
            }
            let (ids, format) = s.with_engine(|e| {
                let template = e.chat_template();
                let text = template
                    .render(&messages, true, &extra)
                    .map_err(|err| ApiError::param("messages", format!("The chat template failed: {err}")))?;
                let thinking = template.source().contains("<think>");
                let mut format = ReplyFormat::for_prompt(&text, thinking, tools.active());
                // A forced call is the reply from its first token, even after an opened <think>.
                format.starts_in_reasoning &= !forced;
                Ok((encode(e, &text, false, "messages")?, format))
            })?;
            let g = Generation {
                kind: Kind::Chat,
                prompts: vec![ids],
                common,
                format,
                parallel_tool_calls: tools.parallel,
                constraint_field: if forced { "tool_choice" } else { "response_format" },
            };
            generate(&s, g).await
        }
        .await,
    )
}

/// A seed from the clock, for `n` sampled choices without a seed.
fn clock_seed() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0x5eed)
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::Length => "length",
        StopReason::Eos | StopReason::StopSequence | StopReason::Callback | StopReason::Grammar => "stop",
    }
}

/// Compile `format` off the async threads (a large schema takes a while); a format that does not
/// compile is a 400, so it never reaches the engine.
async fn compile(s: &AppState, format: ResponseFormat, field: &'static str) -> Result<Constraint> {
    let refuse = move |e: ruda_llm::LlmError| {
        let why = match e {
            ruda_llm::LlmError::Constraint(m) => m,
            other => other.to_string(),
        };
        ApiError::param(field, format!("'{field}' cannot be enforced: {why}"))
    };
    let compiler = s.with_engine(|e| e.constraints().map_err(refuse))?;
    tokio::task::spawn_blocking(move || compiler.compile(&format))
        .await
        .map_err(|_| ApiError::internal(format!("Compiling the {field} grammar failed")))?
        .map_err(refuse)
}

/// Check the lengths, submit every prompt (all or none), and answer in one body or a stream.
async fn generate(s: &AppState, mut g: Generation) -> Result<Response> {
    let vocab = s.info().vocab_size;
    if let Some((id, _)) = g.common.params.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
        return Err(ApiError::param(
            "logit_bias",
            format!("'logit_bias' token id {id} is outside the vocabulary of {vocab}"),
        ));
    }
    if let Some(format) = g.common.response_format.take() {
        g.common.params.constraint = Some(compile(s, format, g.constraint_field).await?);
    }
    let max_model_len = s.info().max_model_len;
    let prompt_param = if g.kind == Kind::Chat { "messages" } else { "prompt" };
    let max_param = if g.kind == Kind::Chat { "max_completion_tokens" } else { "max_tokens" };
    let mut requests = Vec::with_capacity(g.prompts.len());
    for prompt in &g.prompts {
        if prompt.is_empty() {
            return Err(ApiError::param(prompt_param, "The prompt is empty (it encodes to no tokens)"));
        }
        if prompt.len() >= max_model_len {
            return Err(ApiError::param(
                prompt_param,
                format!(
                    "This model's maximum context length is {max_model_len} tokens. However, your prompt has {} tokens",
                    prompt.len()
                ),
            ));
        }
        let room = max_model_len - prompt.len();
        let max_new_tokens = match (g.common.max_tokens, g.kind) {
            (Some(n), _) if n > room => {
                return Err(ApiError::param(
                    max_param,
                    format!(
                        "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens ({} in the prompt, {n} for the completion)",
                        prompt.len() + n,
                        prompt.len()
                    ),
                ))
            }
            (Some(n), _) => n,
            (None, Kind::Completion) => room.min(16),
            (None, Kind::Chat) => room,
        };
        let mut params = g.common.params.clone();
        params.max_new_tokens = max_new_tokens;
        params.eos_token_ids = if g.common.ignore_eos { Vec::new() } else { s.info().eos_token_ids.clone() };
        // `n` choices draw from seeds `seed`, `seed + 1`, ... (one base from the clock without a
        // seed), so that they differ and a given seed repeats them all.
        let base_seed = params.sampling.as_ref().map(|c| c.seed.unwrap_or_else(clock_seed));
        for j in 0..g.common.n {
            let mut params = params.clone();
            if let (Some(sampling), Some(base)) = (params.sampling.as_mut(), base_seed) {
                if g.common.n > 1 || sampling.seed.is_none() {
                    sampling.seed = Some(base.wrapping_add(j as u64));
                }
            }
            requests.push(EngineRequest { prompt: prompt.clone(), params });
        }
    }
    // Usage counts each prompt once, however many choices it has (as OpenAI does).
    let prompt_tokens: usize = g.prompts.iter().map(Vec::len).sum();
    let mut tokenizer = None;
    let handles = s.with_engine(|e| {
        // The reply's own copy: token strings are needed even after a shutdown took the engine.
        if g.common.params.logprobs.is_some() {
            tokenizer = Some(e.tokenizer().clone());
        }
        requests
            .into_iter()
            .map(|r| {
                e.submit(r).map_err(|err| match err {
                    EngineError::Saturated(n) => ApiError::saturated(format!(
                        "The server is at capacity ({n} requests in flight): try again later"
                    )),
                    EngineError::Invalid(m) => ApiError::invalid(m),
                    EngineError::Closed(m) => ApiError::unavailable(m),
                })
            })
            .collect::<Result<Vec<RequestHandle>>>()
    })?;
    let prefix = if g.kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
    let reply = Reply {
        kind: g.kind,
        id: format!("{prefix}-{}", s.new_id()),
        created: unix_now(),
        model: s.options().served_model_name.clone(),
        prompt_tokens,
        choices: handles.len(),
        format: g.format,
        parallel_tool_calls: g.parallel_tool_calls,
        tokenizer,
    };
    if g.common.stream {
        Ok(stream(reply, handles, g.common.include_usage))
    } else {
        whole(reply, handles).await
    }
}

/// What every chunk or body of one reply repeats.
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
    choices: usize,
    format: ReplyFormat,
    parallel_tool_calls: bool,
    /// With logprobs requested: the tokenizer for their token strings.
    tokenizer: Option<Tokenizer>,
}

/// A logprob as JSON, which has no infinities: at least -9999 as vLLM (NaN as null).
fn logprob_value(v: f32) -> Value {
    if v.is_nan() {
        Value::Null
    } else {
        json!(v.max(-9999.0))
    }
}

/// A token's text for logprobs and its raw bytes: a token holding part of a multi-byte
/// character has those bytes, and its text is them decoded lossily.
fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer.token_bytes(id).unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

impl Reply {
    /// Chat's `logprobs` of some tokens: `{"content": [...]}`, or null when not requested.
    fn chat_logprobs(&self, tokens: &[TokenLogprobs]) -> Value {
        let Some(tokenizer) = &self.tokenizer else { return Value::Null };
        let entry = |id: u32, v: f32| {
            let (token, bytes) = token_text(tokenizer, id);
            json!({"token": token, "logprob": logprob_value(v), "bytes": bytes})
        };
        let content: Vec<Value> = tokens
            .iter()
            .map(|t| {
                let mut e = entry(t.token, t.logprob);
                e["top_logprobs"] = t.top.iter().map(|&(id, v)| entry(id, v)).collect();
                e
            })
            .collect();
        json!({"content": content})
    }

    /// Completions' `logprobs` of some tokens, `text_offset` counting characters of the reply
    /// from `offset` on (advanced past them); null when not requested.
    fn completion_logprobs(&self, tokens: &[TokenLogprobs], offset: &mut usize) -> Value {
        let Some(tokenizer) = &self.tokenizer else { return Value::Null };
        let (mut strings, mut values, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
        for t in tokens {
            let (text, _) = token_text(tokenizer, t.token);
            offsets.push(*offset);
            *offset += text.chars().count();
            strings.push(text);
            values.push(logprob_value(t.logprob));
            let mut top = Map::new();
            for &(id, v) in &t.top {
                // Two ids may share a string (partial characters): the likelier one stays.
                top.entry(token_text(tokenizer, id).0).or_insert_with(|| logprob_value(v));
            }
            tops.push(Value::Object(top));
        }
        json!({"tokens": strings, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
    }

    fn object(&self, streaming: bool) -> &'static str {
        match (self.kind, streaming) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    fn chunk(&self, choices: Vec<Value>) -> Value {
        json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model, "choices": choices})
    }

    /// The `id` of the `k`th tool call of choice `i`.
    fn tool_call_id(&self, i: usize, k: usize) -> String {
        format!("call-{}-{i}-{k}", self.id)
    }

    /// The tool calls a reply keeps: the first only without `parallel_tool_calls`.
    fn keep_calls(&self, mut calls: Vec<ToolCall>) -> Vec<ToolCall> {
        if !self.parallel_tool_calls {
            calls.truncate(1);
        }
        calls
    }

    /// `finish_reason`: `tool_calls` when the reply called tools and was not cut short.
    fn finish_reason(&self, r: StopReason, called: bool) -> &'static str {
        match finish_reason(r) {
            "stop" if called => "tool_calls",
            other => other,
        }
    }

    fn usage(&self, completion_tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        })
    }
}

/// One step of a request, as the driver hands it on.
enum Piece {
    /// Text and the logprobs of the tokens it completes (when requested).
    Text(String, Vec<TokenLogprobs>),
    Done(Box<EngineOutput>),
    Failed(String),
}

/// Read the events of `handles` until each ended, handing them to `sink` with their index;
/// stop (dropping the handles, so the engine cancels what is left) when `sink` says so or
/// `closed()` turns true. Blocking: runs on a blocking thread.
fn drive(handles: Vec<RequestHandle>, sink: &mut dyn FnMut(usize, Piece) -> bool, closed: &dyn Fn() -> bool) {
    let mut live: Vec<Option<RequestHandle>> = handles.into_iter().map(Some).collect();
    // Logprobs of tokens whose text is held back, until the text that covers them comes.
    let mut held: Vec<Vec<TokenLogprobs>> = vec![Vec::new(); live.len()];
    loop {
        let n_live = live.iter().filter(|h| h.is_some()).count();
        if n_live == 0 || closed() {
            return;
        }
        let wait = if n_live == 1 { Duration::from_millis(50) } else { Duration::ZERO };
        let mut progressed = false;
        for (i, slot) in live.iter_mut().enumerate() {
            let Some(h) = slot.as_mut() else { continue };
            // At most a batch of events per handle a pass, so others are not starved.
            for _ in 0..64 {
                let event = match h.recv_timeout(wait) {
                    Err(()) => break,
                    Ok(e) => e,
                };
                progressed = true;
                let (pieces, ended) = match event {
                    Some(EngineEvent::Token { text, logprobs, .. }) => {
                        held[i].extend(logprobs);
                        let logprobs = if text.is_empty() { Vec::new() } else { std::mem::take(&mut held[i]) };
                        (vec![Piece::Text(text, logprobs)], false)
                    }
                    Some(EngineEvent::Finished { text, output }) => {
                        let logprobs = std::mem::take(&mut held[i]);
                        (vec![Piece::Text(text, logprobs), Piece::Done(Box::new(output))], true)
                    }
                    Some(EngineEvent::Failed(m)) => (vec![Piece::Failed(m)], true),
                    None => (vec![Piece::Failed("The request was cancelled: the engine stopped".into())], true),
                };
                for piece in pieces {
                    if matches!(&piece, Piece::Text(t, l) if t.is_empty() && l.is_empty()) {
                        continue;
                    }
                    if !sink(i, piece) {
                        return;
                    }
                }
                if ended {
                    *slot = None;
                    break;
                }
            }
        }
        if !progressed && n_live > 1 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A failure of the engine while a request ran.
fn failed(message: &str) -> ApiError {
    if message.contains("shutting down") || message.contains("engine stopped") {
        ApiError::unavailable(message.to_string())
    } else {
        ApiError::internal(message.to_string())
    }
}

/// The non-streamed answer.
async fn whole(reply: Reply, handles: Vec<RequestHandle>) -> Result<Response> {
    let (tx, rx) = oneshot::channel::<Result<Vec<(String, Vec<TokenLogprobs>, EngineOutput)>>>();
    let n = handles.len();
    tokio::task::spawn_blocking(move || {
        let mut texts = vec![String::new(); n];
        let mut logprobs = vec![Vec::new(); n];
        let mut outputs: Vec<Option<EngineOutput>> = vec![None; n];
        let mut failure = None;
        let mut sink = |i: usize, piece: Piece| match piece {
            Piece::Text(t, l) => {
                texts[i].push_str(&t);
                logprobs[i].extend(l);
                true
            }
            Piece::Done(o) => {
                outputs[i] = Some(*o);
                true
            }
            Piece::Failed(m) => {
                failure = Some(m);
                false
            }
        };
        drive(handles, &mut sink, &|| tx.is_closed());
        let result = match failure {
            Some(m) => Err(failed(&m)),
            None => texts
                .into_iter()
                .zip(logprobs)
                .zip(outputs)
                .map(|((t, l), o)| o.map(|o| (t, l, o)).ok_or_else(|| failed("The request ended without a reply")))
                .collect(),
        };
        let _ = tx.send(result);
    });
    let results = rx.await.map_err(|_| ApiError::internal("The request ended without a reply"))??;
    let completion_tokens: usize = results.iter().map(|(_, _, o)| o.generated_token_ids.len()).sum();
    let choices: Vec<Value> = results
        .into_iter()
        .enumerate()
        .map(|(index, (text, logprobs, o))| {
            let reason = finish_reason(o.stop_reason);
            match reply.kind {
                Kind::Completion => {
                    let logprobs = reply.completion_logprobs(&logprobs, &mut 0);
                    json!({"index": index, "text": text, "finish_reason": reason, "logprobs": logprobs})
                }
                Kind::Chat => {
                    let mut parser = ReplyParser::new(reply.format);
                    let mut deltas = parser.push(&text);
                    let end = parser.finish();
                    deltas.extend(end.deltas);
                    let (mut reasoning, mut content) = (None::<String>, None::<String>);
                    for d in deltas {
                        match d {
                            Delta::Reasoning(t) => reasoning.get_or_insert_default().push_str(&t),
                            Delta::Content(t) => content.get_or_insert_default().push_str(&t),
                        }
                    }
                    let calls = reply.keep_calls(end.tool_calls);
                    // Content is null only beside tool calls, as OpenAI sends it.
                    if calls.is_empty() {
                        content.get_or_insert_default();
                    }
                    let mut message = json!({"role": "assistant", "content": content, "reasoning_content": reasoning});
                    if !calls.is_empty() {
                        message["tool_calls"] = calls
                            .iter()
                            .enumerate()
                            .map(|(k, c)| c.to_json(&reply.tool_call_id(index, k), None))
                            .collect();
                    }
                    json!({
                        "index": index,
                        "message": message,
                        "finish_reason": reply.finish_reason(o.stop_reason, !calls.is_empty()),
                        "logprobs": reply.chat_logprobs(&logprobs),
                    })
                }
            }
        })
        .collect();
    Ok(Json(json!({
        "id": reply.id,
        "object": reply.object(false),
        "created": reply.created,
        "model": reply.model,
        "choices": choices,
        "usage": reply.usage(completion_tokens),
    }))
    .into_response())
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// The streamed answer: `data: {chunk}` events, then `data: [DONE]`.
fn stream(reply: Reply, handles: Vec<RequestHandle>, include_usage: bool) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::task::spawn_blocking(move || {
        let send = |b: Bytes| tx.blocking_send(b).is_ok();
        if reply.kind == Kind::Chat {
            let first: Vec<Value> = (0..reply.choices)
                .map(|i| json!({"index": i, "delta": {"role": "assistant"}, "logprobs": null, "finish_reason": null}))
                .collect();
            if !send(sse(&reply.chunk(first))) {
                return;
            }
        }
        let mut completion_tokens = 0;
        let mut failure = None;
        let mut parsers: Vec<Option<ReplyParser>> =
            (0..reply.choices).map(|_| Some(ReplyParser::new(reply.format))).collect();
        // Each choice's `text_offset` so far, and (chat) the logprobs of text the parser holds
        // back, sent with the next chunk it releases.
        let mut offsets = vec![0; reply.choices];
        let mut held: Vec<Vec<TokenLogprobs>> = vec![Vec::new(); reply.choices];
        let chat_delta = |i: usize, d: Delta, logprobs: Value| {
            let delta = match d {
                Delta::Content(t) => json!({"content": t}),
                Delta::Reasoning(t) => json!({"reasoning_content": t}),
            };
            json!({"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": null})
        };
        let mut sink = |i: usize, piece: Piece| {
            let choices: Vec<Value> = match (piece, reply.kind) {
                (Piece::Text(t, l), Kind::Completion) => {
                    let logprobs = reply.completion_logprobs(&l, &mut offsets[i]);
                    vec![json!({"index": i, "text": t, "logprobs": logprobs, "finish_reason": null})]
                }
                (Piece::Text(t, l), Kind::Chat) => {
                    held[i].extend(l);
                    let deltas = parsers[i].as_mut().map(|p| p.push(&t)).unwrap_or_default();
                    let mut out = Vec::with_capacity(deltas.len());
                    for d in deltas {
                        let logprobs = reply.chat_logprobs(&std::mem::take(&mut held[i]));
                        out.push(chat_delta(i, d, logprobs));
                    }
                    out
                }
                (Piece::Done(o), Kind::Completion) => {
                    completion_tokens += o.generated_token_ids.len();
                    let reason = finish_reason(o.stop_reason);
                    vec![json!({"index": i, "text": "", "logprobs": null, "finish_reason": reason})]
                }
                (Piece::Done(o), Kind::Chat) => {
                    completion_tokens += o.generated_token_ids.len();
                    let end = parsers[i].take().map(ReplyParser::finish).unwrap_or_default();
                    let mut choices = Vec::new();
                    for d in end.deltas {
                        let logprobs = reply.chat_logprobs(&std::mem::take(&mut held[i]));
                        choices.push(chat_delta(i, d, logprobs));
                    }
                    let calls = reply.keep_calls(end.tool_calls);
                    if !calls.is_empty() {
                        let calls: Vec<Value> = calls
                            .iter()
                            .enumerate()
                            .map(|(k, c)| c.to_json(&reply.tool_call_id(i, k), Some(k)))
                            .collect();
                        choices.push(json!({"index": i, "delta": {"tool_calls": calls}, "logprobs": null, "finish_reason": null}));
                    }
                    let reason = reply.finish_reason(o.stop_reason, !calls.is_empty());
                    // Tokens whose text became tool calls (or nothing) report here.
                    let logprobs = reply.chat_logprobs(&std::mem::take(&mut held[i]));
                    choices.push(json!({"index": i, "delta": {}, "logprobs": logprobs, "finish_reason": reason}));
                    choices
                }
                (Piece::Failed(m), _) => {
                    failure = Some(m);
                    return false;
                }
            };
            choices.into_iter().all(|choice| send(sse(&reply.chunk(vec![choice]))))
        };
        drive(handles, &mut sink, &|| tx.is_closed());
        if tx.is_closed() {
            return;
        }
        if let Some(m) = failure {
            let _ = send(sse(&failed(&m).body()));
        } else if include_usage {
            let mut chunk = reply.chunk(vec![]);
            chunk["usage"] = reply.usage(completion_tokens);
            let _ = send(sse(&chunk));
        }
        let _ = send(Bytes::from_static(b"data: [DONE]\n\n"));
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")],
        Body::from_stream(Chunks(rx)),
    )
        .into_response()
}

/// The stream of a response body from the blocking thread's channel.
struct Chunks(mpsc::Receiver<Bytes>);

impl futures_core::Stream for Chunks {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|b| b.map(Ok))
    }
}
