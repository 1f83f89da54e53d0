//! `trit convert`: lossless repacks between every ternary format trit reads (GGUF PQ2_0,
//! PTQ1_0, TQ2_0, TQ1_0, Q2_0, legacy Q2_0 g128, MLX 2-bit folders, unpacked FP16/BF16 folders),
//! and `quantize`: full-precision Hugging Face weights → ternary by per-group absmean.
//!
//! A repack decodes each ternary tensor to codes + scales (`ternary::TernaryMatrix`), re-blocks
//! it for the target's group size and refuses, naming the tensor, row and block, whenever a
//! target block can not hold its source groups exactly (two different 128-group scales inside
//! one 256-block of TQ2_0, a scale that is not an f16 value, code 3 in a base-3 format). With
//! `allow_lossy` it converts anyway and reports the error it introduced per tensor.
//! Non-ternary tensors keep their precision; config, tokenizer, chat template and sampling
//! defaults are carried across (`meta`).

mod meta;
mod output;
pub mod quantize;
pub mod ternary;

use crate::format::config::{Arch, ModelConfig};
use crate::format::gguf_write::GgufWriter;
use crate::format::{self, Dtype, ModelFiles, TensorData, TensorView, TokenizerSource};
use crate::quant::{self, GgmlType, HalfKind};
use crate::{Error, Result};
use output::OutData;
use std::path::Path;
pub use ternary::{ErrorStats, TernaryMatrix};

/// What `trit convert --to` produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// One GGUF file with every ternary tensor in this block type.
    Gguf(GgmlType),
    /// An MLX 2-bit folder (group 128, `bias = -scale`), loadable by mlx-lm.
    Mlx,
}

impl Target {
    pub const NAMES: &'static str = "gguf-pq2, gguf-ptq1, gguf-tq2, gguf-tq1, gguf-q2, mlx";

    pub fn parse(s: &str) -> Result<Target> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "gguf-pq2" | "pq2_0" => Target::Gguf(GgmlType::PQ2_0),
            "gguf-ptq1" | "ptq1_0" => Target::Gguf(GgmlType::PTQ1_0),
            "gguf-tq2" | "tq2_0" => Target::Gguf(GgmlType::TQ2_0),
            "gguf-tq1" | "tq1_0" => Target::Gguf(GgmlType::TQ1_0),
            "gguf-q2" | "q2_0" => Target::Gguf(GgmlType::Q2_0),
            "mlx" => Target::Mlx,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown target '{other}' (known: {})",
                    Self::NAMES
                )))
            }
        })
    }

    pub fn name(self) -> String {
        match self {
            Target::Gguf(ty) => format!("GGUF {}", ty.name()),
            Target::Mlx => "MLX 2-bit".into(),
        }
    }

    /// Columns per scale in the target, and whether it stores base-3 digits (no code 3).
    fn group(self) -> (usize, bool) {
        match self {
            Target::Gguf(ty) => (
                ty.block_size(),
                matches!(ty, GgmlType::PTQ1_0 | GgmlType::TQ1_0),
            ),
            Target::Mlx => (128, false),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct ConvertOptions {
    pub target: Target,
    /// Convert even when a target block can not hold its source exactly (then report the error).
    pub allow_lossy: bool,
}

/// What happened to one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorReport {
    pub name: String,
    pub shape: Vec<usize>,
    pub from: String,
    pub to: String,
    /// Set for ternary tensors: the error the conversion introduced (all zero when lossless).
    pub error: Option<ErrorStats>,
}

/// Summary of one conversion (the `--json` output).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvertReport {
    pub source_format: String,
    pub target: String,
    pub tensors: Vec<TensorReport>,
    /// True when at least one block could not be represented exactly.
    pub lossy: bool,
    pub bytes_written: u64,
}

/// Progress callback: `(tensors done, tensors in total, current tensor)`.
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize, &str);

/// GGUF-style tensor order: embedding, layers in numeric order, then the output tensors.
fn order_key(name: &str) -> (usize, usize, String) {
    if let Some(rest) = name.strip_prefix("blk.") {
        let (layer, sub) = rest.split_once('.').unwrap_or((rest, ""));
        return (1, layer.parse().unwrap_or(usize::MAX), sub.to_string());
    }
    let group = if name.starts_with("token_embd") { 0 } else { 2 };
    (group, 0, name.to_string())
}

