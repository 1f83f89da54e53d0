//! A map of server-side objects by id (stored responses, conversations) kept in memory within
//! two bounds — how many and how many bytes — by dropping the least recently used first. Like
//! llama.cpp's slots, nothing survives a restart.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// What an entry weighs against the byte bound (its JSON's length, roughly).
pub trait Weighed {
    fn bytes(&self) -> usize;
}

struct Inner<V> {
    /// Each entry and its weight when it was put or last updated.
    map: HashMap<String, (Arc<V>, usize)>,
    /// Ids, least recently used first.
    order: VecDeque<String>,
    bytes: usize,
}

impl<V> Inner<V> {
    fn touch(&mut self, id: &str) {
        if let Some(i) = self.order.iter().position(|x| x == id) {
            let id = self.order.remove(i).expect("found above");
            self.order.push_back(id);
        }
    }

    fn remove(&mut self, id: &str) -> bool {
        let Some((_, bytes)) = self.map.remove(id) else {
            return false;
        };
        self.bytes -= bytes;
        self.order.retain(|x| x != id);
        true
    }

    /// Drops the least recently used entries other than `keep` until `extra` more bytes and
    /// one more entry (with `new`) fit.
    fn make_room(&mut self, keep: &str, extra: usize, new: bool, max_len: usize, max_bytes: usize) {
        let mut i = 0;
        while (new && self.map.len() >= max_len) || self.bytes + extra > max_bytes {
            let Some(id) = self.order.get(i).cloned() else {
                break;
            };
            if id == keep {
                i += 1;
                continue;
            }
            self.remove(&id);
        }
    }
}

/// Entries by id within `max_len` entries and `max_bytes` bytes.
pub struct BoundedMap<V> {
    inner: Mutex<Inner<V>>,
    max_len: usize,
    max_bytes: usize,
}

impl<V: Weighed + Clone> BoundedMap<V> {
    pub fn new(max_len: usize, max_bytes: usize) -> BoundedMap<V> {
        BoundedMap {
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
            }),
            max_len,
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<V>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `value` under `id` (replacing what was there), dropping the least recently used
    /// entries beyond the bounds; one larger than the byte bound alone is not kept.
    pub fn put(&self, id: String, value: V) {
        let bytes = value.bytes();
        if bytes > self.max_bytes {
            return;
        }
        let mut inner = self.lock();
        inner.remove(&id);
        inner.make_room(&id, bytes, true, self.max_len, self.max_bytes);
        inner.bytes += bytes;
        inner.order.push_back(id.clone());
        inner.map.insert(id, (Arc::new(value), bytes));
    }

    /// The entry `id` (marked as used).
    pub fn get(&self, id: &str) -> Option<Arc<V>> {
        let mut inner = self.lock();
        let v = inner.map.get(id).map(|e| e.0.clone())?;
        inner.touch(id);
        Some(v)
    }

    /// Changes the entry `id` in place under the lock (so two updates of one entry never lose
    /// each other's change) and marks it used; `None` when there is none. An update that makes
    /// it larger drops other entries for room; one that leaves it larger than the whole byte
    /// bound removes it, and `Err` says so.
    pub fn update<R>(&self, id: &str, f: impl FnOnce(&mut V) -> R) -> Option<Result<R, TooLarge>> {
        let mut inner = self.lock();
        let (r, new, old) = {
            let (value, old) = inner.map.get_mut(id)?;
            let value = Arc::make_mut(value);
            let r = f(value);
            (r, value.bytes(), *old)
        };
        if new > self.max_bytes {
            inner.remove(id);
            return Some(Err(TooLarge));
        }
        inner.map.get_mut(id).expect("present").1 = new;
        inner.bytes = inner.bytes - old + new;
        inner.touch(id);
        inner.make_room(id, 0, false, self.max_len, self.max_bytes);
        Some(Ok(r))
    }

    pub fn remove(&self, id: &str) -> bool {
        self.lock().remove(id)
    }

    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An update left an entry larger than the store's whole byte bound (it was removed).
#[derive(Debug, PartialEq)]
pub struct TooLarge;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    struct Blob(usize);
    impl Weighed for Blob {
        fn bytes(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn the_least_recently_used_go_first_within_both_bounds() {
        let m = BoundedMap::new(2, 100);
        m.put("a".into(), Blob(1));
        m.put("b".into(), Blob(1));
        assert!(m.get("a").is_some()); // a is now newer than b
        m.put("c".into(), Blob(1));
        assert!(m.get("b").is_none());
        assert!(m.get("a").is_some() && m.get("c").is_some());
        assert_eq!(m.len(), 2);

        let m = BoundedMap::new(100, 10);
        for id in ["p", "q", "r"] {
            m.put(id.into(), Blob(4));
        }
        assert_eq!(m.len(), 2);
        assert!(m.get("p").is_none());
        // An entry larger than the whole bound is not kept (and evicts nothing).
        m.put("big".into(), Blob(11));
        assert!(m.get("big").is_none());
        assert_eq!(m.len(), 2);
        // Replacing an entry counts its new weight only.
        m.put("q".into(), Blob(6));
        assert_eq!((m.len(), m.get("q").unwrap().0), (2, 6));
    }

    #[test]
    fn updates_change_in_place_make_room_and_drop_what_outgrows_the_bound() {
        let m = BoundedMap::new(10, 10);
        m.put("a".into(), Blob(3));
        m.put("b".into(), Blob(3));
        m.put("c".into(), Blob(3));
        assert_eq!(m.update("zz", |b| b.0 += 1), None);
        // b grows to 6: a (least recently used) goes for room; b is kept though it is older
        // than c.
        assert_eq!(m.update("b", |b| b.0 = 6), Some(Ok(())));
        assert!(m.get("a").is_none());
        assert_eq!(m.get("b").unwrap().0, 6);
        assert!(m.get("c").is_some());
        // Growing past the whole bound removes it.
        assert_eq!(m.update("c", |b| b.0 = 11), Some(Err(TooLarge)));
        assert!(m.get("c").is_none());
        assert_eq!(m.len(), 1);
        // The update's result comes back.
        assert_eq!(m.update("b", |b| b.0), Some(Ok(6)));
    }
}
