//! OpenAI's Responses API, `POST /v1/responses`: its text and function-call subset, whole or streamed as its
//! typed events. A request becomes the chat request it means (`instructions` the system message, `input`
//! items the messages, function calls and their outputs the tool turns, `text.format` the response format)
//! and goes the chat path (`api::prepare_chat`); only the answer's shape is this API's.
//!
//! The server keeps no state between requests: `previous_response_id`, `background` and stored responses
//! are refused by name (send the whole conversation in `input`), as are tools other than functions.

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
use crate::telemetry::Summary;
use crate::tokenizer::reasoning::{split_reply, ReasoningSplitter};
use crate::tools::{self, ToolCall, ToolSplitter};

use super::api::{self, collect, first_message, prepare_chat, read_body, unix_now, Reply};
use super::error::ApiError;
use super::fair::Peer;
use super::openai::{self, ChatRequest};
use super::worker::Msg;
use super::App;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Option<Value>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<Value>,
    pub user: Option<String>,
    pub previous_response_id: Option<String>,
    pub background: Option<bool>,
    // Accepted and without effect here.
    pub metadata: Option<IgnoredAny>,
    pub store: Option<bool>,
    pub reasoning: Option<IgnoredAny>,
    pub include: Option<IgnoredAny>,
    pub truncation: Option<String>,
    pub service_tier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub safety_identifier: Option<String>,
    pub stream_options: Option<IgnoredAny>,
    pub max_tool_calls: Option<i64>,
    pub top_logprobs: Option<i64>,
    // llama-server's extensions, passed on as the chat path takes them.
    pub seed: Option<i64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub timings_per_token: Option<bool>,
    pub return_progress: Option<bool>,
}

fn invalid(field: impl Into<String>, what: impl std::fmt::Display) -> ApiError {
    let field = field.into();
    ApiError::invalid(field.clone(), format!("{field}: {what}"))
}

