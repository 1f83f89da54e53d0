//! Batched prefill: a prompt runs through each layer in chunks of up to
//! `CudaOptions::prefill_chunk` tokens, so every weight tile is read once per chunk instead of once per token. The
//! matrix products are the int8 tensor-core GEMM (`kernels/prefill.cu`); norms, SwiGLU and
//! quantization are the decode kernels launched with one block row per token; QK-norm, RoPE
//! and the KV append run for the chunk's positions, then causal attention over the cache. The
//! LM head runs only for the tokens whose logits are asked for (the last one for
//! `Logits::Last`).

use crate::device::{ptr, Arg, Gpu};
use crate::flash::{attn_prefill_kernel, FLASH_QT};
use crate::gemm::launch_ternary_gemm;
use crate::graph::{alloc_host_logits, copy_to_pinned};
use crate::launch;
use crate::model::{CudaModel, Input, State};
use crate::weights::DevMatrix;
use cudarc::driver::{CudaSlice, PinnedHostSlice};
use trit::format::config::{ModelConfig, RopeStyle};
use trit::model::{KvCache, Logits};
use trit::Result;

/// Where a prefill writes keys and values: per layer, the f16 key and value cache of one
/// sequence (`[kv_head][ctx][head_dim]`), and its positions. The single-sequence state's cache,
/// or one slot of the batched path (`batch.rs`).
pub(crate) struct KvTarget {
    pub(crate) k: Vec<u64>,
    pub(crate) v: Vec<u64>,
    pub(crate) ctx: usize,
}

/// Activations of one chunk, token after token.
pub(crate) struct PrefillBuffers {
    chunk: usize,
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    xq: CudaSlice<i8>,
    xm: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    qr: CudaSlice<f32>,
    att: CudaSlice<f32>,
    gu: CudaSlice<f32>,
    h: CudaSlice<f32>,
    /// Logits of up to `HEAD_ROWS` rows and their page-locked copy, made on the first
    /// `Logits::All` (speculative scoring, perplexity).
    rows_out: Option<(CudaSlice<f32>, PinnedHostSlice<f32>)>,
}

/// Rows whose logits one LM-head product computes for `Logits::All` (the head's weights are
/// read once per group instead of once per row; 32 rows of a 152k vocabulary take 19 MB).
const HEAD_ROWS: usize = 32;

impl PrefillBuffers {
    pub(crate) fn new(gpu: &Gpu, c: &ModelConfig, chunk: usize) -> Result<PrefillBuffers> {
        let (d, hd) = (c.hidden, c.head_dim);
        let (nq, nkv) = (c.n_heads * hd, c.n_kv_heads * hd);
        let widest = d.max(nq).max(c.ffn);
        Ok(PrefillBuffers {
            chunk,
            x: gpu.zeros(chunk * d)?,
            xn: gpu.zeros(chunk * d)?,
            xq: gpu.zeros(chunk * widest)?,
            xm: gpu.zeros(chunk * (2 * widest / 64 + 2))?,
            qkv: gpu.zeros(chunk * (nq + 2 * nkv))?,
            qr: gpu.zeros(chunk * nq)?,
            att: gpu.zeros(chunk * nq)?,
            gu: gpu.zeros(chunk * 2 * c.ffn)?,
            h: gpu.zeros(chunk * c.ffn)?,
            rows_out: None,
        })
    }
}

impl CudaModel {
    /// Whether a prompt of `n` tokens takes the batched path: more than one token, a GPU with
    /// int8 tensor cores, and not switched off by TRIT_CUDA_PREFILL=0.
    pub(crate) fn use_prefill(&self, st: &State, n: usize) -> bool {
        n > 1 && self.prefill && st.gpu.compute_capability.0 >= 8
    }

