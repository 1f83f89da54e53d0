//! Generation with the GPU choosing each token itself (`ExternalNet::decode_on_device`): every
//! step ends with its token's pick (`kernels/greedy.cu`: the row's argmax, or the host
//! sampler's rule on the row's top-k candidates from `topk.cu`, its generator continued on the
//! device), written where the next step reads its token, so steps run back to back without the
//! host between them — no logits copy, no wake-up of the host thread, no launch on the
//! critical path. Each step is one
//! graph launch (the position lives in device memory, so one graph serves every position) and
//! `IN_FLIGHT` are kept queued; the host reads each step's token from mapped page-locked
//! memory once the step is done and offers it to the caller, who may refuse it (end of
//! sequence, stop string, length). Steps already run past a refused token are dropped: the
//! cache advances only by the tokens fed.
//!
//! One step per graph, not several: inside a graph, kernels start early through programmatic
//! dependent launch and some read the position before their wait (the decode attention's
//! first round), which is safe only while the position cannot change under them — across a
//! graph boundary. Steps captured several to a graph gave slightly different logits, and no
//! more speed (H200, 8B: 913 tok/s with 4, 8 or 16 steps per graph, 911 with one).

use crate::device::{cuda_err, ptr, Arg, Gpu};
use crate::graph::StepGraph;
use crate::mapped::MappedBuf;
use crate::model::{Head, StepKind};
use crate::topk::TopBuffers;
use cudarc::driver::{CudaSlice, CudaStream};
use std::collections::VecDeque;
use trit::model::{DeviceLoopRun, DevicePick};
use trit::{Error, Result};

/// Steps queued on the GPU while the host waits for the oldest (at most this many run past a
/// refused token).
const IN_FLIGHT: usize = 3;

/// `ARGMAX_THREADS` in greedy.cu.
const ARGMAX_THREADS: u32 = 256;

/// Flags of a ring entry (high word): a NaN in the row (or, sampling, a normalizer that is not
/// finite), no entry at all (every entry NaN), a stop id (the device set its halt word there),
/// a draw of the generator.
const FLAG_NAN: u64 = 1 << 32;
const FLAG_EMPTY: u64 = 2 << 32;
const FLAG_STOP: u64 = 4 << 32;
const FLAG_DREW: u64 = 8 << 32;

/// Stop ids the device knows (`take_argmax` reads a count, then the ids); a longer list halts
/// nothing, so a hybrid replays after such a stop instead.
const MAX_STOP_IDS: usize = 32;

/// A model's buffers and graphs of the greedy loop, made on its first use.
pub(crate) struct GreedyBufs {
    /// The step's best key (greedy.cu) and its flags word (NaN, drew); zero between steps.
    best: CudaSlice<u64>,
    nan_seen: CudaSlice<u32>,
    /// The sampler's generator state (`DevicePick::Sample`), uploaded per loop.
    rng: CudaSlice<u64>,
    /// The row's candidates for the sampler, made on its first use.
    top: Option<TopBuffers>,
    /// The caller's stop ids: a count, then up to MAX_STOP_IDS ids.
    stop: CudaSlice<i32>,
    /// A halt word for models without one of their own (dense: nothing reads it).
    halt: CudaSlice<i32>,
    /// Per position p, the token the step at p − 1 chose (`n_toks + 1` entries).
    /// Page-locked host memory the GPU writes in place: one 64-bit entry per position.
    ring: MappedBuf<u64>,
    /// One step ended by the pick, captured on first use, with the rule, kind and batched
    /// slot (`None`: the single path's own cache) it was captured for.
    graph: Option<(Rule, StepKind, Option<usize>, StepGraph)>,
}

/// How a step picks its token: the argmax, or the sampler's rule with its settings (kernel
/// arguments, so a graph serves one rule).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Rule {
    Argmax,
    Sample {
        k: usize,
        temperature: f32,
        top_p: f32,
        min_p: f32,
    },
}

