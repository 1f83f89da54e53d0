//! Sampling from the GPU's candidates instead of full logits: the candidate kernel
//! (`kernels/topk.cu`) against the host reference `TopLogits::from_row` on random rows with
//! ties and edge cases, the single-sequence path's candidate steps (`trit run` / `chat`), and
//! the scheduler over the GPU model giving every sequence the same tokens and
//! log-probabilities with candidate rows as with full rows.
//!
//! Needs an NVIDIA GPU, so every test is `#[ignore]`. Run on a GPU machine:
//!     cargo test --release -p trit-cuda --test gpu_sample -- --ignored --test-threads 1

mod common;
use common::*;
use std::sync::{mpsc, Arc};
use std::time::Duration;
use trit::engine::{
    GenerateOptions, Scheduler, SchedulerConfig, SeqEvent, SeqRequest, TokenLogprob,
};
use trit::format::config::ModelConfig;
use trit::model::{BatchSeq, ExternalNet, KvCache, Logits, Model};
use trit::sample::rng::Rng;
use trit::sample::{Penalties, RowLogits, SamplingParams, TopLogits};
use trit::tokenizer::Tokenizer;
use trit_cuda::topk::top_candidates_once;
use trit_cuda::{CudaModel, CudaOptions};

/// Rows of `vocab` logits: model-like spread, coarse values with many ties (also at the
/// k-th place), a constant row, −inf entries, ±0.0, and rows the kernel must refuse.
fn rows(vocab: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    let mut u = move || rng.next_f64();
    let mut out = Vec::new();
    out.push((0..vocab).map(|_| (u() * 30.0 - 12.0) as f32).collect());
    out.push(
        (0..vocab)
            .map(|_| (u() * 16.0).floor() as f32 * 0.5)
            .collect(),
    );
    out.push(vec![0.25; vocab]);
    let mut r: Vec<f32> = (0..vocab).map(|_| (u() * 8.0 - 4.0) as f32).collect();
    for i in (0..vocab).step_by(3) {
        r[i] = f32::NEG_INFINITY;
    }
    r[vocab / 2] = 0.0;
    r[vocab / 3] = -0.0;
    out.push(r);
    let mut spike: Vec<f32> = (0..vocab).map(|_| (u() * 2.0) as f32).collect();
    spike[vocab - 1] = 40.0;
    out.push(spike);
    out
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn top_candidates_kernel_matches_the_host_reference() {
    if gpu_missing() {
        return;
    }
    let gpu = trit_cuda::device::Gpu::open(0).unwrap();
    let mut checked = 0;
    for (vocab, ks) in [
        (151_936, &[1usize, 20, 64, 256][..]),
        (49_152, &[64][..]),
        (1_000, &[64, 255][..]),
        (70, &[64, 70][..]),
    ] {
        for &k in ks {
            let rs = rows(vocab, vocab as u64 + k as u64);
            let flat: Vec<f32> = rs.concat();
            let got = top_candidates_once(&gpu, &flat, vocab, k).unwrap();
            assert_eq!(got.len(), rs.len());
            for (i, (g, r)) in got.iter().zip(&rs).enumerate() {
                let want = TopLogits::from_row(r, k).unwrap();
                let g = g
                    .as_ref()
                    .unwrap_or_else(|| panic!("vocab {vocab} k {k} row {i}"));
                assert_eq!(g.ids, want.ids, "vocab {vocab} k {k} row {i}: ids");
                assert_eq!(
                    g.logits.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
                    want.logits.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
                    "vocab {vocab} k {k} row {i}: logits"
                );
                let dz = (g.log_z - want.log_z).abs() / want.log_z.abs().max(1.0);
                assert!(dz < 1e-12, "vocab {vocab} k {k} row {i}: log_z {dz:e}");
                checked += 1;
            }
        }
    }
    // Rows only the full logits can answer: a NaN, a +inf, nothing but −inf.
    let vocab = 5_000;
    let mut bad = vec![rows(vocab, 1)[0].clone(); 3];
    bad[0][17] = f32::NAN;
    bad[1][4_999] = f32::INFINITY;
    bad[2] = vec![f32::NEG_INFINITY; vocab];
    let got = top_candidates_once(&gpu, &bad.concat(), vocab, 64).unwrap();
    assert!(
        got.iter().all(|g| g.is_none()),
        "non-finite normalizers refused"
    );
    // Sizes the kernel does not take are refused, not run.
    assert!(top_candidates_once(&gpu, &[0.0; 50], 50, 64).is_err());
    assert!(top_candidates_once(&gpu, &[0.0; 1000], 1000, 257).is_err());
    eprintln!("candidate kernel equals the host reference on {checked} rows");
}

/// `forward_top` on the single-sequence path (what `trit run` / `chat --device cuda` sample
/// from): a session stepping with candidates and a twin stepping with full rows, fed the same
/// tokens, on the same GPU model; every step's candidates are the host reference's candidates
/// of the twin's full row (the same graph computes both rows, so the numbers are equal), which
/// also shows the device position advancing right between the two kinds of step.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn single_path_steps_with_candidates_give_the_candidates_of_full_rows() {
    if gpu_missing() {
        return;
    }
    let files = trit::format::open(&default_model_path()).unwrap();
    let vocab = files.config.vocab;
    let gpu = Arc::new(Model::from_external(Box::new(
        CudaModel::load(&files, &CudaOptions::new(96)).unwrap(),
    )));
    let k = trit::sample::TOP_CANDIDATES;
    let (mut a, mut b) = (
        trit::engine::Session::new(gpu.clone(), 96),
        trit::engine::Session::new(gpu.clone(), 96),
    );
    let p = prompt(9, vocab, 91);
    let first = a.prefill(&p).unwrap();
    assert_eq!(first, b.prefill(&p).unwrap());
    let mut tok = argmax(&first);
    let mut tops = 0;
    for step in 0..20 {
        let full = b.step(tok).unwrap();
        let want = TopLogits::from_row(&full, k).expect("finite logits");
        match a.step_top(tok, k).unwrap() {
            RowLogits::Top(got) => {
                assert_eq!(got.ids, want.ids, "step {step}");
                assert_eq!(got.logits, want.logits, "step {step}");
                assert!((got.log_z - want.log_z).abs() < 1e-9 * want.log_z.abs().max(1.0));
                tops += 1;
            }
            RowLogits::Full(row) => assert_eq!(row, full, "step {step}"),
        }
        tok = argmax(&full);
    }
    assert_eq!(tops, 20, "every step came back as candidates");
    assert_eq!(a.tokens(), b.tokens());
}

