//! Qwen3.5's XML tool-call dialect as a frame of the recognizer. After the opening text
//! `<tool_call>\n<function=NAME>\n` each argument is `<parameter=NAME>\n` VALUE
//! `\n</parameter>\n`, and once every required property is written the call may end with the
//! schema's closing text, `</function>\n</tool_call>`. Only declared properties, each at most
//! once. A plain string property's VALUE is its text as it is, as Qwen3.5's template writes
//! strings (any UTF-8 without control characters but tab and line break, within the length
//! bounds; the server's reader keeps a string parameter's text); any other VALUE is a JSON
//! document of the property's schema.

use super::{lex, Frame, Lex, LexStep, Outcome, Runner};
use crate::sample::json::schema::{Node, STRING};

const PARAM_OPEN: &[u8] = b"<parameter=";
const PARAM_CLOSE: &[u8] = b"\n</parameter>\n";
/// What ends a raw value (the rest of `PARAM_CLOSE` follows).
const RAW_END: &[u8] = b"\n</parameter>";

/// Whether a property's value is written raw: a string without enumerated values or pattern.
fn raw_string(n: &Node) -> bool {
    n.kinds == STRING && n.literals.is_none() && n.pattern.is_none() && n.branches.is_empty()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum XmlPhase {
    /// A parameter's opening (`alive` bit 0) or the closing text (bit 1).
    Next,
    /// A parameter's name: `alive` the properties it can still become.
    Name,
    /// The line break after the name of property `alive` (its index) and its `>`.
    NameEnd,
    /// `\n</parameter>\n` after a value.
    ValueEnd,
}

impl Runner<'_> {
    /// The arguments' frame right after the opening text.
    pub(super) fn xml_start(&self, node: u32) -> Frame {
        self.xml_next(node, 0)
    }

    /// Between arguments: another property if one is left, the end if none is required.
    fn xml_next(&self, node: u32, seen: u64) -> Frame {
        let obj = &self.node(node).object;
        let left = super::mask(obj.props.len()) & !seen != 0;
        let may_end = obj.required & !seen == 0;
        Frame::XmlArgs {
            node,
            seen,
            phase: XmlPhase::Next,
            alive: left as u64 | (may_end as u64) << 1,
            pos: 0,
        }
    }

    pub(super) fn xml_args(
        &mut self,
        node: u32,
        seen: u64,
        phase: XmlPhase,
        alive: u64,
        pos: u16,
        b: u8,
    ) -> Outcome {
        let props = &self.node(node).object.props;
        let at = pos as usize;
        let frame = |phase, alive, pos| Frame::XmlArgs {
            node,
            seen,
            phase,
            alive,
            pos,
        };
        match phase {
            XmlPhase::Next => {
                let closing = self.schema.closing.as_slice();
                let mut next = 0u64;
                for (i, text) in [PARAM_OPEN, closing].into_iter().enumerate() {
                    if alive >> i & 1 == 1 && text.get(at) == Some(&b) {
                        next |= 1 << i;
                    }
                }
                // The two texts differ at their second byte: at most one is left after it.
                if next == 1 && at + 1 == PARAM_OPEN.len() {
                    let unseen = super::mask(props.len()) & !seen;
                    return Outcome::Replace(frame(XmlPhase::Name, unseen, 0));
                }
                if next == 2 && at + 1 == closing.len() {
                    return Outcome::Done;
                }
                match next {
                    0 => Outcome::Reject,
                    _ => Outcome::Replace(frame(XmlPhase::Next, next, pos + 1)),
                }
            }
            XmlPhase::Name => {
                if b == b'>' {
                    let named =
                        (0..props.len()).find(|&i| alive >> i & 1 == 1 && props[i].0.len() == at);
                    return match named {
                        Some(i) => Outcome::Replace(frame(XmlPhase::NameEnd, i as u64, 0)),
                        None => Outcome::Reject,
                    };
                }
                let mut next = 0u64;
                for (i, (name, _)) in props.iter().enumerate() {
                    if alive >> i & 1 == 1 && name.get(at) == Some(&b) {
                        next |= 1 << i;
                    }
                }
                match next {
                    0 => Outcome::Reject,
                    _ => Outcome::Replace(frame(XmlPhase::Name, next, pos + 1)),
                }
            }
            XmlPhase::NameEnd => {
                if b != b'\n' {
                    return Outcome::Reject;
                }
                let i = alive as usize;
                self.set_top(Frame::XmlArgs {
                    node,
                    seen: seen | 1 << i,
                    phase: XmlPhase::ValueEnd,
                    alive: 0,
                    pos: 0,
                });
                let value = props[i].1 as u32;
                Outcome::Push(match raw_string(self.node(value)) {
                    true => raw(value, 0, Lex::Normal, (0, 0)),
                    false => Frame::Value { node: value },
                })
            }
            XmlPhase::ValueEnd => {
                if PARAM_CLOSE.get(at) != Some(&b) {
                    return Outcome::Reject;
                }
                if at + 1 == PARAM_CLOSE.len() {
                    return Outcome::Replace(self.xml_next(node, seen));
                }
                Outcome::Replace(frame(XmlPhase::ValueEnd, 0, pos + 1))
            }
        }
    }

    /// A raw string value's next byte. A line break may begin the closing `\n</parameter>`:
    /// its bytes are held in `tail` until they either complete it (the value ends; the
    /// arguments' frame then takes the last line break) or stop matching (they were content).
    /// Content may not hold `</parameter>` anywhere (`watch`): readers end the value there.
    pub(super) fn raw_text(
        &mut self,
        node: u32,
        chars: u32,
        lex: Lex,
        (tail, watch): (u8, u8),
        b: u8,
    ) -> Outcome {
        let n = self.node(node);
        let mut chars = chars;
        let t = tail as usize;
        if t > 0 {
            if RAW_END[t] == b {
                if t + 1 < RAW_END.len() {
                    return Outcome::Replace(raw(node, chars, lex, (tail + 1, 0)));
                }
                if (chars as usize) < n.min_len {
                    return Outcome::Reject;
                }
                // The value is over: the arguments' frame below expects PARAM_CLOSE's last byte.
                let below = self.t.stack.len() - 2;
                if let Frame::XmlArgs { pos, .. } = &mut self.t.stack[below] {
                    *pos = RAW_END.len() as u16;
                }
                return Outcome::Done;
            }
            // The held bytes were content: a line break and ASCII, a character each. (They
            // match `</parameter>` only up to the byte that just broke the match.)
            chars += tail as u32;
            if n.max_len.is_some_and(|m| chars as usize > m) {
                return Outcome::Reject;
            }
        }
        let mut lex = lex;
        let new = match (lex, b) {
            (Lex::Normal, b'\n') => return Outcome::Replace(raw(node, chars, lex, (1, 0))),
            (Lex::Normal, b'\t' | 0x20..=0x7f) => true,
            (Lex::Normal, 0..=0x1f) => return Outcome::Reject,
            // A UTF-8 lead or continuation byte (JSON's lexer checks them alike).
            _ => match self::lex(&mut lex, b) {
                LexStep::Content(new) => new,
                _ => return Outcome::Reject,
            },
        };
        let chars = chars + new as u32;
        if n.max_len.is_some_and(|m| chars as usize > m) {
            return Outcome::Reject;
        }
        let end_tag = &RAW_END[1..];
        let watch = match (t == 0 && end_tag[watch as usize] == b, b == b'<') {
            (true, _) if watch as usize + 1 == end_tag.len() => return Outcome::Reject,
            (true, _) => watch + 1,
            (false, true) => 1,
            (false, false) => 0,
        };
        Outcome::Replace(raw(node, chars, lex, (0, watch)))
    }
}

fn raw(node: u32, chars: u32, lex: Lex, (tail, watch): (u8, u8)) -> Frame {
    Frame::RawText {
        node,
        chars,
        lex,
        tail,
        watch,
    }
}
