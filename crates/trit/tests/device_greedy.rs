//! `generate` over a backend with a device greedy loop (`ExternalNet::decode_on_device`, what
//! the GPU models do): the same text, tokens and finish reason as the CPU engine picking every
//! token, for length limits, stop strings, end-of-sequence tokens, a cancelling reader and a
//! chat's second turn — while the stand-in device runs steps past every refused token (as the
//! GPU's graphs in flight do) and, in one variant, hands back a pending token when its step
//! budget runs out. The stand-in computes with the CPU engine on a cache of its own, so any
//! bookkeeping slip (a token fed twice or not at all, a cache length off by one) changes the
//! text.

mod common;
use common::device_loop::run_ahead;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use trit::engine::{generate, generate_shifting, ContextShift, GenerateOptions, Session};
use trit::format::config::ModelConfig;
use trit::model::{DeviceLoopRun, DevicePick, ExternalNet, KvCache, Logits, Model};
use trit::sample::SamplingParams;
use trit::tokenizer::Tokenizer;

/// Steps the stand-in computes ahead of the token it offers (the GPU: two graphs of 4).
const AHEAD: usize = 8;

struct Device {
    inner: Model,
    own: Mutex<KvCache>,
    /// Most steps one loop may feed (below the caller's budget: the pending-token path).
    budget: usize,
    /// Steps computed and dropped, over all loops.
    dropped: AtomicUsize,
    loops: AtomicUsize,
    /// The stop ids each loop was given.
    stops_seen: Mutex<Vec<Vec<u32>>>,
}

impl Device {
    /// The logits after `tokens` at the caller's position: the stand-in's own cache is cut back
    /// to the caller's first (it may hold steps run ahead).
    fn run(&self, own: &mut KvCache, at: usize, tokens: &[u32]) -> trit::Result<Vec<f32>> {
        own.truncate(at);
        assert_eq!(own.len(), at, "the caller's cache is ahead of the device's");
        self.inner.forward(tokens, own, Logits::Last)
    }
}

impl ExternalNet for Device {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> trit::Result<Vec<f32>> {
        assert_eq!(which, Logits::Last);
        let mut own = self.own.lock().unwrap();
        let row = self.run(&mut own, cache.len(), tokens)?;
        cache.advance(tokens.len());
        Ok(row)
    }
    fn decode_on_device(
        &self,
        first: u32,
        cache: &mut KvCache,
        max_steps: usize,
        pick: &DevicePick,
        stop: &[u32],
        accept: &mut dyn FnMut(u32, bool) -> bool,
    ) -> trit::Result<Option<DeviceLoopRun>> {
        self.loops.fetch_add(1, Ordering::SeqCst);
        self.stops_seen.lock().unwrap().push(stop.to_vec());
        let mut own = self.own.lock().unwrap();
        own.truncate(cache.len());
        let max_steps = max_steps.min(self.budget);
        let (run, dropped) = run_ahead(
            &self.inner,
            &mut own,
            cache,
            first,
            max_steps,
            AHEAD,
            pick,
            accept,
        )?;
        self.dropped.fetch_add(dropped, Ordering::SeqCst);
        Ok(Some(run))
    }
    fn weight_bytes(&self) -> usize {
        self.inner.weight_bytes()
    }
    fn bytes_per_token(&self) -> usize {
        self.inner.bytes_per_token()
    }
}

fn device(files: &trit::format::ModelFiles, budget: usize) -> Arc<Device> {
    let inner = Model::load(files, 2).unwrap();
    let own = Mutex::new(inner.new_cache(256));
    Arc::new(Device {
        inner,
        own,
        budget,
        dropped: AtomicUsize::new(0),
        loops: AtomicUsize::new(0),
        stops_seen: Mutex::new(Vec::new()),
    })
}

