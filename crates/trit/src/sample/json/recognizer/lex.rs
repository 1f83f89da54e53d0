//! The JSON string lexer the recognizer's frames share: where a string's content is (plain,
//! an escape, `\u` hex digits, a UTF-8 character's continuation bytes) and what the next
//! byte is.

/// Where the string lexer is inside a string's content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Lex {
    Normal,
    Escape,
    /// Hex digits of a `\u` escape still to come.
    Hex(u8),
    /// Continuation bytes of a UTF-8 character still to come, and the next one's range.
    Utf8 {
        need: u8,
        lo: u8,
        hi: u8,
    },
}

/// What a string's next byte is.
pub(super) enum LexStep {
    /// Content; `true` when it begins a new character.
    Content(bool),
    Close,
    Reject,
}

pub(super) fn lex(l: &mut Lex, b: u8) -> LexStep {
    match *l {
        Lex::Normal => match b {
            b'"' => LexStep::Close,
            b'\\' => {
                *l = Lex::Escape;
                LexStep::Content(true)
            }
            0..=0x1f => LexStep::Reject,
            0x20..=0x7f => LexStep::Content(true),
            0xc2..=0xdf => {
                *l = Lex::Utf8 {
                    need: 1,
                    lo: 0x80,
                    hi: 0xbf,
                };
                LexStep::Content(true)
            }
            0xe0..=0xef => {
                let (lo, hi) = match b {
                    0xe0 => (0xa0, 0xbf),
                    0xed => (0x80, 0x9f),
                    _ => (0x80, 0xbf),
                };
                *l = Lex::Utf8 { need: 2, lo, hi };
                LexStep::Content(true)
            }
            0xf0..=0xf4 => {
                let (lo, hi) = match b {
                    0xf0 => (0x90, 0xbf),
                    0xf4 => (0x80, 0x8f),
                    _ => (0x80, 0xbf),
                };
                *l = Lex::Utf8 { need: 3, lo, hi };
                LexStep::Content(true)
            }
            _ => LexStep::Reject,
        },
        Lex::Escape => match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                *l = Lex::Normal;
                LexStep::Content(false)
            }
            b'u' => {
                *l = Lex::Hex(4);
                LexStep::Content(false)
            }
            _ => LexStep::Reject,
        },
        Lex::Hex(n) => {
            if !b.is_ascii_hexdigit() {
                return LexStep::Reject;
            }
            *l = if n == 1 { Lex::Normal } else { Lex::Hex(n - 1) };
            LexStep::Content(false)
        }
        Lex::Utf8 { need, lo, hi } => {
            if b < lo || b > hi {
                return LexStep::Reject;
            }
            *l = if need == 1 {
                Lex::Normal
            } else {
                Lex::Utf8 {
                    need: need - 1,
                    lo: 0x80,
                    hi: 0xbf,
                }
            };
            LexStep::Content(false)
        }
    }
}
