//! The serving engine on the bundled tiny model: a request alone gets the pipeline's greedy
//! reply, streamed pieces add up to the final text, concurrent requests from several threads all
//! finish with their lone replies, admission is bounded (refused at once, never waiting), a
//! dropped handle cancels its request and frees its pages, bad requests are refused, and
//! shutdown finishes or cancels what is in flight.

use std::time::{Duration, Instant};

use ruda_llm::{
    example, load_pipeline, BatchOptions, Engine, EngineConfig, EngineError, EngineEvent, EngineRequest,
    GenerateParams, ModelType, Pipeline, PipelineOptions, RequestHandle, Shutdown, StreamControl,
};
use ruda_runtime::Device;

fn pipeline() -> Pipeline {
    let options = PipelineOptions { device: Some(Device::cpu()), ..Default::default() };
    load_pipeline(example::bundled_model(ModelType::Qwen2), &options).unwrap()
}

fn engine(max_active: usize, max_pending: usize) -> Engine {
    let batch = BatchOptions { max_active, block_size: 4, ..Default::default() };
    Engine::start(pipeline(), EngineConfig { batch, max_model_len: Some(96), max_pending }).unwrap()
}

fn greedy(max_new_tokens: usize) -> GenerateParams {
    GenerateParams { max_new_tokens, eos_token_ids: vec![], ..Default::default() }
}

/// Every event of `h` until its end: (streamed text, the final event).
fn drain(h: &mut RequestHandle) -> (String, Option<EngineEvent>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut text = String::new();
    loop {
        assert!(Instant::now() < deadline, "request {} did not end", h.id());
        match h.recv_timeout(Duration::from_secs(60)).expect("an event within a minute") {
            Some(EngineEvent::Token { text: piece, .. }) => text.push_str(&piece),
            Some(EngineEvent::Finished { text: rest, output }) => {
                text.push_str(&rest);
                return (text, Some(EngineEvent::Finished { text: rest, output }));
            }
            other => return (text, other),
        }
    }
}

fn prompts(engine: &Engine) -> Vec<Vec<u32>> {
    ["Hello there", "The cat sat on the", "A", "Once upon a time, in a land", "Hello there", "42 is"]
        .iter()
        .map(|p| engine.tokenizer().encode(p, true).unwrap())
        .collect()
}

/// A reply holding ids past the tokenizer's vocabulary (the padding rows of `qwen2-yarn`'s
/// embedding, 13 past its 400 tokens, which its random weights pick): streamed and final text
/// leave them out as transformers' decode does, and the request succeeds.
#[test]
fn padding_ids_in_a_reply_have_no_text() {
    let dir = crate::common::fixture("qwen2-yarn");
    let goldens: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("goldens.json")).unwrap()).unwrap();
    let options = PipelineOptions { device: Some(Device::cpu()), ..Default::default() };
    let batch = BatchOptions { max_active: 2, block_size: 4, ..Default::default() };
    let config = EngineConfig { batch, max_model_len: Some(96), max_pending: 4 };
    let engine = Engine::start(load_pipeline(&dir, &options).unwrap(), config).unwrap();
    let tokens = engine.tokenizer().vocab_size() as u32;
    let mut padded = 0;
    for prompt in goldens["prompts"].as_array().unwrap() {
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
        };
        let (prompt_ids, want) = (ids(&prompt["prompt_ids"]), ids(&prompt["greedy"]["ids"]));
        let mut h = engine.submit(EngineRequest { prompt: prompt_ids, params: greedy(want.len()) }).unwrap();
        let (streamed, last) = drain(&mut h);
        let Some(EngineEvent::Finished { output, .. }) = last else { panic!("{last:?}") };
        // (The f32 goldens test holds the ids to transformers'; here they only need their text.)
        let got = &output.generated_token_ids;
        padded += got.iter().filter(|&&id| id >= tokens).count();
        let known: Vec<u32> = got.iter().copied().filter(|&id| id < tokens).collect();
        assert_eq!(output.generated_text, engine.tokenizer().decode(&known, true).unwrap(), "special tokens skipped");
        assert_eq!(streamed, output.generated_text);
    }
    assert!(padded > 0, "no reply picked a padding id: the fixture no longer tests them");
}

#[test]
fn requests_get_their_lone_greedy_replies_streamed_and_concurrently() {
    let alone = pipeline();
    let engine = engine(3, 16);
    let prompts = prompts(&engine);
    let expected: Vec<(Vec<u32>, String)> = prompts
        .iter()
        .map(|p| {
            let g = alone.generate_from_ids(p, &greedy(9), true, |_, _| StreamControl::Continue).unwrap();
            (g.generated_token_ids, g.generated_text)
        })
        .collect();
    std::thread::scope(|scope| {
        let mut threads = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let engine = &engine;
            threads.push(scope.spawn(move || {
                let mut h = engine.submit(EngineRequest { prompt: p.clone(), params: greedy(9) }).unwrap();
                (i, drain(&mut h))
            }));
        }
        for t in threads {
            let (i, (streamed, last)) = t.join().unwrap();
            let Some(EngineEvent::Finished { output, .. }) = last else { panic!("prompt {i}: {last:?}") };
            assert_eq!(
                (&output.generated_token_ids, &output.generated_text),
                (&expected[i].0, &expected[i].1),
                "prompt {i}"
            );
            assert_eq!(streamed, output.generated_text, "prompt {i}: the streamed pieces add up to the reply");
            assert!(output.time_to_first_token <= output.latency);
        }
    });
    // The scheduler's figures are taken after each step, so they settle just after the last
    // reply.
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.metrics().scheduler.running > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let m = engine.metrics();
    assert_eq!(m.requests_finished, prompts.len() as u64);
    assert_eq!(m.time_to_first_token.count, prompts.len() as u64);
    assert_eq!(m.inter_token_latency.count, 8 * prompts.len() as u64);
    assert_eq!((m.scheduler.running, m.scheduler.waiting, m.scheduler.pages_used), (0, 0, 0));
    assert_eq!(engine.in_flight(), 0);
    engine.shutdown(Shutdown::Finish).unwrap();
}