/// The text of a message's `content`: a string, or parts of type `input_text`, `output_text` or `text`.
fn content_text(field: &str, c: &Value) -> Result<String, ApiError> {
    match c {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or_default();
                match (kind, p.get("text").and_then(Value::as_str)) {
                    ("input_text" | "output_text" | "text", Some(t)) => text.push_str(t),
                    _ => {
                        return Err(invalid(
                            format!("{field}[{j}]"),
                            format!("{kind:?} parts are not supported: only input_text and output_text"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(invalid(field, "must be a string or a list of text parts")),
    }
}

/// The chat messages `input` (and `instructions`) mean.
fn messages(req: &ResponsesRequest) -> Result<Vec<Value>, ApiError> {
    let mut out: Vec<Value> = Vec::new();
    if let Some(i) = &req.instructions {
        out.push(json!({"role": "system", "content": i}));
    }
    let items = match &req.input {
        None => return Err(invalid("input", "is required: a string or a list of items")),
        Some(Value::String(s)) => {
            return Ok({
                out.push(json!({"role": "user", "content": s}));
                out
            })
        }
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid("input", "must be a string or a list of items")),
    };
    for (i, item) in items.iter().enumerate() {
        let field = format!("input[{i}]");
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        let text = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_owned);
        match kind {
            "message" => {
                let role = text("role").ok_or_else(|| invalid(format!("{field}.role"), "is required"))?;
                let content = content_text(&format!("{field}.content"), item.get("content").unwrap_or(&Value::Null))?;
                out.push(json!({"role": role, "content": content}));
            }
            "function_call" => {
                let (Some(name), Some(arguments)) = (text("name"), text("arguments")) else {
                    return Err(invalid(field, "a function_call needs name and arguments"));
                };
                let call = json!({"id": text("call_id").unwrap_or_default(), "type": "function",
                    "function": {"name": name, "arguments": arguments}});
                // Calls in a row are one assistant turn.
                let earlier = out
                    .last_mut()
                    .filter(|prev| prev["role"] == "assistant")
                    .and_then(|prev| prev.get_mut("tool_calls"))
                    .and_then(Value::as_array_mut);
                match earlier {
                    Some(calls) => calls.push(call),
                    None => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(o) => content_text(&format!("{field}.output"), o)?,
                    None => return Err(invalid(format!("{field}.output"), "is required")),
                };
                out.push(
                    json!({"role": "tool", "tool_call_id": text("call_id").unwrap_or_default(), "content": output}),
                );
            }
            // A reasoning item of an earlier response: the chat template decides what to keep of it.
            "reasoning" => {}
            other => return Err(invalid(format!("{field}.type"), format!("{other:?} items are not supported"))),
        }
    }
    Ok(out)
}

/// The chat request a Responses request means.
fn chat_request(req: &ResponsesRequest) -> Result<ChatRequest, ApiError> {
    if req.previous_response_id.is_some() {
        return Err(invalid(
            "previous_response_id",
            "this server keeps no responses: send the whole conversation in input",
        ));
    }
    if req.background == Some(true) {
        return Err(invalid("background", "background responses are not supported"));
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages(req)?));
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            chat.insert(k.into(), v);
        }
    };
    put("model", req.model.clone().map(Value::from));
    put("max_tokens", req.max_output_tokens.map(Value::from));
    put("temperature", req.temperature.map(Value::from));
    put("top_p", req.top_p.map(Value::from));
    put("user", req.user.clone().map(Value::from));
    put("parallel_tool_calls", req.parallel_tool_calls.map(Value::from));
    put("seed", req.seed.map(Value::from));
    put("top_k", req.top_k.map(Value::from));
    put("min_p", req.min_p.map(Value::from));
    put("repeat_penalty", req.repeat_penalty.map(Value::from));
    if let Some(tools) = &req.tools {
        let mut list = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or_default();
            if kind != "function" {
                return Err(invalid(
                    format!("tools[{i}].type"),
                    format!("{kind:?} tools are not supported: only function"),
                ));
            }
            let mut f = Map::new();
            for k in ["name", "description", "parameters", "strict"] {
                if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                    f.insert(k.into(), v.clone());
                }
            }
            list.push(json!({"type": "function", "function": f}));
        }
        chat.insert("tools".into(), Value::Array(list));
    }
    if let Some(c) = &req.tool_choice {
        let c = match c.get("name") {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => c.clone(),
        };
        chat.insert("tool_choice".into(), c);
    }
    if let Some(format) = req.text.as_ref().and_then(|t| t.get("format")) {
        let rf = match format.get("type").and_then(Value::as_str) {
            Some("text") | None => None,
            Some("json_object") => Some(json!({"type": "json_object"})),
            Some("json_schema") => {
                let mut js = Map::new();
                for k in ["name", "description", "schema", "strict"] {
                    if let Some(v) = format.get(k) {
                        js.insert(k.into(), v.clone());
                    }
                }
                Some(json!({"type": "json_schema", "json_schema": js}))
            }
            Some(other) => return Err(invalid("text.format.type", format!("{other:?} is not supported"))),
        };
        if let Some(rf) = rf {
            chat.insert("response_format".into(), rf);
        }
    }
    chat.insert("stream".into(), Value::Bool(req.stream.unwrap_or(false)));
    serde_json::from_value(Value::Object(chat)).map_err(|e| invalid("input", e))
}

pub async fn responses(
    State(app): State<App>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = responses_inner(&app, peer.map(|p| p.0), &headers, body).await;
    api::respond(&app, r)
}

