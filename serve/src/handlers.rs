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
    StopReason,
};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};

use crate::error::ApiError;
use crate::request::{self, Common, Fields, Prompt, TokenizeInput};
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
                TokenizeInput::Messages { messages, add_generation_prompt, add_special_tokens } => {
                    let text = e
                        .chat_template()
                        .render(&messages, add_generation_prompt, &Map::new())
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
}

pub async fn completions(State(s): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(
        async {
            let mut f = read_body(&s, &headers, body).await?;
            f.model(&s.options().served_model_name)?;
            let prompts = request::prompts(&mut f)?;
            let common = request::common(&mut f, &["max_tokens"])?;
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
            generate(&s, Generation { kind: Kind::Completion, prompts: ids, common }).await
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
            let common = request::common(&mut f, &["max_completion_tokens", "max_tokens"])?;
            f.finish()?;
            let ids = s.with_engine(|e| {
                let text = e
                    .chat_template()
                    .render(&messages, true, &Map::new())
                    .map_err(|err| ApiError::param("messages", format!("The chat template failed: {err}")))?;
                encode(e, &text, false, "messages")
            })?;
            generate(&s, Generation { kind: Kind::Chat, prompts: vec![ids], common }).await
        }
        .await,
    )
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
async fn compile(s: &AppState, format: ResponseFormat) -> Result<Constraint> {
    let refuse = |e: ruda_llm::LlmError| {
        let why = match e {
            ruda_llm::LlmError::Constraint(m) => m,
            other => other.to_string(),
        };
        ApiError::param("response_format", format!("'response_format' cannot be enforced: {why}"))
    };
    let compiler = s.with_engine(|e| e.constraints().map_err(refuse))?;
    tokio::task::spawn_blocking(move || compiler.compile(&format))
        .await
        .map_err(|_| ApiError::internal("Compiling the response_format failed"))?
        .map_err(refuse)
}

/// Check the lengths, submit every prompt (all or none), and answer in one body or a stream.
async fn generate(s: &AppState, mut g: Generation) -> Result<Response> {
    if let Some(format) = g.common.response_format.take() {
        g.common.params.constraint = Some(compile(s, format).await?);
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
        requests.push(EngineRequest { prompt: prompt.clone(), params });
    }
    let prompt_tokens: usize = g.prompts.iter().map(Vec::len).sum();
    let handles = s.with_engine(|e| {
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
}

impl Reply {
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
    Text(String),
    Done(Box<EngineOutput>),
    Failed(String),
}

/// Read the events of `handles` until each ended, handing them to `sink` with their index;
/// stop (dropping the handles, so the engine cancels what is left) when `sink` says so or
/// `closed()` turns true. Blocking: runs on a blocking thread.
fn drive(handles: Vec<RequestHandle>, sink: &mut dyn FnMut(usize, Piece) -> bool, closed: &dyn Fn() -> bool) {
    let mut live: Vec<Option<RequestHandle>> = handles.into_iter().map(Some).collect();
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
                    Some(EngineEvent::Token { text, .. }) => (vec![Piece::Text(text)], false),
                    Some(EngineEvent::Finished { text, output }) => {
                        (vec![Piece::Text(text), Piece::Done(Box::new(output))], true)
                    }
                    Some(EngineEvent::Failed(m)) => (vec![Piece::Failed(m)], true),
                    None => (vec![Piece::Failed("The request was cancelled: the engine stopped".into())], true),
                };
                for piece in pieces {
                    if matches!(&piece, Piece::Text(t) if t.is_empty()) {
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
    let (tx, rx) = oneshot::channel::<Result<Vec<(String, EngineOutput)>>>();
    let n = handles.len();
    tokio::task::spawn_blocking(move || {
        let mut texts = vec![String::new(); n];
        let mut outputs: Vec<Option<EngineOutput>> = vec![None; n];
        let mut failure = None;
        let mut sink = |i: usize, piece: Piece| match piece {
            Piece::Text(t) => {
                texts[i].push_str(&t);
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
                .zip(outputs)
                .map(|(t, o)| o.map(|o| (t, o)).ok_or_else(|| failed("The request ended without a reply")))
                .collect(),
        };
        let _ = tx.send(result);
    });
    let results = rx.await.map_err(|_| ApiError::internal("The request ended without a reply"))??;
    let completion_tokens: usize = results.iter().map(|(_, o)| o.generated_token_ids.len()).sum();
    let choices: Vec<Value> = results
        .into_iter()
        .enumerate()
        .map(|(index, (text, o))| {
            let reason = finish_reason(o.stop_reason);
            match reply.kind {
                Kind::Completion => json!({"index": index, "text": text, "finish_reason": reason, "logprobs": null}),
                Kind::Chat => json!({
                    "index": index,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": reason,
                    "logprobs": null,
                }),
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
        let mut sink = |i: usize, piece: Piece| {
            let choice = match (piece, reply.kind) {
                (Piece::Text(t), Kind::Completion) => {
                    json!({"index": i, "text": t, "logprobs": null, "finish_reason": null})
                }
                (Piece::Text(t), Kind::Chat) => {
                    json!({"index": i, "delta": {"content": t}, "logprobs": null, "finish_reason": null})
                }
                (Piece::Done(o), kind) => {
                    completion_tokens += o.generated_token_ids.len();
                    let reason = finish_reason(o.stop_reason);
                    match kind {
                        Kind::Completion => json!({"index": i, "text": "", "logprobs": null, "finish_reason": reason}),
                        Kind::Chat => json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": reason}),
                    }
                }
                (Piece::Failed(m), _) => {
                    failure = Some(m);
                    return false;
                }
            };
            send(sse(&reply.chunk(vec![choice])))
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