/// `forward_batch_top` on the batched path, called directly: 6 sequences and their 6 twins
/// (same prompts and tokens) in every call, the twins asking for candidates; each twin's
/// candidates are the host reference's candidates of the other's full row (rows of a batch
/// are computed independently, so the two rows are the same numbers). Rows that cannot be
/// candidates come back in full: prompts (several tokens) even when asked.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn batched_rows_asked_as_candidates_are_the_candidates_of_the_full_rows() {
    if gpu_missing() {
        return;
    }
    let files = trit::format::open(&default_model_path()).unwrap();
    let vocab = files.config.vocab;
    let ctx = 96;
    let gpu = CudaModel::load(&files, &CudaOptions::new(ctx)).unwrap();
    let k = trit::sample::TOP_CANDIDATES;
    let scripts: Vec<(Vec<u32>, Vec<u32>)> = (0..6)
        .map(|i| {
            (
                prompt(3 + 7 * i, vocab, 40 + i as u64),
                prompt(5, vocab, 70 + i as u64),
            )
        })
        .collect();
    let n_layers = files.config.n_layers;
    let mut caches: Vec<KvCache> = (0..12).map(|_| KvCache::new(n_layers, 0, ctx)).collect();
    for step in 0..=5 {
        let feeds: Vec<Vec<u32>> = (0..12)
            .map(|i| {
                let (p, t) = &scripts[i % 6];
                if step == 0 {
                    p.clone()
                } else {
                    vec![t[step - 1]]
                }
            })
            .collect();
        let want: Vec<bool> = (0..12).map(|i| i >= 6).collect();
        let mut batch: Vec<BatchSeq<'_>> = caches
            .iter_mut()
            .zip(&feeds)
            .map(|(c, f)| BatchSeq {
                tokens: f,
                cache: c,
                logits: Logits::Last,
            })
            .collect();
        let rows = gpu.forward_batch_top(&mut batch, k, &want).unwrap();
        for i in 0..6 {
            let RowLogits::Full(full) = &rows[i] else {
                panic!("step {step} row {i}: candidates that were not asked for")
            };
            assert_eq!(full.len(), vocab);
            match &rows[i + 6] {
                RowLogits::Full(twin) => {
                    assert_eq!(step, 0, "step {step} row {}: a decode row in full", i + 6);
                    assert_eq!(twin, full, "prompt rows of twins");
                }
                RowLogits::Top(top) => {
                    assert!(step > 0, "a prompt row as candidates");
                    let want = TopLogits::from_row(full, k).unwrap();
                    assert_eq!(top.ids, want.ids, "step {step} row {i}: ids");
                    assert_eq!(top.logits, want.logits, "step {step} row {i}: logits");
                    let dz = (top.log_z - want.log_z).abs() / want.log_z.abs().max(1.0);
                    assert!(dz < 1e-12, "step {step} row {i}: log_z {dz:e}");
                }
            }
        }
    }
    eprintln!("batched candidates equal the host reference of the twin rows for 5 steps");
}

