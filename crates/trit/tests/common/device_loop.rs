//! A stand-in for a device's decoding loop (what the GPU models' `decode_on_device` does): the
//! CPU engine computes every step on the device's own cache, `ahead` steps past the token it
//! offers (as the GPU's queued graphs run), and those past a refused token are dropped.

use trit::model::{DeviceLoopRun, DevicePick, KvCache, Logits, Model};
use trit::sample::sampler::argmax;
use trit::sample::{Sampler, SamplingParams, TopLogits};

/// Runs the loop from `first` at `cache.len()` (`own`, the device's cache, already cut back
/// there); returns the run and how many computed steps were dropped.
#[allow(clippy::too_many_arguments)]
pub fn run_ahead(
    inner: &Model,
    own: &mut KvCache,
    cache: &mut KvCache,
    first: u32,
    max_steps: usize,
    ahead: usize,
    pick: &DevicePick,
    accept: &mut dyn FnMut(u32, bool) -> bool,
) -> trit::Result<(DeviceLoopRun, usize)> {
    assert_eq!(
        own.len(),
        cache.len(),
        "the caller's cache is ahead of the device's"
    );
    // The device's own copy of the sampler, continuing the host's generator.
    let mut sampler = match *pick {
        DevicePick::Argmax => None,
        DevicePick::Sample {
            temperature,
            top_k,
            top_p,
            min_p,
            rng,
        } => {
            let params = SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                ..SamplingParams::default()
            };
            Some(Sampler::with_rng_state(params, rng)?)
        }
    };
    // fed[i] is the input of step i; out[i] its pick and whether it drew.
    let (mut fed, mut out) = (vec![first], Vec::new());
    let mut offered = 0;
    loop {
        while out.len() < (offered + ahead).min(max_steps) {
            let row = inner.forward(&[fed[out.len()]], own, Logits::Last)?;
            let (t, drew) = match &mut sampler {
                None => (argmax(&row), false),
                Some(s) => {
                    let top = TopLogits::from_row(&row, s.params().top_k).unwrap();
                    let before = s.rng_state();
                    let t = s.sample_top(&top);
                    (t, s.rng_state() != before)
                }
            };
            out.push((t, drew));
            fed.push(t);
        }
        if offered == out.len() {
            cache.advance(max_steps);
            let run = DeviceLoopRun {
                fed: max_steps,
                pending: out.last().map(|o| o.0),
            };
            return Ok((run, 0));
        }
        let (t, drew) = out[offered];
        offered += 1;
        if !accept(t, drew) {
            cache.advance(offered);
            let run = DeviceLoopRun {
                fed: offered,
                pending: None,
            };
            return Ok((run, out.len() - offered));
        }
    }
}