async fn responses_inner(app: &App, peer: Option<Peer>, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    api::check_admission(app)?;
    let _permit = app.shared.preparing.try_acquire().map_err(|_| ApiError::queue_full(app.shared.queue_cap))?;
    let bytes = read_body(headers, body, app.opts.max_body_bytes, app.opts.body_timeout).await?;
    let req: ResponsesRequest = openai::parse(&bytes)?;
    drop(bytes);
    // The model does not change until the request is queued (a switch waits for it, and it for a switch).
    let lease = app.models.lease().await?;
    let chat = chat_request(&req)?;
    let (mut queued, reply) = prepare_chat(app, peer, chat).await?;
    queued.endpoint = "responses";
    let head = Head::new(&reply, &req);
    let (mut rx, guard) = api::submit(app, queued, reply.checked.clone())?;
    drop(lease);
    if reply.checked.stream {
        let first = first_message(&mut rx).await?;
        return Ok(stream(head, reply, first, rx, guard).into_response());
    }
    let _guard = guard;
    let (choices, summary) = collect(&mut rx, 1).await?;
    let (stop, text, _) = choices.into_iter().next().flatten().unwrap_or((StopReason::Eog, String::new(), Vec::new()));
    let content = match reply.reasoning {
        Some(inside) => split_reply(&text, inside).content,
        None => text,
    };
    let (content, calls) = match reply.tools {
        Some(f) => tools::parse_reply(f, &content),
        None => (content, Vec::new()),
    };
    let mut output = Vec::new();
    if !content.is_empty() || calls.is_empty() {
        output.push(head.message_item(0, &content, "completed"));
    }
    for (k, c) in calls.iter().enumerate() {
        output.push(head.call_item(k, c, "completed"));
    }
    Ok(Json(head.response("completed", stop, output, Some(&summary))).into_response())
}

/// What every event and the final object repeat: ids, the model, the request's settings.
struct Head {
    id: String,
    created: u64,
    model: String,
    settings: Value,
}

impl Head {
    fn new(reply: &Reply, req: &ResponsesRequest) -> Head {
        let s = &reply.checked.params.sampler;
        let settings = json!({
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "tools": req.tools.clone().unwrap_or_default(),
            "tool_choice": req.tool_choice.clone().unwrap_or(json!("auto")),
            "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
            "text": req.text.clone().unwrap_or(json!({"format": {"type": "text"}})),
            "store": false,
            "metadata": {},
        });
        let n = api::request_id("resp");
        let id = format!("resp_{}", n.trim_start_matches("resp-"));
        Head { id, created: unix_now(), model: reply.model.clone(), settings }
    }

    fn item_id(&self, kind: &str, k: usize) -> String {
        format!("{kind}_{}_{k}", self.id.trim_start_matches("resp_"))
    }

    fn message_item(&self, k: usize, text: &str, status: &str) -> Value {
        json!({"type": "message", "id": self.item_id("msg", k), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]})
    }

    fn call_item(&self, k: usize, c: &ToolCall, status: &str) -> Value {
        json!({"type": "function_call", "id": self.item_id("fc", k), "call_id": self.item_id("call", k),
            "name": c.name, "arguments": c.arguments, "status": status})
    }

    /// The response object; `stop` None while it runs.
    fn response(
        &self,
        status: &str,
        stop: impl Into<Option<StopReason>>,
        output: Vec<Value>,
        usage: Option<&Summary>,
    ) -> Value {
        let stop = stop.into();
        let cut = matches!(stop, Some(StopReason::Length | StopReason::Context));
        let status = if cut { "incomplete" } else { status };
        let mut v = json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": output, "error": null,
            "incomplete_details": if cut { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "usage": usage.map(|s| json!({
                "input_tokens": s.prompt_tokens,
                "input_tokens_details": {"cached_tokens": s.reused},
                "output_tokens": s.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": s.reasoning_tokens},
                "total_tokens": s.prompt_tokens + s.completion_tokens,
            })),
        });
        if let (Value::Object(o), Value::Object(settings)) = (&mut v, &self.settings) {
            o.extend(settings.clone());
        }
        v
    }
}

/// The typed events of a streamed response.
struct Events {
    head: Head,
    seq: u64,
    pending: VecDeque<Event>,
    reasoning: Option<ReasoningSplitter>,
    tools: Option<ToolSplitter>,
    /// The message item's text so far; whether its item was opened.
    text: String,
    message_open: bool,
    /// Items in the output, in order (the message first when there is text).
    output: Vec<Value>,
    calls: usize,
    /// Why the reply ended, once it has.
    stop: Option<StopReason>,
    done: bool,
}

impl Events {
    fn push(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.pending.push_back(Event::default().event(kind).data(data.to_string()));
    }

