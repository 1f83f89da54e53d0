//! Batched prompt processing for hybrid models: a prompt runs through each layer in chunks of
//! up to `CudaOptions::prefill_chunk` tokens. The matrix products (q/k/v/z, ssm_out,
//! q‖gate/k/v, o, gate‖up, down) are the int8 tensor-core GEMM of the dense prefill, so each
//! weight tile is read once per chunk instead of once per token; norms, SwiGLU and the int8
//! blocks of the mixers' outputs are the decode kernels over all the chunk's rows. The DeltaNet
//! recurrence runs a whole chunk per value head (`deltanet_chunk.cu`: the state in registers
//! across the tokens), or with `TRIT_CUDA_DN_CHUNK=0` or heads wider than it holds one
//! `deltanet_step` per token with a pointer to the token's position. The gated full attention
//! takes two launches per chunk: `hybrid_attn_prep` appends every token's key and value, then
//! `hybrid_attn_decode` attends for every (head, token) over the positions up to the token's.
//! Bonsai 2's rotated inputs go through `hadamard_quant` over the chunk's rows where the decode
//! step rotates one vector. Models these kernels do not cover (dense projections, the
//! five-kernel DeltaNet) keep the token-by-token path.

use super::step::{AttnIo, DnStepIo};
use super::{upload_feed, CudaHybrid, SeqBufs, State};
use crate::device::{ptr, Arg, Gpu};
use crate::gemm::launch_ternary_gemm;
use crate::hybrid_weights::{DevDeltaNet, DevFullAttention, DevHybridLayer, DevMixer};
use crate::launch::{self, QuantOut};
use crate::rotation::{launch_rotate_rows, RotOut, RotSource};
use crate::weights::DevMatrix;
use cudarc::driver::{CudaSlice, CudaStream};
use trit::format::config::{HybridConfig, ModelConfig};
use trit::model::{KvCache, Logits};
use trit::Result;

/// Activations of one chunk, token after token.
pub(super) struct HybridPrefill {
    pub(super) chunk: usize,
    /// Each token's position (the per-token kernels read their position through a pointer).
    pub(super) pos: CudaSlice<i32>,
    pub(super) x: CudaSlice<f32>,
    pub(super) xn: CudaSlice<f32>,
    pub(super) xq: CudaSlice<i8>,
    pub(super) xm: CudaSlice<f32>,
    pub(super) proj: CudaSlice<f32>,
    pub(super) mixed: CudaSlice<f32>,
    pub(super) gu: CudaSlice<f32>,
    /// (g, β) per token and value head (`deltanet_gates_rows`).
    pub(super) gb: CudaSlice<f32>,
    /// Per token the gated attention's normed, rotated queries and its gates.
    pub(super) q: CudaSlice<f32>,
    pub(super) gate: CudaSlice<f32>,
}

impl HybridPrefill {
    /// The chunk's int8 rows (`xq`/`xm`) as a rotation's only output.
    fn int8_out(&self, s: &CudaStream) -> RotOut {
        RotOut {
            q: ptr(&self.xq, s),
            meta: ptr(&self.xm, s),
            ..RotOut::default()
        }
    }

    fn new(gpu: &Gpu, c: &ModelConfig, hy: &HybridConfig, chunk: usize) -> Result<HybridPrefill> {
        let (d, nq) = (c.hidden, c.n_heads * c.head_dim);
        let nkv = c.n_kv_heads * c.head_dim;
        let vw = hy.value_width();
        let widest = d.max(nq).max(c.ffn).max(vw);
        Ok(HybridPrefill {
            chunk,
            pos: gpu.zeros(chunk)?,
            x: gpu.zeros(chunk * d)?,
            xn: gpu.zeros(chunk * d)?,
            xq: gpu.zeros(chunk * widest)?,
            xm: gpu.zeros(chunk * (2 * widest / 64) + 2)?,
            proj: gpu.zeros(chunk * (hy.conv_dim() + vw).max(2 * nq + 2 * nkv))?,
            mixed: gpu.zeros(chunk * vw.max(nq))?,
            gu: gpu.zeros(chunk * 2 * c.ffn)?,
            gb: gpu.zeros(chunk * 2 * hy.v_heads)?,
            q: gpu.zeros(chunk * nq)?,
            gate: gpu.zeros(chunk * nq)?,
        })
    }
}

/// Widest key and value heads `deltanet_chunk` holds (`32·DNC_U`, `16·DNC_ROWS`).
const DNC_MAX_DK: usize = 128;
const DNC_MAX_DV: usize = 128;

