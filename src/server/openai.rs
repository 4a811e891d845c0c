//! The OpenAI request shapes (`/v1/chat/completions`, `/v1/completions`), checked field by field: a wrong
//! type, a value out of range or a field the server does not know is a 400 naming the field, in OpenAI's
//! error JSON. What passes becomes the engine's [`GenerateParams`] and the choices to make.
//!
//! Fields are as in the official API reference. `user` names the client's lane in the queue (`fair`).
//! Accepted and ignored (they change nothing here): `metadata`, `store`, `service_tier`,
//! `parallel_tool_calls`, `best_of` of 1. Refused with a clear error unless empty: tools and functions,
//! `logit_bias`. `response_format` (`json_object`, with llama.cpp's `schema` too, and `json_schema`) and
//! llama.cpp's `grammar` (GBNF) and `json_schema` keep the reply inside a grammar (`crate::grammar`). Extra
//! sampling fields that llama.cpp's server takes: `top_k`, `min_p`, `repeat_penalty`, `repeat_last_n`,
//! `ignore_eos`.
//!
//! Reasoning models, as llama.cpp's server takes them: `chat_template_kwargs` (an object whose keys become
//! variables of the chat template, such as Qwen3's `enable_thinking`), a top-level `enable_thinking` and
//! `reasoning_effort` (template variables too, unless `chat_template_kwargs` names them), `reasoning_format`
//! (`deepseek` or `auto`, the default: a reply's `<think>` block comes back as `reasoning_content`; `none`:
//! the raw text in `content`), and an assistant message's `reasoning_content` (the template decides whether
//! an earlier reply's reasoning goes back into the prompt).

use std::collections::HashMap;

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Deserialize;

use crate::engine::GenerateParams;
use crate::grammar::GrammarSpec;
use crate::sample::defaults::SamplingDefaults;
use crate::sample::SamplerConfig;
use crate::tokenizer::{ChatMessage, TemplateKwargs, RESERVED_TEMPLATE_NAMES};
use crate::tools::{Tool, ToolChoice};

use super::error::ApiError;

/// Most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 8;
/// Most stop strings (OpenAI's limit), and the longest one in bytes.
pub const MAX_STOPS: usize = 4;
pub const MAX_STOP_BYTES: usize = 1024;
/// Most top log-probabilities per token (OpenAI's limit for chat; completions take at most 5).
pub const MAX_TOP_LOGPROBS: usize = 20;
pub const MAX_COMPLETION_LOGPROBS: usize = 5;

/// Parses a JSON body into `T`: malformed JSON (with where), or the path of the field that is wrong.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::malformed("the request body is empty: send a JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let param = if path == "." { String::new() } else { path };
                let what = inner.to_string();
                let what = what.split(" at line ").next().unwrap_or(&what).to_owned();
                if param.is_empty() {
                    ApiError::invalid("", what)
                } else {
                    ApiError::invalid(param.clone(), format!("{param}: {what}"))
                }
            }
            _ => ApiError::malformed(format!("the request body is not valid JSON: {inner}")),
        }
    })?;
    de.end().map_err(|e| ApiError::malformed(format!("the request body is not valid JSON: {e}")))?;
    Ok(value)
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    pub include_obfuscation: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    /// `json_schema`: `{name, description, schema, strict}` (OpenAI).
    pub json_schema: Option<JsonSchemaFormat>,
    /// `json_object` with a schema (llama.cpp's extension).
    pub schema: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    pub schema: Option<serde_json::Value>,
    /// The output always follows the schema here, strict or not.
    pub strict: Option<bool>,
}

/// A message's content: a string or a list of parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    pub image_url: Option<IgnoredAny>,
    pub input_audio: Option<IgnoredAny>,
    pub file: Option<IgnoredAny>,
    pub refusal: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    pub content: Option<Content>,
    pub name: Option<String>,
    pub refusal: Option<IgnoredAny>,
    pub tool_calls: Option<Vec<MessageToolCall>>,
    pub tool_call_id: Option<String>,
    /// An earlier reply's reasoning, as this server (and llama.cpp's) sent it.
    pub reasoning_content: Option<String>,
}

/// A function the request offers (`tools[i]`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolParam {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Option<FunctionParam>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionParam {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<serde_json::Value>,
    /// Calls always follow the schema when they are constrained (tool_choice required or named).
    pub strict: Option<bool>,
}