impl Rule {
    /// The rule of `pick` for a `vocab`-entry row, and the generator state to start from;
    /// `None` where the device cannot pick so (more candidates than the kernel gives).
    pub(crate) fn of(pick: &DevicePick, vocab: usize) -> Option<(Rule, [u64; 4])> {
        match *pick {
            DevicePick::Argmax => Some((Rule::Argmax, [0; 4])),
            DevicePick::Sample {
                temperature,
                top_k,
                top_p,
                min_p,
                rng,
            } => crate::topk::supported(top_k, vocab).then_some((
                Rule::Sample {
                    k: top_k,
                    temperature,
                    top_p,
                    min_p,
                },
                rng,
            )),
        }
    }
}

impl GreedyBufs {
    /// Buffers for a model whose token array holds `n_toks` positions.
    pub(crate) fn new(gpu: &Gpu, n_toks: usize) -> Result<GreedyBufs> {
        Ok(GreedyBufs {
            best: gpu.zeros(1)?,
            nan_seen: gpu.zeros(1)?,
            rng: gpu.zeros(4)?,
            top: None,
            stop: gpu.zeros(MAX_STOP_IDS + 1)?,
            halt: gpu.zeros(1)?,
            ring: MappedBuf::new(gpu, n_toks + 1)?,
            graph: None,
        })
    }

    /// The buffers kept in `slot` (taken out while a loop runs), or new ones.
    pub(crate) fn take_or_new(
        slot: &mut Option<GreedyBufs>,
        gpu: &Gpu,
        n_toks: usize,
    ) -> Result<GreedyBufs> {
        match slot.take() {
            Some(b) => Ok(b),
            None => GreedyBufs::new(gpu, n_toks),
        }
    }

    /// Launches one step, captured on first use with `enqueue` (which enqueues a step up to
    /// its logits over the caches of `slot`; the pick ends it).
    pub(crate) fn launch_step(
        &mut self,
        gpu: &Gpu,
        use_graph: bool,
        pick: &Pick,
        (kind, slot): (StepKind, Option<usize>),
        enqueue: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        if matches!(pick.rule, Rule::Sample { .. }) && self.top.is_none() {
            self.top = Some(TopBuffers::new(gpu, 1)?);
        }
        let step = |b: &GreedyBufs| -> Result<()> {
            enqueue()?;
            enqueue_pick(gpu, b, pick)
        };
        if !use_graph {
            return step(self);
        }
        if self
            .graph
            .as_ref()
            .is_none_or(|(r, k, at, _)| *r != pick.rule || *k != kind || *at != slot)
        {
            self.graph = None;
            let g = StepGraph::capture(&gpu.stream, "greedy decode graph", || step(self))?;
            self.graph = Some((pick.rule, kind, slot, g));
        }
        let (_, _, _, g) = self.graph.as_ref().expect("captured above");
        g.launch("greedy decode")
    }
}

/// Where a step's pick reads its logits and writes the next token.
pub(crate) struct Pick {
    pub(crate) logits: u64,
    pub(crate) vocab: usize,
    /// The device position counter (`{position, unused}`).
    pub(crate) step: u64,
    pub(crate) toks: u64,
    pub(crate) n_toks: usize,
    /// The word a stop id sets (`None`: the loop's own, which nothing reads).
    pub(crate) halt: Option<u64>,
    pub(crate) rule: Rule,
}

impl Pick {
    /// The pick of a model's single path: its logits (and their count), its position counter
    /// and its token array (one entry per position), no halt word of its own.
    pub(crate) fn new(
        s: &CudaStream,
        (logits, vocab): (&CudaSlice<f32>, usize),
        step: &CudaSlice<i32>,
        toks: &CudaSlice<i32>,
        rule: Rule,
    ) -> Pick {
        Pick {
            logits: ptr(logits, s),
            vocab,
            step: ptr(step, s),
            toks: ptr(toks, s),
            n_toks: toks.len(),
            halt: None,
            rule,
        }
    }
}