    /// `y (+)= m · rows` for `ntok` token rows of `inp`.
    pub(crate) fn matmul(
        &self,
        st: &State,
        m: &DevMatrix,
        inp: &Input,
        ntok: usize,
        y: u64,
        accumulate: bool,
    ) -> Result<()> {
        let s = &st.gpu.stream;
        match m {
            DevMatrix::Ternary { .. } => {
                let args = m.ternary_args(s).expect("a ternary matrix");
                launch_ternary_gemm(&st.gpu, &args, ntok, inp.q, inp.meta, y, accumulate)
            }
            // Dense matrices (f32/f16/bf16 checkpoints) keep the exact f32 path, each weight
            // read once per 8 rows.
            DevMatrix::Dense { .. } | DevMatrix::Half { .. } => {
                crate::gemv::dense::launch_dense(&st.gpu, m, inp.f32, ntok, y, accumulate)
            }
        }
    }

    /// Runs `tokens` (already uploaded to the token array at `pos0`) through the model in
    /// chunks, keys and values into the single-sequence cache; returns the logits `which`
    /// asks for.
    pub(crate) fn prefill_locked(
        &self,
        st: &mut State,
        tokens: &[u32],
        pos0: usize,
        which: Logits,
    ) -> Result<Vec<f32>> {
        let s = &st.gpu.stream;
        let kv = KvTarget {
            k: st.b.k_cache.iter().map(|c| ptr(c, s)).collect(),
            v: st.b.v_cache.iter().map(|c| ptr(c, s)).collect(),
            ctx: self.ctx,
        };
        self.prefill_into(st, tokens, pos0, which, &kv)
    }

    /// The final-normed hidden states (`hidden` floats per row `which` asks for) of `tokens` as
    /// a sequence of their own from position 0: the prompt path in chunks, keys and values in
    /// scratch memory freed afterwards, the final norm on each chunk's rows in f32 (what
    /// embeddings pool; `ExternalNet::hidden_states`). The single sequence's position counter
    /// is re-uploaded by its next step.
    pub(crate) fn hidden_states_gpu(&self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        let c = &self.config;
        trit::model::check_input(tokens, &KvCache::new(c.n_layers, 0, self.ctx), c.vocab)?;
        let mut guard = self
            .state
            .lock()
            .map_err(|_| trit::Error::Unsupported("CUDA: an earlier step panicked".into()))?;
        let st: &mut State = &mut guard;
        if !self.use_prefill(st, 2) {
            return Err(trit::Error::Unsupported(
                "hidden states on this GPU need its prompt path (int8 tensor cores, compute \
                 capability 8.0+)"
                    .into(),
            ));
        }
        let n = tokens.len();
        let per_layer = c.n_kv_heads * c.head_dim * n;
        let scratch = |_| st.gpu.zeros::<u16>(per_layer);
        let k = (0..c.n_layers).map(scratch).collect::<Result<Vec<_>>>()?;
        let v = (0..c.n_layers).map(scratch).collect::<Result<Vec<_>>>()?;
        let s = st.gpu.stream.clone();
        let kv = KvTarget {
            k: k.iter().map(|b| ptr(b, &s)).collect(),
            v: v.iter().map(|b| ptr(b, &s)).collect(),
            ctx: n,
        };
        self.upload_inputs(st, tokens, 0)?;
        let chunk = self.prefill_buffers(st)?;
        let d = c.hidden;
        let mut out = Vec::new();
        let mut done = 0;
        while done < n {
            let m = chunk.min(n - done);
            self.prefill_chunk(st, done, m, &kv)?;
            done += m;
            let Some(rows) = chunk_rows_wanted(which, m, done, n) else {
                continue;
            };
            let pb = st.prefill.as_ref().expect("allocated above");
            let x = ptr(&pb.x, &s) + (rows.start * d * 4) as u64;
            self.norm_rows(st, &st.w.final_norm, x, rows.len(), true)?;
            let normed = pb.xn.slice(0..rows.len() * d);
            out.extend(
                s.clone_dtoh(&normed)
                    .map_err(|e| crate::device::cuda_err("reading hidden states", e))?,
            );
        }
        st.device_pos = None;
        Ok(out)
    }

