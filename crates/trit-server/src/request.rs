//! Request bodies: decoding (with errors that name the offending field) and validation of the
//! fields both endpoints share, turning them into generation options for the scheduler.
//! Everything a client can get wrong ends here as a 4xx [`ApiError`], before any compute.

use crate::error::ApiError;
use crate::state::AppState;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;
use trit::engine::GenerateOptions;
use trit::sample::{
    Breakers, ConstrainedOutput, Dry, DynamicTemperature, Grammar, JsonSchema, LazyRule, Mirostat,
    OutputRule, Penalties, SamplingParams, Truncation,
};

/// Decodes a JSON body into `T`; a broken body or a wrong type is a 400 naming the field.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if std::str::from_utf8(body).is_err() {
        return Err(ApiError::invalid("request body is not valid UTF-8"));
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("request body must be a JSON object"));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        ApiError::invalid(format!("field '{path}': {}", e.inner()))
    })
}

/// A string or a list of strings (`stop`).
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Debug, Default, Clone)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields common to `/v1/chat/completions` and `/v1/completions`.
#[derive(Deserialize, Debug, Default)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    #[serde(alias = "repeat_penalty")]
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<OneOrMany>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    pub response_format: Option<Value>,
    pub logit_bias: Option<Value>,
    /// llama.cpp's top-level schema field (same as `response_format` json_schema).
    pub json_schema: Option<Value>,
    /// llama.cpp's GBNF grammar (a string): the output must be a string of it.
    pub grammar: Option<Value>,
    /// llama.cpp: the grammar binds only from a trigger on (`grammar_triggers`).
    pub grammar_lazy: Option<bool>,
    /// llama.cpp's triggers: `{"type": 1, "value": WORD}` (a word) or `{"type": 0, "value":
    /// TEXT, "token": ID}` (a token, by its text); patterns (types 2, 3) are refused.
    pub grammar_triggers: Option<Vec<Value>>,
    /// llama.cpp: keep generating past end-of-sequence tokens (they are banned).
    pub ignore_eos: Option<bool>,
    /// llama.cpp's name for max_tokens; −1: until the context is full.
    pub n_predict: Option<i64>,
    /// llama.cpp: prompt tokens a context shift keeps; −1: the whole prompt.
    pub n_keep: Option<i64>,
    /// llama.cpp samplers this server does not have: accepted at their neutral values only.
    pub typical_p: Option<f32>,
    pub tfs_z: Option<f64>,
    /// llama.cpp's mirostat: 0 off, 1 or 2, with `mirostat_tau` (5) and `mirostat_eta` (0.1).
    pub mirostat: Option<i64>,
    pub mirostat_tau: Option<f32>,
    pub mirostat_eta: Option<f32>,
    /// llama.cpp's DRY repetition penalty (`sample/dry.rs`): off at multiplier 0.
    pub dry_multiplier: Option<f32>,
    pub dry_base: Option<f32>,
    pub dry_allowed_length: Option<i64>,
    /// Recent tokens searched for repeats; −1: the whole context, 0: off.
    pub dry_penalty_last_n: Option<i64>,
    pub dry_sequence_breakers: Option<Vec<String>>,
    pub xtc_probability: Option<f32>,
    pub xtc_threshold: Option<f32>,
    pub top_n_sigma: Option<f32>,
    /// llama.cpp's dynamic temperature: `temperature ± range` by the candidates' entropy.
    pub dynatemp_range: Option<f32>,
    pub dynatemp_exponent: Option<f32>,
}

/// Choices one request may ask for (OpenAI's `n`).
pub const MAX_CHOICES: usize = 16;

/// What the scheduler needs, validated.
#[derive(Clone)]
pub struct Job {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub top_logprobs: Option<usize>,
    /// llama.cpp's `n_keep`: prompt tokens a context shift keeps (None: the server's `--keep`).
    pub keep: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    /// Choices to generate (OpenAI's `n`): sequences of the same prompt, choice i sampled
    /// with the seed + i.
    pub n: usize,
}

