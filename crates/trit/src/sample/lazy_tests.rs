use super::*;
use crate::sample::{Grammar, JsonSchema, SamplingParams};

const WORDS: [&str; 12] = [
    "a", "<t>", "<", "t>", "x", "{", "}", "<q>", "</q>", "<t>x", "<t>{", "b}",
];
const EOS: u32 = WORDS.len() as u32;

fn id(word: &str) -> u32 {
    WORDS.iter().position(|w| *w == word).unwrap() as u32
}

/// The words above, then the end of sequence (no bytes).
fn table() -> Arc<TokenTable> {
    let mut t: Vec<Option<Vec<u8>>> = WORDS.iter().map(|w| Some(w.as_bytes().to_vec())).collect();
    t.push(None);
    Arc::new(TokenTable::from_bytes(t))
}

fn rule() -> OutputRule {
    OutputRule::Grammar(Arc::new(
        Grammar::parse(r#"root ::= "<t>{" [ab]* "}""#).unwrap(),
    ))
}

fn lazy(rule: LazyRule) -> Lazy<Grammar> {
    let OutputRule::Grammar(g) = rule.rule().clone() else {
        unreachable!()
    };
    Lazy::new(Arc::new(rule), g, table(), vec![EOS])
}

/// The tokens the mask leaves, after checking that it agrees with `allows`.
fn allowed(l: &Lazy<Grammar>) -> Vec<&'static str> {
    let mut row = vec![0.0f32; WORDS.len() + 1];
    let n = l.mask(&mut row);
    let ids: Vec<u32> = (0..=EOS).filter(|&i| row[i as usize].is_finite()).collect();
    assert_eq!(n, ids.len());
    assert_eq!(ids, (0..=EOS).filter(|&t| l.allows(t)).collect::<Vec<_>>());
    ids.iter()
        .map(|&i| WORDS.get(i as usize).copied().unwrap_or("EOS"))
        .collect()
}

fn feed(l: &mut Lazy<Grammar>, words: &[&str]) {
    for w in words {
        assert!(l.allows(id(w)), "{w} refused");
        l.advance(id(w));
    }
}

#[test]
fn output_is_free_until_the_trigger_then_follows_the_language_then_is_free_again() {
    let mut l = lazy(LazyRule::new("<t>", rule()).unwrap());
    let all = WORDS.iter().copied().chain(["EOS"]);
    let free: Vec<&str> = all.filter(|w| *w != "<t>x").collect();
    // Free: anything, but a token that writes the trigger with bytes the call refuses after it.
    assert_eq!(allowed(&l), free);
    feed(&mut l, &["a", "x", "}"]);
    assert_eq!(allowed(&l), free);
    assert!(l.is_complete(), "the end may come while free");
    // The trigger written across two tokens binds the output.
    feed(&mut l, &["<", "t>"]);
    assert_eq!(allowed(&l), ["{"]);
    assert!(!l.is_complete());
    feed(&mut l, &["{", "a"]);
    assert_eq!(allowed(&l), ["a", "}", "b}"]);
    feed(&mut l, &["b}"]);
    // The call is done: free again, and another one may follow.
    assert_eq!(allowed(&l), free);
    feed(&mut l, &["<t>{", "}", "x"]);
    assert_eq!(allowed(&l), free);
}

#[test]
fn a_once_rule_allows_only_the_end_after_its_string() {
    let mut l = lazy(LazyRule::new("<t>", rule()).unwrap().once(true));
    feed(&mut l, &["a", "<t>{", "a"]);
    assert_eq!(allowed(&l), ["a", "}", "b}"]);
    feed(&mut l, &["}"]);
    assert_eq!(allowed(&l), ["EOS"]);
    let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
    let mut row = vec![1.0; WORDS.len() + 1];
    assert_eq!(l.sample(&mut s, &mut row, &[]), Some(EOS));
}

