//! The kernel sequence of one hybrid decode step (`CudaHybrid::enqueue_step`).
//!
//! Per DeltaNet layer, by default 8 kernels: RMSNorm (+ int8), q/k/v/z, `deltanet_step` (a/b,
//! conv, delta rule, gated norm and the int8 blocks of its output in one kernel), ssm_out,
//! RMSNorm, gate‖up, SwiGLU (+ int8), down. (Before: 12 — a/b, conv, recurrence, gated norm
//! and quantization were five kernels; the a/b product alone, 96 f32 rows on 96 warps, took
//! 16 µs of the layer's ~100 in ncu.) Full-attention layers: norm, q/k/v, prep, attention,
//! quantization, o, and the same MLP. `TRIT_CUDA_DN_STEP=0` switches back to the five kernels
//! (`=2`: `deltanet_step_hoisted`, loads reordered, measured as fast as the default);
//! `TRIT_CUDA_FUSED` (as for dense models, default off here) moves the norms into the fused
//! GEMV's prologue (q/k/v/z, gate‖up with SwiGLU, head), which measured slower on the 27B
//! widths.
//!
//! A Hadamard-rotated input (Bonsai 2) is prepared by `hadamard_quant` instead of the norm or
//! quantization kernel it replaces (RMSNorm, SwiGLU or a copy, then `H_B(s ⊙ x)`, then int8);
//! the fused GEMV then copies those int8 blocks (its prologue cannot rotate).

use super::{CudaHybrid, SeqBufs, State, DN_ROWS};
use crate::device::{ptr, Arg};
use crate::gemv::{
    fused_fits, launch_matrix_gemv, launch_ternary_fused, stream_takes_rotated, FusedInput,
    FusedOpts, GemvInput, TernaryArgs,
};
use crate::hybrid_weights::{DevDeltaNet, DevFullAttention, DevMixer};
use crate::launch::{self, QuantOut};
use crate::options::CudaOptions;
use crate::rotation::{launch_rotate, RotOut, RotSource};
use crate::weights::DevMatrix;
use cudarc::driver::CudaSlice;
use trit::Result;

/// Where a matrix product reads its input.
#[derive(Clone, Copy)]
enum Input {
    /// Made by an earlier kernel: f32 values (dense matrices read them) and their int8 blocks.
    Ready { f32: u64, q: u64, meta: u64 },
    /// The residual stream, RMS-normalized with `gamma` in the fused GEMV's prologue.
    Norm { x: u64, gamma: u64 },
    /// As `Norm`, then rotated in the streaming GEMV's prologue (`signs`, Hadamard `block`).
    NormRot {
        x: u64,
        gamma: u64,
        signs: u64,
        block: usize,
    },
}

/// The per-token device addresses of one `deltanet_step*` launch: the residual row, the
/// q‖k‖v‖z row, the position, the gated-norm output row and its int8 blocks (0: none).
pub(super) struct DnStepIo {
    /// The greedy loop's halt word (0: none; see greedy.cu).
    pub(super) halt: u64,
    pub(super) x: u64,
    pub(super) proj: u64,
    pub(super) step: u64,
    pub(super) out: u64,
    pub(super) q: u64,
    pub(super) meta: u64,
}

/// The device addresses of a gated attention over `rows` consecutive tokens: their q‖gate/k/v
/// rows (`proj_row` floats apart), their positions (`step`, one int each), and per token a
/// q, a gate and an output row (`n_heads · head_dim` floats each).
pub(super) struct AttnIo {
    pub(super) proj: u64,
    pub(super) proj_row: usize,
    pub(super) step: u64,
    pub(super) q: u64,
    pub(super) gate: u64,
    pub(super) out: u64,
    pub(super) rows: usize,
}

