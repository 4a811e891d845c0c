//! Token attributes, and the split of text around special tokens before BPE/SPM sees it.
//!
//! It owns llama.cpp's `tokenizer_st_partition`: for each special token, longest text first, every raw-text
//! fragment is cut at each occurrence of that token's text, and the occurrence becomes the token itself.
//! With `parse_special` false, CONTROL and UNKNOWN tokens are left as text, but USER_DEFINED tokens are
//! still cut out (as HF `tokenizers` does for added tokens). It never tokenizes the text between them.

/// Token attribute bits, as llama.cpp derives them from `tokenizer.ggml.token_type`.
pub(crate) mod attr {
    pub const UNDEFINED: u8 = 0;
    pub const UNKNOWN: u8 = 1 << 0;
    pub const UNUSED: u8 = 1 << 1;
    pub const NORMAL: u8 = 1 << 2;
    pub const CONTROL: u8 = 1 << 3;
    pub const USER_DEFINED: u8 = 1 << 4;
    pub const BYTE: u8 = 1 << 5;

    /// The attribute of a GGUF token type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
    /// 6 byte); anything else is undefined.
    pub fn from_token_type(ty: i64) -> u8 {
        match ty {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => UNDEFINED,
        }
    }
}

/// A piece of the input: raw text still to tokenize, or a special token already recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// Splits `text` around the special tokens in `order` (ids, longest text first).
pub(crate) fn partition<'t>(
    text: &'t str,
    order: &[u32],
    texts: &[String],
    attrs: &[u8],
    parse_special: bool,
) -> Vec<Fragment<'t>> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Fragment::Text(text));
    for &id in order {
        let (Some(tok), Some(&a)) = (texts.get(id as usize), attrs.get(id as usize)) else {
            continue;
        };
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        if tok.is_empty() || !frags.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(tok.as_str()))) {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            let Fragment::Text(mut rest) = f else {
                next.push(f);
                continue;
            };
            while let Some(at) = rest.find(tok.as_str()) {
                if at > 0 {
                    next.push(Fragment::Text(&rest[..at]));
                }
                next.push(Fragment::Token(id));
                rest = &rest[at + tok.len()..];
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        frags = next;
    }
    frags
}

#[cfg(test)]
mod tests {
    use super::*;
    use Fragment::{Text, Token};

    fn setup() -> (Vec<String>, Vec<u8>, Vec<u32>) {
        let texts: Vec<String> =
            ["<s>", "<|im_start|>", "<|im", "<tool>", "hi"].iter().map(|s| s.to_string()).collect();
        let attrs = vec![attr::CONTROL, attr::CONTROL, attr::CONTROL, attr::USER_DEFINED, attr::NORMAL];
        // Longest first, as the tokenizer orders them.
        (texts, attrs, vec![1, 3, 2, 0])
    }

    #[test]
    fn longest_special_wins_and_text_between_is_kept() {
        let (texts, attrs, order) = setup();
        let f = partition("a<|im_start|>b<|im<s>", &order, &texts, &attrs, true);
        assert_eq!(f, [Text("a"), Token(1), Text("b"), Token(2), Token(0)]);
    }

    #[test]
    fn without_parse_special_only_user_defined_tokens_split() {
        let (texts, attrs, order) = setup();
        let f = partition("<s>x<tool>y", &order, &texts, &attrs, false);
        assert_eq!(f, [Text("<s>x"), Token(3), Text("y")]);
    }

    #[test]
    fn empty_text_has_no_fragments() {
        let (texts, attrs, order) = setup();
        assert!(partition("", &order, &texts, &attrs, true).is_empty());
    }
}
