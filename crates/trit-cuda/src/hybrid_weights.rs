//! A Qwen3.5 hybrid model's weights on the GPU (the CPU loader is `trit::model::qwen35`):
//! ternary projections through the dense loader's `load_stacked` (fused where one input feeds
//! several: q/k/v/z of a DeltaNet layer, q/k/v of a full-attention layer, gate/up), the small
//! per-head pieces (`ssm_alpha`/`ssm_beta` rows, conv taps, decay parameters, norms) as f32.
//! A Hadamard-rotated (Bonsai 2) file's rotations are uploaded alongside (`rotation.rs`), each
//! projection input naming its rotation by index; `ssm_alpha`/`ssm_beta` read the unrotated
//! input, as on the CPU.

use crate::device::Gpu;
use crate::rotation::DevRotations;
use crate::weights::{load_stacked, load_stacked_f32, norm, DevMatrix};
use cudarc::driver::CudaSlice;
use trit::format::config::{HybridConfig, ModelConfig};
use trit::format::rotation::RotationSpec;
use trit::format::WeightSource;
use trit::model::weights::{require, to_f32};
use trit::{Error, Result};

pub struct DevDeltaNet {
    /// q, k, v (the conv channels) then z (the output gate): rows `conv_dim + value_width`.
    pub qkvz: DevMatrix,
    /// Decay input `a` then update-gate input `b`: rows `2·v_heads`.
    pub ab: DevMatrix,
    /// `conv_dim × kernel`, tap `kernel − 1` on the current input.
    pub conv: CudaSlice<f32>,
    pub dt_bias: CudaSlice<f32>,
    /// `−exp(A_log)`.
    pub a_neg: CudaSlice<f32>,
    /// Gated RMSNorm weights (`v_dim`).
    pub norm: CudaSlice<f32>,
    pub out: DevMatrix,
    /// Index among the linear layers (their recurrent state).
    pub slot: usize,
    /// Rotations (indices into `DevHybrid::rotations`) of q/k/v/z's input and of `ssm_out`'s.
    pub rot_in: Option<usize>,
    pub rot_out: Option<usize>,
}

pub struct DevFullAttention {
    /// q‖gate (interleaved per head, `2·nq` rows), then k, then v.
    pub qkv: DevMatrix,
    pub q_norm: CudaSlice<f32>,
    pub k_norm: CudaSlice<f32>,
    pub o: DevMatrix,
    /// Index among the full-attention layers (their KV cache).
    pub slot: usize,
    /// Rotations of q/k/v's input and of o's.
    pub rot_in: Option<usize>,
    pub rot_out: Option<usize>,
}

pub enum DevMixer {
    Linear(Box<DevDeltaNet>),
    Full(Box<DevFullAttention>),
}

pub struct DevHybridLayer {
    pub attn_norm: CudaSlice<f32>,
    pub mixer: DevMixer,
    pub post_norm: CudaSlice<f32>,
    /// gate and up stacked (rows `2·ffn`).
    pub gate_up: DevMatrix,
    pub down: DevMatrix,
    /// Rotations of gate/up's input and of down's.
    pub rot_gu: Option<usize>,
    pub rot_down: Option<usize>,
}

pub struct DevHybrid {
    pub embed: DevMatrix,
    pub layers: Vec<DevHybridLayer>,
    pub final_norm: CudaSlice<f32>,
    /// `None` when tied to the embedding.
    pub head: Option<DevMatrix>,
    pub rotations: DevRotations,
    /// The embedding rows' inverse rotation, and whether to round around it to f16 (MLX packs).
    pub rot_embed: Option<usize>,
    pub embed_f16: bool,
    /// The head's input rotation (the embedding's when tied).
    pub rot_head: Option<usize>,
    /// GGUF `gdn_v_grouped` with tiled value heads: the gated norm writes each head at its
    /// grouped place, where `ssm_out`'s columns expect it (formats.md §8.4).
    pub regroup: bool,
}

impl DevHybrid {
    pub fn head(&self) -> &DevMatrix {
        self.head.as_ref().unwrap_or(&self.embed)
    }

    fn matrices(&self) -> Vec<&DevMatrix> {
        let mut v = Vec::new();
        for l in &self.layers {
            match &l.mixer {
                DevMixer::Linear(m) => v.extend([&m.qkvz, &m.ab, &m.out]),
                DevMixer::Full(m) => v.extend([&m.qkv, &m.o]),
            }
            v.extend([&l.gate_up, &l.down]);
        }
        v
    }

    /// Bytes streamed per decoded token: every matrix and the head once, one embedding row
    /// (the recurrent state, read and written every token, is not counted, as on the CPU).
    pub fn bytes_per_token(&self) -> usize {
        let blocks: usize = self.matrices().iter().map(|m| m.bytes()).sum();
        blocks + self.head().bytes() + self.embed.bytes() / self.embed.rows().max(1)
    }

    pub fn weight_bytes(&self) -> usize {
        let blocks: usize = self.matrices().iter().map(|m| m.bytes()).sum();
        blocks + self.embed.bytes() + self.head.as_ref().map_or(0, |h| h.bytes())
    }
}

