//! Qwen3.5 hybrid decoder (Bonsai 27B, Bonsai 2; models.md §3): per layer
//! `h = x + Mixer(RMSNorm(x))`, `x' = h + MLP(RMSNorm(h))`, where the mixer is a Gated
//! DeltaNet linear attention (`gated_delta.rs`) on most layers and a gated full attention with
//! partial RoPE on every `full_attention_interval`-th. Norm weights are the effective ones
//! (the converters add HF's `1 +`), the gated norm is plain.
//!
//! Full-attention layers keep keys/values in the `KvCache` (indexed by their rank among the
//! full layers); linear layers keep their conv and delta-rule state in the cache's
//! `RecurrentState`, updated in place.

use super::attention::{attend_batch, AttendSeq};
use super::gated_delta::{self as gd, HeadInputs};
use super::kv_cache::KvCache;
use super::lora::LoraAdapter;
use super::recurrent::RecurrentState;
use super::rope::Rope;
use super::rotation::{Projector, RotatedLinear, Rotations};
use super::transformer::{BatchSeq, Logits};
use super::weights::{require, to_f32, vector};
use crate::format::config::{HybridConfig, ModelConfig, RopeStyle};
use crate::format::WeightSource;
use crate::kernels::{ops, Linear};
use crate::profile::{self, Op};
use crate::threadpool::ThreadPool;
use crate::{Error, Result};
use std::sync::Mutex;

struct DeltaNet {
    qkv: RotatedLinear,
    z: RotatedLinear,
    /// Per-head decay and update-gate inputs: never rotated, read the unrotated input.
    a: Linear,
    b: Linear,
    /// `conv_dim × kernel`.
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    /// `−exp(A_log)` (GGUF's `ssm_a`), so `ln g = a_neg · softplus(a + dt_bias)`.
    a_neg: Vec<f32>,
    norm: Vec<f32>,
    out: RotatedLinear,
    /// Index into `RecurrentState::layers`.
    slot: usize,
}

struct FullAttention {
    /// Rows: per head `head_dim` query values then `head_dim` gate values.
    q: RotatedLinear,
    k: RotatedLinear,
    v: RotatedLinear,
    o: RotatedLinear,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    /// Index into the KV cache's layers.
    slot: usize,
}

enum Mixer {
    Linear(DeltaNet),
    Full(FullAttention),
}

struct Layer {
    attn_norm: Vec<f32>,
    mixer: Mixer,
    post_norm: Vec<f32>,
    gate: RotatedLinear,
    up: RotatedLinear,
    down: RotatedLinear,
}

pub struct Qwen35 {
    pub config: ModelConfig,
    hy: HybridConfig,
    rot: Rotations,
    embed: Linear,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    /// `None` when the head is tied to the embedding.
    head: Option<RotatedLinear>,
    rope: Rope,
    /// LoRA side paths (`set_adapter`), in the file's value-head order, computed in f32
    /// beside the projections on the same inputs.
    lora: Option<LoraAdapter>,
}

