//! Constrained decoding to JSON: the sampled token must keep the output a prefix of a
//! document that satisfies the schema (`response_format` in the server, `--json` /
//! `--json-schema` in `trit run`). As llama.cpp does with grammars, the sampler first draws
//! from the unconstrained row; only when that token does not fit are the tokens that do not
//! fit masked out and the draw repeated. Once the document is complete only an
//! end-of-sequence token remains.

mod dec_range;
mod int_range;
mod pattern;
mod recognizer;
mod schema;

pub use recognizer::{ParseState, Recognizer};
pub use schema::JsonSchema;

use super::Sampler;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

/// Every token's bytes, as the recognizer reads them; `None` for special tokens (never
/// allowed inside a document) and tokens without bytes.
pub struct TokenTable {
    bytes: Vec<Option<Box<[u8]>>>,
}

impl TokenTable {
    pub fn new(tok: &Tokenizer) -> TokenTable {
        let bytes = (0..tok.vocab_size() as u32)
            .map(|id| {
                if tok.is_special(id) {
                    return None;
                }
                tok.token_bytes(id)
                    .filter(|b| !b.is_empty())
                    .map(Vec::into_boxed_slice)
            })
            .collect();
        TokenTable { bytes }
    }

    /// A table from explicit token bytes (tests, synthetic vocabularies).
    pub fn from_bytes(bytes: Vec<Option<Vec<u8>>>) -> TokenTable {
        TokenTable {
            bytes: bytes
                .into_iter()
                .map(|b| b.filter(|b| !b.is_empty()).map(Vec::into_boxed_slice))
                .collect(),
        }
    }

    pub fn get(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).and_then(|b| b.as_deref())
    }
}

/// What a request asks its output to be: a schema, with the vocabulary's bytes to check
/// tokens against (built once per tokenizer and shared).
#[derive(Clone)]
pub struct JsonOutput {
    pub schema: Arc<JsonSchema>,
    pub table: Arc<TokenTable>,
}

impl std::fmt::Debug for JsonOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonOutput")
            .field("schema", &self.schema)
            .finish()
    }
}

/// The constraint of one sequence: the schema, the vocabulary's bytes and where the output is.
pub struct JsonConstraint {
    schema: Arc<JsonSchema>,
    table: Arc<TokenTable>,
    state: ParseState,
    eos: Vec<u32>,
}

impl JsonConstraint {
    /// `eos`: the tokens that end the output, allowed once the document is complete.
    pub fn new(schema: Arc<JsonSchema>, table: Arc<TokenTable>, eos: Vec<u32>) -> Self {
        let state = ParseState::new(&schema);
        JsonConstraint {
            schema,
            table,
            state,
            eos,
        }
    }

    fn recognizer(&self) -> Recognizer<'_> {
        Recognizer::resume(&self.schema, self.state.clone())
    }

    /// The output is a complete document.
    pub fn is_complete(&self) -> bool {
        self.recognizer().can_end()
    }

    /// Whether `tok` may come next.
    pub fn allows(&self, tok: u32) -> bool {
        if self.eos.contains(&tok) {
            return self.is_complete();
        }
        match self.table.get(tok) {
            Some(bytes) => self.recognizer().feed_all(bytes),
            None => false,
        }
    }

    /// Sets every token that may not come next to −∞; returns how many may.
    pub fn mask(&self, logits: &mut [f32]) -> usize {
        // The bytes that can come next at all decide most tokens without a trial parse.
        let mut first = [false; 256];
        for (b, ok) in first.iter_mut().enumerate() {
            *ok = self.recognizer().feed(b as u8);
        }
        let complete = self.is_complete();
        let mut allowed = 0;
        for (id, l) in logits.iter_mut().enumerate() {
            let id = id as u32;
            let ok = if self.eos.contains(&id) {
                complete
            } else {
                match self.table.get(id) {
                    Some(bytes) if first[bytes[0] as usize] => {
                        bytes.len() == 1 || self.recognizer().feed_all(bytes)
                    }
                    _ => false,
                }
            };
            if ok {
                allowed += 1;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        allowed
    }

    /// Draws the next token from `logits` under the constraint; `None` when no token fits (a
    /// vocabulary without the bytes the document needs next), which ends the output.
    pub fn sample(
        &self,
        sampler: &mut Sampler,
        logits: &mut [f32],
        history: &[u32],
    ) -> Option<u32> {
        if self.state.is_done() {
            return self.eos.first().copied();
        }
        let mut trial = logits.to_vec();
        let tok = sampler.sample(&mut trial, history);
        if trial.get(tok as usize).is_some_and(|l| l.is_finite()) && self.allows(tok) {
            return Some(tok);
        }
        if self.mask(logits) == 0 {
            return None;
        }
        Some(sampler.sample(logits, history))
    }

    /// Records the sampled token (one that [`allows`](Self::allows) accepted).
    pub fn advance(&mut self, tok: u32) {
        if let Some(bytes) = self.table.get(tok) {
            let mut r = Recognizer::resume(&self.schema, self.state.clone());
            if r.feed_all(bytes) {
                self.state = r.state;
            }
        }
    }
}

#[cfg(test)]
mod all_of_tests;
#[cfg(test)]
mod number_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod union_tests;
#[cfg(test)]
mod xml_tests;
