//! Key/value cache of the attention layers.
//!
//! Stored per layer as contiguous `[position][kv_head · head_dim]` f32 rows that grow as
//! tokens arrive, so a truncate (prefix reuse between chat turns) is just a length change.
//! The type hides its layout behind `keys`/`values` so it can later become paged or f16.
//!
//! Hybrid models (Qwen3.5) also carry the recurrent state of their linear-attention layers
//! here. That state cannot be truncated, so the cache keeps one snapshot (`checkpoint`);
//! `truncate(n)` to a point before the end rolls back to the snapshot when it lies at or
//! before `n`, else to the empty state, and the caller re-evaluates from `len()`.

use super::recurrent::RecurrentState;

pub struct KvCache {
    n_layers: usize,
    row: usize,
    capacity: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    recurrent: Option<RecurrentState>,
    /// Position and recurrent state of the last `checkpoint`.
    snapshot: Option<(usize, RecurrentState)>,
}

impl KvCache {
    /// `row` = kv_heads · head_dim; `capacity` = the context size in tokens.
    pub fn new(n_layers: usize, row: usize, capacity: usize) -> Self {
        KvCache {
            n_layers,
            row,
            capacity,
            len: 0,
            k: vec![Vec::new(); n_layers],
            v: vec![Vec::new(); n_layers],
            recurrent: None,
            snapshot: None,
        }
    }

    /// Adds the recurrent state of a hybrid model's linear layers (zero at position 0).
    pub fn with_recurrent(mut self, state: RecurrentState) -> Self {
        self.recurrent = Some(state);
        self
    }

    pub fn recurrent_mut(&mut self) -> Option<&mut RecurrentState> {
        self.recurrent.as_mut()
    }

    /// Whether `truncate` may keep fewer positions than asked (a recurrent state is present).
    pub fn has_recurrent(&self) -> bool {
        self.recurrent.is_some()
    }

    /// Remembers the recurrent state at the current position, so that a later `truncate` to
    /// this position or beyond resumes here instead of from the start. No-op without one.
    pub fn checkpoint(&mut self) {
        if let Some(r) = &self.recurrent {
            self.snapshot = Some((self.len, r.clone()));
        }
    }

    /// Tokens currently held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forget everything from position `n` on.
    /// Also drops rows appended for positions that were never `advance`d (a failed forward).
    /// With a recurrent state, cutting before the end keeps fewer positions (the snapshot's,
    /// or none): check `len()` afterwards.
    pub fn truncate(&mut self, n: usize) {
        if n < self.len {
            if let Some(r) = &mut self.recurrent {
                match &self.snapshot {
                    Some((pos, saved)) if *pos <= n => {
                        r.clone_from(saved);
                        self.len = *pos;
                    }
                    _ => {
                        r.reset();
                        self.snapshot = None;
                        self.len = 0;
                    }
                }
            }
        }
        self.len = self.len.min(n);
        for l in 0..self.n_layers {
            self.k[l].truncate(self.len * self.row);
            self.v[l].truncate(self.len * self.row);
        }
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Appends `n` rows of keys and values for `layer`; the caller appends every layer for
    /// the same positions, then calls `advance(n)`.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        debug_assert_eq!(k.len(), v.len());
        debug_assert_eq!(k.len() % self.row, 0);
        self.k[layer].extend_from_slice(k);
        self.v[layer].extend_from_slice(v);
    }

    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Keys of `layer` for positions `0..n` (n may include rows appended but not yet advanced).
    pub fn keys(&self, layer: usize, n: usize) -> &[f32] {
        &self.k[layer][..n * self.row]
    }

    pub fn values(&self, layer: usize, n: usize) -> &[f32] {
        &self.v[layer][..n * self.row]
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        let kv: usize = self
            .k
            .iter()
            .chain(self.v.iter())
            .map(|x| x.len() * 4)
            .sum();
        kv + self.recurrent.as_ref().map_or(0, |r| r.bytes())
    }

    /// Bytes a full cache of `tokens` positions needs (for `trit info`).
    pub fn bytes_for(n_layers: usize, row: usize, tokens: usize) -> usize {
        2 * n_layers * row * tokens * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_truncate_and_reuse() {
        let mut c = KvCache::new(2, 4, 16);
        for layer in 0..2 {
            c.append(layer, &[1.0; 8], &[2.0; 8]);
        }
        c.advance(2);
        assert_eq!(c.len(), 2);
        assert_eq!(c.keys(1, 2).len(), 8);
        c.truncate(1);
        assert_eq!(c.len(), 1);
        assert_eq!(c.values(0, 1), &[2.0; 4]);
        for layer in 0..2 {
            c.append(layer, &[3.0; 4], &[4.0; 4]);
        }
        c.advance(1);
        assert_eq!(&c.keys(0, 2)[4..], &[3.0; 4]);
        assert_eq!(c.bytes(), 2 * 2 * 8 * 4);
    }

    #[test]
    fn recurrent_state_rolls_back_to_its_snapshot() {
        let mut c = KvCache::new(1, 2, 16).with_recurrent(RecurrentState::new(1, 3, 4));
        let fill = |c: &mut KvCache, n: usize, v: f32| {
            c.append(0, &vec![v; 2 * n], &vec![v; 2 * n]);
            c.recurrent_mut().unwrap().layers[0].ssm.fill(v);
            c.advance(n);
        };
        fill(&mut c, 3, 1.0);
        c.checkpoint();
        fill(&mut c, 4, 2.0);
        // Cutting inside the part after the snapshot resumes at the snapshot.
        c.truncate(5);
        assert_eq!(c.len(), 3);
        assert_eq!(c.recurrent_mut().unwrap().layers[0].ssm, vec![1.0; 4]);
        assert_eq!(c.keys(0, 3), &[1.0; 6]);
        // Cutting at the end keeps everything; cutting before the snapshot starts over.
        c.truncate(3);
        assert_eq!(c.len(), 3);
        c.truncate(2);
        assert_eq!(c.len(), 0);
        assert_eq!(c.recurrent_mut().unwrap().layers[0].ssm, vec![0.0; 4]);
    }
}
