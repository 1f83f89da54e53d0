//! `trit bench MODEL`: throughput in llama-bench's convention (conventions.md §3.1), or in
//! mlx_lm.benchmark's (`--format mlx`, §3.2), plus what tells a reader how far from the machine's
//! limit the numbers are: peak RSS, load time, weight bytes read per token, kernel level and,
//! with `--membw`, the measured read bandwidth and the decode ceiling it implies.
//!
//! Method (as llama-bench): prompts are random token ids (seeded), so tokenization and sampling
//! are excluded; `pp` runs from an empty cache (or one pre-filled to `-d` tokens) and needs
//! logits for the last position only; `tg` feeds single tokens, one forward call each; every
//! test runs once untimed as a warm-up.

mod batched;
mod membw;
mod mlx;
mod profile;
mod report;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::time::Instant;
use trit::format::ModelFiles;
use trit::model::{DevicePick, KvCache, Logits, Model};
use trit::sample::{RowLogits, Sampler, SamplingParams, TOP_CANDIDATES};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Model path (positional form of --model).
    pub path: Option<PathBuf>,
    /// GGUF file, MLX 2-bit folder, or unpacked FP16/BF16 safetensors folder.
    #[arg(short, long, env = "TRIT_MODEL")]
    pub model: Option<PathBuf>,
    /// Prompt lengths to test, comma-separated (0 = none). mlx style: one length, default 512.
    #[arg(
        short = 'p',
        long = "n-prompt",
        alias = "prompt-tokens",
        value_name = "N[,N..]"
    )]
    pub n_prompt: Option<String>,
    /// Generation lengths, comma-separated (0 = none). mlx style: number of trials (default 5).
    #[arg(
        short = 'n',
        long = "n-gen",
        alias = "num-trials",
        value_name = "N[,N..]"
    )]
    pub n_gen: Option<String>,
    /// Prompt+generation tests "PP,TG" (llama-bench's -pg), repeatable.
    #[arg(long = "pg", value_name = "PP,TG")]
    pub pg: Vec<String>,
    /// Cache depths to measure at, comma-separated (pre-filled, untimed).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_name = "N[,N..]",
        default_value = "0"
    )]
    pub n_depth: String,
    /// Timed repetitions of each test (default 5).
    #[arg(short = 'r', long = "repetitions")]
    pub repetitions: Option<usize>,
    /// Threads, comma-separated (default: physical cores).
    #[arg(short = 't', long = "threads", value_name = "N[,N..]")]
    pub threads: Option<String>,
    /// Prompt tokens per forward call.
    #[arg(
        long = "ubatch-size",
        alias = "batch-size-tokens",
        default_value_t = 512
    )]
    pub ubatch: usize,
    /// llama style: output format. Other formats print at the end of the run.
    #[arg(short = 'o', long = "output", value_enum)]
    pub output: Option<Output>,
    /// Report style: llama-bench's table (default) or mlx_lm.benchmark's trial lines.
    #[arg(long = "format", value_enum, default_value = "llama")]
    pub format: Style,
    /// mlx style: tokens generated per trial (default 1024).
    #[arg(short = 'g', long = "generation-tokens")]
    pub generation_tokens: Option<usize>,
    /// mlx style: batch size (only 1 is supported).
    #[arg(short = 'b', long = "batch-size")]
    pub batch_size: Option<usize>,
    /// Skip the untimed warm-up run of each test.
    #[arg(long)]
    pub no_warmup: bool,
    /// Where the model runs: cpu, or cuda (needs a build with `--features cuda`).
    #[arg(long, value_enum, default_value_t = super::Device::Cpu, env = "TRIT_DEVICE")]
    pub device: super::Device,
    /// Seed of the random prompt token ids.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also measure this machine's memory read bandwidth with the same threads and print the
    /// decode ceiling (bandwidth / bytes read per token) and the share of it tg reached.
    #[arg(long)]
    pub membw: bool,
    /// Buffer size of the --membw measurement, MiB.
    #[arg(long, default_value_t = 1024, value_name = "MIB")]
    pub membw_mib: usize,
    /// Passes over the buffer of the --membw measurement.
    #[arg(long, default_value_t = 10)]
    pub membw_passes: usize,
    /// Generation tests feed back each step's argmax (greedy generation, what `trit run --temp
    /// 0` does) instead of random tokens, picked where the backend picks greedy tokens: a GPU
    /// model keeps the whole loop on the device (no logits copy and no host round trip per
    /// token). The tests are named `tg<N> greedy`; plain `tg<N>` is llama-bench's test.
    #[arg(long, conflicts_with = "sampled")]
    pub greedy: bool,
    /// Generation tests sample each next token with trit's default sampler (temperature 0.7,
    /// top-k 20, top-p 0.8; seed `--seed`), where the backend samples: a GPU model draws on the
    /// device inside its loop, else the host samples from the GPU's candidates. Named
    /// `tg<N> sampled`.
    #[arg(long)]
    pub sampled: bool,
    /// Print progress to stderr.
    #[arg(long)]
    pub progress: bool,
    /// Sequences run together (llama-batched-bench's -npl), e.g. 1,8,32: each reads a -p-token
    /// prompt and generates -n tokens, all in batched calls; prints its PP/TG/B/N_KV table.
    #[arg(long, value_name = "B[,B..]")]
    pub npl: Option<String>,
    /// After the results, print per-op time counters (each matmul kind, activation
    /// quantization, norms, RoPE, attention, SwiGLU) of every test's timed runs.
    #[arg(long)]
    pub profile: bool,
    #[command(flatten)]
    pub cache_types: super::CacheTypeArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Md,
    Json,
    Jsonl,
    Csv,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Style {
    Llama,
    Mlx,
}