/// Row order of llama Q/K: GGUF files hold them permuted per head for adjacent-pair RoPE
/// (llama.cpp's converter), Hugging Face folders in rotate-half order. `to_gguf` gives the
/// permutation folder → GGUF, otherwise its inverse. `perm[new] = old`.
fn llama_qk_perm(rows: usize, n_heads: usize, to_gguf: bool) -> Vec<usize> {
    let hd = rows / n_heads;
    let half = hd / 2;
    (0..rows)
        .map(|new| {
            let (h, k) = (new / hd, new % hd);
            let other = if to_gguf {
                (k % 2) * half + k / 2
            } else {
                2 * (k % half) + k / half
            };
            h * hd + other
        })
        .collect()
}

/// The permutation a tensor needs between the two conventions, if any.
fn qk_perm(cfg: &ModelConfig, name: &str, rows: usize, to_gguf: bool) -> Option<Vec<usize>> {
    // BitNet GGUFs keep Q/K in the Hugging Face order (NeoX RoPE), as llama.cpp's converter.
    if cfg.arch != Arch::Llama || cfg.bitnet {
        return None;
    }
    let heads = if name.ends_with(".attn_q.weight") {
        cfg.n_heads
    } else if name.ends_with(".attn_k.weight") {
        cfg.n_kv_heads
    } else {
        return None;
    };
    Some(llama_qk_perm(rows, heads, to_gguf))
}

/// Dense values of a non-ternary tensor (for targets that can not keep its encoding).
fn dense_values(view: &TensorView<'_>) -> Result<Vec<f32>> {
    let n = view.n_elements();
    let mut out = vec![0f32; n];
    match view.data {
        TensorData::F32(b) => quant::float::dequantize_f32(b, &mut out),
        TensorData::F16(b) => quant::float::dequantize_f16(b, &mut out),
        TensorData::BF16(b) => quant::float::dequantize_bf16(b, &mut out),
        TensorData::Ggml { ty, bytes } => {
            let (rows, cols) = (view.rows(), view.cols());
            let rb = ty.row_bytes(cols);
            for r in 0..rows {
                quant::dequantize(
                    ty,
                    &bytes[r * rb..(r + 1) * rb],
                    cols,
                    &mut out[r * cols..(r + 1) * cols],
                )?;
            }
        }
        TensorData::Mlx { bits, .. } => {
            return Err(Error::Unsupported(format!(
                "tensor '{}': MLX {bits}-bit affine tensors have no lossless target; trit \
                 converts ternary (2-bit, bias = -scale) modules",
                view.name
            )))
        }
    }
    Ok(out)
}

/// The narrowest of F16, BF16, F32 that holds every value exactly.
fn exact_plain(values: &[f32]) -> OutData {
    let fits = |k: HalfKind| values.iter().all(|&v| k.from_f32_exact(v).is_ok());
    let (dtype, bytes) = if fits(HalfKind::F16) {
        (Dtype::F16, quant::float::encode_f16(values))
    } else if fits(HalfKind::BF16) {
        (Dtype::BF16, quant::float::encode_bf16(values))
    } else {
        (Dtype::F32, quant::float::encode_f32(values))
    };
    OutData::Plain { dtype, bytes }
}

/// A non-ternary tensor for the target: GGUF keeps the encoding (vectors become F32, as
/// llama.cpp expects of norms), MLX gets the narrowest exact float type.
fn convert_plain(view: &TensorView<'_>, target: Target) -> Result<OutData> {
    let plain = |dtype, b: &[u8]| OutData::Plain {
        dtype,
        bytes: b.to_vec(),
    };
    Ok(match (target, view.data) {
        (Target::Gguf(_), TensorData::Ggml { ty, bytes }) => OutData::Ggml {
            ty,
            bytes: bytes.to_vec(),
        },
        (Target::Gguf(_), TensorData::F16(_) | TensorData::BF16(_)) if view.shape.len() <= 1 => {
            OutData::Plain {
                dtype: Dtype::F32,
                bytes: quant::float::encode_f32(&dense_values(view)?),
            }
        }
        (_, TensorData::F16(b)) => plain(Dtype::F16, b),
        (_, TensorData::BF16(b)) => plain(Dtype::BF16, b),
        (Target::Gguf(_), TensorData::F32(b)) => plain(Dtype::F32, b),
        _ => exact_plain(&dense_values(view)?),
    })
}