/// The decode step's gated attention as one kernel (`CudaOptions::hybrid_attn_step`).
#[derive(Clone, Copy, Debug)]
pub(super) struct AttnStep {
    kernel: &'static str,
    /// The batched step's variant (`hybrid_attn_step*_slots`: one block per head and row),
    /// where `CudaOptions::hybrid_attn_slots` asks for it.
    pub(super) slots_kernel: Option<&'static str>,
    /// Most splits (blocks) per head.
    pub(super) splits: u32,
    /// Fewest positions per split.
    min_chunk: i32,
}

impl AttnStep {
    /// The kernel for heads of `head_dim` (128 or 256; else `None`: the prep and decode
    /// kernels), unless the option is off; out-of-range split settings are refused.
    pub(super) fn new(opts: &CudaOptions, head_dim: usize) -> Result<Option<AttnStep>> {
        let (splits, min_chunk) = (opts.att_splits, opts.hybrid_att_min_chunk);
        if !(1..=64).contains(&splits) || min_chunk % 32 != 0 || !(32..=4096).contains(&min_chunk) {
            return Err(trit::Error::InvalidArgument(format!(
                "CUDA hybrid attention: splits must be 1 to 64 (got {splits}) and positions per \
                 split a multiple of 32 from 32 to 4096 (got {min_chunk})"
            )));
        }
        let (kernel, slots_kernel) = match head_dim {
            _ if !opts.hybrid_attn_step => return Ok(None),
            128 => ("hybrid_attn_step_e4", "hybrid_attn_step_e4_slots"),
            256 => ("hybrid_attn_step", "hybrid_attn_step_slots"),
            _ => return Ok(None),
        };
        Ok(Some(AttnStep {
            kernel,
            slots_kernel: opts.hybrid_attn_slots.then_some(slots_kernel),
            splits: splits as u32,
            min_chunk: min_chunk as i32,
        }))
    }

    /// Blocks per head for steps whose context reaches at most `reach` positions: as the dense
    /// attention's (`decode_attention::grid`), the fewest of 4, 8, 16 that give each split a
    /// block — the kernel sizes its splits from the grid, so they are the ones all `splits`
    /// blocks would make, and so are the step's bits.
    pub(super) fn grid(&self, reach: usize) -> u32 {
        crate::decode_attention::grid(reach, self.min_chunk as usize, self.splits as usize) as u32
    }
}

/// Rows per warp of the fused GEMV when the option asks for 1 (which it does not run).
const FUSED_MIN_ROWS: usize = 2;

impl CudaHybrid {
    /// The attention's blocks per head for steps reaching at most `reach` positions
    /// (`AttnStep::grid`; 0 with the prep + decode kernels, whose launch does not vary).
    pub(super) fn att_grid(&self, reach: usize) -> u32 {
        self.attn_step.map_or(0, |a| a.grid(reach))
    }

    fn p(st: &State, x: &CudaSlice<f32>) -> u64 {
        ptr(x, &st.gpu.stream)
    }

    fn ready(st: &State, f32: u64) -> Input {
        Input::Ready {
            f32,
            q: ptr(&st.b.xq, &st.gpu.stream),
            meta: Self::p(st, &st.b.xm),
        }
    }

    /// `m`'s arguments when the fused GEMV can run it (ternary, fits) and `on`.
    fn fusable(&self, st: &State, m: &DevMatrix, on: bool, glu: bool) -> Option<TernaryArgs> {
        if !on {
            return None;
        }
        let a = m.ternary_args(&st.gpu.stream)?;
        fused_fits(&a, glu).then_some(a)
    }

    /// Whether the fused GEMV of `m` can also rotate its input in its prologue (a rotated
    /// input, the option on, and the streaming kernel running `m`).
    fn rot_fusable(&self, st: &State, m: &DevMatrix, glu: bool, rot: Option<usize>) -> bool {
        let r = self.rows_per_warp.max(FUSED_MIN_ROWS);
        rot.is_some()
            && self.rot_prologue
            && m.ternary_args(&st.gpu.stream)
                .is_some_and(|a| stream_takes_rotated(&st.gpu, &a, r, glu))
    }

