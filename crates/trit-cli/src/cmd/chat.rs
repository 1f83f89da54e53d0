//! `trit chat`: an interactive conversation. Each turn re-renders the whole history with
//! the chat template, and the session evaluates only the tokens after the longest common
//! prefix with its KV cache, so earlier turns are never re-read.

use super::run::{draft_line, template_kwargs, DraftArgs, OutputArgs};
use super::{eos_ids, load, ModelArgs, SamplingArgs};
use anyhow::{bail, Result};
use clap::Args;
use rustyline::error::ReadlineError;
use serde_json::{json, Value};
use std::io::Write;
use trit::engine::{GenerateOptions, Session};
use trit::Error;

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Model path (positional form of --model: `trit chat MODEL`).
    pub path: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[arg(long, alias = "system-prompt")]
    pub system: Option<String>,
    #[arg(long)]
    pub no_think: bool,
    #[arg(long)]
    pub chat_template_args: Option<String>,
    /// Print prompt/generation speed after each reply.
    #[arg(short, long)]
    pub verbose: bool,
    #[command(flatten)]
    pub draft: DraftArgs,
    /// Every reply a JSON document, or a string of a grammar.
    #[command(flatten)]
    pub output: OutputArgs,
}

const HELP: &str = "commands: /help (h), /clear or /reset (r) forget the conversation, \
/system TEXT set the system message, /save FILE keep the conversation and its cache in FILE, \
/load FILE continue one saved there, /exit (q)";