impl Common {
    /// Checks the model name and the parameters, and builds the job for `prompt`.
    pub fn job(
        &self,
        state: &AppState,
        prompt: Vec<u32>,
        top_logprobs: Option<usize>,
        rule: Option<OutputRule>,
    ) -> Result<Job, ApiError> {
        if let Some(m) = &self.model {
            if !state.accepts_model(m) {
                return Err(ApiError::not_found(format!(
                    "The model `{m}` does not exist (this server serves `{}`)",
                    state.config.model_id
                )));
            }
        }
        let n = match self.n {
            None => 1,
            Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::invalid(format!(
                    "n must be between 1 and {MAX_CHOICES}, got {n}"
                )))
            }
        };
        let constraint = match rule {
            // A tool call (chat's tool_choice): decoded under its tools' schema.
            Some(rule) => Some(ConstrainedOutput {
                rule,
                table: state.token_table(),
            }),
            None => self.constraint(state)?,
        };
        let n_ctx = state.config.n_ctx;
        if prompt.len() >= n_ctx {
            return Err(ApiError::exceeds_context(prompt.len(), n_ctx));
        }
        self.check_samplers()?;
        let requested = match (
            self.max_completion_tokens.or(self.max_tokens),
            self.n_predict,
        ) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "give either max_tokens or n_predict, not both",
                ))
            }
            (None, Some(-1)) => None,
            (m, n) => m.or(n),
        };
        let shifts = state.config.context_shift.is_some();
        let max_tokens = match requested {
            // Unset: generate until the end of the sequence or of the context.
            None if shifts => usize::MAX,
            None => n_ctx - prompt.len(),
            Some(m) if m < 1 => {
                return Err(ApiError::invalid(format!(
                    "max_tokens must be at least 1, got {m}"
                )))
            }
            Some(m) if m as u64 > n_ctx as u64 && !shifts => {
                return Err(ApiError::invalid(format!(
                    "max_tokens ({m}) is larger than the context size ({n_ctx} tokens)"
                )))
            }
            Some(m) => usize::try_from(m).unwrap_or(usize::MAX),
        };
        let mut sampling = self.sampling(state)?;
        if self.ignore_eos == Some(true) {
            let ban = state.config.eos.iter().map(|&t| (t, f32::NEG_INFINITY));
            sampling.logit_bias.extend(ban);
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        let keep = match self.n_keep {
            None => None,
            Some(-1) => Some(usize::MAX),
            Some(k) if k >= 0 => Some(usize::try_from(k).unwrap_or(usize::MAX)),
            Some(k) => {
                return Err(ApiError::invalid(format!(
                    "n_keep must be -1 (the whole prompt) or at least 0, got {k}"
                )))
            }
        };
        Ok(Job {
            prompt,
            keep,
            options: GenerateOptions {
                max_tokens,
                sampling,
                stop,
                eos: state.config.eos.clone(),
                constraint,
            },
            top_logprobs,
            stream: self.stream,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            n,
        })
    }

    /// OpenAI's `{"token id": bias}` (llama.cpp's `[[id, bias], …]` too): bias in −100..=100
    /// added to the logit, −100 (or llama.cpp's `false`) bans the token as OpenAI documents.
    fn logit_bias(&self, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        let pairs: Vec<(String, &Value)> = match &self.logit_bias {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v)).collect(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|p| match p.as_array().map(Vec::as_slice) {
                    Some([id, b]) => Ok((id.to_string(), b)),
                    _ => Err(ApiError::invalid(
                        "field 'logit_bias': a list must hold [token id, bias] pairs",
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(ApiError::invalid(
                    "field 'logit_bias': expected an object of token id → bias",
                ))
            }
        };
        pairs
            .into_iter()
            .map(|(key, v)| {
                let id = key
                    .parse::<u32>()
                    .ok()
                    .filter(|&id| (id as usize) < vocab)
                    .ok_or_else(|| {
                        ApiError::invalid(format!(
                            "field 'logit_bias': {key} is not a token id of this model (0..{vocab})"
                        ))
                    })?;
                let bias = match v {
                    Value::Bool(false) => f32::NEG_INFINITY,
                    v => match v.as_f64() {
                        Some(b) if (-100.0..=100.0).contains(&b) => {
                            if b <= -100.0 {
                                f32::NEG_INFINITY
                            } else {
                                b as f32
                            }
                        }
                        _ => {
                            return Err(ApiError::invalid(format!(
                                "field 'logit_bias': the bias of token {id} must be a number \
                                 from -100 to 100"
                            )))
                        }
                    },
                };
                Ok((id, bias))
            })
            .collect()
    }

    /// llama.cpp sampler fields at anything but their neutral value are refused by name (a
    /// client that sets mirostat gets told, not a different sampler).
    fn check_samplers(&self) -> Result<(), ApiError> {
        let active = [("tfs_z", self.tfs_z.is_some_and(|v| v != 1.0))];
        match active.iter().find(|a| a.1) {
            Some((name, _)) => Err(ApiError::invalid(format!(
                "{name} is not supported by this server (only its neutral value is accepted); \
                 it has temperature (and dynatemp), top_k, top_p, min_p, typical_p, \
                 top_n_sigma, XTC, mirostat, the penalties, DRY and logit_bias"
            ))),
            None => Ok(()),
        }
    }

    /// llama.cpp's DRY fields (its defaults: base 1.75, allowed length 2, the whole context,
    /// breakers newline, `:`, `"` and `*`); `None` while the multiplier is 0.
    fn dry(&self, state: &AppState) -> Result<Option<Dry>, ApiError> {
        // The server's own DRY (`trit serve --dry-multiplier …`) where the request says nothing.
        let server = state.config.defaults.dry.as_ref();
        let multiplier = match (self.dry_multiplier, server) {
            (Some(m), _) => m,
            (None, Some(d)) => d.multiplier,
            (None, None) => 0.0,
        };
        if multiplier == 0.0 {
            return Ok(None);
        }
        let allowed_length = match self.dry_allowed_length {
            None => server.map_or(2, |d| d.allowed_length),
            Some(n) if n >= 0 => n as usize,
            Some(n) => {
                return Err(ApiError::invalid(format!(
                    "dry_allowed_length must be ≥ 0, got {n}"
                )))
            }
        };
        let last_n = match self.dry_penalty_last_n {
            None => server.map_or(state.config.n_ctx, |d| d.last_n),
            Some(-1) => state.config.n_ctx,
            Some(n) if n >= 0 => n as usize,
            Some(n) => {
                return Err(ApiError::invalid(format!(
                    "dry_penalty_last_n must be -1 (the context) or ≥ 0, got {n}"
                )))
            }
        };
        let breakers = match (&self.dry_sequence_breakers, server) {
            (None, Some(d)) => d.breakers.clone(),
            (None, None) => state.default_dry_breakers(),
            (Some(list), _) if list.len() > 64 => {
                return Err(ApiError::invalid(
                    "dry_sequence_breakers: at most 64 strings",
                ))
            }
            (Some(list), _) => Arc::new(Breakers::new(&state.tokenizer, list)),
        };
        Ok(Some(Dry {
            multiplier,
            base: self.dry_base.or(server.map(|d| d.base)).unwrap_or(1.75),
            allowed_length,
            last_n,
            breakers,
        }))
    }

    /// The request's sampling fields over the server's defaults, validated.
    fn sampling(&self, state: &AppState) -> Result<SamplingParams, ApiError> {
        let d = &state.config.defaults;
        let vocab = state.tokenizer.vocab_size();
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(ApiError::invalid(format!(
                    "temperature must be between 0 and 2, got {t}"
                )));
            }
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if let Some(v) = v {
                if !(-2.0..=2.0).contains(&v) {
                    return Err(ApiError::invalid(format!(
                        "{name} must be between -2 and 2, got {v}"
                    )));
                }
            }
        }
        let top_k = match self.top_k {
            Some(k) if k < 0 => {
                return Err(ApiError::invalid(format!("top_k must be ≥ 0, got {k}")))
            }
            Some(k) => k as usize,
            None => d.top_k,
        };
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k,
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            penalties: Penalties {
                repetition: self.repetition_penalty.unwrap_or(d.penalties.repetition),
                presence: self.presence_penalty.unwrap_or(d.penalties.presence),
                frequency: self.frequency_penalty.unwrap_or(d.penalties.frequency),
                last_n: d.penalties.last_n,
            },
            seed: match self.seed {
                Some(s) => s as u64,
                None => fresh_seed(),
            },
            logit_bias: self.logit_bias(vocab)?,
            dry: self.dry(state)?,
            mirostat: match self.mirostat {
                None => d.mirostat.clone(),
                Some(0) => None,
                Some(v @ (1 | 2)) => Some(Mirostat {
                    version: v as u8,
                    tau: self
                        .mirostat_tau
                        .or(d.mirostat.as_ref().map(|m| m.tau))
                        .unwrap_or(5.0),
                    eta: self
                        .mirostat_eta
                        .or(d.mirostat.as_ref().map(|m| m.eta))
                        .unwrap_or(0.1),
                }),
                Some(v) => {
                    return Err(ApiError::invalid(format!(
                        "mirostat must be 0 (off), 1 or 2, got {v}"
                    )))
                }
            },
            dynatemp: match self.dynatemp_range {
                Some(r) if r.is_nan() || r < 0.0 => {
                    return Err(ApiError::invalid(format!(
                        "dynatemp_range must be ≥ 0, got {r}"
                    )))
                }
                Some(range) if range > 0.0 => Some(DynamicTemperature {
                    range,
                    exponent: self
                        .dynatemp_exponent
                        .or(d.dynatemp.as_ref().map(|t| t.exponent))
                        .unwrap_or(1.0),
                }),
                Some(_) => None,
                None => d.dynatemp.clone().map(|t| DynamicTemperature {
                    exponent: self.dynatemp_exponent.unwrap_or(t.exponent),
                    ..t
                }),
            },
            truncation: Truncation {
                top_n_sigma: self.top_n_sigma.unwrap_or(d.truncation.top_n_sigma),
                typical_p: self.typical_p.unwrap_or(d.truncation.typical_p),
                xtc_probability: self.xtc_probability.unwrap_or(d.truncation.xtc_probability),
                xtc_threshold: self.xtc_threshold.unwrap_or(d.truncation.xtc_threshold),
            },
        };
        p.validate().map_err(|e| ApiError::bad_value(&e))?;
        Ok(p)
    }
}