    /// The input of the projections after an RMSNorm of the residual stream with `gamma`:
    /// normalized and rotated in the fused GEMV's prologue when `rot_fuse`, else rotated by
    /// `hadamard_quant` (which also leaves the unrotated normed values in `xn`); unrotated, left
    /// to the fused GEMV's prologue when `fuse`, else `rms_norm_quant` (f32 in `xn`, int8
    /// blocks).
    fn norm_input(
        &self,
        st: &State,
        gamma: &CudaSlice<f32>,
        rot: Option<usize>,
        fuse: bool,
        rot_fuse: bool,
    ) -> Result<Input> {
        self.norm_input_at(st, Self::p(st, &st.b.x), gamma, rot, fuse, rot_fuse)
    }

    /// `norm_input` of the residual row at `x`.
    fn norm_input_at(
        &self,
        st: &State,
        x: u64,
        gamma: &CudaSlice<f32>,
        rot: Option<usize>,
        fuse: bool,
        rot_fuse: bool,
    ) -> Result<Input> {
        let (g, b, c) = (&st.gpu, &st.b, &self.config);
        let xn = Self::p(st, &b.xn);
        if let (Some(r), true) = (rot, rot_fuse) {
            let rotation = st.w.rotations.get(r);
            return Ok(Input::NormRot {
                x,
                gamma: Self::p(st, gamma),
                signs: Self::p(st, &rotation.signs),
                block: rotation.block,
            });
        }
        if let Some(r) = rot {
            let out = RotOut {
                prepared: xn,
                rotated: Self::p(st, &b.xr),
                q: ptr(&b.xq, &g.stream),
                meta: Self::p(st, &b.xm),
            };
            let src = RotSource::Norm {
                x,
                gamma: Self::p(st, gamma),
                eps: c.norm_eps,
            };
            launch_rotate(g, st.w.rotations.get(r), c.hidden, src, out)?;
            return Ok(Self::ready(st, out.rotated));
        }
        if fuse {
            return Ok(Input::Norm {
                x,
                gamma: Self::p(st, gamma),
            });
        }
        let out = QuantOut {
            f32: xn,
            q: ptr(&b.xq, &g.stream),
            meta: Self::p(st, &b.xm),
        };
        launch::rms_norm_quant(g, x, Self::p(st, gamma), c.norm_eps, c.hidden, out, 1)?;
        Ok(Self::ready(st, xn))
    }

    /// The input of a projection of the `n` f32 values at `x`: rotated, or quantized.
    fn vec_input(&self, st: &State, x: u64, n: usize, rot: Option<usize>) -> Result<Input> {
        let (g, b) = (&st.gpu, &st.b);
        let (xq, xm) = (ptr(&b.xq, &g.stream), Self::p(st, &b.xm));
        match rot {
            Some(r) => {
                let out = RotOut {
                    prepared: 0,
                    rotated: Self::p(st, &b.xr),
                    q: xq,
                    meta: xm,
                };
                launch_rotate(g, st.w.rotations.get(r), n, RotSource::Copy { x }, out)?;
                Ok(Self::ready(st, out.rotated))
            }
            None => {
                launch::quantize_vec(g, x, n, xq, xm)?;
                Ok(Self::ready(st, x))
            }
        }
    }

    /// `y (+)= m·input`, or with `glu` (m = gate‖up, fused GEMV only) `y = SwiGLU`.
    fn project(
        &self,
        st: &State,
        m: &DevMatrix,
        input: Input,
        y: u64,
        accumulate: bool,
        glu: bool,
    ) -> Result<()> {
        self.project_with(st, m, input, y, accumulate, glu, false, false)
    }

