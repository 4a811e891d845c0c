//! A conversation's prompt with its earlier replies kept as the tokens they were generated as.
//!
//! A client sends a reply back as text, and tokenizing that text again rarely gives the tokens the model
//! generated (BPE merges across what were separate steps; "Rome." generated as `Rome` `.` may come back as
//! `Rome.`). The live sequence holds the generated tokens, so a retokenized reply breaks the common prefix
//! at its first differing token, and the rest of the reply and everything after it are read again. Here
//! each reply the engine produced is remembered by its exact text ([`ReplyTokens`]); when an assistant
//! message's content is byte for byte one of them, its tokens go into the prompt as generated and only the
//! template's glue and the new messages are tokenized ([`encode_chat`]).
//!
//! Exact, never a guess: a reply is remembered only with the tokens whose decoded text is exactly its text
//! ([`tokens_of_text`]), it is used only for content equal to that text, and the prompt is split only where
//! the template writes each such content once and unchanged (checked by rendering the conversation with
//! markers in those places: the marked render with the contents put back must be the real render).
//! Otherwise the whole render is tokenized as before. It owns that store and that rule; it never runs the
//! model.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::reasoning::ReplyFormat;
use super::{ChatMessage, ChatTemplate, StreamDecoder, TemplateKwargs, Tokenizer, TokenizerError};

/// Replies remembered at most, and their bytes (text and tokens) at most: the oldest go first.
pub const REPLIES_KEPT: usize = 1024;
pub const REPLY_BYTES_KEPT: usize = 64 << 20;

/// Replies the engine generated, by their exact text, with the token ids each was generated as.
#[derive(Debug)]
pub struct ReplyTokens {
    by_text: HashMap<Arc<str>, Arc<[u32]>>,
    /// Oldest first (a reply remembered again moves to the end).
    order: VecDeque<Arc<str>>,
    bytes: usize,
    max_replies: usize,
    max_bytes: usize,
}

impl Default for ReplyTokens {
    fn default() -> Self {
        ReplyTokens::new(REPLIES_KEPT, REPLY_BYTES_KEPT)
    }
}

fn cost(text: &str, tokens: &[u32]) -> usize {
    text.len() + tokens.len() * 4
}

impl ReplyTokens {
    pub fn new(max_replies: usize, max_bytes: usize) -> ReplyTokens {
        ReplyTokens { by_text: HashMap::new(), order: VecDeque::new(), bytes: 0, max_replies, max_bytes }
    }

    /// Remembers that `text` was generated as `tokens` (the caller checked that they decode to it, with
    /// [`tokens_of_text`]). Empty replies are not remembered.
    pub fn remember(&mut self, text: &str, tokens: &[u32]) {
        if text.is_empty() || tokens.is_empty() || cost(text, tokens) > self.max_bytes || self.max_replies == 0 {
            return;
        }
        if let Some(old) = self.by_text.remove(text) {
            self.bytes -= cost(text, &old);
            self.order.retain(|t| &**t != text);
        }
        let key: Arc<str> = Arc::from(text);
        self.bytes += cost(text, tokens);
        self.by_text.insert(key.clone(), Arc::from(tokens));
        self.order.push_back(key);
        while self.order.len() > self.max_replies || self.bytes > self.max_bytes {
            let Some(oldest) = self.order.pop_front() else { break };
            if let Some(t) = self.by_text.remove(&oldest) {
                self.bytes -= cost(&oldest, &t);
            }
        }
    }

    /// The tokens `text` was generated as, when it is exactly a remembered reply.
    pub fn get(&self, text: &str) -> Option<Arc<[u32]>> {
        self.by_text.get(text).cloned()
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// The first tokens of `generated` whose decoded text is exactly `text` (end-of-generation tokens decode
/// to nothing and are left out); None when no prefix decodes to it (a stop string cut a token in two).
pub fn tokens_of_text<'a>(tok: &Tokenizer, generated: &'a [u32], text: &str) -> Option<&'a [u32]> {
    let end = generated.iter().rposition(|&t| !tok.is_eog(t)).map_or(0, |i| i + 1);
    let generated = &generated[..end];
    if generated.iter().any(|&t| tok.is_eog(t)) {
        return None;
    }
    let mut stream = StreamDecoder::new();
    // Bytes of `text` matched so far: each piece is compared once, where it falls.
    let mut matched = 0;
    for (i, &id) in generated.iter().enumerate() {
        let piece = stream.push(tok, id);
        if !text[matched..].starts_with(piece.as_str()) {
            return None;
        }
        matched += piece.len();
        if matched == text.len() && !stream.has_pending() {
            return Some(&generated[..=i]);
        }
    }
    None
}

/// A conversation's prompt tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatPrompt {
    pub tokens: Vec<u32>,
    /// Assistant messages taken as they were generated, and their tokens.
    pub kept_replies: usize,
    pub kept_reply_tokens: usize,
    /// Whether the rendered prompt leaves the reply inside a `<think>` block (its generation prompt opened
    /// one: [`super::reasoning::prompt_opens_think`]).
    pub opens_think: bool,
    /// How the reply carries its reasoning: a `<think>` block (opened by the prompt or not), or harmony
    /// messages ([`super::reasoning::prompt_is_harmony`]).
    pub format: ReplyFormat,
}