/// One llama-bench test instance: `pp<n_prompt>`, `tg<n_gen>` or both, at a cache depth.
#[derive(Clone, Debug, PartialEq)]
pub struct Test {
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_depth: usize,
    pub n_threads: usize,
    /// How generation picks the tokens it feeds back.
    pub feed: Feed,
}

/// Tokens a generation test feeds: llama-bench's random ones, or the model's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feed {
    Random,
    /// Each step's argmax (`--greedy`).
    Greedy,
    /// trit's default sampler (`--sampled`).
    Sampled,
}

impl Test {
    /// llama-bench's test name: `pp512`, `tg128`, `pp512+tg128`, with ` @ d<N>` at depth;
    /// ` greedy` or ` sampled` after the generation part of a `--greedy` / `--sampled` test.
    pub fn name(&self) -> String {
        let g = match self.feed {
            Feed::Random => "",
            Feed::Greedy => " greedy",
            Feed::Sampled => " sampled",
        };
        let mut s = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, n) => format!("tg{n}{g}"),
            (p, n) => format!("pp{p}+tg{n}{g}"),
        };
        if self.n_depth > 0 {
            s += &format!(" @ d{}", self.n_depth);
        }
        s
    }

    fn tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }
}

/// Timed samples of one test.
pub struct Measured {
    pub test: Test,
    pub samples_ns: Vec<u64>,
    pub test_time: std::time::SystemTime,
}

impl Measured {
    /// Tokens per second of each sample (llama-bench averages these, not the times).
    pub fn samples_ts(&self) -> Vec<f64> {
        let n = self.test.tokens() as f64;
        self.samples_ns
            .iter()
            .map(|&ns| n * 1e9 / ns.max(1) as f64)
            .collect()
    }
}

/// Facts about the model and the run shared by every output format.
pub struct RunInfo {
    pub model_filename: String,
    /// `arch size-label type`, e.g. `qwen3 1.7B PQ2_0`.
    pub model_type: String,
    pub model_size: usize,
    pub model_n_params: usize,
    pub load_secs: f64,
    pub weight_bytes_per_token: usize,
    /// KV-cache bytes read per token per position already cached (K and V, all layers).
    pub kv_bytes_per_position: usize,
    /// How the cache stores keys and values.
    pub kv_types: trit::model::KvTypes,
    pub kernel_level: String,
    pub ubatch: usize,
    pub peak_rss: Option<u64>,
    pub membw: Option<membw::Bandwidth>,
}

/// Parses a llama-bench style comma list of non-negative integers.
fn parse_list(flag: &str, s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(|v| {
            let v = v.trim();
            v.parse::<usize>().map_err(|_| {
                let hint = if flag == "-p" && v.starts_with('g') {
                    " (for a prompt+generation test use --pg PP,TG)"
                } else {
                    ""
                };
                anyhow::anyhow!("{flag}: '{v}' is not a non-negative integer{hint}")
            })
        })
        .collect()
}

