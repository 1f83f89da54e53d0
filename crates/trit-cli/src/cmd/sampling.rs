//! Sampling flags: `SamplerArgs` (how tokens are picked; `run`, `chat`, and `serve`, which
//! takes them as the defaults of requests that leave a field unset, as llama-server does) and
//! `SamplingArgs` (those plus a generation's length, seed, stops and logit bias).

use super::Loaded;
use anyhow::{bail, Result};
use clap::Args;
use std::sync::Arc;
use trit::sample::dry::DEFAULT_BREAKERS;
use trit::sample::{
    Breakers, Dry, DynamicTemperature, Mirostat, Penalties, SamplingParams, Truncation,
};

/// Unset flags take the model's recommendation (GGUF `general.sampling.*`, else
/// `generation_config.json`, else Qwen3's no-thinking values) or llama.cpp's default.
#[derive(Args, Clone, Debug, Default)]
pub struct SamplerArgs {
    /// Temperature (0 = greedy). Default: the model's recommendation.
    #[arg(long)]
    pub temp: Option<f32>,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Repetition penalty (1.0 = off).
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
    /// Presence penalty (default 0).
    #[arg(long)]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty (default 0).
    #[arg(long)]
    pub frequency_penalty: Option<f32>,
    /// DRY repetition penalty (llama.cpp's): a token that would extend a repeat of at least
    /// --dry-allowed-length tokens loses MULT · base^(length − allowed) of its logit
    /// (default 0 = off).
    #[arg(long, value_name = "MULT")]
    pub dry_multiplier: Option<f32>,
    /// Default 1.75.
    #[arg(long)]
    pub dry_base: Option<f32>,
    /// Default 2.
    #[arg(long)]
    pub dry_allowed_length: Option<usize>,
    /// Recent tokens searched for repeats (default -1: the whole context; 0: off).
    #[arg(long, allow_negative_numbers = true)]
    pub dry_penalty_last_n: Option<i64>,
    /// A DRY sequence breaker (repeatable; replaces the defaults newline, `:`, `"`, `*`;
    /// "none" for no breakers).
    #[arg(long = "dry-sequence-breaker", value_name = "STRING")]
    pub dry_sequence_breakers: Vec<String>,
    /// Top-n-σ: drop tokens more than N standard deviations of the logits below the best
    /// (llama.cpp's --top-nsigma; off at ≤ 0, the default).
    #[arg(long = "top-nsigma", allow_negative_numbers = true)]
    pub top_n_sigma: Option<f32>,
    /// Locally typical sampling (llama.cpp's --typical; default 1 = off).
    #[arg(long = "typical", value_name = "P")]
    pub typical_p: Option<f32>,
    /// XTC: the chance per step of excluding the top choices (llama.cpp's; default 0 = off).
    #[arg(long)]
    pub xtc_probability: Option<f32>,
    /// XTC: tokens at least this likely count as top choices (default 0.1; above 0.5 XTC
    /// never acts).
    #[arg(long)]
    pub xtc_threshold: Option<f32>,
    /// Dynamic temperature: each step's temperature moves within --temp ± RANGE with the
    /// candidates' entropy (llama.cpp's; default 0 = off).
    #[arg(long, value_name = "RANGE")]
    pub dynatemp_range: Option<f32>,
    /// The exponent of that mapping (default 1).
    #[arg(long = "dynatemp-exp")]
    pub dynatemp_exponent: Option<f32>,
    /// Mirostat 1 or 2 (llama.cpp's; replaces the penalties and the truncation samplers;
    /// default 0 = off).
    #[arg(long, value_name = "N")]
    pub mirostat: Option<u8>,
    /// Mirostat's target surprise τ in bits per token (default 5).
    #[arg(long = "mirostat-ent", value_name = "TAU")]
    pub mirostat_tau: Option<f32>,
    /// Mirostat's learning rate η (default 0.1).
    #[arg(long = "mirostat-lr", value_name = "ETA")]
    pub mirostat_eta: Option<f32>,
}

