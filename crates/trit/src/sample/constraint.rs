//! Constrained decoding: the sampled token must keep the output a prefix of a string of a
//! language over bytes — a JSON schema (`json/`: `response_format` in the server, `--json` /
//! `--json-schema` in `trit run`) or a GBNF grammar (`grammar/`: the server's `grammar`,
//! `--grammar` / `--grammar-file`). As llama.cpp does with grammars, the sampler first draws
//! from the unconstrained row; only when that token does not fit are the tokens that do not fit
//! masked out and the draw repeated. Once the output is complete and nothing may follow, only
//! an end-of-sequence token remains.

use super::grammar::{Grammar, GrammarState};
use super::json::{ParseState, Recognizer};
use super::lazy::{Lazy, LazyRule};
use super::token_table::TokenTable;
use super::{JsonSchema, Sampler};
use std::collections::HashMap;
use std::sync::Arc;

/// A language the output must stay inside, read byte by byte.
pub trait ByteLanguage: Send + Sync + 'static {
    /// Equal states behave alike, so a mask computes each (state, byte) step once.
    type State: Clone + Send + Eq + std::hash::Hash;
    /// The state before any output.
    fn start(&self) -> Self::State;
    /// The state after `bytes`, or `None` when no string of the language continues that way.
    fn feed_all(&self, st: Self::State, bytes: &[u8]) -> Option<Self::State>;
    /// The state after one more byte (`feed_all` of a copy, unless the language can do
    /// without the copy).
    fn next(&self, st: &Self::State, b: u8) -> Option<Self::State> {
        self.feed_all(st.clone(), &[b])
    }
    /// The output so far is a complete string of the language.
    fn can_end(&self, st: &Self::State) -> bool;
    /// Nothing may follow.
    fn is_done(&self, st: &Self::State) -> bool;
}

impl ByteLanguage for JsonSchema {
    type State = ParseState;
    fn start(&self) -> ParseState {
        ParseState::new(self)
    }
    fn feed_all(&self, st: ParseState, bytes: &[u8]) -> Option<ParseState> {
        let mut r = Recognizer::resume(self, st);
        r.feed_all(bytes).then_some(r.state)
    }
    fn can_end(&self, st: &ParseState) -> bool {
        Recognizer::resume(self, st.clone()).can_end()
    }
    fn is_done(&self, st: &ParseState) -> bool {
        st.is_done()
    }
}

impl ByteLanguage for Grammar {
    type State = GrammarState;
    fn start(&self) -> GrammarState {
        Grammar::start(self)
    }
    fn feed_all(&self, mut st: GrammarState, bytes: &[u8]) -> Option<GrammarState> {
        Grammar::feed_all(self, &mut st, bytes).then_some(st)
    }
    fn next(&self, st: &GrammarState, b: u8) -> Option<GrammarState> {
        Grammar::next(self, st, b)
    }
    fn can_end(&self, st: &GrammarState) -> bool {
        Grammar::can_end(self, st)
    }
    fn is_done(&self, st: &GrammarState) -> bool {
        Grammar::is_done(self, st)
    }
}

/// What a request asks its output to be.
#[derive(Clone, Debug)]
pub enum OutputRule {
    Json(Arc<JsonSchema>),
    Grammar(Arc<Grammar>),
    /// Free output until a trigger, then a language (a tool call, say) from the trigger on.
    Lazy(Arc<LazyRule>),
}

/// The rule, with the vocabulary's bytes to check tokens against (built once per tokenizer
/// and shared).
#[derive(Clone)]
pub struct ConstrainedOutput {
    pub rule: OutputRule,
    pub table: Arc<TokenTable>,
}

impl std::fmt::Debug for ConstrainedOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstrainedOutput")
            .field("rule", &self.rule)
            .finish()
    }
}

/// One sequence's constraint: the language, the vocabulary's bytes and where the output is.
pub struct Follow<L: ByteLanguage> {
    lang: Arc<L>,
    table: Arc<TokenTable>,
    state: L::State,
    eos: Vec<u32>,
}

