//! Tokens back to text: one token's bytes, a whole sequence, and a stream that never splits a character.
//!
//! It owns llama.cpp's `token_to_piece` (with special tokens rendered) and `detokenize` (first-token space
//! strip for SPM, `clean_spaces` tidying for some BPE models), plus [`StreamDecoder`], which holds back the
//! bytes of a character that is not complete yet. It never fails: bytes that are not UTF-8 become U+FFFD.
//!
//! Known difference: a BPE token character outside GPT-2's byte table (only in malformed vocabularies) is
//! kept as its own UTF-8 here; llama.cpp writes an `[UNK_BYTE_0x..]` marker instead.

use super::special::attr;
use super::unicode::ByteMap;
use super::{Algorithm, Tokenizer};

impl Tokenizer {
    /// The bytes token `id` stands for: byte-level decoded for BPE, U+2581 as space and `<0xXX>` as that
    /// byte for SentencePiece, control and user-defined tokens as their text. Unknown ids and unused
    /// tokens give no bytes. A piece may be part of a UTF-8 character; see [`StreamDecoder`].
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        let mut out = Vec::new();
        self.append_piece(id, &mut out);
        out
    }

    fn append_piece(&self, id: u32, out: &mut Vec<u8>) {
        let Some(text) = self.texts.get(id as usize) else {
            return;
        };
        let a = self.attr(id);
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            match self.algorithm {
                Algorithm::Bpe { .. } => {
                    let map = ByteMap::get();
                    for c in text.chars() {
                        match map.char_to_byte(c) {
                            Some(b) => out.push(b),
                            None => out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
                        }
                    }
                }
                Algorithm::Spm => {
                    for c in text.chars() {
                        let c = if c == '\u{2581}' { ' ' } else { c };
                        out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes());
                    }
                }
            }
        } else if a & attr::BYTE != 0 {
            // `<0xXX>`
            if let Some(b) = text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
            }
        }
    }

    /// The text of a token sequence, as llama.cpp's detokenizer gives it with special tokens rendered:
    /// SentencePiece's added leading space is removed from the first token, and models with
    /// `clean_spaces` get spaces before `?!.,` and some contractions removed. Invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let start = bytes.len();
            self.append_piece(id, &mut bytes);
            if i == 0 && self.add_space_prefix && bytes.get(start) == Some(&b' ') {
                bytes.remove(start);
            }
        }
        if self.clean_spaces {
            clean_spaces(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// llama.cpp's three `clean_spaces` passes, kept byte for byte (they work in place on the buffer).
fn clean_spaces(t: &mut Vec<u8>) {
    // Pass 1: " ?", " !", " .", " ," lose the space.
    let n = t.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        t[total] = x;
        total += 1;
    }
    // Pass 2: a single apostrophe between spaces loses both spaces.
    let n = total;
    total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = t[i];
        if x == b'\'' && i + 1 < n && t[i - 1] == b' ' && t[i + 1] == b' ' {
            total -= 1;
            i += 1;
            t[i] = 0;
        }
        t[total] = x;
        total += 1;
        i += 1;
    }
    // Pass 3: " 's", " 'm", " 're", " 've" lose the space.
    let n = total;
    total = usize::from(n > 0);
    for i in 1..n {
        let x = t[i];
        if t[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = t[i + 1];
            if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if x1 != b't' && x1 != b'd' && i + 2 < n {
                let x2 = t[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        t[total] = x;
        total += 1;
    }
    t.truncate(total);
}

/// Turns generated tokens into text as they arrive, never splitting a UTF-8 character: bytes of a character
/// that is not complete yet are held until a later token completes it.
///
/// Tokens are rendered as [`Tokenizer::token_to_piece`] renders them, control tokens included; a caller
/// that must not show end-of-generation tokens stops before pushing them. It holds no reference to the
/// tokenizer, so it can live next to one in a request's state.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        tokenizer.append_piece(id, &mut self.pending);
        self.take_complete()
    }

    /// Adds raw bytes; returns the text that is now complete (possibly empty).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        self.take_complete()
    }

    /// Whether bytes of an unfinished character are being held.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream: whatever is held comes out, an unfinished character as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Everything in `pending` up to a trailing incomplete character; invalid bytes become U+FFFD.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, after) = rest.split_at(e.valid_up_to());
                    // `good` is valid UTF-8 by the error's own account.
                    out.push_str(&String::from_utf8_lossy(good));
                    match e.error_len() {
                        // Incomplete character at the end: hold it.
                        None => {
                            rest = after;
                            break;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            rest = &after[bad..];
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }
}
