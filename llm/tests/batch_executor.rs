//! The batched executor against one-at-a-time generation: mixed-length prompts with repeats and a
//! shared prefix, few active slots, few pages (so prompts are chunked and sequences preempted
//! and recomputed), for Qwen2, Qwen3, the hybrid Qwen3.5 and Qwen3-MoE, through both paged attention paths.
//! Every sampled row's f32 logits agree with the single-sequence pipeline's at that step within
//! 1e-4, and its greedy pick agrees wherever the single-sequence top-2 margin exceeds 1e-3 (the
//! tokens fed back are the single-sequence ones, so every step stays comparable).

use std::collections::HashMap;

use ruda_llm::{
    architecture, decode_bucket, example, load_config, BatchKind, CausalLm, ContinuousBatchConfig,
    ContinuousBatchScheduler, GenerateParams, ModelType, PagedKvCacheConfig, RequestId, Weights,
};
use ruda_runtime::{DType, Device, GraphMode, PagedAttentionMode};

fn load(model_type: ModelType, device: &Device) -> Box<dyn CausalLm> {
    load_dir(&example::bundled_model(model_type), device)
}

fn load_dir(dir: &std::path::Path, device: &Device) -> Box<dyn CausalLm> {
    let config = load_config(dir).unwrap();
    let weights = Weights::load(dir, &config).unwrap();
    architecture(config.model_type).load(&config, &weights, device, DType::F32).unwrap()
}

/// Prompts of 5, 8 (two pages of 4), 1, 13 and 9 tokens, a repeat of the first, one sharing the
/// 13-token one's first 8, and a repeat of the page-aligned one, last (so the first copy's pages
/// are cached by the time it runs).
fn prompts() -> Vec<Vec<u32>> {
    let long: Vec<u32> = (0..13).map(|i| (i * 37 + 11) % 397).collect();
    let mut shared = long[..8].to_vec();
    shared.extend([3, 99, 301]);
    let aligned: Vec<u32> = (0..8).map(|i| 200 + i * 11).collect();
    vec![
        vec![5, 17, 42, 9, 100],
        aligned.clone(),
        vec![77],
        long,
        (0..9).map(|i| 390 - i * 13).collect(),
        vec![5, 17, 42, 9, 100],
        shared,
        aligned,
    ]
}

/// One sequence at a time: the logits after the prompt and after each of `steps - 1` greedy
/// tokens, and those tokens.
fn one_at_a_time(model: &dyn CausalLm, prompt: &[u32], steps: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut cache = model.new_cache_with_capacity(64).unwrap();
    let ws = model.decode_workspace().unwrap();
    let mut logits = vec![model.forward_cached_last(prompt, &mut cache).unwrap().to_f32_vec().unwrap()];
    let mut ids = Vec::new();
    for step in 0..steps {
        let id = argmax(&logits[step]);
        ids.push(id);
        if step + 1 < steps {
            let next = model.decode_step(&mut cache, id, &ws).unwrap();
            logits.push(next.to_f32_vec().unwrap());
        }
    }
    (logits, ids)
}

fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}

fn top2_margin(xs: &[f32]) -> f32 {
    let best = argmax(xs) as usize;
    let second = xs.iter().enumerate().filter(|&(i, _)| i != best).map(|(_, &x)| x).fold(f32::MIN, f32::max);
    xs[best] - second
}

/// What a batched run did.
#[derive(Debug, Default)]
struct Run {
    preemptions: u64,
    /// Prefill and decode batches of several rows.
    multi_prefill: usize,
    multi_decode: usize,
    prefix_hits: u64,
    page_copies: usize,
    restores: usize,
}