impl Common {
    /// Whether the output is constrained: `response_format` asks for JSON, or a `grammar` is
    /// given (checked in full by [`job`](Self::job)).
    pub fn is_constrained(&self) -> bool {
        self.json_schema.is_some()
            || self.grammar.as_ref().is_some_and(|g| !g.is_null())
            || self
                .response_format
                .as_ref()
                .and_then(|f| f.get("type"))
                .and_then(Value::as_str)
                .is_some_and(|t| t == "json_object" || t == "json_schema")
    }

    /// `response_format` and `grammar` are enforced or refused, never ignored: `json_object`
    /// (any object, or llama.cpp's `schema` beside it) and `json_schema` (OpenAI's
    /// `json_schema.schema`) are decoded under their schema; a schema with keywords the
    /// recognizer cannot enforce gets a 400 naming them; a GBNF `grammar` (llama.cpp's field)
    /// is parsed, and a grammar that does not parse gets a 400 with the reason and place.
    fn constraint(&self, state: &AppState) -> Result<Option<ConstrainedOutput>, ApiError> {
        let table = || state.token_table();
        let Some(schema) = self.json_schema_rule()? else {
            return match self.grammar.as_ref().filter(|g| !g.is_null()) {
                None => Ok(None),
                Some(Value::String(text)) => {
                    let g = Grammar::parse(text).map_err(|e| ApiError::bad_value(&e))?;
                    let mut rule = OutputRule::Grammar(Arc::new(g));
                    if self.grammar_lazy == Some(true) {
                        let words = self.trigger_words(state)?;
                        let words: Vec<&str> = words.iter().map(String::as_str).collect();
                        let lazy = LazyRule::with_triggers(&words, rule)
                            .map_err(|e| ApiError::bad_value(&e))?;
                        rule = OutputRule::Lazy(Arc::new(lazy));
                    }
                    Ok(Some(ConstrainedOutput {
                        rule,
                        table: table(),
                    }))
                }
                Some(_) => Err(ApiError::invalid("grammar must be a string of GBNF rules")),
            };
        };
        if self.grammar.as_ref().is_some_and(|g| !g.is_null()) {
            return Err(ApiError::invalid(
                "give either grammar or a JSON response_format / json_schema, not both",
            ));
        }
        Ok(Some(ConstrainedOutput {
            rule: OutputRule::Json(Arc::new(schema)),
            table: table(),
        }))
    }