fn ternary(m: &DevMatrix) -> bool {
    !m.is_dense()
}

impl CudaHybrid {
    /// Whether `n` tokens take the batched path: more than one, tensor cores, not switched off
    /// (`TRIT_CUDA_PREFILL=0`), and every layer one the per-token kernels cover.
    pub(super) fn use_prefill(&self, st: &State, n: usize) -> bool {
        // Checked on every forward, decode steps included: the cheap tests first.
        let w = &st.w;
        if n < 2 || !self.prefill || st.gpu.compute_capability.0 < 8 {
            return false;
        }
        // Rotated (Bonsai 2) inputs are fine: `hadamard_quant` runs over rows too.
        w.layers.iter().all(|l| {
            ternary(&l.gate_up)
                && ternary(&l.down)
                && match &l.mixer {
                    DevMixer::Linear(m) => {
                        self.one_kernel_mixer(m) && ternary(&m.qkvz) && ternary(&m.out)
                    }
                    DevMixer::Full(m) => ternary(&m.qkv) && ternary(&m.o),
                }
        })
    }

    /// Runs the `n` tokens at `toks[start..start + n]` (uploaded) through every layer in
    /// chunks, updating the recurrent state and KV caches; leaves the last token's hidden state
    /// in the step's `x`, its logits in `logits`, and the device position at `start + n`.
    pub(super) fn prefill_prompt(&self, st: &mut State, start: usize, n: usize) -> Result<()> {
        self.ensure_rows(st)?;
        let chunk = self.prompt_chunk();
        let mut done = 0;
        while done < n {
            let m = chunk.min(n - done);
            self.prefill_chunk(st, start + done, m)?;
            done += m;
        }
        let s = st.gpu.stream.clone();
        // The last row into the step's x (the head and the next decode step read it there).
        {
            let pb = st.prefill.as_ref().expect("allocated above");
            let d = self.config.hidden;
            let m = n - (n - 1) / chunk * chunk;
            let src = pb.x.slice((m - 1) * d..m * d);
            s.memcpy_dtod(&src, &mut st.b.x)
                .map_err(|e| crate::device::cuda_err("copying the last hidden state", e))?;
        }
        s.memcpy_htod(&[(start + n) as i32, 0], &mut st.b.step)
            .map_err(|e| crate::device::cuda_err("setting the position", e))?;
        self.enqueue_head(st)
    }

    /// The final-normed hidden state of every token of `tokens` (or of the last), run as a
    /// sequence of their own from position 0 on a scratch state (a fresh `SeqBufs` swapped in
    /// for the single path's, which stays as it was): what embeddings pool
    /// (`ExternalNet::hidden_states`).
    pub(super) fn hidden_states_gpu(&self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        let c = &self.config;
        trit::model::check_input(tokens, &KvCache::new(c.n_layers, 0, self.ctx), c.vocab)?;
        let mut guard = self.state.lock().map_err(|_| crate::model::poisoned())?;
        let st: &mut State = &mut guard;
        if !self.use_prefill(st, 2) {
            return Err(trit::Error::Unsupported(
                "hidden states of this hybrid on this GPU need its prompt path (int8 tensor \
                 cores, compute capability 8.0+, ternary projections)"
                    .into(),
            ));
        }
        let mut scratch = SeqBufs::new(&st.gpu, c, &self.hy, tokens.len())?;
        std::mem::swap(&mut st.b.seq, &mut scratch);
        let out = self.hidden_on_swapped(st, tokens, which);
        std::mem::swap(&mut st.b.seq, &mut scratch);
        // The position counter now says where the scratch sequence ended.
        st.device_pos = None;
        st.gpu.sync()?;
        out
    }

    fn hidden_on_swapped(&self, st: &mut State, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        let (n, d) = (tokens.len(), self.config.hidden);
        upload_feed(st, tokens, 0)?;
        let chunk = self.ensure_rows(st)?.min(self.prompt_chunk());
        let s = st.gpu.stream.clone();
        let mut out = Vec::with_capacity(if which == Logits::All { n * d } else { d });
        let mut done = 0;
        while done < n {
            let m = chunk.min(n - done);
            self.prefill_chunk(st, done, m)?;
            done += m;
            let Some(rows) = crate::prefill::chunk_rows_wanted(which, m, done, n) else {
                continue;
            };
            let pb = st.prefill.as_ref().expect("allocated by ensure_rows");
            let normed = QuantOut {
                f32: ptr(&pb.xn, &s),
                q: ptr(&pb.xq, &s),
                meta: ptr(&pb.xm, &s),
            };
            let x = ptr(&pb.x, &s) + (rows.start * d * 4) as u64;
            let gamma = ptr(&st.w.final_norm, &s);
            let eps = self.config.norm_eps;
            launch::rms_norm_quant(&st.gpu, x, gamma, eps, d, normed, rows.len() as u32)?;
            out.extend(
                s.clone_dtoh(&pb.xn.slice(0..rows.len() * d))
                    .map_err(|e| crate::device::cuda_err("reading hidden states", e))?,
            );
        }
        Ok(out)
    }

