//! The prefix cache: full pages of prompt tokens, keyed by a hash chain and shared by reference
//! count, with the linear-attention snapshots of hybrid models attached to them; LRU eviction of
//! unreferenced entries within the byte and entry bounds. See `docs/batching.md`.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::scheduler::{PrefixCacheConfig, SnapshotId};

/// `h_{-1}`: the parent hash of a prompt's first page.
const SEED: u64 = 0x5255_4441_5052_4546;

/// `h_i = hash(h_{i-1}, tokens of page i)`: deterministic (SipHash with fixed keys).
fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

#[derive(Debug)]
struct Entry {
    /// `None` for a prompt's first page.
    parent: Option<u64>,
    tokens: Vec<u32>,
    page: u32,
    /// Running requests whose block table holds `page` (or that copy from it).
    refs: usize,
    /// LRU clock; an entry's parent is always at least as recent as the entry.
    last_used: u64,
    snapshot: Option<SnapshotId>,
    children: Vec<u64>,
}

/// What an eviction gave back: pages for the free list, snapshots for the executor to free.
#[derive(Debug, Default)]
pub(crate) struct Evicted {
    pub(crate) pages: Vec<u32>,
    pub(crate) snapshots: Vec<SnapshotId>,
}

#[derive(Debug)]
pub(crate) struct PrefixCache {
    config: PrefixCacheConfig,
    /// By chain hash: an existing key is never replaced, so a hash names one entry at a time.
    entries: HashMap<u64, Entry>,
    snapshots: usize,
    clock: u64,
    hash: fn(u64, &[u32]) -> u64,
}

impl PrefixCache {
    pub(crate) fn new(config: PrefixCacheConfig) -> PrefixCache {
        PrefixCache { config, entries: HashMap::new(), snapshots: 0, clock: 0, hash: chain_hash }
    }

    /// Whether snapshots of linear-attention states are kept (a hybrid model).
    pub(crate) fn hybrid(&self) -> bool {
        self.config.snapshot_bytes > 0
    }

