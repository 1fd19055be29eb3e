//! The server on the bundled tiny Qwen2 model (CPU), bound to a loopback port, driven by a
//! hand-rolled HTTP/1.1 client: every endpoint, streamed and whole replies agreeing with the
//! pipeline, bad requests and their statuses, saturation, disconnects, graceful shutdown.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ruda_llm::{
    example, load_pipeline, BatchOptions, Engine, EngineConfig, GenerateParams, ModelType, Pipeline, PipelineOptions,
    StreamControl,
};
use ruda_runtime::Device;
use ruda_serve::{AppState, ServeOptions};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MAX_MODEL_LEN: usize = 128;
const NAME: &str = "tiny";

fn pipeline() -> Pipeline {
    let options = PipelineOptions { device: Some(Device::cpu()), ..Default::default() };
    load_pipeline(example::bundled_model(ModelType::Qwen2), &options).unwrap()
}

struct Server {
    addr: SocketAddr,
    state: AppState,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

struct Setup {
    max_active: usize,
    max_pending: usize,
    api_key: Option<&'static str>,
    max_body_bytes: usize,
    max_model_len: usize,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            max_active: 4,
            max_pending: 16,
            api_key: None,
            max_body_bytes: ruda_serve::DEFAULT_MAX_BODY_BYTES,
            max_model_len: MAX_MODEL_LEN,
        }
    }
}

async fn start(setup: Setup) -> Server {
    let engine = tokio::task::spawn_blocking(move || {
        let batch = BatchOptions { max_active: setup.max_active, block_size: 4, ..Default::default() };
        let config = EngineConfig { batch, max_model_len: Some(setup.max_model_len), max_pending: setup.max_pending };
        Engine::start(pipeline(), config).unwrap()
    })
    .await
    .unwrap();
    let options = ServeOptions {
        served_model_name: NAME.into(),
        api_key: setup.api_key.map(String::from),
        max_body_bytes: setup.max_body_bytes,
    };
    let state = AppState::new(engine, options);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(ruda_serve::serve(
        listener,
        state.clone(),
        async move {
            let _ = stopped.await;
        },
        Duration::from_secs(30),
    ));
    Server { addr, state, stop: Some(stop), task }
}

impl Server {
    async fn get(&self, path: &str) -> Resp {
        http(self.addr, "GET", path, &[], b"").await
    }

    async fn post(&self, path: &str, body: &Value) -> Resp {
        http(self.addr, "POST", path, &[], body.to_string().as_bytes()).await
    }

    /// Shut down (as a signal would) and wait for the server to stop.
    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(60), self.task).await.unwrap().unwrap().unwrap();
    }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }

    /// The SSE events' data, `[DONE]` included.
    fn events(&self) -> Vec<String> {
        let text = self.text();
        assert!(text.ends_with("\n\n"), "{text}");
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data line: {e}")).to_string())
            .collect()
    }
}

fn request_bytes(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// One request on a fresh connection, read to its end (at most a minute).
async fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let exchange = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&request_bytes(addr, method, path, headers, body)).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        parse(&raw)
    };
    tokio::time::timeout(Duration::from_secs(60), exchange).await.expect("a response within a minute")
}

fn parse(raw: &[u8]) -> Resp {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Resp { status, headers, body }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = b.windows(2).position(|w| w == b"\r\n") else { return out };
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..end]).trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[end + 2..end + 2 + size]);
        b = &b[end + 4 + size..];
    }
}

fn completion(prompt: &str, max_tokens: usize, stream: bool) -> Value {
    json!({"model": NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream})
}

/// The concatenated text of a completion or chat stream, its finish reason, and the events.
fn streamed(r: &Resp) -> (String, Option<String>, Vec<Value>) {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let mut text = String::new();
    let mut reason = None;
    for c in &chunks {
        assert!(c.get("error").is_none(), "{c}");
        for choice in c["choices"].as_array().unwrap() {
            if let Some(t) = choice["text"].as_str() {
                text.push_str(t);
            }
            if let Some(t) = choice["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                reason = Some(f.to_string());
            }
        }
    }
    (text, reason, chunks)
}