#[test]
fn triggers_inside_a_quiet_region_do_not_count() {
    let quiet = |inside| {
        LazyRule::new("<t>", rule())
            .unwrap()
            .quiet_between("<q>", "</q>", inside)
            .unwrap()
    };
    // Starting inside: "<t>x" is plain text until the region closes.
    let mut l = lazy(quiet(true));
    assert!(allowed(&l).contains(&"<t>x"));
    feed(&mut l, &["<t>x", "<", "t>", "a", "</q>"]);
    assert!(!allowed(&l).contains(&"<t>x"));
    feed(&mut l, &["<t>"]);
    assert_eq!(allowed(&l), ["{"]);
    // Starting outside: the opening word makes the region.
    let mut l = lazy(quiet(false));
    assert!(!allowed(&l).contains(&"<t>x"));
    feed(&mut l, &["<q>", "<t>x", "</q>", "<t>{", "}"]);
    assert!(!allowed(&l).contains(&"<t>x"));
}

#[test]
fn a_refused_trigger_is_redrawn_from_the_tokens_that_fit() {
    let l = lazy(LazyRule::new("<t>", rule()).unwrap());
    let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
    // Greedy: "<t>x" leads but cannot go on as a call; "<t>{" is the best that can.
    let mut row = vec![0.0; WORDS.len() + 1];
    row[id("<t>x") as usize] = 9.0;
    row[id("<t>{") as usize] = 5.0;
    row[id("a") as usize] = 4.0;
    assert_eq!(l.sample(&mut s, &mut row, &[]), Some(id("<t>{")));
    // A free draw is taken as it is.
    let mut row = vec![0.0; WORDS.len() + 1];
    row[id("x") as usize] = 9.0;
    assert_eq!(l.sample(&mut s, &mut row, &[]), Some(id("x")));
}

#[test]
fn a_trigger_far_into_free_output_is_still_seen() {
    let mut l = lazy(LazyRule::new("<t>", rule()).unwrap());
    for _ in 0..100 {
        feed(&mut l, &["a", "x"]);
    }
    feed(&mut l, &["<"]);
    assert!(!l.allows(id("<t>x")));
    feed(&mut l, &["t>"]);
    assert_eq!(allowed(&l), ["{"]);
}

#[test]
fn any_of_several_triggers_binds_the_output() {
    let g = Grammar::parse(r#"root ::= ("<t>" | "x") "{" [ab]* "}""#).unwrap();
    let rule = LazyRule::with_triggers(&["<t>", "x"], OutputRule::Grammar(Arc::new(g)));
    let mut l = lazy(rule.unwrap());
    feed(&mut l, &["a", "x"]);
    assert_eq!(allowed(&l), ["{"], "x started it");
    feed(&mut l, &["{", "}", "<t>"]);
    assert_eq!(
        allowed(&l),
        ["{"],
        "and so does <t>, after the first string"
    );
}

#[test]
fn rules_that_cannot_work_are_refused() {
    let err = |r: Result<LazyRule>| r.expect_err("refused").to_string();
    assert!(err(LazyRule::new("<x>", rule())).contains("does not start with"));
    assert!(err(LazyRule::new("", rule())).contains("1 to 32 bytes"));
    let long = "<t>".repeat(20);
    assert!(err(LazyRule::new(&long, rule())).contains("1 to 32 bytes"));
    let lazy = OutputRule::Lazy(Arc::new(LazyRule::new("<t>", rule()).unwrap()));
    assert!(err(LazyRule::new("<t>", lazy)).contains("another lazy rule"));
    assert!(err(LazyRule::with_triggers(&[], rule())).contains("1 to 16 triggers"));
    assert!(err(LazyRule::with_triggers(&["<t>", "x"], rule())).contains("\"x\""));
    let ok = LazyRule::new("<t>", rule()).unwrap();
    assert!(err(ok.quiet_between("", "</q>", false)).contains("opening"));
    // A JSON document cannot start with "<".
    let json = OutputRule::Json(Arc::new(JsonSchema::any_object()));
    assert!(err(LazyRule::new("<t>", json)).contains("does not start with"));
}
