//! Greedy generation with the GPU picking each token itself (`greedy.rs`,
//! `kernels/greedy.cu`): the pick kernel against the host's `argmax` on rows with ties, ±0.0,
//! −inf and NaN; the device loop against a twin model stepped by the host (the same kernels,
//! so the same logits and tokens), including steps run past a refused token, the context's
//! end, the hybrid's recurrent state, and `generate` itself (same text, tokens and finish
//! with the loop as without it).
//!
//! Needs an NVIDIA GPU, so every test is `#[ignore]`. Run on a GPU machine:
//!     cargo test --release -p trit-cuda --test gpu_greedy -- --ignored --test-threads 1

mod common;
use common::*;
use std::sync::Arc;
use trit::engine::{generate, generate_shifting, ContextShift, GenerateOptions, Session};
use trit::format::testgen::hybrid::{generate as generate_hybrid, HybridPreset};
use trit::format::testgen::{OutFormat, TokenizerAssets};
use trit::model::{DevicePick, Logits, Model};
use trit::sample::rng::Rng;
use trit::sample::SamplingParams;
use trit::tokenizer::Tokenizer;
use trit_cuda::greedy::argmax_once;
use trit_cuda::{load_model, CudaOptions};

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_pick_is_the_hosts_argmax() {
    if gpu_missing() {
        return;
    }
    let gpu = trit_cuda::device::Gpu::open(0).unwrap();
    let mut rng = Rng::new(3);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for vocab in [151_936, 49_153, 1_001, 7, 1] {
        rows.push(
            (0..vocab)
                .map(|_| (rng.next_f64() * 30.0 - 12.0) as f32)
                .collect(),
        );
        // Coarse values: the maximum is tied many times (the lowest id wins).
        rows.push(
            (0..vocab)
                .map(|_| (rng.next_f64() * 8.0).floor() as f32)
                .collect(),
        );
        let mut r = vec![f32::NEG_INFINITY; vocab];
        r[vocab - 1] = -0.0;
        if vocab > 2 {
            r[vocab / 2] = 0.0;
        }
        rows.push(r);
        rows.push(vec![f32::NEG_INFINITY; vocab]);
    }
    for (i, r) in rows.iter().enumerate() {
        let want = trit::sample::sampler::argmax(r);
        assert_eq!(argmax_once(&gpu, r).unwrap(), (want, 0), "row {i}");
    }
    // A NaN is skipped and flagged; a row of NaN has no entry.
    let mut r = vec![1.0f32; 5_000];
    r[17] = f32::NAN;
    r[4_000] = 2.0;
    assert_eq!(argmax_once(&gpu, &r).unwrap(), (4_000, 1));
    let (_, flags) = argmax_once(&gpu, &[f32::NAN; 64]).unwrap();
    assert_eq!(flags, 3);
}

fn options(ctx: usize, greedy_loop: bool) -> CudaOptions {
    CudaOptions {
        greedy_loop,
        ..CudaOptions::new(ctx)
    }
}

/// The device loop from the first greedy token after `prompt`, accepting `accept_n` tokens
/// (then refusing one): returns the session, the first token and the accepted tokens.
fn device_greedy(
    model: Arc<Model>,
    ctx: usize,
    prompt: &[u32],
    accept_n: usize,
) -> (Session, Vec<u32>) {
    let mut s = Session::new(model, ctx);
    let first = argmax(&s.prefill(prompt).unwrap());
    let mut got = vec![first];
    let run = s
        .decode_on_device(first, usize::MAX, &DevicePick::Argmax, &[], &mut |t, _| {
            if got.len() > accept_n {
                return false;
            }
            got.push(t);
            true
        })
        .unwrap()
        .expect("the GPU model has a device loop");
    assert_eq!(run.pending, None);
    assert_eq!(run.fed, accept_n + 1);
    assert_eq!(s.tokens().len(), prompt.len() + run.fed);
    (s, got)
}