async fn metric(server: &Server, name: &str) -> f64 {
    let text = server.get("/metrics").await.text();
    let prefix = format!("{name}{{model_name=\"{NAME}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in {text}"))
}

/// Poll until nothing runs and the KV pool is empty (at most 30 s).
async fn wait_idle(server: &Server) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let running = metric(server, "ruda:num_requests_running").await;
        let waiting = metric(server, "ruda:num_requests_waiting").await;
        let kv = metric(server, "ruda:kv_cache_usage_perc").await;
        let in_flight = server.state.with_engine(|e| Ok(e.in_flight())).unwrap();
        if running == 0.0 && waiting == 0.0 && kv == 0.0 && in_flight == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "still busy: running {running}, waiting {waiting}, kv {kv}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_in_its_shape_with_a_request_id() {
    let server = start(Setup::default()).await;
    let health = server.get("/health").await;
    assert_eq!(health.status, 200);
    assert_eq!(server.get("/ready").await.status, 200);

    let models = server.get("/v1/models").await;
    assert_eq!(models.status, 200);
    let m = models.json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], NAME);
    assert_eq!(m["data"][0]["object"], "model");
    assert_eq!(m["data"][0]["owned_by"], "ruda");
    assert_eq!(m["data"][0]["max_model_len"], MAX_MODEL_LEN);
    assert!(m["data"][0]["created"].as_u64().is_some());

    let tok = server.post("/tokenize", &json!({"prompt": "Hello there"})).await.json();
    let tokens: Vec<u32> = serde_json::from_value(tok["tokens"].clone()).unwrap();
    let expected = server.state.with_engine(|e| Ok(e.tokenizer().encode("Hello there", true).unwrap())).unwrap();
    assert_eq!(tokens, expected);
    assert_eq!(tok["count"], tokens.len());
    assert_eq!(tok["max_model_len"], MAX_MODEL_LEN);
    let detok = server.post("/detokenize", &json!({"tokens": tokens})).await;
    assert_eq!(detok.status, 200);
    assert_eq!(detok.json()["prompt"], "Hello there");
    let chat_tok = server.post("/tokenize", &json!({"messages": [{"role": "user", "content": "hi"}]})).await.json();
    assert!(chat_tok["count"].as_u64().unwrap() > 3, "{chat_tok}");
    let bad = server.post("/detokenize", &json!({"tokens": [1, 1_000_000]})).await;
    assert_eq!((bad.status, bad.json()["error"]["param"].clone()), (400, json!("tokens")));

    let c = server.post("/v1/completions", &completion("Hello there", 4, false)).await;
    assert_eq!(c.status, 200, "{}", c.text());
    let c = c.json();
    assert!(c["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(c["object"], "text_completion");
    assert_eq!(c["model"], NAME);
    assert_eq!(c["choices"][0]["index"], 0);
    assert_eq!(c["choices"][0]["logprobs"], Value::Null);
    assert!(c["choices"][0]["text"].is_string());
    let usage = &c["usage"];
    assert_eq!(usage["prompt_tokens"], tokens.len());
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap())
    );

    let chat = server
        .post(
            "/v1/chat/completions",
            &json!({"model": NAME, "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
            ], "max_completion_tokens": 4, "temperature": 0, "user": "u1", "store": false}),
        )
        .await;
    assert_eq!(chat.status, 200, "{}", chat.text());
    let chat = chat.json();
    assert!(chat["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    assert!(chat["choices"][0]["message"]["content"].is_string());
    assert!(["stop", "length"].contains(&chat["choices"][0]["finish_reason"].as_str().unwrap()));

    let metrics = server.get("/metrics").await;
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    for name in
        ["ruda:time_to_first_token_seconds", "ruda:inter_token_latency_seconds", "ruda:e2e_request_latency_seconds"]
    {
        assert!(text.contains(&format!("# TYPE {name} histogram")), "{name}");
        let value = |series: String| {
            text.lines()
                .find_map(|l| l.strip_prefix(&series))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{series} not in {text}"))
        };
        let inf = value(format!("{name}_bucket{{model_name=\"{NAME}\",le=\"+Inf\"}}"));
        assert_eq!(inf, value(format!("{name}_count{{model_name=\"{NAME}\"}}")), "{name}");
        assert!(value(format!("{name}_sum{{model_name=\"{NAME}\"}}")) >= 0.0);
        if name != "ruda:inter_token_latency_seconds" {
            assert_eq!(inf, 2.0, "{name}: the two requests");
        }
    }
    for (name, kind) in [
        ("ruda:num_requests_running", "gauge"),
        ("ruda:num_requests_waiting", "gauge"),
        ("ruda:kv_cache_usage_perc", "gauge"),
        ("ruda:prefix_cache_queries_total", "counter"),
        ("ruda:prefix_cache_hits_total", "counter"),
        ("ruda:num_preemptions_total", "counter"),
        ("ruda:prompt_tokens_total", "counter"),
        ("ruda:generation_tokens_total", "counter"),
    ] {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
    }
    assert!(metric(&server, "ruda:prompt_tokens_total").await >= tokens.len() as f64);

    // Every response carries an id; a client's own is echoed.
    for r in [&health, &models, &detok, &bad, &metrics] {
        assert!(r.header("x-request-id").is_some_and(|v| !v.is_empty()), "{r:?}");
    }
    let unknown = server.get("/v1/nothing").await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.json()["error"]["message"].is_string());
    assert!(unknown.header("x-request-id").is_some());
    let mine = http(server.addr, "GET", "/health", &[("x-request-id", "abc-123")], b"").await;
    assert_eq!(mine.header("x-request-id"), Some("abc-123"));

    server.state.begin_drain();
    assert_eq!(server.get("/ready").await.status, 503);
    assert_eq!(server.get("/health").await.status, 200);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_replies_equal_the_pipeline_whole_and_streamed() {
    let server = start(Setup::default()).await;
    let prompts = ["Hello there", "The cat sat on the"];
    let expected: Vec<(Vec<u32>, String)> = tokio::task::spawn_blocking(move || {
        let alone = pipeline();
        let eos = alone.loaded.default_eos_token_ids.clone();
        prompts
            .iter()
            .map(|p| {
                let ids = alone.encode(p, true).unwrap();
                let params = GenerateParams { max_new_tokens: 10, eos_token_ids: eos.clone(), ..Default::default() };
                let g = alone.generate_from_ids(&ids, &params, true, |_, _| StreamControl::Continue).unwrap();
                (g.generated_token_ids, g.generated_text)
            })
            .collect()
    })
    .await
    .unwrap();
    for (p, (ids, text)) in prompts.iter().zip(&expected) {
        let whole = server.post("/v1/completions", &completion(p, 10, false)).await.json();
        assert_eq!(whole["choices"][0]["text"].as_str(), Some(text.as_str()), "{p}");
        assert_eq!(whole["usage"]["completion_tokens"], ids.len(), "{p}");
        let reason = if ids.len() == 10 { "length" } else { "stop" };
        assert_eq!(whole["choices"][0]["finish_reason"], reason);
        let mut body = completion(p, 10, true);
        body["stream_options"] = json!({"include_usage": true});
        let (streamed_text, streamed_reason, chunks) = streamed(&server.post("/v1/completions", &body).await);
        assert_eq!(&streamed_text, text, "{p}: the streamed pieces add up to the reply");
        assert_eq!(streamed_reason.as_deref(), Some(reason));
        assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"]["completion_tokens"], ids.len());
    }
    // An array of prompts: one choice per prompt, in order.
    let both = server
        .post("/v1/completions", &json!({"prompt": prompts, "max_tokens": 10, "temperature": 0, "model": NAME}))
        .await
        .json();
    let choices = both["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for (i, (c, (_, text))) in choices.iter().zip(&expected).enumerate() {
        assert_eq!((c["index"].as_u64(), c["text"].as_str()), (Some(i as u64), Some(text.as_str())));
    }
    // Chat: streamed deltas equal the whole message.
    let chat = |stream: bool| json!({"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 12, "temperature": 0, "stream": stream});
    let whole = server.post("/v1/chat/completions", &chat(false)).await.json();
    let r = server.post("/v1/chat/completions", &chat(true)).await;
    let (text, reason, chunks) = streamed(&r);
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant"}));
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(whole["choices"][0]["message"]["content"].as_str(), Some(text.as_str()));
    assert_eq!(whole["choices"][0]["finish_reason"].as_str(), reason.as_deref());
    // ignore_eos runs to max_tokens.
    let long = server
        .post("/v1/completions", &json!({"prompt": "A", "max_tokens": 20, "temperature": 0, "ignore_eos": true}))
        .await
        .json();
    assert_eq!(
        (long["usage"]["completion_tokens"].as_u64(), long["choices"][0]["finish_reason"].as_str()),
        (Some(20), Some("length"))
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_status_and_the_server_keeps_serving() {
    let key = "sekrit";
    let server = start(Setup { api_key: Some(key), max_body_bytes: 4096, ..Setup::default() }).await;
    let auth = format!("Bearer {key}");
    let post = |path: &'static str, body: Vec<u8>| {
        let auth = auth.clone();
        let addr = server.addr;
        async move { http(addr, "POST", path, &[("Authorization", &auth)], &body).await }
    };
    let ok = json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0});
    let with = |field: &str, value: Value| {
        let mut b = ok.clone();
        b[field] = value;
        b
    };
    let long_prompt = "Hello there ".repeat(60);
    let cases: Vec<(&str, Value, u16, Option<&str>)> = vec![
        ("/v1/completions", with("model", json!("gpt-4")), 404, Some("model")),
        ("/v1/completions", with("max_tokens", json!(0)), 400, Some("max_tokens")),
        ("/v1/completions", with("max_tokens", json!(-3)), 400, Some("max_tokens")),
        ("/v1/completions", with("max_tokens", json!("many")), 400, Some("max_tokens")),
        ("/v1/completions", with("max_tokens", json!(1000)), 400, Some("max_tokens")),
        ("/v1/completions", with("temperature", json!(-0.5)), 400, Some("temperature")),
        ("/v1/completions", with("top_p", json!(0)), 400, Some("top_p")),
        ("/v1/completions", with("top_p", json!(1.5)), 400, Some("top_p")),
        ("/v1/completions", with("top_k", json!(-2)), 400, Some("top_k")),
        ("/v1/completions", with("n", json!(2)), 400, Some("n")),
        ("/v1/completions", with("n", json!(0)), 400, Some("n")),
        ("/v1/completions", with("stop", json!(["a", "b", "c", "d", "e"])), 400, Some("stop")),
        ("/v1/completions", with("logprobs", json!(2)), 400, Some("logprobs")),
        ("/v1/completions", with("presence_penalty", json!(2.5)), 400, Some("presence_penalty")),
        ("/v1/completions", with("frequency_penalty", json!("1")), 400, Some("frequency_penalty")),
        ("/v1/completions", with("logit_bias", json!({"five": 1})), 400, Some("logit_bias")),
        ("/v1/completions", with("logit_bias", json!({"5": 101})), 400, Some("logit_bias")),
        ("/v1/completions", with("min_p", json!(0.1)), 400, Some("min_p")),
        ("/v1/completions", with("echo", json!(true)), 400, Some("echo")),
        ("/v1/completions", with("best_of", json!(3)), 400, Some("best_of")),
        ("/v1/completions", with("suffix", json!("end")), 400, Some("suffix")),
        ("/v1/completions", with("frobnicate", json!(1)), 400, Some("frobnicate")),
        ("/v1/completions", with("prompt", json!(long_prompt)), 400, Some("prompt")),
        ("/v1/completions", with("prompt", json!("")), 400, Some("prompt")),
        ("/v1/completions", with("prompt", json!({"a": 1})), 400, Some("prompt")),
        ("/v1/completions", json!({"max_tokens": 2}), 400, Some("prompt")),
        ("/v1/completions", json!([1, 2]), 400, None),
        ("/v1/chat/completions", json!({"messages": []}), 400, Some("messages")),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            400,
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}),
            400,
            Some("response_format"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
            400,
            Some("tools"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}),
            400,
            Some("top_logprobs"),
        ),
        ("/tokenize", json!({"prompt": 5}), 400, Some("prompt")),
        ("/detokenize", json!({"tokens": "abc"}), 400, Some("tokens")),
    ];
    for (path, body, status, param) in cases {
        let r = post(path, body.to_string().into_bytes()).await;
        assert_eq!(r.status, status, "{path} {body}: {}", r.text());
        let e = r.json();
        assert!(e["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
        assert!(e["error"]["type"].is_string(), "{e}");
        assert!(e["error"].as_object().unwrap().contains_key("code"), "{e}");
        assert_eq!(e["error"]["param"].as_str(), param, "{path} {body}: {e}");
        assert!(r.header("x-request-id").is_some());
    }
    let r = post("/v1/completions", b"{\"prompt\": ".to_vec()).await;
    assert_eq!(r.status, 400, "malformed JSON");
    let r = post("/v1/completions", vec![b' '; 5000]).await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.json()["error"]["message"].is_string());
    // The key: required on /v1/*, /tokenize and /detokenize, not on the rest.
    for path in ["/v1/models"] {
        assert_eq!(server.get(path).await.status, 401);
    }
    for path in ["/v1/completions", "/tokenize", "/detokenize"] {
        let r = server.post(path, &ok).await;
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
        let wrong =
            http(server.addr, "POST", path, &[("Authorization", "Bearer nope")], ok.to_string().as_bytes()).await;
        assert_eq!(wrong.status, 401, "{path}");
    }
    for path in ["/health", "/ready", "/metrics"] {
        assert_eq!(server.get(path).await.status, 200, "{path}");
    }
    // Still serving, and with the ignored fields clients send.
    let mut fine = ok.clone();
    for (k, v) in [
        ("user", json!("me")),
        ("store", json!(false)),
        ("metadata", json!({"a": "b"})),
        ("service_tier", json!("auto")),
        ("logprobs", json!(null)),
        ("presence_penalty", json!(0.5)),
        ("frequency_penalty", json!(-0.5)),
        ("logit_bias", json!({"5": -100, "7": 2})),
        ("stop", json!("\n")),
        ("seed", json!(3)),
        ("top_k", json!(-1)),
        ("repetition_penalty", json!(1.1)),
    ] {
        fine[k] = v;
    }
    let r = post("/v1/completions", fine.to_string().into_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = http(server.addr, "GET", "/v1/models", &[("Authorization", &auth)], b"").await;
    assert_eq!(r.status, 200);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_get_a_full_reply_or_429() {
    let server = start(Setup { max_active: 4, max_pending: 4, ..Setup::default() }).await;
    let body =
        json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stream": true});
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (addr, body) = (server.addr, body.to_string());
            tokio::spawn(async move { http(addr, "POST", "/v1/completions", &[], body.as_bytes()).await })
        })
        .collect();
    let (mut full, mut refused) = (0, 0);
    let mut texts = Vec::new();
    for c in clients {
        let r = c.await.unwrap();
        match r.status {
            200 => {
                let (text, reason, _) = streamed(&r);
                assert_eq!(reason.as_deref(), Some("length"));
                texts.push(text);
                full += 1;
            }
            429 => {
                assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
                refused += 1;
            }
            other => panic!("status {other}: {}", r.text()),
        }
    }
    assert_eq!(full + refused, 16);
    assert!(full >= 8, "the first max_active + max_pending are admitted ({full} were)");
    assert!(texts.windows(2).all(|w| w[0] == w[1]), "the same greedy reply for every client");
    wait_idle(&server).await;
    // Deterministically full: 8 long streams in flight, then one more is refused at once.
    let long = json!({"prompt": "A", "max_tokens": 100, "temperature": 0, "ignore_eos": true, "stream": true});
    let mut open = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        s.write_all(&request_bytes(server.addr, "POST", "/v1/completions", &[], long.to_string().as_bytes()))
            .await
            .unwrap();
        open.push(s);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.state.with_engine(|e| Ok(e.in_flight())).unwrap() < 8 {
        assert!(Instant::now() < deadline, "the streams did not arrive");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let r = server.post("/v1/completions", &completion("Hi", 2, false)).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    drop(open);
    wait_idle(&server).await;
    assert_eq!(server.post("/v1/completions", &completion("Hi", 2, false)).await.status, 200);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_is_cancelled() {
    let server = start(Setup::default()).await;
    let body =
        json!({"prompt": "Once upon a time", "max_tokens": 100, "temperature": 0, "ignore_eos": true, "stream": true});
    for _ in 0..2 {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        s.write_all(&request_bytes(server.addr, "POST", "/v1/completions", &[], body.to_string().as_bytes()))
            .await
            .unwrap();
        // Read until a content chunk arrived, then hang up.
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !String::from_utf8_lossy(&seen).contains("\"text\":") {
            assert!(Instant::now() < deadline, "no chunk arrived");
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await.unwrap().unwrap();
            assert!(n > 0, "the stream ended early");
            seen.extend_from_slice(&buf[..n]);
        }
        drop(s);
        wait_idle(&server).await;
    }
    // Still serving.
    let r = server.post("/v1/completions", &completion("Hi", 2, false)).await;
    assert_eq!(r.status, 200);
    let cancelled = server.state.with_engine(|e| Ok(e.metrics().requests_cancelled)).unwrap();
    assert_eq!(cancelled, 2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_loses_no_reply_in_flight() {
    let server = start(Setup { max_active: 4, max_pending: 8, ..Setup::default() }).await;
    let n = 6;
    let clients: Vec<_> = (0..n)
        .map(|i| {
            let stream = i % 2 == 0;
            let body = json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": true, "stream": stream});
            let addr = server.addr;
            tokio::spawn(async move { (stream, http(addr, "POST", "/v1/completions", &[], body.to_string().as_bytes()).await) })
        })
        .collect();
    // Shut down once all are in the engine.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.state.with_engine(|e| Ok(e.in_flight())).unwrap() < n {
        assert!(Instant::now() < deadline, "the requests did not arrive");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let addr = server.addr;
    let state = server.state.clone();
    server.shutdown().await;
    for c in clients {
        let (stream, r) = c.await.unwrap();
        if stream {
            let (_, reason, chunks) = streamed(&r);
            assert_eq!(reason.as_deref(), Some("length"));
            assert!(chunks.len() >= 2);
        } else {
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.json()["usage"]["completion_tokens"], 16);
        }
    }
    assert!(TcpStream::connect(addr).await.is_err(), "the listener is closed");
    assert!(!state.is_ready());
    assert!(state.with_engine(|_| Ok(())).is_err(), "the engine was shut down");
}

/// The web chat: the page and its assets at their paths with their types and policy, open
/// without the API key, and loading nothing from outside the server (no absolute URL in a
/// `src`, `href`, `import` or CSS `url(...)`; the page's own fetches are relative).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_chat_is_served_and_loads_nothing_from_outside() {
    let server = start(Setup { api_key: Some("sekrit"), ..Setup::default() }).await;
    let mut files = Vec::new();
    for (path, content_type) in [
        ("/", "text/html"),
        ("/app.js", "text/javascript"),
        ("/chat.js", "text/javascript"),
        ("/style.css", "text/css"),
    ] {
        let r = server.get(path).await;
        assert_eq!(r.status, 200, "{path}");
        assert!(r.header("content-type").is_some_and(|t| t.starts_with(content_type)), "{path}: {:?}", r.headers);
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"), "{path}");
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(r.header("x-request-id").is_some(), "{path}");
        files.push((path, r.text()));
    }
    let page = &files[0].1;
    assert!(page.contains("app.js") && page.contains("style.css"), "the page loads its assets");
    for (path, text) in &files {
        let squashed: String = text.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase();
        for pattern in [
            "src=\"http",
            "src='http",
            "href=\"http",
            "href='http",
            "url(http",
            "url(\"http",
            "url('http",
            "from\"http",
            "from'http",
            "import(\"http",
            "src=\"//",
            "href=\"//",
            "url(//",
        ] {
            assert!(!squashed.contains(pattern), "{path} loads an external URL ({pattern})");
        }
        assert!(
            !squashed.contains("fetch(\"http") && !squashed.contains("fetch('http"),
            "{path} fetches an absolute URL"
        );
    }
    // The API stays behind the key.
    assert_eq!(server.get("/v1/models").await.status, 401);
    server.shutdown().await;
}

/// The schema of the `response_format` tests: bounded, so a reply completes within 100 tokens
/// however the model spells it.
fn pet_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 4},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "kind": {"enum": ["cat", "dog"]}
        },
        "required": ["name", "age", "kind"],
        "additionalProperties": false
    })
}

