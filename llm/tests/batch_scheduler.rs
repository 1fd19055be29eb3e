//! The continuous-batching scheduler: one test per rule, then random operation sequences
//! checked against the invariants after every step.

use std::collections::HashMap;

use proptest::prelude::*;
use ruda_llm::{
    BatchKind, ContinuousBatchConfig, ContinuousBatchScheduler, GenerateParams, PageCopy, PagedKvCacheConfig,
    PrefixCacheConfig, RequestId, ScheduledBatch, StopReason,
};

fn scheduler(active: usize, tokens: usize, block: usize, pages: usize) -> ContinuousBatchScheduler {
    ContinuousBatchScheduler::new(
        ContinuousBatchConfig { max_active_sequences: active, max_batch_tokens: tokens },
        PagedKvCacheConfig { block_size: block, num_pages: pages, max_sequence_length: 64 },
    )
    .unwrap()
}

fn params(max_new_tokens: usize) -> GenerateParams {
    GenerateParams { max_new_tokens, ..Default::default() }
}

#[test]
fn prefill_in_chunks_then_decode_until_length() {
    let mut s = scheduler(2, 4, 4, 16);
    let id = s.submit((10..20).collect(), params(3)).unwrap();
    let mut starts = Vec::new();
    loop {
        let b = s.schedule().unwrap().unwrap();
        assert_eq!(b.kind, BatchKind::Prefill);
        let row = &b.sequences[0];
        assert!(row.tokens.len() <= 4);
        starts.push(row.start_position);
        let samples = row.samples;
        s.complete_batch(b.id, &[99]).unwrap();
        if samples {
            break;
        }
    }
    assert_eq!(starts, vec![0, 4, 8]);
    let b = s.schedule().unwrap().unwrap();
    assert_eq!(b.kind, BatchKind::Decode);
    assert_eq!(b.sequences[0].tokens, vec![99]);
    assert_eq!(b.sequences[0].start_position, 10);
    assert_eq!(b.sequences[0].block_table.len(), 3);
    s.complete_batch(b.id, &[7]).unwrap();
    let b = s.schedule().unwrap().unwrap();
    s.complete_batch(b.id, &[8]).unwrap();
    assert!(s.schedule().unwrap().is_none());
    let f = s.pop_finished();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].request_id, id);
    assert_eq!(f[0].generated_token_ids, vec![99, 7, 8]);
    assert_eq!(f[0].stop_reason, Some(StopReason::Length));
    assert_eq!(s.stats().pages_free, 16);
    assert!(!s.has_work());
}

#[test]
fn eos_stops_and_rows_that_do_not_sample_ignore_their_token() {
    let mut s = scheduler(1, 2, 4, 8);
    s.submit(vec![1, 2, 3], GenerateParams { eos_token_ids: vec![5], ..params(10) }).unwrap();
    let b = s.schedule().unwrap().unwrap();
    assert!(!b.sequences[0].samples);
    s.complete_batch(b.id, &[5]).unwrap(); // not a sample: no EOS
    let b = s.schedule().unwrap().unwrap();
    assert!(b.sequences[0].samples);
    s.complete_batch(b.id, &[5]).unwrap();
    let f = s.pop_finished();
    assert_eq!(f[0].generated_token_ids, vec![5]);
    assert_eq!(f[0].stop_reason, Some(StopReason::Eos));
}

#[test]
fn submit_rejects_what_can_never_run() {
    let mut s = scheduler(1, 8, 4, 2);
    assert!(s.submit(vec![], params(1)).is_err());
    assert!(s.submit(vec![1; 60], params(8)).is_err(), "longer than max_sequence_length");
    assert!(s.submit(vec![1; 8], params(2)).is_err(), "needs 3 pages, the pool has 2");
    assert!(s.submit(vec![1; 8], params(1)).is_ok(), "8 positions of KV fit in 2 pages");
    assert!(ContinuousBatchScheduler::new(
        ContinuousBatchConfig { max_active_sequences: 0, max_batch_tokens: 1 },
        PagedKvCacheConfig { block_size: 1, num_pages: 1, max_sequence_length: 1 }
    )
    .is_err());
}