/// Encodes one ternary tensor for the target, or refuses a lossy one.
fn convert_ternary(
    name: &str,
    m: &TernaryMatrix,
    target: Target,
    allow_lossy: bool,
) -> Result<(OutData, ErrorStats)> {
    let (group, trits) = target.group();
    let re = ternary::reblock(m, group, trits)
        .map_err(|e| Error::Unsupported(format!("tensor '{name}': {e}")))?;
    if let (Some(b), false) = (&re.first_lossy, allow_lossy) {
        return Err(Error::Unsupported(format!(
            "converting to {} would lose information: tensor '{name}', row {}, block {} \
             (columns {}..{}): {} ({} of {} blocks in this tensor are affected). \
             Pass --allow-lossy to convert anyway and get the error report",
            target.name(),
            b.row,
            b.block,
            b.block * group,
            (b.block + 1) * group,
            b.reason,
            re.stats.lossy_blocks,
            re.stats.blocks
        )));
    }
    let data = match target {
        Target::Gguf(ty) => OutData::Ggml {
            ty,
            bytes: quant::ternary::encode_matrix(ty, m.rows, m.cols, &re.codes, &re.scales64())
                .map_err(|e| Error::Format(format!("tensor '{name}': {e}")))?,
        },
        Target::Mlx => {
            let (codes, scales, biases) = quant::mlx2::encode_ternary(
                m.rows,
                m.cols,
                group,
                &re.codes,
                &re.scales,
                HalfKind::F16,
            )
            .map_err(|e| Error::Format(format!("tensor '{name}': {e}")))?;
            OutData::Mlx {
                codes,
                scales,
                biases,
            }
        }
    };
    Ok((data, re.stats))
}

/// Where the source's tokenizer and metadata live.
enum SourceKind<'a> {
    Gguf(&'a format::gguf::GgufFile),
    Folder,
}

fn source_kind(files: &ModelFiles) -> SourceKind<'_> {
    match &files.tokenizer {
        TokenizerSource::Gguf(f) => SourceKind::Gguf(f),
        TokenizerSource::Json { .. } => SourceKind::Folder,
    }
}

/// Converts the model at `input` into `output` (a `.gguf` file, or a folder for MLX).
pub fn convert(
    input: &Path,
    output: &Path,
    opts: &ConvertOptions,
    progress: Progress<'_>,
) -> Result<ConvertReport> {
    let files = format::open(input)?;
    convert_files(&files, input, output, opts, None, progress)
}

/// Ternarizes one full-precision tensor, returning the matrix and its quantization error.
type TernarizeFn<'a> = &'a dyn Fn(&str, &TensorView<'_>) -> Result<(TernaryMatrix, ErrorStats)>;

/// What `quantize` ternarizes: `applies` says which tensors (known before any is encoded, so
/// the output can be laid out first), `run` ternarizes one.
pub(crate) struct Quantizer<'a> {
    pub applies: &'a dyn Fn(&str) -> bool,
    pub run: TernarizeFn<'a>,
}

/// Whether a tensor is written as ternary.
fn is_ternary(view: &TensorView<'_>, quantizer: Option<&Quantizer<'_>>) -> bool {
    quantizer.is_some_and(|q| (q.applies)(&view.name))
        || matches!(view.data, TensorData::Ggml { ty, .. } if ty.reads_as_ternary())
        || matches!(view.data, TensorData::Mlx { bits: 1 | 2, .. })
}

/// The GGUF type a non-ternary tensor gets (the rule of `convert_plain`, without its data).
fn gguf_plain_type(view: &TensorView<'_>) -> Result<GgmlType> {
    Ok(match view.data {
        TensorData::Ggml { ty, .. } => ty,
        TensorData::F16(_) | TensorData::BF16(_) if view.shape.len() <= 1 => GgmlType::F32,
        TensorData::F16(_) => GgmlType::F16,
        TensorData::BF16(_) => GgmlType::BF16,
        TensorData::F32(_) => GgmlType::F32,
        TensorData::Mlx { .. } => return Err(dense_values(view).unwrap_err()),
    })
}

