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
//! Hybrid models (Qwen3.5) also need the recurrent state of their linear-attention layers,
//! which exists only at the positions where somebody kept a copy. The pool stores such copies
//! next to the trie ([`save_state`](BlockPool::save_state)): a state after exactly the tokens
//! `t[..p]`, anchored on the trie entry that holds position `p − 1`. Its bytes count against
//! the same budget (in block units, rounded up) and it is evicted least recently used like a
//! block; evicting the blocks it stands on drops it too (a state without its keys/values is
//! useless). [`lookup_state`](BlockPool::lookup_state) finds the longest saved prefix of a
//! prompt and returns its blocks and state together.

use crate::model::kv_cache::{BlockSource, KvBlock, KvCache, KvShape, BLOCK_TOKENS};
use crate::model::recurrent::RecurrentState;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The trie's root (the parent of first blocks).
const ROOT: u64 = 0;

pub struct BlockPool {
    shape: KvShape,
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
    /// Saved recurrent states of hybrid sequences, by id (ids shared with `entries`).
    states: HashMap<u64, SavedState>,
    /// Budget units (blocks) the saved states take.
    state_units: usize,
}

/// A hybrid sequence's recurrent state after exactly `tokens`.
struct SavedState {
    tokens: Vec<u32>,
    /// The trie entry holding position `tokens.len() − 1`.
    anchor: u64,
    state: RecurrentState,
    units: usize,
    last_used: u64,
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
    /// Saved recurrent states of hybrid sequences (reusable, evictable) and the blocks of
    /// budget they take.
    pub states: usize,
    pub state_blocks: usize,
}

impl BlockPool {
    /// A pool of at most `budget_bytes` of blocks for caches of `shape` (at least one block).
    /// The budget counts bytes: blocks of an f16 cache take half those of an f32 one, so the
    /// same budget holds twice the positions.
    pub fn new(shape: KvShape, budget_bytes: usize) -> Arc<Self> {
        let max_blocks = budget_bytes / KvBlock::bytes_for(shape).max(1);
        Self::with_max_blocks(shape, max_blocks)
    }

