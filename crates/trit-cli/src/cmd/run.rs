//! `trit run "prompt"`: one generation, streamed, followed by mlx-lm-style speed lines.

use super::{eos_ids, load, print_speed, Loaded, ModelArgs, SamplingArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use trit::engine::{
    check_draft, generate, generate_shifting, generate_speculative, ContextShift, DraftOptions,
    DraftStats, GenerateOptions, Generation, Session,
};
use trit::sample::{ConstrainedOutput, Grammar, JsonSchema, OutputRule, TokenTable};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The model (the positional form of --model: `trit run MODEL "prompt"`); given alone,
    /// the prompt (`trit run "prompt"` runs --model, TRIT_MODEL or the default model), or with
    /// -f the model.
    #[arg(value_name = "MODEL")]
    pub first: Option<String>,
    /// The prompt (a user message, unless --raw); `-` reads it from standard input.
    #[arg(value_name = "PROMPT")]
    pub second: Option<String>,
    /// Read the prompt from this file (llama.cpp's -f).
    #[arg(short, long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System message.
    #[arg(long, alias = "system-prompt")]
    pub system: Option<String>,
    /// Disable Qwen3 thinking (enable_thinking=false in the chat template).
    #[arg(long)]
    pub no_think: bool,
    /// Extra chat-template variables as JSON, e.g. '{"enable_thinking": false}'.
    #[arg(long)]
    pub chat_template_args: Option<String>,
    /// Feed the prompt as-is, without the chat template.
    #[arg(long, alias = "ignore-chat-template")]
    pub raw: bool,
    /// Print only the generated text.
    #[arg(short, long)]
    pub quiet: bool,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    /// Keep the prompt's state (its tokens' keys and values) in FILE: a later run whose
    /// prompt starts with the same tokens reads only the rest. Read if FILE exists, written
    /// after the reply. llama.cpp's --prompt-cache.
    #[arg(long, value_name = "FILE")]
    pub prompt_cache: Option<PathBuf>,
    /// With --prompt-cache: save the reply's tokens too, not only the prompt's.
    #[arg(long, requires = "prompt_cache")]
    pub prompt_cache_all: bool,
    /// With --prompt-cache: read the file, never write it.
    #[arg(long, requires = "prompt_cache")]
    pub prompt_cache_ro: bool,
    /// When generation fills the context, keep the first --keep tokens and the newer half of
    /// the rest, read them again and go on (llama.cpp's --context-shift); with -n -1 there is
    /// then no length limit.
    #[arg(long)]
    pub context_shift: bool,
    /// Tokens from the start of the prompt (as templated) that a context shift keeps; -1: the
    /// whole prompt. llama.cpp's --keep.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, requires = "context_shift",
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub keep: i64,
}

/// Speculative decoding (`run`, `chat`).
#[derive(Args, Debug, Clone)]
pub struct DraftArgs {
    /// Speculative decoding: a small model with the same vocabulary drafts tokens that the
    /// model checks in one pass (same output as without it). llama.cpp's --model-draft.
    #[arg(long, alias = "model-draft", value_name = "PATH")]
    pub draft_model: Option<PathBuf>,
    /// Tokens the draft proposes per pass of the model, at most.
    #[arg(long, alias = "num-draft-tokens", default_value_t = 8)]
    pub draft_max: usize,
    /// The draft stops proposing when its best token's probability is below this.
    #[arg(long, default_value_t = 0.75)]
    pub draft_p_min: f32,
}

impl DraftArgs {
    /// The draft's session beside `target` (loaded like the model, without its adapter).
    pub fn session(&self, model: &ModelArgs, target: &Session) -> Result<Option<Session>> {
        let Some(d) = self.model(model)? else {
            return Ok(None);
        };
        let draft = Session::new(d, target.n_ctx());
        check_draft(target, &draft)?;
        Ok(Some(draft))
    }

    /// The draft model, loaded like the model (without its adapter), if there is one.
    pub fn model(&self, model: &ModelArgs) -> Result<Option<std::sync::Arc<trit::model::Model>>> {
        let Some(path) = &self.draft_model else {
            return Ok(None);
        };
        let args = ModelArgs {
            model: Some(path.clone()),
            adapter: None,
            ..model.clone()
        };
        let d =
            load(&args).with_context(|| format!("loading the draft model {}", path.display()))?;
        Ok(Some(d.model))
    }

    pub fn options(&self) -> DraftOptions {
        DraftOptions {
            max: self.draft_max,
            p_min: self.draft_p_min,
        }
    }