fn cache(max_bytes: u64, max_entries: usize, snapshot_bytes: u64) -> PrefixCacheConfig {
    PrefixCacheConfig { max_bytes, max_entries, page_bytes: 10, snapshot_bytes }
}

fn cached(active: usize, tokens: usize, block: usize, pages: usize, c: PrefixCacheConfig) -> ContinuousBatchScheduler {
    scheduler(active, tokens, block, pages).with_prefix_cache(c).unwrap()
}

/// Schedule and complete batches (token 9 each) until nothing runs; the batches.
fn drain(s: &mut ContinuousBatchScheduler) -> Vec<ScheduledBatch> {
    let mut out = Vec::new();
    while let Some(b) = s.schedule().unwrap() {
        s.complete_batch(b.id, &vec![9; b.sequences.len()]).unwrap();
        out.push(b);
    }
    out
}

/// Complete decode batches until a prefill batch comes (left outstanding).
fn next_prefill(s: &mut ContinuousBatchScheduler) -> ScheduledBatch {
    loop {
        let b = s.schedule().unwrap().unwrap();
        if b.kind == BatchKind::Prefill {
            return b;
        }
        s.complete_batch(b.id, &vec![1; b.sequences.len()]).unwrap();
    }
}

#[test]
fn prefix_cache_settings_are_checked() {
    let bad = [cache(0, 8, 0), cache(100, 0, 0), PrefixCacheConfig { page_bytes: 0, ..cache(100, 8, 0) }];
    for c in bad {
        assert!(scheduler(1, 8, 4, 2).with_prefix_cache(c).is_err(), "{c:?}");
    }
    let mut s = scheduler(1, 8, 4, 2);
    s.submit(vec![1], params(1)).unwrap();
    assert!(s.with_prefix_cache(cache(100, 8, 0)).is_err(), "requests already submitted");
}

#[test]
fn the_same_prompt_shares_its_full_pages() {
    let mut s = cached(2, 16, 4, 16, cache(1000, 16, 0));
    let prompt: Vec<u32> = (10..20).collect();
    s.submit(prompt.clone(), params(4)).unwrap();
    let a = s.schedule().unwrap().unwrap();
    s.complete_batch(a.id, &[1]).unwrap();
    assert_eq!(s.stats().prefix_cached_pages, 2, "two full prompt pages");
    s.submit(prompt, params(4)).unwrap();
    let b = next_prefill(&mut s);
    let row = &b.sequences[0];
    assert_eq!((row.start_position, row.tokens.clone()), (8, vec![18, 19]));
    assert_eq!(row.block_table[..2], a.sequences[0].block_table[..2], "the same physical pages");
    assert_ne!(row.block_table[2], a.sequences[0].block_table[2]);
    assert!(b.copies.is_empty());
    let st = s.stats();
    assert_eq!((st.prefix_queries, st.prefix_hits, st.prefix_hit_tokens), (2, 1, 8));
    s.complete_batch(b.id, &[1]).unwrap();
    drain(&mut s);
    let st = s.stats();
    assert_eq!((st.pages_free, st.prefix_cached_pages, st.prefix_cache_bytes), (14, 2, 20));
}

