//! Keys/values of earlier requests kept beyond the scheduler's slots, under a memory budget.
//!
//! A slot keeps its cache after its request ends, but only until another request takes the
//! slot. Before the scheduler overwrites a slot's cached positions, it saves them here; a later
//! request whose prompt starts with a saved sequence gets those positions copied back into its
//! slot instead of recomputing them (a memory copy is orders of magnitude cheaper than the
//! forward pass that produced it). Entries are evicted least recently used first once their
//! total size exceeds the budget.

use crate::model::{KvCache, Model};

/// Sequences shorter than this are cheaper to recompute than to keep.
const MIN_TOKENS: usize = 32;

pub struct PrefixStore {
    budget_bytes: usize,
    entries: Vec<Entry>,
    bytes: usize,
    tick: u64,
}

/// Keys/values copied out of a cache, not yet kept.
pub struct Snapshot {
    tokens: Vec<u32>,
    kv: KvCache,
}

struct Entry {
    tokens: Vec<u32>,
    /// Exactly `tokens.len()` positions.
    kv: KvCache,
    last_used: u64,
}

impl PrefixStore {
    pub fn new(budget_bytes: usize) -> Self {
        PrefixStore {
            budget_bytes,
            entries: Vec::new(),
            bytes: 0,
            tick: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A copy of the first `tokens.len()` positions of `cache`, to [`insert`](Self::insert)
    /// once the cache has been reused; `None` when not worth keeping (too short, larger than
    /// the budget, or already covered by a saved entry).
    pub fn snapshot(&self, model: &Model, tokens: &[u32], cache: &KvCache) -> Option<Snapshot> {
        // Only attention KV is copied; a recurrent state (hybrid models) is not kept here.
        if cache.has_recurrent() {
            return None;
        }
        let n = tokens.len().min(cache.len());
        let tokens = &tokens[..n];
        if n < MIN_TOKENS || self.entries.iter().any(|e| e.tokens.starts_with(tokens)) {
            return None;
        }
        let mut kv = model.new_cache(n);
        for layer in 0..model.config().n_layers {
            kv.append(layer, cache.keys(layer, n), cache.values(layer, n));
        }
        kv.advance(n);
        (kv.bytes() <= self.budget_bytes).then(|| Snapshot {
            tokens: tokens.to_vec(),
            kv,
        })
    }

    /// Keeps a snapshot (it supersedes saved entries that are prefixes of it), then evicts the
    /// least recently used entries beyond the budget.
    pub fn insert(&mut self, snapshot: Snapshot) {
        let Snapshot { tokens, kv } = snapshot;
        self.entries.retain(|e| !tokens.starts_with(&e.tokens));
        self.tick += 1;
        self.entries.push(Entry {
            tokens,
            kv,
            last_used: self.tick,
        });
        self.evict();
    }

    /// The saved entry sharing the longest prefix with `prompt`: (entry, shared length).
    pub fn best(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(_, n)| n)
    }

    /// Replaces the contents of `cache` with the first `n` positions of entry `index`;
    /// returns the tokens they stand for.
    pub fn restore(&mut self, index: usize, n: usize, cache: &mut KvCache) -> Vec<u32> {
        self.tick += 1;
        let e = &mut self.entries[index];
        e.last_used = self.tick;
        let n = n.min(e.tokens.len());
        cache.clear();
        for layer in 0..e.kv.n_layers() {
            cache.append(layer, e.kv.keys(layer, n), e.kv.values(layer, n));
        }
        cache.advance(n);
        e.tokens[..n].to_vec()
    }

    fn evict(&mut self) {
        self.bytes = self.entries.iter().map(|e| e.kv.bytes()).sum();
        while self.bytes > self.budget_bytes {
            let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)
            else {
                break;
            };
            self.bytes -= self.entries.remove(oldest).kv.bytes();
        }
    }
}

pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
