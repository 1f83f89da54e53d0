//! The serving scheduler's KV memory: one pool of fixed-size KV blocks under a budget, and a
//! prefix index over the blocks of earlier requests.
//!
//! Every sequence's cache takes its blocks from here and gives back the ones nobody else
//! references. Blocks of finished (or still running) sequences are kept in a trie keyed by
//! their token ids — a block's key is its parent block plus the tokens it holds — so a new
//! prompt that starts with cached blocks maps them into its table without copying or
//! recomputing (a block ending inside the prompt is copied on its first write). A block held
//! only by the index is *cached*: reusable, and evicted least recently used first (with the
//! part of the trie below it) when a sequence needs a block and the budget is spent.
//!
//! Only attention keys/values are shared. A hybrid model's recurrent state at a block
//! boundary is not kept, so the scheduler neither looks up nor registers hybrid caches.

use crate::model::kv_cache::{BlockSource, KvBlock, KvCache, BLOCK_TOKENS};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The trie's root (the parent of first blocks).
const ROOT: u64 = 0;

pub struct BlockPool {
    n_layers: usize,
    row: usize,
    max_blocks: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Blocks that exist (in tables, in the index, or free).
    allocated: usize,
    /// Allocated blocks nobody references.
    free: Vec<KvBlock>,
    entries: HashMap<u64, Entry>,
    /// Entry ids below each entry id (`ROOT` for first blocks).
    children: HashMap<u64, Vec<u64>>,
    next_id: u64,
    tick: u64,
}

/// One cached block: its tokens (all `BLOCK_TOKENS`, or fewer for the tail of a sequence).
struct Entry {
    parent: u64,
    tokens: Vec<u32>,
    block: Arc<KvBlock>,
    last_used: u64,
}

/// Gauges for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockStats {
    /// The budget, in blocks.
    pub total: usize,
    /// Referenced by at least one sequence.
    pub used: usize,
    /// Held only by the prefix index (reusable, evictable).
    pub cached: usize,
    /// Positions per block and bytes per block.
    pub block_tokens: usize,
    pub block_bytes: usize,
}

impl BlockPool {
    /// A pool of at most `budget_bytes` of blocks for caches of `n_layers` × `row` floats per
    /// position (at least one block).
    pub fn new(n_layers: usize, row: usize, budget_bytes: usize) -> Arc<Self> {
        let max_blocks = (budget_bytes / KvBlock::bytes_for(n_layers, row).max(1)).max(1);
        Arc::new(BlockPool {
            n_layers,
            row,
            max_blocks,
            inner: Mutex::new(Inner {
                next_id: ROOT + 1,
                ..Default::default()
            }),
        })
    }

    pub fn max_blocks(&self) -> usize {
        self.max_blocks
    }

