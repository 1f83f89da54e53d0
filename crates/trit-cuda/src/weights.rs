//! The dense model's weights on the GPU: ternary matrices repacked (`repack.rs`) from the same
//! `TernaryRows` views the CPU loader uses, other matrices dequantized to f32 exactly as the
//! CPU loader does (`trit::model::weights::to_linear`), norms as f32 vectors.

use crate::device::{cuda_err, Gpu};
use crate::gemv::TernaryArgs;
use crate::repack::{self, PackedScales, PackedTernary};
use cudarc::driver::{CudaSlice, CudaStream};
use trit::format::config::{Arch, ModelConfig};
use trit::format::{Dtype, TensorData, TensorView, WeightSource};
use trit::kernels::{DenseMatrix, Linear};
use trit::model::weights::{require, tensor_scale, to_linear_scaled, vector};
use trit::quant::bitnet::Scaled;
use trit::quant::float::HalfKind;
use trit::quant::{GgmlTernary, MlxTernary, TernaryRows};
use trit::{Error, Result};

pub enum DevScales {
    F16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
}

/// One matrix on the device.
pub enum DevMatrix {
    Ternary {
        rows: usize,
        cols: usize,
        codes: CudaSlice<u32>,
        scales: DevScales,
    },
    Dense {
        rows: usize,
        cols: usize,
        w: CudaSlice<f32>,
    },
    /// f16/bf16 values kept at 2 bytes (BitNet's tied 128k-row bf16 embedding and head: half
    /// the bytes per token of f32), widened in the kernels.
    Half {
        rows: usize,
        cols: usize,
        w: CudaSlice<u16>,
        kind: HalfKind,
    },
}

impl DevMatrix {
    /// A dense (f16/bf16/f32) matrix: its products read f32 activations, not int8 blocks.
    pub(crate) fn is_dense(&self) -> bool {
        matches!(self, DevMatrix::Dense { .. } | DevMatrix::Half { .. })
    }

    /// The kernel arguments of a ternary matrix (`None` for a dense one).
    pub(crate) fn ternary_args(&self, s: &CudaStream) -> Option<TernaryArgs> {
        match self {
            DevMatrix::Ternary {
                rows,
                cols,
                codes,
                scales,
            } => Some(TernaryArgs::new(*rows, *cols, codes, scales, s)),
            DevMatrix::Dense { .. } | DevMatrix::Half { .. } => None,
        }
    }
}

impl DevMatrix {
    pub fn rows(&self) -> usize {
        match self {
            DevMatrix::Ternary { rows, .. }
            | DevMatrix::Dense { rows, .. }
            | DevMatrix::Half { rows, .. } => *rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            DevMatrix::Ternary { cols, .. }
            | DevMatrix::Dense { cols, .. }
            | DevMatrix::Half { cols, .. } => *cols,
        }
    }

    pub fn is_ternary(&self) -> bool {
        matches!(self, DevMatrix::Ternary { .. })
    }

    /// Bytes read by one product (all of the matrix).
    pub fn bytes(&self) -> usize {
        match self {
            DevMatrix::Ternary {
                rows, cols, scales, ..
            } => {
                let n = rows * cols / repack::BLOCK;
                n * 16
                    + n * match scales {
                        DevScales::F16(_) => 2,
                        DevScales::F32(_) => 4,
                    }
            }
            DevMatrix::Dense { rows, cols, .. } => rows * cols * 4,
            DevMatrix::Half { rows, cols, .. } => rows * cols * 2,
        }
    }
}

/// One transformer block's weights.
pub struct DevBlock {
    pub attn_norm: CudaSlice<f32>,
    /// q, k and v stacked (rows `nq + 2·nkv`).
    pub qkv: DevMatrix,
    pub q_norm: Option<CudaSlice<f32>>,
    pub k_norm: Option<CudaSlice<f32>>,
    pub o: DevMatrix,
    /// BitNet: RMSNorm of the attention output (`nq` wide) before `o`.
    pub attn_sub_norm: Option<CudaSlice<f32>>,
    pub ffn_norm: CudaSlice<f32>,
    /// BitNet: RMSNorm of `act(gate) ⊙ up` (`ffn` wide) before `down`.
    pub ffn_sub_norm: Option<CudaSlice<f32>>,
    /// gate and up stacked (rows `2·ffn`).
    pub gate_up: DevMatrix,
    pub down: DevMatrix,
}

pub struct DevWeights {
    pub embed: DevMatrix,
    pub blocks: Vec<DevBlock>,
    pub final_norm: CudaSlice<f32>,
    /// `None` when tied to the embedding.
    pub head: Option<DevMatrix>,
}

impl DevWeights {
    pub fn head(&self) -> &DevMatrix {
        self.head.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes streamed per decoded token (every matrix and the head once, one embedding row).
    pub fn bytes_per_token(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| b.qkv.bytes() + b.o.bytes() + b.gate_up.bytes() + b.down.bytes())
            .sum();
        blocks + self.head().bytes() + self.embed.bytes() / self.embed.rows().max(1)
    }

