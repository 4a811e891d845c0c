//! BPE pre-tokenizers: split text into the words that BPE merges never cross, as llama.cpp does per
//! `tokenizer.ggml.pre`.
//!
//! It owns the table from pre-tokenizer name to split stages, and the stages themselves. A pre-tokenizer
//! is a list of stages applied in turn: each stage splits every piece the previous stage produced, keeping
//! the text between matches as pieces of its own (llama.cpp's `unicode_regex_split`). It never byte-encodes
//! or looks at the vocabulary; `bpe` does that.
//!
//! Why hand-written splitters: for the GPT-2 and Llama-3 patterns llama.cpp does not run a regex engine, it
//! runs hand-written matchers (`unicode_regex_split_custom_*`), and those matchers are the behaviour to
//! match. They are mirrored here, and are also several times faster than a backtracking regex with
//! look-ahead. Patterns without such a matcher (the `default` pre-tokenizer's extra stages) run on
//! `fancy-regex`, as llama.cpp runs them on `std::regex`.

use super::unicode::{is_letter, is_number, is_whitespace};
use super::TokenizerError;

/// One split stage.
pub(crate) enum Stage {
    /// `\p{N}`: every number character is a piece of its own (SmolLM, StarCoder, ...).
    EachNumber,
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` (GPT-2).
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|
    /// \s*[\r\n]+|\s+(?!\S)|\s+` (Llama 3 with 3 digits, Qwen 2 with 1).
    Llama3 { max_digits: usize },
    /// Any other pattern, matched with fancy-regex.
    Regex(fancy_regex::Regex),
}

/// How one `tokenizer.ggml.pre` value tokenizes, as llama.cpp's vocabulary loader sets it up.
pub(crate) struct PreTokenizer {
    pub stages: Vec<Stage>,
    /// A word that is itself a token is emitted whole, without merging (Llama 3).
    pub ignore_merges: bool,
    /// The add-BOS default before `tokenizer.ggml.add_bos_token` overrides it.
    pub add_bos_default: bool,
    /// Detokenizing removes spaces before `?!.,` and in some contractions (llama.cpp `clean_spaces`).
    pub clean_spaces: bool,
    /// The pre-tokenizer disables the BOS token (GLM-4).
    pub no_bos: bool,
}

/// o200k's split (gpt-oss, Llama 4), as the model's own `tokenizer.json` writes it: words with their case
/// runs and contractions, numbers in threes, punctuation runs with their newlines and slashes. llama.cpp
/// runs a rewrite of it for `std::regex` that takes a non-ASCII lowercase letter for an uppercase one; on
/// ASCII text the two split alike, and this one is what the tokenizer was trained with.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn regex(pattern: &str) -> Result<Stage, TokenizerError> {
    fancy_regex::Regex::new(pattern)
        .map(Stage::Regex)
        .map_err(|e| TokenizerError::BadRegex { pattern: pattern.to_owned(), message: e.to_string() })
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value; an empty name means llama.cpp's `default`.
    pub fn for_name(name: &str) -> Result<PreTokenizer, TokenizerError> {
        let mut p = PreTokenizer {
            stages: vec![Stage::Gpt2],
            ignore_merges: false,
            add_bos_default: false,
            clean_spaces: true,
            no_bos: false,
        };
        match name {
            "" | "default" => {
                p.stages =
                    vec![regex(r"[\p{P}\$\+<=>\^~\|]+")?, Stage::Gpt2, regex(r"\p{N}+")?, regex(r"[0-9][0-9][0-9]")?];
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
            | "jina-v5-nano" => {
                p.stages = vec![Stage::Llama3 { max_digits: 3 }];
                p.ignore_merges = true;
                p.add_bos_default = true;
            }
            "dbrx" | "smaug-bpe" => p.stages = vec![Stage::Llama3 { max_digits: 3 }],
            "glm4" | "chatglm-bpe" => {
                p.stages = vec![Stage::Llama3 { max_digits: 3 }];
                p.no_bos = true;
            }
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" => {
                p.stages = vec![Stage::Llama3 { max_digits: 1 }];
                p.clean_spaces = false;
            }
            "megrez" | "stablelm2" => p.stages = vec![Stage::Llama3 { max_digits: 1 }],
            "smollm" | "command-r" => {
                p.stages = vec![Stage::EachNumber, Stage::Gpt2];
                p.clean_spaces = false;
            }
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                p.stages = vec![Stage::EachNumber, Stage::Gpt2];
            }
            "gpt-4o" | "llama4" | "kanana2" | "talkie" => {
                p.stages = vec![regex(GPT4O)?];
                p.clean_spaces = false;
            }
            "trillion" | "granite-docling" => p.clean_spaces = false,
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0"
            | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "exaone4" | "jina-v1-en" | "jina-v2-code"
            | "roberta-bpe" => {}
            other => return Err(TokenizerError::UnsupportedPreTokenizer { pre: other.to_owned() }),
        }
        Ok(p)
    }

    /// Splits `text` into words, in order; the words concatenate back to `text`.
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let chars: Vec<char> = text.chars().collect();
        // Byte offset of every char, plus the end of the text.
        let mut byte_at: Vec<usize> = text.char_indices().map(|(b, _)| b).collect();
        byte_at.push(text.len());

        // Pieces as half-open ranges of char indices.
        let mut pieces = vec![(0usize, chars.len())];
        for stage in &self.stages {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for &(ini, end) in &pieces {
                let mut out = Splitter { chars: &chars, ini, end, prev: ini, out: &mut next };
                match stage {
                    Stage::EachNumber => out.each_number(),
                    Stage::Gpt2 => out.gpt2(),
                    Stage::Llama3 { max_digits } => out.llama3(*max_digits),
                    Stage::Regex(re) => split_regex(re, text, &byte_at, ini, end, &mut next),
                }
            }
            pieces = next;
        }
        pieces.into_iter().filter(|(a, b)| b > a).map(|(a, b)| &text[byte_at[a]..byte_at[b]]).collect()
    }
}

