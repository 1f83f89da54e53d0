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
}

impl KvType {
    /// Every type, for option parsing and error messages.
    pub const ALL: [KvType; 2] = [KvType::F16, KvType::F32];

    /// Bytes per stored element.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }

    /// llama.cpp's name (`f16`, `f32`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
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
                    names.join(" or ")
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

    /// Bytes of one position's key and value for one element of the row.
    pub fn bytes(self) -> usize {
        self.k.bytes() + self.v.bytes()
    }
}

/// Stored keys or values of one cache block: `[layer][kv_head][position][head_dim]`.
#[derive(Clone, Debug, PartialEq)]
pub enum KvStore {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

impl KvStore {
    /// `len` zeroed elements of type `t`.
    pub fn zeroed(t: KvType, len: usize) -> Self {
        match t {
            KvType::F16 => KvStore::F16(vec![f16::ZERO; len]),
            KvType::F32 => KvStore::F32(vec![0.0; len]),
        }
    }

    pub fn kind(&self) -> KvType {
        match self {
            KvStore::F16(_) => KvType::F16,
            KvStore::F32(_) => KvType::F32,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvStore::F16(d) => d.len(),
            KvStore::F32(d) => d.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores `src` at element `at`, rounded to this store's type.
    pub fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvStore::F32(d) => d[at..][..src.len()].copy_from_slice(src),
            KvStore::F16(d) => store_f16(&mut d[at..][..src.len()], src),
        }
    }

    /// Element `at..at + out.len()` widened to f32.
    pub fn read(&self, at: usize, out: &mut [f32]) {
        match self {
            KvStore::F32(d) => out.copy_from_slice(&d[at..][..out.len()]),
            KvStore::F16(d) => d[at..][..out.len()].convert_to_f32_slice(out),
        }
    }

    /// Overwrites this store with `other`'s contents (same type and length).
    pub fn copy_from(&mut self, other: &KvStore) {
        match (self, other) {
            (KvStore::F16(a), KvStore::F16(b)) => a.copy_from_slice(b),
            (KvStore::F32(a), KvStore::F32(b)) => a.copy_from_slice(b),
            _ => panic!("copying a KV store into one of another type"),
        }
    }

    /// The `len` elements from `at`, as a page the attention kernels read.
    pub fn page(&self, at: usize, len: usize) -> KvPage<'_> {
        match self {
            KvStore::F16(d) => KvPage::F16(&d[at..][..len]),
            KvStore::F32(d) => KvPage::F32(&d[at..][..len]),
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
}

impl<'a> KvPage<'a> {
    pub fn len(&self) -> usize {
        match self {
            KvPage::F16(d) => d.len(),
            KvPage::F32(d) => d.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn kind(&self) -> KvType {
        match self {
            KvPage::F16(_) => KvType::F16,
            KvPage::F32(_) => KvType::F32,
        }
    }

    /// Elements `at..at + out.len()` widened to f32 (exact).
    pub fn read(&self, at: usize, out: &mut [f32]) {
        match self {
            KvPage::F32(d) => out.copy_from_slice(&d[at..][..out.len()]),
            KvPage::F16(d) => d[at..][..out.len()].convert_to_f32_slice(out),
        }
    }

    /// Address of element `at` (for prefetching) and the size of one element.
    pub fn addr(&self, at: usize) -> (*const u8, usize) {
        match self {
            KvPage::F16(d) => (d[at..].as_ptr().cast(), 2),
            KvPage::F32(d) => (d[at..].as_ptr().cast(), 4),
        }
    }
}

/// The pages of one layer's keys (or values) across a cache's block table, all of one type.
#[derive(Clone, Copy, Debug)]
pub enum KvPages<'a> {
    F16(&'a [&'a [f16]]),
    F32(&'a [&'a [f32]]),
}

impl<'a> KvPages<'a> {
    pub fn len(&self) -> usize {
        match self {
            KvPages::F16(p) => p.len(),
            KvPages::F32(p) => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn page(&self, p: usize) -> KvPage<'a> {
        match self {
            KvPages::F16(d) => KvPage::F16(d[p]),
            KvPages::F32(d) => KvPage::F32(d[p]),
        }
    }
}

/// Owned list of pages (what a cache hands out for one layer); [`as_pages`](Self::as_pages)
/// borrows it as the kernels' [`KvPages`].
#[derive(Clone, Debug)]
pub enum KvPageList<'a> {
    F16(Vec<&'a [f16]>),
    F32(Vec<&'a [f32]>),
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
        }
    }

    pub fn as_pages(&self) -> KvPages<'_> {
        match self {
            KvPageList::F16(p) => KvPages::F16(p),
            KvPageList::F32(p) => KvPages::F32(p),
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
        let src: Vec<f32> = (0..40).map(|i| i as f32 * 0.25 - 3.0).collect();
        for t in KvType::ALL {
            let mut s = KvStore::zeroed(t, 100);
            assert_eq!((s.kind(), s.len()), (t, 100));
            s.write(30, &src);
            let mut back = vec![0f32; 40];
            s.read(30, &mut back);
            // Quarter steps below 8 are exact halves.
            assert_eq!(back, src, "{t}");
            let mut page_back = vec![0f32; 40];
            s.page(30, 40).read(0, &mut page_back);
            assert_eq!(page_back, src);
            let mut c = KvStore::zeroed(t, 100);
            c.copy_from(&s);
            assert_eq!(c, s);
        }
    }

    #[test]
    fn parses_llama_cpp_names() {
        assert_eq!(KvType::parse("f16").unwrap(), KvType::F16);
        assert_eq!(KvType::parse("F32").unwrap(), KvType::F32);
        let e = KvType::parse("q8_0").unwrap_err().to_string();
        assert!(e.contains("q8_0") && e.contains("f16 or f32"), "{e}");
        assert_eq!(KvType::default(), KvType::F16);
    }
}
