//! File → named tensor views + config. See docs/ARCHITECTURE.md.
//!
//! Every source (GGUF file, MLX 2-bit folder, unpacked FP16/BF16 folder) exposes its tensors
//! under GGUF canonical names (`token_embd.weight`, `blk.{i}.attn_q.weight`, …) with shapes
//! outermost first (`[out, in]`), so the model code never sees a file layout.

mod bitnet_hf;
pub mod config;
mod config_arch;
mod config_hybrid;
pub(crate) mod folder;
pub mod gguf;
pub mod gguf_source;
pub mod gguf_write;
pub mod mlx;
mod prism_gguf;
mod prism_mlx;
pub mod rotation;
pub mod safetensors;
pub mod testgen;
mod unpacked;

pub use config::{Arch, ModelConfig, RopeScaling, RopeStyle};
pub use folder::{canonical_to_hf, hf_to_canonical};

use crate::quant::GgmlType;
use crate::{Error, Result};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Element types of plain (non-block) tensors, as named by safetensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    F32,
    F16,
    BF16,
    F64,
    U32,
    I32,
    U16,
    I16,
    U8,
    I8,
    U64,
    I64,
    Bool,
}

impl Dtype {
    /// Parses a safetensors dtype string (`"F16"`, `"U32"`, …).
    pub fn from_safetensors(s: &str) -> Option<Dtype> {
        Some(match s {
            "F32" => Dtype::F32,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "F64" => Dtype::F64,
            "U32" => Dtype::U32,
            "I32" => Dtype::I32,
            "U16" => Dtype::U16,
            "I16" => Dtype::I16,
            "U8" => Dtype::U8,
            "I8" => Dtype::I8,
            "U64" => Dtype::U64,
            "I64" => Dtype::I64,
            "BOOL" => Dtype::Bool,
            _ => return None,
        })
    }

    /// The safetensors spelling.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::F64 => "F64",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::U16 => "U16",
            Dtype::I16 => "I16",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::U64 => "U64",
            Dtype::I64 => "I64",
            Dtype::Bool => "BOOL",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F64 | Dtype::U64 | Dtype::I64 => 8,
            Dtype::F32 | Dtype::U32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::BF16 | Dtype::U16 | Dtype::I16 => 2,
            Dtype::U8 | Dtype::I8 | Dtype::Bool => 1,
        }
    }

    /// Floating types a weight or scale may use.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F16 | Dtype::BF16)
    }
}

/// Borrowed bytes of one tensor, in its file encoding (little-endian).
#[derive(Clone, Copy, Debug)]
pub enum TensorData<'a> {
    F32(&'a [u8]),
    F16(&'a [u8]),
    BF16(&'a [u8]),
    /// A ggml block type; `bytes` holds `rows · row_bytes(cols)` bytes, row-major.
    Ggml {
        ty: GgmlType,
        bytes: &'a [u8],
    },
    /// MLX affine quantization: `w = scale · q + bias` per group of `group_size` inputs.
    /// `codes` are u32 words (as bytes), `bits`-bit codes LSB-first, rows of `cols·bits/32`
    /// words; `scales`/`biases` are `[rows, cols/group_size]` of `scale_dtype`.
    Mlx {
        codes: &'a [u8],
        scales: &'a [u8],
        biases: &'a [u8],
        scale_dtype: Dtype,
        group_size: usize,
        bits: usize,
    },
}

impl TensorData<'_> {
    /// Bytes the tensor occupies in its file (codes, scales and biases together for MLX).
    pub fn stored_bytes(&self) -> usize {
        match self {
            TensorData::F32(b) | TensorData::F16(b) | TensorData::BF16(b) => b.len(),
            TensorData::Ggml { bytes, .. } => bytes.len(),
            TensorData::Mlx {
                codes,
                scales,
                biases,
                ..
            } => codes.len() + scales.len() + biases.len(),
        }
    }

    /// Short name for messages and `trit info`.
    pub fn kind_name(&self) -> String {
        match self {
            TensorData::F32(_) => "F32".into(),
            TensorData::F16(_) => "F16".into(),
            TensorData::BF16(_) => "BF16".into(),
            TensorData::Ggml { ty, .. } => ty.name().into(),
            TensorData::Mlx {
                group_size, bits, ..
            } => format!("MLX affine {bits}-bit g{group_size}"),
        }
    }
}

/// The per-layer projections (canonical suffixes, `blk.{i}.<name>.weight`) that ternary models
/// quantize: attention and MLP matrices (not norms, embeddings or the head).
pub const PROJECTIONS: &[&str] = &[
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// One tensor under its canonical name. `shape` is outermost first: a linear weight of
/// `out × in` has shape `[out, in]`; a norm weight has shape `[n]`.
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: TensorData<'a>,
}

impl TensorView<'_> {
    /// Number of rows (outer dimensions folded); 1 for a vector.
    pub fn rows(&self) -> usize {
        if self.shape.len() <= 1 {
            1
        } else {
            self.shape[..self.shape.len() - 1].iter().product()
        }
    }

    /// Length of the innermost (contiguous, input) dimension.
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A set of named tensors (one opened model).
pub trait WeightSource: Send + Sync {
    /// The tensor under its canonical GGUF name, or `None` when the model has no such tensor.
    fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>>;
    /// Every canonical name, sorted.
    fn tensor_names(&self) -> Vec<String>;
    /// One line for `trit info`: container, encodings, anything converted at load.
    fn describe(&self) -> String;
    /// The engine has copied this tensor into its own layout; a mapped source may give its
    /// pages back to the OS (keeps peak memory near one copy of the weights).
    fn release(&self, _name: &str) {}
}

impl dyn WeightSource + '_ {
    /// Like `tensor`, but a missing tensor is `Error::MissingTensor`.
    pub fn require(&self, name: &str) -> Result<TensorView<'_>> {
        self.tensor(name)?
            .ok_or_else(|| Error::MissingTensor(name.to_string()))
    }
}