#[test]
fn a_partly_shared_prompt_reuses_whole_pages_only() {
    let mut s = cached(2, 16, 4, 16, cache(1000, 16, 0));
    s.submit((0..10).collect(), params(1)).unwrap();
    drain(&mut s);
    // Shares 6 tokens: one whole page.
    s.submit(vec![0, 1, 2, 3, 4, 5, 60, 61, 62], params(1)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    assert_eq!(b.sequences[0].start_position, 4);
    assert_eq!(s.stats().prefix_hit_tokens, 4);
    s.complete_batch(b.id, &[1]).unwrap();
    // Another first page, the same second page: the chain differs, nothing is shared.
    s.submit(vec![9, 9, 9, 9, 4, 5, 6, 7, 8], params(1)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    assert_eq!(b.sequences[0].start_position, 0);
    assert_eq!(s.stats().prefix_hits, 1);
}

#[test]
fn a_page_aligned_repeat_copies_its_last_page() {
    let mut s = cached(2, 16, 4, 16, cache(1000, 16, 0));
    let prompt: Vec<u32> = (0..8).collect();
    s.submit(prompt.clone(), params(3)).unwrap();
    let a = s.schedule().unwrap().unwrap();
    s.complete_batch(a.id, &[1]).unwrap();
    s.submit(prompt, params(3)).unwrap();
    let b = next_prefill(&mut s);
    let (old, row) = (&a.sequences[0].block_table, &b.sequences[0]);
    assert_eq!((row.start_position, row.tokens.clone()), (7, vec![7]), "the last prompt token is computed");
    assert_eq!(row.block_table[0], old[0]);
    assert_ne!(row.block_table[1], old[1]);
    assert_eq!(b.copies, vec![PageCopy { src: old[1], dst: row.block_table[1] }]);
    assert_eq!(s.stats().prefix_hit_tokens, 7);
    s.complete_batch(b.id, &[1]).unwrap();
    drain(&mut s);
    assert_eq!(s.stats().pages_free + s.stats().prefix_cached_pages, 16);
}

#[test]
fn hybrid_models_save_a_snapshot_at_the_last_boundary_and_restore_it() {
    let mut s = cached(2, 16, 4, 16, cache(10_000, 16, 100));
    let prompt: Vec<u32> = (10..20).collect();
    s.submit(prompt.clone(), params(1)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    let row = &b.sequences[0];
    assert_eq!((row.context_length, row.samples), (8, false), "the chunk is cut at the boundary");
    let snapshot = row.save_snapshot.expect("saved at position 8");
    assert_eq!(row.restore_snapshot, None);
    s.complete_batch(b.id, &[0]).unwrap();
    assert_eq!(s.stats().prefix_cached_snapshots, 1);
    let batches = drain(&mut s);
    assert!(batches.iter().all(|b| b.sequences.iter().all(|r| r.save_snapshot.is_none())));
    // The next request with this prompt starts at 8 from the snapshot.
    s.submit(prompt.clone(), params(1)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    let row = &b.sequences[0];
    assert_eq!((row.start_position, row.restore_snapshot, row.save_snapshot), (8, Some(snapshot), None));
    s.complete_batch(b.id, &[0]).unwrap();
    // Without a snapshot, a matched prefix is not usable: a prompt sharing only page 0 recomputes,
    // and its snapshot at 4 goes to the existing entry of page 0 (whose page it did not take).
    let other = vec![10, 11, 12, 13, 50, 51];
    s.submit(other.clone(), params(1)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    let row = &b.sequences[0];
    assert_eq!((row.start_position, row.context_length, row.restore_snapshot), (0, 4, None));
    let at_four = row.save_snapshot.unwrap();
    s.complete_batch(b.id, &[0]).unwrap();
    drain(&mut s);
    assert_eq!(s.stats().prefix_hits, 1);
    assert_eq!(s.stats().prefix_cache_bytes, 2 * 10 + 2 * 100, "pages 0 and 1, snapshots at 4 and 8");
    s.submit(other, params(1)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    assert_eq!((b.sequences[0].start_position, b.sequences[0].restore_snapshot), (4, Some(at_four)));
}

#[test]
fn evicting_a_hybrid_entry_releases_its_snapshot() {
    // Two entries at most: the second prompt's pages evict the first's, and its snapshot.
    let mut s = cached(1, 16, 2, 16, cache(10_000, 2, 100));
    s.submit(vec![1, 2, 3, 4, 5], params(1)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    let snapshot = b.sequences[0].save_snapshot.unwrap();
    s.complete_batch(b.id, &[0]).unwrap();
    drain(&mut s);
    assert_eq!(s.stats().prefix_cached_snapshots, 1);
    s.submit(vec![6, 7, 8, 9, 10], params(1)).unwrap();
    let mut released = Vec::new();
    for b in drain(&mut s) {
        released.extend(b.released_snapshots);
    }
    s.submit(vec![11], params(1)).unwrap();
    released.extend(drain(&mut s).into_iter().flat_map(|b| b.released_snapshots));
    assert_eq!(released, vec![snapshot]);
    assert_eq!(s.stats().prefix_cached_pages, 2);
}

#[test]
fn bounds_by_entries_and_bytes_evict_the_least_recently_used() {
    // One full page per prompt (block 2, 3 tokens); room for two entries, by count or by bytes.
    for c in [cache(1000, 2, 0), cache(25, 16, 0)] {
        let mut s = cached(1, 16, 2, 16, c);
        let hits = |s: &ContinuousBatchScheduler| s.stats().prefix_hits;
        for p in [[1, 1, 0], [2, 2, 0]] {
            s.submit(p.to_vec(), params(1)).unwrap();
            drain(&mut s);
        }
        s.submit(vec![1, 1, 5], params(1)).unwrap(); // touches [1, 1]
        drain(&mut s);
        assert_eq!(hits(&s), 1);
        s.submit(vec![3, 3, 0], params(1)).unwrap(); // evicts [2, 2], the least recently used
        drain(&mut s);
        assert!(s.stats().prefix_cached_pages <= 2 && s.stats().prefix_cache_bytes <= 25);
        s.submit(vec![1, 1, 6], params(1)).unwrap();
        drain(&mut s);
        assert_eq!(hits(&s), 2, "{c:?}: [1, 1] stayed");
        s.submit(vec![2, 2, 6], params(1)).unwrap();
        drain(&mut s);
        assert_eq!(hits(&s), 2, "{c:?}: [2, 2] was evicted");
    }
}

#[test]
fn unreferenced_cached_pages_are_evicted_before_preempting() {
    let mut s = cached(2, 16, 2, 4, cache(1000, 16, 0));
    s.submit(vec![1, 2, 3, 4, 5], params(1)).unwrap();
    drain(&mut s);
    assert_eq!((s.stats().prefix_cached_pages, s.stats().pages_free), (2, 2));
    let d = s.submit(vec![9], params(2)).unwrap();
    s.submit(vec![11, 12, 13, 14, 15, 16], params(1)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    assert_eq!(b.sequences.len(), 2, "both rows got pages");
    assert_eq!(b.sequences[0].request_id, d);
    let st = s.stats();
    assert_eq!((st.preemptions, st.prefix_cached_pages, st.pages_free), (0, 0, 0));
    assert!(b.released_snapshots.is_empty());
}

#[test]
fn outstanding_batch_rules() {
    let mut s = scheduler(2, 8, 4, 8);
    s.submit(vec![1, 2], params(2)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    assert!(s.schedule().is_err(), "a batch is outstanding");
    assert!(s.complete_batch(b.id + 1, &[1]).is_err(), "wrong id");
    assert!(s.complete_batch(b.id, &[1, 2]).is_err(), "one token per row");
    s.fail_batch(b.id).unwrap();
    let b2 = s.schedule().unwrap().unwrap();
    assert_eq!(b2.sequences, b.sequences, "a failed batch is scheduled again");
}

#[test]
fn decode_goes_first_but_prefill_is_not_starved() {
    let mut s = scheduler(2, 64, 4, 32);
    s.submit(vec![1], params(30)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    s.complete_batch(b.id, &[2]).unwrap();
    s.submit(vec![3, 4], params(30)).unwrap();
    let mut kinds = Vec::new();
    for _ in 0..6 {
        let b = s.schedule().unwrap().unwrap();
        kinds.push(b.kind);
        let tokens = vec![9; b.sequences.len()];
        s.complete_batch(b.id, &tokens).unwrap();
    }
    assert_eq!(kinds[0], BatchKind::Decode);
    assert!(kinds.contains(&BatchKind::Prefill), "prefill starved: {kinds:?}");
}

#[test]
fn cancel_is_deferred_while_in_a_batch() {
    let mut s = scheduler(2, 8, 4, 8);
    let a = s.submit(vec![1, 2], params(4)).unwrap();
    let w = s.submit(vec![1, 2], params(4)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    s.cancel(a).unwrap();
    assert!(s.pop_finished().is_empty(), "deferred");
    s.complete_batch(b.id, &vec![0; b.sequences.len()]).unwrap();
    s.cancel(w).unwrap();
    let f = s.pop_finished();
    assert_eq!(f.len(), 2);
    assert!(f.iter().all(|f| f.stop_reason.is_none()));
    assert!(!s.has_work());
    assert_eq!(s.stats().pages_used, 0);
    assert!(s.cancel(a).is_err(), "no longer active");
}

#[test]
fn the_youngest_is_preempted_and_recomputes_prompt_and_generated() {
    // Two requests, 2 pages of 2: each holds one page after prefill; the first decode needs a second page.
    let mut s = scheduler(2, 8, 2, 2);
    let old = s.submit(vec![1, 2], params(3)).unwrap();
    let young = s.submit(vec![3, 4], params(3)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    assert_eq!(b.sequences.len(), 2);
    s.complete_batch(b.id, &[5, 6]).unwrap();
    let b = s.schedule().unwrap().unwrap();
    assert_eq!(b.kind, BatchKind::Decode);
    assert_eq!(b.sequences.len(), 1);
    assert_eq!(b.sequences[0].request_id, old);
    assert_eq!(s.stats().preemptions, 1);
    assert_eq!(s.stats().waiting, 1);
    s.complete_batch(b.id, &[7]).unwrap();
    let b = s.schedule().unwrap().unwrap();
    s.complete_batch(b.id, &[8]).unwrap();
    let f = s.pop_finished();
    assert_eq!(f[0].request_id, old);
    let b = s.schedule().unwrap().unwrap();
    assert_eq!(b.kind, BatchKind::Prefill);
    assert_eq!(b.sequences[0].request_id, young);
    assert_eq!(b.sequences[0].tokens, vec![3, 4, 6], "prompt + generated so far");
    assert_eq!(b.sequences[0].start_position, 0);
    assert!(b.sequences[0].samples);
}

#[test]
fn padding_of_the_matrices() {
    let mut s = scheduler(2, 16, 2, 16);
    s.submit(vec![1, 2, 3], params(2)).unwrap();
    s.submit(vec![4], params(2)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    assert_eq!(b.token_matrix(), vec![vec![1, 2, 3], vec![4, 0, 0]]);
    assert_eq!(b.context_lengths(), vec![3, 1]);
    let (flat, width) = b.flattened_block_table();
    assert_eq!(width, 2);
    assert_eq!(flat.len(), 4);
    assert_eq!(flat[3], 0);
}

#[derive(Clone, Debug)]
enum Op {
    Submit(usize, usize),
    Step(u32),
    Fail,
    Cancel(usize),
    Finish(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (1usize..12, 1usize..6).prop_map(|(p, n)| Op::Submit(p, n)),
        5 => (0u32..8).prop_map(Op::Step),
        1 => Just(Op::Fail),
        1 => (0usize..16).prop_map(Op::Cancel),
        1 => (0usize..16).prop_map(Op::Finish),
    ]
}

/// With `shared` (prefix caching), rows may share the pages they only read; a page a row writes
/// is in no other row's table.
fn check_batch(
    b: &ScheduledBatch,
    prompts: &HashMap<RequestId, Vec<u32>>,
    tokens: usize,
    active: usize,
    block: usize,
    shared: bool,
) {
    let total: usize = b.sequences.iter().map(|s| s.tokens.len()).sum();
    assert!(total <= tokens, "token budget exceeded");
    assert!(b.sequences.len() <= active);
    let mut pages = std::collections::HashSet::new();
    let mut slots = std::collections::HashSet::new();
    for s in &b.sequences {
        assert_eq!(s.context_length, s.start_position + s.tokens.len());
        assert_eq!(s.block_table.len(), s.context_length.div_ceil(block), "block table covers context_length");
        assert!(slots.insert(s.slot) && s.slot < active, "slot unique and in range");
        if shared {
            for &p in &s.block_table[s.start_position / block..] {
                let others = b.sequences.iter().filter(|o| o.block_table.contains(&p)).count();
                assert_eq!(others, 1, "page {p} written by one row and in another's table");
            }
        } else {
            for &p in &s.block_table {
                assert!(pages.insert(p), "page {p} assigned twice");
            }
        }
        if b.kind == BatchKind::Decode {
            assert_eq!(s.tokens.len(), 1);
        }
        let prompt = &prompts[&s.request_id];
        for (i, &t) in s.tokens.iter().enumerate() {
            if s.start_position + i < prompt.len() {
                assert_eq!(t, prompt[s.start_position + i]);
            }
        }
    }
}

/// Random operations, then a drain; every request finishes and every page comes back (to the
/// free list or the prefix cache).
fn random_operations(
    ops: Vec<Op>,
    block: usize,
    pages: usize,
    active: usize,
    tokens: usize,
    prefix: Option<PrefixCacheConfig>,
) -> Result<(), TestCaseError> {
    let mut s = scheduler(active, tokens, block, pages);
    if let Some(c) = prefix {
        s = s.with_prefix_cache(c).unwrap();
    }
    let shared = prefix.is_some();
    let bases: [Vec<u32>; 3] = [(0..11).collect(), (0..5).chain(40..46).collect(), (60..71).collect()];
    let mut ids = Vec::new();
    let mut prompts = HashMap::new();
    let mut outstanding: Option<ScheduledBatch> = None;
    let mut done = 0usize;
    for op in ops {
        match op {
            Op::Submit(p, n) => {
                let prompt: Vec<u32> = if shared {
                    bases[ids.len() % 3][..p].to_vec()
                } else {
                    (0..p as u32).map(|t| t + 100 * ids.len() as u32).collect()
                };
                if let Ok(id) = s.submit(prompt.clone(), params(n)) {
                    ids.push(id);
                    prompts.insert(id, prompt);
                }
            }
            Op::Step(t) => {
                if let Some(b) = outstanding.take() {
                    s.complete_batch(b.id, &vec![t; b.sequences.len()]).unwrap();
                } else if let Some(b) = s.schedule().unwrap() {
                    check_batch(&b, &prompts, tokens, active, block, shared);
                    outstanding = Some(b);
                }
            }
            Op::Fail => {
                if let Some(b) = outstanding.take() {
                    s.fail_batch(b.id).unwrap();
                }
            }
            Op::Cancel(i) => {
                if let Some(&id) = ids.get(i) {
                    let _ = s.cancel(id);
                }
            }
            Op::Finish(i) => {
                if let Some(&id) = ids.get(i) {
                    let _ = s.finish_request(id, StopReason::StopSequence);
                }
            }
        }
        done += s.pop_finished().len();
        let st = s.stats();
        prop_assert_eq!(st.pages_used + st.pages_free, pages);
        prop_assert!(st.running <= active);
        if let Some(c) = prefix {
            prop_assert!(st.prefix_cached_pages <= c.max_entries && st.prefix_cache_bytes <= c.max_bytes);
            prop_assert!(st.prefix_hits <= st.prefix_queries);
        }
    }
    // Drain: the driver keeps completing, so everything finishes and every page comes back.
    if let Some(b) = outstanding.take() {
        s.complete_batch(b.id, &vec![1; b.sequences.len()]).unwrap();
    }
    let mut steps = 0;
    while let Some(b) = s.schedule().unwrap() {
        check_batch(&b, &prompts, tokens, active, block, shared);
        s.complete_batch(b.id, &vec![1; b.sequences.len()]).unwrap();
        steps += 1;
        prop_assert!(steps < 10_000, "no progress");
    }
    done += s.pop_finished().len();
    prop_assert!(!s.has_work());
    prop_assert_eq!(done, ids.len());
    prop_assert_eq!(s.stats().pages_free + s.stats().prefix_cached_pages, pages);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
    #[test]
    fn random_operations_keep_the_invariants(ops in proptest::collection::vec(op(), 1..60), block in 1usize..4,
                                             pages in 4usize..12, active in 1usize..4, tokens in 1usize..8) {
        random_operations(ops, block, pages, active, tokens, None)?;
    }

    #[test]
    fn random_operations_with_prefix_caching_keep_the_invariants(
        ops in proptest::collection::vec(op(), 1..60), block in 1usize..4, pages in 4usize..12,
        active in 1usize..4, tokens in 1usize..8, hybrid in any::<bool>(), max_entries in 1usize..8,
        max_bytes in 1u64..100,
    ) {
        let c = PrefixCacheConfig { max_bytes, max_entries, page_bytes: 10, snapshot_bytes: if hybrid { 7 } else { 0 } };
        random_operations(ops, block, pages, active, tokens, Some(c))?;
    }
}