    /// The texts of `grammar_triggers` (llama.cpp's shape: a word, or a token and its text).
    fn trigger_words(&self, state: &AppState) -> Result<Vec<String>, ApiError> {
        let triggers = self.grammar_triggers.as_deref().unwrap_or_default();
        if triggers.is_empty() {
            return Err(ApiError::invalid(
                "grammar_lazy needs grammar_triggers: the words from which the grammar binds",
            ));
        }
        triggers
            .iter()
            .map(
                |t| match (t["type"].as_i64(), &t["value"], t["token"].as_u64()) {
                    (Some(1), Value::String(word), _) => Ok(word.clone()),
                    (Some(0), _, Some(id)) if (id as usize) < state.tokenizer.vocab_size() => {
                        Ok(crate::state::token_text(&state.tokenizer, id as u32))
                    }
                    (Some(0), Value::String(text), None) => Ok(text.clone()),
                    (Some(2 | 3), _, _) => Err(ApiError::invalid(
                        "grammar_triggers: pattern triggers (types 2 and 3) are not supported; \
                     give words (type 1) or tokens (type 0)",
                    )),
                    _ => Err(ApiError::invalid(format!(
                        "grammar_triggers: {t} is not {{\"type\": 1, \"value\": WORD}} or \
                     {{\"type\": 0, \"token\": ID}}"
                    ))),
                },
            )
            .collect()
    }

