//! Element types of the KV cache (`--cache-type-k` / `--cache-type-v`) and the typed pages the
//! attention kernels read.
//!
//! Why f16 by default (as llama.cpp; mlx-lm keeps the model's f16/bf16): batched decode reads
//! every sequence's whole cache once per layer and step, so with 8 sequences the cache, not the
//! weights, is most of the memory traffic at moderate depths; half the bytes per position is
//! half that traffic and twice the positions in the same `--kv-cache-mib` budget. Keys and
//! values are rounded once, when they are stored (round to nearest even, saturating at ±65504
//! so an outlier becomes the largest half instead of an infinity that would turn a whole
//! softmax into NaN); the kernels widen them exactly (`vcvtph2ps` on AVX-512), so all arithmetic
//! stays f32. f32 keeps the exact values (the reference tests compare against f32 frameworks).
//!
//! `q8_0` (as llama.cpp's: blocks of 32 values as int8 codes `q` and one scale `d = max|x| /
//! 127`, `x ≈ q·d`, codes rounded half away from zero) halves the bytes again; the scale is kept
//! in f32 here (1.125 bytes per value instead of llama.cpp's 1.0625) so the kernels read it
//! with a plain broadcast and no second rounding. The kernels widen `q·d` (one rounding) and
//! otherwise compute exactly as on f32 pages holding those numbers. It needs head dimensions
//! that are multiples of 32.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// How keys (or values) are stored in the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    /// IEEE half precision: 2 bytes per element, about 3 significant decimal digits.
    #[default]
    F16,
    /// Single precision: exact, 4 bytes per element.
    F32,
    /// 8-bit codes with an f32 scale per block of 32: 1.125 bytes per element.
    Q8_0,
}

impl KvType {
    /// Every type, for option parsing and error messages.
    pub const ALL: [KvType; 3] = [KvType::F16, KvType::F32, KvType::Q8_0];

    /// Bytes of `n` stored elements (`n` a multiple of [`Q8_BLOCK`] for `q8_0`).
    pub fn bytes_for(self, n: usize) -> usize {
        match self {
            KvType::F16 => 2 * n,
            KvType::F32 => 4 * n,
            KvType::Q8_0 => n + 4 * n.div_ceil(Q8_BLOCK),
        }
    }

    /// How many elements a row must be a multiple of.
    pub fn granule(self) -> usize {
        match self {
            KvType::Q8_0 => Q8_BLOCK,
            _ => 1,
        }
    }

    /// llama.cpp's name (`f16`, `f32`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Parses llama.cpp's names; other llama.cpp cache types (`q8_0`, `bf16`, ...) are refused
    /// with the list of the ones trit stores.
    pub fn parse(s: &str) -> crate::Result<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|t| t.name()).collect();
                crate::Error::InvalidArgument(format!(
                    "KV cache type '{s}' (trit stores keys and values as {})",
                    names.join(", ")
                ))
            })
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The types of keys and of values (like llama.cpp, they may differ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    /// Keys and values in f32 (exact).
    pub const F32: KvTypes = KvTypes {
        k: KvType::F32,
        v: KvType::F32,
    };
    /// Keys and values in f16 (the default).
    pub const F16: KvTypes = KvTypes {
        k: KvType::F16,
        v: KvType::F16,
    };
    /// Keys and values in q8_0.
    pub const Q8_0: KvTypes = KvTypes {
        k: KvType::Q8_0,
        v: KvType::Q8_0,
    };

    /// Bytes of `n` elements of keys and `n` of values.
    pub fn bytes_for(self, n: usize) -> usize {
        self.k.bytes_for(n) + self.v.bytes_for(n)
    }

    /// How many elements a row must be a multiple of.
    pub fn granule(self) -> usize {
        self.k.granule().max(self.v.granule())
    }
}

/// Values per `q8_0` block (one scale each).
pub const Q8_BLOCK: usize = 32;

