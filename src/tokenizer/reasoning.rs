//! A reply's reasoning kept apart from its answer: the text of a `<think>...</think>` block that opens the
//! reply (Qwen3, DeepSeek-R1, QwQ) is the reasoning, what follows the block is the content. This is what
//! llama.cpp's server does with `--reasoning-format deepseek` (its default), rule for rule:
//!
//! - the block counts only where it opens the reply, `<think>` as its very first characters, or where the
//!   prompt already opened it (the generation prompt ends with `<think>`: [`prompt_opens_think`]), and then
//!   the reply starts inside it;
//! - the reasoning is trimmed of whitespace at both ends, the content of whitespace at its start;
//! - a block that never closes is all reasoning, and the content is empty.
//!
//! gpt-oss writes its reply as harmony messages instead ([`ReplyFormat::Harmony`]; its generation prompt
//! ends with `<|start|>assistant`): `<|channel|>analysis<|message|>...<|end|>` is reasoning, then
//! `<|start|>assistant<|channel|>final<|message|>...` is the content (llama.cpp's gpt-oss parser does the
//! same). A message's header is everything up to `<|message|>`; the `analysis` channel is reasoning, any
//! other channel (`final`, `commentary`) content; a reply that does not start with a header is all content.
//! A message to a function (`to=functions.NAME` in its header) is a call: its body (the arguments) goes on
//! in the content as the Hermes text of that call, `<tool_call>\n{"name": "NAME", "arguments": BODY}\n
//! </tool_call>`, which `tools` reads as a call.
//!
//! [`ReasoningSplitter`] does it on a stream of text pieces, however the tags fall across them: a piece
//! that may be the start of a tag, or whitespace that may end the reasoning, is held back until the next
//! piece (or the end) tells. [`split_reply`] does it on a whole reply. It owns only this rule; it never
//! tokenizes, and never sees the model.

/// The tag that opens a reasoning block.
pub const THINK_OPEN: &str = "<think>";
/// The tag that closes it.
pub const THINK_CLOSE: &str = "</think>";

/// How a reply may carry its reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyFormat {
    /// A `<think>` block may open the reply; `starts_inside`: the prompt opened it ([`prompt_opens_think`]).
    Think { starts_inside: bool },
    /// gpt-oss's harmony messages ([`prompt_is_harmony`]).
    Harmony,
}

impl From<bool> for ReplyFormat {
    /// `starts_inside` of a `<think>` reply.
    fn from(starts_inside: bool) -> ReplyFormat {
        ReplyFormat::Think { starts_inside }
    }
}

/// The harmony tags the splitter reads.
const H_CHANNEL: &str = "<|channel|>";
const H_MESSAGE: &str = "<|message|>";
const H_START: &str = "<|start|>";
const H_END: &str = "<|end|>";
/// Tags that end a message's body: the next message's start, or the ends the model may write.
const H_BODY_ENDS: [&str; 4] = [H_END, H_START, "<|return|>", "<|call|>"];
/// A header longer than this without `<|message|>` is not one: the text is content.
const H_MAX_HEADER_BYTES: usize = 256;

/// Where a harmony reply is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HPlace {
    /// Reading a message's header (up to `<|message|>`).
    Header,
    /// In a message's body: reasoning (the analysis channel) or content; `call`: a call's arguments.
    Body { reasoning: bool, call: bool },
    /// Not harmony after all: everything is content.
    Plain,
}

/// A reply's text (or a piece of it) divided into reasoning and content.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl Split {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }
}

/// Where the splitter is in the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Nothing decided yet: the text so far may be the start of `<think>`.
    Start,
    /// Inside the block; `leading`: no reasoning written yet (whitespace is dropped).
    Reasoning { leading: bool },
    /// Just past `</think>`: whitespace is dropped until the content starts.
    AfterClose,
    /// The content, written as it comes.
    Content,
}

/// Splits a streamed reply into reasoning and content pieces (see the module).
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    place: Place,
    /// Text received and not yet given out.
    held: String,
    /// Some for a harmony reply, which `place` does not describe.
    harmony: Option<HPlace>,
    /// A harmony reply's analysis messages so far, and whether a content body has begun.
    analysis_closed: usize,
    content_begun: bool,
}

