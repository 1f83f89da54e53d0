//! Tensor encodings: one file per block format, each with its block struct, a scalar
//! reference decoder (ground truth for every SIMD kernel) and an encoder for the writer.
//!
//! Every ternary format decodes to the same thing: per group of consecutive input weights
//! of a row, one scale `s` and codes `q = t + 1` with `t ∈ {-1, 0, +1}` (code 3 = +2 is
//! representable and is carried through, never silently dropped).

pub mod bitnet;
pub mod float;
pub mod mlx2;
pub mod ptq1_0;
pub mod q1_0;
pub mod q2_0;
pub mod q4;
pub mod q8_0;
pub mod ternary;
pub mod tq1_0;
pub mod tq2_0;
pub mod trit3;

pub use float::HalfKind;
pub use mlx2::MlxTernary;
pub use ternary::GgmlTernary;

/// Scalar reference dequantization of `n` consecutive weights of type `ty` (n a multiple of the
/// block size; `bytes` exactly `ty.row_bytes(n)` long; `out` at least `n` long).
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize, out: &mut [f32]) -> crate::Result<()> {
    if !n.is_multiple_of(ty.block_size()) || bytes.len() != ty.row_bytes(n) || out.len() < n {
        return Err(crate::Error::InvalidArgument(format!(
            "dequantize {}: {n} weights need a multiple of {} and {} bytes (got {} bytes, \
             output room {})",
            ty.name(),
            ty.block_size(),
            ty.row_bytes(n),
            bytes.len(),
            out.len()
        )));
    }
    let out = &mut out[..n];
    match ty {
        GgmlType::F32 => float::dequantize_f32(bytes, out),
        GgmlType::F16 => float::dequantize_f16(bytes, out),
        GgmlType::BF16 => float::dequantize_bf16(bytes, out),
        GgmlType::Q8_0 => q8_0::dequantize_row(bytes, out),
        GgmlType::Q4_0 => q4::dequantize_row_q4_0(bytes, out),
        GgmlType::Q4_1 => q4::dequantize_row_q4_1(bytes, out),
        GgmlType::Q1_0 => q1_0::dequantize_row(bytes, out),
        GgmlType::Q2_0 => q2_0::dequantize_row(64, bytes, out),
        GgmlType::Q2_0Legacy128 | GgmlType::PQ2_0 => q2_0::dequantize_row(128, bytes, out),
        GgmlType::PTQ1_0 => ptq1_0::dequantize_row(bytes, out),
        GgmlType::TQ1_0 => tq1_0::dequantize_row(bytes, out),
        GgmlType::TQ2_0 => tq2_0::dequantize_row(bytes, out),
    }
    Ok(())
}

/// ggml tensor type ids that trit reads (ids from upstream llama.cpp and the PrismML fork).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
    BF16,
    TQ1_0,
    TQ2_0,
    Q1_0,
    /// Upstream Q2_0: 64 weights per 18-byte block.
    Q2_0,
    /// Deprecated Prism files that reuse id 42 for 128 weights per 34 bytes.
    Q2_0Legacy128,
    PQ2_0,
    PTQ1_0,
}