impl Qwen35 {
    pub fn load(cfg: &ModelConfig, src: &dyn WeightSource, rot: Rotations) -> Result<Self> {
        let hy = cfg
            .hybrid
            .clone()
            .ok_or_else(|| Error::Config("qwen35 model without its hybrid config".into()))?;
        let (d, hd) = (cfg.hidden, cfg.head_dim);
        let embed = super::weights::linear(src, "token_embd.weight", cfg.vocab, d)?;
        let lin = |name: &str, rows: usize, cols: usize| rot.linear(src, name, rows, cols);
        let mut layers = Vec::with_capacity(cfg.n_layers);
        let (mut n_lin, mut n_full) = (0, 0);
        for (i, &is_linear) in hy.linear.iter().enumerate() {
            let w = |t: &str| format!("blk.{i}.{t}.weight");
            let mixer = if is_linear {
                let (cd, vw, hv) = (hy.conv_dim(), hy.value_width(), hy.v_heads);
                let a_neg = decay_rates(src, i, hv)?;
                let conv_view = require(src, &w("ssm_conv1d"))?;
                let conv = to_f32(&conv_view)?;
                if conv.len() != cd * hy.conv_kernel {
                    return Err(Error::ShapeMismatch {
                        tensor: w("ssm_conv1d"),
                        found: conv_view.shape.clone(),
                        expected: vec![cd, hy.conv_kernel],
                    });
                }
                n_lin += 1;
                Mixer::Linear(DeltaNet {
                    qkv: lin(&w("attn_qkv"), cd, d)?,
                    z: lin(&w("attn_gate"), vw, d)?,
                    a: super::weights::linear(src, &w("ssm_alpha"), hv, d)?,
                    b: super::weights::linear(src, &w("ssm_beta"), hv, d)?,
                    conv,
                    dt_bias: vector(src, &format!("blk.{i}.ssm_dt.bias"), hv)?,
                    a_neg,
                    norm: vector(src, &w("ssm_norm"), hy.v_dim)?,
                    out: lin(&w("ssm_out"), d, vw)?,
                    slot: n_lin - 1,
                })
            } else {
                let (nq, nkv) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
                n_full += 1;
                Mixer::Full(FullAttention {
                    q: lin(&w("attn_q"), 2 * nq, d)?,
                    k: lin(&w("attn_k"), nkv, d)?,
                    v: lin(&w("attn_v"), nkv, d)?,
                    o: lin(&w("attn_output"), d, nq)?,
                    q_norm: vector(src, &w("attn_q_norm"), hd)?,
                    k_norm: vector(src, &w("attn_k_norm"), hd)?,
                    slot: n_full - 1,
                })
            };
            let post = crate::format::config::post_norm_name(src, i)?;
            layers.push(Layer {
                attn_norm: vector(src, &w("attn_norm"), d)?,
                mixer,
                post_norm: vector(src, &format!("blk.{i}.{post}"), d)?,
                gate: lin(&w("ffn_gate"), cfg.ffn, d)?,
                up: lin(&w("ffn_up"), cfg.ffn, d)?,
                down: lin(&w("ffn_down"), d, cfg.ffn)?,
            });
        }
        let final_norm = vector(src, "output_norm.weight", d)?;
        let head = if cfg.tied_embeddings {
            None
        } else {
            Some(lin("output.weight", cfg.vocab, d)?)
        };
        rot.check_embedding(d)?;
        // A rotation declared for a weight the graph never rotates (or never reads) means the
        // file and this reader disagree about the model: refuse rather than guess.
        rot.check_all_used(&|name| is_rotatable(&hy, cfg.tied_embeddings, name))?;
        let rope = Rope::new(hy.rotary_dim, cfg.rope_theta, RopeStyle::Neox, None);
        Ok(Qwen35 {
            config: cfg.clone(),
            hy,
            rot,
            embed,
            layers,
            final_norm,
            head,
            rope,
            lora: None,
        })
    }

    /// Applies a LoRA adapter (mlx-lm or PEFT, trained on the Hugging Face model) to the
    /// projections it names, replacing any earlier one.
    pub fn set_adapter(&mut self, adapter: &LoraAdapter) -> Result<()> {
        if !self.rot.is_empty() {
            return Err(Error::Unsupported(
                "LoRA adapters on Hadamard-rotated models (the adapter's matrices are in the \
                 unrotated basis; fuse it into the unrotated weights with `trit convert \
                 --quantize --adapter` instead)"
                    .into(),
            ));
        }
        adapter.check(&self.config)?;
        self.lora = Some(if self.hy.v_tiled {
            adapter.to_tiled_value_heads(&self.hy)
        } else {
            adapter.clone()
        });
        Ok(())
    }

    /// `out += scale · B·(A·x)` for the adapter's pair of projection `sub` in `layer`, over
    /// the `n` rows of `x` the projection itself read.
    fn lora_add(&self, layer: usize, sub: &str, x: &[f32], n: usize, out: &mut [f32]) {
        if let Some(p) = self.lora.as_ref().and_then(|a| a.pair(layer, sub)) {
            p.add_to(x, n, out);
        }
    }

    fn matrices(&self) -> Vec<&Linear> {
        let mut v = Vec::new();
        for l in &self.layers {
            match &l.mixer {
                Mixer::Linear(m) => {
                    v.extend([&m.qkv.lin, &m.z.lin, &m.a, &m.b, &m.out.lin]);
                }
                Mixer::Full(m) => v.extend([&m.q.lin, &m.k.lin, &m.v.lin, &m.o.lin]),
            }
            v.extend([&l.gate.lin, &l.up.lin, &l.down.lin]);
        }
        v
    }

    pub fn weight_bytes(&self) -> usize {
        let blocks: usize = self.matrices().iter().map(|l| l.bytes()).sum();
        blocks + self.embed.bytes() + self.head.as_ref().map_or(0, |h| h.lin.bytes())
    }