impl ReasoningSplitter {
    /// A splitter for a reply in `format` (a bool: a `<think>` reply, whether the prompt opened the block).
    pub fn new(format: impl Into<ReplyFormat>) -> ReasoningSplitter {
        let (place, harmony) = match format.into() {
            ReplyFormat::Think { starts_inside: true } => (Place::Reasoning { leading: true }, None),
            ReplyFormat::Think { starts_inside: false } => (Place::Start, None),
            ReplyFormat::Harmony => (Place::Content, Some(HPlace::Header)),
        };
        ReasoningSplitter { place, held: String::new(), harmony, analysis_closed: 0, content_begun: false }
    }

    /// Takes the next piece of the reply; returns what can be given out now.
    pub fn push(&mut self, piece: &str) -> Split {
        self.held.push_str(piece);
        if self.harmony.is_some() {
            return self.push_harmony();
        }
        let mut out = Split::default();
        loop {
            match self.place {
                Place::Start => {
                    if let Some(rest) = self.held.strip_prefix(THINK_OPEN) {
                        self.held = rest.to_owned();
                        self.place = Place::Reasoning { leading: true };
                    } else if THINK_OPEN.starts_with(self.held.as_str()) {
                        return out; // "", "<", "<th", ...: not decided yet
                    } else {
                        self.place = Place::Content;
                    }
                }
                Place::Reasoning { leading } => {
                    if leading {
                        let kept = self.held.trim_start().len();
                        self.held.drain(..self.held.len() - kept);
                        if self.held.is_empty() {
                            return out;
                        }
                    }
                    if let Some(at) = self.held.find(THINK_CLOSE) {
                        out.reasoning.push_str(self.held[..at].trim_end());
                        self.held.drain(..at + THINK_CLOSE.len());
                        self.place = Place::AfterClose;
                        continue;
                    }
                    // Hold back what may be the start of `</think>`, and the whitespace before it (it is
                    // dropped if the block closes next).
                    let tag_at = partial_suffix_start(&self.held, THINK_CLOSE);
                    let give = self.held[..tag_at].trim_end().len();
                    out.reasoning.push_str(&self.held[..give]);
                    self.held.drain(..give);
                    if give > 0 {
                        self.place = Place::Reasoning { leading: false };
                    }
                    return out;
                }
                Place::AfterClose => {
                    let kept = self.held.trim_start().len();
                    self.held.drain(..self.held.len() - kept);
                    if self.held.is_empty() {
                        return out;
                    }
                    self.place = Place::Content;
                }
                Place::Content => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// The reply has ended: gives out what was held back (an unclosed block's last reasoning, or a reply
    /// that was only the start of `<think>`).
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        let mut out = Split::default();
        if let Some(h) = self.harmony {
            // A header cut short is content (it was not one); a body's held tail is its channel's.
            match h {
                HPlace::Body { reasoning: true, .. } => out.reasoning = held,
                // `<|call|>` ends the generation, so the text usually stops inside the call's body.
                HPlace::Body { call: true, .. } => out.content = format!("{held}}}\n</tool_call>"),
                HPlace::Header if held.starts_with(H_CHANNEL) || held.starts_with(H_START) => {}
                _ => out.content = held,
            }
            self.harmony = Some(HPlace::Plain);
            return out;
        }
        match self.place {
            Place::Start | Place::Content => out.content = held,
            Place::Reasoning { .. } => out.reasoning = held.trim().to_owned(),
            Place::AfterClose => {}
        }
        self.place = Place::Content;
        out
    }

    /// Whether the splitter is inside the reasoning block now.
    pub fn in_reasoning(&self) -> bool {
        match self.harmony {
            Some(h) => matches!(h, HPlace::Body { reasoning: true, .. }),
            None => matches!(self.place, Place::Reasoning { .. }),
        }
    }

    /// `push` for a harmony reply: headers are read whole and dropped, bodies given out to their channel,
    /// a possible tag at the end of the held text kept back.
    fn push_harmony(&mut self) -> Split {
        let mut out = Split::default();
        loop {
            match self.harmony.unwrap_or(HPlace::Plain) {
                HPlace::Header => {
                    if let Some(at) = self.held.find(H_MESSAGE) {
                        let header = &self.held[..at];
                        let reasoning = header_channel(header) == Some("analysis");
                        let callee = header_recipient(header).map(str::to_owned);
                        if !reasoning {
                            self.content_begun = true;
                        }
                        self.held.drain(..at + H_MESSAGE.len());
                        let call = callee.is_some();
                        if let Some(name) = callee {
                            let name = serde_json::Value::String(name);
                            out.content.push_str(&format!("<tool_call>\n{{\"name\": {name}, \"arguments\": "));
                        }
                        self.harmony = Some(HPlace::Body { reasoning: reasoning && !call, call });
                        continue;
                    }
                    let header_like = H_CHANNEL.starts_with(self.held.as_str())
                        || self.held.starts_with(H_CHANNEL)
                        || H_START.starts_with(self.held.as_str())
                        || self.held.starts_with(H_START);
                    if header_like && self.held.len() <= H_MAX_HEADER_BYTES {
                        return out;
                    }
                    self.harmony = Some(HPlace::Plain);
                }
                HPlace::Body { reasoning, call } => {
                    let end = H_BODY_ENDS.iter().filter_map(|t| self.held.find(t).map(|at| (at, *t))).min();
                    let (give, next) = match end {
                        Some((at, tag)) => (at, Some((at, tag))),
                        None => {
                            let keep = H_BODY_ENDS.iter().map(|t| partial_suffix_start(&self.held, t)).min();
                            (keep.unwrap_or(self.held.len()), None)
                        }
                    };
                    let text: String = self.held.drain(..give).collect();
                    if reasoning {
                        out.reasoning.push_str(&text);
                    } else {
                        out.content.push_str(&text);
                    }
                    let Some((_, tag)) = next else { return out };
                    if reasoning {
                        self.analysis_closed += 1;
                    }
                    if call {
                        out.content.push_str("}\n</tool_call>");
                    }
                    // `<|start|>` begins the next message's header; the ends are dropped.
                    if tag != H_START {
                        self.held.drain(..tag.len());
                    }
                    self.harmony = Some(HPlace::Header);
                }
                HPlace::Plain => {
                    self.content_begun = true;
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }
}

/// The channel a harmony header names (`<|start|>assistant<|channel|>final` -> `final`; `<|channel|>commentary
/// to=functions.f <|constrain|>json` -> `commentary`).
fn header_channel(header: &str) -> Option<&str> {
    let at = header.find(H_CHANNEL)? + H_CHANNEL.len();
    header[at..].split(|c: char| c.is_whitespace() || c == '<').next().filter(|c| !c.is_empty())
}

/// The function a harmony header addresses (`... to=functions.get_weather ...` -> `get_weather`).
fn header_recipient(header: &str) -> Option<&str> {
    let at = header.find("to=functions.")? + "to=functions.".len();
    header[at..].split(|c: char| c.is_whitespace() || c == '<').next().filter(|c| !c.is_empty())
}

/// Whether a rendered prompt asks for a harmony reply: its generation prompt ends with `<|start|>assistant`.
pub fn prompt_is_harmony(rendered: &str) -> bool {
    rendered.trim_end().ends_with("<|start|>assistant")
}

/// A whole reply split into reasoning and content.
pub fn split_reply(text: &str, format: impl Into<ReplyFormat>) -> Split {
    let mut s = ReasoningSplitter::new(format);
    let mut out = s.push(text);
    let last = s.finish();
    out.reasoning.push_str(&last.reasoning);
    out.content.push_str(&last.content);
    out
}

/// Whether a rendered prompt leaves the reply inside a reasoning block: its generation prompt ends with
/// `<think>` (whitespace after it aside), as DeepSeek-R1's does and some Qwen3 variants' do. Qwen3's own
/// template with `enable_thinking: false` ends with a closed, empty block instead: the reply is content.
pub fn prompt_opens_think(rendered: &str) -> bool {
    rendered.trim_end().ends_with(THINK_OPEN)
}

/// How many of a reply's tokens (`pieces`: each token's bytes, in order) are its reasoning (the usage's
/// `reasoning_tokens`): where the reply has a block by this module's rule (it starts with `<think>`, or the
/// prompt opened it: `starts_inside`), the tokens up to and including the one that completes `</think>`;
/// every token when the block never closes; none without a block.
///
/// A harmony reply's reasoning tokens are those up to and including the one that ends its last analysis
/// message before the content begins (every token while an analysis message is open at the end).
pub fn reasoning_token_count<'a>(pieces: impl IntoIterator<Item = &'a [u8]>, format: impl Into<ReplyFormat>) -> usize {
    let starts_inside = match format.into() {
        ReplyFormat::Think { starts_inside } => starts_inside,
        ReplyFormat::Harmony => return harmony_reasoning_tokens(pieces),
    };
    let (open, close) = (THINK_OPEN.as_bytes(), THINK_CLOSE.as_bytes());
    let mut text: Vec<u8> = Vec::new();
    let mut count = 0;
    for piece in pieces {
        let searched_from = text.len().saturating_sub(close.len() - 1);
        text.extend_from_slice(piece);
        count += 1;
        if !starts_inside {
            // Undecided while the text is a prefix of `<think>`; no block once it is not.
            let n = text.len().min(open.len());
            if text[..n] != open[..n] {
                return 0;
            }
            if text.len() < open.len() {
                continue;
            }
        }
        // `</think>` after the opening tag (with `starts_inside`, anywhere).
        let body = if starts_inside { 0 } else { open.len() };
        let from = searched_from.max(body);
        if text[from..].windows(close.len()).any(|w| w == close) {
            return count;
        }
    }
    if !starts_inside && !text.starts_with(open) {
        return 0;
    }
    count
}

/// [`reasoning_token_count`] of a harmony reply.
fn harmony_reasoning_tokens<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> usize {
    let mut s = ReasoningSplitter::new(ReplyFormat::Harmony);
    let (mut count, mut bytes) = (0, Vec::new());
    for (i, piece) in pieces.into_iter().enumerate() {
        bytes.extend_from_slice(piece);
        // Whole characters only (a token may end inside one); the rest waits for the next piece.
        let valid = match std::str::from_utf8(&bytes) {
            Ok(t) => t.len(),
            Err(e) => e.valid_up_to(),
        };
        let text = String::from_utf8_lossy(&bytes[..valid]).into_owned();
        bytes.drain(..valid);
        let closed = s.analysis_closed;
        s.push(&text);
        if s.content_begun {
            break;
        }
        if s.analysis_closed > closed || s.in_reasoning() {
            count = i + 1;
        }
    }
    count
}

/// Where the longest suffix of `text` that is a proper prefix of `tag` starts (`text.len()` when none).
fn partial_suffix_start(text: &str, tag: &str) -> usize {
    let longest = tag.len().saturating_sub(1).min(text.len());
    for n in (1..=longest).rev() {
        let at = text.len() - n;
        if text.is_char_boundary(at) && tag.starts_with(&text[at..]) {
            return at;
        }
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `pieces` through a splitter, returning every non-empty piece given out and the whole.
    fn stream(pieces: &[&str], starts_inside: bool) -> (Vec<Split>, Split) {
        let mut s = ReasoningSplitter::new(starts_inside);
        let mut out: Vec<Split> = pieces.iter().map(|p| s.push(p)).collect();
        out.push(s.finish());
        let mut whole = Split::default();
        for p in &out {
            whole.reasoning.push_str(&p.reasoning);
            whole.content.push_str(&p.content);
        }
        (out.into_iter().filter(|p| !p.is_empty()).collect(), whole)
    }

    fn split(reasoning: &str, content: &str) -> Split {
        Split { reasoning: reasoning.to_owned(), content: content.to_owned() }
    }

    #[test]
    fn reasoning_tokens_are_those_up_to_the_closing_tag() {
        let count = |pieces: &[&str], inside| reasoning_token_count(pieces.iter().map(|p| p.as_bytes()), inside);
        // `</think>` split across tokens: the token that completes it is the last reasoning token.
        assert_eq!(count(&["<think>", "Hm", "</th", "ink>", "\n\n", "Hi"], false), 4);
        assert_eq!(count(&["<", "think>a</think>", "Hi"], false), 2);
        // The prompt opened the block: the reply starts inside it.
        assert_eq!(count(&["Let", " me", "</think>", "Hi"], true), 3);
        // A block that never closes is all reasoning; no block, no reasoning.
        assert_eq!(count(&["<think>", "still", " thinking"], false), 3);
        assert_eq!(count(&["Hello", " <think>", "</think>"], false), 0);
        assert_eq!(count(&["<thin"], false), 0);
        assert_eq!(count(&[], true), 0);
        // `</think>` inside the opening tag's bytes does not close it early.
        assert_eq!(count(&["<think></think>", "x"], false), 1);
    }

    /// gpt-oss's reply after a generation prompt that ends with `<|start|>assistant`.
    const HARMONY: &str = "<|channel|>analysis<|message|>User greets. Reply briefly.<|end|><|start|>assistant\
                           <|channel|>final<|message|>Hello! How can I help?";

    #[test]
    fn harmony_analysis_is_reasoning_and_the_final_channel_content() {
        let h = ReplyFormat::Harmony;
        assert_eq!(split_reply(HARMONY, h), split("User greets. Reply briefly.", "Hello! How can I help?"));
        // The end tags the model may write stay out of the text; a reply straight to the final channel.
        assert_eq!(split_reply("<|channel|>final<|message|>Hi.<|return|>", h), split("", "Hi."));
        // Two analysis messages, a commentary preamble (content), then the answer.
        let text = "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>\
                    <|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>\
                    <|start|>assistant<|channel|>final<|message|> 42";
        assert_eq!(split_reply(text, h), split("ab", "Checking. 42"));
        // Cut inside the analysis (max_tokens): all reasoning; a reply that is not harmony: all content.
        assert_eq!(split_reply("<|channel|>analysis<|message|>thinking", h), split("thinking", ""));
        assert_eq!(split_reply("Plain answer <|end|>", h), split("", "Plain answer <|end|>"));
        // The start of a tag that never came is text, as with `<think>`.
        assert_eq!(split_reply("<|chan", h), split("", "<|chan"));
        assert_eq!(split_reply("", h), split("", ""));
        assert!(prompt_is_harmony("<|start|>user<|message|>Hi<|end|><|start|>assistant"));
        assert!(!prompt_is_harmony("<|im_start|>assistant\n"));
    }

    #[test]
    fn a_harmony_call_goes_on_as_the_hermes_text_of_the_call() {
        let h = ReplyFormat::Harmony;
        let text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary \
                    to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}";
        let want = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        // The call ends with `<|call|>` (an end of generation, so usually not in the text) or is cut.
        assert_eq!(split_reply(&format!("{text}<|call|>"), h), split("Need weather.", want));
        assert_eq!(split_reply(text, h), split("Need weather.", want));
        // The recipient may come before the channel, as the template writes earlier calls.
        let before = "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>";
        assert_eq!(split_reply(before, h).content, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
        let (content, calls) = crate::tools::parse_reply(crate::tools::ToolFormat::Harmony, want);
        assert!(content.is_empty());
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("get_weather", "{\"city\":\"Oslo\"}"));
    }

    #[test]
    fn harmony_streams_give_the_same_split_wherever_the_tags_fall() {
        let want = split_reply(HARMONY, ReplyFormat::Harmony);
        let bounds: Vec<usize> = (0..=HARMONY.len()).filter(|&i| HARMONY.is_char_boundary(i)).collect();
        for &a in &bounds {
            for &b in bounds.iter().filter(|&&b| b >= a).step_by(3) {
                let mut s = ReasoningSplitter::new(ReplyFormat::Harmony);
                let mut whole = Split::default();
                for piece in [&HARMONY[..a], &HARMONY[a..b], &HARMONY[b..]] {
                    let p = s.push(piece);
                    whole.reasoning.push_str(&p.reasoning);
                    whole.content.push_str(&p.content);
                }
                let p = s.finish();
                whole.reasoning.push_str(&p.reasoning);
                whole.content.push_str(&p.content);
                assert_eq!(whole, want, "cut at {a}, {b}");
            }
        }
    }

    #[test]
    fn harmony_reasoning_tokens_end_with_the_analysis_message() {
        let count = |pieces: &[&str]| reasoning_token_count(pieces.iter().map(|p| p.as_bytes()), ReplyFormat::Harmony);
        let reply = ["<|channel|>", "analysis", "<|message|>", "Hm", ".", "<|end|>", "<|start|>", "assistant"];
        let answer = ["<|channel|>", "final", "<|message|>", "Hi"];
        assert_eq!(count(&[&reply[..], &answer[..]].concat()), 6);
        assert_eq!(count(&answer), 0);
        // Still thinking at the end: every token.
        assert_eq!(count(&reply[..5]), 5);
    }

    #[test]
    fn a_think_block_is_reasoning_and_the_rest_content() {
        let s = split_reply("<think>\nThe user greets me.\n</think>\n\nHello!", false);
        assert_eq!(s, split("The user greets me.", "Hello!"));
        // Whitespace inside the content is kept; only its start is trimmed.
        let s = split_reply("<think>a</think>  Hi\n\nthere \n", false);
        assert_eq!(s, split("a", "Hi\n\nthere \n"));
        // An empty block (Qwen3 with thinking off writes one in the prompt; a model may write one too).
        assert_eq!(split_reply("<think>\n\n</think>\n\nHi", false), split("", "Hi"));
    }

    #[test]
    fn a_reply_without_a_block_is_all_content_and_unchanged() {
        assert_eq!(split_reply("Hello!", false), split("", "Hello!"));
        assert_eq!(split_reply("\n Hi", false), split("", "\n Hi"));
        // A tag that does not open the reply is text, as in llama.cpp.
        assert_eq!(split_reply("I <think> so</think>", false), split("", "I <think> so</think>"));
        assert_eq!(split_reply(" <think>x</think>y", false), split("", " <think>x</think>y"));
        // A reply that is only the start of the tag, or the tag's letters but not the tag.
        assert_eq!(split_reply("<thi", false), split("", "<thi"));
        assert_eq!(split_reply("<thing>", false), split("", "<thing>"));
        assert_eq!(split_reply("", false), split("", ""));
    }

    #[test]
    fn an_unclosed_block_is_all_reasoning() {
        assert_eq!(split_reply("<think>\nStill thinking about it\n", false), split("Still thinking about it", ""));
        assert_eq!(split_reply("<think>", false), split("", ""));
        // Cut in the middle of the closing tag (max_tokens): the partial tag is reasoning text.
        assert_eq!(split_reply("<think>hmm</thi", false), split("hmm</thi", ""));
    }

    #[test]
    fn a_prompt_that_opened_the_block_starts_the_reply_inside_it() {
        assert!(prompt_opens_think("<|im_start|>assistant\n<think>\n"));
        assert!(prompt_opens_think("<｜Assistant｜><think>"));
        assert!(!prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!prompt_opens_think("<|im_start|>assistant\n"));
        assert_eq!(split_reply("Let me see.\n</think>\n\n42", true), split("Let me see.", "42"));
        assert_eq!(split_reply("no end", true), split("no end", ""));
        // Inside the block already, a `<think>` is reasoning text.
        assert_eq!(split_reply("<think>x</think>y", true), split("<think>x", "y"));
    }

    #[test]
    fn streamed_pieces_give_the_same_split_wherever_the_tags_fall() {
        let text = "<think>\nStep 1.\n\nStep 2 </thinking> aside.\n</think>\n\nThe answer: 42.\n";
        let want = split_reply(text, false);
        assert_eq!(want, split("Step 1.\n\nStep 2 </thinking> aside.", "The answer: 42.\n"));
        // Every cut into two and three pieces (at char boundaries), and one character at a time.
        let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        for &a in &bounds {
            for &b in bounds.iter().filter(|&&b| b >= a) {
                let (_, whole) = stream(&[&text[..a], &text[a..b], &text[b..]], false);
                assert_eq!(whole, want, "cut at {a}, {b}");
            }
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(stream(&pieces, false).1, want);
    }

    #[test]
    fn pieces_are_given_out_as_soon_as_they_are_known() {
        let (out, _) = stream(&["<th", "ink>", "\nA", " b", "\n</th", "ink>", "\n\n", "C", "d"], false);
        assert_eq!(out, vec![split("A", ""), split(" b", ""), split("", "C"), split("", "d")]);
        // No block: the first piece waits only while it may be `<think>`.
        let (out, _) = stream(&["<", "b>", "x"], false);
        assert_eq!(out, vec![split("", "<b>"), split("", "x")]);
        let (out, _) = stream(&["Hi", " there"], false);
        assert_eq!(out, vec![split("", "Hi"), split("", " there")]);
        // Whitespace inside the reasoning waits for the text after it, then goes out with it.
        let (out, _) = stream(&["<think>a", "\n\n", "b", "\n", "</think>", "c"], false);
        assert_eq!(out, vec![split("a", ""), split("\n\nb", ""), split("", "c")]);
    }

    #[test]
    fn the_splitter_says_whether_it_is_inside_the_block() {
        let mut s = ReasoningSplitter::new(false);
        assert!(!s.in_reasoning());
        s.push("<think>x");
        assert!(s.in_reasoning());
        s.push("</think>y");
        assert!(!s.in_reasoning());
        assert!(ReasoningSplitter::new(true).in_reasoning());
    }

    #[test]
    fn multibyte_text_next_to_the_tags_is_kept_whole() {
        let text = "<think>é…</think>日本";
        assert_eq!(split_reply(text, false), split("é…", "日本"));
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(stream(&pieces, false).1, split("é…", "日本"));
    }
}
