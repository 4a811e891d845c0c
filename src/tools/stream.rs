//! Calls read out of a reply while it streams: text goes on as content as soon as it cannot be the start of
//! a call; a call goes out whole once it has closed (Hermes' `</tool_call>`) or the reply has ended
//! (Llama 3's bare JSON, Mistral's `[TOOL_CALLS]` list). What looked like a call and does not parse goes
//! out as the text it was, so nothing the model wrote is lost.
//!
//! Whitespace next to a call (the newlines between two calls, before the first, after the last) is not
//! content.

use serde_json::Value;

use super::{call_of, ToolCall, ToolFormat};

/// What one piece of the reply gave: text for the content, and the calls that closed.
#[derive(Debug, Default, PartialEq)]
pub struct ToolText {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

#[derive(Debug)]
enum State {
    /// Plain text (a call may start).
    Text,
    /// Inside `<tool_call>`, waiting for its end.
    Call,
    /// The rest of the reply is calls (Llama 3's JSON, Mistral's list): read at the end.
    Rest,
}

#[derive(Debug)]
pub struct ToolSplitter {
    format: ToolFormat,
    state: State,
    /// Text not yet given out (a marker's possible start, trailing whitespace, a call's body).
    pending: String,
    /// Something other than whitespace went out as content already (Llama 3's call must come first).
    wrote_text: bool,
    /// A call went out: whitespace right after it is not content.
    after_call: bool,
    calls: usize,
    /// The marker that started `State::Rest` (given back with the text when it does not parse).
    rest_marker: &'static str,
    /// The whitespace before the call being read (content again if it is not a call).
    gap: String,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";

impl ToolSplitter {
    pub fn new(format: ToolFormat) -> ToolSplitter {
        ToolSplitter {
            format,
            state: State::Text,
            pending: String::new(),
            wrote_text: false,
            after_call: false,
            calls: 0,
            rest_marker: "",
            gap: String::new(),
        }
    }

    /// Calls given out so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn open_marker(&self) -> &'static str {
        match self.format {
            // The reasoning splitter hands harmony's calls on as Hermes text.
            ToolFormat::Hermes | ToolFormat::Harmony => HERMES_OPEN,
            ToolFormat::Mistral => MISTRAL_OPEN,
            ToolFormat::Llama3 => PYTHON_TAG,
        }
    }

    fn emit(&mut self, out: &mut ToolText, text: &str) {
        let text = if self.after_call { text.trim_start() } else { text };
        if !text.is_empty() {
            self.after_call = false;
            self.wrote_text |= !text.trim().is_empty();
            out.content.push_str(text);
        }
    }

    fn called(&mut self, out: &mut ToolText, call: ToolCall) {
        out.calls.push(call);
        self.calls += 1;
        self.after_call = true;
    }

    pub fn push(&mut self, piece: &str) -> ToolText {
        let mut out = ToolText::default();
        self.pending.push_str(piece);
        loop {
            match self.state {
                State::Text => {
                    if self.format == ToolFormat::Llama3 && !self.wrote_text {
                        let t = self.pending.trim_start();
                        if t.starts_with('{') {
                            self.state = State::Rest;
                            self.rest_marker = "";
                            self.gap.clear();
                            continue;
                        }
                        if t.is_empty() || "{".starts_with(t) {
                            return out;
                        }
                    }
                    let marker = self.open_marker();
                    if let Some(i) = self.pending.find(marker) {
                        let before = self.pending[..i].trim_end().to_owned();
                        self.gap = self.pending[before.len()..i].to_owned();
                        self.emit(&mut out, &before);
                        self.pending.drain(..i + marker.len());
                        let tagged = matches!(self.format, ToolFormat::Hermes | ToolFormat::Harmony);
                        self.state = if tagged { State::Call } else { State::Rest };
                        self.rest_marker = marker;
                        continue;
                    }
                    // Hold back a marker's possible start and trailing whitespace.
                    let keep = held_suffix(&self.pending, marker);
                    let ws = self.pending[..self.pending.len() - keep].trim_end().len();
                    let text: String = self.pending.drain(..ws).collect();
                    self.emit(&mut out, &text);
                    return out;
                }
                State::Call => {
                    let Some(j) = self.pending.find(HERMES_CLOSE) else { return out };
                    let body: String = self.pending.drain(..j + HERMES_CLOSE.len()).collect();
                    let body = &body[..j];
                    match parse_object(body) {
                        Some(call) => self.called(&mut out, call),
                        None => {
                            let text = format!("{}{HERMES_OPEN}{body}{HERMES_CLOSE}", self.gap);
                            self.emit(&mut out, &text);
                        }
                    }
                    self.state = State::Text;
                }
                State::Rest => return out,
            }
        }
    }

    /// The end of the reply: what was held goes out, as calls when it parses as calls.
    pub fn finish(&mut self) -> ToolText {
        let mut out = ToolText::default();
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Text => {
                if self.calls == 0 {
                    self.emit(&mut out, &rest);
                } else {
                    let text = rest.trim_end().to_owned();
                    self.emit(&mut out, &text);
                }
            }
            // A call the reply ended inside (the end-of-turn token came before `</tool_call>`).
            State::Call => match parse_object(&rest) {
                Some(call) => self.called(&mut out, call),
                None => {
                    let text = format!("{}{HERMES_OPEN}{rest}", self.gap);
                    self.emit(&mut out, &text);
                }
            },
            State::Rest => {
                let calls = match self.format {
                    ToolFormat::Mistral => parse_list(&rest),
                    _ => parse_llama(&rest),
                };
                match calls {
                    Some(calls) => calls.into_iter().for_each(|c| self.called(&mut out, c)),
                    None => {
                        let text = format!("{}{}{rest}", self.gap, self.rest_marker);
                        self.emit(&mut out, &text);
                    }
                }
            }
        }
        self.state = State::Text;
        out
    }
}

/// How many bytes at the end of `text` could begin `marker` (held back until the next piece says).
fn held_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

fn parse_object(body: &str) -> Option<ToolCall> {
    call_of(&serde_json::from_str::<Value>(body.trim()).ok()?)
}

/// Mistral's `[{...}, ...]`.
fn parse_list(body: &str) -> Option<Vec<ToolCall>> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let calls: Option<Vec<ToolCall>> = v.as_array()?.iter().map(call_of).collect();
    calls.filter(|c| !c.is_empty())
}

/// Llama 3's calls: one JSON object, or several separated by `;`.
fn parse_llama(body: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut de = serde_json::Deserializer::from_str(body.trim()).into_iter::<Value>();
    loop {
        match de.next() {
            Some(Ok(v)) => calls.push(call_of(&v)?),
            Some(Err(_)) => {
                // `;` between calls.
                let rest = body.trim()[de.byte_offset()..].trim_start();
                let rest = rest.strip_prefix(';')?;
                let mut more = parse_llama(rest)?;
                calls.append(&mut more);
                break;
            }
            None => break,
        }
    }
    Some(calls).filter(|c| !c.is_empty())
}