pub fn run(mut a: ChatArgs) -> Result<()> {
    super::take_positional_model(a.path.take(), &mut a.model)?;
    let loaded = load(&a.model)?;
    let Some(template) = &loaded.template else {
        bail!("this model has no chat template; use `trit run --raw` instead");
    };
    let constraint = a.output.constraint(&loaded)?;
    // A constrained reply starts right away: no thinking block before it.
    let kwargs = template_kwargs(a.no_think || constraint.is_some(), &a.chat_template_args)?;
    let limit = a.sampling.token_limit();
    let mut opts = GenerateOptions {
        max_tokens: limit.unwrap_or(loaded.n_ctx),
        sampling: a.sampling.params(&loaded)?,
        stop: a.sampling.stop.clone(),
        eos: eos_ids(&loaded),
        constraint,
    };
    let mut session = Session::new(loaded.model.clone(), loaded.n_ctx);
    // A draft keeps its own cache of the conversation, reused between turns the same way.
    let mut draft = a.draft.session(&a.model, &session)?;
    let mut system = a.system.clone();
    let mut history: Vec<Value> = Vec::new();
    let mut rl = rustyline::DefaultEditor::new()?;
    println!("trit chat — {}. {HELP}", loaded.files.config.name);
    loop {
        let line = match rl.readline(">> ") {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) | Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let input = line.trim();
        if input.is_empty() {
            continue;
        }
        let _ = rl.add_history_entry(input);
        match input {
            "/exit" | "/quit" | "q" => break,
            "/help" | "h" => {
                println!("{HELP}");
                continue;
            }
            "/clear" | "/reset" | "r" => {
                history.clear();
                session.reset();
                if let Some(d) = &mut draft {
                    d.reset();
                }
                println!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        if let Some(file) = input.strip_prefix("/save ") {
            let saved = json!({"system": system, "messages": history});
            match session.save_state(file.trim().as_ref(), saved) {
                Ok(()) => println!(
                    "(saved {} messages, {} cached tokens, to {})",
                    history.len(),
                    session.tokens().len(),
                    file.trim()
                ),
                Err(e) => println!("could not save: {e}"),
            }
            continue;
        }
        if let Some(file) = input.strip_prefix("/load ") {
            match load_chat(&mut session, file.trim()) {
                Ok((s, h)) => {
                    (system, history) = (s, h);
                    if let Some(d) = &mut draft {
                        d.reset();
                    }
                    println!(
                        "(loaded {} messages, {} cached tokens, from {})",
                        history.len(),
                        session.tokens().len(),
                        file.trim()
                    );
                }
                Err(e) => println!("could not load: {e}"),
            }
            continue;
        }
        if let Some(s) = input.strip_prefix("/system") {
            system = Some(s.trim().to_string()).filter(|s| !s.is_empty());
            history.clear();
            println!("(system message set; conversation cleared)");
            continue;
        }
        // Room for a reply: the oldest exchanges go when the conversation leaves less.
        let room = opts.max_tokens.clamp(1, (session.n_ctx() / 4).max(1));
        let mut dropped = 0;
        let ids = loop {
            let mut messages = Vec::new();
            if let Some(s) = &system {
                messages.push(json!({"role": "system", "content": s}));
            }
            messages.extend(history.iter().cloned());
            messages.push(json!({"role": "user", "content": input}));
            let text = template.render(&messages, true, None, &kwargs)?;
            let ids = loaded.tokenizer.encode(&text, false)?;
            if ids.len() + room <= session.n_ctx() || history.len() < 2 {
                break ids;
            }
            history.drain(..2);
            dropped += 1;
        };
        if dropped > 0 {
            let what = match dropped {
                1 => "exchange".to_string(),
                n => format!("{n} exchanges"),
            };
            println!(
                "(the conversation outgrew the context of {} tokens: dropped its oldest {what})",
                session.n_ctx()
            );
        }
        if limit.is_none() {
            // -n -1: each reply may run to the context's end.
            opts.max_tokens = session.n_ctx().saturating_sub(ids.len());
        }
        let mut stdout = std::io::stdout();
        let result = a.draft.generate(
            &mut session,
            draft.as_mut(),
            &loaded.tokenizer,
            &ids,
            &opts,
            &mut |piece| {
                print!("{piece}");
                let _ = stdout.flush();
                true
            },
        );
        println!();
        match result {
            Ok((g, stats)) => {
                history.push(json!({"role": "user", "content": input}));
                history.push(json!({"role": "assistant", "content": g.text.trim()}));
                if a.verbose {
                    println!(
                        "[prompt: {} tokens ({} reused from cache), {:.1} tok/s; generation: {} tokens, {:.1} tok/s]",
                        g.prompt_tokens,
                        g.prompt_tokens - g.prompt_evaluated,
                        g.prompt_tps(),
                        g.tokens.len(),
                        g.gen_tps()
                    );
                    if let Some(s) = stats {
                        println!("[{}]", draft_line(&s, g.tokens.len()));
                    }
                }
            }
            Err(Error::ContextOverflow { n_prompt, n_ctx }) => {
                println!(
                    "{}\nThis message alone has {} tokens with the system message; use a larger --ctx.",
                    Error::ContextOverflow { n_prompt, n_ctx },
                    ids.len()
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The system message and history saved by `/save` in `file`, its cache loaded into `session`.
fn load_chat(session: &mut Session, file: &str) -> Result<(Option<String>, Vec<Value>)> {
    // Checked before the cache is replaced, so a file of `trit run --prompt-cache` (no
    // messages) leaves the conversation as it was.
    let peek = trit::engine::state_file::read_extra(file.as_ref())?;
    let parse = |v: &Value| -> Option<(Option<String>, Vec<Value>)> {
        let system = match v.get("system")? {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            _ => return None,
        };
        let messages = v.get("messages")?.as_array()?;
        let well_formed = messages.iter().all(|m| {
            m.get("role").is_some_and(Value::is_string)
                && m.get("content").is_some_and(Value::is_string)
        });
        well_formed.then(|| (system, messages.clone()))
    };
    let Some(chat) = parse(&peek) else {
        bail!("{file} holds a saved session without a conversation (saved by `trit run --prompt-cache`?)");
    };
    session.load_state(file.as_ref())?;
    Ok(chat)
}