impl<L: ByteLanguage> Follow<L> {
    /// `eos`: the tokens that end the output, allowed once it is complete.
    pub fn new(lang: Arc<L>, table: Arc<TokenTable>, eos: Vec<u32>) -> Self {
        let state = lang.start();
        Follow {
            lang,
            table,
            state,
            eos,
        }
    }

    fn fits(&self, bytes: &[u8]) -> bool {
        self.lang.feed_all(self.state.clone(), bytes).is_some()
    }

    /// The state after `bytes` from the language's start, or `None` when no string of the
    /// language starts that way.
    pub(super) fn state_after(&self, bytes: &[u8]) -> Option<L::State> {
        self.lang.feed_all(self.lang.start(), bytes)
    }

    /// Goes on from `state` (one [`state_after`](Self::state_after) gave).
    pub(super) fn resume(&mut self, state: L::State) {
        self.state = state;
    }

    /// Nothing may follow the output.
    pub(super) fn is_done(&self) -> bool {
        self.lang.is_done(&self.state)
    }

    pub(super) fn table(&self) -> &TokenTable {
        &self.table
    }

    pub(super) fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// Whether `tok` may come next.
    pub fn allows(&self, tok: u32) -> bool {
        if self.eos.contains(&tok) {
            return self.is_complete();
        }
        self.table.get(tok).is_some_and(|b| self.fits(b))
    }

