//! The dense decoder shared by the llama, qwen3 and bitnet architectures:
//! `h = x + Attn(RMSNorm(x))`, `x' = h + MLP(RMSNorm(h))`, final RMSNorm, LM head.
//! Architecture files (`llama.rs`, `qwen3.rs`, `bitnet.rs`) only decide which optional pieces
//! exist: per-head q/k norms (qwen3), sub-norms before `o_proj` and `down_proj` and the MLP's
//! activation (bitnet, from `ModelConfig::bitnet` / `ffn_act`).

use super::attention::{attend_batch, AttendSeq};
use super::kv_cache::KvCache;
use super::rope::Rope;
use super::weights::{linear, vector};
use crate::format::config::{Activation, ModelConfig};
use crate::format::WeightSource;
use crate::kernels::{ops, ActQ8, Linear};
use crate::profile::{self, Op};
use crate::threadpool::ThreadPool;
use crate::{Error, Result};

/// Tokens per MLP chunk of a prefill. Smaller chunks save scratch memory (2 × ffn floats per
/// token) but each chunk reads the layer's MLP weights from memory again (9 MiB on the 1.7B
/// shape: ~0.4 ms at 25 GB/s, against ~15 ms of int8 compute for 256 tokens).
const MLP_TOKENS: usize = 256;

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
    /// BitNet: RMSNorm of the attention output (`q_dim` wide) before `o`.
    attn_sub_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    /// BitNet: RMSNorm of `act(gate) ⊙ up` (`ffn` wide) before `down`.
    ffn_sub_norm: Option<Vec<f32>>,
    gate: Linear,
    up: Linear,
    down: Linear,
    /// LoRA side paths (`Transformer::set_adapter`), computed in f32 beside the matmuls.
    lora: Option<Box<super::lora::BlockLora>>,
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
            let sub_norm = |t: &str, n| -> Result<Option<Vec<f32>>> {
                Ok(if cfg.bitnet {
                    Some(vector(src, &name(t), n)?)
                } else {
                    None
                })
            };
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
                attn_sub_norm: sub_norm("attn_sub_norm", nq)?,
                ffn_norm: vector(src, &name("ffn_norm"), d)?,
                ffn_sub_norm: sub_norm("ffn_sub_norm", cfg.ffn)?,
                gate: linear(src, &name("ffn_gate"), cfg.ffn, d)?,
                up: linear(src, &name("ffn_up"), cfg.ffn, d)?,
                down: linear(src, &name("ffn_down"), d, cfg.ffn)?,
                lora: None,
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

    /// Applies a LoRA adapter to every block it names (replacing any earlier one).
    pub fn set_adapter(&mut self, adapter: &super::lora::LoraAdapter) -> Result<()> {
        if self.config.bitnet {
            // The side paths read the MLP's SwiGLU output and the un-normed attention output.
            return Err(Error::Unsupported(
                "LoRA adapters on bitnet models (their sub-norms and relu² MLP have no LoRA \
                 path yet)"
                    .into(),
            ));
        }
        adapter.check(&self.config)?;
        for (i, b) in self.blocks.iter_mut().enumerate() {
            b.lora = adapter.block(i).map(Box::new);
        }
        Ok(())
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
        KvCache::new(c.n_layers, c.n_kv_heads * c.head_dim, n_ctx).with_heads(c.n_kv_heads)
    }

    /// Runs `tokens` at positions `cache.len()..`, appends their keys/values to the cache and
    /// returns logits (`vocab` floats for `Logits::Last`, `tokens.len() × vocab` for `All`).
    /// The one-sequence case of [`Transformer::forward_batch`].
    pub fn forward(
        &self,
        pool: &ThreadPool,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<Vec<f32>> {
        super::one_sequence(tokens, cache, which, |s| self.run(pool, s, false))
    }

    /// Runs several sequences in one pass, each after what its own cache holds. The rows of
    /// every sequence are stacked so each weight matrix is read once per call for all of them
    /// (continuous batching); only attention runs per sequence, against its own cache.
    /// Returns each sequence's logits, in order. Nothing is computed if any input is invalid.
    pub fn forward_batch(
        &self,
        pool: &ThreadPool,
        seqs: &mut [BatchSeq<'_>],
    ) -> Result<Vec<Vec<f32>>> {
        self.run(pool, seqs, false)
    }

    /// [`forward`](Self::forward) returning the final-normed hidden states of the rows `which`
    /// asks for (`hidden` floats each: the LM head's input, what embeddings pool) instead of
    /// their logits.
    pub fn hidden_states(
        &self,
        pool: &ThreadPool,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<Vec<f32>> {
        super::one_sequence(tokens, cache, which, |s| self.run(pool, s, true))
    }

    /// The layers for every sequence, then the head (or, `hidden`, only the final norm, exact
    /// in f32) on the rows each asks for.
    fn run(
        &self,
        pool: &ThreadPool,
        seqs: &mut [BatchSeq<'_>],
        hidden: bool,
    ) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        for s in seqs.iter() {
            super::check_input(s.tokens, s.cache, c.vocab)?;
        }
        // Row range of each sequence in the stacked activations.
        let mut starts = Vec::with_capacity(seqs.len() + 1);
        starts.push(0);
        for s in seqs.iter() {
            starts.push(starts.last().unwrap() + s.tokens.len());
        }
        let n = *starts.last().unwrap();
        if n == 0 {
            return Err(Error::InvalidArgument("no tokens to evaluate".into()));
        }
        let d = c.hidden;
        let embed_probe = profile::start(Op::Residual, 0);
        let mut x = vec![0f32; n * d];
        for (si, s) in seqs.iter().enumerate() {
            for (t, &tok) in s.tokens.iter().enumerate() {
                let row = starts[si] + t;
                self.embed
                    .dequantize_row(tok as usize, &mut x[row * d..(row + 1) * d]);
            }
        }
        drop(embed_probe);
        let rope_probe = profile::start(Op::Rope, 0);
        let mut angles = Vec::with_capacity(n);
        for s in seqs.iter() {
            let pos0 = s.cache.len();
            angles.extend((0..s.tokens.len()).map(|t| self.rope.angles(pos0 + t)));
        }
        drop(rope_probe);
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
        let mut g = vec![0f32; n.min(MLP_TOKENS) * c.ffn];
        let mut u = vec![0f32; n.min(MLP_TOKENS) * c.ffn];
        // One int8 quantization per matmul input, shared by q/k/v and by gate/up.
        let mut xq = ActQ8::new();
        let exact = |ls: &[&Linear]| ls.iter().any(|l| l.needs_exact());
        for (li, b) in self.blocks.iter().enumerate() {
            let probe = profile::start(Op::ActQuant, 0);
            xq.quantize_rms_norm(
                Some(pool),
                &x,
                &b.attn_norm,
                c.norm_eps,
                n,
                exact(&[&b.q, &b.k, &b.v]),
            );
            drop(probe);
            let qkv = [(&b.q, &mut q[..]), (&b.k, &mut k[..]), (&b.v, &mut v[..])];
            matmul_fused(pool, Op::MatQ, &xq, qkv);
            if let Some(l) = &b.lora {
                l.attn_in(&x, &b.attn_norm, c.norm_eps, [&mut q, &mut k, &mut v]);
            }
            // QK norms (Qwen3) and RoPE, one pass per token row, rows split over the pool (a
            // batched step has 8+ rows; one row stays on the caller).
            let probe = profile::start(Op::Rope, 0);
            let rows = crate::kernels::PAR_ROWS;
            let items: Vec<_> = q
                .chunks_mut(nq * rows)
                .zip(k.chunks_mut(nkv * rows))
                .zip(angles.chunks(rows))
                .collect();
            crate::kernels::par_items(pool, items, &|((qc, kc), ac)| {
                for (t, (cos, sin)) in ac.iter().enumerate() {
                    for (x, w, width) in [(&mut *qc, &b.q_norm, nq), (&mut *kc, &b.k_norm, nkv)] {
                        for head in x[t * width..(t + 1) * width].chunks_exact_mut(hd) {
                            if let Some(w) = w {
                                norm_in_place(head, w, c.norm_eps);
                            }
                            self.rope.apply_angles(head, cos, sin);
                        }
                    }
                }
            });
            drop(probe);
            let probe = profile::start(Op::Attention, 0);
            for (si, s) in seqs.iter_mut().enumerate() {
                let (r0, r1) = (starts[si], starts[si + 1]);
                s.cache
                    .append(li, &k[r0 * nkv..r1 * nkv], &v[r0 * nkv..r1 * nkv]);
            }
            // Every sequence against its own cache, in one dispatch over the pool.
            let parts: Vec<AttendSeq<'_>> = seqs
                .iter()
                .enumerate()
                .map(|(si, s)| AttendSeq {
                    q: &q[starts[si] * nq..starts[si + 1] * nq],
                    cache: s.cache,
                    pos0: s.cache.len(),
                    n: s.tokens.len(),
                })
                .collect();
            attend_batch(pool, c, li, &parts, &mut att);
            drop(probe);
            match &b.attn_sub_norm {
                Some(w) => {
                    let _p = profile::start(Op::ActQuant, 0);
                    let keep = b.o.needs_exact();
                    xq.quantize_rms_norm(Some(pool), &att, w, c.norm_eps, n, keep);
                }
                None => quantize(pool, &mut xq, &att, n, &b.o),
            }
            matmul(pool, Op::MatO, &b.o, &xq, &mut h);
            if let Some(l) = &b.lora {
                l.o_from(&att, &mut h);
            }
            residual(&mut x, &h);

            // The MLP in chunks of tokens: its two ffn-wide buffers are the largest scratch of
            // a prefill (2 × 512 × 6144 floats = 24 MiB on the 1.7B shape).
            for t0 in (0..n).step_by(MLP_TOKENS) {
                let m = (n - t0).min(MLP_TOKENS);
                let (g, u) = (&mut g[..m * c.ffn], &mut u[..m * c.ffn]);
                let probe = profile::start(Op::ActQuant, 0);
                let rows = &x[t0 * d..(t0 + m) * d];
                let keep = exact(&[&b.gate, &b.up]);
                xq.quantize_rms_norm(Some(pool), rows, &b.ffn_norm, c.norm_eps, m, keep);
                drop(probe);
                matmul_fused(
                    pool,
                    Op::MatGate,
                    &xq,
                    [(&b.gate, &mut *g), (&b.up, &mut *u)],
                );
                if let Some(l) = &b.lora {
                    l.mlp_in(rows, &b.ffn_norm, c.norm_eps, [&mut *g, &mut *u]);
                }
                if c.ffn_act == Activation::ReluSq || b.ffn_sub_norm.is_some() {
                    // BitNet: act(gate) ⊙ up written out, then (sub-)normed and quantized.
                    let probe = profile::start(Op::SwiGlu, 0);
                    gated_product(c.ffn_act, g, u);
                    drop(probe);
                    let _p = profile::start(Op::ActQuant, 0);
                    let keep = b.down.needs_exact();
                    match &b.ffn_sub_norm {
                        Some(w) => xq.quantize_rms_norm(Some(pool), g, w, c.norm_eps, m, keep),
                        None => xq.quantize_from_on(Some(pool), g, m, c.ffn, keep),
                    }
                } else if b.lora.is_some() {
                    // The adapter's down path reads the SwiGLU output itself.
                    let probe = profile::start(Op::SwiGlu, 0);
                    ops::silu_mul_on(pool, g, u, c.ffn);
                    drop(probe);
                    quantize(pool, &mut xq, g, m, &b.down);
                } else {
                    let _p = profile::start(Op::SwiGlu, 0);
                    let keep = b.down.needs_exact();
                    xq.quantize_silu_mul(Some(pool), g, u, m, c.ffn, keep);
                }
                matmul(
                    pool,
                    Op::MatDown,
                    &b.down,
                    &xq,
                    &mut h[t0 * d..(t0 + m) * d],
                );
                if let Some(l) = &b.lora {
                    l.down_from(g, &mut h[t0 * d..(t0 + m) * d]);
                }
            }
            residual(&mut x, &h);
        }
        for s in seqs.iter_mut() {
            s.cache.advance(s.tokens.len());
        }

        // The rows that need logits, all sequences together through one head matmul.
        let mut wanted = Vec::new();
        for (si, s) in seqs.iter().enumerate() {
            match s.logits {
                Logits::Last => wanted.push(starts[si + 1] - 1..starts[si + 1]),
                Logits::All => wanted.push(starts[si]..starts[si + 1]),
            }
        }
        let mut rows = Vec::new();
        for r in &wanted {
            rows.extend_from_slice(&x[r.start * d..r.end * d]);
        }
        if hidden {
            for row in rows.chunks_exact_mut(d) {
                norm_in_place(row, &self.final_norm, c.norm_eps);
            }
            return Ok(wanted
                .iter()
                .scan(0, |at, r| {
                    let part = rows[*at * d..(*at + r.len()) * d].to_vec();
                    *at += r.len();
                    Some(part)
                })
                .collect());
        }
        let m = rows.len() / d;
        let head = self.head.as_ref().unwrap_or(&self.embed);
        let probe = profile::start(Op::ActQuant, 0);
        xq.quantize_rms_norm(
            Some(pool),
            &rows,
            &self.final_norm,
            c.norm_eps,
            m,
            head.needs_exact(),
        );
        drop(probe);
        let mut logits = vec![0f32; m * c.vocab];
        matmul(pool, Op::MatHead, head, &xq, &mut logits);
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for r in &wanted {
            out.push(logits[at * c.vocab..(at + r.len()) * c.vocab].to_vec());
            at += r.len();
        }
        Ok(out)
    }
}

/// One sequence's share of a batched forward: `tokens` run after what `cache` holds.
pub struct BatchSeq<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
    pub logits: Logits,
}

/// `l` applied to the activations in `xq`, timed as `op` when profiling.
fn matmul(pool: &ThreadPool, op: Op, l: &Linear, xq: &ActQ8, y: &mut [f32]) {
    let _p = profile::start(op, (l.rows() * l.cols() * xq.n()) as u64);
    l.forward_q8(pool, xq, y);
}

/// The layers of `parts` (one input width) on the same activations in one pool dispatch,
/// timed together as `op`.
fn matmul_fused<const N: usize>(
    pool: &ThreadPool,
    op: Op,
    xq: &ActQ8,
    mut parts: [(&Linear, &mut [f32]); N],
) {
    let work = parts
        .iter()
        .map(|(l, _)| l.rows() * l.cols())
        .sum::<usize>()
        * xq.n();
    let _p = profile::start(op, work as u64);
    Linear::forward_q8_fused(pool, xq, &mut parts);
}

/// Quantizes `n` rows of `x` for `l`.
fn quantize(pool: &ThreadPool, xq: &mut ActQ8, x: &[f32], n: usize, l: &Linear) {
    let _p = profile::start(Op::ActQuant, 0);
    xq.quantize_from_on(Some(pool), x, n, l.cols(), l.needs_exact());
}

/// `gate ← act(gate) ⊙ up`, element-wise.
fn gated_product(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => ops::silu_mul(gate, up),
        Activation::ReluSq => {
            for (g, &u) in gate.iter_mut().zip(up) {
                let r = g.max(0.0);
                *g = r * r * u;
            }
        }
    }
}

fn residual(x: &mut [f32], h: &[f32]) {
    let _p = profile::start(Op::Residual, 0);
    ops::add_inplace(x, h);
}

fn norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    // Lane-wise sum (vectorizes); a sequential sum of squares was ~0.4 ms of an 8-row step.
    let mean_sq = ops::dot(x, x) / x.len() as f32;
    let inv = 1.0 / (mean_sq + eps).sqrt();
    for (v, g) in x.iter_mut().zip(w) {
        *v *= inv * g;
    }
}
