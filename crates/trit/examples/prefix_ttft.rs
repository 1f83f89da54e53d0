//! Time to first token of a long-history follow-up request through the `Scheduler` that
//! `trit serve` uses: cold (a fresh scheduler evaluates the whole prompt) vs warm (an earlier
//! request left the history's keys/values in a slot, so only the new turn is evaluated).
//!
//! cargo run --release -p trit --example prefix_ttft -- MODEL [-t THREADS] [--history 512,2048]
//!     [--turn 24] [--reply N]
//!
//! Prompts are random token ids (seeded); the follow-up is the history plus TURN new tokens.
//! The history ends with a chat-like generation prompt: a turn-start token and two more. With
//! `--reply N` the follow-up is rendered as a Qwen3.5 chat template re-renders history: the
//! earlier generation prompt is replaced (from its turn-start token on) by the turn start and
//! an N-token reply, then the new turn — so a hybrid model resumes at the turn start and
//! computes N + 1 + TURN tokens. Without it the follow-up extends the history exactly.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use trit::engine::{GenerateOptions, Scheduler, SchedulerConfig, SeqEvent, SeqRequest};
use trit::model::Model;
use trit::sample::SamplingParams;
use trit::tokenizer::Tokenizer;

/// Random ids below `vocab` (the turn-start token, `vocab`, never occurs by chance).
fn random_tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Submits `prompt`, returns (seconds to the first token, prompt tokens reused).
fn ttft(s: &Scheduler, prompt: &[u32]) -> (f64, usize) {
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    s.submit(SeqRequest {
        prompt: prompt.to_vec(),
        options: GenerateOptions {
            max_tokens: 1,
            sampling: SamplingParams::greedy(),
            stop: vec![],
            eos: vec![],
            constraint: None,
        },
        top_logprobs: None,
        keep: None,
        sink: Box::new(move |e| tx.send((Instant::now(), e)).is_ok()),
    })
    .unwrap();
    let mut first = None;
    for (at, e) in rx {
        match e {
            SeqEvent::Piece { .. } => {
                first.get_or_insert(at);
            }
            SeqEvent::Done(sum) => {
                let at = first.unwrap_or(at);
                return ((at - t0).as_secs_f64(), sum.cached_tokens);
            }
            SeqEvent::Error(e) => panic!("{e}"),
            SeqEvent::Prompt { .. } => {}
        }
    }
    panic!("no result")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut model_path = None;
    let (mut threads, mut histories, mut turn) =
        (trit::threadpool::default_threads(), vec![512, 2048], 24);
    let mut reply: Option<usize> = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-t" => threads = it.next().ok_or("-t N")?.parse()?,
            "--turn" => turn = it.next().ok_or("--turn N")?.parse()?,
            "--reply" => reply = Some(it.next().ok_or("--reply N")?.parse()?),
            "--history" => {
                histories = it
                    .next()
                    .ok_or("--history N[,N]")?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            _ => model_path = Some(a),
        }
    }
    let path =
        model_path.ok_or("usage: prefix_ttft MODEL [-t N] [--history 512,2048] [--turn 24]")?;
    let files = trit::format::open(std::path::Path::new(&path))?;
    let tok = Arc::new(Tokenizer::from_source(&files.tokenizer)?);
    let model = Arc::new(Model::load(&files, threads)?);
    // The last id plays the turn-start token (`<|im_start|>`); random ids stay below it.
    let turn_start = model.config().vocab as u32 - 1;
    let vocab = turn_start as usize;
    println!(
        "model {path}, {threads} threads, new turn {turn} tokens, re-rendered reply {}",
        reply.map_or("none (exact continuation)".into(), |n| format!(
            "{n} tokens"
        ))
    );
    println!("| history tokens | TTFT cold | TTFT warm (prefix reused) | reused | speed-up |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for &h in &histories {
        let config = SchedulerConfig {
            n_ctx: h + turn + reply.unwrap_or(0) + 8,
            parallel: 2,
            max_queue: 0,
            kv_cache_bytes: 8 << 30, // a cap; blocks are allocated as used
            context_shift: None,
            draft: None,
        };
        let mut history = random_tokens(h as u64, h - 3, vocab);
        history.push(turn_start);
        history.extend(random_tokens(3, 2, vocab));
        let mut follow_up = match reply {
            Some(n) => {
                let mut f = history[..h - 2].to_vec();
                f.extend(random_tokens(5, n, vocab));
                f
            }
            None => history.clone(),
        };
        follow_up.extend(random_tokens(7, turn, vocab));

        let start = |config: SchedulerConfig| {
            Scheduler::start_with_turn_start(model.clone(), tok.clone(), config, Some(turn_start))
        };
        let cold = start(config.clone())?;
        let (t_cold, _) = ttft(&cold, &follow_up);
        drop(cold);
        let warm = start(config)?;
        ttft(&warm, &history);
        let (t_warm, reused) = ttft(&warm, &follow_up);
        println!(
            "| {h} | {:.0} ms | {:.0} ms | {reused} | {:.1}× |",
            t_cold * 1e3,
            t_warm * 1e3,
            t_cold / t_warm
        );
    }
    Ok(())
}