impl SamplerArgs {
    /// The sampling parameters: these flags over the model's defaults, with `seed` and
    /// `logit_bias`.
    pub fn params(
        &self,
        loaded: &Loaded,
        seed: u64,
        logit_bias: Vec<(u32, f32)>,
    ) -> Result<SamplingParams> {
        let d = &loaded.files.generation;
        let t = Truncation::default();
        let p = SamplingParams {
            temperature: self.temp.or(d.temperature).unwrap_or(0.7),
            top_k: self.top_k.or(d.top_k).unwrap_or(20),
            top_p: self.top_p.or(d.top_p).unwrap_or(0.8),
            min_p: self.min_p.or(d.min_p).unwrap_or(0.0),
            penalties: Penalties {
                repetition: self.repeat_penalty.or(d.repetition_penalty).unwrap_or(1.0),
                presence: self.presence_penalty.unwrap_or(0.0),
                frequency: self.frequency_penalty.unwrap_or(0.0),
                last_n: 64,
            },
            seed,
            logit_bias,
            dry: self.dry(loaded)?,
            mirostat: match self.mirostat.unwrap_or(0) {
                0 => None,
                version => Some(Mirostat {
                    version,
                    tau: self.mirostat_tau.unwrap_or(5.0),
                    eta: self.mirostat_eta.unwrap_or(0.1),
                }),
            },
            dynatemp: self
                .dynatemp_range
                .filter(|&r| r > 0.0)
                .map(|range| DynamicTemperature {
                    range,
                    exponent: self.dynatemp_exponent.unwrap_or(1.0),
                }),
            truncation: Truncation {
                top_n_sigma: self.top_n_sigma.unwrap_or(t.top_n_sigma),
                typical_p: self.typical_p.unwrap_or(t.typical_p),
                xtc_probability: self.xtc_probability.unwrap_or(t.xtc_probability),
                xtc_threshold: self.xtc_threshold.unwrap_or(t.xtc_threshold),
            },
        };
        p.validate()?;
        Ok(p)
    }

    fn dry(&self, loaded: &Loaded) -> Result<Option<Dry>> {
        let multiplier = self.dry_multiplier.unwrap_or(0.0);
        if multiplier == 0.0 {
            return Ok(None);
        }
        let last_n = match self.dry_penalty_last_n.unwrap_or(-1) {
            -1 => loaded.n_ctx,
            n if n >= 0 => n as usize,
            n => bail!("--dry-penalty-last-n must be -1 (the context) or ≥ 0, not {n}"),
        };
        let strings: Vec<String> = match self.dry_sequence_breakers.as_slice() {
            [] => DEFAULT_BREAKERS.map(String::from).to_vec(),
            [none] if none == "none" => Vec::new(),
            list => list.to_vec(),
        };
        Ok(Some(Dry {
            multiplier,
            base: self.dry_base.unwrap_or(1.75),
            allowed_length: self.dry_allowed_length.unwrap_or(2),
            last_n,
            breakers: Arc::new(Breakers::new(&loaded.tokenizer, &strings)),
        }))
    }
}

#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Maximum tokens to generate; -1: until the context is full (with `run
    /// --context-shift`: no limit). llama.cpp's -n.
    #[arg(short = 'n', long, default_value_t = 256, allow_negative_numbers = true,
          value_parser = parse_max_tokens)]
    pub max_tokens: i64,
    #[command(flatten)]
    pub samplers: SamplerArgs,
    /// Random seed (same seed, same output).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop before this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Bias a token's logit, llama.cpp style: TOKEN_ID(+|-)BIAS, e.g. 15043+1 or 15043-inf
    /// (bans it); repeatable.
    #[arg(short = 'l', long, value_parser = parse_logit_bias, value_name = "ID(+|-)BIAS")]
    pub logit_bias: Vec<(u32, f32)>,
}

fn parse_max_tokens(s: &str) -> std::result::Result<i64, String> {
    match s.parse::<i64>() {
        Ok(n) if n >= -1 => Ok(n),
        _ => Err(format!("{s:?}: expected a token count, or -1 for no limit")),
    }
}

fn parse_logit_bias(s: &str) -> std::result::Result<(u32, f32), String> {
    let at = s
        .find(['+', '-'])
        .ok_or_else(|| format!("{s:?}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS"))?;
    let id = s[..at]
        .parse::<u32>()
        .map_err(|_| format!("{s:?}: {:?} is not a token id", &s[..at]))?;
    let bias = match &s[at..] {
        "-inf" => f32::NEG_INFINITY,
        b => b
            .parse::<f32>()
            .ok()
            .filter(|b| b.is_finite())
            .ok_or_else(|| format!("{s:?}: {b:?} is not a finite bias (or -inf)"))?,
    };
    Ok((id, bias))
}

impl SamplingArgs {
    /// `-n` as a length limit: None for -1 (until the context's end).
    pub fn token_limit(&self) -> Option<usize> {
        usize::try_from(self.max_tokens).ok()
    }

    /// The sampling parameters: these flags over the model's defaults. A biased token id
    /// outside the vocabulary is refused (the server answers it with a 400 likewise).
    pub fn params(&self, loaded: &Loaded) -> Result<SamplingParams> {
        let vocab = loaded.tokenizer.vocab_size();
        if let Some((id, _)) = self.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
            bail!("--logit-bias: {id} is not a token id of this model (0..{vocab})");
        }
        self.samplers
            .params(loaded, self.seed, self.logit_bias.clone())
    }
}
