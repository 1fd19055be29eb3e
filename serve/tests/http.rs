//! The server on the bundled tiny Qwen2 model (CPU), bound to a loopback port, driven by a
//! hand-rolled HTTP/1.1 client: every endpoint, streamed and whole replies agreeing with the
//! pipeline, bad requests and their statuses, saturation, disconnects, graceful shutdown; and the
//! MoE fixtures served.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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
    pipeline_of(&example::bundled_model(ModelType::Qwen2))
}

fn pipeline_of(dir: &Path) -> Pipeline {
    let options = PipelineOptions { device: Some(Device::cpu()), ..Default::default() };
    load_pipeline(dir, &options).unwrap()
}

/// The bundled tiny Qwen3 with 1024 positions instead of 256 (RoPE takes any position), in a
/// folder of this process and test (`test`): Qwen3's tool preamble alone is some 300 tokens of its
/// tiny vocabulary.
fn long_context_qwen3(test: &str) -> PathBuf {
    let from = example::bundled_model(ModelType::Qwen3);
    let to = std::env::temp_dir().join(format!("ruda-serve-long-qwen3-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(&from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
    let config_path = to.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(1024);
    std::fs::write(&config_path, config.to_string()).unwrap();
    to
}

struct Server {
    addr: SocketAddr,
    state: AppState,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

struct Setup {
    model: PathBuf,
    max_model_len: usize,
    max_active: usize,
    max_pending: usize,
    api_key: Option<&'static str>,
    max_body_bytes: usize,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            model: example::bundled_model(ModelType::Qwen2),
            max_model_len: MAX_MODEL_LEN,
            max_active: 4,
            max_pending: 16,
            api_key: None,
            max_body_bytes: ruda_serve::DEFAULT_MAX_BODY_BYTES,
        }
    }
}

async fn start(setup: Setup) -> Server {
    let engine = tokio::task::spawn_blocking(move || {
        let batch = BatchOptions { max_active: setup.max_active, block_size: 4, ..Default::default() };
        let config = EngineConfig { batch, max_model_len: Some(setup.max_model_len), max_pending: setup.max_pending };
        Engine::start(pipeline_of(&setup.model), config).unwrap()
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
        ("/v1/completions", with("n", json!(129)), 400, Some("n")),
        ("/v1/completions", with("n", json!(0)), 400, Some("n")),
        ("/v1/completions", with("stop", json!(["a", "b", "c", "d", "e"])), 400, Some("stop")),
        ("/v1/completions", with("logprobs", json!(6)), 400, Some("logprobs")),
        ("/v1/completions", with("logprobs", json!(-1)), 400, Some("logprobs")),
        ("/v1/completions", with("logprobs", json!(true)), 400, Some("logprobs")),
        ("/v1/completions", with("presence_penalty", json!(2.5)), 400, Some("presence_penalty")),
        ("/v1/completions", with("frequency_penalty", json!("1")), 400, Some("frequency_penalty")),
        ("/v1/completions", with("logit_bias", json!({"five": 1})), 400, Some("logit_bias")),
        ("/v1/completions", with("logit_bias", json!({"5": 101})), 400, Some("logit_bias")),
        ("/v1/completions", with("logit_bias", json!({"999999999": 1})), 400, Some("logit_bias")),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}], "logit_bias": {"4294967295": -1}}),
            400,
            Some("logit_bias"),
        ),
        ("/v1/completions", with("min_p", json!(1.5)), 400, Some("min_p")),
        ("/v1/completions", with("min_p", json!(-0.1)), 400, Some("min_p")),
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
            Some("tools[0]"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
            400,
            Some("tool_choice"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]}),
            400,
            Some("messages[0].tool_calls[0]"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": "no"}}),
            400,
            Some("chat_template_kwargs"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}),
            400,
            Some("tools"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}),
            400,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}),
            400,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}),
            400,
            Some("logprobs"),
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
        ("min_p", json!(0.05)),
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

