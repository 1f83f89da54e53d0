//! Key/value slots of a device backend (the GPU model's batched path). The keys and values of
//! a sequence that runs on the GPU live in GPU memory, in one of a fixed number of slots; the
//! sequence's `KvCache` holds positions only, plus the [`DeviceSlot`] it owns. Dropping the
//! handle (with the cache, e.g. when the scheduler retires a sequence) returns the slot to its
//! [`SlotPool`], so a slot can never leak or be owned twice.

use std::sync::{Arc, Mutex};

/// The free slots of one backend; slots are numbered `0..capacity`.
pub struct SlotPool {
    capacity: usize,
    /// Free slot numbers, lowest last (taken first, so a backend that allocates slot memory
    /// lazily touches as few slots as the concurrency needs).
    free: Arc<Mutex<Vec<usize>>>,
}

impl SlotPool {
    pub fn new(capacity: usize) -> SlotPool {
        SlotPool {
            capacity,
            free: Arc::new(Mutex::new((0..capacity).rev().collect())),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A free slot, or `None` when all are owned.
    pub fn take(&self) -> Option<DeviceSlot> {
        let index = lock(&self.free).pop()?;
        Some(DeviceSlot {
            index,
            free: self.free.clone(),
        })
    }

    /// Slots not owned by any cache.
    pub fn free_count(&self) -> usize {
        lock(&self.free).len()
    }

    /// Whether `slot` was handed out by this pool (not by another backend's).
    pub fn owns(&self, slot: &DeviceSlot) -> bool {
        Arc::ptr_eq(&self.free, &slot.free)
    }
}

/// Ownership of one slot; returns it to the pool when dropped.
pub struct DeviceSlot {
    index: usize,
    free: Arc<Mutex<Vec<usize>>>,
}

impl DeviceSlot {
    pub fn index(&self) -> usize {
        self.index
    }
}

impl std::fmt::Debug for DeviceSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceSlot({})", self.index)
    }
}

impl Drop for DeviceSlot {
    fn drop(&mut self) {
        let mut free = lock(&self.free);
        // Keep the lowest numbers at the end (taken first).
        let at = free.partition_point(|&i| i > self.index);
        free.insert(at, self.index);
    }
}

/// A panic while holding the lock leaves a consistent list (every update is one step).
fn lock(m: &Mutex<Vec<usize>>) -> std::sync::MutexGuard<'_, Vec<usize>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::KvCache;

    #[test]
    fn slots_come_back_when_their_cache_is_dropped() {
        let pool = SlotPool::new(3);
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        assert_eq!((a.index(), b.index()), (0, 1));
        assert_eq!(pool.free_count(), 1);
        let mut cache = KvCache::new(2, 0, 16);
        cache.set_device_slot(b);
        assert_eq!(cache.device_slot().map(|s| s.index()), Some(1));
        // Clearing keeps the slot (the cache may be reused); dropping returns it.
        cache.clear();
        assert_eq!(pool.free_count(), 1);
        drop(cache);
        assert_eq!(pool.free_count(), 2);
        let c = pool.take().unwrap();
        let d = pool.take().unwrap();
        assert_eq!((c.index(), d.index()), (1, 2), "lowest free slot first");
        assert!(pool.take().is_none(), "all three owned");
        drop(a);
        assert_eq!(pool.take().map(|s| s.index()), Some(0));
        assert!(pool.owns(&c));
        assert!(!SlotPool::new(3).owns(&c));
    }
}