/// An earlier assistant turn's call (`messages[i].tool_calls[j]`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageToolCall {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: CalledFunction,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalledFunction {
    pub name: String,
    /// JSON text, as OpenAI sends it (an object is taken too).
    pub arguments: serde_json::Value,
}

/// The tools of a chat request, checked.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// Several calls in one reply (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

/// The sampling and length fields both endpoints share, read from either request.
#[derive(Debug, Default)]
pub struct Common {
    pub max_tokens: Option<i64>,
    pub max_tokens_field: &'static str,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub n: Option<i64>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub stream: Option<bool>,
    pub include_usage: Option<bool>,
    pub has_stream_options: bool,
    pub logit_bias_len: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Option<Vec<Message>>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub n: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub response_format: Option<ResponseFormat>,
    pub tools: Option<Vec<ToolParam>>,
    pub tool_choice: Option<serde_json::Value>,
    pub functions: Option<Vec<IgnoredAny>>,
    pub function_call: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    pub user: Option<String>,
    pub metadata: Option<HashMap<String, String>>,
    pub store: Option<bool>,
    pub service_tier: Option<String>,
    pub reasoning_effort: Option<String>,
    pub modalities: Option<Vec<String>>,
    pub prediction: Option<IgnoredAny>,
    pub audio: Option<IgnoredAny>,
    pub web_search_options: Option<IgnoredAny>,
    pub verbosity: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub safety_identifier: Option<String>,
    pub chat_template_kwargs: Option<TemplateKwargs>,
    pub enable_thinking: Option<bool>,
    pub reasoning_format: Option<String>,
    /// llama.cpp's extensions: a GBNF grammar, or a JSON schema, the reply must follow.
    pub grammar: Option<String>,
    pub json_schema: Option<serde_json::Value>,
}

/// `prompt` of a completion: a string, a token list, or a list of one of either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<i64>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Option<Prompt>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub n: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub suffix: Option<String>,
    pub best_of: Option<i64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub user: Option<String>,
}