/// A `q8_0` page: `q[i] · d[i / Q8_BLOCK]` is element `i`.
#[derive(Clone, Copy, Debug)]
pub struct Q8Page<'a> {
    pub q: &'a [i8],
    pub d: &'a [f32],
}

impl Q8Page<'_> {
    fn read(&self, at: usize, out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.q[at + i] as f32 * self.d[(at + i) / Q8_BLOCK];
        }
    }
}

/// Quantizes `src` (a multiple of `Q8_BLOCK` values) into codes `q` and scales `d` as
/// llama.cpp's `quantize_row_q8_0_ref` does: `d = max|x| / 127`, `q = round(x / d)` (half away
/// from zero). A block holding a NaN gets scale NaN (it reads back as NaN, never as numbers).
pub fn store_q8(q: &mut [i8], d: &mut [f32], src: &[f32]) {
    assert!(
        src.len() == q.len() && src.len() == d.len() * Q8_BLOCK,
        "store_q8: lengths"
    );
    for ((qb, db), xb) in q
        .chunks_exact_mut(Q8_BLOCK)
        .zip(d.iter_mut())
        .zip(src.chunks_exact(Q8_BLOCK))
    {
        let amax = xb.iter().fold(0f32, |m, &x| {
            if x.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(x.abs())
            }
        });
        let scale = amax / 127.0;
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for (c, &x) in qb.iter_mut().zip(xb) {
            // |x · inv| ≤ 127 up to rounding; the cast saturates (and maps NaN to 0).
            *c = (x * inv).round() as i8;
        }
        *db = scale;
    }
}

/// Stored keys or values of one cache block: `[layer][kv_head][position][head_dim]`.
#[derive(Clone, Debug, PartialEq)]
pub enum KvStore {
    F16(Vec<f16>),
    F32(Vec<f32>),
    Q8_0 { q: Vec<i8>, d: Vec<f32> },
}

impl KvStore {
    /// `len` zeroed elements of type `t`.
    pub fn zeroed(t: KvType, len: usize) -> Self {
        match t {
            KvType::F16 => KvStore::F16(vec![f16::ZERO; len]),
            KvType::F32 => KvStore::F32(vec![0.0; len]),
            KvType::Q8_0 => KvStore::Q8_0 {
                q: vec![0; len],
                d: vec![0.0; len.div_ceil(Q8_BLOCK)],
            },
        }
    }

    pub fn kind(&self) -> KvType {
        match self {
            KvStore::F16(_) => KvType::F16,
            KvStore::F32(_) => KvType::F32,
            KvStore::Q8_0 { .. } => KvType::Q8_0,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvStore::F16(d) => d.len(),
            KvStore::F32(d) => d.len(),
            KvStore::Q8_0 { q, .. } => q.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores `src` at element `at`, rounded to this store's type (`q8_0`: `at` and the
    /// length multiples of `Q8_BLOCK`).
    pub fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvStore::F32(d) => d[at..][..src.len()].copy_from_slice(src),
            KvStore::F16(d) => store_f16(&mut d[at..][..src.len()], src),
            KvStore::Q8_0 { q, d } => {
                assert!(at.is_multiple_of(Q8_BLOCK), "q8_0 write inside a block");
                let blocks = src.len().div_ceil(Q8_BLOCK);
                store_q8(
                    &mut q[at..][..src.len()],
                    &mut d[at / Q8_BLOCK..][..blocks],
                    src,
                )
            }
        }
    }

    /// Element `at..at + out.len()` widened to f32.
    pub fn read(&self, at: usize, out: &mut [f32]) {
        self.page(0, self.len()).read(at, out)
    }

    /// Overwrites this store with `other`'s contents (same type and length).
    pub fn copy_from(&mut self, other: &KvStore) {
        match (self, other) {
            (KvStore::F16(a), KvStore::F16(b)) => a.copy_from_slice(b),
            (KvStore::F32(a), KvStore::F32(b)) => a.copy_from_slice(b),
            (KvStore::Q8_0 { q, d }, KvStore::Q8_0 { q: qb, d: db }) => {
                q.copy_from_slice(qb);
                d.copy_from_slice(db);
            }
            _ => panic!("copying a KV store into one of another type"),
        }
    }

