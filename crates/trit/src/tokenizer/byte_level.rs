//! GPT-2's byte-level alphabet: every byte 0..=255 is written as one printable Unicode character
//! so that BPE vocabularies can be stored as text. Printable Latin-1 bytes stand for themselves;
//! the other 68 bytes (controls, space, DEL, NBSP, soft hyphen) are shifted to U+0100 onwards
//! in byte order. Byte-level vocabularies (Qwen, Llama-3, SmolLM2) store tokens in this form,
//! e.g. `Ġthe` for " the".

use std::sync::OnceLock;

/// Whether byte `b` is represented by the character with the same code point.
fn stands_for_itself(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// `char_to_byte[c]` for the 324 code points below U+0144 that the alphabet uses.
fn table() -> &'static [Option<u8>; 0x144] {
    static TABLE: OnceLock<[Option<u8>; 0x144]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [None; 0x144];
        let mut shifted = 0x100usize;
        for b in 0..=255u8 {
            if stands_for_itself(b) {
                t[b as usize] = Some(b);
            } else {
                t[shifted] = Some(b);
                shifted += 1;
            }
        }
        t
    })
}

/// The byte a byte-level character stands for, or `None` if `c` is outside the alphabet.
pub fn char_to_byte(c: char) -> Option<u8> {
    table().get(c as usize).copied().flatten()
}

/// The raw bytes of a vocabulary piece. Pieces made only of alphabet characters are mapped
/// back to bytes; any other piece (an added token such as `<|im_start|>` written with
/// characters outside the alphabet) stands for its own UTF-8 text. This is the rule of the
/// `ByteLevel` decoder of Hugging Face `tokenizers`, so concatenating these bytes and decoding
/// them lossily reproduces `decode` exactly.
pub fn piece_to_bytes(piece: &str) -> Vec<u8> {
    let mapped: Option<Vec<u8>> = piece.chars().map(char_to_byte).collect();
    mapped.unwrap_or_else(|| piece.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection_onto_256_chars() {
        let mut seen = [false; 256];
        let mut count = 0;
        for c in 0..0x144u32 {
            if let Some(b) = char_to_byte(char::from_u32(c).unwrap()) {
                assert!(!seen[b as usize], "byte {b} mapped twice");
                seen[b as usize] = true;
                count += 1;
            }
        }
        assert_eq!(count, 256);
    }

    #[test]
    fn well_known_characters() {
        assert_eq!(char_to_byte('Ġ'), Some(b' '));
        assert_eq!(char_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(char_to_byte('ĉ'), Some(b'\t'));
        assert_eq!(char_to_byte('A'), Some(b'A'));
        assert_eq!(char_to_byte('ġ'), Some(0x7F));
        assert_eq!(char_to_byte('ł'), Some(0xA0));
        assert_eq!(char_to_byte('Ń'), Some(0xAD));
        assert_eq!(char_to_byte('中'), None);
        assert_eq!(piece_to_bytes("Ġworld"), b" world");
        // "ä½ł" is the byte-level spelling of the first two bytes of '你' (E4 BD A0).
        assert_eq!(piece_to_bytes("ä½ł"), vec![0xE4, 0xBD, 0xA0]);
        assert_eq!(piece_to_bytes("<think>"), b"<think>");
        assert_eq!(piece_to_bytes("中文"), "中文".as_bytes());
    }
}