/// Enqueues the pick of the step's token (argmax, or candidates and the sampler) and the
/// kernel that makes it the next step's token.
fn enqueue_pick(gpu: &Gpu, b: &GreedyBufs, pick: &Pick) -> Result<()> {
    let s = &gpu.stream;
    let (best, nan) = (ptr(&b.best, s), ptr(&b.nan_seen, s));
    match pick.rule {
        Rule::Argmax => {
            let blocks = (pick.vocab / 4).div_ceil(ARGMAX_THREADS as usize).max(1) as u32;
            gpu.launch(
                "row_argmax",
                (blocks, 1),
                ARGMAX_THREADS,
                &[
                    Arg::Ptr(pick.logits),
                    Arg::I32(pick.vocab as i32),
                    Arg::Ptr(best),
                    Arg::Ptr(nan),
                ],
            )?;
        }
        Rule::Sample {
            k,
            temperature,
            top_p,
            min_p,
        } => {
            let top = b.top.as_ref().expect("made by launch_step");
            let cand = top.enqueue_one(gpu, pick.logits, pick.vocab, k)?;
            gpu.launch(
                "sample_candidates",
                (1, 1),
                32,
                &[
                    Arg::Ptr(cand),
                    Arg::I32(k as i32),
                    Arg::F32(temperature),
                    Arg::F32(top_p),
                    Arg::F32(min_p),
                    Arg::Ptr(ptr(&b.rng, s)),
                    Arg::Ptr(best),
                    Arg::Ptr(nan),
                ],
            )?;
        }
    }
    gpu.launch(
        "take_argmax",
        (1, 1),
        32,
        &[
            Arg::Ptr(pick.step),
            Arg::Ptr(pick.toks),
            Arg::I32(pick.n_toks as i32),
            Arg::Ptr(best),
            Arg::Ptr(nan),
            Arg::Ptr(b.ring.dev),
            Arg::Ptr(ptr(&b.stop, s)),
            Arg::Ptr(pick.halt.unwrap_or(ptr(&b.halt, s))),
        ],
    )
}

/// What a loop is asked to do (`ExternalNet::decode_on_device`'s arguments).
pub(crate) struct LoopArgs<'a> {
    /// The first token, fed at `pos0`.
    pub(crate) first: u32,
    pub(crate) pos0: usize,
    pub(crate) max_steps: usize,
    pub(crate) pick: &'a DevicePick,
    pub(crate) stop: &'a [u32],
}

/// How a driven loop ended.
pub(crate) struct Driven {
    pub(crate) run: DeviceLoopRun,
    /// Steps the device ran (at least `run.fed`; the rest were dropped).
    pub(crate) ran: usize,
    /// The refused token was a stop id the device knew: it set the halt word there, so a
    /// hybrid's state stands where the fed tokens end.
    pub(crate) halted: bool,
}

