//! The dense decoder shared by the llama and qwen3 architectures:
//! `h = x + Attn(RMSNorm(x))`, `x' = h + MLP(RMSNorm(h))`, final RMSNorm, LM head.
//! Architecture files (`llama.rs`, `qwen3.rs`) only decide which optional pieces exist.

use super::attention::attend;
use super::kv_cache::KvCache;
use super::rope::Rope;
use super::weights::{linear, vector};
use crate::format::config::ModelConfig;
use crate::format::WeightSource;
use crate::kernels::{ops, Linear};
use crate::threadpool::ThreadPool;
use crate::{Error, Result};

/// Which positions need logits: generation wants the last, perplexity wants all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    Last,
    All,
}

pub struct Block {
    attn_norm: Vec<f32>,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate: Linear,
    up: Linear,
    down: Linear,
}

pub struct Transformer {
    pub config: ModelConfig,
    embed: Linear,
    blocks: Vec<Block>,
    final_norm: Vec<f32>,
    /// `None` when the head is tied to the embedding.
    head: Option<Linear>,
    rope: Rope,
}

impl Transformer {
    pub fn load(cfg: &ModelConfig, src: &dyn WeightSource, qk_norm: bool) -> Result<Self> {
        let (d, hd) = (cfg.hidden, cfg.head_dim);
        let (nq, nkv) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
        let embed = linear(src, "token_embd.weight", cfg.vocab, d)?;
        let mut blocks = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let name = |t: &str| format!("blk.{i}.{t}.weight");
            let norm = |t: &str| vector(src, &name(t), hd);
            blocks.push(Block {
                attn_norm: vector(src, &name("attn_norm"), d)?,
                q: linear(src, &name("attn_q"), nq, d)?,
                k: linear(src, &name("attn_k"), nkv, d)?,
                v: linear(src, &name("attn_v"), nkv, d)?,
                o: linear(src, &name("attn_output"), d, nq)?,
                q_norm: if qk_norm {
                    Some(norm("attn_q_norm")?)
                } else {
                    None
                },
                k_norm: if qk_norm {
                    Some(norm("attn_k_norm")?)
                } else {
                    None
                },
                ffn_norm: vector(src, &name("ffn_norm"), d)?,
                gate: linear(src, &name("ffn_gate"), cfg.ffn, d)?,
                up: linear(src, &name("ffn_up"), cfg.ffn, d)?,
                down: linear(src, &name("ffn_down"), d, cfg.ffn)?,
            });
        }
        let final_norm = vector(src, "output_norm.weight", d)?;
        let head = if cfg.tied_embeddings {
            None
        } else {
            Some(linear(src, "output.weight", cfg.vocab, d)?)
        };
        let rope = Rope::new(
            hd,
            cfg.rope_theta,
            cfg.rope_style,
            cfg.rope_scaling.as_ref(),
        );
        Ok(Transformer {
            config: cfg.clone(),
            embed,
            blocks,
            final_norm,
            head,
            rope,
        })
    }

    fn block_bytes(&self) -> usize {
        let mut n = 0;
        for b in &self.blocks {
            n += [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down]
                .iter()
                .map(|l| l.bytes())
                .sum::<usize>();
        }
        n
    }

    /// Bytes of weights held in memory.
    pub fn weight_bytes(&self) -> usize {
        self.block_bytes() + self.embed.bytes() + self.head.as_ref().map_or(0, |h| h.bytes())
    }

    /// Bytes streamed per decoded token: every matrix and the head once, one embedding row.
    pub fn bytes_per_token(&self) -> usize {
        let head = self.head.as_ref().unwrap_or(&self.embed).bytes();
        self.block_bytes() + head + self.embed.bytes() / self.config.vocab.max(1)
    }

    pub fn new_cache(&self, n_ctx: usize) -> KvCache {
        let c = &self.config;
        KvCache::new(c.n_layers, c.n_kv_heads * c.head_dim, n_ctx)
    }

    /// Runs `tokens` at positions `cache.len()..`, appends their keys/values to the cache and
    /// returns logits (`vocab` floats for `Logits::Last`, `tokens.len() × vocab` for `All`).
    pub fn forward(
        &self,
        pool: &ThreadPool,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let n = tokens.len();
        if n == 0 {
            return Err(Error::InvalidArgument("no tokens to evaluate".into()));
        }
        if cache.len() + n > cache.capacity() {
            return Err(Error::ContextOverflow {
                n_prompt: cache.len() + n,
                n_ctx: cache.capacity(),
            });
        }
        let d = c.hidden;
        let mut x = vec![0f32; n * d];
        for (t, &tok) in tokens.iter().enumerate() {
            if tok as usize >= c.vocab {
                return Err(Error::InvalidArgument(format!(
                    "token id {tok} is outside the vocabulary ({} rows)",
                    c.vocab
                )));
            }
            self.embed
                .dequantize_row(tok as usize, &mut x[t * d..(t + 1) * d]);
        }
        let pos0 = cache.len();
        let angles: Vec<(Vec<f32>, Vec<f32>)> =
            (0..n).map(|t| self.rope.angles(pos0 + t)).collect();
        let (hd, nq, nkv) = (
            c.head_dim,
            c.n_heads * c.head_dim,
            c.n_kv_heads * c.head_dim,
        );
        let mut h = vec![0f32; n * d];
        let mut q = vec![0f32; n * nq];
        let mut k = vec![0f32; n * nkv];
        let mut v = vec![0f32; n * nkv];
        let mut att = vec![0f32; n * nq];
        let mut g = vec![0f32; n * c.ffn];
        let mut u = vec![0f32; n * c.ffn];
        for (li, b) in self.blocks.iter().enumerate() {
            norm_rows(&x, &b.attn_norm, c.norm_eps, &mut h);
            b.q.forward(pool, &h, n, &mut q);
            b.k.forward(pool, &h, n, &mut k);
            b.v.forward(pool, &h, n, &mut v);
            for (t, (cos, sin)) in angles.iter().enumerate() {
                for head in q[t * nq..(t + 1) * nq].chunks_exact_mut(hd) {
                    if let Some(w) = &b.q_norm {
                        norm_in_place(head, w, c.norm_eps);
                    }
                    self.rope.apply_angles(head, cos, sin);
                }
                for head in k[t * nkv..(t + 1) * nkv].chunks_exact_mut(hd) {
                    if let Some(w) = &b.k_norm {
                        norm_in_place(head, w, c.norm_eps);
                    }
                    self.rope.apply_angles(head, cos, sin);
                }
            }
            cache.append(li, &k, &v);
            attend(pool, c, &q, cache, li, pos0, n, &mut att);
            b.o.forward(pool, &att, n, &mut h);
            ops::add_inplace(&mut x, &h);

            norm_rows(&x, &b.ffn_norm, c.norm_eps, &mut h);
            b.gate.forward(pool, &h, n, &mut g);
            b.up.forward(pool, &h, n, &mut u);
            ops::silu_mul(&mut g, &u);
            b.down.forward(pool, &g, n, &mut h);
            ops::add_inplace(&mut x, &h);
        }
        cache.advance(n);

        let rows = match which {
            Logits::Last => &x[(n - 1) * d..],
            Logits::All => &x[..],
        };
        let m = rows.len() / d;
        let mut normed = vec![0f32; m * d];
        norm_rows(rows, &self.final_norm, c.norm_eps, &mut normed);
        let head = self.head.as_ref().unwrap_or(&self.embed);
        let mut logits = vec![0f32; m * c.vocab];
        head.forward(pool, &normed, m, &mut logits);
        Ok(logits)
    }
}

fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        ops::rms_norm(xr, w, eps, or);
    }
}

fn norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (mean_sq + eps).sqrt();
    for (v, g) in x.iter_mut().zip(w) {
        *v *= inv * g;
    }
}