    /// The schema `response_format` or `json_schema` asks for, if any.
    fn json_schema_rule(&self) -> Result<Option<JsonSchema>, ApiError> {
        let wrapped;
        let f = match (&self.response_format, &self.json_schema) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "give either response_format or json_schema, not both",
                ))
            }
            (Some(f), None) => f,
            (None, Some(s)) => {
                wrapped = serde_json::json!({"type": "json_schema", "schema": s});
                &wrapped
            }
            (None, None) => return Ok(None),
        };
        let schema = match f.get("type").and_then(Value::as_str) {
            Some("text") => return Ok(None),
            Some("json_object") => match f.get("schema") {
                None => JsonSchema::any_object(),
                Some(s) => compile(s)?,
            },
            Some("json_schema") => {
                let s = f
                    .get("json_schema")
                    .and_then(|j| j.get("schema"))
                    .or_else(|| f.get("schema"))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "response_format type 'json_schema' needs json_schema.schema",
                        )
                    })?;
                compile(s)?
            }
            _ => {
                return Err(ApiError::invalid(
                    "response_format must be an object with type 'text', 'json_object' or \
                     'json_schema'",
                ))
            }
        };
        Ok(Some(schema))
    }
}

fn compile(schema: &Value) -> Result<JsonSchema, ApiError> {
    JsonSchema::compile(schema).map_err(|e| ApiError::bad_value(&e))
}

/// A seed for requests that give none, so unseeded requests differ from each other.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