    /// The chunk activations (made on first use; at 512 tokens, the default, ~150 MB for the
    /// 27B shape) for a prompt chunk's tokens or a batched step's sequences; returns the rows
    /// they hold.
    pub(super) fn ensure_rows(&self, st: &mut State) -> Result<usize> {
        if st.prefill.is_none() {
            let rows = self.prompt_chunk().max(self.max_seqs);
            st.prefill = Some(HybridPrefill::new(&st.gpu, &self.config, &self.hy, rows)?);
        }
        Ok(st.prefill.as_ref().map_or(1, |p| p.chunk))
    }

    /// Tokens of one prompt chunk.
    fn prompt_chunk(&self) -> usize {
        self.prefill_chunk.min(self.ctx).max(1)
    }

    /// Every layer for the `n` tokens at positions `pos..pos + n`.
    fn prefill_chunk(&self, st: &mut State, pos: usize, n: usize) -> Result<()> {
        {
            let s = st.gpu.stream.clone();
            let pb = st.prefill.as_mut().expect("allocated by prefill");
            let positions: Vec<i32> = (pos..pos + n).map(|p| p as i32).collect();
            s.memcpy_htod(&positions, &mut pb.pos.slice_mut(0..n))
                .map_err(|e| crate::device::cuda_err("uploading positions", e))?;
        }
        let st: &State = st;
        let s = &st.gpu.stream;
        let pb = st.prefill.as_ref().expect("allocated by prefill");
        self.embed_rows(st, ptr(&st.b.toks, s), ptr(&pb.pos, s), n)?;
        for layer in &st.w.layers {
            match &layer.mixer {
                DevMixer::Linear(m) => self.prefill_delta_net(st, m, &layer.attn_norm, pos, n)?,
                DevMixer::Full(m) => self.prefill_attention(st, m, &layer.attn_norm, n)?,
            }
            self.mlp_rows(st, layer, n, false)?;
        }
        Ok(())
    }

    /// The embedding rows of `toks[*first + r]` for `r < n` into the chunk's `x` (rotated
    /// where Bonsai 2's embedding is).
    pub(super) fn embed_rows(&self, st: &State, toks: u64, first: u64, n: usize) -> Result<()> {
        let (c, g, s) = (&self.config, &st.gpu, &st.gpu.stream);
        let pb = st.prefill.as_ref().expect("allocated by the caller");
        let x = ptr(&pb.x, s);
        launch::embed(g, &st.w.embed, toks, first, x, n as u32)?;
        if let Some(r) = st.w.rot_embed {
            let src = RotSource::Embed {
                x,
                round_f16: st.w.embed_f16,
            };
            let out = RotOut {
                rotated: x,
                ..RotOut::default()
            };
            launch_rotate_rows(g, st.w.rotations.get(r), c.hidden, n, src, out)?;
        }
        Ok(())
    }

    /// The MLP of `n` rows: RMSNorm rows, gate‖up, SwiGLU (+ int8 rows), down into the
    /// residual; `decode`: a batched decode step's rows (its small-batch GEMM).
    pub(super) fn mlp_rows(
        &self,
        st: &State,
        layer: &DevHybridLayer,
        n: usize,
        decode: bool,
    ) -> Result<()> {
        let gemm = |m: &DevMatrix, y: u64, acc: bool| {
            if decode {
                self.rows_gemm(st, m, n, y, acc)
            } else {
                self.gemm(st, m, n, y, acc)
            }
        };
        let (c, g, s) = (&self.config, &st.gpu, &st.gpu.stream);
        let pb = st.prefill.as_ref().expect("allocated by the caller");
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        self.norm_rows(st, &layer.post_norm, layer.rot_gu, n)?;
        gemm(&layer.gate_up, p(&pb.gu), false)?;
        match layer.rot_down {
            Some(r) => {
                let src = RotSource::Glu { x: p(&pb.gu) };
                launch_rotate_rows(g, st.w.rotations.get(r), c.ffn, n, src, pb.int8_out(s))?
            }
            None => {
                let h_out = QuantOut {
                    f32: 0,
                    q: ptr(&pb.xq, s),
                    meta: p(&pb.xm),
                };
                launch::glu_quant(g, p(&pb.gu), c.ffn, c.ffn_act, h_out, n as u32)?
            }
        }
        gemm(&layer.down, p(&pb.x), true)
    }