    pub(crate) fn entries(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn snapshots(&self) -> usize {
        self.snapshots
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.entries.len() as u64 * self.config.page_bytes + self.snapshots as u64 * self.config.snapshot_bytes
    }

    /// The chain hashes of the full pages of `tokens`.
    pub(crate) fn page_hashes(&self, tokens: &[u32], block_size: usize) -> Vec<u64> {
        let mut parent = SEED;
        tokens
            .chunks_exact(block_size)
            .map(|page| {
                parent = (self.hash)(parent, page);
                parent
            })
            .collect()
    }

    /// The entries matching `prompt`'s full pages from page 0 (parent hash and tokens compared,
    /// so a collision never matches): each one's snapshot.
    pub(crate) fn matched(&self, prompt: &[u32], hashes: &[u64], block_size: usize) -> Vec<Option<SnapshotId>> {
        let mut out = Vec::new();
        for (i, (&h, page)) in hashes.iter().zip(prompt.chunks_exact(block_size)).enumerate() {
            let parent = i.checked_sub(1).map(|p| hashes[p]);
            match self.entries.get(&h) {
                Some(e) if e.parent == parent && e.tokens == page => out.push(e.snapshot),
                _ => break,
            }
        }
        out
    }

    /// Take a reference to each entry of `chain` (matched from page 0) and touch them; their pages.
    pub(crate) fn acquire(&mut self, chain: &[u64]) -> Vec<u32> {
        let pages = chain
            .iter()
            .map(|h| {
                let e = self.entries.get_mut(h).expect("acquiring a matched entry");
                e.refs += 1;
                e.page
            })
            .collect();
        if let Some(&last) = chain.last() {
            self.touch(last);
        }
        pages
    }

    pub(crate) fn release(&mut self, hash: u64) {
        let e = self.entries.get_mut(&hash).expect("releasing a held entry");
        e.refs -= 1;
    }

    /// Cache `page` (the request's, which then holds one reference) as the entry `hash`, child of
    /// `parent` (held by the same request). False, and nothing changes hands, when an entry
    /// `hash` exists (an equal page, or a collision) or the bounds cannot be met by evicting.
    pub(crate) fn insert(
        &mut self,
        hash: u64,
        parent: Option<u64>,
        tokens: &[u32],
        page: u32,
        evicted: &mut Evicted,
    ) -> bool {
        if self.entries.contains_key(&hash) || !self.make_room(1, 0, evicted) {
            return false;
        }
        if let Some(p) = parent {
            self.entries.get_mut(&p).expect("the parent is held by the same request").children.push(hash);
        }
        let entry = Entry {
            parent,
            tokens: tokens.to_vec(),
            page,
            refs: 1,
            last_used: 0,
            snapshot: None,
            children: Vec::new(),
        };
        self.entries.insert(hash, entry);
        self.touch(hash);
        true
    }

    /// Attach snapshot `id` to the (held) entry `hash`. False when it has one already or the
    /// bounds cannot be met by evicting.
    pub(crate) fn attach_snapshot(&mut self, hash: u64, id: SnapshotId, evicted: &mut Evicted) -> bool {
        if self.entries[&hash].snapshot.is_some() || !self.make_room(0, 1, evicted) {
            return false;
        }
        self.entries.get_mut(&hash).expect("attaching to a held entry").snapshot = Some(id);
        self.snapshots += 1;
        true
    }

    /// Evict the least recently used unreferenced entry and its descendants. False when every
    /// entry is referenced.
    pub(crate) fn evict_lru(&mut self, evicted: &mut Evicted) -> bool {
        let victim = self.entries.iter().filter(|(_, e)| e.refs == 0).min_by_key(|(_, e)| e.last_used).map(|(&h, _)| h);
        let Some(victim) = victim else { return false };
        if let Some(p) = self.entries[&victim].parent {
            self.entries.get_mut(&p).expect("a cached entry's parent is cached").children.retain(|&c| c != victim);
        }
        let mut stack = vec![victim];
        while let Some(h) = stack.pop() {
            let e = self.entries.remove(&h).expect("descendants are cached");
            debug_assert_eq!(e.refs, 0, "a request holds whole chains");
            evicted.pages.push(e.page);
            if let Some(s) = e.snapshot {
                self.snapshots -= 1;
                evicted.snapshots.push(s);
            }
            stack.extend(e.children);
        }
        true
    }

    /// Evict until `entries` more entries and `snapshots` more snapshots fit; false (evicting
    /// nothing) when they would not fit even with every unreferenced entry gone.
    fn make_room(&mut self, entries: usize, snapshots: usize, evicted: &mut Evicted) -> bool {
        let c = self.config;
        let fits = |e: usize, s: usize| {
            e + entries <= c.max_entries
                && (e + entries) as u64 * c.page_bytes + (s + snapshots) as u64 * c.snapshot_bytes <= c.max_bytes
        };
        let held = self.entries.values().filter(|e| e.refs > 0);
        let (held_entries, held_snapshots) =
            held.fold((0, 0), |(n, s), e| (n + 1, s + usize::from(e.snapshot.is_some())));
        if !fits(held_entries, held_snapshots) {
            return false;
        }
        while !fits(self.entries.len(), self.snapshots) {
            self.evict_lru(evicted);
        }
        true
    }

    /// Mark `hash` and its ancestors used, the ancestors more recently (so LRU evicts leaves first).
    fn touch(&mut self, hash: u64) {
        let mut next = Some(hash);
        while let Some(h) = next {
            self.clock += 1;
            let e = self.entries.get_mut(&h).expect("touching a cached chain");
            e.last_used = self.clock;
            next = e.parent;
        }
    }

    /// Every entry as (hash, page, refs, snapshot), and whether the tree links are consistent.
    #[cfg(test)]
    pub(crate) fn view(&self) -> Vec<(u64, u32, usize, Option<SnapshotId>)> {
        for (h, e) in &self.entries {
            if let Some(p) = e.parent {
                assert!(self.entries[&p].children.contains(h), "child link");
                assert!(self.entries[&p].refs >= e.refs, "a parent is held by every holder of its child");
            }
            for c in &e.children {
                assert_eq!(self.entries[c].parent, Some(*h), "parent link");
            }
        }
        assert_eq!(self.snapshots, self.entries.values().filter(|e| e.snapshot.is_some()).count());
        assert!(self.entries.len() <= self.config.max_entries && self.bytes() <= self.config.max_bytes, "bounds");
        self.entries.iter().map(|(&h, e)| (h, e.page, e.refs, e.snapshot)).collect()
    }

    #[cfg(test)]
    pub(crate) fn set_hash(&mut self, hash: fn(u64, &[u32]) -> u64) {
        self.hash = hash;
    }
}