    /// A pool of at most `max_blocks` blocks (at least one). For caches whose keys/values live
    /// on a device (`row` 0: the blocks only count positions), the budget is in positions.
    pub fn with_max_blocks(shape: KvShape, max_blocks: usize) -> Arc<Self> {
        let max_blocks = max_blocks.max(1);
        Arc::new(BlockPool {
            shape,
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
            block_bytes: KvBlock::bytes_for(self.shape),
            states: g.states.len(),
            state_blocks: g.state_units,
        }
    }

    /// The longest cached prefix of `prompt`, at most `limit` tokens: the blocks to map and how
    /// many positions of them match. Marks them used.
    pub fn lookup(&self, prompt: &[u32], limit: usize) -> (Vec<Arc<KvBlock>>, usize) {
        let mut g = self.lock();
        let (path, matched) = g.walk(&prompt[..limit.min(prompt.len())]);
        (g.touch(&path), matched)
    }

    /// For a hybrid model: the longest saved state whose tokens are a prefix of `prompt` of at
    /// most `limit` tokens, with the blocks holding those positions — `(blocks, len, state)`.
    /// Marks them used. `None` when there is none: a prompt that shares only part of a saved
    /// prefix cannot start from it (the recurrent state exists only at the saved position),
    /// so it is computed from the start.
    pub fn lookup_state(
        &self,
        prompt: &[u32],
        limit: usize,
    ) -> Option<(Vec<Arc<KvBlock>>, usize, RecurrentState)> {
        let mut g = self.lock();
        let limit = limit.min(prompt.len());
        let (id, len) = g
            .states
            .iter()
            .filter(|(_, s)| s.tokens.len() <= limit && prompt.starts_with(&s.tokens))
            .map(|(&id, s)| (id, s.tokens.len()))
            .max_by_key(|&(_, len)| len)?;
        let (path, matched) = g.walk(&prompt[..len]);
        if matched < len {
            // Cannot happen (evicting its blocks drops the state), but never map a short prefix.
            g.drop_state(id);
            return None;
        }
        let blocks = g.touch(&path);
        // As when saved: older than its deepest block.
        let last_used = g.tick - path.len() as u64;
        let saved = g.states.get_mut(&id).expect("found above");
        saved.last_used = last_used;
        Some((blocks, len, saved.state.clone()))
    }

    /// Keeps a copy of a hybrid sequence's recurrent `state` after exactly `tokens`, whose
    /// keys/values must already be in the index (`register`); otherwise, or when the budget
    /// has no room even after evicting what is cached, nothing is kept.
    pub fn save_state(&self, tokens: &[u32], state: &RecurrentState) {
        if tokens.is_empty() {
            return;
        }
        let block_bytes = KvBlock::bytes_for(self.shape).max(1);
        let units = state.bytes().div_ceil(block_bytes).max(1);
        let mut g = self.lock();
        let tick = g.tick;
        if let Some(s) = g.states.values_mut().find(|s| s.tokens == tokens) {
            s.last_used = tick;
            return;
        }
        let (path, matched) = g.walk(tokens);
        let Some(&anchor) = path.last().filter(|_| matched == tokens.len()) else {
            return;
        };
        // Blocks that sequences hold cannot make room: give up before evicting anything.
        let cached = g
            .entries
            .values()
            .filter(|e| Arc::strong_count(&e.block) == 1)
            .count();
        if g.allocated - g.free.len() - cached + units > self.max_blocks {
            return;
        }
        // Its own blocks become the most recent, so making room does not evict them first.
        g.touch(&path);
        while g.allocated + g.state_units + units > self.max_blocks {
            if g.free.pop().is_some() {
                g.allocated -= 1;
            } else if !g.evict_one() {
                return;
            }
        }
        if !g.entries.contains_key(&anchor) {
            return; // the budget is so small that making room evicted its own blocks
        }
        let id = g.next_id;
        g.next_id += 1;
        // Older than its deepest block: the state (the bigger part) goes first.
        let last_used = g.tick - path.len() as u64;
        g.state_units += units;
        g.states.insert(
            id,
            SavedState {
                tokens: tokens.to_vec(),
                anchor,
                state: state.clone(),
                units,
                last_used,
            },
        );
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
            let mut superseded_tails = Vec::new();
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
                    // A cached shorter tail that ours extends: ours replaces it (below).
                    superseded_tails.push(id);
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
            for old in superseded_tails {
                // Saved states standing on the old tail stand on ours (same positions).
                for st in g.states.values_mut().filter(|st| st.anchor == old) {
                    st.anchor = id;
                }
                g.remove_subtree(old);
            }
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
    /// The trie entries holding the longest cached prefix of `tokens`, and its length.
    fn walk(&self, tokens: &[u32]) -> (Vec<u64>, usize) {
        let (mut parent, mut matched, mut path) = (ROOT, 0, Vec::new());
        while matched < tokens.len() {
            let rest = &tokens[matched..];
            let best = self.children.get(&parent).and_then(|kids| {
                kids.iter()
                    .map(|id| (*id, common_prefix(&self.entries[id].tokens, rest)))
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
        (path, matched)
    }

    /// Marks the entries of `path` used and returns their blocks. Deeper blocks get older
    /// ticks, so eviction takes the ends of chains first.
    fn touch(&mut self, path: &[u64]) -> Vec<Arc<KvBlock>> {
        self.tick += path.len() as u64;
        let base = self.tick;
        path.iter()
            .enumerate()
            .map(|(depth, id)| {
                let e = self.entries.get_mut(id).expect("on the path");
                e.last_used = base - depth as u64;
                e.block.clone()
            })
            .collect()
    }

    fn drop_state(&mut self, id: u64) {
        if let Some(s) = self.states.remove(&id) {
            self.state_units -= s.units;
        }
    }

    /// Drops entry `id` and everything below it (and the states standing on them); blocks
    /// nobody else holds become free.
    fn remove_subtree(&mut self, id: u64) {
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            if let Some(kids) = self.children.remove(&id) {
                stack.extend(kids);
            }
            let orphans: Vec<u64> = self
                .states
                .iter()
                .filter(|(_, s)| s.anchor == id)
                .map(|(&sid, _)| sid)
                .collect();
            for sid in orphans {
                self.drop_state(sid);
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

    /// Evicts the least recently used of: a block held only by the index (with its subtree),
    /// a saved recurrent state.
    fn evict_one(&mut self) -> bool {
        let block = self
            .entries
            .iter()
            .filter(|(_, e)| Arc::strong_count(&e.block) == 1)
            .min_by_key(|(_, e)| e.last_used)
            .map(|(&id, e)| (e.last_used, id));
        let state = self
            .states
            .iter()
            .min_by_key(|(_, s)| s.last_used)
            .map(|(&id, s)| (s.last_used, id));
        match (block, state) {
            (Some((b, _)), Some((s, id))) if s <= b => self.drop_state(id),
            (None, Some((_, id))) => self.drop_state(id),
            (Some((_, id)), _) => self.remove_subtree(id),
            (None, None) => return false,
        }
        true
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
        while g.allocated + g.state_units >= self.max_blocks && g.evict_one() {
            if let Some(b) = g.free.pop() {
                return b;
            }
        }
        g.allocated += 1;
        KvBlock::new(self.shape)
    }

    fn give_back(&self, block: KvBlock) {
        let mut g = self.lock();
        if g.allocated + g.state_units > self.max_blocks {
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

    use crate::model::kv_cache::{KvType, KvTypes};

    const LAYERS: usize = 2;
    const ROW: usize = 4;
    const SHAPE: KvShape = KvShape {
        n_layers: LAYERS,
        row: ROW,
        types: KvTypes::F32,
    };

    fn pool(blocks: usize) -> Arc<BlockPool> {
        BlockPool::new(SHAPE, blocks * KvBlock::bytes_for(SHAPE))
    }

    /// The budget counts bytes: f16 blocks are half the size, so the same budget holds twice
    /// as many (and mixed K/V types three quarters), and `/metrics` reports their real size.
    #[test]
    fn the_budget_counts_bytes_of_the_stored_types() {
        let budget = 8 * KvBlock::bytes_for(SHAPE);
        for (k, v, blocks) in [
            (KvType::F32, KvType::F32, 8),
            (KvType::F16, KvType::F16, 16),
            (KvType::F32, KvType::F16, 10),
        ] {
            let shape = KvShape {
                types: KvTypes { k, v },
                ..SHAPE
            };
            let p = BlockPool::new(shape, budget);
            let s = p.stats();
            assert_eq!(
                (s.total, s.block_bytes),
                (blocks, KvBlock::bytes_for(shape))
            );
            assert!(s.total * s.block_bytes <= budget);
            // A cache of these types fills it block by block.
            let mut c = KvCache::new(LAYERS, ROW, 4096)
                .with_types(shape.types)
                .with_source(p.clone());
            feed(&mut c, &tokens(blocks * BLOCK_TOKENS, 1));
            assert_eq!(p.stats().used, blocks);
            assert_eq!(c.key_row(1, 70), vec![tokens(71, 1)[70] as f32; ROW]);
            drop(c);
            assert_eq!(p.stats().used, 0);
        }
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
    fn saved_states_need_their_blocks_match_exactly_and_are_evicted_first() {
        let p = pool(4);
        let t = tokens(100, 3);
        let mut a = cache(&p);
        feed(&mut a, &t);
        let mut state = RecurrentState::new(2, 3, 250);
        state.layers[1].ssm.fill(0.5);
        // One budget unit (2,024 bytes ≤ one 4,096-byte block).
        p.save_state(&t[..90], &state);
        assert_eq!(p.stats().states, 0, "its blocks are not in the index yet");
        p.register(&mut a, &t, true);
        p.save_state(&t[..90], &state);
        assert_eq!((p.stats().states, p.stats().state_blocks), (1, 1));
        drop(a);
        let mut follow = t[..90].to_vec();
        follow.extend([1, 2]);
        let (blocks, n, found) = p.lookup_state(&follow, follow.len() - 1).unwrap();
        assert_eq!((blocks.len(), n), (2, 90));
        assert_eq!(found, state);
        assert!(Arc::ptr_eq(&blocks[1], &p.lookup(&t, 99).0[1]));
        drop(blocks);
        // No state at a position that only part of the prompt shares, nor beyond the limit.
        assert!(p.lookup_state(&t[..89], 88).is_none());
        assert!(p.lookup_state(&follow, 89).is_none());
        // 2 cached blocks + the state fill 3 of 4 units: a sequence taking 3 blocks evicts the
        // state first (older than its blocks), then the tail block.
        let mut b = cache(&p);
        feed(&mut b, &tokens(130, 1000));
        let s = p.stats();
        assert_eq!((s.states, s.state_blocks, s.cached, s.used), (0, 0, 1, 3));
        assert!(p.lookup_state(&follow, 91).is_none());
        drop(b);
        // A state bigger than the whole budget is never kept.
        let mut c = cache(&p);
        feed(&mut c, &t);
        p.register(&mut c, &t, true);
        p.save_state(&t, &RecurrentState::new(2, 3, 4 * 1024));
        assert_eq!(p.stats().states, 0);
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