    /// `project`; `late_trigger` (an RMSNorm input only, which the fused GEMV takes): the next
    /// kernel starts only once this one's input is final (`FusedOpts::late_trigger`);
    /// `streamed`: int8 input through the fused GEMV too (`CudaOptions::stream_down`; the
    /// caller checked it runs `m`).
    #[allow(clippy::too_many_arguments)]
    fn project_with(
        &self,
        st: &State,
        m: &DevMatrix,
        input: Input,
        y: u64,
        accumulate: bool,
        glu: bool,
        late_trigger: bool,
        streamed: bool,
    ) -> Result<()> {
        let g = &st.gpu;
        let fused_input = match input {
            Input::Norm { x, gamma } => Some(FusedInput::Norm {
                x,
                gamma,
                eps: self.config.norm_eps,
            }),
            Input::NormRot {
                x,
                gamma,
                signs,
                block,
            } => Some(FusedInput::NormRot {
                x,
                gamma,
                eps: self.config.norm_eps,
                signs,
                block,
            }),
            Input::Ready { q, meta, .. } if glu || streamed => Some(FusedInput::Q { q, meta }),
            Input::Ready { .. } => None,
        };
        if let Some(fi) = fused_input {
            let a = self
                .fusable(st, m, true, glu)
                .expect("the caller checked the fused GEMV runs this matrix");
            let opts = FusedOpts {
                r: self.rows_per_warp.max(FUSED_MIN_ROWS),
                max_split: self.max_split,
                accumulate,
                glu,
                act: self.config.ffn_act,
                late_trigger,
            };
            return launch_ternary_fused(g, &a, fi, y, opts);
        }
        let Input::Ready { f32, q, meta } = input else {
            unreachable!("handled above")
        };
        let x = GemvInput { f32, q, meta };
        launch_matrix_gemv(g, m, x, y, accumulate, self.rows_per_warp, self.max_split)
    }

    /// Enqueues one decode step (position and token from device memory) whose context reaches
    /// at most `reach` positions (its attention's grid covers them: `AttnStep::grid`).
    pub(super) fn enqueue_step(&self, st: &State, with_head: bool, reach: usize) -> Result<()> {
        self.enqueue_layers(st, with_head, reach)?;
        let step = ptr(&st.b.step, &st.gpu.stream);
        st.gpu
            .launch("advance_position", (1, 1), 32, &[Arg::Ptr(step)])
    }

    /// `enqueue_step` up to the logits: the caller ends the step (advances the position).
    pub(super) fn enqueue_layers(&self, st: &State, with_head: bool, reach: usize) -> Result<()> {
        let (g, b, w) = (&st.gpu, &st.b, &st.w);
        let (x, step) = (Self::p(st, &b.x), ptr(&b.step, &g.stream));
        launch::embed(g, &w.embed, ptr(&b.toks, &g.stream), step, x, 1)?;
        if let Some(r) = w.rot_embed {
            let src = RotSource::Embed {
                x,
                round_f16: w.embed_f16,
            };
            let out = RotOut {
                rotated: x,
                ..RotOut::default()
            };
            launch_rotate(g, w.rotations.get(r), self.config.hidden, src, out)?;
        }
        for layer in &w.layers {
            match &layer.mixer {
                DevMixer::Linear(m) => self.delta_net(st, m, &layer.attn_norm)?,
                DevMixer::Full(m) => self.full_attention(st, m, &layer.attn_norm, reach)?,
            }
            self.mlp(st, layer)?;
        }
        if with_head {
            self.enqueue_head(st)?;
        }
        Ok(())
    }

    /// Final norm and LM head of the residual stream `x` into `logits`.
    pub(super) fn enqueue_head(&self, st: &State) -> Result<()> {
        let (x, y) = (Self::p(st, &st.b.x), Self::p(st, &st.b.logits));
        self.enqueue_head_at(st, x, y)
    }

    /// Final norm and LM head of the residual row at `x` into the `vocab` logits at `y`.
    pub(super) fn enqueue_head_at(&self, st: &State, x: u64, y: u64) -> Result<()> {
        let w = &st.w;
        let head = w.head();
        let fuse = self.fusable(st, head, self.fused.head, false).is_some();
        let rot_fuse = fuse && self.rot_fusable(st, head, false, w.rot_head);
        let input = self.norm_input_at(st, x, &w.final_norm, w.rot_head, fuse, rot_fuse)?;
        self.project(st, head, input, y, false, false)
    }