/// Each choice's streamed text, by index.
fn streamed_choices(r: &Resp, n: usize) -> Vec<String> {
    let (_, _, chunks) = streamed(r);
    let mut texts = vec![String::new(); n];
    for c in &chunks {
        for choice in c["choices"].as_array().unwrap() {
            let i = choice["index"].as_u64().unwrap() as usize;
            texts[i].push_str(choice["text"].as_str().or(choice["delta"]["content"].as_str()).unwrap_or(""));
        }
    }
    texts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_sample_from_successive_seeds() {
    let server = start(Setup::default()).await;
    let body = |prompt: Value, n: usize, seed: u64, stream: bool| json!({"prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": seed, "n": n, "stream": stream, "ignore_eos": true});
    let texts = |v: &Value| -> Vec<String> {
        v["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap().to_string()).collect()
    };
    let three = server.post("/v1/completions", &body(json!("Once upon"), 3, 11, false)).await.json();
    let choices = three["choices"].as_array().unwrap();
    assert_eq!(choices.iter().map(|c| c["index"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(three["usage"]["completion_tokens"], 24);
    let prompt_alone = server.post("/v1/completions", &body(json!("Once upon"), 1, 11, false)).await.json();
    assert_eq!(three["usage"]["prompt_tokens"], prompt_alone["usage"]["prompt_tokens"], "a prompt counts once");
    // Choice j is what seed + j gives alone, so a seed repeats every choice.
    for (j, text) in texts(&three).iter().enumerate() {
        let alone = server.post("/v1/completions", &body(json!("Once upon"), 1, 11 + j as u64, false)).await.json();
        assert_eq!(&texts(&alone)[0], text, "choice {j}");
    }
    let distinct: std::collections::HashSet<_> = texts(&three).into_iter().collect();
    assert!(distinct.len() > 1, "three samples of 8 tokens at temperature 1 all equal: {distinct:?}");
    let r = server.post("/v1/completions", &body(json!("Once upon"), 3, 11, true)).await;
    assert_eq!(streamed_choices(&r, 3), texts(&three), "streamed choices equal the whole ones");
    // Several prompts: prompt-major order.
    let both = server.post("/v1/completions", &body(json!(["Once upon", "The cat"]), 2, 5, false)).await.json();
    assert_eq!(both["choices"].as_array().unwrap().len(), 4);
    let cat = server.post("/v1/completions", &body(json!("The cat"), 2, 5, false)).await.json();
    assert_eq!(texts(&both)[2..], texts(&cat)[..]);
    // Greedy choices are all the argmax.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0, "n": 2});
    let greedy = server.post("/v1/chat/completions", &chat).await.json();
    let c = greedy["choices"].as_array().unwrap();
    assert_eq!((c.len(), &c[0]["message"], c[1]["index"].as_u64()), (2, &c[1]["message"], Some(1)));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_and_thinking_reach_the_template_and_the_reply() {
    let dir = long_context_qwen3("tools");
    let server = start(Setup { model: dir.clone(), max_model_len: 1024, ..Setup::default() }).await;
    let weather = json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city"]},
    }});
    let tokens = |r: Resp| -> Vec<u32> {
        assert_eq!(r.status, 200, "{}", r.text());
        serde_json::from_value(r.json()["tokens"].clone()).unwrap()
    };
    let encode = |text: &str| server.state.with_engine(|e| Ok(e.tokenizer().encode(text, false).unwrap())).unwrap();
    let user = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let ask = |extra: Value| {
        let mut body = json!({"messages": user});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    // The prompts the template makes, against transformers' renderings of the same requests.
    let goldens: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../llm/tests/fixtures/chat_goldens.json"))
            .unwrap(),
    )
    .unwrap();
    let golden = |conversation: &str, thinking: Option<bool>| {
        let case = goldens["cases"].as_array().unwrap().iter().find(|c| {
            c["fixture"] == "qwen3"
                && c["conversation"] == conversation
                && c["add_generation_prompt"] == true
                && c["extra"].get("enable_thinking").and_then(Value::as_bool) == thinking
        });
        encode(case.unwrap()["rendered"].as_str().unwrap())
    };
    let plain = tokens(server.post("/tokenize", &ask(json!({}))).await);
    let none = tokens(server.post("/tokenize", &ask(json!({"tools": [weather], "tool_choice": "none"}))).await);
    assert_eq!(none, plain, "tool_choice none leaves the tools out");
    let off = tokens(server.post("/tokenize", &ask(json!({"chat_template_kwargs": {"enable_thinking": false}}))).await);
    assert!(off.len() > plain.len(), "enable_thinking false closes an empty think block in the prompt");
    // A whole tool-call round trip, the arguments as OpenAI clients send them (a JSON string).
    let round_trip = json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"C\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 22}"},
    ], "tools": [weather]});
    assert_eq!(tokens(server.post("/tokenize", &round_trip).await), golden("tool_call_round_trip", None));
    let mut thinking_off = round_trip.clone();
    thinking_off["chat_template_kwargs"] = json!({"enable_thinking": false});
    assert_eq!(tokens(server.post("/tokenize", &thinking_off).await), golden("tool_call_round_trip", Some(false)));

    // A chat request makes the same prompt and answers (auto: nothing to parse from a random model).
    let mut chat = round_trip.clone();
    chat["max_tokens"] = json!(2);
    chat["temperature"] = json!(0);
    let r = server.post("/v1/chat/completions", &chat).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = r.json();
    assert_eq!(r["usage"]["prompt_tokens"], golden("tool_call_round_trip", None).len());
    assert!(["stop", "length"].contains(&r["choices"][0]["finish_reason"].as_str().unwrap()), "{r}");

    // Thinking: a reply that opens with <think> goes to reasoning_content, streamed and whole.
    let think = server.post("/tokenize", &json!({"prompt": "<think>", "add_special_tokens": false})).await.json();
    assert_eq!(think["count"], 1, "<think> is one token");
    let think_id = think["tokens"][0].as_u64().unwrap();
    let biased = |stream: bool| {
        json!({"messages": user, "max_tokens": 3, "temperature": 0, "stream": stream,
               "logit_bias": {think_id.to_string(): 100}})
    };
    let whole = server.post("/v1/chat/completions", &biased(false)).await.json();
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "<think><think>", "{whole}");
    assert_eq!(message["content"], "");
    let (content, reason, chunks) = streamed(&server.post("/v1/chat/completions", &biased(true)).await);
    let reasoning: String = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().clone())
        .filter_map(|c| c["delta"]["reasoning_content"].as_str().map(String::from))
        .collect();
    assert_eq!((reasoning.as_str(), content.as_str(), reason.as_deref()), ("<think><think>", "", Some("length")));
    // Without thinking in the reply, content stays content and reasoning_content is null.
    let plain =
        server.post("/v1/chat/completions", &json!({"messages": user, "max_tokens": 4, "temperature": 0})).await;
    let plain = plain.json();
    assert!(plain["choices"][0]["message"]["content"].is_string());
    assert_eq!(plain["choices"][0]["message"]["reasoning_content"], Value::Null);
    server.shutdown().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_streaming_clients_get_the_replies_they_would_get_alone() {
    const CLIENTS: usize = 64;
    const TOKENS: usize = 8;
    // Admission holds 16 running and 48 waiting: all 64 are served.
    let server = start(Setup { max_active: 16, max_pending: 48, ..Setup::default() }).await;
    let candidates: Vec<String> = (0..12).map(|i| format!("Story {i}: once upon a time")).collect();
    // Each prompt's reply alone, kept where every greedy step's top-2 margin clears batching's
    // numerical noise (agreement within 1e-4), so that a batched reply must be the same text.
    let prompts: Vec<(String, String)> = tokio::task::spawn_blocking(move || {
        let alone = pipeline();
        candidates
            .into_iter()
            .filter_map(|p| {
                let ids = alone.encode(&p, true).unwrap();
                let params = GenerateParams { max_new_tokens: TOKENS, ..Default::default() };
                let g = alone.generate_from_ids(&ids, &params, true, |_, _| StreamControl::Continue).unwrap();
                let all: Vec<u32> = ids.iter().chain(&g.generated_token_ids).copied().collect();
                let logits = alone.logits(&all, 64).unwrap();
                let vocab = logits.len() / all.len();
                let clear = (0..TOKENS).all(|step| {
                    let row = &logits[(ids.len() - 1 + step) * vocab..(ids.len() + step) * vocab];
                    let mut sorted = row.to_vec();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    sorted[0] - sorted[1] > 1e-3
                });
                clear.then_some((p, g.generated_text))
            })
            .collect()
    })
    .await
    .unwrap();
    assert!(prompts.len() >= 4, "only {} prompts have clear margins", prompts.len());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (prompt, want) = prompts[i % prompts.len()].clone();
            let body =
                json!({"prompt": prompt, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": true, "stream": true});
            let addr = server.addr;
            tokio::spawn(async move {
                (http(addr, "POST", "/v1/completions", &[], body.to_string().as_bytes()).await, want)
            })
        })
        .collect();
    for (i, c) in clients.into_iter().enumerate() {
        let (r, want) = c.await.unwrap();
        let (text, reason, _) = streamed(&r);
        assert_eq!((text.as_str(), reason.as_deref()), (want.as_str(), Some("length")), "client {i}");
    }
    wait_idle(&server).await;
    server.shutdown().await;
}