/// Runs the host side of the loop: `launch(bufs)` enqueues one step (the first reads the token
/// the caller put at `start`), at most `max_steps` in all; each step's token goes to `accept`
/// in order once the step is done. `stop`: ids `accept` always refuses (end of sequence),
/// which set the halt word on the device. Zeroes the pick's scratch first, so a loop called
/// off by an error leaves nothing behind.
pub(crate) fn drive(
    gpu: &Gpu,
    bufs: &mut GreedyBufs,
    run: &LoopArgs<'_>,
    rng: [u64; 4],
    launch: &mut dyn FnMut(&mut GreedyBufs) -> Result<()>,
    accept: &mut dyn FnMut(u32, bool) -> bool,
) -> Result<Driven> {
    let (start, max_steps, stop) = (run.pos0, run.max_steps, run.stop);
    let s = gpu.stream.clone();
    s.memcpy_htod(&rng, &mut bufs.rng)
        .map_err(|e| cuda_err("uploading the generator", e))?;
    s.memset_zeros(&mut bufs.best)
        .map_err(|e| cuda_err("clearing the argmax", e))?;
    s.memset_zeros(&mut bufs.nan_seen)
        .map_err(|e| cuda_err("clearing the argmax", e))?;
    let mut ids = vec![0i32; MAX_STOP_IDS + 1];
    if stop.len() <= MAX_STOP_IDS {
        ids[0] = stop.len() as i32;
        for (d, &t) in ids[1..].iter_mut().zip(stop) {
            *d = t as i32;
        }
    }
    s.memcpy_htod(&ids, &mut bufs.stop)
        .map_err(|e| cuda_err("uploading stop ids", e))?;
    s.memset_zeros(&mut bufs.halt)
        .map_err(|e| cuda_err("clearing the halt word", e))?;
    let mut in_flight = VecDeque::new();
    let (mut issued, mut offered) = (0, 0);
    let mut last = None;
    loop {
        while in_flight.len() < IN_FLIGHT && issued < max_steps {
            launch(bufs)?;
            issued += 1;
            let done = s
                .record_event(None)
                .map_err(|e| cuda_err("recording a greedy step", e))?;
            in_flight.push_back((done, issued));
        }
        let Some((done, end)) = in_flight.pop_front() else {
            break;
        };
        done.synchronize()
            .map_err(|e| cuda_err("running the greedy steps", e))?;
        while offered < end {
            let entry = bufs.ring.get(start + offered + 1);
            if entry & (FLAG_NAN | FLAG_EMPTY) != 0 {
                gpu.sync()?;
                return Err(Error::Unsupported(format!(
                    "CUDA: the logits of generated token {} hold NaN (or +inf); the model's \
                     output is not usable",
                    offered + 1
                )));
            }
            let tok = entry as u32;
            offered += 1;
            if !accept(tok, entry & FLAG_DREW != 0) {
                // Let the steps already enqueued finish; their results are dropped.
                gpu.sync()?;
                return Ok(Driven {
                    run: DeviceLoopRun {
                        fed: offered,
                        pending: None,
                    },
                    ran: issued,
                    halted: entry & FLAG_STOP != 0,
                });
            }
            last = Some(tok);
        }
    }
    Ok(Driven {
        run: DeviceLoopRun {
            fed: issued,
            pending: last,
        },
        ran: issued,
        halted: false,
    })
}

/// Loops run over a batched slot's caches (the scheduler's lone sequence), counted for the
/// tests: how they know the scheduler took the loop rather than batched steps.
static SLOT_LOOPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub fn slot_loops() -> usize {
    SLOT_LOOPS.load(std::sync::atomic::Ordering::Relaxed)
}