/// A hand-written check of [`pet_schema`].
fn check_pet(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v.as_object().unwrap_or_else(|| panic!("not an object: {text}"));
    assert_eq!(o.len(), 3, "{text}");
    assert!(o["name"].as_str().is_some_and(|n| n.chars().count() <= 4), "{text}");
    assert!(o["age"].as_i64().is_some_and(|a| o["age"].is_i64() && (0..=99).contains(&a)), "{text}");
    assert!(matches!(o["kind"].as_str(), Some("cat" | "dog")), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_format_constrains_replies_streamed_and_not() {
    // The chat prompt is 78 tokens: room for 100 more.
    let server = start(Setup { max_model_len: 256, ..Setup::default() }).await;
    let schema_format =
        json!({"type": "json_schema", "json_schema": {"name": "pet", "schema": pet_schema(), "strict": true}});
    let chat = |stream: bool, format: &Value| {
        json!({
            "model": NAME, "messages": [{"role": "user", "content": "A pet as JSON"}], "max_tokens": 100,
            "temperature": 0, "stream": stream, "response_format": format,
        })
    };
    // json_schema on chat: the reply completes ("stop") and validates, streamed the same.
    let r = server.post("/v1/chat/completions", &chat(false, &schema_format)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    let whole = body["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    check_pet(&whole);
    let (text, reason, _) = streamed(&server.post("/v1/chat/completions", &chat(true, &schema_format)).await);
    assert_eq!((text.as_str(), reason.as_deref()), (whole.as_str(), Some("stop")));

    // json_object on completions: an object, or (16 tokens of a random model) its prefix.
    let completion = |stream: bool, format: Value| json!({"model": NAME, "prompt": "A pet:", "max_tokens": 16, "temperature": 0, "stream": stream, "response_format": format});
    let object = json!({"type": "json_object"});
    let r = server.post("/v1/completions", &completion(false, object.clone())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    let whole = body["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(whole.starts_with('{'), "{whole:?}");
    match body["choices"][0]["finish_reason"].as_str() {
        Some("stop") => assert!(serde_json::from_str::<Value>(&whole).unwrap().is_object()),
        Some("length") => assert!(serde_json::from_str::<Value>(&whole).is_err_and(|e| e.is_eof()), "{whole:?}"),
        other => panic!("{other:?}"),
    }
    let (text, reason, _) = streamed(&server.post("/v1/completions", &completion(true, object)).await);
    assert_eq!((text.as_str(), reason.as_deref()), (whole.as_str(), body["choices"][0]["finish_reason"].as_str()));
    // json_schema on completions, sampled.
    let mut sampled = completion(false, schema_format.clone());
    sampled["max_tokens"] = json!(100);
    sampled["temperature"] = json!(0.8);
    sampled["seed"] = json!(11);
    let r = server.post("/v1/completions", &sampled).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
    check_pet(r.json()["choices"][0]["text"].as_str().unwrap());

    // Formats that cannot be enforced are 400s naming the field, before any request runs; the
    // server keeps serving.
    for format in [
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}),
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}),
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "https://example.com/s.json"}}}),
        json!({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}),
        json!({"type": "json_object", "schema": {}}),
        json!({"type": "grammar"}),
        json!("json_object"),
    ] {
        for (path, body) in
            [("/v1/chat/completions", chat(true, &format)), ("/v1/completions", completion(false, format.clone()))]
        {
            let r = server.post(path, &body).await;
            assert_eq!(r.status, 400, "{format}: {}", r.text());
            let e = r.json();
            assert_eq!(e["error"]["param"], "response_format", "{e}");
            assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
        }
    }
    let r = server.post("/v1/chat/completions", &chat(false, &schema_format)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    check_pet(r.json()["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(server.state.with_engine(|e| Ok(e.metrics().requests_failed)).unwrap(), 0);
    server.shutdown().await;
}