    /// Blocks a sequence of `tokens` positions needs at most.
    pub fn blocks_for(tokens: usize) -> usize {
        tokens.div_ceil(BLOCK_TOKENS)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (every update is one step).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stats(&self) -> BlockStats {
        let g = self.lock();
        let cached = g
            .entries
            .values()
            .filter(|e| Arc::strong_count(&e.block) == 1)
            .count();
        BlockStats {
            total: self.max_blocks,
            used: g.allocated - g.free.len() - cached,
            cached,
            block_tokens: BLOCK_TOKENS,
            block_bytes: KvBlock::bytes_for(self.n_layers, self.row),
        }
    }

    /// The longest cached prefix of `prompt`, at most `limit` tokens: the blocks to map and how
    /// many positions of them match. Marks them used.
    pub fn lookup(&self, prompt: &[u32], limit: usize) -> (Vec<Arc<KvBlock>>, usize) {
        let mut g = self.lock();
        let prompt = &prompt[..limit.min(prompt.len())];
        let (mut parent, mut matched, mut path) = (ROOT, 0, Vec::new());
        while matched < prompt.len() {
            let rest = &prompt[matched..];
            let best = g.children.get(&parent).and_then(|kids| {
                kids.iter()
                    .map(|id| (*id, common_prefix(&g.entries[id].tokens, rest)))
                    .max_by_key(|&(_, n)| n)
            });
            let Some((id, n)) = best.filter(|&(_, n)| n > 0) else {
                break;
            };
            path.push(id);
            matched += n;
            if n < BLOCK_TOKENS {
                break; // the match ends inside this block
            }
            parent = id;
        }
        // Deeper blocks get older ticks, so eviction takes the ends of chains first.
        g.tick += path.len() as u64;
        let base = g.tick;
        let blocks = path
            .iter()
            .enumerate()
            .map(|(depth, id)| {
                let e = g.entries.get_mut(id).expect("on the path");
                e.last_used = base - depth as u64;
                e.block.clone()
            })
            .collect();
        (blocks, matched)
    }

    /// Adds the blocks of `cache` holding `tokens` (its first `tokens.len()` positions) to the
    /// index: the full ones, and with `with_tail` the last, partial one too (a finished
    /// sequence). A block the index already holds with the same contents replaces the cache's
    /// own copy, so both share one.
    pub fn register(&self, cache: &mut KvCache, tokens: &[u32], with_tail: bool) {
        let n = tokens.len().min(cache.len());
        let count = if with_tail {
            n.div_ceil(BLOCK_TOKENS)
        } else {
            n / BLOCK_TOKENS
        };
        // Blocks of the cache to replace by the index's copy, once the lock is released (the
        // cache gives its own copy back to this pool).
        let mut swaps = Vec::new();
        let mut g = self.lock();
        // Deeper blocks get older ticks, so eviction takes the ends of chains first.
        g.tick += count as u64;
        let base = g.tick;
        let mut parent = ROOT;
        for i in 0..count {
            let chunk = &tokens[i * BLOCK_TOKENS..((i + 1) * BLOCK_TOKENS).min(n)];
            let last_used = base - i as u64;
            let kids = g.children.get(&parent).cloned().unwrap_or_default();
            let mut found = None;
            for id in kids {
                let e = &g.entries[&id];
                let covers = e.tokens.starts_with(chunk);
                let mine = Arc::ptr_eq(&e.block, &cache.blocks()[i]);
                let superseded = chunk.starts_with(&e.tokens) && Arc::strong_count(&e.block) == 1;
                if covers {
                    if !mine {
                        // Same positions computed twice (or ours are a prefix of a cached
                        // block): keep one copy, ours goes back.
                        swaps.push((i, e.block.clone()));
                    }
                    found = Some(id);
                    break;
                }
                if superseded && !covers {
                    // A cached shorter tail that ours extends: ours replaces it.
                    g.remove_subtree(id);
                }
            }
            let id = match found {
                Some(id) => id,
                None => {
                    let id = g.next_id;
                    g.next_id += 1;
                    g.entries.insert(
                        id,
                        Entry {
                            parent,
                            tokens: chunk.to_vec(),
                            block: cache.blocks()[i].clone(),
                            last_used,
                        },
                    );
                    g.children.entry(parent).or_default().push(id);
                    id
                }
            };
            if let Some(e) = g.entries.get_mut(&id) {
                e.last_used = e.last_used.max(last_used);
            }
            if chunk.len() < BLOCK_TOKENS {
                break;
            }
            parent = id;
        }
        drop(g);
        for (i, block) in swaps {
            cache.share_block(i, block);
        }
    }
}

impl Inner {
    /// Drops entry `id` and everything below it; blocks nobody else holds become free.
    fn remove_subtree(&mut self, id: u64) {
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            if let Some(kids) = self.children.remove(&id) {
                stack.extend(kids);
            }
            if let Some(e) = self.entries.remove(&id) {
                if let Some(sib) = self.children.get_mut(&e.parent) {
                    sib.retain(|&k| k != id);
                }
                if let Ok(b) = Arc::try_unwrap(e.block) {
                    self.free.push(b);
                }
            }
        }
    }

    /// Evicts the least recently used block held only by the index (with its subtree).
    fn evict_one(&mut self) -> bool {
        let victim = self
            .entries
            .iter()
            .filter(|(_, e)| Arc::strong_count(&e.block) == 1)
            .min_by_key(|(_, e)| e.last_used)
            .map(|(&id, _)| id);
        match victim {
            Some(id) => {
                self.remove_subtree(id);
                true
            }
            None => false,
        }
    }
}

impl BlockSource for BlockPool {
    /// A free block, a new one while under budget, else an evicted cached one. The scheduler
    /// admits sequences only while their worst case fits the budget, so the last resort — a
    /// block beyond the budget rather than a failure in the middle of a forward pass — is not
    /// reached by its sequences.
    fn take(&self) -> KvBlock {
        let mut g = self.lock();
        if let Some(b) = g.free.pop() {
            return b;
        }
        if g.allocated >= self.max_blocks && g.evict_one() {
            if let Some(b) = g.free.pop() {
                return b;
            }
        }
        g.allocated += 1;
        KvBlock::new(self.n_layers, self.row)
    }