impl ChatRequest {
    pub fn common(&self) -> Common {
        let (max_tokens, field) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => (Some(m), "max_completion_tokens"),
            (None, m) => (m, "max_tokens"),
        };
        Common {
            max_tokens,
            max_tokens_field: field,
            temperature: self.temperature,
            top_p: self.top_p,
            n: self.n,
            seed: self.seed,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            top_k: self.top_k,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            ignore_eos: self.ignore_eos,
            stream: self.stream,
            include_usage: self.stream_options.as_ref().and_then(|o| o.include_usage),
            has_stream_options: self.stream_options.is_some(),
            logit_bias_len: self.logit_bias.as_ref().map_or(0, HashMap::len),
        }
    }

    /// The messages as the chat template takes them, after checking roles and content.
    pub fn chat_messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        if self.functions.as_ref().is_some_and(|f| !f.is_empty()) {
            return Err(ApiError::invalid("functions", "functions (the old API) is not supported: send tools"));
        }
        if self.function_call.as_ref().is_some_and(|v| !(v.is_null() || v == "none")) {
            return Err(ApiError::invalid(
                "function_call",
                "function_call (the old API) is not supported: send tool_choice",
            ));
        }
        let Some(messages) = &self.messages else {
            return Err(ApiError::invalid("messages", "messages is required: a list of {role, content}"));
        };
        if messages.is_empty() {
            return Err(ApiError::invalid("messages", "messages is empty: send at least one message"));
        }
        messages.iter().enumerate().map(|(i, m)| chat_message(i, m)).collect()
    }

    /// The offered tools and what the reply may do with them; None without tools (or with `tool_choice`
    /// none: the reply is text and the prompt offers nothing).
    pub fn tool_request(&self) -> Result<Option<ToolRequest>, ApiError> {
        let params = self.tools.as_deref().unwrap_or_default();
        let mut tools: Vec<Tool> = Vec::with_capacity(params.len());
        for (i, t) in params.iter().enumerate() {
            if t.kind != "function" {
                return Err(ApiError::invalid(
                    format!("tools[{i}].type"),
                    format!("tools[{i}].type {:?} is not supported: only \"function\"", truncate(&t.kind, 64)),
                ));
            }
            let Some(f) = &t.function else {
                let field = format!("tools[{i}].function");
                return Err(ApiError::invalid(field.clone(), format!("{field} is required: {{name, parameters}}")));
            };
            let name_ok = (1..=64).contains(&f.name.len())
                && f.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
            if !name_ok {
                let field = format!("tools[{i}].function.name");
                return Err(ApiError::invalid(
                    field.clone(),
                    format!("{field} {:?}: 1 to 64 of a-z, A-Z, 0-9, _, - and .", truncate(&f.name, 80)),
                ));
            }
            if tools.iter().any(|o| o.name == f.name) {
                let field = format!("tools[{i}].function.name");
                return Err(ApiError::invalid(field.clone(), format!("{field}: {:?} is offered twice", f.name)));
            }
            let parameters = match &f.parameters {
                None => serde_json::json!({"type": "object", "properties": {}}),
                Some(p) => schema_object(&format!("tools[{i}].function.parameters"), p)?,
            };
            tools.push(Tool { name: f.name.clone(), description: f.description.clone(), parameters });
        }
        let choice = match &self.tool_choice {
            None | Some(serde_json::Value::Null) => ToolChoice::Auto,
            Some(serde_json::Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!(
                            "tool_choice {:?} is not one of \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                            truncate(other, 64)
                        ),
                    ))
                }
            },
            Some(v) => match v.pointer("/function/name").and_then(|n| n.as_str()) {
                Some(name) if v.get("type").and_then(|t| t.as_str()) == Some("function") => {
                    ToolChoice::Named(name.to_owned())
                }
                _ => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    ))
                }
            },
        };
        if let ToolChoice::Named(name) = &choice {
            if !tools.iter().any(|t| &t.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice names {:?}, which tools does not offer", truncate(name, 64)),
                ));
            }
        }
        if tools.is_empty() {
            return match choice {
                ToolChoice::Required | ToolChoice::Named(_) => {
                    Err(ApiError::invalid("tool_choice", "tool_choice asks for a call but tools is empty"))
                }
                _ => Ok(None),
            };
        }
        if choice == ToolChoice::None {
            return Ok(None);
        }
        Ok(Some(ToolRequest { tools, choice, parallel: self.parallel_tool_calls.unwrap_or(true) }))
    }

    /// What the reply must follow: `response_format` (`json_object`, `json_schema`), or llama.cpp's
    /// `grammar` / `json_schema`; at most one of them. None for plain text.
    pub fn grammar_spec(&self) -> Result<Option<(GrammarSpec, &'static str)>, ApiError> {
        let from_format = match &self.response_format {
            None => None,
            Some(f) => match f.kind.as_str() {
                "text" => None,
                "json_object" => Some(match &f.schema {
                    None => (GrammarSpec::JsonObject, "response_format"),
                    Some(s) => {
                        (GrammarSpec::JsonSchema(schema_object("response_format.schema", s)?), "response_format.schema")
                    }
                }),
                "json_schema" => {
                    let Some(js) = &f.json_schema else {
                        return Err(ApiError::invalid(
                            "response_format.json_schema",
                            "response_format.json_schema is required with type \"json_schema\": {\"name\", \"schema\"}",
                        ));
                    };
                    let schema = match &js.schema {
                        Some(s) => schema_object("response_format.json_schema.schema", s)?,
                        // No schema: any JSON value.
                        None => serde_json::json!({}),
                    };
                    Some((GrammarSpec::JsonSchema(schema), "response_format.json_schema.schema"))
                }
                other => {
                    return Err(ApiError::invalid(
                        "response_format.type",
                        format!(
                        "response_format.type {:?} is not supported: use \"text\", \"json_object\" or \"json_schema\"",
                        truncate(other, 64)
                    ),
                    ))
                }
            },
        };
        let grammar =
            self.grammar.as_ref().filter(|g| !g.trim().is_empty()).map(|g| (GrammarSpec::Gbnf(g.clone()), "grammar"));
        let schema = match &self.json_schema {
            None | Some(serde_json::Value::Null) => None,
            Some(s) => Some((GrammarSpec::JsonSchema(schema_object("json_schema", s)?), "json_schema")),
        };
        let mut given = [from_format, grammar, schema].into_iter().flatten();
        let first = given.next();
        if let Some((_, second)) = given.next() {
            return Err(ApiError::invalid(
                second,
                format!("{second}: send one of response_format, grammar and json_schema"),
            ));
        }
        Ok(first)
    }

    /// The chat template's extra variables: `chat_template_kwargs`, with `enable_thinking` and
    /// `reasoning_effort` added from the top level when it does not name them. The render's own names are
    /// refused.
    pub fn template_kwargs(&self) -> Result<TemplateKwargs, ApiError> {
        let mut kwargs = self.chat_template_kwargs.clone().unwrap_or_default();
        if let Some(name) = kwargs.keys().find(|k| RESERVED_TEMPLATE_NAMES.contains(&k.as_str())) {
            let param = format!("chat_template_kwargs.{name}");
            return Err(ApiError::invalid(
                param.clone(),
                format!("{param}: {name:?} is set by the server; send it in the request itself"),
            ));
        }
        if let Some(on) = self.enable_thinking {
            kwargs.entry("enable_thinking").or_insert(on.into());
        }
        if let Some(effort) = &self.reasoning_effort {
            kwargs.entry("reasoning_effort").or_insert(effort.clone().into());
        }
        Ok(kwargs)
    }

    /// Whether a reply's `<think>` block comes back apart, as `reasoning_content` (`reasoning_format`:
    /// `deepseek` or `auto`, the default), or stays in `content` (`none`).
    pub fn splits_reasoning(&self) -> Result<bool, ApiError> {
        match self.reasoning_format.as_deref() {
            None | Some("auto" | "deepseek") => Ok(true),
            Some("none") => Ok(false),
            Some(other) => Err(ApiError::invalid(
                "reasoning_format",
                format!(
                    "reasoning_format {:?} is not supported: use \"deepseek\", \"auto\" or \"none\"",
                    truncate(other, 64)
                ),
            )),
        }
    }

    pub fn top_logprobs(&self) -> Result<(bool, usize), ApiError> {
        let on = self.logprobs.unwrap_or(false);
        let k = match self.top_logprobs {
            None => 0,
            Some(k) if (0..=MAX_TOP_LOGPROBS as i64).contains(&k) => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    format!("top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {k}"),
                ))
            }
        };
        if k > 0 && !on {
            return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs set to true"));
        }
        Ok((on, k))
    }
}