    /// One generation, drafted when there is a draft session.
    pub fn generate(
        &self,
        session: &mut Session,
        draft: Option<&mut Session>,
        tokenizer: &trit::tokenizer::Tokenizer,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> trit::Result<(Generation, Option<DraftStats>)> {
        match draft {
            None => Ok((generate(session, tokenizer, prompt, opts, on_text)?, None)),
            Some(d) => {
                let o = self.options();
                let (g, s) = generate_speculative(session, d, tokenizer, prompt, opts, o, on_text)?;
                Ok((g, Some(s)))
            }
        }
    }
}

/// The line `run` prints after a drafted generation.
pub fn draft_line(s: &DraftStats, tokens: usize) -> String {
    format!(
        "Draft: {} of {} drafted tokens accepted ({:.1} %), {} passes of the model for {} tokens",
        s.accepted,
        s.drafted,
        100.0 * s.acceptance(),
        s.target_passes,
        tokens
    )
}

/// What the reply must be: a JSON document, or a string of a grammar (`run` and `chat`).
#[derive(Args, Debug, Default)]
pub struct OutputArgs {
    /// Constrain the output to a JSON object (any).
    #[arg(long)]
    pub json: bool,
    /// Constrain the output to a JSON document of this JSON Schema (inline, or @FILE).
    #[arg(long, value_name = "SCHEMA")]
    pub json_schema: Option<String>,
    /// Constrain the output to a string of this GBNF grammar (llama.cpp's notation; the
    /// output starts at its `root` rule).
    #[arg(long, value_name = "GBNF", conflicts_with = "grammar_file")]
    pub grammar: Option<String>,
    /// `--grammar`, read from FILE.
    #[arg(long, value_name = "FILE")]
    pub grammar_file: Option<std::path::PathBuf>,
}

impl OutputArgs {
    /// `--json` / `--json-schema` / `--grammar` / `--grammar-file` as a constraint over the
    /// loaded model's vocabulary.
    pub fn constraint(&self, loaded: &Loaded) -> Result<Option<ConstrainedOutput>> {
        let grammar = match (&self.grammar, &self.grammar_file) {
            (Some(g), _) => Some(g.clone()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading the grammar {}", path.display()))?,
            ),
            (None, None) => None,
        };
        let rule = match (&self.json_schema, self.json, grammar) {
            (None, false, None) => return Ok(None),
            (None, false, Some(g)) => OutputRule::Grammar(Arc::new(Grammar::parse(&g)?)),
            (_, _, Some(_)) => bail!("give either a grammar or --json / --json-schema, not both"),
            (None, true, None) => OutputRule::Json(Arc::new(JsonSchema::any_object())),
            (Some(s), _, None) => {
                let text = match s.strip_prefix('@') {
                    Some(path) => std::fs::read_to_string(path)
                        .with_context(|| format!("reading the JSON schema {path}"))?,
                    None => s.clone(),
                };
                let v: Value =
                    serde_json::from_str(&text).context("--json-schema is not valid JSON")?;
                OutputRule::Json(Arc::new(JsonSchema::compile(&v)?))
            }
        };
        Ok(Some(ConstrainedOutput {
            rule,
            table: Arc::new(TokenTable::new(&loaded.tokenizer)),
        }))
    }
}

pub fn template_kwargs(no_think: bool, extra: &Option<String>) -> Result<Map<String, Value>> {
    let mut kw = Map::new();
    if let Some(s) = extra {
        let v: Value = serde_json::from_str(s).context("--chat-template-args is not valid JSON")?;
        match v {
            Value::Object(m) => kw.extend(m),
            _ => bail!("--chat-template-args must be a JSON object"),
        }
    }
    if no_think {
        kw.insert("enable_thinking".into(), Value::Bool(false));
    }
    Ok(kw)
}

/// Turns the user's text into prompt token ids (chat template unless raw).
pub fn prompt_ids(
    loaded: &Loaded,
    messages: &[Value],
    raw_text: Option<&str>,
    kwargs: &Map<String, Value>,
) -> Result<Vec<u32>> {
    let tok = &loaded.tokenizer;
    if let Some(text) = raw_text {
        let mut ids = Vec::new();
        if loaded.files.config.add_bos {
            if let Some(b) = loaded.files.config.bos {
                ids.push(b);
            }
        }
        ids.extend(tok.encode(text, false)?);
        return Ok(ids);
    }
    let Some(t) = &loaded.template else {
        bail!("this model has no chat template; use --raw to feed the prompt as plain text");
    };
    let text = t.render(messages, true, None, kwargs)?;
    Ok(tok.encode(&text, false)?)
}

/// The prompt's text: the argument, the file, or standard input for `-`.
fn prompt_text(prompt: &Option<String>, a: &RunArgs) -> Result<String> {
    let text = match (prompt, &a.file) {
        (_, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the prompt file {}", f.display()))?,
        (Some(p), None) if p == "-" => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .context("reading the prompt from standard input")?;
            s
        }
        (Some(p), None) => return Ok(p.clone()),
        (None, None) => {
            bail!("no prompt: give it as an argument, -f FILE, or - for standard input")
        }
    };
    if text.trim().is_empty() {
        bail!("the prompt is empty");
    }
    Ok(text)
}

pub fn run(mut a: RunArgs) -> Result<()> {
    let (model, prompt) = super::model_then_text((&a.first, &a.second), a.file.is_some(), "run")?;
    let prompt = prompt_text(&prompt, &a)?;
    super::take_positional_model(model, &mut a.model)?;
    let loaded = load(&a.model)?;
    let constraint = a.output.constraint(&loaded)?;
    // A constrained output (a JSON document, a grammar's string) starts the reply: no thinking
    // block before it.
    let kwargs = template_kwargs(a.no_think || constraint.is_some(), &a.chat_template_args)?;
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    messages.push(json!({"role": "user", "content": prompt}));
    let ids = prompt_ids(
        &loaded,
        &messages,
        a.raw.then_some(prompt.as_str()),
        &kwargs,
    )?;
    let shift = a.context_shift.then(|| ContextShift {
        keep: usize::try_from(a.keep).map_or(ids.len(), |k| k.min(ids.len())),
    });
    if shift.is_some() && a.draft.draft_model.is_some() {
        bail!("--context-shift does not work with --draft-model (yet)");
    }
    let max_tokens = match (a.sampling.token_limit(), shift) {
        (Some(n), _) => n,
        (None, Some(_)) => usize::MAX,
        // -1: until the context's end.
        (None, None) => loaded.n_ctx.saturating_sub(ids.len()),
    };
    let opts = GenerateOptions {
        max_tokens,
        sampling: a.sampling.params(&loaded)?,
        stop: a.sampling.stop.clone(),
        eos: eos_ids(&loaded),
        constraint,
    };
    let mut session = Session::new(loaded.model.clone(), loaded.n_ctx);
    if a.prompt_cache.is_some() {
        trit::engine::state_file::check_savable(&loaded.model).context("--prompt-cache")?;
    }
    if let Some(f) = a.prompt_cache.as_ref().filter(|f| f.exists()) {
        session
            .load_state(f)
            .with_context(|| format!("--prompt-cache {}", f.display()))?;
    }
    let mut draft = a.draft.session(&a.model, &session)?;
    if !a.quiet {
        println!("==========");
    }
    let mut stdout = std::io::stdout();
    let mut print = |piece: &str| {
        print!("{piece}");
        let _ = stdout.flush();
        true
    };
    let (g, stats) = match shift {
        Some(_) => {
            let g = generate_shifting(
                &mut session,
                &loaded.tokenizer,
                &ids,
                &opts,
                shift,
                &mut print,
            )?;
            (g, None)
        }
        None => a.draft.generate(
            &mut session,
            draft.as_mut(),
            &loaded.tokenizer,
            &ids,
            &opts,
            &mut print,
        )?,
    };
    println!();
    if let Some(f) = a.prompt_cache.as_ref().filter(|_| !a.prompt_cache_ro) {
        if !a.prompt_cache_all {
            // The prompt only (a hybrid cache keeps its state from before the last token).
            session.truncate(ids.len());
        }
        session
            .save_state(f, json!({}))
            .with_context(|| format!("saving --prompt-cache {}", f.display()))?;
    }
    if !a.quiet {
        println!("==========");
        if let Some(f) = &a.prompt_cache {
            // The session started from the file alone: what it did not evaluate came from it.
            println!(
                "Prompt cache: {} of {} prompt tokens read from {}",
                g.prompt_tokens - g.prompt_evaluated,
                g.prompt_tokens,
                f.display()
            );
        }
        print_speed(&g);
        if g.shifts > 0 {
            println!(
                "Context shifts: {} ({} tokens read again)",
                g.shifts, g.shift_tokens
            );
        }
        if let Some(s) = stats {
            println!("{}", draft_line(&s, g.tokens.len()));
        }
    }
    Ok(())
}
