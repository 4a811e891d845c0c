//! Chat templates: the model's Jinja template (`tokenizer.chat_template`) rendered the way Hugging Face
//! `apply_chat_template` renders it.
//!
//! It owns the template environment: minijinja with `trim_blocks` and `lstrip_blocks` on (as HF sets
//! them), Python string/dict methods (`.strip()`, `.startswith()`, `.items()`, ...) through
//! minijinja-contrib's pycompat, `raise_exception(msg)` as a typed error, a `tojson` filter that writes
//! JSON the way Python's `json.dumps` does, and `strftime_now`. The context is `messages` (each with `role`,
//! `content`, and `reasoning_content` when the client sent one back), `add_generation_prompt`, `bos_token`
//! and `eos_token`, and the request's template kwargs ([`TemplateKwargs`]: llama.cpp's
//! `chat_template_kwargs`, such as Qwen3's `enable_thinking`), which never replace those four. Without a template in the file, ChatML is used,
//! as llama.cpp does. It never tokenizes the rendered text.
//!
//! A chat template is code from the model file, so rendering has a budget: [`TEMPLATE_FUEL`] instructions
//! (minijinja's fuel) and an output cap ([`output_cap_bytes`]); a template that loops without end or writes
//! without end fails fast with an error naming the template; `indent` and `tojson(indent=N)` are bounded.
//! Limits minijinja keeps on its own: a range has at most 100,000 items, a repeated string (`'x' * n`) at
//! most 100 MB, recursion 500 levels. Not bounded: memory a template builds without writing it (captures,
//! concatenation in a `namespace`); see docs/ARCHITECTURE.md.
//!
//! Known difference: maps are serialized with sorted keys (minijinja without `preserve_order`), where
//! Python keeps insertion order; this only shows in templates that `tojson` whole dicts (tool schemas).

use std::fmt::Write as _;

use minijinja::value::Kwargs;
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use super::TokenizerError;
use crate::gguf::{GgufFile, GgufValue};

/// The ChatML template, used when a model file has none.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + \
message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Instructions a render may execute (minijinja's fuel). Real templates take tens per message (a Llama-3
/// style template takes about 25,000 for 1,000 messages, see the tests): 200 times that; a runaway loop
/// stops here within a fraction of a second.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// Bytes a render may write for `messages`: 16 MiB plus four times the text of the messages (a template
/// repeats a message's content at most a small number of times).
pub fn output_cap_bytes(messages: &[ChatMessage]) -> usize {
    let content: usize = messages
        .iter()
        .map(|m| m.content.len() + m.role.len() + m.reasoning_content.as_ref().map_or(0, String::len))
        .sum();
    (16 << 20) + content.saturating_mul(4)
}

/// The prefix that marks an error as coming from `raise_exception`.
const RAISED: &str = "raise_exception: ";

/// Extra variables of a render, by name (a request's `chat_template_kwargs`): Qwen3's `enable_thinking`,
/// gpt-oss's `reasoning_effort`, or whatever else a template reads.
pub type TemplateKwargs = serde_json::Map<String, serde_json::Value>;

/// The names of the render's own variables, which kwargs never replace.
pub const RESERVED_TEMPLATE_NAMES: [&str; 4] = ["messages", "add_generation_prompt", "bos_token", "eos_token"];

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An earlier reply's reasoning, kept apart from its content (absent from the template's context when
    /// None: templates test `message.reasoning_content is defined`). Qwen3's template drops it from turns
    /// before the last question itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An assistant turn's function calls, as templates read them: `{id, type, function: {name,
    /// arguments}}` with the arguments as an object (absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// A tool result's call id and function name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    /// The message with an earlier reply's reasoning.
    pub fn with_reasoning(mut self, reasoning: impl Into<String>) -> ChatMessage {
        self.reasoning_content = Some(reasoning.into());
        self
    }
}

/// A compiled chat template with the BOS/EOS texts it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// Where the template comes from, for messages: `tokenizer.chat_template`, the built-in ChatML, ...
    origin: String,
    bos_token: String,
    eos_token: String,
    /// Whether the template renders a system message (Gemma 2's raises on one, some drop it): when not, a
    /// system message's text goes at the start of the next user message instead, as llama.cpp does.
    system_role: bool,
}

