//! The prefix cache inside the scheduler: where every page is, reference counts, bounds, and a
//! hash collision; random operation sequences checked after every step.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::*;

fn scheduler(
    active: usize,
    tokens: usize,
    block: usize,
    pages: usize,
    prefix: PrefixCacheConfig,
) -> ContinuousBatchScheduler {
    ContinuousBatchScheduler::new(
        ContinuousBatchConfig { max_active_sequences: active, max_batch_tokens: tokens },
        PagedKvCacheConfig { block_size: block, num_pages: pages, max_sequence_length: 64 },
    )
    .unwrap()
    .with_prefix_cache(prefix)
    .unwrap()
}

fn params(max_new_tokens: usize) -> GenerateParams {
    GenerateParams { max_new_tokens, ..Default::default() }
}

impl ContinuousBatchScheduler {
    /// Every page in exactly one place (free, private to one request, a cache entry), a request's
    /// shared pages are the entries of its prompt's chain, references equal holders, bounds hold.
    fn check_invariants(&self) {
        let entries = self.prefix.as_ref().map_or_else(Vec::new, |c| c.view());
        let mut places = vec![0usize; self.kv.num_pages];
        for &p in self.pool.free_pages() {
            places[p as usize] += 1;
        }
        let by_hash: HashMap<u64, (u32, usize)> = entries.iter().map(|&(h, page, refs, _)| (h, (page, refs))).collect();
        for &(_, page, _, _) in &entries {
            places[page as usize] += 1;
        }
        let mut holders: HashMap<u64, usize> = HashMap::new();
        for r in self.requests.values() {
            assert!(r.shared <= r.pages.len());
            for (i, &h) in r.hashes[..r.shared].iter().enumerate() {
                assert_eq!(by_hash[&h].0, r.pages[i], "a shared page is its entry's page");
                *holders.entry(h).or_default() += 1;
            }
            if let Some((src, copy)) = r.cow {
                *holders.entry(src).or_default() += 1;
                assert_eq!(by_hash[&src].0, copy.src);
                assert_eq!(r.pages[r.shared], copy.dst, "the copy's destination is private");
            }
            for &p in &r.pages[r.shared..] {
                places[p as usize] += 1;
            }
            if r.slot.is_none() {
                assert!(r.pages.is_empty(), "a waiting request holds no pages");
            }
        }
        assert!(places.iter().all(|&n| n == 1), "pages in exactly one place: {places:?}");
        for (h, (_, refs)) in &by_hash {
            assert_eq!(*refs, holders.get(h).copied().unwrap_or(0), "references equal holders");
        }
    }
}