fn single(flag: &str, s: &str) -> Result<usize> {
    match parse_list(flag, s)?.as_slice() {
        [v] => Ok(*v),
        _ => bail!("{flag} takes one number in --format mlx, got '{s}'"),
    }
}

/// The tests llama-bench would run for these flags, in its order: threads and depth outer,
/// then every prompt test, every generation test, every prompt+generation pair.
fn plan_tests(a: &BenchArgs, threads: &[usize]) -> Result<Vec<Test>> {
    let prompts = parse_list("-p", a.n_prompt.as_deref().unwrap_or("512"))?;
    let gens = parse_list("-n", a.n_gen.as_deref().unwrap_or("128"))?;
    let depths = parse_list("-d", &a.n_depth)?;
    let mut pairs = Vec::new();
    for pg in &a.pg {
        match parse_list("--pg", pg)?.as_slice() {
            [p, g] if *p > 0 && *g > 0 => pairs.push((*p, *g)),
            _ => bail!("--pg takes two positive numbers PP,TG, got '{pg}'"),
        }
    }
    let mut tests = Vec::new();
    for &n_threads in threads {
        for &n_depth in &depths {
            let t = |n_prompt, n_gen| Test {
                n_prompt,
                n_gen,
                n_depth,
                n_threads,
                feed: match (a.greedy, a.sampled) {
                    _ if n_gen == 0 => Feed::Random,
                    (true, _) => Feed::Greedy,
                    (_, true) => Feed::Sampled,
                    _ => Feed::Random,
                },
            };
            tests.extend(prompts.iter().filter(|&&p| p > 0).map(|&p| t(p, 0)));
            tests.extend(gens.iter().filter(|&&g| g > 0).map(|&g| t(0, g)));
            tests.extend(pairs.iter().map(|&(p, g)| t(p, g)));
        }
    }
    if tests.is_empty() {
        bail!("nothing to measure: every -p and -n value is 0 and no --pg was given");
    }
    Ok(tests)
}

fn thread_counts(a: &BenchArgs) -> Result<Vec<usize>> {
    let list = match &a.threads {
        Some(s) => parse_list("-t", s)?,
        None => vec![trit::threadpool::default_threads()],
    };
    if list.contains(&0) {
        bail!("-t: thread counts must be at least 1");
    }
    let mut distinct = Vec::new();
    for t in list {
        if !distinct.contains(&t) {
            distinct.push(t);
        }
    }
    Ok(distinct)
}

/// Deterministic random token ids (SplitMix64), uniform over the vocabulary.
struct TokenRng(u64);

impl TokenRng {
    fn next(&mut self, vocab: usize) -> u32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z as u128 * vocab as u128) >> 64) as u32
    }

    fn tokens(&mut self, n: usize, vocab: usize) -> Vec<u32> {
        (0..n).map(|_| self.next(vocab)).collect()
    }
}

/// A model loaded for one thread count.
struct Bench {
    model: Model,
    vocab: usize,
    ubatch: usize,
    rng: TokenRng,
    /// The sampler's seed of `--sampled` tests.
    seed: u64,
}

impl Bench {
    fn prefill(&mut self, cache: &mut KvCache, n: usize) -> Result<Vec<f32>> {
        let tokens = self.rng.tokens(n, self.vocab);
        let mut logits = Vec::new();
        for chunk in tokens.chunks(self.ubatch) {
            logits = self.model.forward(chunk, cache, Logits::Last)?;
        }
        Ok(logits)
    }

    /// `n` tokens after a random one, each the model's argmax (`Feed::Greedy`) or sampled
    /// (`Feed::Sampled`): on the backend's device loop where it has one, else picked by the
    /// host (from the GPU's candidates where it gives them).
    fn generate_fed(&mut self, cache: &mut KvCache, n: usize, feed: Feed) -> Result<()> {
        let params = match feed {
            Feed::Sampled => SamplingParams {
                seed: self.seed,
                ..SamplingParams::default()
            },
            _ => SamplingParams::greedy(),
        };
        let mut sampler = Sampler::new(params.clone())?;
        let pick = match feed {
            Feed::Sampled => DevicePick::Sample {
                temperature: params.temperature,
                top_k: params.top_k,
                top_p: params.top_p,
                min_p: params.min_p,
                rng: sampler.rng_state(),
            },
            _ => DevicePick::Argmax,
        };
        let first = self.rng.next(self.vocab);
        let mut left = n;
        let run = self
            .model
            .decode_on_device(first, cache, n, &pick, &[], &mut |_, _| {
                left -= 1;
                left > 0
            })?;
        if run.is_some() {
            return Ok(());
        }
        let mut tok = first;
        for _ in 0..n {
            tok = match self.model.forward_top(&[tok], cache, TOP_CANDIDATES)? {
                RowLogits::Top(top) => sampler.sample_top(&top),
                RowLogits::Full(mut row) => sampler.sample(&mut row, &[]),
            };
        }
        Ok(())
    }

