//! Key/value cache of the attention layers, paged: positions live in fixed-size blocks of
//! [`BLOCK_TOKENS`] positions and a cache is a table of blocks, so sequences that share a
//! prefix can share its blocks (the serving scheduler's prefix cache) and memory is handed out
//! and taken back a block at a time from a budgeted pool.
//!
//! Why 64 positions per block: the attention kernel streams keys in blocks of
//! `kernels::attn::KEY_BLOCK` = 64 with an online softmax, so one cache block is exactly one
//! kernel key block and paging costs one slice lookup per 64 keys, nothing in the inner loops.
//! Smaller blocks would share prefixes at a finer grain but would split the kernel's key blocks;
//! larger ones waste more of the last block of every sequence (at most 63 positions here).
//!
//! A block holds every layer (keys `[layer][kv_head][position][head_dim]`, values alike, each in
//! its stored type: f16 by default, f32 on request — see `kernels::kv_type` for why), so one
//! table serves all layers. Head-major inside a page: the attention kernel walks one KV head's
//! keys position after position, and these are then one contiguous run (64 × head_dim floats)
//! instead of head_dim-wide pieces one whole row apart — 512-byte reads 4 KiB apart on the 1.7B
//! shape, each in its own page, where the hardware prefetchers stop. Blocks are `Arc`s: a block in more than one table (or kept by the
//! pool's prefix index) is read-only, and a cache that must write into one (appending after a
//! prefix that ends inside it) first copies it (copy-on-write). Blocks come from and go back to
//! a [`BlockSource`] when there is one (the scheduler's pool); a standalone cache (`trit run`,
//! `trit chat`, perplexity) allocates its own as it grows.
//!
//! Hybrid models (Qwen3.5) also carry the recurrent state of their linear-attention layers
//! here. That state cannot be truncated, so the cache keeps one snapshot (`checkpoint`);
//! `truncate(n)` to a point before the end rolls back to the snapshot when it lies at or
//! before `n`, else to the empty state, and the caller re-evaluates from `len()`. The serving
//! scheduler instead keeps copies of the state in its block pool and starts a new cache from one
//! (`resume`).

use super::device_slot::DeviceSlot;
use super::recurrent::RecurrentState;
use crate::kernels::attn::KEY_BLOCK;
use crate::kernels::kv_type::{KvPage, KvStore};
pub use crate::kernels::kv_type::{KvPageList, KvType, KvTypes};
use std::sync::Arc;

/// Positions per block (one attention-kernel key block).
pub const BLOCK_TOKENS: usize = KEY_BLOCK;

/// What every block of a cache holds: `n_layers` layers of `row` (kv_heads · head_dim) keys and
/// values per position, stored as `types`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub n_layers: usize,
    pub row: usize,
    pub types: KvTypes,
}

impl KvShape {
    /// Bytes of keys and values of `tokens` positions.
    pub fn bytes_for(&self, tokens: usize) -> usize {
        self.types.bytes_for(self.n_layers * self.row * tokens)
    }
}

/// Keys and values of `BLOCK_TOKENS` positions for every layer.
#[derive(Clone)]
pub struct KvBlock {
    keys: KvStore,
    values: KvStore,
}

impl KvBlock {
    /// A zeroed block of `shape`.
    pub fn new(shape: KvShape) -> Self {
        let len = shape.n_layers * BLOCK_TOKENS * shape.row;
        KvBlock {
            keys: KvStore::zeroed(shape.types.k, len),
            values: KvStore::zeroed(shape.types.v, len),
        }
    }

    /// Bytes of one block (what a `--kv-cache-mib` budget counts).
    pub fn bytes_for(shape: KvShape) -> usize {
        shape.bytes_for(BLOCK_TOKENS)
    }

    /// The types this block stores.
    pub fn types(&self) -> KvTypes {
        KvTypes {
            k: self.keys.kind(),
            v: self.values.kind(),
        }
    }