/// A host log-softmax (f64) of the pipeline's logits after `history`.
fn host_logprobs(p: &Pipeline, history: &[u32]) -> Vec<f64> {
    let vocab = p.model().config().vocab_size;
    let logits = p.logits(history, 64).unwrap();
    let row = &logits[logits.len() - vocab..];
    let m = row.iter().fold(f64::NEG_INFINITY, |m, &z| m.max(z as f64));
    let lse = m + row.iter().map(|&z| (z as f64 - m).exp()).sum::<f64>().ln();
    row.iter().map(|&z| z as f64 - lse).collect()
}

/// Checks one chat `logprobs.content` entry against the host values: greedy is the top-1, the
/// top list is sorted, values are ≤ 0 and their probabilities sum to at most 1.
fn check_chat_entry(what: &str, e: &Value, want: &[f64], id: u32, top: usize) {
    let close = |g: f64, w: f64| (g - w).abs() < 1e-3;
    let lp = e["logprob"].as_f64().unwrap();
    assert!(lp <= 0.0 && close(lp, want[id as usize]), "{what}: {e}");
    let token = e["token"].as_str().unwrap();
    let bytes: Vec<u8> = e["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
    assert_eq!(String::from_utf8_lossy(&bytes), token, "{what}");
    let tops = e["top_logprobs"].as_array().unwrap();
    assert_eq!(tops.len(), top, "{what}");
    let values: Vec<f64> = tops.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
    assert!(values.windows(2).all(|w| w[0] >= w[1]), "{what}: sorted: {values:?}");
    assert_eq!((tops[0]["token"].as_str(), values[0]), (Some(token), lp), "{what}: greedy is the top-1");
    assert!(values.iter().map(|v| v.exp()).sum::<f64>() <= 1.0 + 1e-5, "{what}");
    let mut host: Vec<f64> = want.to_vec();
    host.sort_by(|a, b| b.total_cmp(a));
    for (k, (&g, &w)) in values.iter().zip(&host).enumerate() {
        assert!(close(g, w), "{what}: top {k}: {g} vs host {w}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_in_openai_shapes_match_a_host_log_softmax() {
    let alone = pipeline();
    let server = start(Setup::default()).await;
    let n = 6;
    // Completions: logprobs 5, whole and streamed.
    let prompt = "The cat sat on the";
    let mut body = completion(prompt, n, false);
    body["logprobs"] = json!(5);
    body["ignore_eos"] = json!(true);
    let whole = server.post("/v1/completions", &body).await;
    assert_eq!(whole.status, 200, "{}", whole.text());
    let whole = whole.json();
    let choice = &whole["choices"][0];
    let lp = &choice["logprobs"];
    let prompt_ids = alone.encode(prompt, true).unwrap();
    let greedy = GenerateParams { max_new_tokens: n, ..Default::default() };
    let want = alone.generate_from_ids(&prompt_ids, &greedy, true, |_, _| StreamControl::Continue).unwrap();
    let tokens: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.len(), n);
    assert_eq!(tokens.concat(), choice["text"].as_str().unwrap(), "the tokens spell the text");
    let mut offset = 0;
    let mut history = prompt_ids.clone();
    for (k, &id) in want.generated_token_ids.iter().enumerate() {
        assert_eq!(lp["text_offset"][k].as_u64(), Some(offset as u64));
        offset += tokens[k].chars().count();
        let host = host_logprobs(&alone, &history);
        let got = lp["token_logprobs"][k].as_f64().unwrap();
        assert!(got <= 0.0 && (got - host[id as usize]).abs() < 1e-3, "step {k}: {got} vs {}", host[id as usize]);
        let top = lp["top_logprobs"][k].as_object().unwrap();
        assert!(top.len() <= 5 && !top.is_empty());
        let best = top.values().map(|v| v.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(
            (top.get(tokens[k]).and_then(Value::as_f64), best),
            (Some(got), got),
            "step {k}: greedy is the top-1"
        );
        history.push(id);
    }
    body["stream"] = json!(true);
    let (text, _, chunks) = streamed(&server.post("/v1/completions", &body).await);
    assert_eq!(text, choice["text"].as_str().unwrap());
    let mut joined = json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    for c in &chunks {
        let l = &c["choices"][0]["logprobs"];
        if l.is_null() {
            continue;
        }
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            joined[key].as_array_mut().unwrap().extend(l[key].as_array().unwrap().iter().cloned());
        }
    }
    assert_eq!(joined["tokens"], lp["tokens"]);
    assert_eq!(joined["text_offset"], lp["text_offset"]);
    for (g, w) in joined["token_logprobs"].as_array().unwrap().iter().zip(lp["token_logprobs"].as_array().unwrap()) {
        assert!((g.as_f64().unwrap() - w.as_f64().unwrap()).abs() < 1e-4, "{g} vs {w}");
    }

    // Chat: logprobs with the top 20, whole and streamed, against the host on the templated
    // prompt (from /tokenize).
    let messages = json!([{"role": "user", "content": "Say hello"}]);
    let ids = server.post("/tokenize", &json!({"messages": messages})).await.json()["tokens"].clone();
    let chat_ids: Vec<u32> = ids.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let want = alone.generate_from_ids(&chat_ids, &greedy, true, |_, _| StreamControl::Continue).unwrap();
    let mut body = json!({"messages": messages, "max_tokens": n, "temperature": 0, "ignore_eos": true,
        "logprobs": true, "top_logprobs": 20});
    let whole = server.post("/v1/chat/completions", &body).await;
    assert_eq!(whole.status, 200, "{}", whole.text());
    let whole = whole.json();
    let content = whole["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len(), n);
    let mut history = chat_ids.clone();
    for (k, (e, &id)) in content.iter().zip(&want.generated_token_ids).enumerate() {
        check_chat_entry(&format!("chat step {k}"), e, &host_logprobs(&alone, &history), id, 20);
        history.push(id);
    }
    body["stream"] = json!(true);
    let (text, _, chunks) = streamed(&server.post("/v1/chat/completions", &body).await);
    assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap());
    let mut streamed_content = Vec::new();
    for c in &chunks {
        let choice = &c["choices"][0];
        if let Some(l) = choice["logprobs"]["content"].as_array() {
            // A chunk's entries spell its text.
            let spelled: String = l.iter().map(|e| e["token"].as_str().unwrap()).collect();
            assert_eq!(spelled, choice["delta"]["content"].as_str().unwrap_or(""), "{c}");
            streamed_content.extend(l.iter().cloned());
        }
    }
    assert_eq!(streamed_content.len(), n);
    for (g, w) in streamed_content.iter().zip(&content) {
        assert_eq!(g["token"], w["token"]);
        assert!((g["logprob"].as_f64().unwrap() - w["logprob"].as_f64().unwrap()).abs() < 1e-4);
    }
    // Not asked for: null; `logprobs` without `top_logprobs`: no top entries.
    body["stream"] = json!(false);
    body["top_logprobs"] = json!(null);
    let r = server.post("/v1/chat/completions", &body).await.json();
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(content.iter().all(|e| e["top_logprobs"].as_array().is_some_and(Vec::is_empty)), "{r}");
    body["logprobs"] = json!(false);
    let r = server.post("/v1/chat/completions", &body).await.json();
    assert!(r["choices"][0]["logprobs"].is_null(), "{r}");
    // min_p 1 keeps only the most likely token: a sampled reply equals the greedy one.
    let sampled = json!({"messages": messages, "max_tokens": n, "temperature": 1.5, "seed": 4, "min_p": 1.0,
        "ignore_eos": true});
    let r = server.post("/v1/chat/completions", &sampled).await.json();
    assert_eq!(r["choices"][0]["message"]["content"], whole["choices"][0]["message"]["content"], "{r}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_tool_calls_come_back_as_tool_calls() {
    let dir = long_context_qwen3("forced");
    let server = start(Setup { model: dir.clone(), max_model_len: 1024, ..Setup::default() }).await;
    // Bounded arguments, so a call completes within max_tokens however the model spells it.
    let clock = json!({"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
        "required": ["hour"], "additionalProperties": false}}});
    let light = json!({"type": "function", "function": {"name": "set_light", "parameters": {
        "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"], "additionalProperties": false}}});
    let ask = |choice: Value, stream: bool| {
        json!({"messages": [{"role": "user", "content": "What time is it?"}], "tools": [clock, light],
               "tool_choice": choice, "parallel_tool_calls": false, "max_tokens": 120, "temperature": 0, "stream": stream})
    };
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let r = server.post("/v1/chat/completions", &ask(named.clone(), false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = r.json();
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{r}");
    assert_eq!(choice["message"]["content"], Value::Null, "{r}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{r}");
    assert_eq!((&calls[0]["type"], &calls[0]["function"]["name"]), (&json!("function"), &json!("get_time")));
    assert!(calls[0]["id"].as_str().is_some_and(|id| !id.is_empty()));
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["hour"].as_i64().is_some_and(|h| (0..=23).contains(&h)), "{args}");
    assert_eq!(args.as_object().unwrap().len(), 1);

    // Streamed: the same call, whole, in one delta, then finish_reason tool_calls.
    let (content, reason, chunks) = streamed(&server.post("/v1/chat/completions", &ask(named, true)).await);
    assert_eq!((content.as_str(), reason.as_deref()), ("", Some("tool_calls")));
    let streamed_calls: Vec<&Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(streamed_calls.len(), 1, "{chunks:?}");
    assert_eq!(streamed_calls[0][0]["index"], 0);
    assert_eq!(streamed_calls[0][0]["function"], calls[0]["function"]);

    // required: a call of one of the tools.
    let r = server.post("/v1/chat/completions", &ask(json!("required"), false)).await.json();
    let call = &r["choices"][0]["message"]["tool_calls"][0]["function"];
    assert!(["get_time", "set_light"].contains(&call["name"].as_str().unwrap()), "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");

    // A tool whose parameters cannot be enforced, and a forced call with a response_format.
    let mut bad = ask(json!("required"), false);
    bad["tools"] = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "frobnicate"}}}]);
    let r = server.post("/v1/chat/completions", &bad).await;
    assert_eq!((r.status, r.json()["error"]["param"].clone()), (400, json!("tool_choice")), "{}", r.text());
    let mut both = ask(json!("required"), false);
    both["response_format"] = json!({"type": "json_object"});
    let r = server.post("/v1/chat/completions", &both).await;
    assert_eq!((r.status, r.json()["error"]["param"].clone()), (400, json!("tool_choice")), "{}", r.text());
    server.shutdown().await;
    std::fs::remove_dir_all(dir).unwrap();
}