/// Dense model (the default SmolLM2): 30 device-picked tokens equal 30 host-picked ones; the
/// token the loop refused is then fed by an ordinary step, which must give the twin's logits
/// bit for bit — the steps run past it (queued on the GPU) left neither the position nor the
/// keys and values astray.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn dense_device_loop_gives_the_tokens_and_cache_of_host_steps() {
    if gpu_missing() {
        return;
    }
    let files = trit::format::open(&default_model_path()).unwrap();
    let ctx = 160;
    let p = prompt(11, files.config.vocab, 17);
    let host = Arc::new(load_model(&files, &options(ctx, false)).unwrap());
    let (want, rows) = {
        let mut s = Session::new(host.clone(), ctx);
        let mut logits = s.prefill(&p).unwrap();
        let (mut toks, mut rows) = (Vec::new(), Vec::new());
        for _ in 0..32 {
            let t = argmax(&logits);
            toks.push(t);
            logits = s.step(t).unwrap();
            rows.push(logits.clone());
        }
        (toks, rows)
    };
    let dev = Arc::new(load_model(&files, &options(ctx, true)).unwrap());
    let (mut s, got) = device_greedy(dev, ctx, &p, 30);
    assert_eq!(got, want[..31]);
    // The refused token (the 32nd) fed by an ordinary step.
    let next = s.step(want[31]).unwrap();
    assert_eq!(next, rows[31], "the step after the loop");
}

/// The loop up to the end of the context (every token accepted): the last token comes back
/// pending, and the tokens equal the host's to the end.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn dense_device_loop_runs_to_the_end_of_the_context() {
    if gpu_missing() {
        return;
    }
    let files = trit::format::open(&default_model_path()).unwrap();
    let ctx = 64;
    let p = prompt(9, files.config.vocab, 5);
    let host = Arc::new(load_model(&files, &options(ctx, false)).unwrap());
    let mut s = Session::new(host, ctx);
    let mut logits = s.prefill(&p).unwrap();
    let mut want = Vec::new();
    while s.tokens().len() < ctx {
        let t = argmax(&logits);
        want.push(t);
        logits = s.step(t).unwrap();
    }
    want.push(argmax(&logits));
    let dev = Arc::new(load_model(&files, &options(ctx, true)).unwrap());
    let mut s = Session::new(dev, ctx);
    let first = argmax(&s.prefill(&p).unwrap());
    let mut got = vec![first];
    let run = s
        .decode_on_device(first, usize::MAX, &DevicePick::Argmax, &[], &mut |t, _| {
            got.push(t);
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(run.fed, ctx - p.len());
    assert_eq!(run.pending, got.last().copied());
    assert_eq!(s.tokens().len(), ctx);
    assert_eq!(got, want);
}

/// `generate` with greedy options on the GPU: the same text, tokens and finish with the device
/// loop as with the host picking every token, for a length limit, a stop string cut out of
/// the loop's tokens, and an end-of-sequence token; and a second request in the same session
/// (chat) continues from the right cache.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn generate_with_the_device_loop_equals_host_greedy() {
    if gpu_missing() {
        return;
    }
    let files = trit::format::open(&default_model_path()).unwrap();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let ctx = 256;
    let host = Arc::new(load_model(&files, &options(ctx, false)).unwrap());
    let dev = Arc::new(load_model(&files, &options(ctx, true)).unwrap());
    let prompt = tok
        .encode("Once upon a time, in a small village,", false)
        .unwrap();
    let base = GenerateOptions {
        max_tokens: 40,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        eos: Vec::new(),
        constraint: None,
    };
    let free = run_gen(&host, &tok, &[&prompt], &base)[0].clone();
    // A stop string from the middle of the free text; an EOS token from its middle.
    let words: Vec<&str> = free.0.split_whitespace().collect();
    assert!(words.len() > 8, "{:?}", free.0);
    let stop = GenerateOptions {
        stop: vec![words[5].to_string()],
        ..base.clone()
    };
    let eos = GenerateOptions {
        eos: vec![free.1[12]],
        ..base.clone()
    };
    for opts in [&base, &stop, &eos] {
        let want = run_gen(&host, &tok, &[&prompt, &prompt], opts);
        let got = run_gen(&dev, &tok, &[&prompt, &prompt], opts);
        assert_eq!(got, want, "{opts:?}");
    }
    // A follow-up that extends the first reply (a chat's second turn).
    let second: Vec<u32> = prompt
        .iter()
        .chain(&free.1)
        .copied()
        .chain(prompt.iter().copied())
        .collect();
    let want = run_gen(&host, &tok, &[&prompt, &second], &base);
    let got = run_gen(&dev, &tok, &[&prompt, &second], &base);
    assert_eq!(got, want);
}