/// The probe's system text: a template that keeps it renders the system role.
const SYSTEM_PROBE: &str = "<<strata system probe>>";

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("source", &self.source).finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts the template sees under those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("indent", indent);
        env.add_template_owned("chat", source.to_owned())?;
        let mut t = ChatTemplate {
            env,
            source: source.to_owned(),
            origin: "the chat template".to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            system_role: true,
        };
        let probe = [ChatMessage::new("system", SYSTEM_PROBE), ChatMessage::new("user", "Hi")];
        t.system_role =
            t.render_as_is(&probe, false, &TemplateKwargs::new()).is_ok_and(|text| text.contains(SYSTEM_PROBE));
        Ok(t)
    }

    /// Whether the template renders system messages itself (see [`ChatTemplate::render_with`]).
    pub fn renders_system_role(&self) -> bool {
        self.system_role
    }

    /// The template of a GGUF file (`tokenizer.chat_template`, ChatML when absent), with the texts of its
    /// BOS and EOS tokens.
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTemplate, TokenizerError> {
        let key = "tokenizer.chat_template";
        let (source, origin) = match file.get(key) {
            None => (CHATML_TEMPLATE, "the built-in ChatML chat template (the model file has none)"),
            Some(v) => (
                v.as_str().ok_or_else(|| TokenizerError::wrong_type(key, v, "a string"))?,
                "the model's chat template (tokenizer.chat_template)",
            ),
        };
        ChatTemplate::for_gguf(file, source, origin)
    }

    /// `source` in place of the file's own template (`strata serve --chat-template-file`), with the texts of
    /// the file's BOS and EOS tokens; `origin` names it in errors.
    pub fn for_gguf(file: &GgufFile, source: &str, origin: &str) -> Result<ChatTemplate, TokenizerError> {
        let token_text = |id_key: &str| -> &str {
            let id = file.get(id_key).and_then(GgufValue::as_u64);
            let tokens = file.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array);
            match (id, tokens) {
                (Some(id), Some(t)) => usize::try_from(id).ok().and_then(|i| t.get_str(i)).unwrap_or(""),
                _ => "",
            }
        };
        let mut t = ChatTemplate::new(
            source,
            token_text("tokenizer.ggml.bos_token_id"),
            token_text("tokenizer.ggml.eos_token_id"),
        )
        .map_err(|e| e.in_template(origin))?;
        t.origin = origin.to_owned();
        Ok(t)
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation; with `add_generation_prompt` the text ends where the assistant's reply
    /// begins. Within the budget of fuel and output (see the module); a template that renders nothing for
    /// a conversation is an error too (there would be no prompt).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TokenizerError> {
        self.render_with(messages, add_generation_prompt, &TemplateKwargs::new())
    }

    /// [`ChatTemplate::render`] with extra variables: each of `kwargs` is a variable of the render, except
    /// the render's own names ([`RESERVED_TEMPLATE_NAMES`]), which keep their values. A template without a
    /// system role gets each system message's text at the start of the next user message (joined by a
    /// newline; one left at the end becomes a user message), as llama.cpp's templates polyfill it.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        kwargs: &TemplateKwargs,
    ) -> Result<String, TokenizerError> {
        if self.system_role || !messages.iter().any(|m| m.role == "system") {
            return self.render_as_is(messages, add_generation_prompt, kwargs);
        }
        self.render_as_is(&without_system_role(messages), add_generation_prompt, kwargs)
    }

    fn render_as_is(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        kwargs: &TemplateKwargs,
    ) -> Result<String, TokenizerError> {
        let template = self.env.get_template("chat")?;
        let own = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let ctx = if kwargs.is_empty() {
            own
        } else {
            let extra: TemplateKwargs = kwargs
                .iter()
                .filter(|(k, _)| !RESERVED_TEMPLATE_NAMES.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            context! { ..own, ..Value::from_serialize(&extra) }
        };
        let cap_bytes = output_cap_bytes(messages);
        let mut out = CappedOutput { bytes: Vec::new(), cap_bytes, over: false };
        let origin = self.origin.clone();
        let rendered = template.render_captured_to(ctx, &mut out);
        if out.over {
            return Err(TokenizerError::TemplateBudget {
                origin,
                what: format!("wrote more than its output cap of {} MiB", cap_bytes >> 20),
            });
        }
        if let Err(e) = rendered {
            return Err(match e.detail().and_then(|d| d.strip_prefix(RAISED)) {
                Some(message) if e.kind() == ErrorKind::InvalidOperation => {
                    TokenizerError::TemplateRaised { message: message.to_owned() }
                }
                _ if e.kind() == ErrorKind::OutOfFuel => TokenizerError::TemplateBudget {
                    origin,
                    what: format!("ran more than {TEMPLATE_FUEL} steps (a loop without end?)"),
                },
                _ => TokenizerError::Template { source: e }.in_template(&origin),
            });
        }
        let text = String::from_utf8(out.bytes).map_err(|_| TokenizerError::TemplateBudget {
            origin: origin.clone(),
            what: "wrote text that is not UTF-8".to_owned(),
        })?;
        if text.is_empty() && !messages.is_empty() {
            return Err(TokenizerError::TemplateEmpty { origin, messages: messages.len() });
        }
        Ok(text)
    }
}

