//! A byte-at-a-time recognizer of JSON documents that satisfy a compiled [`JsonSchema`]: it
//! accepts a byte only while the text so far can still be completed into such a document,
//! so a sampler that only ever picks accepted tokens cannot paint itself into a corner.
//! One frame per open value on a stack; every frame is a few words (no buffers), so trying
//! a token on a copy of the state costs one small allocation.

use super::dec_range::DecPrefix;
use super::int_range::IntPrefix;
use super::schema::{JsonSchema, Node, ARRAY, BOOL, INTEGER, NULL, NUMBER, OBJECT, STRING};
use lex::{lex, Lex, LexStep};
use xml_call::XmlPhase;

mod forks;
mod lex;
mod xml_call;

pub use forks::{ParseState, Recognizer};

/// Whitespace bytes allowed in a row, of which one line break (pretty-printed JSON fits; a
/// model that would rather end its turn cannot stall on newlines).
const MAX_WHITESPACE_RUN: u8 = 32;
/// Open values at most (a model cannot nest forever).
const MAX_DEPTH: usize = 32;
/// Bytes of one number at most; of an integer (an i64 holds any 18 digits); and exponent
/// digits (so that every number fits an f64: readers such as serde_json refuse the others).
const MAX_NUMBER_LEN: u8 = 40;
const MAX_INTEGER_LEN: u8 = 18;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum ObjPhase {
    /// After `{`: a key or `}`.
    KeyOrEnd,
    /// After `,`: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value: `,` or `}`.
    CommaOrEnd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum ArrPhase {
    ValueOrEnd,
    CommaOrEnd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum NumPhase {
    /// After `-`.
    Sign,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
    /// Two exponent digits: no more.
    ExpFull,
}

/// Where a literal's alternatives come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum LitSource {
    /// The node's `enum`/`const` values.
    Node(u32),
    /// `null`, `true` or `false` (index into `KEYWORDS`).
    Keyword(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Frame {
    /// A value of `node` starts here (whitespace first allowed).
    Value { node: u32 },
    Object {
        node: u32,
        seen: u64,
        phase: ObjPhase,
        value: u32,
    },
    Array {
        node: u32,
        count: u32,
        phase: ArrPhase,
    },
    Str {
        node: u32,
        chars: u32,
        lex: Lex,
        /// The pattern's DFA state (strings with a `pattern` or enforced `format`).
        re: u32,
    },
    /// A property name: `alive` are the properties it can still become (by their escaped
    /// names, compared byte for byte); none alive means another property's name.
    Key {
        obj: u32,
        alive: u64,
        pos: u16,
        lex: Lex,
    },
    Number {
        integer: bool,
        phase: NumPhase,
        len: u8,
        node: u32,
        /// An integer's sign and digits so far (its node may bound it).
        int: IntPrefix,
        /// A bounded number's text so far (`dec_range`; default otherwise).
        dec: DecPrefix,
    },
    /// One of a set of literal values; `alive`: those the bytes so far still match.
    Literal {
        src: LitSource,
        alive: u64,
        pos: u16,
    },
    /// A forced tool call's opening text (one per tool), then that tool's arguments.
    Opening { alive: u64, pos: u16 },
    /// The text after the arguments.
    Closing { pos: u16 },
    /// A forced tool call's arguments in Qwen3.5's XML dialect (`xml_call.rs`): `seen` the
    /// properties written, `alive`/`pos` the texts the bytes since `phase` began still match.
    XmlArgs {
        node: u32,
        seen: u64,
        phase: XmlPhase,
        alive: u64,
        pos: u16,
    },
    /// An XML argument's string value written as it is (`xml_call.rs`): `tail` bytes of the
    /// closing `\n</parameter>` seen, not yet known to be content; `watch` bytes of a
    /// `</parameter>` inside the content (which a reader would take for the end).
    RawText {
        node: u32,
        chars: u32,
        lex: Lex,
        tail: u8,
        watch: u8,
    },
}

/// What a frame did with a byte.
enum Outcome {
    Accept,
    /// The frame's value is complete with this byte.
    Done,
    /// The frame's value ended before this byte, which goes to the parent.
    DoneBefore,
    /// A child frame opens with this byte.
    Push(Frame),
    /// A child frame opens at this byte and takes it.
    PushRefeed(Frame),
    /// The frame becomes another that has taken the byte.
    Replace(Frame),
    Reject,
}

/// One reading of the document so far: its open values (a schema's `anyOf` of overlapping
/// branches is read several ways at once: `forks.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Thread {
    stack: Vec<Frame>,
    whitespace: u8,
    /// The current whitespace run's line break: 0 none yet, 1 after `\r`, 2 after `\n`.
    line_break: u8,
}

impl Thread {
    /// The document is complete: nothing but the end may follow.
    fn is_done(&self) -> bool {
        self.stack.is_empty()
    }

    fn new(schema: &JsonSchema) -> Self {
        let stack = if schema.openings.is_empty() {
            vec![Frame::Value {
                node: schema.root as u32,
            }]
        } else if schema.xml {
            // The arguments' frame writes the closing text itself.
            vec![Frame::Opening {
                alive: mask(schema.openings.len()),
                pos: 0,
            }]
        } else {
            vec![
                Frame::Closing { pos: 0 },
                Frame::Opening {
                    alive: mask(schema.openings.len()),
                    pos: 0,
                },
            ]
        };
        Thread {
            stack,
            whitespace: 0,
            line_break: 0,
        }
    }
}

/// One thread read against its schema, fed one byte at a time.
#[derive(Debug)]
struct Runner<'s> {
    schema: &'s JsonSchema,
    t: Thread,
    /// The branches this byte takes at the forks it meets, in order (`forks.rs`).
    picks: Vec<usize>,
    used: usize,
    /// A fork met with no pick left: its branch count (the byte is then tried on each).
    fork: Option<usize>,
}

const KEYWORDS: [&[u8]; 3] = [b"null", b"true", b"false"];

impl<'s> Runner<'s> {
    fn new(schema: &'s JsonSchema, t: Thread, picks: Vec<usize>) -> Self {
        Runner {
            schema,
            t,
            picks,
            used: 0,
            fork: None,
        }
    }

    fn node(&self, i: u32) -> &'s Node {
        &self.schema.nodes[i as usize]
    }

    /// Whether the text so far is a complete document (a top-level number or literal that
    /// could go on also counts: the end finishes it).
    fn can_end(&self) -> bool {
        self.t.stack.iter().all(|f| match *f {
            Frame::Number {
                phase,
                node,
                int,
                dec,
                ..
            } => number_accepting(phase) && self.number_in_range(node, int, dec),
            Frame::Literal { src, alive, pos } => self.literal_complete(src, alive, pos),
            _ => false,
        })
    }

    /// Feeds one byte; false when it cannot continue this reading (or a fork needs a pick:
    /// `fork`).
    fn feed(&mut self, b: u8) -> bool {
        let ws = matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        loop {
            let Some(&top) = self.t.stack.last() else {
                // After the document only whitespace (the constraint then asks for the end).
                if ws {
                    break;
                }
                return false;
            };
            match self.step(top, b, ws) {
                Outcome::Accept => {}
                Outcome::Done => {
                    self.t.stack.pop();
                }
                Outcome::DoneBefore => {
                    self.t.stack.pop();
                    continue;
                }
                Outcome::Push(f) | Outcome::PushRefeed(f) if self.t.stack.len() >= MAX_DEPTH => {
                    let _ = f;
                    return false;
                }
                Outcome::Push(f) => self.t.stack.push(f),
                Outcome::PushRefeed(f) => {
                    self.t.stack.push(f);
                    continue;
                }
                Outcome::Replace(f) => self.set_top(f),
                Outcome::Reject => return false,
            }
            break;
        }
        let in_string = matches!(
            self.t.stack.last(),
            Some(Frame::Str { .. } | Frame::Key { .. } | Frame::RawText { .. })
        );
        if ws && !in_string {
            // One break per run ("\r\n" counts as one).
            match (b, self.t.line_break) {
                (b'\r', 0) => self.t.line_break = 1,
                (b'\n', 0 | 1) => self.t.line_break = 2,
                (b'\r' | b'\n', _) => return false,
                _ => {}
            }
            self.t.whitespace += 1;
            self.t.whitespace <= MAX_WHITESPACE_RUN
        } else {
            self.t.whitespace = 0;
            self.t.line_break = 0;
            true
        }
    }

    fn set_top(&mut self, f: Frame) {
        *self.t.stack.last_mut().expect("nonempty") = f;
    }

    fn step(&mut self, top: Frame, b: u8, ws: bool) -> Outcome {
        match top {
            Frame::Value { node } => self.value_start(node, b, ws),
            Frame::Object {
                node,
                seen,
                phase,
                value,
            } => self.object(node, seen, phase, value, b, ws),
            Frame::Array { node, count, phase } => self.array(node, count, phase, b, ws),
            Frame::Str {
                node,
                chars,
                mut lex,
                re,
            } => {
                let n = self.node(node);
                let pattern = n.pattern.map(|p| &self.schema.patterns[p]);
                if pattern.is_some() && lex == Lex::Normal && b == b'\\' {
                    // A pattern-constrained string holds its characters unescaped.
                    return Outcome::Reject;
                }
                match self::lex(&mut lex, b) {
                    LexStep::Reject => Outcome::Reject,
                    LexStep::Close if (chars as usize) < n.min_len => Outcome::Reject,
                    LexStep::Close if pattern.is_some_and(|p| !p.accepts(re)) => Outcome::Reject,
                    LexStep::Close => Outcome::Done,
                    LexStep::Content(new) => {
                        if new && n.max_len.is_some_and(|m| chars as usize >= m) {
                            return Outcome::Reject;
                        }
                        let re = match pattern {
                            None => re,
                            Some(p) => match p.next(re, b) {
                                Some(next) => next,
                                None => return Outcome::Reject,
                            },
                        };
                        Outcome::Replace(Frame::Str {
                            node,
                            chars: chars + new as u32,
                            lex,
                            re,
                        })
                    }
                }
            }
            Frame::Key {
                obj,
                alive,
                pos,
                mut lex,
            } => self.key(obj, alive, pos, &mut lex, b),
            Frame::Number {
                integer,
                phase,
                len,
                node,
                int,
                dec,
            } => {
                let limit = if integer {
                    MAX_INTEGER_LEN
                } else {
                    MAX_NUMBER_LEN
                };
                let n = self.node(node);
                // A bounded number (not an integer) takes no exponent and the grid's digits.
                let dec_next = match n.dec_range {
                    Some(_) if !integer => dec.push(b),
                    _ => Some(dec),
                };
                match (number_next(phase, integer, b), dec_next) {
                    (Some(_), _) if len >= limit => Outcome::Reject,
                    (Some(phase), Some(dec)) => {
                        let int = if integer { int.push(b) } else { int };
                        let out = match (n.int_range, n.dec_range) {
                            (Some(r), _) if integer => r.feasible(int),
                            (_, Some(r)) if !integer => r.feasible(dec),
                            _ => true,
                        };
                        if !out {
                            return Outcome::Reject;
                        }
                        Outcome::Replace(Frame::Number {
                            integer,
                            phase,
                            len: len + 1,
                            node,
                            int,
                            dec,
                        })
                    }
                    (Some(_), None) => Outcome::Reject,
                    (None, _)
                        if number_accepting(phase) && self.number_in_range(node, int, dec) =>
                    {
                        Outcome::DoneBefore
                    }
                    (None, _) => Outcome::Reject,
                }
            }
            Frame::Literal { src, alive, pos } => self.literal(src, alive, pos, b),
            Frame::Opening { alive, pos } => {
                let openings = &self.schema.openings;
                let mut next = 0u64;
                for (i, (text, _)) in openings.iter().enumerate() {
                    if alive >> i & 1 == 1 && text.get(pos as usize) == Some(&b) {
                        next |= 1 << i;
                    }
                }
                let pos = pos + 1;
                // Openings differ in their tool's name, so at most one ends here.
                let done = openings
                    .iter()
                    .enumerate()
                    .find(|(i, (text, _))| next >> i & 1 == 1 && text.len() == pos as usize);
                match (next, done) {
                    (0, _) => Outcome::Reject,
                    (_, Some((_, (_, node)))) if self.schema.xml => {
                        Outcome::Replace(self.xml_start(*node as u32))
                    }
                    (_, Some((_, (_, node)))) => {
                        Outcome::Replace(Frame::Value { node: *node as u32 })
                    }
                    _ => Outcome::Replace(Frame::Opening { alive: next, pos }),
                }
            }
            Frame::XmlArgs {
                node,
                seen,
                phase,
                alive,
                pos,
            } => self.xml_args(node, seen, phase, alive, pos, b),
            Frame::RawText {
                node,
                chars,
                lex,
                tail,
                watch,
            } => self.raw_text(node, chars, lex, (tail, watch), b),
            Frame::Closing { pos } => {
                let closing = &self.schema.closing;
                match closing.get(pos as usize) {
                    Some(&c) if c == b && pos as usize + 1 == closing.len() => Outcome::Done,
                    Some(&c) if c == b => Outcome::Replace(Frame::Closing { pos: pos + 1 }),
                    _ => Outcome::Reject,
                }
            }
        }
    }

    /// Alternative `i` of a literal set.
    fn lit(&self, src: LitSource, i: usize) -> &'s [u8] {
        match src {
            LitSource::Keyword(k) => KEYWORDS[k as usize],
            LitSource::Node(n) => &self.node(n).literals.as_ref().expect("a literal node")[i],
        }
    }

    fn lit_count(&self, src: LitSource) -> usize {
        match src {
            LitSource::Keyword(_) => 1,
            LitSource::Node(n) => self.node(n).literals.as_ref().map_or(0, |l| l.len()),
        }
    }

    fn literal_complete(&self, src: LitSource, alive: u64, pos: u16) -> bool {
        (0..self.lit_count(src))
            .any(|i| alive >> i & 1 == 1 && self.lit(src, i).len() == pos as usize)
    }

    fn literal(&self, src: LitSource, alive: u64, pos: u16, b: u8) -> Outcome {
        let n = self.lit_count(src);
        let mut next = 0u64;
        for i in 0..n {
            if alive >> i & 1 == 1 && self.lit(src, i).get(pos as usize) == Some(&b) {
                next |= 1 << i;
            }
        }
        if next == 0 {
            return if self.literal_complete(src, alive, pos) {
                Outcome::DoneBefore
            } else {
                Outcome::Reject
            };
        }
        let pos = pos + 1;
        let longer = (0..n).any(|i| next >> i & 1 == 1 && self.lit(src, i).len() > pos as usize);
        if !longer {
            // Nothing can follow inside this value: it is complete.
            return Outcome::Done;
        }
        Outcome::Replace(Frame::Literal {
            src,
            alive: next,
            pos,
        })
    }

    fn value_start(&mut self, node: u32, b: u8, ws: bool) -> Outcome {
        if ws {
            return Outcome::Accept;
        }
        let mut node = node;
        while let Some(branches) = Some(&self.node(node).branches).filter(|b| !b.is_empty()) {
            let Some(&pick) = self.picks.get(self.used) else {
                self.fork = Some(branches.len());
                return Outcome::Reject;
            };
            self.used += 1;
            node = branches[pick] as u32;
        }
        let n = self.node(node);
        if n.literals.is_some() {
            let src = LitSource::Node(node);
            return self.literal(src, mask(self.lit_count(src)), 0, b);
        }
        let k = n.kinds;
        match b {
            b'{' if k & OBJECT != 0 => Outcome::Replace(Frame::Object {
                node,
                seen: 0,
                phase: ObjPhase::KeyOrEnd,
                value: 0,
            }),
            b'[' if k & ARRAY != 0 => Outcome::Replace(Frame::Array {
                node,
                count: 0,
                phase: ArrPhase::ValueOrEnd,
            }),
            b'"' if k & STRING != 0 => Outcome::Replace(Frame::Str {
                node,
                chars: 0,
                lex: Lex::Normal,
                re: n.pattern.map_or(0, |p| self.schema.patterns[p].start()),
            }),
            b'-' | b'0'..=b'9' if k & (INTEGER | NUMBER) != 0 => {
                let phase = match b {
                    b'-' => NumPhase::Sign,
                    b'0' => NumPhase::Zero,
                    _ => NumPhase::Int,
                };
                let integer = k & NUMBER == 0;
                let int = IntPrefix::start(b);
                let dec = DecPrefix::default().push(b).unwrap_or_default();
                if integer && n.int_range.is_some_and(|r| !r.feasible(int)) {
                    return Outcome::Reject;
                }
                if !integer && n.dec_range.is_some_and(|r| !r.feasible(dec)) {
                    return Outcome::Reject;
                }
                Outcome::Replace(Frame::Number {
                    integer,
                    phase,
                    len: 1,
                    node,
                    int,
                    dec,
                })
            }
            b'n' if k & NULL != 0 => self.keyword(0),
            b't' if k & BOOL != 0 => self.keyword(1),
            b'f' if k & BOOL != 0 => self.keyword(2),
            _ => Outcome::Reject,
        }
    }

    /// Whether a finished number lies in its node's range (always, without one): an integer
    /// by `int_range`, a number by `dec_range`.
    fn number_in_range(&self, node: u32, int: IntPrefix, dec: DecPrefix) -> bool {
        let n = self.node(node);
        if n.kinds & NUMBER == 0 {
            n.int_range.is_none_or(|r| r.contains(int))
        } else {
            n.dec_range.is_none_or(|r| r.contains(dec))
        }
    }

    /// `null`, `true` or `false`, its first byte taken.
    fn keyword(&self, which: u8) -> Outcome {
        Outcome::Replace(Frame::Literal {
            src: LitSource::Keyword(which),
            alive: 1,
            pos: 1,
        })
    }

    fn object(
        &mut self,
        node: u32,
        seen: u64,
        phase: ObjPhase,
        value: u32,
        b: u8,
        ws: bool,
    ) -> Outcome {
        if ws {
            return Outcome::Accept;
        }
        let spec = &self.node(node).object;
        let all = mask(spec.props.len());
        let more_keys = spec.additional.is_some() || all & !seen != 0;
        let closable = spec.required & !seen == 0;
        let with = |phase| Frame::Object {
            node,
            seen,
            phase,
            value,
        };
        match (phase, b) {
            // An object that takes other properties follows every name (a repeated one is
            // refused at its closing quote: readers keep the last value, which the schema may
            // not admit); one that does not follows the unused names only (so it never
            // starts a name it could not finish).
            (ObjPhase::KeyOrEnd | ObjPhase::Key, b'"') if more_keys => Outcome::Push(Frame::Key {
                obj: node,
                alive: if spec.additional.is_some() {
                    all
                } else {
                    all & !seen
                },
                pos: 0,
                lex: Lex::Normal,
            }),
            (ObjPhase::KeyOrEnd | ObjPhase::CommaOrEnd, b'}') if closable => Outcome::Done,
            (ObjPhase::Colon, b':') => {
                self.set_top(with(ObjPhase::CommaOrEnd));
                Outcome::Push(Frame::Value { node: value })
            }
            (ObjPhase::CommaOrEnd, b',') if more_keys => Outcome::Replace(with(ObjPhase::Key)),
            _ => Outcome::Reject,
        }
    }

    fn key(&mut self, obj: u32, alive: u64, pos: u16, lex: &mut Lex, b: u8) -> Outcome {
        let spec = &self.node(obj).object;
        match self::lex(lex, b) {
            LexStep::Reject => Outcome::Reject,
            LexStep::Content(_) => {
                let mut next = 0u64;
                for (i, (name, _)) in spec.props.iter().enumerate() {
                    if alive >> i & 1 == 1 && name.get(pos as usize) == Some(&b) {
                        next |= 1 << i;
                    }
                }
                if next == 0 && spec.additional.is_none() {
                    return Outcome::Reject;
                }
                Outcome::Replace(Frame::Key {
                    obj,
                    alive: next,
                    pos: pos.saturating_add(1),
                    lex: *lex,
                })
            }
            LexStep::Close => {
                let exact = spec
                    .props
                    .iter()
                    .enumerate()
                    .find(|(i, (name, _))| alive >> i & 1 == 1 && name.len() == pos as usize);
                let (bit, value) = match (exact, spec.additional) {
                    (Some((i, (_, v))), _) => (1u64 << i, *v as u32),
                    (None, Some(extra)) => (0, extra as u32),
                    (None, None) => return Outcome::Reject,
                };
                let n = self.t.stack.len();
                if let Some(Frame::Object { seen, .. }) = self.t.stack.get(n.wrapping_sub(2)) {
                    if seen & bit != 0 {
                        return Outcome::Reject;
                    }
                }
                self.t.stack.pop();
                match self.t.stack.last_mut() {
                    Some(Frame::Object {
                        seen,
                        phase,
                        value: v,
                        ..
                    }) => {
                        *seen |= bit;
                        *phase = ObjPhase::Colon;
                        *v = value;
                    }
                    _ => unreachable!("a key's parent is its object"),
                }
                Outcome::Accept
            }
        }
    }

    fn array(&mut self, node: u32, count: u32, phase: ArrPhase, b: u8, ws: bool) -> Outcome {
        if ws {
            return Outcome::Accept;
        }
        let spec = &self.node(node).array;
        let closable = count as usize >= spec.min;
        let room = spec.max.is_none_or(|m| (count as usize) < m);
        // The item that would come next is item `count` (tuples give each its own node).
        let item = Frame::Value {
            node: spec.item(count as usize) as u32,
        };
        let next = Frame::Array {
            node,
            count: count + 1,
            phase: ArrPhase::CommaOrEnd,
        };
        match (phase, b) {
            (_, b']') if closable => Outcome::Done,
            (ArrPhase::CommaOrEnd, b',') if room => {
                self.set_top(next);
                Outcome::Push(item)
            }
            (ArrPhase::ValueOrEnd, _) if room => {
                // The first item starts with this byte.
                self.set_top(next);
                Outcome::PushRefeed(item)
            }
            _ => Outcome::Reject,
        }
    }
}

fn mask(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

fn number_accepting(p: NumPhase) -> bool {
    matches!(
        p,
        NumPhase::Zero | NumPhase::Int | NumPhase::Frac | NumPhase::ExpDigits | NumPhase::ExpFull
    )
}

/// The number's phase after `b`, or `None` when `b` cannot continue it.
fn number_next(p: NumPhase, integer: bool, b: u8) -> Option<NumPhase> {
    use NumPhase::*;
    let digit = b.is_ascii_digit();
    Some(match (p, b) {
        // "-0" is a float to most readers (serde_json): integers never write it.
        (Sign, b'0') if integer => return None,
        (Sign, b'0') => Zero,
        (Sign, _) if digit => Int,
        (Int, _) if digit => Int,
        (Zero | Int, b'.') if !integer => Dot,
        (Zero | Int | Frac, b'e' | b'E') if !integer => Exp,
        (Dot | Frac, _) if digit => Frac,
        (Exp, b'+' | b'-') => ExpSign,
        (Exp | ExpSign, _) if digit => ExpDigits,
        (ExpDigits, _) if digit => ExpFull,
        _ => return None,
    })
}