/// Uploads a qwen35 model; `hy` is its hybrid config (already checked by the caller), `spec`
/// its rotation if the file is Hadamard-rotated.
pub fn load(
    gpu: &Gpu,
    cfg: &ModelConfig,
    hy: &HybridConfig,
    src: &dyn WeightSource,
    spec: Option<&RotationSpec>,
) -> Result<DevHybrid> {
    let (d, hd) = (cfg.hidden, cfg.head_dim);
    let mut rots = DevRotations::default();
    let one = |n: &str, r, c| vec![(n.to_string(), r, c)];
    let embed = load_stacked(gpu, src, &one("token_embd.weight", cfg.vocab, d))?;
    let mut layers = Vec::with_capacity(cfg.n_layers);
    let (mut n_lin, mut n_full) = (0, 0);
    for (i, &is_linear) in hy.linear.iter().enumerate() {
        let w = |t: &str| format!("blk.{i}.{t}.weight");
        let mixer = if is_linear {
            let (cd, vw, hv) = (hy.conv_dim(), hy.value_width(), hy.v_heads);
            let a_neg = trit::model::qwen35::decay_rates(src, i, hv)?;
            let conv_view = require(src, &w("ssm_conv1d"))?;
            let conv = to_f32(&conv_view)?;
            if conv.len() != cd * hy.conv_kernel {
                return Err(Error::ShapeMismatch {
                    tensor: w("ssm_conv1d"),
                    found: conv_view.shape.clone(),
                    expected: vec![cd, hy.conv_kernel],
                });
            }
            drop(conv_view);
            n_lin += 1;
            DevMixer::Linear(Box::new(DevDeltaNet {
                qkvz: load_stacked(gpu, src, &[(w("attn_qkv"), cd, d), (w("attn_gate"), vw, d)])?,
                ab: load_stacked_f32(gpu, src, &[(w("ssm_alpha"), hv, d), (w("ssm_beta"), hv, d)])?,
                conv: gpu.upload(&conv)?,
                dt_bias: norm(gpu, src, &format!("blk.{i}.ssm_dt.bias"), hv)?,
                a_neg: gpu.upload(&a_neg)?,
                norm: norm(gpu, src, &w("ssm_norm"), hy.v_dim)?,
                out: load_stacked(gpu, src, &one(&w("ssm_out"), d, vw))?,
                slot: n_lin - 1,
                rot_in: rots.shared(gpu, spec, &[&w("attn_qkv"), &w("attn_gate")], d)?,
                rot_out: rots.of(gpu, spec, &w("ssm_out"), vw)?,
            }))
        } else {
            let (nq, nkv) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
            n_full += 1;
            DevMixer::Full(Box::new(DevFullAttention {
                qkv: load_stacked(
                    gpu,
                    src,
                    &[
                        (w("attn_q"), 2 * nq, d),
                        (w("attn_k"), nkv, d),
                        (w("attn_v"), nkv, d),
                    ],
                )?,
                q_norm: norm(gpu, src, &w("attn_q_norm"), hd)?,
                k_norm: norm(gpu, src, &w("attn_k_norm"), hd)?,
                o: load_stacked(gpu, src, &one(&w("attn_output"), d, nq))?,
                slot: n_full - 1,
                rot_in: rots.shared(gpu, spec, &[&w("attn_q"), &w("attn_k"), &w("attn_v")], d)?,
                rot_out: rots.of(gpu, spec, &w("attn_output"), nq)?,
            }))
        };
        let post = trit::format::config::post_norm_name(src, i)?;
        layers.push(DevHybridLayer {
            attn_norm: norm(gpu, src, &w("attn_norm"), d)?,
            mixer,
            post_norm: norm(gpu, src, &format!("blk.{i}.{post}"), d)?,
            gate_up: load_stacked(
                gpu,
                src,
                &[(w("ffn_gate"), cfg.ffn, d), (w("ffn_up"), cfg.ffn, d)],
            )?,
            down: load_stacked(gpu, src, &one(&w("ffn_down"), d, cfg.ffn))?,
            rot_gu: rots.shared(gpu, spec, &[&w("ffn_gate"), &w("ffn_up")], d)?,
            rot_down: rots.of(gpu, spec, &w("ffn_down"), cfg.ffn)?,
        });
    }
    let final_norm = norm(gpu, src, "output_norm.weight", d)?;
    let head = if cfg.tied_embeddings {
        None
    } else {
        Some(load_stacked(gpu, src, &one("output.weight", cfg.vocab, d))?)
    };
    let rot_embed = rots.embedding(gpu, spec, d)?;
    let rot_head = if cfg.tied_embeddings {
        rot_embed
    } else {
        rots.of(gpu, spec, "output.weight", d)?
    };
    // A rotation declared for a weight this graph never rotates means the file and this
    // reader disagree about the model: refused, as on the CPU.
    rots.check_all_used(spec)?;
    gpu.sync()?;
    Ok(DevHybrid {
        embed,
        layers,
        final_norm,
        head,
        rotations: rots,
        rot_embed,
        embed_f16: spec.is_some_and(|s| s.embedding_f16),
        rot_head,
        regroup: hy.v_tiled && spec.is_some_and(|s| s.ssm_out_grouped),
    })
}
