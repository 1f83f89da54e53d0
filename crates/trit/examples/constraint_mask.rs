//! How long one full mask of a constrained step takes (`Follow::mask`: every token of the
//! vocabulary checked against a JSON schema or a GBNF grammar), at a few points of an output.
//! The mask runs only when the sampled token does not fit, so this is the worst step's cost.
//!
//!     cargo run --release -p trit --example constraint_mask -- MODEL [REPS]

use std::sync::Arc;
use std::time::Instant;
use trit::sample::constraint::{ByteLanguage, Constrain, Follow};
use trit::sample::{Grammar, JsonSchema, TokenTable};
use trit::tokenizer::Tokenizer;

/// Median time of `reps` masks after `text` (as the model's tokens), and how many tokens fit.
fn time<L: ByteLanguage>(
    lang: Arc<L>,
    table: &Arc<TokenTable>,
    tok: &Tokenizer,
    text: &str,
    reps: usize,
) -> (f64, usize) {
    let mut f = Follow::new(lang, table.clone(), vec![u32::MAX]);
    for t in tok.encode(text, false).expect("encodes") {
        assert!(f.allows(t), "{text:?} leaves the language at token {t}");
        f.advance(t);
    }
    let mut times = Vec::new();
    let mut allowed = 0;
    for _ in 0..reps {
        let mut row = vec![0.0f32; tok.vocab_size()];
        let t = Instant::now();
        allowed = f.mask(&mut row);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    (times[reps / 2], allowed)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).expect("usage: constraint_mask MODEL [REPS]");
    let reps: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(21);
    let files = trit::format::open(std::path::Path::new(model)).expect("opens the model");
    let tok = Tokenizer::from_source(&files.tokenizer).expect("reads the tokenizer");
    let t = Instant::now();
    let table = Arc::new(TokenTable::new(&tok));
    let mut row = vec![0.0f32; tok.vocab_size()];
    Follow::new(Arc::new(JsonSchema::any_object()), table.clone(), vec![]).mask(&mut row);
    println!(
        "{} tokens; table and first mask {:.1} ms",
        tok.vocab_size(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let verdict = r#"root ::= ("yes" | "no") ", because " [a-z ]{1,40} ".""#;
    let list = "root ::= item (\", \" item){2}\nitem ::= [A-Z] [a-z]{1,12}";
    let cases: [(&str, &str, &str); 3] = [
        ("grammar: sentence", verdict, "yes, because it"),
        ("grammar: list", list, "Apple, Pe"),
        ("grammar: start", verdict, ""),
    ];
    for (name, g, text) in cases {
        let g = Arc::new(Grammar::parse(g).expect("parses"));
        let (ms, n) = time(g, &table, &tok, text, reps);
        println!("{name:<22} after {text:<18?} {n:>6} tokens fit  {ms:>7.2} ms");
    }
    let json = Arc::new(JsonSchema::any_object());
    for text in ["", "{\"name\": \"Par", "{\"age\": 4"] {
        let (ms, n) = time(json.clone(), &table, &tok, text, reps);
        println!(
            "{:<22} after {text:<18?} {n:>6} tokens fit  {ms:>7.2} ms",
            "json: any object"
        );
    }
}