fn chat_message(i: usize, m: &Message) -> Result<ChatMessage, ApiError> {
    let role = match m.role.as_str() {
        "system" | "developer" => "system",
        "user" => "user",
        "assistant" => "assistant",
        "tool" => "tool",
        "function" => {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!("messages[{i}].role: \"function\" messages (the old API) are not supported: send \"tool\""),
            ))
        }
        other => {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!(
                    "messages[{i}].role: {:?} is not a role: use system, developer, user or assistant",
                    truncate(other, 64)
                ),
            ))
        }
    };
    let content = match &m.content {
        Some(Content::Text(t)) => t.clone(),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => text.push_str(t),
                    ("text", None) => {
                        return Err(ApiError::invalid(
                            format!("messages[{i}].content[{j}].text"),
                            format!("messages[{i}].content[{j}]: a text part needs \"text\""),
                        ))
                    }
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            format!("messages[{i}].content[{j}].type"),
                            format!(
                                "messages[{i}].content[{j}]: {:?} parts are not supported: only \"text\"",
                                truncate(kind, 64)
                            ),
                        ))
                    }
                }
            }
            text
        }
        None if role == "assistant" => String::new(),
        None => {
            return Err(ApiError::invalid(
                format!("messages[{i}].content"),
                format!("messages[{i}].content is required for a {role} message"),
            ))
        }
    };
    let mut message = ChatMessage::new(role, content);
    if role == "tool" {
        let Some(id) = &m.tool_call_id else {
            let field = format!("messages[{i}].tool_call_id");
            return Err(ApiError::invalid(field.clone(), format!("{field} is required for a tool message")));
        };
        message.tool_call_id = Some(id.clone());
    }
    if let Some(name) = &m.name {
        message.name = Some(name.clone());
    }
    if let Some(calls) = &m.tool_calls {
        if role != "assistant" {
            let field = format!("messages[{i}].tool_calls");
            return Err(ApiError::invalid(field.clone(), format!("{field}: only an assistant message makes calls")));
        }
        for (j, c) in calls.iter().enumerate() {
            // Templates read the arguments as an object; OpenAI sends them as JSON text.
            let arguments = match &c.function.arguments {
                serde_json::Value::String(text) => match serde_json::from_str::<serde_json::Value>(text) {
                    Ok(v) => v,
                    Err(e) => {
                        let field = format!("messages[{i}].tool_calls[{j}].function.arguments");
                        return Err(ApiError::invalid(field.clone(), format!("{field} is not JSON: {e}")));
                    }
                },
                other => other.clone(),
            };
            message.tool_calls.push(serde_json::json!({
                "id": c.id.clone().unwrap_or_else(|| format!("call_{i}_{j}")),
                "type": c.kind.clone().unwrap_or_else(|| "function".into()),
                "function": {"name": c.function.name, "arguments": arguments},
            }));
        }
    }
    match (&m.reasoning_content, role) {
        (None, _) => {}
        (Some(r), "assistant") => message.reasoning_content = Some(r.clone()),
        (Some(_), _) => {
            return Err(ApiError::invalid(
                format!("messages[{i}].reasoning_content"),
                format!("messages[{i}].reasoning_content: only an assistant message has reasoning"),
            ))
        }
    }
    Ok(message)
}

