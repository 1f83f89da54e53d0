//! Key/value cache of the attention layers.
//!
//! Stored per layer as contiguous `[position][kv_head · head_dim]` f32 rows that grow as
//! tokens arrive, so a truncate (prefix reuse between chat turns) is just a length change.
//! The type hides its layout behind `keys`/`values` so it can later become paged or f16.

pub struct KvCache {
    n_layers: usize,
    row: usize,
    capacity: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
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
    pub fn truncate(&mut self, n: usize) {
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
        self.k
            .iter()
            .chain(self.v.iter())
            .map(|x| x.len() * 4)
            .sum()
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
}