/// The safetensors dtype a non-ternary tensor gets in an MLX folder (reads F32/block data to
/// find the narrowest exact type).
fn mlx_plain_dtype(view: &TensorView<'_>) -> Result<Dtype> {
    Ok(match view.data {
        TensorData::F16(_) => Dtype::F16,
        TensorData::BF16(_) => Dtype::BF16,
        _ => match exact_plain(&dense_values(view)?) {
            OutData::Plain { dtype, .. } => dtype,
            _ => unreachable!("exact_plain gives plain data"),
        },
    })
}

/// Encodes the tensors of one conversion, one at a time and in the order asked for.
struct Encoder<'a> {
    files: &'a ModelFiles,
    opts: &'a ConvertOptions,
    quantizer: Option<&'a Quantizer<'a>>,
    crosses: bool,
    reports: Vec<TensorReport>,
    lossy: bool,
    bytes: u64,
}

impl Encoder<'_> {
    fn encode(&mut self, name: &str) -> Result<OutData> {
        let files = self.files;
        let to_gguf = matches!(self.opts.target, Target::Gguf(_));
        let view = files.weights.require(name)?;
        let from = view.data.kind_name();
        let made = match self.quantizer {
            Some(q) if (q.applies)(name) => Some((q.run)(name, &view)?),
            _ => None,
        };
        let ternary = match made {
            Some((m, stats)) => Some((m, Some(stats))),
            None => TernaryMatrix::read_packed(&view)?.map(|m| (m, None)),
        };
        let (data, error) = match ternary {
            Some((mut m, quantized)) => {
                if self.crosses {
                    if let Some(p) = qk_perm(&files.config, name, m.rows, to_gguf) {
                        m = m.permute_rows(&p);
                    }
                }
                let (d, s) = convert_ternary(name, &m, self.opts.target, self.opts.allow_lossy)?;
                self.lossy |= s.lossy_blocks > 0;
                // A quantized tensor's error is the quantization's; its packing is exact.
                (d, Some(quantized.unwrap_or(s)))
            }
            None => {
                if self.crosses && qk_perm(&files.config, name, view.rows(), to_gguf).is_some() {
                    return Err(Error::Unsupported(format!(
                        "tensor '{name}': a non-ternary llama Q/K projection can not be \
                         re-ordered between GGUF and folder conventions"
                    )));
                }
                (convert_plain(&view, self.opts.target)?, None)
            }
        };
        files.weights.release(name);
        self.bytes += data.bytes() as u64;
        self.reports.push(TensorReport {
            name: name.to_string(),
            shape: view.shape.clone(),
            from,
            to: data.kind_name(),
            error,
        });
        Ok(data)
    }
}