/// The GPU model, shared, answering the scheduler with candidates where it asks for them
/// (`candidates`), or with every row in full, as the trait's default `forward_batch_top` does.
struct Shared {
    gpu: Arc<dyn ExternalNet>,
    candidates: bool,
}

impl ExternalNet for Shared {
    fn config(&self) -> &ModelConfig {
        self.gpu.config()
    }
    fn forward(&self, t: &[u32], c: &mut KvCache, w: Logits) -> trit::Result<Vec<f32>> {
        self.gpu.forward(t, c, w)
    }
    fn weight_bytes(&self) -> usize {
        self.gpu.weight_bytes()
    }
    fn bytes_per_token(&self) -> usize {
        self.gpu.bytes_per_token()
    }
    fn max_sequences(&self) -> usize {
        self.gpu.max_sequences()
    }
    fn forward_batch(&self, s: &mut [BatchSeq<'_>]) -> trit::Result<Vec<Vec<f32>>> {
        self.gpu.forward_batch(s)
    }
    fn forward_batch_top(
        &self,
        s: &mut [BatchSeq<'_>],
        k: usize,
        want_top: &[bool],
    ) -> trit::Result<Vec<trit::sample::RowLogits>> {
        if self.candidates {
            return self.gpu.forward_batch_top(s, k, want_top);
        }
        Ok(self
            .gpu
            .forward_batch(s)?
            .into_iter()
            .map(RowLogits::Full)
            .collect())
    }
}

type Reply = (Vec<u32>, Vec<TokenLogprob>);

/// Every request at once through a scheduler over `net`; each reply's tokens and logprobs.
fn serve(
    net: Box<dyn ExternalNet>,
    tok: &Arc<Tokenizer>,
    prompts: &[Vec<u32>],
    requests: &[(GenerateOptions, usize)],
    ctx: usize,
    label: &str,
) -> Vec<Reply> {
    let model = Arc::new(Model::from_external(net));
    let config = SchedulerConfig {
        n_ctx: ctx,
        parallel: prompts.len(),
        max_queue: 8,
        kv_cache_bytes: 64 << 20,
        context_shift: None,
        draft: None,
    };
    let sched = Scheduler::start(model, tok.clone(), config).unwrap();
    let rxs: Vec<_> = prompts
        .iter()
        .zip(requests)
        .map(|(p, (opts, top))| {
            let (tx, rx) = mpsc::channel();
            sched
                .submit(SeqRequest {
                    prompt: p.clone(),
                    options: opts.clone(),
                    top_logprobs: Some(*top),
                    keep: None,
                    sink: Box::new(move |e| tx.send(e).is_ok()),
                })
                .unwrap();
            rx
        })
        .collect();
    rxs.iter()
        .map(|rx| {
            let (mut tokens, mut lps) = (Vec::new(), Vec::new());
            loop {
                match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
                    SeqEvent::Piece { token, logprob, .. } => {
                        tokens.extend(token);
                        lps.extend(logprob);
                    }
                    SeqEvent::Done(_) => break (tokens, lps),
                    SeqEvent::Prompt { .. } => {}
                    SeqEvent::Error(e) => panic!("{label}: unexpected error {e}"),
                }
            }
        })
        .collect()
}

/// Requests with these sampling settings (and `top_logprobs` counts): greedy, the server's
/// default, wide top-k, min-p, top-p alone, a presence penalty, and six more random ones.
fn sampled_requests() -> Vec<(GenerateOptions, usize)> {
    let sampled = |t: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64| GenerateOptions {
        max_tokens: 24,
        sampling: SamplingParams {
            temperature: t,
            top_k,
            top_p,
            min_p,
            penalties: Penalties::default(),
            seed,
            logit_bias: Vec::new(),
            dry: None,
            mirostat: None,
            dynatemp: None,
            truncation: Default::default(),
        },
        stop: vec![],
        eos: vec![],
        constraint: None,
    };
    let mut penalized = sampled(0.7, 20, 0.8, 0.0, 5);
    penalized.sampling.penalties.presence = 0.8;
    let mut requests = vec![
        (sampled(0.0, 0, 1.0, 0.0, 0), 5),
        (sampled(0.7, 20, 0.8, 0.0, 1), 20),
        (sampled(1.0, 64, 1.0, 0.0, 2), 3),
        (sampled(0.9, 40, 0.95, 0.05, 3), 0),
        (sampled(1.0, 0, 0.9, 0.0, 4), 2),
        (penalized, 1),
    ];
    for seed in 10..16 {
        requests.push((sampled(1.1, 50, 0.9, 0.0, seed), 4));
    }
    requests
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn scheduler_on_the_gpu_samples_the_same_from_candidates_as_from_full_rows() {
    if gpu_missing() {
        return;
    }
    let files = trit::format::open(&default_model_path()).unwrap();
    let tok = Arc::new(Tokenizer::from_source(&files.tokenizer).unwrap());
    let ctx = 128;
    let gpu = Arc::new(CudaModel::load(&files, &CudaOptions::new(ctx)).unwrap());
    let texts = [
        "The capital of France is",
        "Once upon a time",
        "def fibonacci(n):",
        "The ocean is",
        "One, two, three,",
        "In the beginning",
    ];
    let prompts: Vec<Vec<u32>> = (0..12)
        .map(|i| tok.encode(texts[i % texts.len()], false).unwrap())
        .collect();
    same_from_candidates_as_from_full_rows(gpu, &tok, &prompts, ctx);
}

/// The same on the hybrid (tiny-qwen35): twelve sequences decoding together through its
/// batched step (rows through the small-batch GEMMs and the per-slot DeltaNet and attention
/// kernels), prompts of 3 to 25 tokens.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn scheduler_on_the_gpu_runs_hybrid_sequences_together() {
    if gpu_missing() {
        return;
    }
    use trit::format::testgen::hybrid::{generate, HybridPreset};
    use trit::format::testgen::{OutFormat, TokenizerAssets};
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset::by_name("tiny-qwen35").unwrap();
    let f = OutFormat::parse("q2_0").unwrap();
    generate(&p, 31, dir.path(), &[f], &TokenizerAssets::Placeholder).unwrap();
    let files = trit::format::open(&dir.path().join(f.file_name())).unwrap();
    let tok = Arc::new(Tokenizer::from_source(&files.tokenizer).unwrap());
    let ctx = 96;
    let gpu = trit_cuda::hybrid::CudaHybrid::load(&files, &CudaOptions::new(ctx)).unwrap();
    assert!(gpu.max_sequences() >= 12, "{}", gpu.max_sequences());
    let vocab = files.config.vocab;
    let prompts: Vec<Vec<u32>> = (0..12)
        .map(|i| prompt(3 + 2 * i, vocab, 40 + i as u64))
        .collect();
    same_from_candidates_as_from_full_rows(Arc::new(gpu), &tok, &prompts, ctx);
}

/// Serves `prompts` with [`sampled_requests`] through a scheduler over `gpu`, once answering
/// with candidates and once with full rows: every request must get the same tokens and
/// log-probabilities.
fn same_from_candidates_as_from_full_rows(
    gpu: Arc<dyn ExternalNet>,
    tok: &Arc<Tokenizer>,
    prompts: &[Vec<u32>],
    ctx: usize,
) {
    let requests = sampled_requests();
    // Candidates first: the full-row run is the reference either way.
    let top = serve(
        Box::new(Shared {
            gpu: gpu.clone(),
            candidates: true,
        }),
        tok,
        prompts,
        &requests,
        ctx,
        "candidates",
    );
    let full = serve(
        Box::new(Shared {
            gpu: gpu.clone(),
            candidates: false,
        }),
        tok,
        prompts,
        &requests,
        ctx,
        "full rows",
    );
    let mut worst = 0f32;
    for (i, (f, t)) in full.iter().zip(&top).enumerate() {
        assert_eq!(f.0, t.0, "request {i}: tokens");
        assert_eq!(f.1.len(), t.1.len());
        for (a, b) in f.1.iter().zip(&t.1) {
            assert_eq!(a.token, b.token);
            let ids = |l: &TokenLogprob| l.top.iter().map(|x| x.0).collect::<Vec<_>>();
            assert_eq!(ids(a), ids(b), "request {i}: top logprob tokens");
            // The normalizer is summed in f64 on both sides, in a different order: equal to
            // f64 rounding, which f32 logprobs almost never show (at most one f32 step).
            let d = std::iter::once((a.logprob, b.logprob))
                .chain(a.top.iter().zip(&b.top).map(|(x, y)| (x.1, y.1)))
                .map(|(x, y)| (x - y).abs() / x.abs().max(1.0))
                .fold(0f32, f32::max);
            worst = worst.max(d);
        }
    }
    assert!(worst <= 1e-6, "logprobs differ by {worst:e} (relative)");
    eprintln!(
        "{} requests, {} tokens: same tokens with candidates as with full rows, logprobs \
         within {worst:e}",
        requests.len(),
        full.iter().map(|r| r.0.len()).sum::<usize>()
    );
}