    pub fn weight_bytes(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| b.qkv.bytes() + b.o.bytes() + b.gate_up.bytes() + b.down.bytes())
            .sum();
        blocks + self.embed.bytes() + self.head.as_ref().map_or(0, |h| h.bytes())
    }
}

/// A tensor as rows for the packer: ternary, or dense (f32, or f16/bf16 kept at 2 bytes).
enum Part<'a> {
    Ternary(Box<dyn TernaryRows + 'a>),
    Dense(DenseMatrix),
}

/// `factor`: the tensor's per-tensor scale (`tensor_scale`: BitNet's, GGUF `<name>.scale`),
/// multiplied into every weight as the CPU loader does.
fn part<'a>(view: &TensorView<'a>, rows: usize, cols: usize, factor: f32) -> Result<Part<'a>> {
    let scaled = |t: Box<dyn TernaryRows + 'a>| -> Part<'a> {
        if factor == 1.0 {
            Part::Ternary(t)
        } else {
            Part::Ternary(Box::new(Scaled { inner: t, factor }))
        }
    };
    if view.shape != [rows, cols] {
        return Err(Error::ShapeMismatch {
            tensor: view.name.clone(),
            found: view.shape.clone(),
            expected: vec![rows, cols],
        });
    }
    match &view.data {
        TensorData::Ggml { ty, bytes } if ty.reads_as_ternary() => {
            Ok(scaled(Box::new(GgmlTernary::new(*ty, bytes, rows, cols)?)))
        }
        TensorData::Mlx {
            codes,
            scales,
            biases,
            scale_dtype,
            group_size,
            bits: bits @ (1 | 2),
        } if matches!(scale_dtype, Dtype::F16 | Dtype::BF16) => {
            let half = if *scale_dtype == Dtype::F16 {
                HalfKind::F16
            } else {
                HalfKind::BF16
            };
            let m =
                MlxTernary::with_bits(codes, scales, biases, half, rows, cols, *group_size, *bits)?;
            if m.check_ternary().is_ok() {
                Ok(scaled(Box::new(m)))
            } else {
                dense_part(view, rows, cols, factor)
            }
        }
        _ => dense_part(view, rows, cols, factor),
    }
}

/// Dequantized exactly as the CPU loader does (same function).
fn dense_part<'a>(
    view: &TensorView<'_>,
    rows: usize,
    cols: usize,
    factor: f32,
) -> Result<Part<'a>> {
    match to_linear_scaled(view, factor)? {
        Linear::Dense(d) if d.rows() == rows && d.cols() == cols => Ok(Part::Dense(d)),
        Linear::Dense(_) => Err(Error::ShapeMismatch {
            tensor: view.name.clone(),
            found: view.shape.clone(),
            expected: vec![rows, cols],
        }),
        Linear::Ternary(_) => Err(Error::Unsupported(format!(
            "tensor '{}': unexpected ternary layout",
            view.name
        ))),
    }
}

/// Loads tensors `names` (each `rows × cols`, one `cols`) as one stacked device matrix:
/// ternary when all are, f16/bf16 when all are of one of those, else dense f32 (ternary parts
/// dequantized).
pub(crate) fn load_stacked(
    gpu: &Gpu,
    src: &dyn WeightSource,
    names: &[(String, usize, usize)],
) -> Result<DevMatrix> {
    load_stacked_as(gpu, src, names, true)
}

/// [`load_stacked`] with half-precision parts widened to f32 (the hybrid's a/b rows, which its
/// DeltaNet kernels read as f32).
pub(crate) fn load_stacked_f32(
    gpu: &Gpu,
    src: &dyn WeightSource,
    names: &[(String, usize, usize)],
) -> Result<DevMatrix> {
    load_stacked_as(gpu, src, names, false)
}

fn load_stacked_as(
    gpu: &Gpu,
    src: &dyn WeightSource,
    names: &[(String, usize, usize)],
    keep_half: bool,
) -> Result<DevMatrix> {
    let views = names
        .iter()
        .map(|(n, _, _)| require(src, n))
        .collect::<Result<Vec<_>>>()?;
    let parts = views
        .iter()
        .zip(names)
        .map(|(v, (n, r, c))| part(v, *r, *c, tensor_scale(src, n)?))
        .collect::<Result<Vec<_>>>()?;
    let all_ternary = parts.iter().all(|p| matches!(p, Part::Ternary(_)));
    let m = if all_ternary {
        let rows: Vec<&dyn TernaryRows> = parts
            .iter()
            .map(|p| match p {
                Part::Ternary(t) => t.as_ref() as &dyn TernaryRows,
                Part::Dense(..) => unreachable!("checked above"),
            })
            .collect();
        upload_ternary(gpu, &repack::pack(&rows)?)?
    } else if let Some((bits, kind)) = half_parts(&parts).filter(|_| keep_half) {
        DevMatrix::Half {
            rows: parts.iter().map(part_rows).sum(),
            cols: names[0].2,
            w: gpu.upload(&bits)?,
            kind,
        }
    } else {
        let cols = names[0].2;
        let mut data = Vec::new();
        let mut rows = 0;
        let mut row = vec![0f32; cols];
        for p in &parts {
            match p {
                Part::Dense(d) => {
                    for r in 0..d.rows() {
                        d.dequantize_row(r, &mut row);
                        data.extend_from_slice(&row);
                    }
                }
                Part::Ternary(t) => {
                    let packed = repack::pack(&[t.as_ref()])?;
                    for r in 0..packed.rows {
                        packed.dequantize_row(r, &mut row);
                        data.extend_from_slice(&row);
                    }
                }
            }
            rows += part_rows(p);
        }
        DevMatrix::Dense {
            rows,
            cols,
            w: gpu.upload(&data)?,
        }
    };
    drop(parts);
    drop(views);
    for (n, _, _) in names {
        src.release(n);
    }
    Ok(m)
}