    fn generate(&mut self, cache: &mut KvCache, n: usize) -> Result<()> {
        for _ in 0..n {
            let tok = self.rng.next(self.vocab);
            // As in llama-bench, the row reaches host memory and nothing reads it: a GPU model
            // lends its page-locked copy instead of copying it again.
            self.model
                .forward_read(&[tok], cache, Logits::Last, &mut |_| {})?;
        }
        Ok(())
    }

    /// One timed run of `t` on a cache holding exactly `t.n_depth` tokens.
    fn run_once(&mut self, t: &Test, cache: &mut KvCache) -> Result<u64> {
        self.back_to_depth(cache, t.n_depth)?;
        let start = Instant::now();
        if t.n_prompt > 0 {
            self.prefill(cache, t.n_prompt)?;
        }
        if t.feed != Feed::Random {
            self.generate_fed(cache, t.n_gen, t.feed)?;
        } else {
            self.generate(cache, t.n_gen)?;
        }
        Ok(start.elapsed().as_nanos() as u64)
    }

    /// The cache cut back to `depth` tokens, untimed. A recurrent state (hybrids) cannot be
    /// cut: it is cleared and the depth prefilled again, as llama-bench does for every model
    /// (else the next step would replay the sequence, or start from an earlier state, inside
    /// the timed run).
    fn back_to_depth(&mut self, cache: &mut KvCache, depth: usize) -> Result<()> {
        if self.model.config().hybrid.is_some() && depth > 0 {
            cache.truncate(0);
            self.prefill(cache, depth)?;
        } else {
            cache.truncate(depth);
        }
        if cache.len() != depth {
            bail!(
                "bench: the cache holds {} tokens, not the depth {depth}",
                cache.len()
            );
        }
        Ok(())
    }

    fn measure(
        &mut self,
        t: &Test,
        reps: usize,
        warmup: bool,
        progress: bool,
        profiles: Option<&mut Vec<profile::TestProfile>>,
    ) -> Result<Measured> {
        let mut cache = self.model.new_cache(t.n_depth + t.tokens());
        if t.n_depth > 0 {
            self.prefill(&mut cache, t.n_depth)?;
        }
        if warmup {
            // llama-bench warms up with the whole prompt, or with a single decode step.
            cache.truncate(t.n_depth);
            if t.n_prompt > 0 {
                self.prefill(&mut cache, t.n_prompt)?;
            } else if t.feed != Feed::Random {
                // The whole run once: the device loop captures its graphs on first use.
                self.generate_fed(&mut cache, t.n_gen, t.feed)?;
            } else {
                self.generate(&mut cache, 1)?;
            }
        }
        let test_time = std::time::SystemTime::now();
        let mut samples_ns = Vec::with_capacity(reps);
        if profiles.is_some() {
            profile::begin();
        }
        for r in 0..reps {
            if progress {
                eprintln!("trit bench: {} rep {}/{reps}", t.name(), r + 1);
            }
            samples_ns.push(self.run_once(t, &mut cache)?);
        }
        if let Some(p) = profiles {
            let total = samples_ns.iter().sum();
            p.push(profile::end(t.name(), t.tokens(), reps, total, t.n_threads));
        }
        Ok(Measured {
            test: t.clone(),
            samples_ns,
            test_time,
        })
    }
}

/// Parameters and stored size as llama-bench counts them: every tensor of the file.
fn count_weights(files: &ModelFiles) -> Result<(usize, usize, String)> {
    let mut by_type: Vec<(String, usize)> = Vec::new();
    let (mut params, mut bytes) = (0usize, 0usize);
    for name in files.weights.tensor_names() {
        let Some(view) = files.weights.tensor(&name)? else {
            continue;
        };
        let (ty, b) = (view.data.kind_name(), view.data.stored_bytes());
        params += view.shape.iter().product::<usize>();
        bytes += b;
        match by_type.iter_mut().find(|(t, _)| *t == ty) {
            Some(e) => e.1 += b,
            None => by_type.push((ty, b)),
        }
    }
    // The type label is the storage type holding most of the bytes (the weight matrices).
    let main_type = by_type
        .into_iter()
        .max_by_key(|(_, b)| *b)
        .map(|(t, _)| t)
        .unwrap_or_else(|| "?".into());
    Ok((params, bytes, main_type))
}

