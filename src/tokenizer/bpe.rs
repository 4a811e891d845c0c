//! Byte-level BPE (`tokenizer.ggml.model = gpt2`): merge ranks and the merge loop over one word.
//!
//! It owns the merge table and turns one pre-tokenized, byte-encoded word into token ids exactly as
//! llama.cpp's `llm_tokenizer_bpe_session` does: start from one symbol per character, repeatedly merge the
//! adjacent pair with the lowest merge rank (ties: leftmost), then look every final symbol up in the
//! vocabulary, falling back to single-byte tokens for symbols that are not tokens. It never splits text
//! into words (`pretokenize`) and never handles special tokens (`special`).
//!
//! Why a hand-written loop rather than the HF `tokenizers` crate: llama.cpp-exact results need llama.cpp's
//! word splitting, special-token partitioning and fallback rules, which `tokenizers` does differently or
//! not at all; the merge loop itself is fifty lines, and a heavy dependency for it is not worth it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Merge ranks: the pair `(left, right)` of symbol texts that merge, by their order in
/// `tokenizer.ggml.merges` (earlier merges first).
pub(crate) struct Merges {
    /// Every string that appears as a merge part, interned to a small id.
    part_ids: HashMap<String, u32>,
    /// `(left part id, right part id)` to rank.
    ranks: HashMap<(u32, u32), u32>,
}

impl Merges {
    /// Builds the table from merge lines `"left right"`. As in llama.cpp the split is at the first space
    /// after the first byte, and a later duplicate of a pair does not replace the earlier rank.
    pub fn new<'a>(lines: impl IntoIterator<Item = &'a str>) -> Merges {
        let mut part_ids: HashMap<String, u32> = HashMap::new();
        let mut ranks = HashMap::new();
        let mut intern = |s: &str| -> u32 {
            if let Some(&id) = part_ids.get(s) {
                return id;
            }
            let id = part_ids.len() as u32;
            part_ids.insert(s.to_owned(), id);
            id
        };
        for (rank, line) in lines.into_iter().enumerate() {
            // Byte search: the first char may be multi-byte, and a space byte is always a char boundary.
            let space = line.bytes().skip(1).position(|b| b == b' ').map(|i| i + 1);
            let (left, right) = match space {
                Some(at) => (&line[..at], &line[at + 1..]),
                None => ("", ""),
            };
            let key = (intern(left), intern(right));
            ranks.entry(key).or_insert(rank as u32);
        }
        Merges { part_ids, ranks }
    }

    /// The rank of merging `left` with `right`, if they merge.
    #[inline]
    fn rank(&self, left: &str, right: &str) -> Option<u32> {
        let l = *self.part_ids.get(left)?;
        let r = *self.part_ids.get(right)?;
        self.ranks.get(&(l, r)).copied()
    }
}

/// A symbol of the word being merged: a byte range of the word, linked to its live neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of symbols `left` and its right neighbour, whose texts totalled `len` bytes when it was
/// queued. Ordered so that the heap pops the lowest rank, then the leftmost pair.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    key: Reverse<(u32, usize)>, // (rank, left)
    right: usize,
    len: usize,
}

/// Tokenizes one byte-encoded word.
///
/// `lookup` maps a text to its token id; `ignore_merges` emits a word that is itself a token whole.
pub(crate) fn encode_word(
    word: &str,
    merges: &Merges,
    lookup: impl Fn(&str) -> Option<u32>,
    ignore_merges: bool,
    out: &mut Vec<u32>,
) {
    if word.is_empty() {
        return;
    }
    if ignore_merges {
        if let Some(id) = lookup(word) {
            out.push(id);
            return;
        }
    }

    let mut symbols: Vec<Symbol> =
        word.char_indices().map(|(start, c)| Symbol { start, len: c.len_utf8(), prev: None, next: None }).collect();
    let n = symbols.len();
    for (i, s) in symbols.iter_mut().enumerate() {
        s.prev = i.checked_sub(1);
        s.next = (i + 1 < n).then_some(i + 1);
    }

    let text = |s: &Symbol| &word[s.start..s.start + s.len];
    let mut heap = BinaryHeap::new();
    let push = |heap: &mut BinaryHeap<Candidate>, symbols: &[Symbol], left: usize, right: usize| {
        let (l, r) = (&symbols[left], &symbols[right]);
        if let Some(rank) = merges.rank(text(l), text(r)) {
            heap.push(Candidate { key: Reverse((rank, left)), right, len: l.len + r.len });
        }
    };
    for i in 1..n {
        push(&mut heap, &symbols, i - 1, i);
    }

    while let Some(Candidate { key: Reverse((_, left)), right, len }) = heap.pop() {
        let (l, r) = (symbols[left], symbols[right]);
        // Stale: one side was merged away or grew since this pair was queued. A symbol only grows by
        // absorbing its right neighbour, so equal total length means both sides are unchanged.
        if l.len == 0 || r.len == 0 || l.next != Some(right) || l.len + r.len != len {
            continue;
        }
        symbols[left].len += r.len;
        symbols[left].next = r.next;
        symbols[right].len = 0;
        if let Some(nx) = r.next {
            symbols[nx].prev = Some(left);
        }
        if let Some(pv) = symbols[left].prev {
            push(&mut heap, &symbols, pv, left);
        }
        if let Some(nx) = symbols[left].next {
            push(&mut heap, &symbols, left, nx);
        }
    }

    let mut i = Some(0);
    while let Some(k) = i {
        let s = &symbols[k];
        let piece = text(s);
        match lookup(piece) {
            Some(id) => out.push(id),
            None => {
                // llama.cpp looks each byte of the symbol up as a one-byte string; only ASCII bytes can
                // be such tokens, the rest are dropped.
                for b in piece.bytes().filter(u8::is_ascii) {
                    let mut buf = [0u8; 4];
                    if let Some(id) = lookup(char::from(b).encode_utf8(&mut buf)) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[&str]) -> HashMap<String, u32> {
        tokens.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect()
    }

    fn run(word: &str, tokens: &[&str], merges: &[&str]) -> Vec<u32> {
        let v = vocab(tokens);
        let m = Merges::new(merges.iter().copied());
        let mut out = Vec::new();
        encode_word(word, &m, |t| v.get(t).copied(), false, &mut out);
        out
    }

    #[test]
    fn merges_apply_by_rank_not_position() {
        let tokens = ["a", "b", "c", "ab", "bc", "abc"];
        // "b c" outranks "a b", so "abc" becomes a + bc, then a + bc is not a merge.
        assert_eq!(run("abc", &tokens, &["b c", "a b"]), [0, 4]);
        // With "a b" first: ab + c, then "ab c" merges to abc.
        assert_eq!(run("abc", &tokens, &["a b", "b c", "ab c"]), [5]);
    }

    #[test]
    fn equal_rank_pairs_merge_leftmost_first() {
        let tokens = ["a", "aa", "aaa"];
        assert_eq!(run("aaa", &tokens, &["a a"]), [1, 0]);
    }

    #[test]
    fn merge_parts_split_at_first_space_after_first_byte() {
        let m = Merges::new(["Ġ t", "a b c"]);
        assert_eq!(m.rank("Ġ", "t"), Some(0));
        assert_eq!(m.rank("a", "b c"), Some(1));
    }

    #[test]
    fn symbols_without_token_fall_back_to_ascii_bytes() {
        // "xy" merges but is not a token: emitted as x, y.
        assert_eq!(run("xy", &["x", "y"], &["x y"]), [0, 1]);
    }
}
