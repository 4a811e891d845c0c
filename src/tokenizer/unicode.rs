//! Unicode facts the pre-tokenizers need, and GPT-2's byte-to-unicode mapping.
//!
//! It owns three codepoint classes with llama.cpp's meaning: letter (general category L), number (N) and
//! whitespace (the White_Space property), and the reversible map between the 256 byte values and the
//! printable characters byte-level BPE vocabularies are written in. It never allocates per call.
//!
//! The L ranges come from `regex-syntax`'s Unicode tables (the same tables `fancy-regex` matches `\p{L}`
//! with), so hand-written splitters and regex stages agree on what a letter is. `char::is_alphabetic` is not
//! used: it also covers marks (Mn/Mc) and letter numbers, which would change where words split.

use std::sync::OnceLock;

/// Inclusive codepoint ranges of one class, sorted and disjoint.
struct Ranges(Vec<(u32, u32)>);

impl Ranges {
    /// The ranges of a `\p{..}` class, read from regex-syntax's Unicode tables.
    fn of_class(class: &str) -> Ranges {
        use regex_syntax::hir::{Class, HirKind};
        let mut out = Vec::new();
        // The pattern is a constant of this module; if it ever failed to parse the class would be empty,
        // which the unit tests below would catch.
        if let Ok(hir) = regex_syntax::Parser::new().parse(class) {
            if let HirKind::Class(Class::Unicode(cls)) = hir.kind() {
                out.extend(cls.ranges().iter().map(|r| (r.start() as u32, r.end() as u32)));
            }
        }
        Ranges(out)
    }

    fn contains(&self, c: char) -> bool {
        let c = c as u32;
        self.0
            .binary_search_by(|&(lo, hi)| {
                if hi < c {
                    std::cmp::Ordering::Less
                } else if lo > c {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
    }
}

fn letters() -> &'static Ranges {
    static LETTERS: OnceLock<Ranges> = OnceLock::new();
    LETTERS.get_or_init(|| Ranges::of_class(r"\p{L}"))
}

/// General category L (Lu, Ll, Lt, Lm, Lo): what `\p{L}` matches.
#[inline]
pub fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    letters().contains(c)
}

/// General category N (Nd, Nl, No): what `\p{N}` matches. `char::is_numeric` is defined as exactly that.
#[inline]
pub fn is_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    c.is_numeric()
}

/// The White_Space property: what `\s` matches, and llama.cpp's `is_whitespace` flag.
#[inline]
pub fn is_whitespace(c: char) -> bool {
    c.is_whitespace()
}

/// GPT-2's byte-to-unicode table: the printable Latin-1 bytes map to themselves, the other 68 bytes to
/// U+0100.. in byte order. Every byte gets a distinct printable character, so any byte string has a
/// textual form the BPE vocabulary can spell.
pub struct ByteMap {
    to_char: [char; 256],
    /// Indexed by codepoint below 0x144: the byte it stands for, or -1.
    from_cp: [i16; 0x144],
}

impl ByteMap {
    pub fn get() -> &'static ByteMap {
        static MAP: OnceLock<ByteMap> = OnceLock::new();
        MAP.get_or_init(|| {
            let printable =
                |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
            let mut to_char = ['\0'; 256];
            let mut from_cp = [-1i16; 0x144];
            let mut next = 256u32;
            for b in 0..256u32 {
                let cp = if printable(b) {
                    b
                } else {
                    next += 1;
                    next - 1
                };
                // All values are below 0x144, so they are valid scalar values.
                to_char[b as usize] = char::from_u32(cp).unwrap_or('\u{FFFD}');
                from_cp[cp as usize] = b as i16;
            }
            ByteMap { to_char, from_cp }
        })
    }

    /// The character that stands for `byte` in vocabulary text.
    #[inline]
    pub fn byte_to_char(&self, byte: u8) -> char {
        self.to_char[byte as usize]
    }

    /// The byte a vocabulary character stands for, or `None` if the character is not in the table.
    #[inline]
    pub fn char_to_byte(&self, c: char) -> Option<u8> {
        let b = *self.from_cp.get(c as usize)?;
        u8::try_from(b).ok()
    }

    /// Appends the byte-level spelling of `text` (each UTF-8 byte as its table character) to `out`.
    pub fn encode_into(&self, text: &str, out: &mut String) {
        for &b in text.as_bytes() {
            out.push(self.byte_to_char(b));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_match_regex_meaning() {
        assert!(is_letter('a') && is_letter('é') && is_letter('你') && is_letter('한'));
        assert!(!is_letter('1') && !is_letter(' ') && !is_letter('🍕') && !is_letter('\u{0301}'));
        assert!(is_number('7') && is_number('٣') && is_number('½') && is_number('Ⅻ'));
        assert!(!is_number('a'));
        assert!(is_whitespace(' ') && is_whitespace('\u{3000}') && is_whitespace('\u{85}'));
        assert!(!is_whitespace('\u{200B}'));
    }

    #[test]
    fn byte_map_round_trips_all_bytes() {
        let m = ByteMap::get();
        assert_eq!(m.byte_to_char(b' '), 'Ġ');
        assert_eq!(m.byte_to_char(b'\n'), 'Ċ');
        assert_eq!(m.byte_to_char(b'a'), 'a');
        for b in 0..=255u8 {
            assert_eq!(m.char_to_byte(m.byte_to_char(b)), Some(b), "byte {b}");
        }
        assert_eq!(m.char_to_byte('€'), None);
    }
}
