//! The hybrid's generation loop on the device (`ExternalNet::decode_on_device`): the dense
//! `greedy.rs` loop over the hybrid's step, with the halt word that keeps a stopped loop from
//! moving the recurrent state on.

use super::{upload_feed, CudaHybrid, State};
use crate::device::ptr;
use crate::greedy::{GreedyBufs, LoopArgs, Pick, Rule};
use crate::hybrid_weights;
use crate::model::StepKind;
use trit::model::DeviceLoopRun;
use trit::Result;

impl CudaHybrid {
    /// `ExternalNet::decode_on_device` with the state locked. A recurrent state that does not
    /// stand at `pos0` is brought there first, as `forward` would: zeroed, and the sequence's
    /// earlier tokens replayed.
    pub(super) fn greedy_locked(
        &self,
        st: &mut State,
        args: &LoopArgs<'_>,
        accept: &mut dyn FnMut(u32, bool) -> bool,
    ) -> Result<Option<DeviceLoopRun>> {
        let (first, pos0, max_steps) = (args.first, args.pos0, args.max_steps);
        let Some((rule, rng)) = Rule::of(args.pick, self.config.vocab) else {
            return Ok(None);
        };
        if !self.greedy_loop || max_steps == 0 || pos0 > st.history.len() {
            return Ok(None);
        }
        if st.seq_len != Some(pos0) {
            if pos0 == 0 {
                st.b.seq.reset(&st.gpu)?;
                st.history.clear();
                st.seq_len = Some(0);
            } else {
                let last = st.history[pos0 - 1];
                self.forward_locked(st, &[last], pos0 - 1, None, &mut |_| {})?;
            }
        }
        upload_feed(st, &[first], pos0)?;
        st.seq_len = None;
        let mut bufs = GreedyBufs::take_or_new(&mut st.greedy, &st.gpu, self.ctx)?;
        let mut seen = Vec::new();
        let driven = {
            let st: &State = st;
            let s = &st.gpu.stream;
            let pick = Pick {
                halt: Some(ptr(&st.b.halt, s)),
                ..Pick::new(
                    s,
                    (&st.b.logits, self.config.vocab),
                    &st.b.step,
                    &st.b.toks,
                    rule,
                )
            };
            // The loop's graph covers its last position.
            let reach = pos0 + max_steps;
            let enqueue = || self.enqueue_layers(st, true, reach);
            crate::greedy::drive(
                &st.gpu,
                &mut bufs,
                args,
                rng,
                &mut |b| {
                    b.launch_step(
                        &st.gpu,
                        self.use_graph,
                        &pick,
                        (
                            StepKind::Chain {
                                splits: self.att_grid(reach) as usize,
                            },
                            None,
                        ),
                        &enqueue,
                    )
                },
                &mut |t, drew| {
                    seen.push(t);
                    accept(t, drew)
                },
            )
        };
        st.greedy = Some(bufs);
        // Ordinary steps must find the halt word clear (queued behind the loop's steps).
        let cleared = st.gpu.stream.clone().memset_zeros(&mut st.b.halt);
        let d = match driven {
            Ok(d) => d,
            Err(e) => {
                let _ = st.gpu.sync();
                return Err(e);
            }
        };
        cleared.map_err(|e| crate::device::cuda_err("clearing the halt word", e))?;
        let fed = d.run.fed;
        st.history.truncate(pos0);
        st.history.push(first);
        st.history.extend_from_slice(&seen[..fed - 1]);
        st.device_pos = Some(pos0 + d.ran);
        // Steps run past the last fed token moved the state on (the next forward replays),
        // unless a stop id halted them (`deltanet_step*` leave the state alone then).
        let kept = d.ran == fed || (d.halted && self.halts(st));
        st.seq_len = kept.then_some(pos0 + fed);
        Ok(Some(d.run))
    }

    /// Whether every DeltaNet layer's state update happens in one `deltanet_step*` kernel of
    /// the decode step, the kernels that honour the halt word.
    fn halts(&self, st: &State) -> bool {
        st.w.layers.iter().all(|l| match &l.mixer {
            hybrid_weights::DevMixer::Linear(m) => self.one_kernel_mixer(m),
            hybrid_weights::DevMixer::Full(_) => true,
        })
    }
}
