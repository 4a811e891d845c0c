//! SentencePiece BPE (`tokenizer.ggml.model = llama`): score-driven merges over one text fragment.
//!
//! It owns llama.cpp's `llm_tokenizer_spm_session`: the fragment (already space-escaped to U+2581) starts as
//! one symbol per character; the adjacent pair whose concatenation is the highest-scoring vocabulary token
//! (ties: leftmost) merges, until no pair is a token. Characters with no token fall back to `<0xXX>` byte
//! tokens. It never
//! adds the space prefix or handles special tokens; the caller does.

use std::collections::BinaryHeap;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge; the heap pops the highest score, then the leftmost pair.
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

/// What the SPM merge loop needs from the vocabulary.
pub(crate) trait SpmVocab {
    /// The id of the token whose text is exactly `text`.
    fn token_id(&self, text: &str) -> Option<u32>;
    /// The score of a token.
    fn score(&self, id: u32) -> f32;
    /// The token for one byte: `<0xXX>`, else the one-byte text, else the unknown token.
    fn byte_token(&self, byte: u8) -> Option<u32>;
}

/// Tokenizes one fragment whose spaces are already escaped.
pub(crate) fn encode_fragment(text: &str, vocab: &impl SpmVocab, out: &mut Vec<u32>) {
    if text.is_empty() {
        return;
    }
    let mut symbols: Vec<Symbol> =
        text.char_indices().map(|(start, c)| Symbol { start, len: c.len_utf8(), prev: None, next: None }).collect();
    let n = symbols.len();
    for (i, s) in symbols.iter_mut().enumerate() {
        s.prev = i.checked_sub(1);
        s.next = (i + 1 < n).then_some(i + 1);
    }

    let mut heap = BinaryHeap::new();
    let push = |heap: &mut BinaryHeap<Candidate>, symbols: &[Symbol], left: usize, right: usize| {
        let (l, r) = (&symbols[left], &symbols[right]);
        let joined = &text[l.start..l.start + l.len + r.len];
        if let Some(id) = vocab.token_id(joined) {
            heap.push(Candidate { score: vocab.score(id), left, right, len: joined.len() });
        }
    };
    for i in 1..n {
        push(&mut heap, &symbols, i - 1, i);
    }

    while let Some(Candidate { left, right, len, .. }) = heap.pop() {
        let (l, r) = (symbols[left], symbols[right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != len {
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

    // A pair only merges when the merged text is a token, so every final symbol longer than one character
    // is a token. llama.cpp's re-split along recorded merges therefore never fires; what remains is:
    // a token, or a character without one, spelled as byte tokens.
    let mut i = Some(0);
    while let Some(k) = i {
        let s = &symbols[k];
        let piece = &text[s.start..s.start + s.len];
        match vocab.token_id(piece) {
            Some(id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| vocab.byte_token(b))),
        }
        i = s.next;
    }
}
