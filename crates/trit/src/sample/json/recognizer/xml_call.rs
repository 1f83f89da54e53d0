//! Qwen3.5's XML tool-call dialect as a frame of the recognizer. After the opening text
//! `<tool_call>\n<function=NAME>\n` each argument is `<parameter=NAME>\n` VALUE
//! `\n</parameter>\n`, VALUE a JSON document of the property's schema (the server's parser
//! reads a parameter's text as JSON when it is JSON, so every value comes back with its type),
//! and once every required property is written the call may end with the schema's closing
//! text, `</function>\n</tool_call>`. Only declared properties, each at most once.

use super::{Frame, Outcome, Recognizer};

const PARAM_OPEN: &[u8] = b"<parameter=";
const PARAM_CLOSE: &[u8] = b"\n</parameter>\n";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

impl Recognizer<'_> {
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
                Outcome::Push(Frame::Value {
                    node: props[i].1 as u32,
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
}
