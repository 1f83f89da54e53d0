//! Time-to-first-token per chat turn, with the session's prefix reuse vs a cold session
//! evaluating the whole conversation (what a runtime without reuse does).
//!
//! cargo run --release -p trit --example chat_ttft -- MODEL.gguf [turns]

use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;
use trit::chat::ChatTemplate;
use trit::engine::{generate, GenerateOptions, Session};
use trit::model::Model;
use trit::sample::SamplingParams;
use trit::tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: chat_ttft MODEL [turns]")?;
    let turns: usize = args.get(2).map_or(Ok(6), |s| s.parse())?;
    let files = trit::format::open(std::path::Path::new(path))?;
    let tok = Tokenizer::from_source(&files.tokenizer)?;
    let tpl = ChatTemplate::new(
        files.chat_template.as_deref().ok_or("no chat template")?,
        "",
        "",
    )?;
    let model = Arc::new(Model::load(&files, trit::threadpool::default_threads())?);
    let mut eos = files.config.eos.clone();
    eos.extend(tok.token_id("<|im_end|>"));
    let opts = GenerateOptions {
        max_tokens: 48,
        sampling: SamplingParams::greedy(),
        stop: vec![],
        eos,
        constraint: None,
    };
    let questions = [
        "Tell me about the history of Paris in a few sentences.",
        "What are the most famous museums there, and what can one see in them?",
        "How would you plan a three-day visit for someone who loves art and food?",
        "Which neighbourhoods are best to stay in, and why?",
        "What should a visitor know about public transport in the city?",
        "Summarize our conversation so far in two sentences.",
        "Now suggest a day trip outside the city.",
        "Thank you! Any last advice?",
    ];
    let mut session = Session::new(model.clone(), 8192);
    let mut msgs: Vec<Value> = Vec::new();
    println!(
        "| turn | prompt tokens | evaluated (reuse) | TTFT reuse ms | TTFT cold ms | speed-up |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for turn in 0..turns {
        msgs.push(json!({"role": "user", "content": questions[turn % questions.len()]}));
        let prompt = tok.encode(&tpl.render(&msgs, true, None, &Map::new())?, false)?;
        let mut cold = Session::new(model.clone(), 8192);
        let t0 = Instant::now();
        cold.prefill(&prompt)?;
        let cold_ms = t0.elapsed().as_secs_f64() * 1e3;
        let g = generate(&mut session, &tok, &prompt, &opts, &mut |_| true)?;
        let reuse_ms = g.prompt_secs * 1e3;
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1}x |",
            turn + 1,
            prompt.len(),
            g.prompt_evaluated,
            reuse_ms,
            cold_ms,
            cold_ms / reuse_ms
        );
        msgs.push(json!({"role": "assistant", "content": g.text.trim()}));
    }
    Ok(())
}