/// The conventional size label of a parameter count: the nearest common model size within
/// 8 % (Qwen3-8B has 8.19 B parameters and is called 8B), else the count rounded.
fn size_label(params: usize) -> String {
    const KNOWN: &[(f64, &str)] = &[
        (135e6, "135M"),
        (360e6, "360M"),
        (0.6e9, "0.6B"),
        (1e9, "1B"),
        (1.7e9, "1.7B"),
        (2e9, "2B"),
        (3e9, "3B"),
        (4e9, "4B"),
        (7e9, "7B"),
        (8e9, "8B"),
        (14e9, "14B"),
        (27e9, "27B"),
        (32e9, "32B"),
        (70e9, "70B"),
    ];
    let p = params as f64;
    if let Some((_, label)) = KNOWN.iter().find(|(n, _)| (p / n - 1.0).abs() < 0.08) {
        return label.to_string();
    }
    if p >= 1e9 {
        format!("{:.1}B", p / 1e9)
    } else {
        format!("{:.0}M", p / 1e6)
    }
}

struct LoadedBench {
    bench: Bench,
    info_model_type: String,
    model_size: usize,
    model_n_params: usize,
    load_secs: f64,
    max_ctx: usize,
    kv_bytes_per_position: usize,
}

/// `positions`: the longest test's cache size (what a GPU model allocates).
fn load(
    path: &std::path::Path,
    threads: usize,
    a: &BenchArgs,
    positions: usize,
) -> Result<LoadedBench> {
    let t0 = Instant::now();
    let files = trit::format::open(path).with_context(|| format!("loading {}", path.display()))?;
    let model = super::load_model(&files, threads, a.device, positions.max(1), None)?
        .with_kv_types(a.cache_types.types())?;
    let load_secs = t0.elapsed().as_secs_f64();
    let (params, size, ty) = count_weights(&files)?;
    let c = model.config();
    let model_type = format!("{} {} {ty}", c.arch_name(), size_label(params));
    let kv = KvCache::bytes_for(
        c.kv_layers(),
        c.n_kv_heads * c.head_dim,
        a.cache_types.types(),
        1,
    );
    let (vocab, max_ctx) = (c.vocab, c.max_ctx);
    Ok(LoadedBench {
        bench: Bench {
            model,
            vocab,
            ubatch: a.ubatch,
            rng: TokenRng(a.seed),
            seed: a.seed,
        },
        info_model_type: model_type,
        model_size: size,
        model_n_params: params,
        load_secs,
        max_ctx,
        kv_bytes_per_position: kv,
    })
}

pub fn run(a: BenchArgs) -> Result<()> {
    if a.path.is_some() && a.model.is_some() {
        bail!("give the model once: either as a positional path or with --model");
    }
    let path = super::resolve_model(&a.path.clone().or(a.model.clone()))?;
    if a.ubatch == 0 {
        bail!("--ubatch-size must be at least 1");
    }
    if a.membw && (a.membw_mib == 0 || a.membw_passes == 0) {
        bail!("--membw-mib and --membw-passes must be at least 1");
    }
    match (a.format, &a.npl) {
        (Style::Mlx, Some(_)) => bail!("--npl is not an mlx flag (use --format llama)"),
        (Style::Mlx, None) => mlx::run_mlx(&a, &path),
        (Style::Llama, Some(npl)) => batched::run(&a, &path, npl),
        (Style::Llama, None) => run_llama(&a, &path),
    }
}