    fn give_back(&self, block: KvBlock) {
        let mut g = self.lock();
        if g.allocated > self.max_blocks {
            // Over budget (see `take`): release the memory.
            g.allocated -= 1;
        } else {
            g.free.push(block);
        }
    }
}

pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYERS: usize = 2;
    const ROW: usize = 4;

    fn pool(blocks: usize) -> Arc<BlockPool> {
        BlockPool::new(LAYERS, ROW, blocks * KvBlock::bytes_for(LAYERS, ROW))
    }

    fn cache(p: &Arc<BlockPool>) -> KvCache {
        KvCache::new(LAYERS, ROW, 1024).with_source(p.clone())
    }

    /// Appends positions for `tokens` whose keys encode the token id.
    fn feed(c: &mut KvCache, tokens: &[u32]) {
        for layer in 0..LAYERS {
            let k: Vec<f32> = tokens.iter().flat_map(|&t| [t as f32; ROW]).collect();
            c.append(layer, &k, &k);
        }
        c.advance(tokens.len());
    }

    fn tokens(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + seed).collect()
    }

    #[test]
    fn blocks_are_counted_shared_and_freed() {
        let p = pool(8);
        let t = tokens(150, 1);
        let mut a = cache(&p);
        feed(&mut a, &t);
        assert_eq!(p.stats().used, 3);
        p.register(&mut a, &t, false);
        // A second sequence with the same first 130 tokens maps two full blocks + 2 positions.
        let (blocks, n) = p.lookup(&t[..130], 129);
        assert_eq!((blocks.len(), n), (2, 128));
        let mut b = cache(&p);
        b.map_prefix(blocks, n);
        assert_eq!(Arc::strong_count(&a.blocks()[0]), 3, "a, b and the index");
        feed(&mut b, &[9, 9]);
        assert_eq!(b.key_row(0, 127), &[t[127] as f32; ROW]);
        assert_eq!(p.stats().used, 4, "3 of a + b's own third block");
        drop(a);
        // a's two registered blocks stay (b uses them), its private tail is free.
        assert_eq!(p.stats().used, 3);
        drop(b);
        let s = p.stats();
        assert_eq!((s.used, s.cached), (0, 2));
    }

    #[test]
    fn finished_tails_are_reused_and_least_recent_blocks_evicted() {
        let p = pool(4);
        let t = tokens(100, 3);
        let mut a = cache(&p);
        feed(&mut a, &t);
        p.register(&mut a, &t, true);
        drop(a);
        assert_eq!(p.stats().cached, 2);
        // The tail (36 tokens) matches partially: 64 + 20 positions.
        let mut follow = t[..84].to_vec();
        follow.extend([1, 2, 3]);
        let (blocks, n) = p.lookup(&follow, follow.len() - 1);
        assert_eq!((blocks.len(), n), (2, 84));
        drop(blocks);
        // Other sequences fill the budget: the old chain is evicted, tail first.
        let other = tokens(200, 1000);
        let mut b = cache(&p);
        feed(&mut b, &other[..192]);
        assert_eq!(p.stats().used, 3);
        let (blocks, n) = p.lookup(&t, 99);
        assert_eq!(
            (blocks.len(), n),
            (1, 64),
            "the first block outlived its tail"
        );
        drop(blocks);
        feed(&mut b, &other[192..]);
        assert_eq!(p.stats().used, 4);
        assert_eq!(p.stats().cached, 0);
        assert_eq!(p.lookup(&t, 99).1, 0);
        drop(b);
        assert_eq!(p.stats().used, 0);
    }

    #[test]
    fn the_same_block_computed_twice_is_kept_once() {
        let p = pool(8);
        let t = tokens(64, 5);
        let (mut a, mut b) = (cache(&p), cache(&p));
        feed(&mut a, &t);
        feed(&mut b, &t);
        p.register(&mut a, &t, false);
        p.register(&mut b, &t, false);
        assert!(Arc::ptr_eq(&a.blocks()[0], &b.blocks()[0]));
        assert_eq!(p.stats().used, 1);
        drop((a, b));
        assert_eq!(
            p.stats(),
            BlockStats {
                total: 8,
                used: 0,
                cached: 1,
                ..p.stats()
            }
        );
    }
}
