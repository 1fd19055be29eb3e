//! `ruda-llm bench-serve`'s client against a small mock OpenAI server (std networking, chunked
//! streaming as axum sends it): every request completes, usage and timings are read from the
//! stream, refused requests count as failures, and a server that refuses everything is an error.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ruda_llm::bench_serve::{bench_serve, BenchServeConfig};

/// Serves `/v1/models` and streaming `/v1/completions` of `tokens` one-token chunks, refusing
/// every `refuse_every`-th completion with 429 (0: never). Returns the address.
fn mock(tokens: usize, refuse_every: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let count = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let count = count.clone();
            std::thread::spawn(move || handle(stream, tokens, refuse_every, &count));
        }
    });
    addr
}

fn chunk(s: &mut TcpStream, data: &str) {
    let _ = write!(s, "{:x}\r\n{data}\r\n", data.len());
}

fn handle(mut s: TcpStream, tokens: usize, refuse_every: usize, count: &AtomicUsize) {
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut length = 0;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).unwrap();
        if h.trim().is_empty() {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    if path == "/v1/models" {
        let j = r#"{"object":"list","data":[{"id":"mock","object":"model"}]}"#;
        let _ =
            write!(s, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{j}", j.len());
        return;
    }
    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
    if refuse_every > 0 && n.is_multiple_of(refuse_every) {
        let j = r#"{"error":{"message":"busy","type":"rate_limit","param":null,"code":null}}"#;
        let _ = write!(s, "HTTP/1.1 429 Too Many Requests\r\nContent-Length: {}\r\n\r\n{j}", j.len());
        return;
    }
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((request["model"].as_str(), request["stream"].as_bool()), (Some("mock"), Some(true)));
    let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    for i in 0..tokens {
        std::thread::sleep(Duration::from_millis(2));
        chunk(&mut s, &format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"t{i}\"}}]}}\n\n"));
    }
    chunk(
        &mut s,
        &format!("data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":7,\"completion_tokens\":{tokens}}}}}\n\n"),
    );
    chunk(&mut s, "data: [DONE]\n\n");
    let _ = write!(s, "0\r\n\r\n");
}

fn config(addr: &str, concurrency: Vec<usize>) -> BenchServeConfig {
    BenchServeConfig {
        url: format!("http://{addr}"),
        concurrency,
        requests: 6,
        input_len: 7,
        output_len: 5,
        model: None,
        api_key: None,
        timeout: Duration::from_secs(30),
    }
}

#[test]
fn every_level_completes_its_requests_with_their_timings() {
    let addr = mock(5, 0);
    let mut seen = Vec::new();
    let results = bench_serve(&config(&addr, vec![1, 3]), |r| seen.push(r.concurrency)).unwrap();
    assert_eq!(seen, [1, 3]);
    for r in &results {
        assert_eq!((r.completed, r.failed), (6, 0), "{r:?}");
        assert_eq!(r.mean_prompt_tokens, 7.0);
        assert!((r.output_tokens_per_second - 30.0 / r.seconds).abs() < 1e-6);
        assert!(r.ttft.mean > 0.0 && r.ttft.p50 <= r.ttft.p99, "{r:?}");
        // Five chunks 2 ms apart: four gaps each, near 2 ms.
        assert!(r.itl.mean >= 0.0015 && r.tpot.mean > 0.0, "{r:?}");
    }
}

#[test]
fn refused_requests_are_failures_and_all_refused_is_an_error() {
    let addr = mock(3, 2);
    let r = &bench_serve(&config(&addr, vec![1]), |_| {}).unwrap()[0];
    assert_eq!((r.completed, r.failed), (3, 3), "{r:?}");
    let addr = mock(3, 1);
    let e = bench_serve(&config(&addr, vec![2]), |_| {}).unwrap_err().to_string();
    assert!(e.contains("429") && e.contains("busy"), "{e}");
    let e = bench_serve(&config(&addr, vec![0]), |_| {}).unwrap_err().to_string();
    assert!(e.contains("positive"), "{e}");
    let e = bench_serve(&BenchServeConfig { url: "localhost:1".into(), ..config(&addr, vec![1]) }, |_| {}).unwrap_err();
    assert!(e.to_string().contains("http://"), "{e}");
}
