//! Anthropic's Messages API, `POST /v1/messages` (and `/v1/messages/count_tokens`): text, thinking, tools and
//! streaming events, so that clients written for Anthropic work unchanged. A request becomes the chat
//! request it means (`system` the system message, `tool_use` / `tool_result` blocks the tool turns,
//! `tool_choice` any / tool / none the OpenAI choices, `thinking` the template's `enable_thinking`) and goes
//! the chat path (`api::prepare_chat`); only the answer's shape is Anthropic's. Images are refused by name.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::engine::StopReason;
use crate::tokenizer::reasoning::{split_reply, ReasoningSplitter};
use crate::tools::{self, ToolCall, ToolSplitter};

use super::api::{self, collect, first_message, prepare_chat, read_body, Reply};
use super::error::ApiError;
use super::fair::Peer;
use super::openai::{self, ChatRequest};
use super::worker::Msg;
use super::App;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    pub model: Option<String>,
    pub messages: Option<Vec<Value>>,
    pub system: Option<Value>,
    pub max_tokens: Option<i64>,
    pub stop_sequences: Option<Vec<String>>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub thinking: Option<Value>,
    pub metadata: Option<Value>,
    pub service_tier: Option<String>,
    // Accepted and without effect here.
    pub container: Option<IgnoredAny>,
    pub mcp_servers: Option<IgnoredAny>,
    pub cache_control: Option<IgnoredAny>,
    pub inference_geo: Option<IgnoredAny>,
    pub speed: Option<IgnoredAny>,
    pub user_profile_id: Option<IgnoredAny>,
    pub workspace_id: Option<IgnoredAny>,
    pub diagnostics: Option<IgnoredAny>,
}

fn invalid(field: impl Into<String>, what: impl std::fmt::Display) -> ApiError {
    let field = field.into();
    ApiError::invalid(field.clone(), format!("{field}: {what}"))
}

/// The text of a `content` that is a string or a list of text blocks.
fn text_of(field: &str, c: &Value) -> Result<String, ApiError> {
    match c {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut t = String::new();
            for (j, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(x)) => t.push_str(x),
                    (kind, _) => {
                        return Err(invalid(
                            format!("{field}[{j}]"),
                            format!("{kind:?} blocks are not supported here: only text"),
                        ))
                    }
                }
            }
            Ok(t)
        }
        _ => Err(invalid(field, "must be a string or a list of text blocks")),
    }
}

/// The chat messages of `system` and `messages`.
fn messages(req: &MessagesRequest) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(s) = &req.system {
        out.push(json!({"role": "system", "content": text_of("system", s)?}));
    }
    let Some(list) = &req.messages else { return Err(invalid("messages", "is required")) };
    if list.is_empty() {
        return Err(invalid("messages", "is empty: send at least one message"));
    }
    for (i, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        if role != "user" && role != "assistant" {
            return Err(invalid(
                format!("messages[{i}].role"),
                format!("{role:?} is not a role: use user or assistant"),
            ));
        }
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                out.push(json!({"role": role, "content": s}));
                continue;
            }
            Some(Value::Array(b)) => b,
            _ => return Err(invalid(format!("messages[{i}].content"), "must be a string or a list of blocks")),
        };
        let (mut text, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
        for (j, b) in blocks.iter().enumerate() {
            let field = format!("messages[{i}].content[{j}]");
            let s = |k: &str| b.get(k).and_then(Value::as_str);
            match b.get("type").and_then(Value::as_str).unwrap_or_default() {
                "text" => text.push_str(s("text").unwrap_or_default()),
                "thinking" => thinking.push_str(s("thinking").unwrap_or_default()),
                "redacted_thinking" => {}
                "tool_use" if role == "assistant" => {
                    let input = b.get("input").cloned().unwrap_or(json!({}));
                    calls.push(json!({"id": s("id").unwrap_or_default(), "type": "function",
                        "function": {"name": s("name").unwrap_or_default(), "arguments": input.to_string()}}));
                }
                "tool_result" if role == "user" => {
                    let mut content = match b.get("content") {
                        None => String::new(),
                        Some(c) => text_of(&format!("{field}.content"), c)?,
                    };
                    if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                        content = format!("Error: {content}");
                    }
                    out.push(json!({"role": "tool", "tool_call_id": s("tool_use_id").unwrap_or_default(), "content": content}));
                }
                other => {
                    return Err(invalid(
                        format!("{field}.type"),
                        format!("{other:?} blocks are not supported in a {role} message"),
                    ))
                }
            }
        }
        if role == "assistant" {
            let mut a = json!({"role": "assistant", "content": text});
            if !thinking.is_empty() {
                a["reasoning_content"] = json!(thinking);
            }
            if !calls.is_empty() {
                a["tool_calls"] = Value::Array(calls);
            }
            out.push(a);
        } else if !text.is_empty() {
            out.push(json!({"role": "user", "content": text}));
        }
    }
    Ok(out)
}