impl crate::model::CudaModel {
    /// `ExternalNet::decode_on_device` of the single path: `first` at the cache's end, then
    /// the greedy steps, over the single path's own keys/values or, for a cache that owns a
    /// batched slot (the scheduler's lone sequence), the slot's — the kernels
    /// `decode_row_single` runs for it. `None` where the loop does not apply (switched off,
    /// the opt-in attention + o kernel, whose steps differ by position, or a slot of no batch
    /// of this model).
    pub(crate) fn decode_on_device_gpu(
        &self,
        first: u32,
        cache: &mut trit::model::KvCache,
        max_steps: usize,
        device_pick: &DevicePick,
        stop: &[u32],
        accept: &mut dyn FnMut(u32, bool) -> bool,
    ) -> Result<Option<DeviceLoopRun>> {
        use crate::model::{check_forward, poisoned, CudaModel};
        let Some((rule, rng)) = Rule::of(device_pick, self.config.vocab) else {
            return Ok(None);
        };
        if !self.greedy_loop || self.attention_o {
            return Ok(None);
        }
        check_forward(&[first], cache, self.config.vocab, self.ctx)?;
        let pos0 = cache.len();
        let max_steps = max_steps.min(self.ctx - pos0);
        if max_steps == 0 {
            return Ok(None);
        }
        let mut guard = self.state.lock().map_err(|_| poisoned())?;
        let st: &mut crate::model::State = &mut guard;
        let slot = cache.device_slot();
        // The single path's own caches, or the slot's (owned by this model's batch).
        let kv = match slot {
            None => CudaModel::own_kv(st),
            Some(slot) => match &st.batch {
                Some(batch) if batch.owns(slot) => batch.slot_kv(&st.gpu, slot, self.ctx),
                _ => return Ok(None),
            },
        };
        let slot = slot.map(|s| s.index());
        if slot.is_some() {
            SLOT_LOOPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.upload_inputs(st, &[first], pos0)?;
        let mut bufs = GreedyBufs::take_or_new(&mut st.greedy, &st.gpu, self.ctx)?;
        let st: &crate::model::State = st;
        let s = &st.gpu.stream;
        let pick = Pick::new(
            s,
            (&st.b.logits, self.config.vocab),
            &st.b.step,
            &st.b.toks,
            rule,
        );
        // The chain (the attention + o kernel's steps differ by position: refused above), its
        // attention grid wide enough for the loop's last position.
        let kind = StepKind::Chain {
            splits: self.att_grid(pos0 + max_steps),
        };
        let enqueue = || self.enqueue_layers(st, Head::Device, &kv, kind);
        let args = LoopArgs {
            first,
            pos0,
            max_steps,
            pick: device_pick,
            stop,
        };
        let driven = drive(
            &st.gpu,
            &mut bufs,
            &args,
            rng,
            &mut |b| b.launch_step(&st.gpu, self.use_graph, &pick, (kind, slot), &enqueue),
            accept,
        );
        // The device counter is wherever the last step left it.
        let st: &mut crate::model::State = &mut guard;
        st.greedy = Some(bufs);
        st.device_pos = None;
        match driven {
            Ok(d) => {
                cache.advance(d.run.fed);
                Ok(Some(d.run))
            }
            Err(e) => {
                let _ = st.gpu.sync();
                Err(e)
            }
        }
    }
}

/// The pick once over `row` (for the tests): the token the next step would read, and the
/// entry's flags (bit 0: a NaN in the row, bit 1: no entry at all). Errors if the token the
/// next step reads differs from the one reported.
pub fn argmax_once(gpu: &Gpu, row: &[f32]) -> Result<(u32, u32)> {
    let bufs = GreedyBufs::new(gpu, 2)?;
    let s = &gpu.stream;
    let logits = gpu.upload(row)?;
    let step = gpu.upload(&[0i32, 0])?;
    let toks = gpu.zeros::<i32>(2)?;
    let pick = Pick {
        logits: ptr(&logits, s),
        vocab: row.len(),
        step: ptr(&step, s),
        toks: ptr(&toks, s),
        n_toks: 2,
        halt: None,
        rule: Rule::Argmax,
    };
    enqueue_pick(gpu, &bufs, &pick)?;
    gpu.sync()?;
    let entry = bufs.ring.get(1);
    let fed = s
        .clone_dtoh(&toks)
        .map_err(|e| cuda_err("reading the token", e))?;
    let pos = s
        .clone_dtoh(&step)
        .map_err(|e| cuda_err("reading the position", e))?;
    if fed[1] as u32 != entry as u32 || pos[0] != 1 {
        return Err(Error::Unsupported(format!(
            "CUDA: the pick reported token {} and fed {} at position {}",
            entry as u32, fed[1], pos[0]
        )));
    }
    Ok((entry as u32, (entry >> 32) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_map_to_rules_the_kernels_can_run() {
        assert_eq!(
            Rule::of(&DevicePick::Argmax, 151_936),
            Some((Rule::Argmax, [0; 4]))
        );
        let sample = |top_k| DevicePick::Sample {
            temperature: 0.7,
            top_k,
            top_p: 0.8,
            min_p: 0.05,
            rng: [1, 2, 3, 4],
        };
        let (rule, rng) = Rule::of(&sample(20), 151_936).unwrap();
        assert_eq!(rng, [1, 2, 3, 4]);
        assert_eq!(
            rule,
            Rule::Sample {
                k: 20,
                temperature: 0.7,
                top_p: 0.8,
                min_p: 0.05
            }
        );
        // Beyond the candidate kernel's 256, or more than the vocabulary: the host samples.
        assert!(Rule::of(&sample(256), 151_936).is_some());
        assert!(Rule::of(&sample(257), 151_936).is_none());
        assert!(Rule::of(&sample(80), 70).is_none());
        assert!(Rule::of(&sample(0), 151_936).is_none());
    }
}