    /// Bytes streamed per decoded token: every matrix and the head once, one embedding row.
    pub fn bytes_per_token(&self) -> usize {
        let blocks: usize = self.matrices().iter().map(|l| l.bytes()).sum();
        let head = self.head.as_ref().map_or(&self.embed, |h| &h.lin).bytes();
        blocks + head + self.embed.bytes() / self.config.vocab.max(1)
    }

    pub fn new_cache(&self, n_ctx: usize) -> KvCache {
        let (c, h) = (&self.config, &self.hy);
        let state = RecurrentState::new(
            h.n_linear(),
            (h.conv_kernel - 1) * h.conv_dim(),
            h.v_heads * h.v_dim * h.k_dim,
        );
        KvCache::new(h.n_full(), c.n_kv_heads * c.head_dim, n_ctx)
            .with_heads(c.n_kv_heads)
            .with_recurrent(state)
    }

    /// Runs `tokens` at positions `cache.len()..`, updating the KV cache and the recurrent
    /// state, and returns logits as `Transformer::forward` does.
    pub fn forward(
        &self,
        pool: &ThreadPool,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<Vec<f32>> {
        super::one_sequence(tokens, cache, which, |s| self.run(pool, s, false))
    }

    /// Several sequences in one pass (as `Transformer::forward_batch`): their rows stacked
    /// through every projection, the DeltaNet recurrence and the attention per sequence on its
    /// own state and cache; logits in `seqs` order.
    pub fn forward_batch(
        &self,
        pool: &ThreadPool,
        seqs: &mut [BatchSeq<'_>],
    ) -> Result<Vec<Vec<f32>>> {
        self.run(pool, seqs, false)
    }

    /// [`forward`](Self::forward) returning the final-normed hidden states of the rows `which`
    /// asks for (the head's input; in a rotated model's basis, which keeps their dot products)
    /// instead of their logits.
    pub fn hidden_states(
        &self,
        pool: &ThreadPool,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<Vec<f32>> {
        super::one_sequence(tokens, cache, which, |s| self.run(pool, s, true))
    }

    /// The layers for every sequence, then the final norm and (unless `hidden`) the head.
    fn run(
        &self,
        pool: &ThreadPool,
        seqs: &mut [BatchSeq<'_>],
        hidden: bool,
    ) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        for s in seqs.iter() {
            super::check_input(s.tokens, s.cache, c.vocab)?;
            if !s.cache.has_recurrent() {
                return Err(Error::InvalidArgument(
                    "a hybrid model needs a cache made by its own new_cache".into(),
                ));
            }
        }
        // Row range of each sequence in the stacked activations, and its first position.
        let mut starts = vec![0];
        for s in seqs.iter() {
            starts.push(starts.last().unwrap() + s.tokens.len());
        }
        let n = *starts.last().unwrap();
        if n == 0 {
            return Err(Error::InvalidArgument("no tokens to evaluate".into()));
        }
        let rows = Rows {
            starts,
            pos0: seqs.iter().map(|s| s.cache.len()).collect(),
        };
        let d = c.hidden;
        let mut x = vec![0f32; n * d];
        let probe = profile::start(Op::Residual, 0);
        let tokens = seqs.iter().flat_map(|s| s.tokens.iter());
        for (row, &tok) in x.chunks_exact_mut(d).zip(tokens) {
            self.embed.dequantize_row(tok as usize, row);
            self.rot.unrotate_embedding(row);
        }
        drop(probe);
        let mut h = vec![0f32; n * d];
        let mut mixed = vec![0f32; n * d];
        let mut g = vec![0f32; n * c.ffn];
        let mut u = vec![0f32; n * c.ffn];
        for (li, layer) in self.layers.iter().enumerate() {
            norm_rows(&x, &layer.attn_norm, c.norm_eps, &mut h);
            match &layer.mixer {
                Mixer::Linear(m) => self.delta_net(pool, li, m, &h, &rows, seqs, &mut mixed),
                Mixer::Full(m) => self.full_attention(pool, li, m, &h, &rows, seqs, &mut mixed),
            }
            residual(&mut x, &mixed);
            norm_rows(&x, &layer.post_norm, c.norm_eps, &mut h);
            Projector::new(pool, &h, n).run_fused(
                Op::MatGate,
                [(&layer.gate, &mut g[..]), (&layer.up, &mut u[..])],
            );
            self.lora_add(li, "ffn_gate", &h, n, &mut g);
            self.lora_add(li, "ffn_up", &h, n, &mut u);
            let probe = profile::start(Op::SwiGlu, 0);
            ops::silu_mul(&mut g, &u);
            drop(probe);
            Projector::new(pool, &g, n).run(Op::MatDown, &layer.down, &mut mixed);
            self.lora_add(li, "ffn_down", &g, n, &mut mixed);
            residual(&mut x, &mixed);
        }
        for s in seqs.iter_mut() {
            s.cache.advance(s.tokens.len());
        }

        // The rows whose logits are asked for, through the final norm and the head at once.
        let wanted: Vec<usize> = seqs
            .iter()
            .enumerate()
            .flat_map(|(i, s)| match s.logits {
                Logits::Last => rows.starts[i + 1] - 1..rows.starts[i + 1],
                Logits::All => rows.starts[i]..rows.starts[i + 1],
            })
            .collect();
        let m = wanted.len();
        let mut normed = vec![0f32; m * d];
        for (out, &r) in normed.chunks_exact_mut(d).zip(&wanted) {
            norm_rows(&x[r * d..(r + 1) * d], &self.final_norm, c.norm_eps, out);
        }
        // Each sequence's share of the rows: its last, or all of its tokens.
        let counts = seqs.iter().map(|s| match s.logits {
            Logits::Last => 1,
            Logits::All => s.tokens.len(),
        });
        if hidden {
            let mut at = 0;
            return Ok(counts
                .map(|k| {
                    at += k;
                    normed[(at - k) * d..at * d].to_vec()
                })
                .collect());
        }
        let mut logits = vec![0f32; m * c.vocab];
        match &self.head {
            Some(head) => Projector::new(pool, &normed, m).run(Op::MatHead, head, &mut logits),
            None => {
                self.rot.rotate_for_tied_head(&mut normed);
                let work = self.embed.rows() * self.embed.cols() * m;
                let _p = profile::start(Op::MatHead, work as u64);
                self.embed.forward(pool, &normed, m, &mut logits)
            }
        }
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for k in counts {
            out.push(logits[at * c.vocab..(at + k) * c.vocab].to_vec());
            at += k;
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn full_attention(
        &self,
        pool: &ThreadPool,
        li: usize,
        m: &FullAttention,
        h: &[f32],
        rows: &Rows,
        seqs: &mut [BatchSeq<'_>],
        out: &mut [f32],
    ) {
        let c = &self.config;
        let (hd, nh) = (c.head_dim, c.n_heads);
        let (nq, nkv) = (nh * hd, c.n_kv_heads * hd);
        let n = rows.total();
        let mut qg = vec![0f32; n * 2 * nq];
        let mut k = vec![0f32; n * nkv];
        let mut v = vec![0f32; n * nkv];
        Projector::new(pool, h, n).run_fused(
            Op::MatQ,
            [(&m.q, &mut qg[..]), (&m.k, &mut k[..]), (&m.v, &mut v[..])],
        );
        self.lora_add(li, "attn_q", h, n, &mut qg);
        self.lora_add(li, "attn_k", h, n, &mut k);
        self.lora_add(li, "attn_v", h, n, &mut v);
        let probe = profile::start(Op::Rope, 0);
        let rot = self.hy.rotary_dim;
        let mut q = vec![0f32; n * nq];
        let mut gate = vec![0f32; n * nq];
        for t in 0..n {
            let (cos, sin) = self.rope.angles(rows.position(t));
            for head in 0..nh {
                let src = &qg[(t * nh + head) * 2 * hd..(t * nh + head + 1) * 2 * hd];
                let qh = &mut q[(t * nh + head) * hd..(t * nh + head + 1) * hd];
                ops::rms_norm(&src[..hd], &m.q_norm, c.norm_eps, qh);
                self.rope.apply_angles(&mut qh[..rot], &cos, &sin);
                gate[(t * nh + head) * hd..(t * nh + head + 1) * hd].copy_from_slice(&src[hd..]);
            }
            for kh in k[t * nkv..(t + 1) * nkv].chunks_exact_mut(hd) {
                let raw = kh.to_vec();
                ops::rms_norm(&raw, &m.k_norm, c.norm_eps, kh);
                self.rope.apply_angles(&mut kh[..rot], &cos, &sin);
            }
        }
        drop(probe);
        let probe = profile::start(Op::Attention, 0);
        for (i, s) in seqs.iter_mut().enumerate() {
            let r = rows.range(i);
            s.cache.append(
                m.slot,
                &k[r.start * nkv..r.end * nkv],
                &v[r.start * nkv..r.end * nkv],
            );
        }
        let att_seqs: Vec<AttendSeq> = seqs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let r = rows.range(i);
                AttendSeq {
                    q: &q[r.start * nq..r.end * nq],
                    cache: &*s.cache,
                    pos0: rows.pos0[i],
                    n: r.len(),
                }
            })
            .collect();
        let mut att = vec![0f32; n * nq];
        attend_batch(pool, c, m.slot, &att_seqs, &mut att);
        for (a, &g) in att.iter_mut().zip(&gate) {
            *a *= gd::sigmoid(g);
        }
        drop(probe);
        Projector::new(pool, &att, n).run(Op::MatO, &m.o, out);
        self.lora_add(li, "attn_output", &att, n, out);
    }

    #[allow(clippy::too_many_arguments)]
    fn delta_net(
        &self,
        pool: &ThreadPool,
        li: usize,
        m: &DeltaNet,
        h: &[f32],
        rows: &Rows,
        seqs: &mut [BatchSeq<'_>],
        out: &mut [f32],
    ) {
        let hy = &self.hy;
        let (cd, vw, hv, hk) = (hy.conv_dim(), hy.value_width(), hy.v_heads, hy.k_heads);
        let (dk, dv) = (hy.k_dim, hy.v_dim);
        let n = rows.total();
        let mut qkv = vec![0f32; n * cd];
        let mut z = vec![0f32; n * vw];
        let mut a = vec![0f32; n * hv];
        let mut b = vec![0f32; n * hv];
        let mut p = Projector::new(pool, h, n);
        p.run(Op::MatQ, &m.qkv, &mut qkv);
        p.run(Op::MatGates, &m.z, &mut z);
        let probe = profile::start(Op::MatGates, (2 * hv * h.len()) as u64);
        m.a.forward(pool, h, n, &mut a);
        m.b.forward(pool, h, n, &mut b);
        drop(probe);
        self.lora_add(li, "attn_qkv", h, n, &mut qkv);
        self.lora_add(li, "attn_gate", h, n, &mut z);
        self.lora_add(li, "ssm_alpha", h, n, &mut a);
        self.lora_add(li, "ssm_beta", h, n, &mut b);
        let probe = profile::start(Op::DeltaRule, 0);
        // Each sequence's conv runs over its own rows with its own window.
        let mut ssm: Vec<&mut [f32]> = Vec::with_capacity(seqs.len());
        for (i, s) in seqs.iter_mut().enumerate() {
            let r = rows.range(i);
            let state = &mut s.cache.recurrent_mut().expect("checked in forward").layers[m.slot];
            gd::causal_conv_silu(
                &mut qkv[r.start * cd..r.end * cd],
                &mut state.conv,
                &m.conv,
                cd,
            );
            ssm.push(&mut state.ssm);
        }
        let kw = hy.key_width();
        for row in qkv.chunks_exact_mut(cd) {
            let (q, rest) = row.split_at_mut(kw);
            let k = &mut rest[..kw];
            for head in q.chunks_exact_mut(dk) {
                gd::l2_normalize(head, 1.0 / (dk as f32).sqrt());
            }
            for head in k.chunks_exact_mut(dk) {
                gd::l2_normalize(head, 1.0);
            }
        }
        // Work items: (sequence, value head), each on its own slice of state.
        let heads: Vec<Mutex<&mut [f32]>> = ssm
            .into_iter()
            .flat_map(|st| st.chunks_mut(dv * dk))
            .map(Mutex::new)
            .collect();
        let outs: Vec<Mutex<Vec<f32>>> = (0..heads.len()).map(|_| Mutex::new(Vec::new())).collect();
        let items = heads.len();
        pool.run(&|tid, nt| {
            for item in (items * tid / nt)..(items * (tid + 1) / nt) {
                let (seq, head) = (item / hv, item % hv);
                let r = rows.range(seq);
                let kh = hy.key_head_of(head);
                let gather = |off: usize, width: usize| -> Vec<f32> {
                    qkv[r.start * cd..r.end * cd]
                        .chunks_exact(cd)
                        .flat_map(|row| row[off..off + width].iter().copied())
                        .collect()
                };
                let q = gather(kh * dk, dk);
                let k = gather(kw + kh * dk, dk);
                let v = gather(2 * kw + head * dv, dv);
                let log_g: Vec<f32> = r
                    .clone()
                    .map(|t| m.a_neg[head] * gd::softplus(a[t * hv + head] + m.dt_bias[head]))
                    .collect();
                let beta: Vec<f32> = r.clone().map(|t| gd::sigmoid(b[t * hv + head])).collect();
                let x = HeadInputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    log_g: &log_g,
                    beta: &beta,
                };
                let mut o = vec![0f32; r.len() * dv];
                let mut s = heads[item].lock().unwrap();
                if r.len() == 1 {
                    gd::recur_steps(&mut s, &x, &mut o);
                } else {
                    gd::recur_chunked(&mut s, &x, &mut o);
                }
                for (i, t) in r.clone().enumerate() {
                    let zh = &z[t * vw + head * dv..t * vw + (head + 1) * dv];
                    gd::gated_rms_norm(
                        &mut o[i * dv..(i + 1) * dv],
                        zh,
                        &m.norm,
                        self.config.norm_eps,
                    );
                }
                *outs[item].lock().unwrap() = o;
            }
        });
        // A rotated GGUF keeps ssm_out's columns in grouped order while the heads above ran
        // in the file's tiled order (formats.md §8.4): place each head where ssm_out expects it.
        let regroup = hy.v_tiled && self.rot.ssm_out_grouped();
        let mut o = vec![0f32; n * vw];
        for (item, part) in outs.into_iter().enumerate() {
            let (seq, head) = (item / hv, item % hv);
            let part = part.into_inner().unwrap();
            let at = if regroup {
                (head % hk) * (hv / hk) + head / hk
            } else {
                head
            };
            for (i, t) in rows.range(seq).enumerate() {
                o[t * vw + at * dv..t * vw + (at + 1) * dv]
                    .copy_from_slice(&part[i * dv..(i + 1) * dv]);
            }
        }
        drop(probe);
        Projector::new(pool, &o, n).run(Op::MatO, &m.out, out);
        self.lora_add(li, "ssm_out", &o, n, out);
    }
}

/// Where each sequence of a batched pass sits among the stacked rows: sequence `i` owns rows
/// `starts[i]..starts[i + 1]`, its first at position `pos0[i]`.
struct Rows {
    starts: Vec<usize>,
    pos0: Vec<usize>,
}

impl Rows {
    fn total(&self) -> usize {
        *self.starts.last().expect("at least the 0 start")
    }

    fn range(&self, seq: usize) -> std::ops::Range<usize> {
        self.starts[seq]..self.starts[seq + 1]
    }

    /// The position of stacked row `t`.
    fn position(&self, t: usize) -> usize {
        let seq = self.starts.partition_point(|&s| s <= t) - 1;
        self.pos0[seq] + t - self.starts[seq]
    }
}

/// Whether `name` is a projection this graph loads through `Rotations::linear`.
/// Layer `layer`'s `−exp(A_log)` per value head, from either spelling files use: `ssm_a`
/// (GGUF, already negated and exponentiated) or `ssm_a_log`.
pub fn decay_rates(src: &dyn WeightSource, layer: usize, heads: usize) -> Result<Vec<f32>> {
    let a_neg = match src.tensor(&format!("blk.{layer}.ssm_a"))? {
        Some(v) => to_f32(&v)?,
        None => vector(src, &format!("blk.{layer}.ssm_a_log"), heads)?
            .iter()
            .map(|&x| -x.exp())
            .collect(),
    };
    if a_neg.len() != heads {
        return Err(Error::ShapeMismatch {
            tensor: format!("blk.{layer}.ssm_a"),
            found: vec![a_neg.len()],
            expected: vec![heads],
        });
    }
    Ok(a_neg)
}

fn is_rotatable(hy: &HybridConfig, tied: bool, name: &str) -> bool {
    if name == "output.weight" {
        return !tied;
    }
    let Some(rest) = name.strip_prefix("blk.") else {
        return false;
    };
    let Some((layer, tensor)) = rest.split_once('.') else {
        return false;
    };
    let Some(&linear) = layer.parse::<usize>().ok().and_then(|i| hy.linear.get(i)) else {
        return false;
    };
    let mixer: &[&str] = if linear {
        &["attn_qkv", "attn_gate", "ssm_out"]
    } else {
        &["attn_q", "attn_k", "attn_v", "attn_output"]
    };
    mixer
        .iter()
        .chain(&["ffn_gate", "ffn_up", "ffn_down"])
        .any(|t| tensor == format!("{t}.weight"))
}

fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let _p = profile::start(Op::Norm, 0);
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        ops::rms_norm(xr, w, eps, or);
    }
}

fn residual(x: &mut [f32], h: &[f32]) {
    let _p = profile::start(Op::Residual, 0);
    ops::add_inplace(x, h);
}