fn chat_request(req: &MessagesRequest) -> Result<ChatRequest, ApiError> {
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages(req)?));
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            chat.insert(k.into(), v);
        }
    };
    put("model", req.model.clone().map(Value::from));
    put("max_tokens", req.max_tokens.map(Value::from));
    put("temperature", req.temperature.map(Value::from));
    put("top_p", req.top_p.map(Value::from));
    put("top_k", req.top_k.map(Value::from));
    put("stop", req.stop_sequences.clone().filter(|s| !s.is_empty()).map(|s| json!(s)));
    put("user", req.metadata.as_ref().and_then(|m| m.get("user_id")).cloned());
    if let Some(tools) = &req.tools {
        let mut list = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            if let Some(kind) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
                return Err(invalid(
                    format!("tools[{i}].type"),
                    format!("{kind:?} tools are not supported: only custom tools"),
                ));
            }
            let mut f = Map::new();
            f.insert("name".into(), t.get("name").cloned().unwrap_or(Value::Null));
            if let Some(d) = t.get("description") {
                f.insert("description".into(), d.clone());
            }
            if let Some(s) = t.get("input_schema") {
                f.insert("parameters".into(), s.clone());
            }
            list.push(json!({"type": "function", "function": f}));
        }
        chat.insert("tools".into(), Value::Array(list));
    }
    if let Some(c) = &req.tool_choice {
        let choice = match c.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => {
                json!({"type": "function", "function": {"name": c.get("name").cloned().unwrap_or(Value::Null)}})
            }
            _ => return Err(invalid("tool_choice", "must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}")),
        };
        chat.insert("tool_choice".into(), choice);
        if c.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
            chat.insert("parallel_tool_calls".into(), Value::Bool(false));
        }
    }
    if let Some(t) = &req.thinking {
        let on = t.get("type").and_then(Value::as_str) == Some("enabled");
        chat.insert("enable_thinking".into(), Value::Bool(on));
    }
    chat.insert("stream".into(), Value::Bool(req.stream.unwrap_or(false)));
    serde_json::from_value(Value::Object(chat)).map_err(|e| invalid("messages", e))
}