/// Text, tokens, finish, prompt tokens computed (prefix reuse), the session's cached tokens.
type Outcome = (String, Vec<u32>, &'static str, usize, Vec<u32>);

/// `generate` for each prompt in turn in one session; the reader cancels after `cancel_at`
/// pieces of text.
fn run(
    m: &Arc<Model>,
    tok: &Tokenizer,
    prompts: &[&[u32]],
    opts: &GenerateOptions,
    cancel_at: usize,
) -> Vec<Outcome> {
    let mut s = Session::new(m.clone(), 256);
    prompts
        .iter()
        .map(|p| {
            let mut pieces = 0;
            let g = generate(&mut s, tok, p, opts, &mut |_| {
                pieces += 1;
                pieces < cancel_at
            })
            .unwrap();
            (
                g.text,
                g.tokens,
                g.finish.as_str(),
                g.prompt_evaluated,
                s.tokens().to_vec(),
            )
        })
        .collect()
}

#[test]
fn generate_over_a_device_loop_equals_the_cpu_picking_every_token() {
    let files = common::default_model_files();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let cpu = Arc::new(Model::load(&files, 2).unwrap());
    let prompt = tok.encode("The old lighthouse keeper said", false).unwrap();
    let base = GenerateOptions {
        max_tokens: 30,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        eos: Vec::new(),
        constraint: None,
    };
    let free = run(&cpu, &tok, &[&prompt], &base, usize::MAX)[0].clone();
    let words: Vec<&str> = free.0.split_whitespace().collect();
    assert!(words.len() > 6, "{:?}", free.0);
    let stop = GenerateOptions {
        stop: vec![words[4].to_string()],
        ..base.clone()
    };
    let eos = GenerateOptions {
        eos: vec![free.1[9]],
        ..base.clone()
    };
    let second: Vec<u32> = prompt
        .iter()
        .chain(&free.1)
        .chain(&prompt)
        .copied()
        .collect();
    for budget in [usize::MAX, 5] {
        let dev = device(&files, budget);
        let dev_model = Arc::new(Model::from_external(Box::new(Shared(Arc::clone(&dev)))));
        for (opts, cancel_at) in [
            (&base, usize::MAX),
            (&stop, usize::MAX),
            (&eos, usize::MAX),
            (&base, 7),
        ] {
            let prompts: [&[u32]; 3] = [&prompt, &second, &prompt];
            let want = run(&cpu, &tok, &prompts, opts, cancel_at);
            let got = run(&dev_model, &tok, &prompts, opts, cancel_at);
            assert_eq!(
                got, want,
                "budget {budget}, cancel at {cancel_at}, {opts:?}"
            );
        }
        assert!(
            dev.loops.load(Ordering::SeqCst) >= 12,
            "the device loop ran"
        );
        let stops = dev.stops_seen.lock().unwrap();
        assert!(stops.contains(&eos.eos), "the EOS ids reach the device");
        assert!(
            dev.dropped.load(Ordering::SeqCst) > 0,
            "steps ran past refused tokens"
        );
    }
    // Sampling: the device draws in the host's place, continuing its generator; the host's
    // generator skips the draws of the tokens it reads, so every request, and a second request
    // in the same session, samples what the CPU engine samples. A top-k beyond what the
    // device is asked for, penalties, or log-probabilities keep the host's loop.
    // A budget of 5 steps per loop: the host samples one token between loops, from its own
    // generator, which must have skipped the device's draws.
    let dev = device(&files, 5);
    let dev_model = Arc::new(Model::from_external(Box::new(Shared(Arc::clone(&dev)))));
    let sampled = |temperature, top_k, top_p, min_p| GenerateOptions {
        sampling: SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: 5,
            ..SamplingParams::default()
        },
        ..base.clone()
    };
    for opts in [
        sampled(0.8, 20, 0.8, 0.0),
        sampled(1.5, 40, 1.0, 0.05),
        sampled(0.3, 5, 0.9, 0.0),
        GenerateOptions {
            stop: stop.stop.clone(),
            eos: eos.eos.clone(),
            ..sampled(1.0, 64, 0.95, 0.0)
        },
    ] {
        let prompts: [&[u32]; 2] = [&prompt, &prompt];
        assert_eq!(
            run(&dev_model, &tok, &prompts, &opts, usize::MAX),
            run(&cpu, &tok, &prompts, &opts, usize::MAX),
            "{opts:?}"
        );
    }
    assert!(dev.loops.load(Ordering::SeqCst) >= 8, "the device loop ran");
    let loops = dev.loops.load(Ordering::SeqCst);
    let penalized = GenerateOptions {
        sampling: SamplingParams {
            penalties: trit::sample::Penalties {
                repetition: 1.3,
                ..Default::default()
            },
            ..sampled(0.8, 20, 0.8, 0.0).sampling
        },
        ..base.clone()
    };
    assert_eq!(
        run(&dev_model, &tok, &[&prompt], &penalized, usize::MAX),
        run(&cpu, &tok, &[&prompt], &penalized, usize::MAX)
    );
    assert_eq!(
        dev.loops.load(Ordering::SeqCst),
        loops,
        "penalties stay on the host"
    );
}

/// A shared handle on a `Device`, as the model (the test keeps the other to read counters).
struct Shared(Arc<Device>);

impl ExternalNet for Shared {
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn forward(&self, t: &[u32], c: &mut KvCache, w: Logits) -> trit::Result<Vec<f32>> {
        self.0.forward(t, c, w)
    }
    fn decode_on_device(
        &self,
        first: u32,
        cache: &mut KvCache,
        max_steps: usize,
        pick: &DevicePick,
        stop: &[u32],
        accept: &mut dyn FnMut(u32, bool) -> bool,
    ) -> trit::Result<Option<DeviceLoopRun>> {
        self.0
            .decode_on_device(first, cache, max_steps, pick, stop, accept)
    }
    fn weight_bytes(&self) -> usize {
        self.0.weight_bytes()
    }
    fn bytes_per_token(&self) -> usize {
        self.0.bytes_per_token()
    }
}

/// A context shift between device loops: a loop's run ends at the context's end with its last
/// token pending, the host shifts (reads the kept tokens again) and feeds it — the CPU
/// engine's tokens and final window, with and without a step budget per loop.
#[test]
fn a_context_shift_between_device_loops_equals_the_cpu() {
    let files = common::default_model_files();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let cpu = Arc::new(Model::load(&files, 2).unwrap());
    let prompt = tok.encode("The old lighthouse keeper said", false).unwrap();
    let shift = Some(ContextShift { keep: 3 });
    let gen = |m: &Arc<Model>| {
        let mut s = Session::new(m.clone(), 32);
        let g = generate_shifting(
            &mut s,
            &tok,
            &prompt,
            &common::greedy(80),
            shift,
            &mut |_| true,
        )
        .unwrap();
        (g.text, g.tokens, g.shifts, s.tokens().to_vec())
    };
    let want = gen(&cpu);
    assert_eq!(want.1.len(), 80);
    assert!(want.2 >= 3, "{} shifts", want.2);
    for budget in [usize::MAX, 5] {
        let dev = device(&files, budget);
        let dev_model = Arc::new(Model::from_external(Box::new(Shared(Arc::clone(&dev)))));
        assert_eq!(gen(&dev_model), want, "budget {budget}");
        assert!(
            dev.loops.load(Ordering::SeqCst) > want.2,
            "the device loop ran"
        );
    }
}
