//! `ruda-llm bench-serve`: a serving benchmark in the manner of `vllm bench serve`. At each
//! concurrency, that many clients send streaming `/v1/completions` requests (a fixed prompt of
//! about `input_len` tokens, `max_tokens = output_len`, `ignore_eos`) until `requests` are done,
//! and it reports request throughput, output tokens per second, and the mean, median and p99 of
//! time to first token (TTFT), time per output token after the first (TPOT) and inter-token
//! latency (ITL). HTTP/1.1 over `std::net` (one connection per request), so the model layer
//! needs no HTTP stack.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::LlmError;

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchServeConfig {
    /// `http://HOST:PORT` (a path after it is ignored).
    pub url: String,
    pub concurrency: Vec<usize>,
    /// Requests per concurrency level.
    pub requests: usize,
    pub input_len: usize,
    pub output_len: usize,
    /// The served model's name; `None`: the first of `/v1/models`.
    pub model: Option<String>,
    pub api_key: Option<String>,
    /// Per request.
    pub timeout: Duration,
}

/// One request's timings.
#[derive(Clone, Debug, Default, PartialEq)]
struct RequestTiming {
    ttft: f64,
    /// Gaps between successive text chunks.
    itl: Vec<f64>,
    e2e: f64,
    prompt_tokens: usize,
    output_tokens: usize,
}

/// Mean, median and 99th percentile (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

impl Spread {
    fn of(mut xs: Vec<f64>) -> Spread {
        if xs.is_empty() {
            return Spread::default();
        }
        xs.sort_by(f64::total_cmp);
        let at = |q: f64| xs[((q * (xs.len() - 1) as f64).round() as usize).min(xs.len() - 1)];
        Spread { mean: xs.iter().sum::<f64>() / xs.len() as f64, p50: at(0.5), p99: at(0.99) }
    }

    fn to_json_ms(self) -> Value {
        json!({"mean_ms": self.mean * 1e3, "p50_ms": self.p50 * 1e3, "p99_ms": self.p99 * 1e3})
    }
}

/// One concurrency level's results.
#[derive(Clone, Debug, PartialEq)]
pub struct LevelResult {
    pub concurrency: usize,
    pub completed: usize,
    /// Requests refused (429) or failed.
    pub failed: usize,
    pub seconds: f64,
    pub request_throughput: f64,
    pub output_tokens_per_second: f64,
    pub mean_prompt_tokens: f64,
    pub ttft: Spread,
    pub tpot: Spread,
    pub itl: Spread,
}

impl LevelResult {
    pub fn to_json(&self) -> Value {
        json!({
            "concurrency": self.concurrency,
            "completed": self.completed,
            "failed": self.failed,
            "seconds": self.seconds,
            "request_throughput": self.request_throughput,
            "output_tokens_per_second": self.output_tokens_per_second,
            "mean_prompt_tokens": self.mean_prompt_tokens,
            "ttft": self.ttft.to_json_ms(),
            "tpot": self.tpot.to_json_ms(),
            "itl": self.itl.to_json_ms(),
        })
    }
}

/// The `host:port` of an `http://` URL.
fn split_url(url: &str) -> Result<String, LlmError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| LlmError::InvalidArgument(format!("--url {url:?}: expected http://HOST:PORT")))?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err(LlmError::InvalidArgument(format!("--url {url:?}: no host")));
    }
    Ok(host.to_string())
}

/// A response: its status and a reader of its body (chunked transfer decoded).
struct Response {
    status: u16,
    body: Box<dyn BufRead>,
}