impl CompletionRequest {
    pub fn common(&self) -> Common {
        Common {
            max_tokens: self.max_tokens.or(Some(16)), // the legacy endpoint's default
            max_tokens_field: "max_tokens",
            temperature: self.temperature,
            top_p: self.top_p,
            n: self.n,
            seed: self.seed,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            top_k: self.top_k,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            ignore_eos: self.ignore_eos,
            stream: self.stream,
            include_usage: self.stream_options.as_ref().and_then(|o| o.include_usage),
            has_stream_options: self.stream_options.is_some(),
            logit_bias_len: self.logit_bias.as_ref().map_or(0, HashMap::len),
        }
    }

    /// Checks what only completions have: one prompt, echo off, no suffix, best_of 1, logprobs 0..5.
    pub fn check(&self) -> Result<usize, ApiError> {
        if self.echo == Some(true) {
            return Err(ApiError::invalid("echo", "echo=true is not supported: the reply never repeats the prompt"));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "suffix (fill in the middle) is not supported"));
        }
        if let Some(b) = self.best_of {
            if b != 1 && Some(b) != self.n {
                return Err(ApiError::invalid("best_of", format!("best_of must be 1 (or equal n), got {b}")));
            }
        }
        match self.logprobs {
            None => Ok(0),
            Some(k) if (0..=MAX_COMPLETION_LOGPROBS as i64).contains(&k) => Ok(k as usize),
            Some(k) => Err(ApiError::invalid(
                "logprobs",
                format!("logprobs must be an integer from 0 to {MAX_COMPLETION_LOGPROBS}, got {k}"),
            )),
        }
    }
}

/// What the prompt of a completion is: text to tokenize, or tokens (checked against the vocabulary).
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

pub fn prompt_input(p: &Option<Prompt>, n_vocab: usize) -> Result<PromptInput, ApiError> {
    let tokens = |list: &[i64]| -> Result<Vec<u32>, ApiError> {
        if list.is_empty() {
            return Err(ApiError::invalid("prompt", "prompt is an empty token list"));
        }
        token_ids("prompt", list, n_vocab)
    };
    let one = |n: usize| {
        ApiError::invalid("prompt", format!("prompt lists {n} prompts: this server takes one prompt per request"))
    };
    match p {
        None => Err(ApiError::invalid("prompt", "prompt is required: a string or a list of token ids")),
        Some(Prompt::Text(t)) if t.is_empty() => Err(ApiError::invalid("prompt", "prompt is empty")),
        Some(Prompt::Text(t)) => Ok(PromptInput::Text(t.clone())),
        Some(Prompt::Tokens(list)) => Ok(PromptInput::Tokens(tokens(list)?)),
        Some(Prompt::Texts(list)) if list.len() == 1 => prompt_input(&Some(Prompt::Text(list[0].clone())), n_vocab),
        Some(Prompt::Texts(list)) => Err(one(list.len())),
        Some(Prompt::TokenLists(lists)) if lists.len() == 1 => Ok(PromptInput::Tokens(tokens(&lists[0])?)),
        Some(Prompt::TokenLists(lists)) => Err(one(lists.len())),
    }
}