    fn prefill_delta_net(
        &self,
        st: &State,
        m: &DevDeltaNet,
        attn_norm: &CudaSlice<f32>,
        pos: usize,
        n: usize,
    ) -> Result<()> {
        let (c, hy, s) = (&self.config, &self.hy, &st.gpu.stream);
        let pb = st.prefill.as_ref().expect("allocated");
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        self.norm_rows(st, attn_norm, m.rot_in, n)?;
        self.gemm(st, &m.qkvz, n, p(&pb.proj), false)?;
        let (rows, vw, d) = (hy.conv_dim() + hy.value_width(), hy.value_width(), c.hidden);
        if self.dn_chunk && hy.k_dim <= DNC_MAX_DK && hy.v_dim <= DNC_MAX_DV {
            self.chunk_recurrence(st, m, attn_norm, pos, n)?;
        } else {
            let kernel = self.dn_step.expect("use_prefill checked one_kernel_mixer");
            for t in 0..n {
                let io = DnStepIo {
                    halt: 0,
                    x: p(&pb.x) + (4 * t * d) as u64,
                    proj: p(&pb.proj) + (4 * t * rows) as u64,
                    step: ptr(&pb.pos, s) + (4 * t) as u64,
                    out: p(&pb.mixed) + (4 * t * vw) as u64,
                    q: 0,
                    meta: 0,
                };
                self.launch_dn_step(st, &st.b.seq, m, attn_norm, (kernel, 512), io)?;
            }
        }
        // The int8 blocks of all rows at once (the same codes the per-token kernel would write).
        self.quantize_rows(st, p(&pb.mixed), vw, m.rot_out, n)?;
        self.gemm(st, &m.out, n, p(&pb.x), true)
    }

    /// The chunk's DeltaNet recurrence in three launches (`deltanet_chunk.cu`): the gates of
    /// every token, the recurrence of every value head over the tokens with its state in
    /// registers (its gated-RMSNorm rows into `mixed`), then the conv window's last inputs.
    fn chunk_recurrence(
        &self,
        st: &State,
        m: &DevDeltaNet,
        attn_norm: &CudaSlice<f32>,
        pos: usize,
        n: usize,
    ) -> Result<()> {
        let (c, hy, g, s) = (&self.config, &self.hy, &st.gpu, &st.gpu.stream);
        let (pb, b) = (st.prefill.as_ref().expect("allocated"), &st.b);
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        let DevMatrix::Dense { w: ab, .. } = &m.ab else {
            unreachable!("use_prefill checked one_kernel_mixer")
        };
        let (cd, rows) = (hy.conv_dim(), hy.conv_dim() + hy.value_width());
        g.launch(
            "deltanet_gates_rows",
            (n as u32, 1),
            512,
            &[
                Arg::Ptr(p(&pb.x)),
                Arg::Ptr(p(attn_norm)),
                Arg::F32(c.norm_eps),
                Arg::I32(c.hidden as i32),
                Arg::Ptr(p(ab)),
                Arg::Ptr(p(&m.a_neg)),
                Arg::Ptr(p(&m.dt_bias)),
                Arg::I32(hy.v_heads as i32),
                Arg::Ptr(p(&pb.gb)),
            ],
        )?;
        let window = p(&b.seq.conv_window[m.slot]);
        g.launch(
            "deltanet_chunk",
            (hy.v_heads as u32, 1),
            512,
            &[
                Arg::Ptr(p(&pb.proj)),
                Arg::I32(rows as i32),
                Arg::Ptr(p(&pb.gb)),
                Arg::Ptr(window),
                Arg::Ptr(p(&m.conv)),
                Arg::I32(hy.conv_kernel as i32),
                Arg::I32(pos as i32),
                Arg::I32(n as i32),
                Arg::Ptr(p(&b.seq.ssm[m.slot])),
                Arg::I32(hy.k_heads as i32),
                Arg::I32(hy.k_dim as i32),
                Arg::I32(hy.v_dim as i32),
                Arg::I32(hy.v_tiled as i32),
                Arg::Ptr(p(&m.norm)),
                Arg::F32(c.norm_eps),
                Arg::I32(st.w.regroup as i32),
                Arg::Ptr(p(&pb.mixed)),
            ],
        )?;
        g.launch(
            "deltanet_window_store",
            (cd.div_ceil(256) as u32, 1),
            256,
            &[
                Arg::Ptr(p(&pb.proj)),
                Arg::I32(rows as i32),
                Arg::I32(pos as i32),
                Arg::I32(n as i32),
                Arg::I32(cd as i32),
                Arg::I32(hy.conv_kernel as i32),
                Arg::Ptr(window),
            ],
        )
    }