/// Runs `prompts` through the scheduler (with the prefix cache when `prefix`) and the batched
/// executor, feeding back the reference tokens, checking every sampled row against the
/// references.
#[allow(clippy::too_many_arguments)]
fn batched_agrees(
    model: &dyn CausalLm,
    mode: PagedAttentionMode,
    prefix: bool,
    prompts: &[Vec<u32>],
    references: &[(Vec<Vec<f32>>, Vec<u32>)],
    steps: usize,
    kv: PagedKvCacheConfig,
    config: ContinuousBatchConfig,
) -> Run {
    let mut cache = model.new_batch_cache_with(kv, config.max_active_sequences, mode).unwrap();
    let mut scheduler = ContinuousBatchScheduler::new(config, kv).unwrap();
    if prefix {
        let bounds = cache.prefix_cache_config(1 << 40, kv.num_pages);
        scheduler = scheduler.with_prefix_cache(bounds).unwrap();
    }
    let mut run = Run::default();
    let params = GenerateParams { max_new_tokens: steps, eos_token_ids: vec![], ..Default::default() };
    let mut index: HashMap<RequestId, usize> = HashMap::new();
    for (i, p) in prompts.iter().enumerate() {
        index.insert(scheduler.submit(p.clone(), params.clone()).unwrap(), i);
    }
    let vocab = model.config().vocab_size;
    let mut done = vec![false; prompts.len()];
    while scheduler.has_work() {
        let batch = scheduler.schedule().unwrap().expect("work left, so a batch");
        let rows = batch.sequences.len();
        match batch.kind {
            BatchKind::Prefill if rows > 1 => run.multi_prefill += 1,
            BatchKind::Decode if rows > 1 => run.multi_decode += 1,
            _ => {}
        }
        run.page_copies += batch.copies.len();
        run.restores += batch.sequences.iter().filter(|r| r.restore_snapshot.is_some()).count();
        let logits = model.forward_batch(&batch, &mut cache).unwrap();
        assert_eq!(logits.shape(), [rows, vocab]);
        let logits = logits.to_f32_vec().unwrap();
        let mut tokens = Vec::new();
        for (r, row) in batch.sequences.iter().enumerate() {
            let i = index[&row.request_id];
            let (ref_logits, ref_ids) = &references[i];
            if !row.samples {
                tokens.push(0);
                continue;
            }
            // The step this row samples: tokens generated so far.
            let step = row.context_length - prompts[i].len();
            let got = &logits[r * vocab..(r + 1) * vocab];
            let want = &ref_logits[step];
            let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(worst <= 1e-4, "{mode:?} prompt {i} step {step}: logits differ by {worst}");
            if top2_margin(want) > 1e-3 {
                assert_eq!(argmax(got), ref_ids[step], "{mode:?} prompt {i} step {step}");
            }
            tokens.push(ref_ids[step]);
        }
        scheduler.complete_batch(batch.id, &tokens).unwrap();
        for f in scheduler.pop_finished() {
            let i = index[&f.request_id];
            assert_eq!(f.generated_token_ids, references[i].1, "prompt {i}");
            done[i] = true;
        }
    }
    assert!(done.iter().all(|&d| d), "{done:?}");
    let stats = scheduler.stats();
    (run.preemptions, run.prefix_hits) = (stats.preemptions, stats.prefix_hits);
    run
}

