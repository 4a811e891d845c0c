//! Tool calling: how a model family writes a call to a function, the grammar that makes it write one, and
//! the reading of calls back out of its reply (whole, or piece by piece while it streams).
//!
//! It owns the call formats and nothing of the transport: the OpenAI, Responses and Anthropic shapes are
//! the server's. The format comes from the chat template, which is the model's own statement of it:
//!
//! ```text
//! Hermes   (Qwen 2.5/3, Hermes, SmolLM3; and every template that knows no tools, see below)
//!          <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//! Llama3   (Llama 3.1-3.3)        {"name": "f", "parameters": {...}}
//! Mistral  (Mistral, Mixtral)     [TOOL_CALLS][{"name": "f", "arguments": {...}}]
//! Harmony  (gpt-oss)              <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}
//! ```
//!
//! A harmony call is a message of its own, which the reasoning splitter (`tokenizer::reasoning`) reads: it
//! hands the call on as the Hermes text of the same call, so calls are read out of its content as Hermes'.
//!
//! A template that does not mention tools (SmolLM2, Gemma 3) gets them described in a system message
//! ([`system_prompt`]) in the Hermes format, and earlier calls and results written as text in that format.

mod stream;

use serde_json::{json, Value};

pub use stream::{ToolSplitter, ToolText};

use crate::grammar::gbnf::lark_string;
use crate::tokenizer::{ChatMessage, Tokenizer};

/// The call format of a model family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Mistral,
    Harmony,
}

/// One function a request offers.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON schema of the arguments object.
    pub parameters: Value,
}

impl Tool {
    /// The OpenAI shape, as templates read `tools`.
    pub fn to_openai(&self) -> Value {
        let mut f = serde_json::Map::new();
        f.insert("name".into(), json!(self.name));
        if let Some(d) = &self.description {
            f.insert("description".into(), json!(d));
        }
        f.insert("parameters".into(), self.parameters.clone());
        json!({"type": "function", "function": f})
    }
}

/// A call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments object as JSON text.
    pub arguments: String,
}

/// Which calls a reply may or must make.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// Text or calls, as the model likes (OpenAI's default when tools are given).
    Auto,
    /// No call: tools stay in the prompt, the reply is text.
    None,
    /// At least one call, and nothing else.
    Required,
    /// A call to this function, and nothing else.
    Named(String),
}

impl ToolFormat {
    /// The format a chat template writes and reads, and whether the template renders `tools` itself.
    pub fn of_template(source: &str) -> (ToolFormat, bool) {
        let knows_tools = source.contains("tools");
        let format = if source.contains("<|channel|>") {
            ToolFormat::Harmony
        } else if source.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if source.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if source.contains("<|start_header_id|>") && knows_tools {
            ToolFormat::Llama3
        } else {
            ToolFormat::Hermes
        };
        (format, knows_tools)
    }

    /// The JSON of one call in this format (earlier calls written back as text).
    pub fn call_json(self, call: &ToolCall) -> Value {
        let args: Value = serde_json::from_str(&call.arguments).unwrap_or(Value::String(call.arguments.clone()));
        match self {
            ToolFormat::Llama3 => json!({"name": call.name, "parameters": args}),
            ToolFormat::Hermes | ToolFormat::Mistral | ToolFormat::Harmony => {
                json!({"name": call.name, "arguments": args})
            }
        }
    }

    /// Earlier calls as the model would have written them.
    pub fn calls_text(self, calls: &[ToolCall]) -> String {
        match self {
            ToolFormat::Harmony => calls
                .iter()
                .map(|c| {
                    format!(
                        "<|channel|>commentary to=functions.{} <|constrain|>json<|message|>{}<|call|>",
                        c.name, c.arguments
                    )
                })
                .collect(),
            ToolFormat::Hermes => calls
                .iter()
                .map(|c| format!("<tool_call>\n{}\n</tool_call>", self.call_json(c)))
                .collect::<Vec<_>>()
                .join("\n"),
            ToolFormat::Llama3 => calls.iter().map(|c| self.call_json(c).to_string()).collect::<Vec<_>>().join("; "),
            ToolFormat::Mistral => {
                format!("[TOOL_CALLS]{}", Value::Array(calls.iter().map(|c| self.call_json(c)).collect()))
            }
        }
    }
}