    /// The chunk buffers, made on first use; returns the chunk's token count.
    fn prefill_buffers(&self, st: &mut State) -> Result<usize> {
        if st.prefill.is_none() {
            // At 512 tokens (the default) about 100 MB of activations for the 8B shape.
            let chunk = self.prefill_chunk.min(self.ctx).max(1);
            st.prefill = Some(PrefillBuffers::new(&st.gpu, &self.config, chunk)?);
        }
        Ok(st.prefill.as_ref().map_or(1, |p| p.chunk))
    }

    /// `prefill_locked` with keys and values going to `kv`.
    pub(crate) fn prefill_into(
        &self,
        st: &mut State,
        tokens: &[u32],
        pos0: usize,
        which: Logits,
        kv: &KvTarget,
    ) -> Result<Vec<f32>> {
        let chunk = self.prefill_buffers(st)?;
        let mut out = Vec::new();
        let mut done = 0;
        while done < tokens.len() {
            let n = chunk.min(tokens.len() - done);
            let last_chunk = done + n == tokens.len();
            self.prefill_chunk(st, pos0 + done, n, kv)?;
            match which {
                Logits::All => self.heads_of_rows(st, n, &mut out)?,
                Logits::Last if last_chunk => {
                    self.head_of_row(st, n - 1)?;
                    out.extend(self.read_logits(st)?);
                }
                Logits::Last => {}
            }
            done += n;
        }
        st.gpu.sync()?;
        Ok(out)
    }