    /// [`store`](Self::store), writable (a saved session is read back into it).
    pub fn store_mut(&mut self, values: bool) -> &mut KvStore {
        if values {
            &mut self.values
        } else {
            &mut self.keys
        }
    }

    /// Stored keys (`values` false) or values, every layer.
    pub fn store(&self, values: bool) -> &KvStore {
        if values {
            &self.values
        } else {
            &self.keys
        }
    }

    fn page(&self, layer: usize, values: bool, row: usize) -> KvPage<'_> {
        let page = BLOCK_TOKENS * row;
        self.store(values).page(layer * page, page)
    }
}

/// Where a cache gets its blocks and returns the ones it no longer references (the scheduler's
/// budgeted pool). `take` always returns a block of the right shape.
pub trait BlockSource: Send + Sync {
    fn take(&self) -> KvBlock;
    fn give_back(&self, block: KvBlock);
}

pub struct KvCache {
    n_layers: usize,
    row: usize,
    types: KvTypes,
    /// KV heads per row (`row / heads` floats each); 1 for caches without head structure.
    heads: usize,
    capacity: usize,
    len: usize,
    blocks: Vec<Arc<KvBlock>>,
    source: Option<Arc<dyn BlockSource>>,
    recurrent: Option<RecurrentState>,
    /// Position and recurrent state of the last `checkpoint`.
    snapshot: Option<(usize, RecurrentState)>,
    /// The device slot holding this sequence's keys/values when they live on a GPU (the cache
    /// then holds positions only); returned to its pool when the cache is dropped.
    device_slot: Option<DeviceSlot>,
}

impl KvCache {
    /// `row` = kv_heads · head_dim; `capacity` = the context size in tokens. Stores f32 until
    /// [`with_types`](Self::with_types) says otherwise (models hand out f16 caches by default:
    /// `Model::new_cache`).
    pub fn new(n_layers: usize, row: usize, capacity: usize) -> Self {
        KvCache {
            n_layers,
            row,
            types: KvTypes::F32,
            heads: 1,
            capacity,
            len: 0,
            blocks: Vec::new(),
            source: None,
            recurrent: None,
            snapshot: None,
            device_slot: None,
        }
    }

    /// Stores keys and values as `types` (before anything is appended). Each KV head's row
    /// must be a whole number of the types' blocks (`q8_0`: 32 values; `Model::set_kv_types`
    /// refuses models that do not fit).
    pub fn with_types(mut self, types: KvTypes) -> Self {
        assert!(self.blocks.is_empty(), "KV types change on a cache in use");
        assert!(
            (self.row / self.heads).is_multiple_of(types.granule()),
            "{types:?} in heads of {} values",
            self.row / self.heads
        );
        self.types = types;
        self
    }

    /// Layers, row width and stored types: what each of this cache's blocks holds.
    pub fn shape(&self) -> KvShape {
        KvShape {
            n_layers: self.n_layers,
            row: self.row,
            types: self.types,
        }
    }

    pub fn types(&self) -> KvTypes {
        self.types
    }

    /// Lays each page out head after head (`heads` must divide `row`): see the module doc.
    pub fn with_heads(mut self, heads: usize) -> Self {
        assert!(
            heads > 0 && self.row.is_multiple_of(heads),
            "{heads} heads in rows of {}",
            self.row
        );
        self.heads = heads;
        self
    }

    /// Where KV head `head` sits in every page of [`pages`](Self::pages): key `j` of a page at
    /// `j · stride + offset`, `row / heads` floats. Returns `(stride, offset)`.
    pub fn head_layout(&self, head: usize) -> (usize, usize) {
        let hd = self.row / self.heads;
        (hd, head * BLOCK_TOKENS * hd)
    }

    /// Hands this cache the device slot its keys/values live in (a device backend's batched
    /// path does this on first use). A slot it held before goes back to its pool.
    pub fn set_device_slot(&mut self, slot: DeviceSlot) {
        self.device_slot = Some(slot);
    }

    /// The device slot holding this cache's keys/values, if they live on a device.
    pub fn device_slot(&self) -> Option<&DeviceSlot> {
        self.device_slot.as_ref()
    }