fn run_llama(a: &BenchArgs, path: &std::path::Path) -> Result<()> {
    if a.generation_tokens.is_some() || a.batch_size.is_some() {
        bail!("-g and -b are mlx_lm.benchmark flags: use them with --format mlx (llama style: -p, -n)");
    }
    let reps = a.repetitions.unwrap_or(5);
    if reps == 0 {
        bail!("-r: at least one repetition is needed");
    }
    let threads = thread_counts(a)?;
    let tests = plan_tests(a, &threads)?;
    let output = a.output.unwrap_or(Output::Md);

    let mut results = Vec::new();
    let mut profiles = Vec::new();
    let mut info: Option<RunInfo> = None;
    let mut printer = report::Markdown::default();
    let needed = tests
        .iter()
        .map(|t| t.n_depth + t.tokens())
        .max()
        .unwrap_or(0);
    for &n_threads in &threads {
        let mut lb = load(path, n_threads, a, needed)?;
        if needed > lb.max_ctx {
            bail!(
                "the longest test needs {needed} positions but the model's context is {} tokens",
                lb.max_ctx
            );
        }
        let info = info.get_or_insert_with(|| RunInfo {
            model_filename: path.display().to_string(),
            model_type: lb.info_model_type.clone(),
            model_size: lb.model_size,
            model_n_params: lb.model_n_params,
            load_secs: lb.load_secs,
            weight_bytes_per_token: lb.bench.model.bytes_per_token(),
            kv_bytes_per_position: lb.kv_bytes_per_position,
            kv_types: a.cache_types.types(),
            kernel_level: match a.device {
                super::Device::Cpu => trit::kernels::level().name().to_string(),
                super::Device::Cuda => "cuda".to_string(),
            },
            ubatch: a.ubatch,
            peak_rss: None,
            membw: None,
        });
        for t in tests.iter().filter(|t| t.n_threads == n_threads) {
            let prof = a.profile.then_some(&mut profiles);
            let m = lb.bench.measure(t, reps, !a.no_warmup, a.progress, prof)?;
            if output == Output::Md {
                printer.row(info, &m);
            }
            results.push(m);
        }
    }
    let mut info = info.expect("at least one thread count");
    info.peak_rss = trit::engine::stats::peak_rss_bytes();
    if a.membw {
        // After the model runs, so the 1 GiB buffer does not count in the peak RSS above.
        let n = *threads.last().expect("thread list is not empty");
        info.membw = Some(membw::measure(n, a.membw_mib << 20, a.membw_passes));
    }
    match output {
        Output::Md => printer.finish(&info, &results),
        Output::Json => report::json(&info, &results, false),
        Output::Jsonl => report::json(&info, &results, true),
        Output::Csv => report::csv(&info, &results),
    }
    // Tables go after the results: on stdout with the markdown table, on stderr otherwise so
    // JSON/CSV output stays parseable.
    for p in &profiles {
        if output == Output::Md {
            profile::print(&mut std::io::stdout(), p)?;
        } else {
            profile::print(&mut std::io::stderr(), p)?;
        }
    }
    Ok(())
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_names_follow_llama_bench() {
        let t = |p, g, d| Test {
            n_prompt: p,
            n_gen: g,
            n_depth: d,
            n_threads: 2,
            feed: Feed::Random,
        };
        assert_eq!(t(512, 0, 0).name(), "pp512");
        assert_eq!(t(0, 128, 0).name(), "tg128");
        assert_eq!(t(512, 128, 0).name(), "pp512+tg128");
        assert_eq!(t(0, 128, 4096).name(), "tg128 @ d4096");
        let g = Test {
            feed: Feed::Greedy,
            ..t(0, 128, 0)
        };
        assert_eq!(g.name(), "tg128 greedy");
    }

    #[test]
    fn size_labels_round_to_the_usual_names() {
        assert_eq!(size_label(1_720_000_000), "1.7B");
        assert_eq!(size_label(8_190_000_000), "8B");
        assert_eq!(size_label(42_044_160), "42M");
        assert_eq!(size_label(5_300_000_000), "5.3B");
    }

    #[test]
    fn comma_lists_parse_and_bad_values_are_named() {
        assert_eq!(parse_list("-p", "128, 512").unwrap(), vec![128, 512]);
        let e = parse_list("-p", "g").unwrap_err().to_string();
        assert!(e.contains("--pg"), "{e}");
        assert!(parse_list("-n", "-3").is_err());
    }

    #[test]
    fn token_ids_are_seeded_and_in_range() {
        let a = TokenRng(7).tokens(1000, 151_936);
        assert_eq!(a, TokenRng(7).tokens(1000, 151_936));
        assert_ne!(a, TokenRng(8).tokens(1000, 151_936));
        assert!(a.iter().all(|&t| t < 151_936));
        assert!(
            a.iter().any(|&t| t > 100_000),
            "not spread over the vocabulary"
        );
    }
}