    /// Every layer for `n` tokens at positions `pos..pos + n`; leaves the final hidden states
    /// in the chunk's `x`.
    fn prefill_chunk(&self, st: &mut State, pos: usize, n: usize, kv: &KvTarget) -> Result<()> {
        {
            let s = st.gpu.stream.clone();
            s.memcpy_htod(&[pos as i32, 0], &mut st.b.step)
                .map_err(|e| crate::device::cuda_err("setting the position", e))?;
        }
        let st: &State = st;
        let c = &self.config;
        let pb = st.prefill.as_ref().expect("allocated by prefill_locked");
        let (g, b, s) = (&st.gpu, &st.b, &st.gpu.stream);
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        let hd = c.head_dim;
        let nq = c.n_heads * hd;
        let step = ptr(&b.step, s);
        let toks = ptr(&b.toks, s);
        let (xq, xm) = (ptr(&pb.xq, s), p(&pb.xm));
        let nt = n as u32;
        launch::embed(g, &st.w.embed, toks, step, p(&pb.x), nt)?;
        let normed = Input {
            f32: p(&pb.xn),
            q: xq,
            meta: xm,
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let attn_kernel = attn_prefill_kernel(hd);
        // Heads of whole 64-column blocks: the attention kernel quantizes its own output.
        let fused_quant = hd.is_multiple_of(64);
        for (li, blk) in st.w.blocks.iter().enumerate() {
            self.norm_rows(st, &blk.attn_norm, p(&pb.x), n, blk.qkv.is_dense())?;
            self.matmul(st, &blk.qkv, &normed, n, p(&pb.qkv), false)?;
            let opt = |v: &Option<CudaSlice<f32>>| v.as_ref().map_or(0, p);
            let (kc, vc) = (kv.k[li], kv.v[li]);
            g.launch(
                "rope_append_batch",
                ((c.n_heads + c.n_kv_heads).div_ceil(4) as u32, nt),
                128,
                &[
                    Arg::Ptr(p(&pb.qkv)),
                    Arg::Ptr(opt(&blk.q_norm)),
                    Arg::Ptr(opt(&blk.k_norm)),
                    Arg::F32(c.norm_eps),
                    Arg::Ptr(p(&b.cos_sin)),
                    Arg::Ptr(step),
                    Arg::I32(c.n_heads as i32),
                    Arg::I32(c.n_kv_heads as i32),
                    Arg::I32(hd as i32),
                    Arg::I32((c.rope_style == RopeStyle::Adjacent) as i32),
                    Arg::Ptr(kc),
                    Arg::Ptr(vc),
                    Arg::I32(kv.ctx as i32),
                    Arg::F32(scale),
                    Arg::Ptr(p(&pb.qr)),
                ],
            )?;
            g.launch(
                attn_kernel,
                (c.n_heads as u32, n.div_ceil(FLASH_QT) as u32),
                128,
                &[
                    Arg::Ptr(p(&pb.qr)),
                    Arg::Ptr(kc),
                    Arg::Ptr(vc),
                    Arg::Ptr(step),
                    Arg::I32(n as i32),
                    Arg::I32(c.n_heads as i32),
                    Arg::I32(c.n_kv_heads as i32),
                    Arg::I32(kv.ctx as i32),
                    Arg::Ptr(p(&pb.att)),
                    Arg::Ptr(xq),
                    Arg::Ptr(xm),
                    Arg::I32(fused_quant as i32),
                ],
            )?;
            if nq.is_multiple_of(64) && !fused_quant {
                // The chunk's rows are contiguous, so its blocks are one flat vector.
                launch::quantize_vec(g, p(&pb.att), n * nq, xq, xm)?;
            }
            if let Some(w) = &blk.attn_sub_norm {
                let dense = blk.o.is_dense();
                launch::sub_norm_quant(g, p(&pb.att), p(w), c.norm_eps, nq, (xq, xm), nt, dense)?;
            }
            let att_in = Input {
                f32: p(&pb.att),
                q: xq,
                meta: xm,
            };
            self.matmul(st, &blk.o, &att_in, n, p(&pb.x), true)?;
            self.norm_rows(st, &blk.ffn_norm, p(&pb.x), n, blk.gate_up.is_dense())?;
            self.matmul(st, &blk.gate_up, &normed, n, p(&pb.gu), false)?;
            // Ternary down projections read only the int8 blocks: the f32 copy (ffn values per
            // token) is written only for a dense one.
            // A sub-norm reads h itself.
            let sub = blk.ffn_sub_norm.as_ref();
            let h_out = launch::QuantOut {
                f32: if blk.down.is_dense() || !c.ffn.is_multiple_of(64) || sub.is_some() {
                    p(&pb.h)
                } else {
                    0
                },
                q: xq,
                meta: xm,
            };
            launch::glu_quant(g, p(&pb.gu), c.ffn, c.ffn_act, h_out, nt)?;
            if let Some(w) = sub {
                let dense = blk.down.is_dense();
                launch::sub_norm_quant(g, p(&pb.h), p(w), c.norm_eps, c.ffn, (xq, xm), nt, dense)?;
            }
            let h_in = Input {
                f32: p(&pb.h),
                q: xq,
                meta: xm,
            };
            self.matmul(st, &blk.down, &h_in, n, p(&pb.x), true)?;
        }
        Ok(())
    }

    /// RMSNorm + int8 quantization of `n` rows of `hidden` values starting at `x`, into the
    /// chunk's `xn`/`xq`/`xm` (row after row).
    /// `f32_needed`: a dense matrix reads the normalized rows themselves (ternary ones read only
    /// the int8 blocks, and the vectorized kernel then skips the f32 copy).
    fn norm_rows(
        &self,
        st: &State,
        w: &CudaSlice<f32>,
        x: u64,
        n: usize,
        f32_needed: bool,
    ) -> Result<()> {
        let s = &st.gpu.stream;
        let pb = st.prefill.as_ref().expect("allocated by prefill_locked");
        let d = self.config.hidden;
        let out = launch::QuantOut {
            f32: if f32_needed || !launch::norm_can_skip_f32(d) {
                ptr(&pb.xn, s)
            } else {
                0
            },
            q: ptr(&pb.xq, s),
            meta: ptr(&pb.xm, s),
        };
        launch::rms_norm_quant(
            &st.gpu,
            x,
            ptr(w, s),
            self.config.norm_eps,
            d,
            out,
            n as u32,
        )
    }

    /// Final norm and LM head of the chunk's row `t` into the logits buffer.
    fn head_of_row(&self, st: &State, t: usize) -> Result<()> {
        let s = &st.gpu.stream;
        let pb = st.prefill.as_ref().expect("allocated by prefill_locked");
        let x = ptr(&pb.x, s) + (t * self.config.hidden * 4) as u64;
        self.norm_rows(st, &st.w.final_norm, x, 1, true)?;
        let normed = Input {
            f32: ptr(&pb.xn, s),
            q: ptr(&pb.xq, s),
            meta: ptr(&pb.xm, s),
        };
        self.gemv(st, st.w.head(), &normed, ptr(&st.b.logits, s), false)
    }

    /// Appends the logits of the chunk's first `n` rows to `out`: the final norm and the LM
    /// head as one product over up to `HEAD_ROWS` rows at a time, one copy per group.
    fn heads_of_rows(&self, st: &mut State, n: usize, out: &mut Vec<f32>) -> Result<()> {
        let (d, vocab) = (self.config.hidden, self.config.vocab);
        if st.prefill.as_ref().is_some_and(|p| p.rows_out.is_none()) {
            let rows = st.gpu.zeros(HEAD_ROWS * vocab)?;
            let host = alloc_host_logits(&st.gpu, HEAD_ROWS * vocab)?;
            st.prefill.as_mut().expect("checked above").rows_out = Some((rows, host));
        }
        let mut t0 = 0;
        while t0 < n {
            let g = HEAD_ROWS.min(n - t0);
            let st_ref: &State = st;
            let s = &st_ref.gpu.stream;
            let pb = st_ref.prefill.as_ref().expect("allocated by prefill_into");
            let x = ptr(&pb.x, s) + (t0 * d * 4) as u64;
            self.norm_rows(st_ref, &st_ref.w.final_norm, x, g, true)?;
            let normed = Input {
                f32: ptr(&pb.xn, s),
                q: ptr(&pb.xq, s),
                meta: ptr(&pb.xm, s),
            };
            let (rows, _) = pb.rows_out.as_ref().expect("made above");
            self.matmul(st_ref, st_ref.w.head(), &normed, g, ptr(rows, s), false)?;
            let pb = st.prefill.as_mut().expect("allocated by prefill_into");
            let (rows, host) = pb.rows_out.as_mut().expect("made above");
            out.extend_from_slice(copy_to_pinned(&st.gpu, &rows.slice(0..g * vocab), host)?);
            t0 += g;
        }
        Ok(())
    }
}

/// The rows of a prompt chunk whose hidden states `which` asks for: the chunk's `m` tokens end
/// at token `done` of `n`; all of them, or the sequence's last (none before the last chunk).
pub(crate) fn chunk_rows_wanted(
    which: Logits,
    m: usize,
    done: usize,
    n: usize,
) -> Option<std::ops::Range<usize>> {
    match which {
        Logits::All => Some(0..m),
        Logits::Last if done == n => Some(m - 1..m),
        Logits::Last => None,
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_rows_wanted;
    use trit::model::Logits;

    #[test]
    fn chunks_give_every_row_or_only_the_sequences_last() {
        // 40 tokens in chunks of 16: 16, 16, 8.
        let chunks = [(16, 16), (16, 32), (8, 40)];
        let all: Vec<_> = chunks
            .iter()
            .map(|&(m, done)| chunk_rows_wanted(Logits::All, m, done, 40))
            .collect();
        assert_eq!(all, vec![Some(0..16), Some(0..16), Some(0..8)]);
        let last: Vec<_> = chunks
            .iter()
            .map(|&(m, done)| chunk_rows_wanted(Logits::Last, m, done, 40))
            .collect();
        assert_eq!(last, vec![None, None, Some(7..8)]);
    }
}
