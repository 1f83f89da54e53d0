//! Prefix reuse for a device backend (the GPU): its keys/values live in per-sequence device
//! slots, which host blocks cannot fill, so the block pool's prefix index does not apply.
//! Instead a finished sequence's cache is *parked* with its slot and its tokens; a new prompt
//! that starts with enough of those tokens takes the cache over — the slot already holds the
//! keys/values of the common prefix, positions past it are simply overwritten — and computes
//! only the rest. This is what a multi-turn chat re-sent as full history needs. Sequences that
//! run at the same time share through a slot-to-slot copy where the backend makes one
//! (`Worker::copy_running_prefix` in scheduler.rs).
//!
//! Parked caches hold slots that new sequences may need: the oldest is dropped (its slot
//! returns to the backend's pool) whenever a sequence must start without one.
//!
//! A hybrid's recurrent state exists only at its sequence's end, so its parked slot is taken
//! over only by a prompt that starts with all of the slot's tokens (a chat follow-up whose
//! history re-renders as the model saw it), never cut back to a shorter common prefix.

use super::block_pool::common_prefix;
use crate::model::KvCache;

/// Shortest prefix worth taking a parked slot for: shorter prompts cost little to compute,
/// and adopting a slot for a few common tokens (a shared "The") would spend a parked history
/// that a later follow-up could have used.
pub(crate) const MIN_REUSE: usize = 16;

struct Parked {
    cache: KvCache,
    /// The tokens whose keys/values the cache holds.
    tokens: Vec<u32>,
}

/// Finished sequences' device caches, oldest first.
pub(crate) struct ParkedSlots {
    entries: Vec<Parked>,
    /// Device slots in all (running sequences + parked caches never exceed it).
    slots: usize,
    /// Most caches kept.
    keep: usize,
    /// Caches continue only from their end (a hybrid's): adopted whole or not at all.
    whole: bool,
}