/// Token ids sent as `field` checked against the vocabulary: a bad one is a 400 naming `field[j]`.
pub fn token_ids(field: &str, ids: &[i64], n_vocab: usize) -> Result<Vec<u32>, ApiError> {
    ids.iter()
        .enumerate()
        .map(|(j, &t)| {
            u32::try_from(t).ok().filter(|&t| (t as usize) < n_vocab).ok_or_else(|| {
                ApiError::invalid(
                    format!("{field}[{j}]"),
                    format!(
                        "{field}[{j}]: token {t} is not in the vocabulary (ids 0 to {})",
                        n_vocab.saturating_sub(1)
                    ),
                )
            })
        })
        .collect()
}

/// Stop strings: at most four, none empty.
pub fn stops(stop: &Option<Stop>) -> Result<Vec<String>, ApiError> {
    let list = match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if list.len() > MAX_STOPS {
        return Err(ApiError::invalid("stop", format!("stop lists {} strings: at most {MAX_STOPS}", list.len())));
    }
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    if let Some(long) = list.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(
            "stop",
            format!("a stop string is {} bytes: at most {MAX_STOP_BYTES}", long.len()),
        ));
    }
    Ok(list)
}

/// What one request asks of the engine, checked.
#[derive(Clone, Debug)]
pub struct Checked {
    pub params: GenerateParams,
    pub choices: usize,
    pub stream: bool,
    pub include_usage: bool,
}

fn in_range(field: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) => {
            Err(ApiError::invalid(field, format!("{field} must be a number from {lo} to {hi}, got {x}")))
        }
        v => Ok(v),
    }
}

/// A seed for requests that give none: different every time, as OpenAI's are.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    t ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
}

/// Checks the shared fields and builds the engine's parameters. A sampling field the request sends is used
/// exactly; one it does not send takes the served model's default ([`SamplingDefaults`]: the file's
/// recommendation, its family's preset, or Strata's chain). No max_tokens means up to the end of the context.
pub fn check_common(
    c: &Common,
    stop: &Option<Stop>,
    batch: usize,
    defaults: &SamplingDefaults,
) -> Result<Checked, ApiError> {
    let max_tokens = match c.max_tokens {
        None => usize::MAX,
        Some(m) if m >= 1 => usize::try_from(m).unwrap_or(usize::MAX),
        Some(m) => {
            return Err(ApiError::invalid(
                c.max_tokens_field,
                format!("{} must be at least 1, got {m}", c.max_tokens_field),
            ))
        }
    };
    let temperature = in_range("temperature", c.temperature, 0.0, 2.0)?.unwrap_or(defaults.temperature.value);
    let top_p = in_range("top_p", c.top_p, 0.0, 1.0)?.unwrap_or(defaults.top_p.value);
    let presence = in_range("presence_penalty", c.presence_penalty, -2.0, 2.0)?.unwrap_or(0.0);
    let frequency = in_range("frequency_penalty", c.frequency_penalty, -2.0, 2.0)?.unwrap_or(0.0);
    let min_p = in_range("min_p", c.min_p, 0.0, 1.0)?.unwrap_or(defaults.min_p.value);
    let repeat_penalty = match c.repeat_penalty {
        Some(r) if !(r > 0.0 && r <= 100.0) => {
            return Err(ApiError::invalid("repeat_penalty", format!("repeat_penalty must be > 0 and <= 100, got {r}")))
        }
        r => r.unwrap_or(defaults.repeat_penalty.value),
    };
    let top_k = match c.top_k {
        Some(k) if k < 0 => return Err(ApiError::invalid("top_k", format!("top_k must be 0 (off) or more, got {k}"))),
        k => k.map_or(defaults.top_k.value as usize, |k| usize::try_from(k).unwrap_or(usize::MAX)),
    };
    let repeat_last_n = match c.repeat_last_n {
        Some(n) if !(0..=1 << 20).contains(&n) => {
            return Err(ApiError::invalid("repeat_last_n", format!("repeat_last_n must be from 0 to 1048576, got {n}")))
        }
        n => n.map_or(defaults.repeat_last_n.value as usize, |n| n as usize),
    };
    let choices = match c.n {
        None => 1,
        Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::invalid("n", format!("n must be from 1 to {MAX_CHOICES}, got {n}"))),
    };
    let stream = c.stream.unwrap_or(false);
    if c.has_stream_options && !stream {
        return Err(ApiError::invalid("stream_options", "stream_options is only allowed with stream: true"));
    }
    if c.logit_bias_len > 0 {
        return Err(ApiError::invalid("logit_bias", "logit_bias is not supported"));
    }
    let seed = c.seed.map_or_else(fresh_seed, |s| s as u64);
    Ok(Checked {
        params: GenerateParams {
            max_tokens,
            sampler: SamplerConfig {
                temperature: temperature as f32,
                top_k,
                top_p: top_p as f32,
                min_p: min_p as f32,
                repeat_penalty: repeat_penalty as f32,
                repeat_last_n,
                presence_penalty: presence as f32,
                frequency_penalty: frequency as f32,
                seed,
            },
            ignore_eos: c.ignore_eos.unwrap_or(false),
            stop: stops(stop)?,
            top_logprobs: 0,
            logprobs: false,
            post_sampling: false,
            batch,
            grammar: None,
        },
        choices,
        stream,
        include_usage: c.include_usage.unwrap_or(false),
    })
}