#[test]
fn batched_generation_agrees_with_one_at_a_time() {
    let device = Device::cpu();
    let steps = 6;
    let prompts = prompts();
    // The MoE models from their fixtures (no bundled models): Qwen3-MoE's routed experts in two
    // of three layers, Qwen3.5-MoE's with a shared expert after each of its two mixers.
    let models = [ModelType::Qwen2, ModelType::Qwen3, ModelType::Qwen35]
        .map(|t| (t, example::bundled_model(t)))
        .into_iter()
        .chain([
            (ModelType::Qwen3Moe, crate::common::fixture("qwen3-moe")),
            (ModelType::Qwen35Moe, crate::common::fixture("qwen35-moe")),
        ]);
    for (model_type, dir) in models {
        let model = load_dir(&dir, &device);
        let references: Vec<_> = prompts.iter().map(|p| one_at_a_time(model.as_ref(), p, steps)).collect();
        // Three slots, 7 tokens a batch (the 13-token prompt takes two chunks), pages of 4: the
        // longest requests need 5 pages, and 5 pages cannot hold two of them.
        let kv = PagedKvCacheConfig { block_size: 4, num_pages: 5, max_sequence_length: 20 };
        let config = ContinuousBatchConfig { max_active_sequences: 3, max_batch_tokens: 7 };
        // A pool of 16 pages keeps cached prefixes long enough for the page-aligned repeat to
        // find its pages (copy-on-write) and Qwen3.5's repeats their snapshots.
        let roomy = PagedKvCacheConfig { num_pages: 16, ..kv };
        for mode in [PagedAttentionMode::Legacy, PagedAttentionMode::Fused] {
            for (prefix, kv) in [(false, kv), (true, kv), (true, roomy)] {
                let run = batched_agrees(model.as_ref(), mode, prefix, &prompts, &references, steps, kv, config);
                let what = format!("{model_type:?} {mode:?}, prefix cache {prefix}, {} pages: {run:?}", kv.num_pages);
                assert!(run.multi_prefill > 0 && run.multi_decode > 0, "{what}: batches of several rows of both kinds");
                assert_eq!(run.prefix_hits > 0, prefix, "{what}: repeated and shared prompts hit");
                if kv.num_pages == 5 {
                    assert!(run.preemptions > 0, "{what}: the small pool preempts");
                } else if model_type.is_qwen35() {
                    assert!(run.restores > 0, "{what}: hits resume the linear-attention states");
                } else {
                    assert!(run.page_copies > 0, "{what}: a page-aligned repeat copies its last page");
                }
            }
        }
    }
}

#[test]
fn a_bad_batch_is_an_error_that_changes_nothing() {
    let device = Device::cpu();
    let model = load(ModelType::Qwen2, &device);
    let kv = PagedKvCacheConfig { block_size: 4, num_pages: 4, max_sequence_length: 12 };
    let config = ContinuousBatchConfig { max_active_sequences: 2, max_batch_tokens: 16 };
    let mut scheduler = ContinuousBatchScheduler::new(config, kv).unwrap();
    let params = GenerateParams { max_new_tokens: 2, eos_token_ids: vec![], ..Default::default() };
    scheduler.submit(vec![1, 2, 3], params).unwrap();
    let mut cache = model.new_batch_cache_with(kv, 2, PagedAttentionMode::Legacy).unwrap();
    let batch = scheduler.schedule().unwrap().unwrap();
    let vocab = model.config().vocab_size as u32;
    let bad_inputs = [
        ("a token outside the vocabulary", {
            let mut b = batch.clone();
            b.sequences[0].tokens[1] = vocab;
            b
        }),
        ("a page past the pool", {
            let mut b = batch.clone();
            b.sequences[0].block_table[0] = 4;
            b
        }),
        ("a slot past the active limit", {
            let mut b = batch.clone();
            b.sequences[0].slot = 2;
            b
        }),
        ("a context past max_sequence_length", {
            let mut b = batch.clone();
            b.sequences[0].tokens = vec![1; 13];
            b.sequences[0].context_length = 13;
            b
        }),
    ];
    for (what, bad) in bad_inputs {
        let err = model.forward_batch(&bad, &mut cache).expect_err(what).to_string();
        assert!(err.contains("batch 0"), "{what}: {err}");
        assert!(cache.broken().is_none(), "{what}: a rejected batch must not break the cache");
    }
    let good = model.forward_batch(&batch, &mut cache).unwrap().to_f32_vec().unwrap();
    let mut fresh = model.new_batch_cache_with(kv, 2, PagedAttentionMode::Legacy).unwrap();
    assert_eq!(good, model.forward_batch(&batch, &mut fresh).unwrap().to_f32_vec().unwrap());
    // A model of another shape: its layers do not match the cache.
    let other = load(ModelType::Qwen35, &device);
    let err = other.forward_batch(&batch, &mut cache).unwrap_err().to_string();
    assert!(err.contains("another model"), "{err}");
}