    /// Sets every token that may not come next to −∞; returns how many may. Walks the
    /// vocabulary's trie: each shared prefix is fed once, a prefix the language refuses rules
    /// out every token under it, and each (state, byte) step is computed once (the prefixes of
    /// a JSON string's text or of a grammar's repeated class share their states).
    pub fn mask(&self, logits: &mut [f32]) -> usize {
        let trie = self.table.trie();
        let mut fits = vec![false; logits.len()];
        let mut mark = |c: u32| {
            for &id in trie.tokens(c) {
                if let Some(f) = fits.get_mut(id as usize) {
                    *f = true;
                }
            }
        };
        let mut memo = Memo::new(self.state.clone());
        let mut stack = vec![(trie.root(), 0usize)];
        while let Some((n, sid)) = stack.pop() {
            for c in trie.children(n) {
                if let Some(next) = memo.next(&*self.lang, sid, trie.node(c).byte) {
                    mark(c);
                    if !trie.children(c).is_empty() {
                        stack.push((c, next));
                    }
                }
            }
        }
        let complete = self.is_complete();
        let mut allowed = 0;
        for (id, (l, fit)) in logits.iter_mut().zip(fits).enumerate() {
            let ok = if self.eos.contains(&(id as u32)) {
                complete
            } else {
                fit
            };
            if ok {
                allowed += 1;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        allowed
    }
}

/// The states one mask meets, each kept once, and the steps between them.
struct Memo<S> {
    states: Vec<S>,
    ids: HashMap<S, usize>,
    steps: HashMap<(usize, u8), Option<usize>>,
}

impl<S: Clone + Eq + std::hash::Hash> Memo<S> {
    fn new(start: S) -> Self {
        Memo {
            ids: HashMap::from([(start.clone(), 0)]),
            states: vec![start],
            steps: HashMap::new(),
        }
    }

    /// The id of the state after byte `b` from state `sid`, or `None` where `b` is refused.
    fn next<L: ByteLanguage<State = S>>(&mut self, lang: &L, sid: usize, b: u8) -> Option<usize> {
        if let Some(&r) = self.steps.get(&(sid, b)) {
            return r;
        }
        let r = lang
            .next(&self.states[sid], b)
            .map(|st| match self.ids.get(&st) {
                Some(&id) => id,
                None => {
                    self.ids.insert(st.clone(), self.states.len());
                    self.states.push(st);
                    self.states.len() - 1
                }
            });
        self.steps.insert((sid, b), r);
        r
    }
}

/// What a sequence does with its constraint, whichever language it follows.
pub trait Constrain: Send {
    /// The output is complete.
    fn is_complete(&self) -> bool;
    /// Draws the next token from `logits` under the constraint; `None` when no token fits (a
    /// vocabulary without the bytes the output needs next), which ends the output.
    fn sample(&self, sampler: &mut Sampler, logits: &mut [f32], history: &[u32]) -> Option<u32>;
    /// Records the sampled token (one that the constraint allowed).
    fn advance(&mut self, tok: u32);
}

impl<L: ByteLanguage> Constrain for Follow<L> {
    fn is_complete(&self) -> bool {
        self.lang.can_end(&self.state)
    }

    fn sample(&self, sampler: &mut Sampler, logits: &mut [f32], history: &[u32]) -> Option<u32> {
        if self.lang.is_done(&self.state) {
            return self.eos.first().copied();
        }
        draw(
            |t| self.allows(t),
            |row| self.mask(row),
            sampler,
            logits,
            history,
        )
    }

    fn advance(&mut self, tok: u32) {
        if let Some(bytes) = self.table.get(tok) {
            if let Some(next) = self.lang.feed_all(self.state.clone(), bytes) {
                self.state = next;
            }
        }
    }
}

/// Draws from the unconstrained row first; only when that token is not allowed are the
/// tokens that are not masked out and the draw repeated (`None`: none is allowed).
pub(super) fn draw(
    allows: impl Fn(u32) -> bool,
    mask: impl FnOnce(&mut [f32]) -> usize,
    sampler: &mut Sampler,
    logits: &mut [f32],
    history: &[u32],
) -> Option<u32> {
    let mut trial = logits.to_vec();
    let tok = sampler.sample(&mut trial, history);
    if trial.get(tok as usize).is_some_and(|l| l.is_finite()) && allows(tok) {
        return Some(tok);
    }
    if mask(logits) == 0 {
        return None;
    }
    Some(sampler.sample(logits, history))
}

/// A sequence's constraint: a [`Follow`] of its request's language, or a [`Lazy`] one.
pub type OutputConstraint = Box<dyn Constrain>;

/// The constraint `out` asks for, from the start of the output.
pub fn constraint_for(out: &ConstrainedOutput, eos: Vec<u32>) -> OutputConstraint {
    let table = out.table.clone();
    match &out.rule {
        OutputRule::Json(s) => Box::new(Follow::new(s.clone(), table, eos)),
        OutputRule::Grammar(g) => Box::new(Follow::new(g.clone(), table, eos)),
        OutputRule::Lazy(lazy) => match lazy.rule() {
            OutputRule::Json(s) => Box::new(Lazy::new(lazy.clone(), s.clone(), table, eos)),
            OutputRule::Grammar(g) => Box::new(Lazy::new(lazy.clone(), g.clone(), table, eos)),
            // `LazyRule::new` refuses a lazy rule inside another.
            OutputRule::Lazy(_) => constraint_for(
                &ConstrainedOutput {
                    rule: lazy.rule().clone(),
                    table,
                },
                eos,
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::SamplingParams;

    /// Tokens: "a", "b", "ab", "aé", the two bytes of "é" alone, and end-of-sequence (id 6).
    fn vocab() -> Arc<TokenTable> {
        let t = vec![
            Some(b"a".to_vec()),
            Some(b"b".to_vec()),
            Some(b"ab".to_vec()),
            Some("aé".as_bytes().to_vec()),
            Some(vec![0xc3]),
            Some(vec![0xa9]),
            None,
        ];
        Arc::new(TokenTable::from_bytes(t))
    }

    fn allowed(f: &Follow<Grammar>) -> Vec<usize> {
        let mut row = vec![0.0f32; 7];
        f.mask(&mut row);
        (0..7).filter(|&i| row[i].is_finite()).collect()
    }

    #[test]
    fn a_grammar_masks_tokens_and_ends_with_end_of_sequence() {
        let g = Arc::new(Grammar::parse(r#"root ::= "a"+ "é""#).unwrap());
        let mut f = Follow::new(g, vocab(), vec![6]);
        assert_eq!(allowed(&f), [0, 3], "a, aé");
        f.advance(0);
        // "é" may come whole inside a token, or split: its lead byte alone.
        assert_eq!(allowed(&f), [0, 3, 4]);
        f.advance(4);
        assert_eq!(allowed(&f), [5], "the continuation byte only");
        f.advance(5);
        assert!(f.is_complete());
        assert_eq!(allowed(&f), [6], "only the end");
        // Done: the sampler is not even asked.
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        let mut row = vec![5.0, 0.0, 0.0, 0.0, 0.0, 0.0, -9.0];
        assert_eq!(f.sample(&mut s, &mut row, &[]), Some(6));
    }

    /// 3,000 random tokens of 1–5 pieces of `alphabet`.
    fn random_vocab(alphabet: &[&str], seed: u64) -> Arc<TokenTable> {
        let mut rng = crate::test_values::TestRng(seed);
        let words: Vec<Option<Vec<u8>>> = (0..3000)
            .map(|_| {
                let n = 1 + rng.below(5);
                let w = (0..n).flat_map(|_| alphabet[rng.below(alphabet.len())].bytes());
                Some(w.collect())
            })
            .collect();
        Arc::new(TokenTable::from_bytes(words))
    }

    /// At each of `steps` steps of an output, the trie mask (with its step memo) allows
    /// exactly the tokens `allows` takes (each token's bytes fed alone); then the allowed
    /// token of the median id is taken.
    fn mask_equals_allows<L: ByteLanguage>(mut f: Follow<L>, steps: usize) {
        let n = f.table.len();
        for step in 0..steps {
            let mut row = vec![0.0f32; n];
            let count = f.mask(&mut row);
            let want: Vec<bool> = (0..n as u32).map(|t| f.allows(t)).collect();
            let got: Vec<bool> = row.iter().map(|l| l.is_finite()).collect();
            assert_eq!(got, want, "step {step}");
            assert_eq!(count, want.iter().filter(|&&w| w).count());
            let ok: Vec<u32> = (0..n as u32).filter(|&t| want[t as usize]).collect();
            assert!(!ok.is_empty(), "step {step}");
            f.advance(ok[ok.len() / 2]);
        }
    }

    #[test]
    fn the_trie_mask_agrees_with_each_token_fed_alone() {
        let table = random_vocab(&["a", "b", "(", ")", " ", "é", "1"], 77);
        let text = r#"root ::= item (" " item)*
            item ::= "(" [ab]{1,3} ")" | [1é]+ | "a" item"#;
        let g = Arc::new(Grammar::parse(text).unwrap());
        mask_equals_allows(Follow::new(g, table, vec![]), 12);
        let table = random_vocab(&["{", "}", "\"", "a", ":", ",", " ", "1", "é", "[", "]"], 5);
        let json = Arc::new(JsonSchema::any_object());
        mask_equals_allows(Follow::new(json, table, vec![]), 12);
    }

    #[test]
    fn a_draw_outside_the_grammar_is_redrawn_from_the_tokens_inside() {
        let g = Arc::new(Grammar::parse(r#"root ::= "b" | "ab""#).unwrap());
        let f = Follow::new(g, vocab(), vec![6]);
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        // Greedy: "aé" (id 3) leads but does not fit; of "a", "b" and "ab" (and not the end
        // yet), "ab" is the best.
        let mut row = vec![1.0, 2.0, 8.0, 9.0, 0.0, 0.0, 7.0];
        assert_eq!(f.sample(&mut s, &mut row, &[]), Some(2));
        assert!(row[3].is_infinite() && row[6].is_infinite() && row[0].is_finite());
    }
}