/// `messages` with each system message's text moved to the start of the next user message.
fn without_system_role(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(messages.len());
    let mut pending = String::new();
    for m in messages {
        if m.role == "system" {
            if !pending.is_empty() {
                pending.push('\n');
            }
            pending.push_str(&m.content);
            continue;
        }
        let mut m = m.clone();
        if m.role == "user" && !pending.is_empty() {
            let text = std::mem::take(&mut pending);
            m.content = if m.content.is_empty() { text } else { format!("{text}\n{}", m.content) };
        }
        out.push(m);
    }
    if !pending.is_empty() {
        out.push(ChatMessage::new("user", pending));
    }
    out
}

/// The render's output, refusing bytes past `cap_bytes` (the render then stops with a write error).
struct CappedOutput {
    bytes: Vec<u8>,
    cap_bytes: usize,
    over: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.cap_bytes {
            self.over = true;
            return Err(std::io::Error::other("chat template output cap reached"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The widest indent `indent` and `tojson(indent=N)` take: minijinja's own would allocate any width asked
/// (`''|indent(10**15)` aborts the process).
const MAX_INDENT: usize = 256;
/// The most bytes one `indent` may produce.
const MAX_INDENT_OUTPUT_BYTES: usize = 64 << 20;

/// `text|indent(width=4, first=false, blank=false)`, Jinja's filter (width a number or a string), bounded by
/// [`MAX_INDENT`] and [`MAX_INDENT_OUTPUT_BYTES`].
fn indent(
    value: String,
    width: Option<Value>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let width = match width {
        Some(w) => Some(w),
        None => kwargs.get::<Option<Value>>("width")?,
    };
    let first = match first {
        Some(f) => f,
        None => kwargs.get::<Option<bool>>("first")?.unwrap_or(false),
    };
    let blank = match blank {
        Some(b) => b,
        None => kwargs.get::<Option<bool>>("blank")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let pad = match width {
        None => " ".repeat(4),
        Some(w) => match w.as_str() {
            Some(s) if s.len() <= MAX_INDENT => s.to_owned(),
            Some(_) => {
                return Err(Error::new(ErrorKind::InvalidOperation, format!("indent: more than {MAX_INDENT} bytes")))
            }
            None => {
                let n = usize::try_from(w)?;
                if n > MAX_INDENT {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("indent: width {n} is more than {MAX_INDENT}"),
                    ));
                }
                " ".repeat(n)
            }
        },
    };
    let text = value.strip_suffix('\n').unwrap_or(&value);
    let text = text.strip_suffix('\r').unwrap_or(text);
    let lines = text.split('\n').count();
    if text.len().saturating_add(lines.saturating_mul(pad.len() + 1)) > MAX_INDENT_OUTPUT_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("indent: the result would pass {} MiB", MAX_INDENT_OUTPUT_BYTES >> 20),
        ));
    }
    let mut out = String::with_capacity(text.len() + lines * (pad.len() + 1));
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        // As Jinja: the first line only with `first` (then even when empty), blank lines only with `blank`.
        if (i == 0 && first) || (i > 0 && (blank || !line.is_empty())) {
            out.push_str(&pad);
        }
        out.push_str(line);
    }
    Ok(out)
}

/// `raise_exception(message)`: HF templates call it to reject a conversation they cannot format.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{message}")))
}