#[test]
fn a_hash_collision_never_shares_a_page() {
    let cfg = PrefixCacheConfig { max_bytes: 1 << 20, max_entries: 64, page_bytes: 1, snapshot_bytes: 0 };
    let mut s = scheduler(2, 16, 2, 16, cfg);
    s.prefix.as_mut().unwrap().set_hash(|_, _| 7);
    let a = s.submit(vec![1, 2, 3], params(1)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    s.complete_batch(b.id, &[0]).unwrap();
    assert_eq!(s.stats().prefix_cached_pages, 1);
    assert!(!s.is_active(a));
    // Same hash for every page, other tokens: no hit, and the page is not cached (the key is taken).
    s.submit(vec![4, 5, 6], params(1)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    assert_eq!(b.sequences[0].start_position, 0);
    s.complete_batch(b.id, &[0]).unwrap();
    assert_eq!((s.stats().prefix_hits, s.stats().prefix_cached_pages), (0, 1));
    s.check_invariants();
    // The same tokens still hit.
    s.submit(vec![1, 2, 9], params(1)).unwrap();
    let b = s.schedule().unwrap().unwrap();
    assert_eq!(b.sequences[0].start_position, 2);
    s.check_invariants();
}

#[derive(Clone, Debug)]
enum Op {
    Submit(usize, usize, usize),
    Step(u32),
    Fail,
    Cancel(usize),
    Finish(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0usize..3, 0usize..9, 1usize..5).prop_map(|(b, p, n)| Op::Submit(b, p, n)),
        5 => (0u32..8).prop_map(Op::Step),
        1 => Just(Op::Fail),
        1 => (0usize..16).prop_map(Op::Cancel),
        1 => (0usize..16).prop_map(Op::Finish),
    ]
}

/// The executor's side of the snapshots: live ones, checked against what batches name.
#[derive(Default)]
struct Executor {
    live: HashSet<SnapshotId>,
    named: HashSet<SnapshotId>,
}

impl Executor {
    fn check(&self, s: &ContinuousBatchScheduler, b: &ScheduledBatch) {
        let block = s.kv.block_size;
        let total: usize = b.sequences.iter().map(|r| r.tokens.len()).sum();
        assert!(total <= s.config.max_batch_tokens, "token budget");
        let entries: HashMap<u32, Option<SnapshotId>> =
            s.prefix.as_ref().unwrap().view().into_iter().map(|(_, page, _, snap)| (page, snap)).collect();
        for (i, row) in b.sequences.iter().enumerate() {
            assert_eq!(row.block_table.len(), row.context_length.div_ceil(block));
            let written = &row.block_table[row.start_position / block..];
            for &p in written {
                assert!(!entries.contains_key(&p), "row writes into cached page {p}");
                for (j, other) in b.sequences.iter().enumerate() {
                    assert!(i == j || !other.block_table.contains(&p), "page {p} written by one row, read by another");
                }
            }
            if let Some(snap) = row.restore_snapshot {
                assert!(self.live.contains(&snap), "restoring a live snapshot");
                assert!(row.start_position > 0 && row.start_position.is_multiple_of(block));
                let last = row.block_table[row.start_position / block - 1];
                assert_eq!(entries[&last], Some(snap), "the snapshot of the entry ending at the start");
            }
            assert_eq!(row.start_position, s.requests[&row.request_id].computed);
            if let Some(snap) = row.save_snapshot {
                assert!(!self.named.contains(&snap), "a fresh snapshot id");
                let prompt = s.requests[&row.request_id].prompt.len();
                assert_eq!(
                    row.context_length,
                    (prompt - 1) / block * block,
                    "saved at the last boundary before the end"
                );
            }
        }
        for c in &b.copies {
            assert!(entries.contains_key(&c.src), "copies from a cached page");
            assert!(b.sequences.iter().any(|r| r.block_table.last() == Some(&c.dst)), "into a row's page");
        }
    }

    fn complete(&mut self, b: &ScheduledBatch) {
        for r in &b.sequences {
            if let Some(snap) = r.save_snapshot {
                self.named.insert(snap);
                self.live.insert(snap);
            }
        }
        for snap in &b.released_snapshots {
            assert!(self.live.remove(snap), "releasing a live snapshot");
        }
    }
}

/// Complete the outstanding batch or schedule one; true when there was nothing to do.
fn step(
    s: &mut ContinuousBatchScheduler,
    exec: &mut Executor,
    outstanding: &mut Option<ScheduledBatch>,
    t: u32,
) -> bool {
    if let Some(b) = outstanding.take() {
        exec.complete(&b);
        s.complete_batch(b.id, &vec![t; b.sequences.len()]).unwrap();
        false
    } else if let Some(b) = s.schedule().unwrap() {
        exec.check(s, &b);
        *outstanding = Some(b);
        false
    } else {
        true
    }
}

fn run(ops: Vec<Op>, block: usize, pages: usize, active: usize, tokens: usize, cfg: PrefixCacheConfig) {
    let mut s = scheduler(active, tokens, block, pages, cfg);
    let prefixes: [Vec<u32>; 3] = [(0..9).collect(), (0..4).chain(50..55).collect(), (70..79).collect()];
    let mut ids = Vec::new();
    let mut outstanding: Option<ScheduledBatch> = None;
    let mut exec = Executor::default();
    let mut done = 0;
    for op in ops {
        match op {
            Op::Submit(base, extra, n) => {
                if let Ok(id) = s.submit(prefixes[base][..=extra].to_vec(), params(n)) {
                    ids.push(id);
                }
            }
            Op::Step(t) => {
                step(&mut s, &mut exec, &mut outstanding, t);
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
        s.check_invariants();
    }
    let mut steps = 0;
    while !step(&mut s, &mut exec, &mut outstanding, 1) {
        s.check_invariants();
        steps += 1;
        assert!(steps < 10_000, "no progress");
    }
    done += s.pop_finished().len();
    assert!(!s.has_work());
    assert_eq!(done, ids.len(), "every request finishes");
    let st = s.stats();
    assert_eq!(st.pages_free + st.prefix_cached_pages, pages);
    // Live snapshots: those of the entries, and those still to be released.
    let cached: HashSet<SnapshotId> = s.prefix.as_ref().unwrap().view().into_iter().filter_map(|e| e.3).collect();
    let pending: HashSet<SnapshotId> = s.released.iter().copied().collect();
    assert_eq!(exec.live, &cached | &pending);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn random_operations_with_prefix_caching_keep_the_invariants(
        ops in proptest::collection::vec(op(), 1..60), block in 1usize..4, pages in 4usize..12,
        active in 1usize..4, tokens in 1usize..8, hybrid in any::<bool>(), max_entries in 1usize..8,
        max_bytes in 1u64..80,
    ) {
        let cfg = PrefixCacheConfig { max_bytes, max_entries, page_bytes: 4, snapshot_bytes: if hybrid { 3 } else { 0 } };
        run(ops, block, pages, active, tokens, cfg);
    }
}