    /// The stored bytes, in the order a saved session writes them: the elements (f16/f32
    /// little-endian, or q8_0's codes) then, for q8_0, its scales (empty otherwise).
    pub fn byte_parts(&self) -> [&[u8]; 2] {
        match self {
            KvStore::F16(d) => [bytemuck::cast_slice(d), &[]],
            KvStore::F32(d) => [bytemuck::cast_slice(d), &[]],
            KvStore::Q8_0 { q, d } => [bytemuck::cast_slice(q), bytemuck::cast_slice(d)],
        }
    }

    /// [`byte_parts`](Self::byte_parts), writable (a saved session is read back into them).
    pub fn byte_parts_mut(&mut self) -> [&mut [u8]; 2] {
        match self {
            KvStore::F16(d) => [bytemuck::cast_slice_mut(d), &mut []],
            KvStore::F32(d) => [bytemuck::cast_slice_mut(d), &mut []],
            KvStore::Q8_0 { q, d } => [bytemuck::cast_slice_mut(q), bytemuck::cast_slice_mut(d)],
        }
    }

    /// The `len` elements from `at`, as a page the attention kernels read (`q8_0`: `at` a
    /// multiple of `Q8_BLOCK`).
    pub fn page(&self, at: usize, len: usize) -> KvPage<'_> {
        match self {
            KvStore::F16(d) => KvPage::F16(&d[at..][..len]),
            KvStore::F32(d) => KvPage::F32(&d[at..][..len]),
            KvStore::Q8_0 { q, d } => KvPage::Q8_0(Q8Page {
                q: &q[at..][..len],
                d: &d[at / Q8_BLOCK..][..len.div_ceil(Q8_BLOCK)],
            }),
        }
    }
}

/// Largest finite half.
const F16_MAX: f32 = 65504.0;

/// `dst[i] = f16(src[i])`, round to nearest even, saturating at ±65504 (see the module doc);
/// NaN stays NaN. Through the `half` crate's slice conversion (F16C when the CPU has it).
pub fn store_f16(dst: &mut [f16], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "store_f16: lengths");
    const CHUNK: usize = 64;
    let mut clamped = [0f32; CHUNK];
    for (d, s) in dst.chunks_mut(CHUNK).zip(src.chunks(CHUNK)) {
        for (c, &x) in clamped.iter_mut().zip(s) {
            // `clamp` keeps NaN.
            *c = x.clamp(-F16_MAX, F16_MAX);
        }
        d.convert_from_f32_slice(&clamped[..s.len()]);
    }
}

/// One page of keys or values (one cache block's part for one layer), in its stored type.
#[derive(Clone, Copy, Debug)]
pub enum KvPage<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
    Q8_0(Q8Page<'a>),
}

impl<'a> KvPage<'a> {
    pub fn len(&self) -> usize {
        match self {
            KvPage::F16(d) => d.len(),
            KvPage::F32(d) => d.len(),
            KvPage::Q8_0(p) => p.q.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn kind(&self) -> KvType {
        match self {
            KvPage::F16(_) => KvType::F16,
            KvPage::F32(_) => KvType::F32,
            KvPage::Q8_0(_) => KvType::Q8_0,
        }
    }

    /// Elements `at..at + out.len()` widened to f32 (exact).
    pub fn read(&self, at: usize, out: &mut [f32]) {
        match self {
            KvPage::F32(d) => out.copy_from_slice(&d[at..][..out.len()]),
            KvPage::F16(d) => d[at..][..out.len()].convert_to_f32_slice(out),
            KvPage::Q8_0(p) => p.read(at, out),
        }
    }

    /// Address of element `at` (for prefetching) and the size of one element (`q8_0`: of its
    /// codes).
    pub fn addr(&self, at: usize) -> (*const u8, usize) {
        match self {
            KvPage::F16(d) => (d[at..].as_ptr().cast(), 2),
            KvPage::F32(d) => (d[at..].as_ptr().cast(), 4),
            KvPage::Q8_0(p) => (p.q[at..].as_ptr().cast(), 1),
        }
    }
}

/// The pages of one layer's keys (or values) across a cache's block table, all of one type.
#[derive(Clone, Copy, Debug)]
pub enum KvPages<'a> {
    F16(&'a [&'a [f16]]),
    F32(&'a [&'a [f32]]),
    Q8_0(&'a [Q8Page<'a>]),
}