    fn mlp(&self, st: &State, layer: &crate::hybrid_weights::DevHybridLayer) -> Result<()> {
        let (g, b) = (&st.gpu, &st.b);
        let ffn = self.config.ffn;
        let glu = self
            .fusable(st, &layer.gate_up, self.fused.gate_up, true)
            .is_some();
        let rot_fuse = glu && self.rot_fusable(st, &layer.gate_up, true, layer.rot_gu);
        let input = self.norm_input(st, &layer.post_norm, layer.rot_gu, glu, rot_fuse)?;
        let h = Self::p(st, &b.h);
        let down_in = if glu {
            self.project(st, &layer.gate_up, input, h, false, true)?;
            self.vec_input(st, h, ffn, layer.rot_down)?
        } else {
            let gu = Self::p(st, &b.gu);
            self.project(st, &layer.gate_up, input, gu, false, false)?;
            match layer.rot_down {
                Some(r) => {
                    let out = RotOut {
                        prepared: 0,
                        rotated: Self::p(st, &b.xr),
                        q: ptr(&b.xq, &g.stream),
                        meta: Self::p(st, &b.xm),
                    };
                    let rot = st.w.rotations.get(r);
                    launch_rotate(g, rot, ffn, RotSource::Glu { x: gu }, out)?;
                    Self::ready(st, out.rotated)
                }
                None => {
                    let out = QuantOut {
                        f32: h,
                        q: ptr(&b.xq, &g.stream),
                        meta: Self::p(st, &b.xm),
                    };
                    launch::glu_quant(g, gu, ffn, self.config.ffn_act, out, 1)?;
                    Self::ready(st, h)
                }
            }
        };
        let streamed = self.stream_down && self.fusable(st, &layer.down, true, false).is_some();
        let x = Self::p(st, &b.x);
        self.project_with(st, &layer.down, down_in, x, true, false, false, streamed)
    }

    fn full_attention(
        &self,
        st: &State,
        m: &DevFullAttention,
        attn_norm: &CudaSlice<f32>,
        reach: usize,
    ) -> Result<()> {
        let (c, b, s) = (&self.config, &st.b, &st.gpu.stream);
        let (hd, nh) = (c.head_dim, c.n_heads);
        let p = |x: &CudaSlice<f32>| Self::p(st, x);
        let fuse = self.fusable(st, &m.qkv, self.fused.qkv, false).is_some();
        let rot_fuse = fuse && self.rot_fusable(st, &m.qkv, false, m.rot_in);
        let input = self.norm_input(st, attn_norm, m.rot_in, fuse, rot_fuse)?;
        self.project(st, &m.qkv, input, p(&b.proj), false, false)?;
        if let Some(a) = self.attn_step {
            // The o projection's int8 blocks come from the attention unless it is rotated.
            let quant = m.rot_out.is_none() && hd.is_multiple_of(64);
            let (xq, xm) = if quant {
                (ptr(&b.xq, s), p(&b.xm))
            } else {
                (0, 0)
            };
            st.gpu.launch(
                a.kernel,
                (nh as u32, a.grid(reach)),
                256, // DEC_THREADS
                &[
                    &self.attn_lead_args(st, m, p(&b.proj), ptr(&b.step, s))[..],
                    &[
                        Arg::I32(self.hy.rotary_dim as i32),
                        Arg::Ptr(ptr(&b.seq.k_cache[m.slot], s)),
                        Arg::Ptr(ptr(&b.seq.v_cache[m.slot], s)),
                        Arg::F32(1.0 / (hd as f32).sqrt()),
                        Arg::Ptr(p(&b.part_o)),
                        Arg::Ptr(p(&b.part_ml)),
                        Arg::Ptr(ptr(&b.counters, s)),
                        Arg::I32(a.min_chunk),
                        Arg::Ptr(p(&b.mixed)),
                        Arg::Ptr(xq),
                        Arg::Ptr(xm),
                        Arg::I32(quant as i32),
                    ],
                ]
                .concat(),
            )?;
            let o_in = if quant {
                Self::ready(st, p(&b.mixed))
            } else {
                self.vec_input(st, p(&b.mixed), nh * hd, m.rot_out)?
            };
            return self.project(st, &m.o, o_in, p(&b.x), true, false);
        }
        let io = AttnIo {
            proj: p(&b.proj),
            proj_row: 0,
            step: ptr(&b.step, s),
            q: p(&b.q),
            gate: p(&b.gate),
            out: p(&b.mixed),
            rows: 1,
        };
        self.launch_gated_attention(st, &st.b.seq, m, io)?;
        let o_in = self.vec_input(st, p(&b.mixed), nh * hd, m.rot_out)?;
        self.project(st, &m.o, o_in, p(&b.x), true, false)
    }