/// Runs `generate` for each prompt in turn in one session: (text, tokens, finish).
fn run_gen(
    m: &Arc<Model>,
    tok: &Tokenizer,
    prompts: &[&[u32]],
    opts: &GenerateOptions,
) -> Vec<(String, Vec<u32>, String)> {
    let mut s = Session::new(m.clone(), 256);
    prompts
        .iter()
        .map(|p| {
            let g = generate(&mut s, tok, p, opts, &mut |_| true).unwrap();
            (g.text, g.tokens, g.finish.as_str().to_string())
        })
        .collect()
}

/// The hybrid (tiny-qwen35): device-picked tokens equal the host's (the same kernels); a loop
/// refusing a stop id it was told about keeps the state (below); a loop refusing any other
/// token ran past it, so the next ordinary step replays the sequence, and its
/// logits equal those of a fresh model given the whole sequence at once (the same prompt
/// path). Then a loop from position 0 on a model whose state stands elsewhere (a new
/// sequence) zeroes the state first: the same tokens as the first time.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn hybrid_device_loop_gives_the_tokens_and_state_of_host_steps() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (preset, files) = tiny_hybrid(dir.path(), 6);
    let ctx = 96;
    let p = prompt(7, preset.vocab, 21);
    let host = Arc::new(load_model(&files, &options(ctx, false)).unwrap());
    let mut s = Session::new(host, ctx);
    let mut logits = s.prefill(&p).unwrap();
    let (mut want, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..24 {
        let t = argmax(&logits);
        want.push(t);
        logits = s.step(t).unwrap();
        rows.push(logits.clone());
    }
    let dev = Arc::new(load_model(&files, &options(ctx, true)).unwrap());
    // An end-of-sequence id the loop meets at step k (its first occurrence): the device halts
    // the DeltaNet steps queued past it, so the state stays where the fed tokens end — the
    // next ordinary step equals the host twin's bit for bit (a replay would not).
    let k = (6..24)
        .find(|&k| !want[..k].contains(&want[k]))
        .expect("a token not seen before");
    let mut halted = Session::new(dev.clone(), ctx);
    halted.prefill(&p).unwrap();
    let mut seen = vec![want[0]];
    let run = halted
        .decode_on_device(
            want[0],
            usize::MAX,
            &DevicePick::Argmax,
            &[want[k]],
            &mut |t, _| {
                seen.push(t);
                t != want[k]
            },
        )
        .unwrap()
        .unwrap();
    assert_eq!((run.fed, run.pending), (k, None));
    assert_eq!(seen, want[..=k]);
    assert_eq!(
        halted.step(want[k]).unwrap(),
        rows[k],
        "the state after a halted loop"
    );
    drop(halted);
    let (mut s, got) = device_greedy(dev.clone(), ctx, &p, 20);
    assert_eq!(got, want[..21]);
    let after = s.step(want[21]).unwrap();
    let fresh = load_model(&files, &options(ctx, false)).unwrap();
    let mut c = fresh.new_cache(ctx);
    let all: Vec<u32> = p.iter().chain(&want[..22]).copied().collect();
    let replayed = fresh.forward(&all, &mut c, Logits::Last).unwrap();
    assert_eq!(
        after, replayed,
        "the step after the loop replays the sequence"
    );
    let mut c = dev.new_cache(ctx);
    let mut again = vec![want[0]];
    let run = dev
        .decode_on_device(
            want[0],
            &mut c,
            10,
            &DevicePick::Argmax,
            &[],
            &mut |t, _| {
                again.push(t);
                true
            },
        )
        .unwrap()
        .unwrap();
    assert_eq!(run.fed, 10);
    let fresh_toks: Vec<u32> = {
        let m = load_model(&files, &options(ctx, false)).unwrap();
        let mut c = m.new_cache(ctx);
        let mut t = want[0];
        let mut out = vec![t];
        for _ in 0..10 {
            t = argmax(&m.forward(&[t], &mut c, Logits::Last).unwrap());
            out.push(t);
        }
        out
    };
    assert_eq!(
        again, fresh_toks,
        "a new sequence on a model that ran another"
    );
}