/// The system text that offers `tools` to a model whose template does not render them (Hermes format).
pub fn system_prompt(tools: &[Tool]) -> String {
    let mut s = String::from(
        "You may call functions to answer. The functions you can call, one JSON schema per line:\n<tools>\n",
    );
    for t in tools {
        s.push_str(&t.to_openai().to_string());
        s.push('\n');
    }
    s.push_str(
        "</tools>\nTo call a function, answer with the call alone, as a JSON object with its name and \
         arguments between tags:\n<tool_call>\n{\"name\": \"function name\", \"arguments\": {...}}\n</tool_call>",
    );
    s
}

/// A function result as a model without tool support in its template reads it (Hermes format).
pub fn result_text(content: &str) -> String {
    format!("<tool_response>\n{content}\n</tool_response>")
}

/// Makes a conversation with tool turns renderable by a template that knows no tools (`knows_tools`
/// false): the offered tools described in the system message, earlier calls written as the assistant's
/// text, results as user turns (consecutive results in one). A template that knows tools renders them itself
/// and gets the messages as they are, except that Mistral's (`format`) get call ids it accepts
/// ([`mistral_id`]).
pub fn prepare_messages(
    messages: &mut Vec<ChatMessage>,
    offered: Option<&[Tool]>,
    format: ToolFormat,
    knows_tools: bool,
) {
    if knows_tools {
        if format == ToolFormat::Mistral {
            for m in messages.iter_mut() {
                for c in m.tool_calls.iter_mut() {
                    if let Some(id) = c.get("id").and_then(Value::as_str).map(mistral_id) {
                        c["id"] = Value::String(id);
                    }
                }
                if let Some(id) = &m.tool_call_id {
                    m.tool_call_id = Some(mistral_id(id));
                }
            }
        }
        return;
    }
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    for mut m in messages.drain(..) {
        if !m.tool_calls.is_empty() {
            let calls: Vec<ToolCall> = m.tool_calls.iter().filter_map(|c| call_of(c.get("function")?)).collect();
            let text = ToolFormat::Hermes.calls_text(&calls);
            m.content = if m.content.is_empty() { text } else { format!("{}\n{text}", m.content) };
            m.tool_calls.clear();
        }
        if m.role == "tool" {
            let text = result_text(&m.content);
            match out.last_mut() {
                Some(prev) if prev.role == "user" && prev.content.ends_with("</tool_response>") => {
                    prev.content.push('\n');
                    prev.content.push_str(&text);
                }
                _ => out.push(ChatMessage::new("user", text)),
            }
            continue;
        }
        out.push(m);
    }
    if let Some(tools) = offered.filter(|t| !t.is_empty()) {
        let prompt = system_prompt(tools);
        match out.first_mut() {
            Some(first) if first.role == "system" => first.content = format!("{}\n\n{prompt}", first.content),
            _ => out.insert(0, ChatMessage::new("system", prompt)),
        }
    }
    *messages = out;
}

/// A tool-call id as Mistral's templates take it: exactly 9 ASCII letters and digits (they raise on any
/// other). One already so stays; any other becomes 9 such characters of its FNV-1a hash, the same every
/// turn, so that a call and its result keep matching ids and the prompt's prefix stays the same.
pub fn mistral_id(id: &str) -> String {
    if id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return id.to_owned();
    }
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (0..9)
        .map(|_| {
            let c = ALPHABET[(h % 62) as usize] as char;
            h /= 62;
            c
        })
        .collect()
}