    /// The arguments every gated-attention kernel takes first: the q‖gate/k/v rows at `proj`,
    /// the layer's q/k norms and ε, the cos/sin table, the positions at `pos`, the head counts.
    pub(super) fn attn_lead_args(
        &self,
        st: &State,
        m: &DevFullAttention,
        proj: u64,
        pos: u64,
    ) -> [Arg; 8] {
        let c = &self.config;
        [
            Arg::Ptr(proj),
            Arg::Ptr(Self::p(st, &m.q_norm)),
            Arg::Ptr(Self::p(st, &m.k_norm)),
            Arg::F32(c.norm_eps),
            Arg::Ptr(Self::p(st, &st.b.cos_sin)),
            Arg::Ptr(pos),
            Arg::I32(c.n_heads as i32),
            Arg::I32(c.n_kv_heads as i32),
        ]
    }

    /// The gated attention of `io.rows` consecutive tokens: `hybrid_attn_prep` (q/gate of each
    /// token's q‖gate/k/v row, its key and value appended at its position), then
    /// `hybrid_attn_decode` of each token over the positions up to its own.
    pub(super) fn launch_gated_attention(
        &self,
        st: &State,
        seq: &SeqBufs,
        m: &DevFullAttention,
        io: AttnIo,
    ) -> Result<()> {
        let (c, hy, s) = (&self.config, &self.hy, &st.gpu.stream);
        let (hd, nh, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
        let (kc, vc) = (ptr(&seq.k_cache[m.slot], s), ptr(&seq.v_cache[m.slot], s));
        let rows = io.rows as u32;
        let (prep, attend) = if rows > 1 {
            ("hybrid_attn_prep_rows", "hybrid_attn_decode_rows")
        } else {
            ("hybrid_attn_prep", "hybrid_attn_decode")
        };
        st.gpu.launch(
            prep,
            ((nh + nkv) as u32, rows),
            hd as u32,
            &[
                &self.attn_lead_args(st, m, io.proj, io.step)[..],
                &[
                    Arg::I32(hd as i32),
                    Arg::I32(hy.rotary_dim as i32),
                    Arg::Ptr(kc),
                    Arg::Ptr(vc),
                    Arg::Ptr(io.q),
                    Arg::Ptr(io.gate),
                    Arg::I32(io.proj_row as i32),
                ],
            ]
            .concat(),
        )?;
        st.gpu.launch(
            attend,
            (nh as u32, rows),
            256, // HA_WARPS warps
            &[
                Arg::Ptr(io.q),
                Arg::Ptr(io.gate),
                Arg::Ptr(kc),
                Arg::Ptr(vc),
                Arg::Ptr(io.step),
                Arg::I32(nh as i32),
                Arg::I32(nkv as i32),
                Arg::I32(hd as i32),
                Arg::F32(1.0 / (hd as f32).sqrt()),
                Arg::Ptr(io.out),
            ],
        )
    }

    /// One `deltanet_step*` launch (`kernel` with `threads` per block; `deltanet_step_pair`
    /// takes two blocks per value head) for the token whose residual, projection, position and
    /// outputs `io` points at.
    pub(super) fn launch_dn_step(
        &self,
        st: &State,
        seq: &SeqBufs,
        m: &DevDeltaNet,
        attn_norm: &CudaSlice<f32>,
        (kernel, threads): (&str, u32),
        io: DnStepIo,
    ) -> Result<()> {
        let (c, hy) = (&self.config, &self.hy);
        let p = |x: &CudaSlice<f32>| Self::p(st, x);
        let DevMatrix::Dense { w: ab, .. } = &m.ab else {
            unreachable!("one_kernel_mixer checked: dense a/b rows")
        };
        let per_head = if kernel == "deltanet_step_pair" { 2 } else { 1 };
        st.gpu.launch(
            kernel,
            (per_head * hy.v_heads as u32, 1),
            threads,
            &[
                Arg::Ptr(io.x),
                Arg::Ptr(p(attn_norm)),
                Arg::F32(c.norm_eps),
                Arg::I32(c.hidden as i32),
                Arg::Ptr(p(ab)),
                Arg::Ptr(io.proj),
                Arg::Ptr(p(&seq.conv_window[m.slot])),
                Arg::Ptr(p(&m.conv)),
                Arg::I32(hy.conv_kernel as i32),
                Arg::Ptr(io.step),
                Arg::Ptr(p(&m.a_neg)),
                Arg::Ptr(p(&m.dt_bias)),
                Arg::Ptr(p(&seq.ssm[m.slot])),
                Arg::I32(hy.k_heads as i32),
                Arg::I32(hy.k_dim as i32),
                Arg::I32(hy.v_dim as i32),
                Arg::I32(hy.v_tiled as i32),
                Arg::Ptr(p(&m.norm)),
                Arg::I32(st.w.regroup as i32),
                Arg::Ptr(io.out),
                Arg::Ptr(io.q),
                Arg::Ptr(io.meta),
                Arg::Ptr(io.halt),
            ],
        )
    }

    /// Whether `deltanet_step` runs this layer (dense f32 a/b rows; head sizes it holds).
    pub(super) fn one_kernel_mixer(&self, m: &DevDeltaNet) -> bool {
        self.dn_step.is_some()
            && matches!(m.ab, DevMatrix::Dense { .. })
            && self.hy.v_dim <= super::MAX_HEAD
    }

    fn delta_net(&self, st: &State, m: &DevDeltaNet, attn_norm: &CudaSlice<f32>) -> Result<()> {
        let (c, hy) = (&self.config, &self.hy);
        let (g, b, s) = (&st.gpu, &st.b, &st.gpu.stream);
        let p = |x: &CudaSlice<f32>| Self::p(st, x);
        let (cd, vw) = (hy.conv_dim(), hy.value_width());
        let (xq, xm) = (ptr(&b.xq, s), p(&b.xm));
        if self.one_kernel_mixer(m) {
            let fuse = self.fusable(st, &m.qkvz, self.fused.qkv, false).is_some();
            let rot_fuse = fuse && self.rot_fusable(st, &m.qkvz, false, m.rot_in);
            let input = self.norm_input(st, attn_norm, m.rot_in, fuse, rot_fuse)?;
            // The early variant reads x before its wait: only behind the fused GEMV, which
            // then starts it late (after its own wait).
            let early =
                self.dn_early && matches!(input, Input::Norm { .. } | Input::NormRot { .. });
            self.project_with(st, &m.qkvz, input, p(&b.proj), false, false, early, false)?;
            // The int8 blocks of the output in the same kernel unless it is rotated.
            let quant = m.rot_out.is_none() && hy.v_dim.is_multiple_of(64);
            let (kernel, threads) = if early {
                // 12 warps of 64 registers fit beside a streaming GEMV block (72 registers
                // × 16 warps) on one multiprocessor; 16 do not, and would wait for it to end.
                // The held variant keeps 4 state values per lane: key heads of up to 128.
                let name = if self.dn_held && hy.k_dim <= 128 {
                    // Each block of the pair quantizes its half: whole int8 blocks.
                    if self.dn_pair && hy.v_dim.is_multiple_of(128) {
                        "deltanet_step_pair"
                    } else {
                        "deltanet_step_held"
                    }
                } else {
                    "deltanet_step_early"
                };
                (name, 384)
            } else {
                (self.dn_step.expect("one_kernel_mixer checked"), 512)
            };
            let io = DnStepIo {
                halt: ptr(&b.halt, s),
                x: p(&b.x),
                proj: p(&b.proj),
                step: ptr(&b.step, s),
                out: p(&b.mixed),
                q: if quant { xq } else { 0 },
                meta: if quant { xm } else { 0 },
            };
            self.launch_dn_step(st, &st.b.seq, m, attn_norm, (kernel, threads), io)?;
            let out_in = if quant {
                Self::ready(st, p(&b.mixed))
            } else {
                self.vec_input(st, p(&b.mixed), vw, m.rot_out)?
            };
            return self.project(st, &m.out, out_in, p(&b.x), true, false);
        }

        // The separate kernels. a/b read the unrotated normed input: `xn` (f32), or its own
        // int8 blocks when they are ternary and the shared ones hold the rotated input.
        let input = self.norm_input(st, attn_norm, m.rot_in, false, false)?;
        let ab_in = match (m.rot_in, &m.ab) {
            (Some(_), DevMatrix::Ternary { .. }) => {
                let (q, meta) = (ptr(&b.xq2, s), p(&b.xm2));
                launch::quantize_vec(g, p(&b.xn), c.hidden, q, meta)?;
                Input::Ready {
                    f32: p(&b.xn),
                    q,
                    meta,
                }
            }
            (Some(_), DevMatrix::Dense { .. } | DevMatrix::Half { .. }) => {
                Self::ready(st, p(&b.xn))
            }
            (None, _) => input,
        };
        self.project(st, &m.qkvz, input, p(&b.proj), false, false)?;
        self.project(st, &m.ab, ab_in, p(&b.ab), false, false)?;
        g.launch(
            "deltanet_conv_silu",
            (cd.div_ceil(256) as u32, 1),
            256,
            &[
                Arg::Ptr(p(&b.proj)),
                Arg::Ptr(p(&b.seq.conv_window[m.slot])),
                Arg::Ptr(p(&m.conv)),
                Arg::I32(cd as i32),
                Arg::I32(hy.conv_kernel as i32),
                Arg::Ptr(p(&b.conv_out)),
            ],
        )?;
        g.launch(
            "deltanet_recur",
            (hy.v_heads as u32, hy.v_dim.div_ceil(DN_ROWS) as u32),
            128,
            &[
                Arg::Ptr(p(&b.conv_out)),
                Arg::Ptr(p(&b.ab)),
                Arg::Ptr(p(&m.a_neg)),
                Arg::Ptr(p(&m.dt_bias)),
                Arg::Ptr(p(&b.seq.ssm[m.slot])),
                Arg::I32(hy.k_heads as i32),
                Arg::I32(hy.v_heads as i32),
                Arg::I32(hy.k_dim as i32),
                Arg::I32(hy.v_dim as i32),
                Arg::I32(hy.v_tiled as i32),
                Arg::Ptr(p(&b.o)),
            ],
        )?;
        g.launch(
            "deltanet_gated_norm",
            (hy.v_heads as u32, 1),
            128,
            &[
                Arg::Ptr(p(&b.o)),
                // z: the rows after the conv channels.
                Arg::Ptr(p(&b.proj) + 4 * cd as u64),
                Arg::Ptr(p(&m.norm)),
                Arg::F32(c.norm_eps),
                Arg::I32(hy.v_dim as i32),
                Arg::I32(hy.k_heads as i32),
                Arg::I32(st.w.regroup as i32),
                Arg::Ptr(p(&b.mixed)),
            ],
        )?;
        let out_in = self.vec_input(st, p(&b.mixed), vw, m.rot_out)?;
        self.project(st, &m.out, out_in, p(&b.x), true, false)
    }
}