/// `value|tojson` / `tojson(indent=N)`: JSON as Python's `json.dumps(value, ensure_ascii=False)` writes it,
/// with `", "` and `": "` separators (or newlines and `indent` spaces).
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        Some(v) if !v.is_none() => Some(usize::try_from(v)?),
        _ => None,
    };
    if indent.is_some_and(|n| n > MAX_INDENT) {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: indent is more than {MAX_INDENT}")));
    }
    kwargs.assert_all_used()?;
    let json =
        serde_json::to_value(value).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => {
                let _ = write!(out, "{i}");
            }
            (_, Some(u), _) => {
                let _ = write!(out, "{u}");
            }
            (_, _, Some(f)) => {
                // Python's repr of a float keeps ".0" on whole numbers, as `{:?}` does.
                let _ = write!(out, "{f:?}");
            }
            _ => out.push_str("null"),
        },
        J::String(s) => write_json_str(s, out),
        J::Array(items) if items.is_empty() => out.push_str("[]"),
        J::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                write_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if map.is_empty() => out.push_str("{}"),
        J::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                write_json_str(k, out);
                out.push_str(": ");
                write_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

fn write_json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `strftime_now(format)`: the current UTC date and time, for templates that print today's date
/// (Llama 3.1+). Supports `%Y %y %m %d %e %B %b %A %a %H %M %S %%`.
fn strftime_now(format: String) -> String {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime(secs, &format)
}