impl<'a> KvPages<'a> {
    pub fn len(&self) -> usize {
        match self {
            KvPages::F16(p) => p.len(),
            KvPages::F32(p) => p.len(),
            KvPages::Q8_0(p) => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn page(&self, p: usize) -> KvPage<'a> {
        match self {
            KvPages::F16(d) => KvPage::F16(d[p]),
            KvPages::F32(d) => KvPage::F32(d[p]),
            KvPages::Q8_0(d) => KvPage::Q8_0(d[p]),
        }
    }
}

/// Owned list of pages (what a cache hands out for one layer); [`as_pages`](Self::as_pages)
/// borrows it as the kernels' [`KvPages`].
#[derive(Clone, Debug)]
pub enum KvPageList<'a> {
    F16(Vec<&'a [f16]>),
    F32(Vec<&'a [f32]>),
    Q8_0(Vec<Q8Page<'a>>),
}

impl<'a> KvPageList<'a> {
    /// Collects `pages`, which must all be of one type.
    pub fn collect(kind: KvType, pages: impl Iterator<Item = KvPage<'a>>) -> Self {
        match kind {
            KvType::F16 => KvPageList::F16(
                pages
                    .map(|p| match p {
                        KvPage::F16(d) => d,
                        _ => panic!("KV pages of mixed types in one cache"),
                    })
                    .collect(),
            ),
            KvType::F32 => KvPageList::F32(
                pages
                    .map(|p| match p {
                        KvPage::F32(d) => d,
                        _ => panic!("KV pages of mixed types in one cache"),
                    })
                    .collect(),
            ),
            KvType::Q8_0 => KvPageList::Q8_0(
                pages
                    .map(|p| match p {
                        KvPage::Q8_0(d) => d,
                        _ => panic!("KV pages of mixed types in one cache"),
                    })
                    .collect(),
            ),
        }
    }

    pub fn as_pages(&self) -> KvPages<'_> {
        match self {
            KvPageList::F16(p) => KvPages::F16(p),
            KvPageList::F32(p) => KvPages::F32(p),
            KvPageList::Q8_0(p) => KvPages::Q8_0(p),
        }
    }

    pub fn len(&self) -> usize {
        self.as_pages().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored halves are IEEE round-to-nearest-even of the input (checked against the
    /// `half` crate's scalar conversion and against numpy-style boundary cases), saturating
    /// instead of overflowing to infinity.
    #[test]
    fn f16_store_rounds_to_nearest_even_and_saturates() {
        let mut src: Vec<f32> = crate::test_values::uniform(5, 300)
            .into_iter()
            .map(|x| 8.0 * x - 4.0)
            .collect();
        // 1 + 2^-11 is halfway between 1 and the next half: ties go to the even 1.0;
        // 1 + 3·2^-11 goes up to 1 + 2^-9. 65519 rounds to 65504, 1e6 saturates.
        src.extend([
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            65519.0,
            1e6,
            -1e6,
            f32::INFINITY,
            6e-8,
            0.0,
            -0.0,
        ]);
        let mut got = vec![f16::ZERO; src.len()];
        store_f16(&mut got, &src);
        for (g, &s) in got.iter().zip(&src) {
            let want = f16::from_f32(s.clamp(-F16_MAX, F16_MAX));
            assert_eq!(g.to_bits(), want.to_bits(), "{s}");
            assert!(g.is_finite(), "{s} stored as {g}");
            // Relative rounding error of a normal half is at most 2^-11.
            if s.abs() > 1e-4 && s.abs() <= F16_MAX {
                assert!(((g.to_f32() - s) / s).abs() <= 2f32.powi(-11), "{s} → {g}");
            }
        }
        let n = src.len();
        assert_eq!(got[n - 9].to_f32(), 1.0);
        assert_eq!(got[n - 8].to_f32(), 1.0 + 2f32.powi(-9));
        assert_eq!(got[n - 7].to_f32(), F16_MAX);
        assert_eq!(got[n - 6].to_f32(), F16_MAX);
        assert_eq!(got[n - 5].to_f32(), -F16_MAX);
        let mut nan = [f16::ZERO];
        store_f16(&mut nan, &[f32::NAN]);
        assert!(nan[0].is_nan());
    }

    #[test]
    fn stores_round_trip_and_copy() {
        let src: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 3.0).collect();
        for t in KvType::ALL {
            let mut s = KvStore::zeroed(t, 128);
            assert_eq!((s.kind(), s.len()), (t, 128));
            s.write(32, &src);
            let mut back = vec![0f32; 64];
            s.read(32, &mut back);
            let want: Vec<f32> = match t {
                // Quarter steps below 8 are exact halves.
                KvType::F32 | KvType::F16 => src.clone(),
                KvType::Q8_0 => {
                    let (mut q, mut d) = (vec![0i8; 64], vec![0f32; 2]);
                    store_q8(&mut q, &mut d, &src);
                    (0..64).map(|i| q[i] as f32 * d[i / 32]).collect()
                }
            };
            assert_eq!(back, want, "{t}");
            let mut page_back = vec![0f32; 64];
            s.page(32, 64).read(0, &mut page_back);
            assert_eq!(page_back, want);
            let mut c = KvStore::zeroed(t, 128);
            c.copy_from(&s);
            assert_eq!(c, s);
        }
    }

    /// q8_0 codes equal llama.cpp's (gguf-py's `Q8_0.quantize_blocks`, the numpy port of
    /// `quantize_row_q8_0_ref`) on values with ties, zeros, a lone outlier and an all-zero
    /// block; our scale is its f32 `max|x| / 127` (llama.cpp stores that scale as f16).
    #[test]
    fn q8_codes_match_llama_cpp() {
        let fx: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/fixtures/kv_q8/reference.json"
            ))
            .unwrap(),
        )
        .unwrap();
        let floats = |k: &str| -> Vec<f32> {
            fx[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect()
        };
        let x = floats("x");
        let want_q: Vec<i8> = fx["q"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap() as i8)
            .collect();
        let want_d = floats("d_f16");
        let (mut q, mut d) = (vec![0i8; x.len()], vec![0f32; x.len() / Q8_BLOCK]);
        store_q8(&mut q, &mut d, &x);
        assert_eq!(q, want_q);
        for (ours, theirs) in d.iter().zip(&want_d) {
            assert_eq!(f16::from_f32(*ours).to_f32(), *theirs);
        }
        // NaN never turns into numbers.
        let mut nan_block = x[..Q8_BLOCK].to_vec();
        nan_block[3] = f32::NAN;
        store_q8(&mut q[..Q8_BLOCK], &mut d[..1], &nan_block);
        assert!(d[0].is_nan());
    }

    #[test]
    fn parses_llama_cpp_names() {
        assert_eq!(KvType::parse("f16").unwrap(), KvType::F16);
        assert_eq!(KvType::parse("F32").unwrap(), KvType::F32);
        assert_eq!(KvType::parse("Q8_0").unwrap(), KvType::Q8_0);
        let e = KvType::parse("q4_0").unwrap_err().to_string();
        assert!(e.contains("q4_0") && e.contains("f16, f32, q8_0"), "{e}");
        assert_eq!(KvType::default(), KvType::F16);
    }
}