    fn prefill_attention(
        &self,
        st: &State,
        m: &DevFullAttention,
        attn_norm: &CudaSlice<f32>,
        n: usize,
    ) -> Result<()> {
        let (c, s) = (&self.config, &st.gpu.stream);
        let pb = st.prefill.as_ref().expect("allocated");
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        let (hd, nh, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
        let (nq, rows) = (nh * hd, 2 * nh * hd + 2 * nkv * hd);
        self.norm_rows(st, attn_norm, m.rot_in, n)?;
        self.gemm(st, &m.qkv, n, p(&pb.proj), false)?;
        // Every token's key and value are appended before any token attends (two launches).
        let io = AttnIo {
            proj: p(&pb.proj),
            proj_row: rows,
            step: ptr(&pb.pos, s),
            q: p(&pb.q),
            gate: p(&pb.gate),
            out: p(&pb.mixed),
            rows: n,
        };
        self.launch_gated_attention(st, &st.b.seq, m, io)?;
        self.quantize_rows(st, p(&pb.mixed), nq, m.rot_out, n)?;
        self.gemm(st, &m.o, n, p(&pb.x), true)
    }

    /// The int8 blocks (into `xq`/`xm`) of `n` rows of `width` values at `x`, rotated first
    /// when the projection reading them is.
    pub(super) fn quantize_rows(
        &self,
        st: &State,
        x: u64,
        width: usize,
        rot: Option<usize>,
        n: usize,
    ) -> Result<()> {
        let (g, s) = (&st.gpu, &st.gpu.stream);
        let pb = st.prefill.as_ref().expect("allocated");
        match rot {
            Some(r) => {
                let src = RotSource::Copy { x };
                launch_rotate_rows(g, st.w.rotations.get(r), width, n, src, pb.int8_out(s))
            }
            // The rows are contiguous, so their int8 blocks are those of one flat vector.
            None => launch::quantize_vec(g, x, n * width, ptr(&pb.xq, s), ptr(&pb.xm, s)),
        }
    }

    /// RMSNorm with `gamma` + int8 blocks of the chunk's `n` residual rows (into `xq`/`xm`),
    /// rotated in between when the projections reading them are.
    pub(super) fn norm_rows(
        &self,
        st: &State,
        gamma: &CudaSlice<f32>,
        rot: Option<usize>,
        n: usize,
    ) -> Result<()> {
        let s = &st.gpu.stream;
        let pb = st.prefill.as_ref().expect("allocated");
        let d = self.config.hidden;
        if let Some(r) = rot {
            let src = RotSource::Norm {
                x: ptr(&pb.x, s),
                gamma: ptr(gamma, s),
                eps: self.config.norm_eps,
            };
            return launch_rotate_rows(&st.gpu, st.w.rotations.get(r), d, n, src, pb.int8_out(s));
        }
        let out = QuantOut {
            f32: if launch::norm_can_skip_f32(d) {
                0
            } else {
                ptr(&pb.xn, s)
            },
            q: ptr(&pb.xq, s),
            meta: ptr(&pb.xm, s),
        };
        let (x, w) = (ptr(&pb.x, s), ptr(gamma, s));
        launch::rms_norm_quant(&st.gpu, x, w, self.config.norm_eps, d, out, n as u32)
    }

    /// `y (+)= m · rows` over the chunk's `n` int8 rows (`xq`/`xm`).
    pub(super) fn gemm(
        &self,
        st: &State,
        m: &DevMatrix,
        n: usize,
        y: u64,
        accumulate: bool,
    ) -> Result<()> {
        let s = &st.gpu.stream;
        let pb = st.prefill.as_ref().expect("allocated");
        let args = m.ternary_args(s).expect("use_prefill checked: ternary");
        let (q, meta) = (ptr(&pb.xq, s), ptr(&pb.xm, s));
        launch_ternary_gemm(&st.gpu, &args, n, q, meta, y, accumulate)
    }
}