/// Batched decode steps replayed from graphs (a batch padded up to its bucket) give the logits
/// of launching them one by one, bit for bit; a warmed decode step allocates nothing and never
/// waits for the device.
#[test]
fn batched_decode_graphs_replay_the_launched_steps() {
    for (model_type, mode) in [
        (ModelType::Qwen2, PagedAttentionMode::Legacy),
        (ModelType::Qwen3, PagedAttentionMode::Fused),
        (ModelType::Qwen35, PagedAttentionMode::Legacy),
        (ModelType::Qwen35, PagedAttentionMode::Fused),
        (ModelType::Qwen3Moe, PagedAttentionMode::Fused),
        (ModelType::Qwen35Moe, PagedAttentionMode::Legacy),
    ] {
        let device = Device::cpu();
        let model = match model_type {
            ModelType::Qwen3Moe => load_dir(&crate::common::fixture("qwen3-moe"), &device),
            ModelType::Qwen35Moe => load_dir(&crate::common::fixture("qwen35-moe"), &device),
            _ => load(model_type, &device),
        };
        let kv = PagedKvCacheConfig { block_size: 4, num_pages: 32, max_sequence_length: 32 };
        let config = ContinuousBatchConfig { max_active_sequences: 4, max_batch_tokens: 64 };
        let mut caches = [GraphMode::On, GraphMode::Off]
            .map(|graphs| model.new_batch_cache_with(kv, 4, mode).unwrap().with_graphs(graphs));
        let mut schedulers = [0, 1].map(|_| ContinuousBatchScheduler::new(config, kv).unwrap());
        // Replies of 12, 10, 8 and 6 tokens: decode batches of 4, 3, 2 and 1 rows.
        for (i, p) in prompts().into_iter().take(4).enumerate() {
            let params = GenerateParams { max_new_tokens: 12 - 2 * i, eos_token_ids: vec![], ..Default::default() };
            for s in &mut schedulers {
                s.submit(p.clone(), params.clone()).unwrap();
            }
        }
        let vocab = model.config().vocab_size;
        let (mut replayed, mut padded_replays, mut seen) = (0, 0, [Vec::new(), Vec::new()]);
        while schedulers[0].has_work() {
            let batches = schedulers.each_mut().map(|s| s.schedule().unwrap().unwrap());
            assert_eq!(batches[0], batches[1]);
            let mut logits = Vec::new();
            for (c, (cache, batch)) in caches.iter_mut().zip(&batches).enumerate() {
                let before = device.counters();
                let out = model.forward_batch(batch, cache).unwrap();
                let step = device.counters().since(&before);
                let rows = batch.sequences.len();
                if batch.kind == BatchKind::Decode {
                    // With graphs a batch runs at its bucket's size (3 rows padded to 4).
                    let size = if c == 0 { decode_bucket(rows) } else { rows };
                    // A decode step of a size that ran before finds its buffers made (and with
                    // graphs, the second captures, the later ones replay).
                    if seen[c].contains(&size) {
                        assert_eq!(
                            (step.allocations, step.host_syncs),
                            (0, 0),
                            "{model_type:?}, {rows} rows: {step:?}"
                        );
                    }
                    if c == 0 && seen[c].iter().filter(|&&r| r == size).count() > 1 {
                        assert!(cache.captured_decode_graphs().contains(&size));
                        replayed += 1;
                        padded_replays += usize::from(size != rows);
                    }
                    seen[c].push(size);
                }
                logits.push(out.to_f32_vec().unwrap());
            }
            assert_eq!(logits[0], logits[1], "{model_type:?} batch {}", batches[0].id);
            let tokens: Vec<u32> =
                (0..batches[0].sequences.len()).map(|r| argmax(&logits[0][r * vocab..(r + 1) * vocab])).collect();
            for (s, b) in schedulers.iter_mut().zip(&batches) {
                s.complete_batch(b.id, &tokens).unwrap();
            }
        }
        assert_eq!(caches[0].captured_decode_graphs(), [1, 2, 4], "{model_type:?}");
        assert!(caches[1].captured_decode_graphs().is_empty());
        assert!(replayed >= 5 && padded_replays >= 2, "{model_type:?}: {replayed} replays, {padded_replays} padded");
    }
}