/// Marks an assistant message's place in a render: private-use characters no tokenizer merges with text.
fn marker(i: usize) -> String {
    format!("\u{F8F0}strata-reply-{i}\u{F8F1}")
}

/// Renders `messages` (with the generation prompt) and tokenizes the result as
/// [`Tokenizer::encode_templated`] does, but with every assistant message whose text `replies` knows (a
/// [`ReplyTokens::get`], or the entries of one taken out beforehand) as the tokens it was generated as
/// (see the module comment for when that is done).
pub fn encode_chat(
    template: &ChatTemplate,
    tok: &Tokenizer,
    messages: &[ChatMessage],
    replies: impl Fn(&str) -> Option<Arc<[u32]>>,
) -> Result<ChatPrompt, TokenizerError> {
    encode_chat_with(template, tok, messages, &TemplateKwargs::new(), replies)
}

/// [`encode_chat`] with the request's template kwargs (see [`ChatTemplate::render_with`]).
pub fn encode_chat_with(
    template: &ChatTemplate,
    tok: &Tokenizer,
    messages: &[ChatMessage],
    kwargs: &TemplateKwargs,
    replies: impl Fn(&str) -> Option<Arc<[u32]>>,
) -> Result<ChatPrompt, TokenizerError> {
    let rendered = template.render_with(messages, true, kwargs)?;
    let opens_think = super::reasoning::prompt_opens_think(&rendered);
    let format = if super::reasoning::prompt_is_harmony(&rendered) {
        ReplyFormat::Harmony
    } else {
        ReplyFormat::Think { starts_inside: opens_think }
    };
    let whole = |rendered: &str| ChatPrompt {
        tokens: tok.encode_templated(rendered),
        kept_replies: 0,
        kept_reply_tokens: 0,
        opens_think,
        format,
    };
    // Which messages to keep, in order, with their tokens.
    let kept: Vec<(usize, Arc<[u32]>)> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == "assistant")
        .filter_map(|(i, m)| replies(&m.content).map(|t| (i, t)))
        .collect();
    let clash = messages.iter().any(|m| m.content.contains(['\u{F8F0}', '\u{F8F1}']));
    if kept.is_empty() || clash {
        return Ok(whole(&rendered));
    }
    let mut marked = messages.to_vec();
    for (n, (i, _)) in kept.iter().enumerate() {
        marked[*i].content = marker(n);
    }
    let Ok(marked_render) = template.render_with(&marked, true, kwargs) else {
        return Ok(whole(&rendered));
    };
    // Split at the markers; each must appear once, in order, and putting the contents back must give the
    // real render.
    let mut pieces: Vec<&str> = Vec::with_capacity(kept.len() + 1);
    let mut rest = marked_render.as_str();
    for n in 0..kept.len() {
        let m = marker(n);
        let Some(at) = rest.find(&m) else {
            return Ok(whole(&rendered));
        };
        pieces.push(&rest[..at]);
        rest = &rest[at + m.len()..];
    }
    pieces.push(rest);
    if pieces.iter().any(|p| p.contains('\u{F8F0}')) {
        return Ok(whole(&rendered));
    }
    let mut rebuilt = String::with_capacity(rendered.len());
    for (n, piece) in pieces.iter().enumerate() {
        rebuilt.push_str(piece);
        if let Some((i, _)) = kept.get(n) {
            rebuilt.push_str(&messages[*i].content);
        }
    }
    if rebuilt != rendered {
        return Ok(whole(&rendered));
    }
    let mut tokens = Vec::with_capacity(rendered.len() / 3 + 1);
    let mut kept_reply_tokens = 0;
    for (n, piece) in pieces.iter().enumerate() {
        if n == 0 {
            tokens.extend(tok.encode(piece, true));
        } else {
            tokens.extend(tok.encode_continued(piece, true));
        }
        if let Some((_, t)) = kept.get(n) {
            tokens.extend_from_slice(t);
            kept_reply_tokens += t.len();
        }
    }
    if let (true, Some(bos)) = (tok.add_bos_token(), tok.bos_id()) {
        if tokens.first() != Some(&bos) {
            tokens.insert(0, bos);
        }
    }
    Ok(ChatPrompt { tokens, kept_replies: kept.len(), kept_reply_tokens, opens_think, format })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_bounded_oldest_first() {
        let mut r = ReplyTokens::new(2, 1 << 20);
        r.remember("a", &[1]);
        r.remember("b", &[2]);
        r.remember("a", &[3]); // a again: now the newest
        r.remember("c", &[4]);
        assert_eq!(r.get("b"), None);
        assert_eq!(r.get("a").as_deref(), Some(&[3][..]));
        assert_eq!(r.get("c").as_deref(), Some(&[4][..]));
        let mut r = ReplyTokens::new(100, 10);
        r.remember("abcd", &[1]); // 8 bytes
        r.remember("ef", &[2]); // 6 more: over 10, "abcd" goes
        assert_eq!((r.get("abcd"), r.len()), (None, 1));
        r.remember("", &[1]);
        assert_eq!(r.len(), 1);
    }
}