fn part_rows(p: &Part<'_>) -> usize {
    match p {
        Part::Ternary(t) => t.rows(),
        Part::Dense(d) => d.rows(),
    }
}

/// The parts' f16/bf16 values stacked, when every part is half precision of one kind.
fn half_parts(parts: &[Part<'_>]) -> Option<(Vec<u16>, HalfKind)> {
    let mut out = Vec::new();
    let mut kind = None;
    for p in parts {
        let Part::Dense(d) = p else { return None };
        let (bits, k) = d.half_bits()?;
        if kind.is_some_and(|was| was != k) {
            return None;
        }
        kind = Some(k);
        out.extend_from_slice(bits);
    }
    Some((out, kind?))
}

fn upload_ternary(gpu: &Gpu, p: &PackedTernary) -> Result<DevMatrix> {
    let scales = match &p.scales {
        PackedScales::F16(s) => DevScales::F16(gpu.upload(s)?),
        PackedScales::F32(s) => DevScales::F32(gpu.upload(s)?),
    };
    Ok(DevMatrix::Ternary {
        rows: p.rows,
        cols: p.cols,
        codes: gpu.upload(&p.codes)?,
        scales,
    })
}

pub(crate) fn norm(
    gpu: &Gpu,
    src: &dyn WeightSource,
    name: &str,
    n: usize,
) -> Result<CudaSlice<f32>> {
    gpu.upload(&vector(src, name, n)?)
}

/// Uploads a llama, bitnet or qwen3 model (the dense decoders of `trit::model::transformer`).
pub fn load(gpu: &Gpu, cfg: &ModelConfig, src: &dyn WeightSource) -> Result<DevWeights> {
    let qk_norm = match cfg.arch {
        Arch::Qwen3 => true,
        Arch::Llama => false,
        Arch::Qwen35 => {
            return Err(Error::Unsupported(
                "qwen35 (hybrid) models load through hybrid_weights.rs, not the dense loader"
                    .into(),
            ))
        }
    };
    let (d, hd) = (cfg.hidden, cfg.head_dim);
    let (nq, nkv) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
    let one = |n: &str, r, c| vec![(n.to_string(), r, c)];
    let embed = load_stacked(gpu, src, &one("token_embd.weight", cfg.vocab, d))?;
    let mut blocks = Vec::with_capacity(cfg.n_layers);
    for i in 0..cfg.n_layers {
        let name = |t: &str| format!("blk.{i}.{t}.weight");
        let sub_norm = |t: &str, n| -> Result<Option<CudaSlice<f32>>> {
            cfg.bitnet.then(|| norm(gpu, src, &name(t), n)).transpose()
        };
        blocks.push(DevBlock {
            attn_norm: norm(gpu, src, &name("attn_norm"), d)?,
            qkv: load_stacked(
                gpu,
                src,
                &[
                    (name("attn_q"), nq, d),
                    (name("attn_k"), nkv, d),
                    (name("attn_v"), nkv, d),
                ],
            )?,
            q_norm: if qk_norm {
                Some(norm(gpu, src, &name("attn_q_norm"), hd)?)
            } else {
                None
            },
            k_norm: if qk_norm {
                Some(norm(gpu, src, &name("attn_k_norm"), hd)?)
            } else {
                None
            },
            o: load_stacked(gpu, src, &one(&name("attn_output"), d, nq))?,
            attn_sub_norm: sub_norm("attn_sub_norm", nq)?,
            ffn_norm: norm(gpu, src, &name("ffn_norm"), d)?,
            ffn_sub_norm: sub_norm("ffn_sub_norm", cfg.ffn)?,
            gate_up: load_stacked(
                gpu,
                src,
                &[(name("ffn_gate"), cfg.ffn, d), (name("ffn_up"), cfg.ffn, d)],
            )?,
            down: load_stacked(gpu, src, &one(&name("ffn_down"), d, cfg.ffn))?,
        });
    }
    let final_norm = norm(gpu, src, "output_norm.weight", d)?;
    let head = if cfg.tied_embeddings {
        None
    } else {
        Some(load_stacked(gpu, src, &one("output.weight", cfg.vocab, d))?)
    };
    gpu.sync()
        .map_err(|e| cuda_err("uploading the weights", e))?;
    Ok(DevWeights {
        embed,
        blocks,
        final_norm,
        head,
    })
}