async fn prepare(
    app: &App,
    peer: Option<Peer>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(MessagesRequest, api::Queued, Reply), ApiError> {
    let bytes = read_body(headers, body, app.opts.max_body_bytes, app.opts.body_timeout).await?;
    let req: MessagesRequest = openai::parse(&bytes)?;
    drop(bytes);
    let chat = chat_request(&req)?;
    let (mut queued, reply) = prepare_chat(app, peer, chat).await?;
    queued.endpoint = "messages";
    Ok((req, queued, reply))
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, as the request would be rendered.
pub async fn count_tokens(
    State(app): State<App>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = async {
        let (_, queued, _) = prepare(&app, peer.map(|p| p.0), &headers, body).await?;
        Ok(Json(json!({"input_tokens": queued.prompt.len()})).into_response())
    }
    .await;
    api::respond(&app, r)
}

pub async fn messages_endpoint(
    State(app): State<App>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = messages_inner(&app, peer.map(|p| p.0), &headers, body).await;
    api::respond(&app, r)
}

async fn messages_inner(app: &App, peer: Option<Peer>, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    api::check_admission(app)?;
    let _permit = app.shared.preparing.try_acquire().map_err(|_| ApiError::queue_full(app.shared.queue_cap))?;
    // The model does not change until the request is queued (a switch waits for it, and it for a switch).
    let lease = app.models.lease().await?;
    let (_req, queued, reply) = prepare(app, peer, headers, body).await?;
    let id = format!("msg_{}", api::request_id("m").trim_start_matches("m-"));
    let input_tokens = queued.prompt.len();
    let (mut rx, guard) = api::submit(app, queued, reply.checked.clone())?;
    drop(lease);
    if reply.checked.stream {
        let first = first_message(&mut rx).await?;
        return Ok(stream(id, input_tokens, reply, first, rx, guard).into_response());
    }
    let _guard = guard;
    let (choices, summary) = collect(&mut rx, 1).await?;
    let (stop, text, _) = choices.into_iter().next().flatten().unwrap_or((StopReason::Eog, String::new(), Vec::new()));
    let (thinking, content) = match reply.reasoning {
        Some(inside) => {
            let s = split_reply(&text, inside);
            (s.reasoning, s.content)
        }
        None => (String::new(), text),
    };
    let (content, calls) = match reply.tools {
        Some(f) => tools::parse_reply(f, &content),
        None => (content, Vec::new()),
    };
    let mut blocks = Vec::new();
    if !thinking.is_empty() {
        blocks.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if !content.is_empty() || calls.is_empty() {
        blocks.push(json!({"type": "text", "text": content}));
    }
    blocks.extend(calls.iter().enumerate().map(|(k, c)| tool_use(&id, k, c)));
    Ok(Json(json!({
        "id": id, "type": "message", "role": "assistant", "model": reply.model, "content": blocks,
        "stop_reason": stop_reason(stop, !calls.is_empty()), "stop_sequence": null,
        "usage": {"input_tokens": summary.prompt_tokens, "output_tokens": summary.completion_tokens,
                  "cache_read_input_tokens": summary.reused, "cache_creation_input_tokens": 0},
    }))
    .into_response())
}

fn stop_reason(stop: StopReason, called: bool) -> &'static str {
    match stop {
        _ if called => "tool_use",
        StopReason::Eog | StopReason::Cancelled => "end_turn",
        StopReason::Stop => "stop_sequence",
        StopReason::Length | StopReason::Context => "max_tokens",
    }
}

fn tool_use(id: &str, k: usize, c: &ToolCall) -> Value {
    let input: Value = serde_json::from_str(&c.arguments).unwrap_or(json!({}));
    json!({"type": "tool_use", "id": format!("toolu_{}_{k}", id.trim_start_matches("msg_")), "name": c.name, "input": input})
}

/// The events of a streamed message: blocks opened, filled and closed as the reply's kinds change.
struct Events {
    id: String,
    pending: VecDeque<Event>,
    reasoning: Option<ReasoningSplitter>,
    tools: Option<ToolSplitter>,
    /// The open block's kind ("thinking", "text") and the next block's index.
    open: Option<&'static str>,
    next: usize,
    calls: usize,
    stop: Option<StopReason>,
    done: bool,
}

impl Events {
    fn push(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        self.pending.push_back(Event::default().event(kind).data(data.to_string()));
    }

    fn close(&mut self) {
        if self.open.take().is_some() {
            self.push("content_block_stop", json!({"index": self.next - 1}));
        }
    }

    fn delta(&mut self, kind: &'static str, text: &str) {
        if text.is_empty() {
            return;
        }
        if self.open != Some(kind) {
            self.close();
            let block = if kind == "thinking" {
                json!({"type": "thinking", "thinking": "", "signature": ""})
            } else {
                json!({"type": "text", "text": ""})
            };
            self.push("content_block_start", json!({"index": self.next, "content_block": block}));
            self.open = Some(kind);
            self.next += 1;
        }
        let delta = if kind == "thinking" {
            json!({"type": "thinking_delta", "thinking": text})
        } else {
            json!({"type": "text_delta", "text": text})
        };
        self.push("content_block_delta", json!({"index": self.next - 1, "delta": delta}));
    }

    fn call(&mut self, c: &ToolCall) {
        self.close();
        let mut block = tool_use(&self.id, self.calls, c);
        self.calls += 1;
        let input = block["input"].to_string();
        block["input"] = json!({});
        self.push("content_block_start", json!({"index": self.next, "content_block": block}));
        self.push(
            "content_block_delta",
            json!({"index": self.next, "delta": {"type": "input_json_delta", "partial_json": input}}),
        );
        self.push("content_block_stop", json!({"index": self.next}));
        self.next += 1;
    }

    fn piece(&mut self, text: &str, last: bool) {
        let (thinking, mut content) = match &mut self.reasoning {
            Some(r) => {
                let mut s = r.push(text);
                if last {
                    let end = r.finish();
                    s.reasoning.push_str(&end.reasoning);
                    s.content.push_str(&end.content);
                }
                (s.reasoning, s.content)
            }
            None => (String::new(), text.to_owned()),
        };
        self.delta("thinking", &thinking);
        let mut calls = Vec::new();
        if let Some(ts) = &mut self.tools {
            let mut t = ts.push(&content);
            if last {
                let end = ts.finish();
                t.content.push_str(&end.content);
                t.calls.extend(end.calls);
            }
            content = t.content;
            calls = t.calls;
        }
        self.delta("text", &content);
        calls.iter().for_each(|c| self.call(c));
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Text { text, .. } => self.piece(&text, false),
            Msg::ChoiceDone { stop_reason, .. } => {
                self.piece("", true);
                if self.next == 0 {
                    // An empty reply is one empty text block.
                    self.push(
                        "content_block_start",
                        json!({"index": 0, "content_block": {"type": "text", "text": ""}}),
                    );
                    self.open = Some("text");
                    self.next = 1;
                }
                self.close();
                self.stop = Some(stop_reason);
            }
            Msg::Done(s) => {
                let stop = stop_reason(self.stop.unwrap_or(StopReason::Eog), self.calls > 0);
                self.push(
                    "message_delta",
                    json!({"delta": {"stop_reason": stop, "stop_sequence": null},
                    "usage": {"output_tokens": s.completion_tokens}}),
                );
                self.push("message_stop", json!({}));
                self.done = true;
            }
            Msg::Embeddings(..) => self.handle(Msg::Error(Msg::not_generated())),
            Msg::Error(e) => {
                self.push("error", json!({"error": {"type": "api_error", "message": e.message}}));
                self.done = true;
            }
        }
    }
}

impl api::EventSource for Events {
    fn on(&mut self, msg: Msg) {
        self.handle(msg)
    }

    fn pending(&mut self) -> &mut VecDeque<Event> {
        &mut self.pending
    }

    fn done(&self) -> bool {
        self.done
    }
}

fn stream(
    id: String,
    input_tokens: usize,
    reply: Reply,
    first: Msg,
    rx: tokio::sync::mpsc::Receiver<Msg>,
    guard: super::worker::TicketGuard,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let mut ev = Events {
        id: id.clone(),
        pending: VecDeque::new(),
        reasoning: reply.reasoning.map(ReasoningSplitter::new),
        tools: reply.tools.map(ToolSplitter::new),
        open: None,
        next: 0,
        calls: 0,
        stop: None,
        done: false,
    };
    ev.push(
        "message_start",
        json!({"message": {"id": id, "type": "message", "role": "assistant", "content": [],
        "model": reply.model, "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0}}}),
    );
    ev.push("ping", json!({}));
    api::event_stream(ev, first, rx, guard)
}
