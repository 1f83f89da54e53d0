//! `trit chat`: an interactive conversation. Each turn re-renders the whole history with
//! the chat template, and the session evaluates only the tokens after the longest common
//! prefix with its KV cache, so earlier turns are never re-read.

use super::run::{draft_line, template_kwargs, DraftArgs};
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
}

const HELP: &str = "commands: /help (h), /clear or /reset (r) forget the conversation, \
/system TEXT set the system message, /exit (q)";

pub fn run(a: ChatArgs) -> Result<()> {
    let loaded = load(&a.model)?;
    let Some(template) = &loaded.template else {
        bail!("this model has no chat template; use `trit run --raw` instead");
    };
    let kwargs = template_kwargs(a.no_think, &a.chat_template_args)?;
    let opts = GenerateOptions {
        max_tokens: a.sampling.max_tokens,
        sampling: a.sampling.params(&loaded),
        stop: a.sampling.stop.clone(),
        eos: eos_ids(&loaded),
        json: None,
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
        if let Some(s) = input.strip_prefix("/system") {
            system = Some(s.trim().to_string()).filter(|s| !s.is_empty());
            history.clear();
            println!("(system message set; conversation cleared)");
            continue;
        }
        let mut messages = Vec::new();
        if let Some(s) = &system {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.extend(history.iter().cloned());
        messages.push(json!({"role": "user", "content": input}));
        let text = template.render(&messages, true, None, &kwargs)?;
        let ids = loaded.tokenizer.encode(&text, false)?;
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
                    "{}\nThe conversation has {} tokens; use /clear to start over or a larger --ctx.",
                    Error::ContextOverflow { n_prompt, n_ctx },
                    ids.len()
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