/// The MoE models (Qwen3-MoE's routed experts; Qwen3.5-MoE's with a gated shared expert after
/// gated DeltaNet and full attention) served: three concurrent greedy completions (batched
/// prefill and decode) get the pipeline's replies alone, and the server keeps serving after a
/// bad request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moe_models_serve_the_replies_they_give_alone() {
    for name in ["qwen3-moe", "qwen35-moe"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../llm/tests/fixtures").join(name);
        let server = start(Setup { model: dir.clone(), max_model_len: 64, ..Setup::default() }).await;
        let prompts = ["Hello there", "The cat sat on the", "1 2 3 4 5 6 7 8"];
        let expected: Vec<String> = tokio::task::spawn_blocking(move || {
            let alone = pipeline_of(&dir);
            prompts
                .iter()
                .map(|p| {
                    let ids = alone.encode(p, true).unwrap();
                    let params = GenerateParams { max_new_tokens: 8, eos_token_ids: vec![], ..Default::default() };
                    alone.generate_from_ids(&ids, &params, true, |_, _| StreamControl::Continue).unwrap().generated_text
                })
                .collect()
        })
        .await
        .unwrap();
        let clients: Vec<_> = prompts
            .iter()
            .map(|p| {
                let body = json!({"prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": true});
                let addr = server.addr;
                tokio::spawn(
                    async move { http(addr, "POST", "/v1/completions", &[], body.to_string().as_bytes()).await },
                )
            })
            .collect();
        for ((client, p), want) in clients.into_iter().zip(prompts).zip(&expected) {
            let r = client.await.unwrap();
            assert_eq!(r.status, 200, "{name} {p}: {}", r.text());
            assert_eq!(r.json()["choices"][0]["text"].as_str(), Some(want.as_str()), "{name}: {p}");
        }
        let bad = server.post("/v1/completions", &json!({"prompt": "x", "max_tokens": -3})).await;
        assert_eq!(bad.status, 400, "{name}: {}", bad.text());
        let again = server
            .post(
                "/v1/completions",
                &json!({"prompt": prompts[0], "max_tokens": 8, "temperature": 0, "ignore_eos": true}),
            )
            .await;
        assert_eq!(
            again.json()["choices"][0]["text"].as_str(),
            Some(expected[0].as_str()),
            "{name}: after a bad request"
        );
        server.shutdown().await;
    }
}
