//! Several readings of one document at once: an `anyOf`/`oneOf` whose branches a value's
//! first byte cannot tell apart (two object models, a string enum beside a string pattern, two
//! bounded number ranges) is read along every branch, and a byte is accepted while any reading
//! still takes it.
//!
//! A reading (`Thread`) meets such a fork at the first byte of the value; the byte is then
//! tried on a copy of the reading from before it for each branch (`Runner::picks`: the branch
//! to take at each fork this byte meets, in order). Readings that end up equal are kept once,
//! so a union whose value has closed costs nothing further. At most `MAX_THREADS` readings are
//! kept: dropping one only narrows what may come next, so the output still satisfies the
//! schema.

use super::{Runner, Thread};
use crate::sample::json::schema::JsonSchema;

/// Readings kept at most (schemas that need more are rare and narrowed, never widened).
const MAX_THREADS: usize = 64;

/// Where a document is: every reading of the text so far. Clone it to try bytes without
/// committing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParseState {
    threads: Vec<Thread>,
}

impl ParseState {
    pub fn new(schema: &JsonSchema) -> Self {
        ParseState {
            threads: vec![Thread::new(schema)],
        }
    }

    /// The document is complete: nothing but the end may follow.
    pub fn is_done(&self) -> bool {
        self.threads.iter().all(Thread::is_done)
    }
}

/// A parse state read against its schema.
#[derive(Debug)]
pub struct Recognizer<'s> {
    schema: &'s JsonSchema,
    pub state: ParseState,
}

impl<'s> Recognizer<'s> {
    pub fn new(schema: &'s JsonSchema) -> Self {
        Self::resume(schema, ParseState::new(schema))
    }

    pub fn resume(schema: &'s JsonSchema, state: ParseState) -> Self {
        Recognizer { schema, state }
    }

    pub fn schema(&self) -> &'s JsonSchema {
        self.schema
    }

    /// The document is complete: nothing but the end may follow.
    pub fn is_done(&self) -> bool {
        self.state.is_done()
    }

    /// Whether the text so far is a complete document (a top-level number or literal that
    /// could go on also counts: the end finishes it).
    pub fn can_end(&self) -> bool {
        self.state
            .threads
            .iter()
            .any(|t| Runner::new(self.schema, t.clone(), Vec::new()).can_end())
    }

    /// Feeds `bytes`; false when they cannot continue a valid document (the state is then
    /// meaningless: try bytes on a clone).
    pub fn feed_all(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.feed(b))
    }

    pub fn feed(&mut self, b: u8) -> bool {
        if !self.schema.has_forks && self.state.threads.len() == 1 {
            // One reading and no forks (most schemas): fed in place, no new allocation.
            let t = self.state.threads.pop().expect("one reading");
            let mut r = Runner::new(self.schema, t, Vec::new());
            let fed = r.feed(b);
            self.state.threads.push(r.t);
            return fed;
        }
        let mut kept: Vec<Thread> = Vec::with_capacity(self.state.threads.len());
        let mut work: Vec<(Thread, Vec<usize>)> = self
            .state
            .threads
            .drain(..)
            .rev()
            .map(|t| (t, Vec::new()))
            .collect();
        while let Some((t, picks)) = work.pop() {
            let mut r = Runner::new(self.schema, t, picks);
            // The reading from before the byte, for the branches of a fork it meets (only
            // schemas with forks pay for the copy).
            let before = self.schema.has_forks.then(|| r.t.clone());
            if r.feed(b) {
                if kept.len() < MAX_THREADS && !kept.contains(&r.t) {
                    kept.push(r.t);
                }
            } else if let (Some(n), Some(before)) = (r.fork, before) {
                for i in (0..n).rev() {
                    // The fork came after every pick was used: one more.
                    let mut picks = r.picks.clone();
                    picks.push(i);
                    work.push((before.clone(), picks));
                }
            }
        }
        self.state.threads = kept;
        !self.state.threads.is_empty()
    }
}