fn strftime(unix_secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let days = unix_secs.div_euclid(86_400);
    let tod = unix_secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('B') => write!(out, "{month_name}"),
            Some('b') => write!(out, "{}", &month_name[..3]),
            Some('A') => write!(out, "{weekday}"),
            Some('a') => write!(out, "{}", &weekday[..3]),
            Some('H') => write!(out, "{:02}", tod / 3600),
            Some('M') => write!(out, "{:02}", tod / 60 % 60),
            Some('S') => write!(out, "{:02}", tod % 60),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
    }

    #[test]
    fn chatml_fallback_renders_turns_and_prompt() {
        let t = ChatTemplate::new(CHATML_TEMPLATE, "", "").expect("compiles");
        let out = t.render(&msgs(&[("user", "Hi")]), true).expect("renders");
        assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        let out = t.render(&msgs(&[("user", "Hi")]), false).expect("renders");
        assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n");
    }

    #[test]
    fn llama3_style_template_uses_bos_trim_and_loop_index() {
        let src = "{% set loop_messages = messages %}{% for message in loop_messages %}\
{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}\
{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
        let t = ChatTemplate::new(src, "<|begin_of_text|>", "<|eot_id|>").expect("compiles");
        let out = t.render(&msgs(&[("system", "Be brief. "), ("user", " Hi")]), true).expect("renders");
        assert_eq!(
            out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn a_template_without_a_system_role_gets_the_system_text_in_the_next_user_message() {
        // Gemma 2's rule: a system message raises.
        let src =
            "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}\
{% endif %}<{{ m.role }}>{{ m.content }}\n{% endfor %}";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        assert!(!t.renders_system_role());
        let text =
            t.render(&msgs(&[("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello"), ("user", "Bye")]), false);
        assert_eq!(text.expect("renders"), "<user>Be brief.\nHi\n<assistant>Hello\n<user>Bye\n");
        let alone = t.render(&msgs(&[("system", "A"), ("system", "B")]), false).expect("renders");
        assert_eq!(alone, "<user>A\nB\n");
        // ChatML keeps its system turn.
        let chatml = ChatTemplate::new(CHATML_TEMPLATE, "", "").expect("compiles");
        assert!(chatml.renders_system_role());
        assert!(chatml
            .render(&msgs(&[("system", "S"), ("user", "U")]), false)
            .unwrap()
            .starts_with("<|im_start|>system\nS"));
    }

    #[test]
    fn raise_exception_becomes_typed_error() {
        let src =
            "{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('Assistant turns not supported') }}\
{% endif %}{{ m.content }}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        match t.render(&msgs(&[("assistant", "x")]), false) {
            Err(TokenizerError::TemplateRaised { message }) => {
                assert_eq!(message, "Assistant turns not supported")
            }
            other => panic!("expected TemplateRaised, got {other:?}"),
        }
        assert_eq!(t.render(&msgs(&[("user", "ok")]), false).expect("renders"), "ok");
    }

    #[test]
    fn python_string_methods_loop_vars_and_block_trimming() {
        let src = "{% for m in messages %}\n{% if m.content.startswith('  ') %}{{ m.content.strip() }}{% else %}\
{{ m.content.upper() }}{% endif %}{% if not loop.last %},{% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        assert_eq!(t.render(&msgs(&[("user", "  a "), ("user", "b")]), false).expect("renders"), "a,B");
    }

    #[test]
    fn tojson_writes_python_style_json() {
        let t =
            ChatTemplate::new("{{ messages[0]|tojson }}|{{ {'a': [1, 2.5, none, 'x\"y']}|tojson(indent=2) }}", "", "")
                .expect("compiles");
        let out = t.render(&msgs(&[("user", "é\n")]), false).expect("renders");
        // Keys in the order the map was built, as Python's json.dumps (HF's tojson) and llama.cpp's ordered JSON
        // write them.
        assert_eq!(out, "{\"role\": \"user\", \"content\": \"é\\n\"}|{\n  \"a\": [\n    1,\n    2.5,\n    null,\n    \"x\\\"y\"\n  ]\n}");
    }

    #[test]
    fn a_template_that_writes_without_end_stops_at_the_output_cap() {
        let src = "{% for a in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        let e = t.render(&msgs(&[("user", "hi")]), true).unwrap_err();
        assert!(matches!(e, TokenizerError::TemplateBudget { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("the chat template wrote more than its output cap of 16 MiB"), "{msg}");
        // The issue's template writes 10 bytes per loop: the fuel or the cap stops it.
        let src = "{% for a in range(100000) %}{% for b in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        let e = t.render(&msgs(&[("user", "hi")]), true).unwrap_err();
        assert!(matches!(e, TokenizerError::TemplateBudget { .. }), "{e}");
    }

    #[test]
    fn a_template_that_loops_without_end_runs_out_of_fuel() {
        let src = "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}\
                   {% endfor %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        let e = t.render(&msgs(&[("user", "hi")]), true).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(&format!("ran more than {TEMPLATE_FUEL} steps")), "{msg}");
    }

    #[test]
    fn a_template_that_renders_nothing_is_an_error() {
        let t = ChatTemplate::new("", "", "").expect("compiles");
        let e = t.render(&msgs(&[("user", "hi")]), true).unwrap_err();
        assert!(e.to_string().contains("rendered nothing for a conversation of 1 message(s)"), "{e}");
    }

    #[test]
    fn real_templates_stay_far_below_the_fuel_over_a_long_conversation() {
        // A Llama-3-style template over 1,000 messages: the budget must leave real conversations alone.
        let src = "{% set loop_messages = messages %}{% for message in loop_messages %}\
{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}\
{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_template("t", src).unwrap();
        let messages: Vec<ChatMessage> = (0..1000)
            .map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, "some words ".repeat(50)))
            .collect();
        let template = env.get_template("t").unwrap();
        let captured = template
            .render_captured(context! { messages => messages, add_generation_prompt => true, bos_token => "<s>" })
            .unwrap();
        assert!(captured.output().len() > 500_000);
        let (used, _left) = captured.state().fuel_levels().expect("fuel is on");
        eprintln!("fuel used by 1,000 messages: {used} of {TEMPLATE_FUEL}");
        assert!(used * 20 < TEMPLATE_FUEL, "used {used} of {TEMPLATE_FUEL}");
    }

    #[test]
    fn indent_follows_jinja_and_refuses_widths_that_would_exhaust_memory() {
        let t = ChatTemplate::new("{{ messages[0].content|indent(2) }}|{{ messages[0].content|indent('> ', first=true) }}|{{ messages[0].content|indent(2, blank=true) }}", "", "").expect("compiles");
        assert_eq!(t.render(&msgs(&[("user", "a\n\nb\n")]), false).unwrap(), "a\n\n  b|> a\n\n> b|a\n  \n  b");
        for src in [
            "{{ ''|indent(1000000000000000) }}",
            "{{ ('\n' * 100000000)|indent(200, blank=true) }}",
            "{{ messages|tojson(indent=1000000000000) }}",
        ] {
            let t = ChatTemplate::new(src, "", "").expect("compiles");
            let e = t.render(&msgs(&[("user", "hi")]), true).unwrap_err().to_string();
            assert!(e.contains("more than") || e.contains("would pass"), "{src}: {e}");
        }
    }

    #[test]
    fn syntax_errors_are_reported() {
        assert!(matches!(ChatTemplate::new("{% for %}", "", ""), Err(TokenizerError::Template { .. })));
    }

    #[test]
    fn strftime_formats_a_known_date() {
        // 2024-07-26 12:34:56 UTC was a Friday.
        assert_eq!(strftime(1_721_997_296, "%d %b %Y %A %H:%M:%S"), "26 Jul 2024 Friday 12:34:56");
    }
}