/// Sampling on the device (`DevicePick::Sample`: candidates, the sampler's rule and its
/// generator in `sample_candidates`): `generate` with several sampler settings gives the same
/// text, tokens and finish as the host sampling from the same GPU model's candidates (the loop
/// switched off), on the default model and on the hybrid, two requests in a row in one
/// session (the second continuing the cache the first left). That the host's generator skips
/// exactly the device's draws between two loops of one request is checked on the CPU
/// (`crates/trit/tests/device_greedy.rs`, a device whose loops end every 5 steps).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn sampling_on_the_device_draws_what_the_host_draws() {
    if gpu_missing() {
        return;
    }
    let files = trit::format::open(&default_model_path()).unwrap();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let host = Arc::new(load_model(&files, &options(256, false)).unwrap());
    let dev = Arc::new(load_model(&files, &options(256, true)).unwrap());
    let text = tok
        .encode("The recipe for a good soup starts with", false)
        .unwrap();
    let sampled = |temperature, top_k, top_p, min_p, seed| GenerateOptions {
        max_tokens: 48,
        sampling: SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        eos: Vec::new(),
        constraint: None,
    };
    for opts in [
        sampled(0.7, 20, 0.8, 0.0, 1),
        sampled(1.2, 64, 1.0, 0.05, 2),
        sampled(1.0, 256, 0.95, 0.0, 3),
        sampled(0.2, 3, 1.0, 0.0, 4),
    ] {
        let want = run_gen(&host, &tok, &[&text, &text], &opts);
        let got = run_gen(&dev, &tok, &[&text, &text], &opts);
        assert_eq!(got, want, "{:?}", opts.sampling);
    }
    // The hybrid, its state carried between the two requests' loops.
    let dir = tempfile::tempdir().unwrap();
    let (preset, files) = tiny_hybrid(dir.path(), 9);
    let host = Arc::new(load_model(&files, &options(256, false)).unwrap());
    let dev = Arc::new(load_model(&files, &options(256, true)).unwrap());
    // Ids below the tiny vocabulary are SmolLM2 tokens too: its tokenizer writes the text.
    let p = prompt(9, preset.vocab, 33);
    let opts = sampled(0.9, 40, 0.9, 0.0, 7);
    let want = run_gen(&host, &tok, &[&p, &p], &opts);
    let got = run_gen(&dev, &tok, &[&p, &p], &opts);
    assert_eq!(got, want);
}