    /// Takes blocks from (and returns them to) `source` instead of allocating them.
    pub fn with_source(mut self, source: Arc<dyn BlockSource>) -> Self {
        self.source = Some(source);
        self
    }

    /// Adds the recurrent state of a hybrid model's linear layers (zero at position 0).
    pub fn with_recurrent(mut self, state: RecurrentState) -> Self {
        self.recurrent = Some(state);
        self
    }

    pub fn recurrent_mut(&mut self) -> Option<&mut RecurrentState> {
        self.recurrent.as_mut()
    }

    /// The recurrent state at `len()` (hybrid models), e.g. to keep a copy for prefix reuse.
    pub fn recurrent(&self) -> Option<&RecurrentState> {
        self.recurrent.as_ref()
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

    /// Floats per position and layer (kv_heads · head_dim).
    pub fn row(&self) -> usize {
        self.row
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The block table (the blocks holding positions `0..len`, and possibly one more
    /// allocated ahead).
    pub fn blocks(&self) -> &[Arc<KvBlock>] {
        &self.blocks
    }

    /// Starts an empty cache on `blocks` shared with others (a cached prefix), holding their
    /// first `len` positions. The blocks stay read-only: writing after `len` copies the block
    /// it falls into first.
    pub fn map_prefix(&mut self, blocks: Vec<Arc<KvBlock>>, len: usize) {
        debug_assert!(self.len == 0 && len <= blocks.len() * BLOCK_TOKENS);
        debug_assert!(self.recurrent.is_none(), "a recurrent state is not shared");
        self.release_from(0);
        self.blocks = blocks;
        self.len = len;
    }

    /// Starts an empty hybrid cache at position `len`: attention keys/values from `blocks` (shared,
    /// as in [`map_prefix`](Self::map_prefix)) and a copy of `state`, the recurrent state after
    /// the same `len` tokens. The caller guarantees that both belong to the same token prefix.
    pub fn resume(&mut self, blocks: Vec<Arc<KvBlock>>, len: usize, state: &RecurrentState) {
        debug_assert!(self.len == 0 && len <= blocks.len() * BLOCK_TOKENS);
        let r = self
            .recurrent
            .as_mut()
            .expect("resume is for caches with a recurrent state");
        r.clone_from(state);
        self.snapshot = None;
        self.release_from(0);
        self.blocks = blocks;
        self.len = len;
    }

    /// KV heads per row (the page layout; see [`with_heads`](Self::with_heads)).
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// The position and recurrent state of the last [`checkpoint`](Self::checkpoint), if any.
    pub fn snapshot(&self) -> Option<(usize, &RecurrentState)> {
        self.snapshot.as_ref().map(|(p, s)| (*p, s))
    }

    /// Replaces this cache's contents by a saved session's: `blocks` (this cache's shape, owned
    /// by it alone) holding positions `0..len`, the recurrent state at `len` and its snapshot
    /// (hybrid models; `None` for attention-only caches). The caller checked the shapes.
    pub fn restore(
        &mut self,
        blocks: Vec<KvBlock>,
        len: usize,
        recurrent: Option<RecurrentState>,
        snapshot: Option<(usize, RecurrentState)>,
    ) {
        debug_assert!(len <= blocks.len() * BLOCK_TOKENS && len <= self.capacity);
        debug_assert_eq!(recurrent.is_some(), self.recurrent.is_some());
        self.release_from(0);
        self.blocks = blocks.into_iter().map(Arc::new).collect();
        self.len = len;
        if recurrent.is_some() {
            self.recurrent = recurrent;
        }
        self.snapshot = snapshot;
    }

    /// Replaces block `i` (same contents) by an identical one kept elsewhere, so that both
    /// tables share one copy. Used by the prefix index when two sequences computed the same block.
    pub fn share_block(&mut self, i: usize, block: Arc<KvBlock>) {
        let old = std::mem::replace(&mut self.blocks[i], block);
        self.give_back(old);
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
        self.release_from(self.len.div_ceil(BLOCK_TOKENS));
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Returns the blocks from table index `first` on.
    fn release_from(&mut self, first: usize) {
        if first < self.blocks.len() {
            for b in self.blocks.split_off(first).into_iter().rev() {
                self.give_back(b);
            }
        }
    }

    /// Drops one reference; a block nobody else holds goes back to the source.
    fn give_back(&self, block: Arc<KvBlock>) {
        if let (Some(src), Ok(b)) = (&self.source, Arc::try_unwrap(block)) {
            src.give_back(b);
        }
    }

    fn new_block(&self) -> KvBlock {
        match &self.source {
            Some(src) => {
                let b = src.take();
                // A pool serves caches of one shape; a mix-up would misread every page.
                assert_eq!(b.types(), self.types, "block source of other KV types");
                b
            }
            None => KvBlock::new(self.shape()),
        }
    }

    /// Makes sure positions `len..len + n` have blocks this cache may write: allocates the
    /// missing ones and copies a shared block the range starts in.
    fn prepare(&mut self, n: usize) {
        let end = self.len + n;
        while self.blocks.len() * BLOCK_TOKENS < end {
            let b = self.new_block();
            self.blocks.push(Arc::new(b));
        }
        if n == 0 {
            return;
        }
        let first = self.len / BLOCK_TOKENS;
        for i in first..end.div_ceil(BLOCK_TOKENS) {
            if Arc::get_mut(&mut self.blocks[i]).is_none() {
                let mut copy = self.new_block();
                copy.keys.copy_from(&self.blocks[i].keys);
                copy.values.copy_from(&self.blocks[i].values);
                let shared = std::mem::replace(&mut self.blocks[i], Arc::new(copy));
                self.give_back(shared);
            }
        }
    }

    /// Appends `n` rows of keys and values for `layer` at positions `len..len + n`; the caller
    /// appends every layer for the same positions, then calls `advance(n)`.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        debug_assert_eq!(k.len(), v.len());
        debug_assert_eq!(k.len() % self.row, 0);
        let n = k.len() / self.row;
        self.prepare(n);
        let (row, heads) = (self.row, self.heads);
        let hd = row / heads.max(1);
        for (i, (kr, vr)) in k.chunks_exact(row).zip(v.chunks_exact(row)).enumerate() {
            let pos = self.len + i;
            let (bi, off) = (pos / BLOCK_TOKENS, pos % BLOCK_TOKENS);
            let block = Arc::get_mut(&mut self.blocks[bi]).expect("prepared as private");
            let page = layer * BLOCK_TOKENS * row;
            for (store, src) in [(&mut block.keys, kr), (&mut block.values, vr)] {
                for h in 0..heads {
                    store.write(page + (h * BLOCK_TOKENS + off) * hd, &src[h * hd..][..hd]);
                }
            }
        }
    }

    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Key and value pages of `layer` covering positions `0..n` (n may include rows appended
    /// but not yet advanced): page `p` holds positions `p·BLOCK_TOKENS..`, laid out as
    /// [`head_layout`](Self::head_layout) says.
    pub fn pages(&self, layer: usize, n: usize) -> (KvPageList<'_>, KvPageList<'_>) {
        let count = n.div_ceil(BLOCK_TOKENS);
        let blocks = &self.blocks[..count];
        let list = |values: bool, kind: KvType| {
            KvPageList::collect(kind, blocks.iter().map(|b| b.page(layer, values, self.row)))
        };
        (list(false, self.types.k), list(true, self.types.v))
    }

    /// Keys of `layer` at position `pos`, every head (tests and checks).
    pub fn key_row(&self, layer: usize, pos: usize) -> Vec<f32> {
        self.row_at(layer, false, pos)
    }

    /// Values of `layer` at position `pos`, every head.
    pub fn value_row(&self, layer: usize, pos: usize) -> Vec<f32> {
        self.row_at(layer, true, pos)
    }

    fn row_at(&self, layer: usize, values: bool, pos: usize) -> Vec<f32> {
        let page = self.blocks[pos / BLOCK_TOKENS].page(layer, values, self.row);
        let mut row = vec![0f32; self.row];
        for (h, out) in row.chunks_exact_mut(self.row / self.heads).enumerate() {
            let (stride, offset) = self.head_layout(h);
            page.read((pos % BLOCK_TOKENS) * stride + offset, out);
        }
        row
    }

    /// Bytes of the blocks this cache references (shared blocks counted in full) plus its
    /// recurrent state.
    pub fn bytes(&self) -> usize {
        self.blocks.len() * KvBlock::bytes_for(self.shape())
            + self.recurrent.as_ref().map_or(0, |r| r.bytes())
    }

    /// Bytes of keys/values of `tokens` positions of `n_layers` × `row` stored as `types` (for
    /// `trit info`; a cache rounds up to whole blocks).
    pub fn bytes_for(n_layers: usize, row: usize, types: KvTypes, tokens: usize) -> usize {
        let shape = KvShape {
            n_layers,
            row,
            types,
        };
        shape.bytes_for(tokens)
    }
}

impl Drop for KvCache {
    fn drop(&mut self) {
        self.release_from(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Elements `at..at + n` of page `p`, as f32.
    fn read(list: &KvPageList, p: usize, at: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n];
        list.as_pages().page(p).read(at, &mut out);
        out
    }

    fn fill(c: &mut KvCache, n: usize, v: f32) {
        for layer in 0..c.n_layers() {
            let rows = vec![v + layer as f32; n * c.row()];
            c.append(layer, &rows, &rows.iter().map(|x| -x).collect::<Vec<_>>());
        }
        c.advance(n);
    }

    /// Pages are head-major: head h's keys of a page are one contiguous run at
    /// `head_layout(h)`, and `key_row`/`value_row` give back the rows as appended, across a
    /// block boundary.
    #[test]
    fn pages_hold_each_head_contiguously() {
        let (heads, hd, n) = (3, 4, BLOCK_TOKENS + 5);
        let mut c = KvCache::new(2, heads * hd, 256).with_heads(heads);
        // Value of layer l, position p, head h, element e.
        let val =
            |l: usize, p: usize, h: usize, e: usize| (l * 100_000 + p * 100 + h * 10 + e) as f32;
        for l in 0..2 {
            let k: Vec<f32> = (0..n)
                .flat_map(|p| (0..heads).flat_map(move |h| (0..hd).map(move |e| val(l, p, h, e))))
                .collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            c.append(l, &k, &v);
        }
        c.advance(n);
        for l in 0..2 {
            let (kp, vp) = c.pages(l, n);
            assert_eq!(kp.len(), 2);
            for h in 0..heads {
                let (stride, offset) = c.head_layout(h);
                assert_eq!(stride, hd);
                for p in 0..n {
                    let at = (p % BLOCK_TOKENS) * stride + offset;
                    let want: Vec<f32> = (0..hd).map(|e| val(l, p, h, e)).collect();
                    assert_eq!(read(&kp, p / BLOCK_TOKENS, at, hd), want);
                    let neg: Vec<f32> = want.iter().map(|x| -x).collect();
                    assert_eq!(read(&vp, p / BLOCK_TOKENS, at, hd), neg);
                }
                // One head's keys of a full page are one run of BLOCK_TOKENS · hd floats.
                let run = read(&kp, 0, offset, BLOCK_TOKENS * hd);
                assert_eq!(run[hd], val(l, 1, h, 0));
            }
            let row: Vec<f32> = (0..heads)
                .flat_map(|h| (0..hd).map(move |e| val(l, 66, h, e)))
                .collect();
            assert_eq!(c.key_row(l, 66), row);
            assert_eq!(
                c.value_row(l, 66),
                row.iter().map(|x| -x).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn append_across_blocks_truncate_and_reuse() {
        let mut c = KvCache::new(2, 4, 512);
        fill(&mut c, 70, 1.0);
        assert_eq!((c.len(), c.blocks().len()), (70, 2));
        assert_eq!(c.key_row(1, 69), &[2.0; 4]);
        assert_eq!(c.value_row(0, 63), &[-1.0; 4]);
        c.truncate(64);
        assert_eq!(c.blocks().len(), 1);
        fill(&mut c, 2, 5.0);
        assert_eq!(c.key_row(0, 64), &[5.0; 4]);
        assert_eq!(c.key_row(0, 63), &[1.0; 4]);
        let (k, v) = c.pages(1, 66);
        assert_eq!(
            (k.len(), v.len(), k.as_pages().page(0).len()),
            (2, 2, BLOCK_TOKENS * 4)
        );
        assert_eq!(c.bytes(), 2 * KvBlock::bytes_for(c.shape()));
        assert_eq!(KvBlock::bytes_for(c.shape()), 2 * 2 * BLOCK_TOKENS * 4 * 4);
    }

    /// What a store of type `t` holds for `row` (each head row of `hd` values on its own:
    /// the q8_0 blocks never straddle two heads).
    fn stored(t: KvType, row: &[f32], hd: usize) -> Vec<f32> {
        match t {
            KvType::F32 => row.to_vec(),
            KvType::F16 => row
                .iter()
                .map(|&x| half::f16::from_f32(x).to_f32())
                .collect(),
            KvType::Q8_0 => row
                .chunks(hd)
                .flat_map(|h| {
                    let (mut q, mut d) = (vec![0i8; hd], vec![0f32; hd / 32]);
                    crate::kernels::kv_type::store_q8(&mut q, &mut d, h);
                    (0..hd).map(move |i| q[i] as f32 * d[i / 32])
                })
                .collect(),
        }
    }

    /// An f16 (or q8_0, or mixed) cache hands back what was appended rounded to its type (the
    /// kernels' pages and `key_row` agree), takes the bytes of that type (f16: half of f32;
    /// q8_0: 36 bytes per 32 values), and copies shared blocks before writing like any other.
    #[test]
    fn f16_and_q8_caches_store_rounded_values_in_fewer_bytes() {
        let (heads, hd, n) = (2, 32, BLOCK_TOKENS + 9);
        let row = heads * hd;
        let k = crate::test_values::uniform(3, n * row);
        let v: Vec<f32> = k.iter().map(|x| 100.0 * x - 50.0).collect();
        let (f16, f32, q8) = (KvType::F16, KvType::F32, KvType::Q8_0);
        for (kt, vt) in [(f16, f16), (f32, f16), (q8, q8), (f16, q8)] {
            let types = KvTypes { k: kt, v: vt };
            let mut c = KvCache::new(1, row, 256)
                .with_heads(heads)
                .with_types(types);
            c.append(0, &k, &v);
            c.advance(n);
            let elems = BLOCK_TOKENS * row;
            let per = |t: KvType| match t {
                KvType::F32 => 4 * elems,
                KvType::F16 => 2 * elems,
                KvType::Q8_0 => elems / 32 * 36,
            };
            let want_bytes = per(kt) + per(vt);
            assert_eq!(KvBlock::bytes_for(c.shape()), want_bytes);
            assert_eq!(c.bytes(), 2 * want_bytes);
            let (kp, vp) = c.pages(0, n);
            assert_eq!(
                (kp.as_pages().page(0).kind(), vp.as_pages().page(1).kind()),
                (kt, vt)
            );
            for p in [0, 5, BLOCK_TOKENS - 1, BLOCK_TOKENS, n - 1] {
                let want_k = stored(kt, &k[p * row..][..row], hd);
                let want_v = stored(vt, &v[p * row..][..row], hd);
                assert_eq!(c.key_row(0, p), want_k, "{types:?} key {p}");
                assert_eq!(c.value_row(0, p), want_v, "{types:?} value {p}");
                let (stride, offset) = c.head_layout(1);
                let at = (p % BLOCK_TOKENS) * stride + offset;
                assert_eq!(read(&vp, p / BLOCK_TOKENS, at, hd), want_v[hd..]);
            }
            // Copy-on-write keeps the stored values.
            let mut d = KvCache::new(1, row, 256)
                .with_heads(heads)
                .with_types(types);
            d.map_prefix(c.blocks().to_vec(), 70);
            d.append(0, &vec![1.5; row], &vec![-1.5; row]);
            d.advance(1);
            assert!(!Arc::ptr_eq(&c.blocks()[1], &d.blocks()[1]));
            assert_eq!(d.value_row(0, 66), c.value_row(0, 66));
            assert_eq!(d.value_row(0, 70), stored(vt, &vec![-1.5; row], hd));
        }
    }

    /// Counts what goes in and out, like the scheduler's pool.
    #[derive(Default)]
    struct Counting {
        taken: Mutex<usize>,
        returned: Mutex<usize>,
    }

    impl BlockSource for Counting {
        fn take(&self) -> KvBlock {
            *self.taken.lock().unwrap() += 1;
            KvBlock::new(KvShape {
                n_layers: 1,
                row: 2,
                types: KvTypes::F32,
            })
        }
        fn give_back(&self, _: KvBlock) {
            *self.returned.lock().unwrap() += 1;
        }
    }

    #[test]
    fn shared_blocks_are_copied_before_writing_and_returned_once() {
        let src = Arc::new(Counting::default());
        let mut a = KvCache::new(1, 2, 512).with_source(src.clone());
        fill(&mut a, 100, 1.0);
        // b maps a's first 80 positions: block 0 whole, block 1 up to position 80.
        let mut b = KvCache::new(1, 2, 512).with_source(src.clone());
        b.map_prefix(a.blocks().to_vec(), 80);
        fill(&mut b, 1, 7.0);
        assert!(
            Arc::ptr_eq(&a.blocks()[0], &b.blocks()[0]),
            "full block shared"
        );
        assert!(
            !Arc::ptr_eq(&a.blocks()[1], &b.blocks()[1]),
            "written block copied"
        );
        assert_eq!(b.key_row(0, 79), &[1.0; 2]);
        assert_eq!(b.key_row(0, 80), &[7.0; 2]);
        assert_eq!(a.key_row(0, 80), &[1.0; 2], "a's copy untouched");
        assert_eq!(*src.taken.lock().unwrap(), 3);
        drop(a);
        // Block 0 is still b's; a's block 1 is returned.
        assert_eq!(*src.returned.lock().unwrap(), 1);
        drop(b);
        assert_eq!(*src.returned.lock().unwrap(), 3);
    }

    #[test]
    fn resume_starts_from_shared_blocks_and_a_state_copy() {
        let mut a = KvCache::new(1, 2, 256).with_recurrent(RecurrentState::new(1, 3, 4));
        fill(&mut a, 70, 1.0);
        let mut saved = RecurrentState::new(1, 3, 4);
        saved.layers[0].ssm.fill(3.0);
        let mut b = KvCache::new(1, 2, 256).with_recurrent(RecurrentState::new(1, 3, 4));
        b.resume(a.blocks().to_vec(), 66, &saved);
        assert_eq!(b.len(), 66);
        assert_eq!(b.recurrent(), Some(&saved));
        fill(&mut b, 1, 9.0);
        assert_eq!(b.key_row(0, 65), &[1.0; 2]);
        assert_eq!(b.key_row(0, 66), &[9.0; 2]);
        assert_eq!(a.key_row(0, 66), &[1.0; 2], "the shared block was copied");
        assert!(Arc::ptr_eq(&a.blocks()[0], &b.blocks()[0]));
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
        assert_eq!(c.key_row(0, 2), &[1.0; 2]);
        // Cutting at the end keeps everything; cutting before the snapshot starts over.
        c.truncate(3);
        assert_eq!(c.len(), 3);
        c.truncate(2);
        assert_eq!(c.len(), 0);
        assert_eq!(c.recurrent_mut().unwrap().layers[0].ssm, vec![0.0; 4]);
    }
}