#[test]
fn admission_is_bounded_and_bad_requests_are_refused() {
    let engine = engine(1, 1);
    let prompt = engine.tokenizer().encode("Hello there", true).unwrap();
    let long = || EngineRequest { prompt: prompt.clone(), params: greedy(60) };
    let mut first = engine.submit(long()).unwrap();
    let mut second = engine.submit(long()).unwrap();
    assert!(matches!(engine.submit(long()), Err(EngineError::Saturated(2))), "a third is refused at once");
    for (bad, want) in [
        (EngineRequest { prompt: vec![], params: greedy(4) }, "prompt tokens"),
        (EngineRequest { prompt: prompt.clone(), params: greedy(95) }, "context of 96"),
        (EngineRequest { prompt: vec![1, 400], params: greedy(4) }, "outside the vocabulary"),
        // Refused at once: in a batch, it would fail every request beside it.
        (
            EngineRequest {
                prompt: prompt.clone(),
                params: GenerateParams { logit_bias: vec![(1 << 20, 1.0)], ..greedy(4) },
            },
            "logit_bias: token id 1048576 is outside the vocabulary",
        ),
        (
            EngineRequest { prompt: prompt.clone(), params: GenerateParams { max_new_tokens: 0, ..greedy(1) } },
            "max_new_tokens",
        ),
    ] {
        match engine.submit(bad) {
            Err(EngineError::Invalid(m)) => assert!(m.contains(want), "{m}"),
            other => panic!("{want}: {:?}", other.map(|h| h.id())),
        }
    }
    assert!(matches!(drain(&mut first).1, Some(EngineEvent::Finished { .. })));
    assert!(matches!(drain(&mut second).1, Some(EngineEvent::Finished { .. })));
    // Room again.
    let mut third = engine.submit(EngineRequest { prompt, params: greedy(2) }).unwrap();
    assert!(matches!(drain(&mut third).1, Some(EngineEvent::Finished { .. })));
}

#[test]
fn a_dropped_handle_cancels_its_request_and_frees_its_pages() {
    let engine = engine(2, 4);
    let prompt = engine.tokenizer().encode("Once upon a time", true).unwrap();
    let mut h = engine.submit(EngineRequest { prompt: prompt.clone(), params: greedy(80) }).unwrap();
    assert!(matches!(h.recv(), Some(EngineEvent::Token { .. })));
    drop(h);
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine.in_flight() > 0 || engine.metrics().scheduler.pages_used > 0 {
        assert!(Instant::now() < deadline, "the cancelled request still holds {:?}", engine.metrics().scheduler);
        std::thread::sleep(Duration::from_millis(5));
    }
    let m = engine.metrics();
    assert_eq!((m.requests_cancelled, m.requests_finished), (1, 0));
    // Shutdown: Finish runs what is in flight to its end, Cancel ends it without a reply.
    let mut a = engine.submit(EngineRequest { prompt: prompt.clone(), params: greedy(5) }).unwrap();
    engine.shutdown(Shutdown::Finish).unwrap();
    assert!(matches!(drain(&mut a).1, Some(EngineEvent::Finished { .. })));
    let engine = self::engine(1, 2);
    let mut b = engine.submit(EngineRequest { prompt, params: greedy(80) }).unwrap();
    assert!(matches!(b.recv(), Some(EngineEvent::Token { .. })));
    engine.shutdown(Shutdown::Cancel).unwrap();
    let (_, last) = drain(&mut b);
    assert_eq!(last, None, "a cancelled request ends without a terminal event");
}

#[test]
fn token_events_carry_the_pipelines_logprobs() {
    let alone = pipeline();
    let engine = engine(2, 4);
    let prompt = engine.tokenizer().encode("The cat sat on the", true).unwrap();
    let params = GenerateParams { logprobs: Some(3), ..greedy(6) };
    let want = alone.generate_from_ids(&prompt, &params, true, |_, _| StreamControl::Continue).unwrap();
    let mut h = engine.submit(EngineRequest { prompt: prompt.clone(), params }).unwrap();
    let mut got = Vec::new();
    loop {
        match h.recv_timeout(Duration::from_secs(60)).expect("an event within a minute") {
            Some(EngineEvent::Token { token, logprobs, .. }) => {
                let lp = logprobs.expect("every token carries its logprobs");
                assert_eq!(lp.token, token);
                got.push(lp);
            }
            Some(EngineEvent::Finished { output, .. }) => {
                assert_eq!(output.generated_token_ids, want.generated_token_ids);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got.len(), want.logprobs.len());
    for (g, w) in got.iter().zip(&want.logprobs) {
        assert_eq!(
            (g.token, g.top.iter().map(|t| t.0).collect::<Vec<_>>()),
            (w.token, w.top.iter().map(|t| t.0).collect())
        );
        assert!((g.logprob - w.logprob).abs() < 1e-3, "{g:?} vs {w:?}");
    }
    // Without them, nothing is attached.
    let mut h = engine.submit(EngineRequest { prompt, params: greedy(2) }).unwrap();
    assert!(matches!(h.recv(), Some(EngineEvent::Token { logprobs: None, .. })));
}