/// The JSON schema of one call's object: the name fixed, the arguments as the tool's schema says.
fn call_schema(format: ToolFormat, t: &Tool) -> Value {
    let args = match format {
        ToolFormat::Llama3 => "parameters",
        ToolFormat::Hermes | ToolFormat::Mistral | ToolFormat::Harmony => "arguments",
    };
    let params = if t.parameters.is_object() { t.parameters.clone() } else { json!({"type": "object"}) };
    json!({
        "type": "object",
        "properties": {"name": {"const": t.name}, args: params},
        "required": ["name", args],
        "additionalProperties": false,
    })
}

/// A literal of the grammar: the control token of that text when the vocabulary has one (Mistral's
/// `[TOOL_CALLS]`), otherwise the text.
fn literal(tokenizer: &Tokenizer, text: &str) -> String {
    match tokenizer.token_id(text) {
        Some(id) if tokenizer.is_control(id) => format!("<[{id}]>"),
        _ => lark_string(text),
    }
}

/// The Lark grammar of a reply that is only calls (`tool_choice` required or a named function): one call,
/// or with `parallel` one or more, each valid under its tool's schema.
pub fn calls_grammar(
    format: ToolFormat,
    tools: &[Tool],
    only: Option<&str>,
    parallel: bool,
    tokenizer: &Tokenizer,
) -> String {
    let offered: Vec<&Tool> = tools.iter().filter(|t| only.is_none_or(|n| t.name == n)).collect();
    let schemas: Vec<Value> = offered.iter().map(|t| call_schema(format, t)).collect();
    let one = if schemas.len() == 1 { schemas[0].clone() } else { json!({"anyOf": schemas}) };
    let with_options = crate::grammar::with_json_options;
    match format {
        ToolFormat::Hermes => {
            let repeat = if parallel { "(\"\\n\" call)*" } else { "" };
            format!(
                "start: call {repeat}\ncall: {open} \"\\n\" body \"\\n\" {close}\nbody: %json {}\n",
                with_options(one),
                open = literal(tokenizer, "<tool_call>"),
                close = literal(tokenizer, "</tool_call>"),
            )
        }
        ToolFormat::Llama3 => format!("start: %json {}\n", with_options(one)),
        ToolFormat::Harmony => {
            // One call per reply: `<|call|>` after it ends the generation. Its header names the function,
            // its body is the arguments.
            let calls: Vec<String> = offered
                .iter()
                .map(|t| {
                    let params =
                        if t.parameters.is_object() { t.parameters.clone() } else { json!({"type": "object"}) };
                    format!(
                        "{} {} {} \"json\" {} %json {}",
                        literal(tokenizer, "<|channel|>"),
                        lark_string(&format!("commentary to=functions.{} ", t.name)),
                        literal(tokenizer, "<|constrain|>"),
                        literal(tokenizer, "<|message|>"),
                        with_options(params)
                    )
                })
                .collect();
            format!("start: {}\n", calls.join(" | "))
        }
        ToolFormat::Mistral => {
            let max = if parallel { json!(null) } else { json!(1) };
            let mut array = json!({"type": "array", "items": one, "minItems": 1});
            if !max.is_null() {
                array["maxItems"] = max;
            }
            format!("start: {} %json {}\n", literal(tokenizer, "[TOOL_CALLS]"), with_options(array))
        }
    }
}

/// One call object's name and arguments (`arguments` or `parameters`; an object, or a string of JSON).
fn call_of(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_owned();
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or(json!({}));
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// The calls in a whole reply, and the text around them. A call that does not parse stays in the text.
pub fn parse_reply(format: ToolFormat, text: &str) -> (String, Vec<ToolCall>) {
    let mut s = ToolSplitter::new(format);
    let mut content = String::new();
    let mut calls = Vec::new();
    for part in [s.push(text), s.finish()] {
        content.push_str(&part.content);
        calls.extend(part.calls);
    }
    (content, calls)
}

#[cfg(test)]
mod tests;