/// Send one request and read the head of its response.
fn request(
    host: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
    cfg: &BenchServeConfig,
) -> Result<Response, String> {
    let stream = TcpStream::connect(host).map_err(|e| format!("connecting to {host}: {e}"))?;
    stream.set_read_timeout(Some(cfg.timeout)).map_err(|e| e.to_string())?;
    let payload = body.map(Value::to_string).unwrap_or_default();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAccept: */*\r\n");
    if let Some(key) = &cfg.api_key {
        head.push_str(&format!("Authorization: Bearer {key}\r\n"));
    }
    if body.is_some() {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", payload.len()));
    }
    head.push_str("\r\n");
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    writer.write_all(head.as_bytes()).and_then(|_| writer.write_all(payload.as_bytes())).map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| format!("reading the status line: {e}"))?;
    let status =
        line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or(format!("bad status line {line:?}"))?;
    let mut chunked = false;
    loop {
        line.clear();
        reader.read_line(&mut line).map_err(|e| format!("reading the headers: {e}"))?;
        let h = line.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            if name.eq_ignore_ascii_case("transfer-encoding") && value.trim().eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    let body: Box<dyn BufRead> = if chunked {
        Box::new(BufReader::new(Chunked { inner: reader, left: 0, done: false }))
    } else {
        Box::new(reader)
    };
    Ok(Response { status, body })
}

/// A reader of a chunked HTTP/1.1 body.
struct Chunked<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        if self.left == 0 {
            let mut size = String::new();
            self.inner.read_line(&mut size)?;
            if size.trim().is_empty() {
                // The CRLF after the previous chunk's data.
                size.clear();
                self.inner.read_line(&mut size)?;
            }
            let hex = size.trim().split(';').next().unwrap_or("");
            self.left = usize::from_str_radix(hex, 16)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("chunk size {size:?}")))?;
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let n = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..n])?;
        self.left -= n;
        Ok(n)
    }
}

/// The first served model of `/v1/models`.
fn first_model(host: &str, cfg: &BenchServeConfig) -> Result<String, LlmError> {
    let mut r = request(host, "GET", "/v1/models", None, cfg).map_err(LlmError::InvalidArgument)?;
    let mut text = String::new();
    r.body.read_to_string(&mut text).map_err(|e| LlmError::InvalidArgument(format!("/v1/models: {e}")))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| LlmError::InvalidArgument(format!("/v1/models answered {}: {e}: {text:.200}", r.status)))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| LlmError::InvalidArgument(format!("/v1/models lists no model: {text:.200}")))
}

/// One streaming completion, timed.
fn one(host: &str, model: &str, prompt: &str, cfg: &BenchServeConfig) -> Result<RequestTiming, String> {
    let body = json!({
        "model": model, "prompt": prompt, "max_tokens": cfg.output_len, "stream": true,
        "stream_options": {"include_usage": true}, "ignore_eos": true, "temperature": 0,
    });
    let start = Instant::now();
    let mut r = request(host, "POST", "/v1/completions", Some(&body), cfg)?;
    if r.status != 200 {
        let mut text = String::new();
        let _ = r.body.read_to_string(&mut text);
        return Err(format!("status {}: {text:.200}", r.status));
    }
    let mut t = RequestTiming::default();
    let (mut last, mut line) = (None::<Instant>, String::new());
    loop {
        line.clear();
        if r.body.read_line(&mut line).map_err(|e| format!("reading the stream: {e}"))? == 0 {
            return Err("the stream ended before [DONE]".into());
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("a chunk is not JSON ({e}): {data:.200}"))?;
        if let Some(usage) = v.get("usage").filter(|u| !u.is_null()) {
            t.prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0) as usize;
            t.output_tokens = usage["completion_tokens"].as_u64().unwrap_or(0) as usize;
        }
        let text = v["choices"][0]["text"].as_str().unwrap_or("");
        if !text.is_empty() {
            let now = Instant::now();
            match last {
                None => t.ttft = (now - start).as_secs_f64(),
                Some(prev) => t.itl.push((now - prev).as_secs_f64()),
            }
            last = Some(now);
        }
    }
    t.e2e = start.elapsed().as_secs_f64();
    Ok(t)
}

/// Run every concurrency level in turn, `progress` told after each.
pub fn bench_serve(
    cfg: &BenchServeConfig,
    mut progress: impl FnMut(&LevelResult),
) -> Result<Vec<LevelResult>, LlmError> {
    if cfg.concurrency.is_empty() || cfg.concurrency.contains(&0) || cfg.requests == 0 || cfg.output_len == 0 {
        return Err(LlmError::InvalidArgument(
            "bench-serve: --concurrency values, --requests and --output-len must be positive".into(),
        ));
    }
    let host = split_url(&cfg.url)?;
    let model = match &cfg.model {
        Some(m) => m.clone(),
        None => first_model(&host, cfg)?,
    };
    // About one token per word for Qwen's tokenizers.
    let prompt = vec!["hello"; cfg.input_len.max(1)].join(" ");
    let mut results = Vec::new();
    for &concurrency in &cfg.concurrency {
        let next = AtomicUsize::new(0);
        let timings = Mutex::new(Vec::new());
        let failures = AtomicUsize::new(0);
        let first_error = Mutex::new(None::<String>);
        let start = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..concurrency {
                scope.spawn(|| {
                    while next.fetch_add(1, Ordering::SeqCst) < cfg.requests {
                        match one(&host, &model, &prompt, cfg) {
                            Ok(t) => timings.lock().unwrap_or_else(|e| e.into_inner()).push(t),
                            Err(e) => {
                                failures.fetch_add(1, Ordering::SeqCst);
                                first_error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                            }
                        }
                    }
                });
            }
        });
        let seconds = start.elapsed().as_secs_f64();
        let timings = timings.into_inner().unwrap_or_else(|e| e.into_inner());
        let failed = failures.into_inner();
        if timings.is_empty() {
            let why = first_error.into_inner().unwrap_or_else(|e| e.into_inner()).unwrap_or_default();
            return Err(LlmError::InvalidArgument(format!(
                "bench-serve: every request at concurrency {concurrency} failed: {why}"
            )));
        }
        let output: usize = timings.iter().map(|t| t.output_tokens).sum();
        let result = LevelResult {
            concurrency,
            completed: timings.len(),
            failed,
            seconds,
            request_throughput: timings.len() as f64 / seconds,
            output_tokens_per_second: output as f64 / seconds,
            mean_prompt_tokens: timings.iter().map(|t| t.prompt_tokens as f64).sum::<f64>() / timings.len() as f64,
            ttft: Spread::of(timings.iter().map(|t| t.ttft).collect()),
            tpot: Spread::of(
                timings
                    .iter()
                    .filter(|t| t.output_tokens > 1)
                    .map(|t| (t.e2e - t.ttft) / (t.output_tokens - 1) as f64)
                    .collect(),
            ),
            itl: Spread::of(timings.iter().flat_map(|t| t.itl.iter().copied()).collect()),
        };
        progress(&result);
        results.push(result);
    }
    Ok(results)
}