/// Runs a regex over one piece; matches and the gaps between them become pieces.
fn split_regex(
    re: &fancy_regex::Regex,
    text: &str,
    byte_at: &[usize],
    ini: usize,
    end: usize,
    out: &mut Vec<(usize, usize)>,
) {
    let base = byte_at[ini];
    let hay = &text[base..byte_at[end]];
    // Matches start and end on char boundaries, so their byte offsets are in `byte_at`.
    let to_char = |b: usize| byte_at[ini..=end].partition_point(|&x| x < base + b) + ini;
    let mut last = ini;
    for m in re.find_iter(hay) {
        let Ok(m) = m else { break }; // backtrack limit: keep the rest as one piece
        if m.start() == m.end() {
            continue;
        }
        let (s, e) = (to_char(m.start()), to_char(m.end()));
        if s > last {
            out.push((last, s));
        }
        out.push((s, e));
        last = e;
    }
    if last < end {
        out.push((last, end));
    }
}

/// State of one hand-written split over the chars `ini..end`.
struct Splitter<'a> {
    chars: &'a [char],
    ini: usize,
    end: usize,
    /// End of the last piece emitted.
    prev: usize,
    out: &'a mut Vec<(usize, usize)>,
}

impl Splitter<'_> {
    /// The char at `pos` if it is inside this piece (the matchers never look past its ends).
    #[inline]
    fn at(&self, pos: usize) -> Option<char> {
        (self.ini <= pos && pos < self.end).then(|| self.chars[pos])
    }

    #[inline]
    fn letter(&self, pos: usize) -> bool {
        self.at(pos).is_some_and(is_letter)
    }

    #[inline]
    fn number(&self, pos: usize) -> bool {
        self.at(pos).is_some_and(is_number)
    }

    #[inline]
    fn space(&self, pos: usize) -> bool {
        self.at(pos).is_some_and(is_whitespace)
    }

    /// Inside the piece and not whitespace, letter or number: `[^\s\p{L}\p{N}]`.
    #[inline]
    fn other(&self, pos: usize) -> bool {
        self.at(pos).is_some_and(|c| !(is_whitespace(c) || is_letter(c) || is_number(c)))
    }

    #[inline]
    fn emit(&mut self, to: usize) {
        if to > self.prev {
            self.out.push((self.prev, to));
        }
        self.prev = to;
    }

    fn each_number(&mut self) {
        for pos in self.ini..self.end {
            if self.number(pos) {
                self.emit(pos);
                self.emit(pos + 1);
            }
        }
        self.emit(self.end);
    }

    /// The length of a contraction at `pos` (`'s`, `'re`, ...), matching case-insensitively if asked.
    fn contraction(&self, pos: usize, any_case: bool) -> usize {
        if self.at(pos) != Some('\'') || pos + 1 >= self.end {
            return 0;
        }
        let lower = |c: Option<char>| c.map(|c| if any_case { c.to_ascii_lowercase() } else { c });
        let c1 = lower(self.at(pos + 1));
        if matches!(c1, Some('s' | 't' | 'm' | 'd')) {
            return 2;
        }
        if pos + 2 < self.end {
            let c2 = lower(self.at(pos + 2));
            if matches!((c1, c2), (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))) {
                return 3;
            }
        }
        0
    }

    /// llama.cpp's `unicode_regex_split_custom_gpt2`.
    fn gpt2(&mut self) {
        let mut pos = self.ini;
        while pos < self.end {
            let c = self.chars[pos];
            let n = self.contraction(pos, false);
            if n > 0 {
                pos += n;
                self.emit(pos);
                continue;
            }
            // The class of the char after an optional leading space.
            let lead = usize::from(c == ' ');
            let first = pos + lead;
            if self.letter(first) {
                pos = first;
                while self.letter(pos) {
                    pos += 1;
                }
                self.emit(pos);
                continue;
            }
            if self.number(first) {
                pos = first;
                while self.number(pos) {
                    pos += 1;
                }
                self.emit(pos);
                continue;
            }
            if self.other(first) {
                pos = first;
                while self.other(pos) {
                    pos += 1;
                }
                self.emit(pos);
                continue;
            }
            pos = self.whitespace_run(pos);
        }
        self.emit(self.end);
    }

    /// `\s+(?!\S)|\s+` at `pos`, or a single char when nothing matches; returns the new position.
    fn whitespace_run(&mut self, mut pos: usize) -> usize {
        let mut n = 0;
        while self.space(pos + n) {
            n += 1;
        }
        if n > 1 && self.at(pos + n).is_some() {
            // Leave the last space to lead the next word.
            pos += n - 1;
        } else if n > 0 {
            pos += n;
        } else {
            pos += 1;
        }
        self.emit(pos);
        pos
    }

    /// llama.cpp's `unicode_regex_split_custom_llama3`, with the digit-group length as a parameter.
    fn llama3(&mut self, max_digits: usize) {
        let mut pos = self.ini;
        while pos < self.end {
            let c = self.chars[pos];
            let n = self.contraction(pos, true);
            if n > 0 {
                pos += n;
                self.emit(pos);
                continue;
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(c == '\r' || c == '\n' || is_number(c)) && (is_letter(c) || self.letter(pos + 1)) {
                pos += 1;
                while self.letter(pos) {
                    pos += 1;
                }
                self.emit(pos);
                continue;
            }
            // \p{N}{1,max_digits}
            if is_number(c) {
                let mut group = pos;
                while self.number(pos) {
                    pos += 1;
                    if pos - group >= max_digits {
                        self.emit(pos);
                        group = pos;
                    }
                }
                self.emit(pos);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+[\r\n]*
            let first = pos + usize::from(c == ' ');
            if self.other(first) {
                pos = first;
                while self.other(pos) {
                    pos += 1;
                }
                while matches!(self.at(pos), Some('\r' | '\n')) {
                    pos += 1;
                }
                self.emit(pos);
                continue;
            }
            // \s*[\r\n]+ : through the last line break of the whitespace run.
            let mut n = 0;
            let mut last_break = None;
            while self.space(pos + n) {
                if matches!(self.at(pos + n), Some('\r' | '\n')) {
                    last_break = Some(pos + n + 1);
                }
                n += 1;
            }
            if let Some(to) = last_break {
                pos = to;
                self.emit(pos);
                continue;
            }
            pos = self.whitespace_run(pos);
        }
        self.emit(self.end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::for_name(pre).expect("known pre-tokenizer");
        let words: Vec<String> = p.split(text).into_iter().map(str::to_owned).collect();
        assert_eq!(words.concat(), text, "pieces must cover the text");
        words
    }

    #[test]
    fn gpt2_words_spaces_and_contractions() {
        assert_eq!(split("gpt-2", "Hello world"), ["Hello", " world"]);
        assert_eq!(split("gpt-2", "   leading  x "), ["  ", " leading", " ", " x", " "]);
        assert_eq!(split("gpt-2", "I'm don't IT'S"), ["I", "'m", " don", "'t", " IT", "'", "S"]);
        assert_eq!(split("gpt-2", "a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(split("gpt-2", "x 12345 ?!"), ["x", " 12345", " ?!"]);
    }

    #[test]
    fn smollm_splits_each_digit() {
        assert_eq!(split("smollm", "12345 6.7"), ["1", "2", "3", "4", "5", " ", "6", ".", "7"]);
        assert_eq!(split("smollm", "year 2024 had"), ["year", " ", "2", "0", "2", "4", " had"]);
    }

    #[test]
    fn llama3_groups_digits_and_newlines() {
        assert_eq!(split("llama-bpe", "1234567 x"), ["123", "456", "7", " x"]);
        assert_eq!(split("llama-bpe", "I'M here\n\n  ok"), ["I", "'M", " here", "\n\n", " ", " ok"]);
        assert_eq!(split("llama-bpe", "a.\n\nb"), ["a", ".\n\n", "b"]);
        assert_eq!(split("qwen2", "123 x"), ["1", "2", "3", " x"]);
    }

    /// Expected pieces from Python's `regex` module running the same pattern.
    #[test]
    fn gpt4o_keeps_case_runs_contractions_and_digit_triples() {
        assert_eq!(split("gpt-4o", "Hello World's HTTPServer"), ["Hello", " World's", " HTTPServer"]);
        assert_eq!(split("gpt-4o", "I'M don't 1234567 x"), ["I'M", " don't", " ", "123", "456", "7", " x"]);
        assert_eq!(split("gpt-4o", "a.\n\n  b"), ["a", ".\n\n", " ", " b"]);
        assert_eq!(split("gpt-4o", "path/to/\nfile  end "), ["path", "/to", "/\n", "file", " ", " end", " "]);
        assert_eq!(split("gpt-4o", "Café naïve ÉCOLE 東京"), ["Café", " naïve", " ÉCOLE", " 東京"]);
    }

    #[test]
    fn default_uses_regex_stages() {
        assert_eq!(split("default", "a+b 1234"), ["a", "+", "b", " ", "123", "4"]);
    }

    #[test]
    fn unknown_pre_tokenizer_is_named() {
        let err = PreTokenizer::for_name("no-such-pre").err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("no-such-pre")));
    }
}