impl ParkedSlots {
    pub(crate) fn new(slots: usize, keep: usize, whole: bool) -> ParkedSlots {
        ParkedSlots {
            entries: Vec::new(),
            slots,
            keep: keep.min(slots),
            whole,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// Keeps a finished sequence's cache (with its device slot) for a later prompt; any other
    /// cache (no slot, too short, nothing kept) is dropped, its slot going back to the pool.
    pub(crate) fn park(&mut self, cache: KvCache, tokens: Vec<u32>) {
        if self.keep == 0 || cache.device_slot().is_none() || tokens.len() < MIN_REUSE {
            return;
        }
        debug_assert_eq!(cache.len(), tokens.len());
        self.entries.push(Parked { cache, tokens });
        if self.entries.len() > self.keep {
            self.entries.remove(0);
        }
    }

    /// The parked cache sharing the longest prefix with `prompt`, cut to that prefix (at most
    /// `limit` tokens), and its length — if at least [`MIN_REUSE`] tokens. With `whole` caches
    /// only one whose every token starts `prompt` (within `limit`), uncut.
    pub(crate) fn adopt(&mut self, prompt: &[u32], limit: usize) -> Option<(KvCache, usize)> {
        let shared = |p: &Parked| {
            let n = common_prefix(&p.tokens, prompt).min(limit);
            match self.whole && n < p.tokens.len() {
                true => 0,
                false => n,
            }
        };
        let (i, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, p)| (i, shared(p)))
            .max_by_key(|&(i, n)| (n, i))?;
        if n < MIN_REUSE {
            return None;
        }
        let mut cache = self.entries.remove(i).cache;
        cache.truncate(n);
        Some((cache, n))
    }

    /// Drops the oldest parked caches until a sequence starting now, next to `running`
    /// sequences that own slots, finds a free one.
    pub(crate) fn make_room(&mut self, running: usize) {
        while !self.entries.is_empty() && running + self.entries.len() + 1 > self.slots {
            self.entries.remove(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device_slot::SlotPool;

    fn parked_cache(pool: &SlotPool, tokens: &[u32]) -> KvCache {
        let mut cache = KvCache::new(2, 0, 256);
        cache.set_device_slot(pool.take().expect("a free slot"));
        cache.advance(tokens.len());
        cache
    }

    #[test]
    fn the_longest_shared_prefix_is_adopted_and_cut_to_it() {
        let pool = SlotPool::new(3);
        let mut parked = ParkedSlots::new(3, 3, false);
        let a: Vec<u32> = (0..40).collect();
        let mut b: Vec<u32> = (0..30).collect();
        b.extend(100..110);
        parked.park(parked_cache(&pool, &a), a.clone());
        parked.park(parked_cache(&pool, &b), b.clone());
        assert_eq!((parked.len(), pool.free_count()), (2, 1));
        // Shares 35 tokens with `a`, 30 with `b`; at most `limit` are taken.
        let mut prompt: Vec<u32> = (0..35).collect();
        prompt.extend(200..220);
        let (cache, n) = parked
            .adopt(&prompt, prompt.len() - 1)
            .expect("a is adopted");
        assert_eq!((n, cache.len()), (35, 35));
        assert_eq!(parked.len(), 1);
        let (held, n) = parked.adopt(&prompt, 20).expect("b, cut to the limit");
        assert_eq!((n, held.len()), (20, 20));
        assert_eq!(pool.free_count(), 1, "adopted caches keep their slots");
        drop(cache);
        assert_eq!(pool.free_count(), 2);
    }

    #[test]
    fn short_prefixes_unslotted_caches_and_unkept_models_are_not_reused() {
        let pool = SlotPool::new(2);
        // Keeping none: the slot comes back.
        let mut none = ParkedSlots::new(2, 0, false);
        let a: Vec<u32> = (0..40).collect();
        none.park(parked_cache(&pool, &a), a.clone());
        assert_eq!((none.len(), pool.free_count()), (0, 2));
        let mut parked = ParkedSlots::new(2, 2, false);
        parked.park(parked_cache(&pool, &a), a.clone());
        let mut prompt: Vec<u32> = (0..MIN_REUSE as u32 - 1).collect();
        prompt.push(999);
        assert!(
            parked.adopt(&prompt, 100).is_none(),
            "one token short of the minimum"
        );
        assert_eq!(parked.len(), 1);
        // No slot: nothing to reuse on the device.
        let mut host = KvCache::new(2, 0, 256);
        host.advance(a.len());
        parked.park(host, a.clone());
        // Too short to be worth a slot.
        let short: Vec<u32> = (0..5).collect();
        parked.park(parked_cache(&pool, &short), short);
        assert_eq!(parked.len(), 1);
        assert_eq!(pool.free_count(), 1, "the short one's slot came back");
    }

    #[test]
    fn a_hybrids_cache_is_adopted_whole_or_not_at_all() {
        let pool = SlotPool::new(2);
        let mut parked = ParkedSlots::new(2, 2, true);
        let a: Vec<u32> = (0..40).collect();
        parked.park(parked_cache(&pool, &a), a.clone());
        // 30 tokens in common: a dense cache would be cut to them, a hybrid's cannot.
        let mut partial: Vec<u32> = (0..30).collect();
        partial.extend(500..520);
        assert!(parked.adopt(&partial, partial.len() - 1).is_none());
        // The whole history, then more: taken over, uncut. But not when the limit (the last
        // prompt token is always computed) falls inside it.
        let mut follow: Vec<u32> = a.clone();
        follow.extend(600..610);
        assert!(parked.adopt(&follow, 39).is_none());
        let (cache, n) = parked.adopt(&follow, follow.len() - 1).expect("whole");
        assert_eq!((n, cache.len()), (40, 40));
    }

    #[test]
    fn room_is_made_oldest_first_and_slots_come_back() {
        let pool = SlotPool::new(3);
        let mut parked = ParkedSlots::new(3, 3, false);
        for k in 0..3u32 {
            let t: Vec<u32> = (0..20).map(|i| i + 100 * k).collect();
            parked.park(parked_cache(&pool, &t), t);
        }
        assert_eq!(pool.free_count(), 0);
        // One running sequence and one starting: two parked caches must go, oldest first.
        parked.make_room(1);
        assert_eq!((parked.len(), pool.free_count()), (1, 2));
        let newest: Vec<u32> = (200..220).collect();
        assert!(parked.adopt(&newest, 19).is_some(), "the newest stayed");
        parked.make_room(0);
        assert_eq!(parked.len(), 0);
    }
}