impl GgmlType {
    /// Maps a file's type id. Id 42 is ambiguous (see `Q2_0Legacy128`); the reader resolves it
    /// from the tensor's byte span and this returns the upstream meaning.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            30 => Self::BF16,
            34 => Self::TQ1_0,
            35 => Self::TQ2_0,
            41 => Self::Q1_0,
            42 => Self::Q2_0,
            142 => Self::PQ2_0,
            143 => Self::PTQ1_0,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q8_0 => 8,
            Self::BF16 => 30,
            Self::TQ1_0 => 34,
            Self::TQ2_0 => 35,
            Self::Q1_0 => 41,
            Self::Q2_0 | Self::Q2_0Legacy128 => 42,
            Self::PQ2_0 => 142,
            Self::PTQ1_0 => 143,
        }
    }

    /// Weights per block.
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q8_0 => 32,
            Self::Q2_0 => 64,
            Self::Q1_0 | Self::Q2_0Legacy128 | Self::PQ2_0 | Self::PTQ1_0 => 128,
            Self::TQ1_0 | Self::TQ2_0 => 256,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
            Self::TQ1_0 => 54,
            Self::TQ2_0 => 66,
            Self::Q1_0 => 18,
            Self::Q2_0 => 18,
            Self::Q2_0Legacy128 | Self::PQ2_0 => 34,
            Self::PTQ1_0 => 28,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q8_0 => "Q8_0",
            Self::BF16 => "BF16",
            Self::TQ1_0 => "TQ1_0",
            Self::TQ2_0 => "TQ2_0",
            Self::Q1_0 => "Q1_0",
            Self::Q2_0 => "Q2_0",
            Self::Q2_0Legacy128 => "Q2_0 (legacy g128)",
            Self::PQ2_0 => "PQ2_0",
            Self::PTQ1_0 => "PTQ1_0",
        }
    }

    /// Every format whose values are exactly `s · t` with `t ∈ {-1,0,1}`.
    pub const TERNARY: [GgmlType; 6] = [
        Self::Q2_0,
        Self::Q2_0Legacy128,
        Self::PQ2_0,
        Self::PTQ1_0,
        Self::TQ1_0,
        Self::TQ2_0,
    ];

    /// Formats whose values are exactly `s · t` with `t ∈ {-1,0,1}` (ternary kernels).
    pub fn is_ternary(self) -> bool {
        Self::TERNARY.contains(&self)
    }

    /// The ternary formats and the binary `Q1_0` (`t ∈ {-1,1}`, a subset): what loads into the
    /// ternary kernels, losslessly (1-bit Bonsai's Q1_0 would otherwise run as dense f32, 28×
    /// its file size). Only the ternary ones can be written (`encode_block`).
    pub fn reads_as_ternary(self) -> bool {
        self.is_ternary() || self == Self::Q1_0
    }

    /// Bytes of a row of `n` weights (n must be a multiple of the block size).
    pub fn row_bytes(self, n: usize) -> usize {
        n / self.block_size() * self.type_size()
    }

    /// Every type this build reads, for error messages.
    pub fn known_list() -> String {
        "F32(0) F16(1) Q4_0(2) Q4_1(3) Q8_0(8) BF16(30) TQ1_0(34) TQ2_0(35) Q1_0(41) \
         Q2_0(42, g64 or legacy g128) PQ2_0(142) PTQ1_0(143)"
            .to_string()
    }
}

/// Format-independent view of a ternary matrix of `rows × cols` (cols = input dimension).
///
/// Kernels repack from this view at load time, so they never see file layouts.
pub trait TernaryRows: Sync {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
    /// Fills `codes[0..cols]` with `t + 1` (0..=3) and `scales[0..cols/64]` with one scale
    /// per 64 columns (formats with larger groups repeat their scale).
    fn row(&self, r: usize, codes: &mut [u8], scales: &mut [f32]);
}

/// Borrowed and boxed rows read like the rows themselves (`bitnet::Scaled` wraps either).
impl<T: TernaryRows + ?Sized> TernaryRows for &T {
    fn rows(&self) -> usize {
        (**self).rows()
    }
    fn cols(&self) -> usize {
        (**self).cols()
    }
    fn row(&self, r: usize, codes: &mut [u8], scales: &mut [f32]) {
        (**self).row(r, codes, scales)
    }
}

impl<T: TernaryRows + ?Sized> TernaryRows for Box<T> {
    fn rows(&self) -> usize {
        (**self).rows()
    }
    fn cols(&self) -> usize {
        (**self).cols()
    }
    fn row(&self, r: usize, codes: &mut [u8], scales: &mut [f32]) {
        (**self).row(r, codes, scales)
    }
}