/// The conversion of opened `files` (their folder or file at `input`).
fn convert_files(
    files: &ModelFiles,
    input: &Path,
    output: &Path,
    opts: &ConvertOptions,
    quantizer: Option<&Quantizer<'_>>,
    progress: Progress<'_>,
) -> Result<ConvertReport> {
    let same = input.canonicalize().ok();
    if same.is_some() && same == output.canonicalize().ok() {
        return Err(Error::InvalidArgument(
            "the output path is the input path; write the conversion somewhere else".into(),
        ));
    }
    if files.config.bitnet && opts.target == Target::Mlx {
        // MLX has no BitNet layout (mlx-lm's bitnet model reads the Hugging Face folder).
        return Err(Error::Unsupported(format!(
            "{}: a bitnet model converts to GGUF only (its per-tensor scales and sub-norms have \
             no MLX 2-bit layout)",
            input.display()
        )));
    }
    let kind = source_kind(files);
    let to_gguf = matches!(opts.target, Target::Gguf(_));
    let crosses = match kind {
        SourceKind::Gguf(_) => !to_gguf,
        SourceKind::Folder => to_gguf,
    };
    if crosses && (files.config.arch == Arch::Qwen35 || files.rotation.is_some()) {
        return Err(Error::Unsupported(format!(
            "{} ({}): qwen35 hybrids and Hadamard-rotated packs convert between GGUF block \
             types only (GGUF and MLX order their linear-attention heads and store the \
             rotation differently)",
            input.display(),
            files.format_name
        )));
    }
    if !crosses && !to_gguf && (files.rotation.is_some() || files.config.arch == Arch::Qwen35) {
        return Err(Error::Unsupported(
            "re-packing a qwen35 or Hadamard-rotated MLX folder is not supported".into(),
        ));
    }
    let mut names = files.weights.tensor_names();
    match kind {
        SourceKind::Gguf(f) => names = f.tensors().iter().map(|t| t.name.clone()).collect(),
        SourceKind::Folder => names.sort_by_key(|n| order_key(n)),
    }
    // Lay the output out first (every tensor's type and size), then encode and write one
    // tensor at a time: memory stays near one tensor, not the whole model.
    let mut layout = Vec::with_capacity(names.len());
    for name in &names {
        let view = files.weights.require(name)?;
        let ternary = is_ternary(&view, quantizer);
        let plain = match (opts.target, ternary) {
            (_, true) => None,
            (Target::Gguf(_), false) => Some(output::Layout::Gguf(gguf_plain_type(&view)?)),
            (Target::Mlx, false) => Some(output::Layout::Mlx(mlx_plain_dtype(&view)?)),
        };
        layout.push(output::Planned {
            name: name.clone(),
            shape: view.shape.clone(),
            plain,
        });
    }
    let mut enc = Encoder {
        files,
        opts,
        quantizer,
        crosses,
        reports: Vec::with_capacity(names.len()),
        lossy: false,
        bytes: 0,
    };
    let total = names.len();
    let mut next = |i: usize| {
        progress(i, total, &names[i]);
        enc.encode(&names[i])
    };
    match opts.target {
        Target::Gguf(ty) => {
            let mut w = GgufWriter::new();
            match kind {
                SourceKind::Gguf(f) => meta::copy_gguf_metadata(f, &mut w)?,
                SourceKind::Folder => meta::gguf_metadata_from_folder(files, input, &mut w)?,
            }
            output::write_gguf(&w, &layout, ty, output, &mut next)?;
        }
        Target::Mlx => {
            std::fs::create_dir_all(output).map_err(|e| Error::io(output, e))?;
            // Side files first: a tokenizer that can not be carried fails before the weights.
            match kind {
                SourceKind::Gguf(_) => meta::folder_files_from_gguf(files, output)?,
                SourceKind::Folder => meta::copy_folder_files(input, output)?,
            }
            output::write_mlx_weights(&layout, output, &mut next)?;
        }
    }
    progress(total, total, "done");
    Ok(ConvertReport {
        source_format: files.format_name.clone(),
        target: opts.target.name(),
        tensors: enc.reports,
        lossy: enc.lossy,
        bytes_written: enc.bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_permutations_are_inverse_and_match_the_converter() {
        // One head of 4 rows: llama.cpp's converter order is rows [0, 2, 1, 3].
        assert_eq!(llama_qk_perm(4, 1, true), [0, 2, 1, 3]);
        let to = llama_qk_perm(16, 2, true);
        let back = llama_qk_perm(16, 2, false);
        for (new, &old) in to.iter().enumerate() {
            assert_eq!(back[old], new);
        }
    }

    #[test]
    fn targets_parse_and_order_is_gguf_like() {
        assert_eq!(
            Target::parse("gguf-tq2").unwrap(),
            Target::Gguf(GgmlType::TQ2_0)
        );
        assert_eq!(Target::parse("MLX").unwrap(), Target::Mlx);
        assert!(Target::parse("gguf-q4")
            .unwrap_err()
            .to_string()
            .contains("gguf-pq2"));
        let mut v = vec![
            "output.weight",
            "blk.10.attn_q.weight",
            "blk.2.ffn_up.weight",
            "token_embd.weight",
        ];
        v.sort_by_key(|n| order_key(n));
        assert_eq!(
            v,
            [
                "token_embd.weight",
                "blk.2.ffn_up.weight",
                "blk.10.attn_q.weight",
                "output.weight"
            ]
        );
    }
}