/// Where the tokenizer comes from.
#[derive(Clone, Debug)]
pub enum TokenizerSource {
    /// A Hugging Face `tokenizer.json`, with its `tokenizer_config.json` when present.
    Json {
        tokenizer: PathBuf,
        config: Option<PathBuf>,
    },
    /// The vocabulary in a GGUF file's `tokenizer.ggml.*` metadata (the file stays open).
    Gguf(Arc<gguf::GgufFile>),
}

/// Sampling defaults shipped with the model. Every field is optional; `source` says where
/// they came from (`"gguf general.sampling.*"`, `"generation_config.json"` or `"none"`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub source: String,
}

/// Everything `open` found for one model.
pub struct ModelFiles {
    pub config: ModelConfig,
    pub weights: Box<dyn WeightSource>,
    pub tokenizer: TokenizerSource,
    pub chat_template: Option<String>,
    pub generation: GenerationDefaults,
    pub path: PathBuf,
    /// `"GGUF"`, `"MLX 2-bit"`, `"unpacked F16"`, …
    pub format_name: String,
    /// Bonsai 2's Walsh–Hadamard rotated basis, when the file declares one.
    pub rotation: Option<rotation::RotationSpec>,
}

/// Load-time policy.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Refuse MLX 2-bit folders that are affine but not ternary (`biases != -scales`),
    /// instead of exposing them for a generic dequantizing path.
    pub require_ternary: bool,
}

/// Opens a `.gguf` file, an MLX 2-bit folder or an unpacked FP16/BF16 safetensors folder.
pub fn open(path: &Path) -> Result<ModelFiles> {
    open_with(path, OpenOptions::default())
}

/// `open` with explicit options.
pub fn open_with(path: &Path, options: OpenOptions) -> Result<ModelFiles> {
    let mut files = open_any(path, options)?;
    if files.config.bitnet {
        bitnet_defaults(&mut files);
    }
    Ok(files)
}

/// BitNet b1.58 ships no chat template (and its GGUFs none either): trit's built-in one
/// (models.md §8); with the Llama-3 vocabulary `<|eot_id|>` ends a turn.
fn bitnet_defaults(files: &mut ModelFiles) {
    use crate::chat::builtin;
    if files.chat_template.is_none() {
        files.chat_template = Some(builtin::BITNET.to_string());
    }
    let eos = &mut files.config.eos;
    if files.config.vocab == builtin::LLAMA3_VOCAB && !eos.contains(&builtin::LLAMA3_EOT) {
        eos.push(builtin::LLAMA3_EOT);
    }
}

fn open_any(path: &Path, options: OpenOptions) -> Result<ModelFiles> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if meta.is_dir() {
        return folder::open_folder(path, options);
    }
    let mut magic = [0u8; 4];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut magic))
        .map_err(|e| Error::io(path, e))?;
    let is_gguf_name = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if (n == 4 && &magic == gguf::GGUF_MAGIC) || is_gguf_name {
        return gguf_source::open_gguf(path, options);
    }
    Err(Error::Unsupported(format!(
        "{}: not a GGUF file (no \"GGUF\" magic) and not a model folder; trit opens a .gguf \
         file, an MLX 2-bit folder or an unpacked FP16/BF16 safetensors folder",
        path.display()
    )))
}