/// Context shifts on the GPU (`generate_shifting`): the device loop's run ends at the context's
/// end with its token pending, the kept window goes through the prompt path, the loop goes on
/// — the tokens, text and final window of the host-stepped twin, which shifts at the same
/// places; for the dense default model and the hybrid (whose state is rebuilt).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn context_shifts_with_the_device_loop_equal_host_steps() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let default = trit::format::open(&default_model_path()).unwrap();
    let (preset, hybrid) = tiny_hybrid(dir.path(), 8);
    let default_prompt = Tokenizer::from_source(&default.tokenizer)
        .unwrap()
        .encode("Once upon a time, in a small village,", false)
        .unwrap();
    let cases = [
        (&default, default_prompt),
        (&hybrid, prompt(7, preset.vocab, 23)),
    ];
    let ctx = 48;
    let opts = GenerateOptions {
        max_tokens: 120,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        eos: Vec::new(),
        constraint: None,
    };
    for (files, p) in cases {
        let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
        let gen = |greedy_loop: bool| {
            let m = Arc::new(load_model(files, &options(ctx, greedy_loop)).unwrap());
            let mut s = Session::new(m, ctx);
            let shift = Some(ContextShift { keep: 4 });
            let g = generate_shifting(&mut s, &tok, &p, &opts, shift, &mut |_| true).unwrap();
            (g.text, g.tokens, g.shifts, s.tokens().to_vec())
        };
        let want = gen(false);
        assert_eq!(want.1.len(), 120);
        assert!(want.2 >= 3, "{} shifts", want.2);
        assert_eq!(gen(true), want);
    }
}

/// The generated tiny-qwen35 hybrid (Q2_0 GGUF) under `dir`, opened.
fn tiny_hybrid(dir: &std::path::Path, seed: u64) -> (HybridPreset, trit::format::ModelFiles) {
    let preset = HybridPreset::by_name("tiny-qwen35").unwrap();
    let fmt = OutFormat::parse("q2_0").unwrap();
    generate_hybrid(&preset, seed, dir, &[fmt], &TokenizerAssets::Placeholder).unwrap();
    let files = trit::format::open(&dir.join(fmt.file_name())).unwrap();
    (preset, files)
}

/// `head_to_host` (`TRIT_CUDA_HEAD_HOST=1`): the LM head storing the logits straight into
/// mapped host memory gives the bits the device buffer's copy gives — for each token of a
/// greedy run (the last row), for every row of a prompt stepped token by token (`Logits::All`,
/// prefill off), and for sampled steps (top-k on the device: the device buffer).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn logits_written_to_host_memory_by_the_head_are_the_copied_ones() {
    if gpu_missing() {
        return;
    }
    let files = trit::format::open(&default_model_path()).unwrap();
    let ctx = 96;
    let p = prompt(7, files.config.vocab, 23);
    let load = |to_host: bool, prefill: bool| {
        let o = CudaOptions {
            head_to_host: to_host,
            prefill,
            greedy_loop: false,
            ..CudaOptions::new(ctx)
        };
        Arc::new(load_model(&files, &o).unwrap())
    };
    let rows = |m: Arc<Model>| {
        let mut s = Session::new(m, ctx);
        let mut logits = s.prefill(&p).unwrap();
        let mut rows = vec![logits.clone()];
        for _ in 0..24 {
            logits = s.step(argmax(&logits)).unwrap();
            rows.push(logits.clone());
        }
        rows
    };
    let want = rows(load(false, true));
    assert_eq!(rows(load(true, true)), want, "greedy rows");
    let all = |m: Arc<Model>| {
        let mut cache = m.new_cache(ctx);
        m.forward(&p, &mut cache, Logits::All).unwrap()
    };
    let want_all = all(load(false, false));
    assert_eq!(want_all.len(), p.len() * files.config.vocab);
    assert_eq!(
        all(load(true, false)),
        want_all,
        "every row, token by token"
    );
    // A step whose candidates are picked on the device reads the device buffer; a plain step
    // after it goes back to host memory.
    let top = |m: Arc<Model>| {
        let mut cache = m.new_cache(ctx);
        m.forward(&p, &mut cache, Logits::Last).unwrap();
        let t = m.forward_top(&[5], &mut cache, 40).unwrap();
        (t, m.forward(&[6], &mut cache, Logits::Last).unwrap())
    };
    let (want_top, want_next) = top(load(false, true));
    let (got_top, got_next) = top(load(true, true));
    assert!(
        matches!(want_top, trit::sample::RowLogits::Top(_)),
        "{want_top:?}"
    );
    assert_eq!(got_top, want_top, "device top-k");
    assert_eq!(got_next, want_next, "the plain step after it");
}