/// A JSON schema as a request field gives it: an object (or `true`, any value).
pub fn schema_object(field: &str, v: &serde_json::Value) -> Result<serde_json::Value, ApiError> {
    match v {
        serde_json::Value::Object(_) => Ok(v.clone()),
        serde_json::Value::Bool(true) => Ok(serde_json::json!({})),
        other => Err(ApiError::invalid(
            field,
            format!("{field} must be a JSON schema (an object), got {}", truncate(&other.to_string(), 64)),
        )),
    }
}

/// At most `n` characters of `s`, for echoing client text in an error.
pub fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<ChatRequest, ApiError> {
        parse(body.as_bytes())
    }

    #[test]
    fn wrong_fields_are_named() {
        let e = chat(r#"{"messages":[{"role":"user","content":"hi"}],"temperature":"hot"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(e.message.contains("invalid type"), "{}", e.message);
        let e = chat(r#"{"messages":[{"role":"user","content":5}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        let e = chat(r#"{"messages":[],"colour":1}"#).unwrap_err();
        assert!(e.message.contains("unknown field `colour`"), "{}", e.message);
        let e = chat(r#"{"messages":[{"role":"user","content":"hi"}]"#).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (400, Some("invalid_json")));
        let e = chat(r#"{"messages":[]} trailing"#).unwrap_err();
        assert_eq!(e.code, Some("invalid_json"));
        let e = chat("").unwrap_err();
        assert!(e.message.contains("empty"));
    }

    #[test]
    fn messages_and_ranges_are_checked() {
        let r = chat(r#"{"messages":[{"role":"wizard","content":"hi"}]}"#).unwrap();
        assert_eq!(r.chat_messages().unwrap_err().param.as_deref(), Some("messages[0].role"));
        let r = chat(r#"{"messages":[]}"#).unwrap();
        assert!(r.chat_messages().unwrap_err().message.contains("empty"));
        let r = chat(
            r#"{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap();
        let m = r.chat_messages().unwrap();
        assert_eq!((m[0].role.as_str(), m[0].content.as_str()), ("system", "ab"));
        for (body, param) in [
            (r#"{"temperature":-1}"#, "temperature"),
            (r#"{"temperature":2.5}"#, "temperature"),
            (r#"{"max_tokens":0}"#, "max_tokens"),
            (r#"{"max_completion_tokens":-5}"#, "max_completion_tokens"),
            (r#"{"n":9}"#, "n"),
            (r#"{"top_p":1.5}"#, "top_p"),
            (r#"{"stop":["a","b","c","d","e"]}"#, "stop"),
            (r#"{"stop":""}"#, "stop"),
            (r#"{"stream_options":{"include_usage":true}}"#, "stream_options"),
            (r#"{"top_k":-1}"#, "top_k"),
        ] {
            let r = chat(body).unwrap();
            let e = check_common(&r.common(), &r.stop, 512, &SamplingDefaults::fallback()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
        }
        let r = chat(r#"{"logprobs":false,"top_logprobs":3}"#).unwrap();
        assert!(r.top_logprobs().is_err());
        let r = chat(r#"{"max_tokens":1000000000000,"seed":-3,"temperature":0}"#).unwrap();
        let c = check_common(&r.common(), &r.stop, 512, &SamplingDefaults::fallback()).unwrap();
        assert_eq!((c.params.max_tokens, c.params.sampler.seed), (1_000_000_000_000, (-3i64) as u64));
    }

    #[test]
    fn unsent_sampling_fields_take_the_model_defaults_and_sent_ones_are_exact() {
        use crate::sample::defaults::{SamplingSource, Sourced};
        let mut d = SamplingDefaults::fallback();
        d.temperature = Sourced { value: 0.2, source: SamplingSource::Preset };
        d.top_p = Sourced { value: 0.9, source: SamplingSource::Preset };
        d.repeat_penalty = Sourced { value: 1.1, source: SamplingSource::Model };
        let r = chat(r#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        let s = check_common(&r.common(), &r.stop, 512, &d).unwrap().params.sampler;
        assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p, s.repeat_penalty), (0.2, 0.9, 40, 0.05, 1.1));
        let r = chat(r#"{"temperature":1,"top_p":1,"top_k":0,"min_p":0,"repeat_penalty":1}"#).unwrap();
        let s = check_common(&r.common(), &r.stop, 512, &d).unwrap().params.sampler;
        assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p, s.repeat_penalty), (1.0, 1.0, 0, 0.0, 1.0));
    }

    #[test]
    fn template_kwargs_and_reasoning_format() {
        let r = chat(r#"{"chat_template_kwargs":{"enable_thinking":false,"x":[1]},"enable_thinking":true}"#).unwrap();
        let k = r.template_kwargs().unwrap();
        assert_eq!(serde_json::Value::Object(k), serde_json::json!({"enable_thinking": false, "x": [1]}));
        let r = chat(r#"{"enable_thinking":false,"reasoning_effort":"low"}"#).unwrap();
        let k = r.template_kwargs().unwrap();
        assert_eq!(
            serde_json::Value::Object(k),
            serde_json::json!({"enable_thinking": false, "reasoning_effort": "low"})
        );
        let r = chat(r#"{"chat_template_kwargs":{"messages":[]}}"#).unwrap();
        assert_eq!(r.template_kwargs().unwrap_err().param.as_deref(), Some("chat_template_kwargs.messages"));
        let e = chat(r#"{"chat_template_kwargs":[1]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("chat_template_kwargs"));
        assert!(chat(r#"{}"#).unwrap().splits_reasoning().unwrap());
        assert!(chat(r#"{"reasoning_format":"deepseek"}"#).unwrap().splits_reasoning().unwrap());
        assert!(!chat(r#"{"reasoning_format":"none"}"#).unwrap().splits_reasoning().unwrap());
        let e = chat(r#"{"reasoning_format":"magic"}"#).unwrap().splits_reasoning().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning_format"));
        let r = chat(r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a","reasoning_content":"r"}]}"#)
            .unwrap();
        let m = r.chat_messages().unwrap();
        assert_eq!((m[0].reasoning_content.as_deref(), m[1].reasoning_content.as_deref()), (None, Some("r")));
        let r = chat(r#"{"messages":[{"role":"user","content":"q","reasoning_content":"r"}]}"#).unwrap();
        assert_eq!(r.chat_messages().unwrap_err().param.as_deref(), Some("messages[0].reasoning_content"));
    }

    #[test]
    fn completion_prompts() {
        let p = |s: &str| prompt_input(&parse::<CompletionRequest>(s.as_bytes()).unwrap().prompt, 100);
        assert!(matches!(p(r#"{"prompt":"hi"}"#), Ok(PromptInput::Text(_))));
        assert!(matches!(p(r#"{"prompt":[1,2,3]}"#), Ok(PromptInput::Tokens(t)) if t == [1, 2, 3]));
        assert!(matches!(p(r#"{"prompt":[[1,2]]}"#), Ok(PromptInput::Tokens(t)) if t == [1, 2]));
        assert_eq!(p(r#"{"prompt":[1,100]}"#).err().unwrap().param.as_deref(), Some("prompt[1]"));
        assert!(p(r#"{"prompt":["a","b"]}"#).is_err());
        assert!(p(r#"{"prompt":[]}"#).is_err());
        assert!(p(r#"{}"#).is_err());
    }
}