    fn open_message(&mut self) {
        if !self.message_open {
            self.message_open = true;
            let mut item = self.head.message_item(0, "", "in_progress");
            item["content"] = json!([]);
            self.push("response.output_item.added", json!({"output_index": self.output.len(), "item": item}));
            self.push(
                "response.content_part.added",
                json!({"item_id": self.head.item_id("msg", 0),
                "output_index": self.output.len(), "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
        }
    }

    fn close_message(&mut self) {
        if self.message_open {
            self.message_open = false;
            let id = self.head.item_id("msg", 0);
            let index = self.output.len();
            self.push(
                "response.output_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": self.text}),
            );
            self.push(
                "response.content_part.done",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                "part": {"type": "output_text", "text": self.text, "annotations": []}}),
            );
            let item = self.head.message_item(0, &self.text, "completed");
            self.push("response.output_item.done", json!({"output_index": index, "item": item}));
            self.output.push(item);
        }
    }

    fn text(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        self.open_message();
        self.text.push_str(t);
        self.push(
            "response.output_text.delta",
            json!({"item_id": self.head.item_id("msg", 0),
            "output_index": self.output.len(), "content_index": 0, "delta": t}),
        );
    }

    fn call(&mut self, c: &ToolCall) {
        self.close_message();
        let k = self.calls;
        self.calls += 1;
        let index = self.output.len();
        let mut item = self.head.call_item(k, c, "in_progress");
        item["arguments"] = json!("");
        self.push("response.output_item.added", json!({"output_index": index, "item": item}));
        let id = self.head.item_id("fc", k);
        self.push(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": c.arguments}),
        );
        self.push(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "arguments": c.arguments}),
        );
        let item = self.head.call_item(k, c, "completed");
        self.push("response.output_item.done", json!({"output_index": index, "item": item}));
        self.output.push(item);
    }

    /// A piece of the reply, through the reasoning and tool splitters.
    fn piece(&mut self, text: &str, last: bool) {
        let mut content = match &mut self.reasoning {
            Some(r) => {
                let mut c = r.push(text).content;
                if last {
                    c.push_str(&r.finish().content);
                }
                c
            }
            None => text.to_owned(),
        };
        if let Some(ts) = &mut self.tools {
            let mut t = ts.push(&content);
            if last {
                let end = ts.finish();
                t.content.push_str(&end.content);
                t.calls.extend(end.calls);
            }
            content = t.content;
            let calls = t.calls;
            self.text(&content);
            calls.iter().for_each(|c| self.call(c));
        } else {
            self.text(&content);
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Text { text, .. } => self.piece(&text, false),
            Msg::ChoiceDone { stop_reason, .. } => {
                self.piece("", true);
                if self.output.is_empty() && self.calls == 0 {
                    self.open_message();
                }
                self.close_message();
                self.stop = Some(stop_reason);
            }
            Msg::Done(s) => {
                let output = std::mem::take(&mut self.output);
                let stop = self.stop.unwrap_or(StopReason::Eog);
                let r = self.head.response("completed", stop, output, Some(&s));
                let kind = if r["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
                self.push(kind, json!({"response": r}));
                self.done = true;
            }
            Msg::Embeddings(..) => self.handle(Msg::Error(Msg::not_generated())),
            Msg::Error(e) => {
                let r = self.head.response("failed", None, std::mem::take(&mut self.output), None);
                let mut r = r;
                r["error"] = json!({"code": e.code.unwrap_or("server_error"), "message": e.message});
                self.push("response.failed", json!({"response": r}));
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
    head: Head,
    reply: Reply,
    first: Msg,
    rx: tokio::sync::mpsc::Receiver<Msg>,
    guard: super::worker::TicketGuard,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let mut ev = Events {
        head,
        seq: 0,
        pending: Default::default(),
        reasoning: reply.reasoning.map(ReasoningSplitter::new),
        tools: reply.tools.map(ToolSplitter::new),
        text: String::new(),
        message_open: false,
        output: Vec::new(),
        calls: 0,
        done: false,
        stop: None,
    };
    let created = ev.head.response("in_progress", None, Vec::new(), None);
    ev.push("response.created", json!({"response": created}));
    let progress = ev.head.response("in_progress", None, Vec::new(), None);
    ev.push("response.in_progress", json!({"response": progress}));
    api::event_stream(ev, first, rx, guard)
}
