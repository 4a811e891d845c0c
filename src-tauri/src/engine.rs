//! The app's HTTP client of an engine: a local `strata serve` child (its port and per-launch key) or a
//! remote OpenAI-compatible endpoint. Streams chat replies (SSE), reads the Strata API (devices, cache,
//! telemetry) and follows `/strata/events`. A remote engine that is not Strata answers the Strata paths with
//! 404: those reads are then `None`. Nothing an engine sends is buffered without bound: one event of a
//! stream is at most [`MAX_EVENT_BYTES`], a JSON reply [`MAX_JSON_BYTES`], an error body is cut at
//! [`MAX_ERROR_BODY_BYTES`].

use std::time::Duration;

use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use strata::telemetry::Summary;

use crate::types::{ChatMessage, ChatParams};

/// Where an engine answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// e.g. `http://127.0.0.1:41234` (no trailing slash).
    pub url: String,
    pub api_key: Option<String>,
    /// The model to ask for (empty: the first of `/v1/models`).
    pub model: String,
}

/// How a streamed reply ended.
#[derive(Debug)]
pub enum ChatEnd {
    /// The figures boxed: a Summary is large beside the other variant.
    Done {
        finish_reason: String,
        figures: Option<Box<Summary>>,
    },
    Cancelled,
}

/// Why a streamed reply failed.
#[derive(Debug, thiserror::Error)]
pub enum ChatFailure {
    /// The connection broke or never opened: the engine is gone (a retry on a new one may succeed).
    #[error("the engine went away: {0}")]
    Gone(String),
    /// The engine answered with an error (the request is at fault, or the engine refused it).
    #[error("{0}")]
    Refused(String),
}

/// The most one server-sent event may hold, in bytes (with its field names and line ends): past this the
/// stream fails, whether the event is complete or still arriving (a line that never ends).
pub const MAX_EVENT_BYTES: usize = 1 << 20;
/// The most a JSON reply of the Strata API may hold, in bytes.
pub const MAX_JSON_BYTES: usize = 16 << 20;
/// How much of an error reply's body is read, in bytes (its message is in the first few hundred).
pub const MAX_ERROR_BODY_BYTES: usize = 64 << 10;

/// One server-sent event: its `event:` name (empty for none) and its `data:` lines joined.
#[derive(Debug, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// Why an event stream was given up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// One event (or the part of it received so far) is larger than the parser's limit.
    #[error("the engine sent an event of over {}", size_text(*.limit_bytes))]
    EventTooLarge { limit_bytes: usize },
}

/// `1 MiB` for a whole number of MiB, else bytes.
fn size_text(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// Splits a byte stream into server-sent events, across chunk boundaries, holding at most one event of
/// `limit_bytes` (plus the chunk that arrived) at a time. After an error it keeps failing.
pub struct SseParser {
    buf: Vec<u8>,
    /// Bytes at the start of `buf` already searched for an event's end (none there).
    searched: usize,
    limit_bytes: usize,
    failed: Option<SseError>,
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::with_limit(MAX_EVENT_BYTES)
    }
}

impl SseParser {
    /// A parser that refuses an event of over `limit_bytes`.
    pub fn with_limit(limit_bytes: usize) -> SseParser {
        SseParser { buf: Vec::new(), searched: 0, limit_bytes, failed: None }
    }

    /// The events completed by `bytes`; an error once an event is past the limit (what was buffered is
    /// dropped, and every later push fails the same way).
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            // The end may straddle the last search's edge: look again from one byte before it.
            let from = self.searched.saturating_sub(1);
            let Some(at) = self.buf[from..].windows(2).position(|w| w == b"\n\n") else {
                self.searched = self.buf.len();
                // (Its last byte may be the first of the end: an event of the limit exactly is kept.)
                if self.buf.len() > self.limit_bytes + 1 {
                    return Err(self.fail());
                }
                break;
            };
            let end = from + at;
            if end > self.limit_bytes {
                return Err(self.fail());
            }
            let block: Vec<u8> = self.buf.drain(..end + 2).collect();
            self.searched = 0;
            if let Some(ev) = parse_event(&block) {
                out.push(ev);
            }
        }
        Ok(out)
    }

    fn fail(&mut self) -> SseError {
        let e = SseError::EventTooLarge { limit_bytes: self.limit_bytes };
        self.buf = Vec::new();
        self.searched = 0;
        self.failed = Some(e.clone());
        e
    }
}

/// One event's block (its lines); None when it has no `data:` (a comment, a keep-alive).
fn parse_event(block: &[u8]) -> Option<SseEvent> {
    let block = String::from_utf8_lossy(block);
    let mut ev = SseEvent { event: String::new(), data: String::new() };
    let mut any = false;
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            ev.event = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            if any {
                ev.data.push('\n');
            }
            ev.data.push_str(v.strip_prefix(' ').unwrap_or(v));
            any = true;
        }
    }
    any.then_some(ev)
}

/// A POST the engine did not answer with success.
#[derive(Debug)]
pub struct PostError {
    /// None: no answer came (the connection failed or timed out).
    pub status: Option<u16>,
    pub code: Option<String>,
    /// The request field the error is about.
    pub param: Option<String>,
    pub message: String,
}

#[derive(Clone)]
pub struct EngineClient {
    http: reqwest::Client,
    pub endpoint: Endpoint,
}

impl EngineClient {
    pub fn new(endpoint: Endpoint) -> EngineClient {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        EngineClient { http, endpoint }
    }

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.get(format!("{}{path}", self.endpoint.url));
        match &self.endpoint.api_key {
            Some(k) if !k.is_empty() => r.bearer_auth(k),
            _ => r,
        }
    }

    /// `GET path` as JSON; `Ok(None)` when the engine has no such path (not Strata).
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>, String> {
        let r = self.get(path).timeout(Duration::from_secs(10)).send().await.map_err(|e| e.to_string())?;
        if r.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !r.status().is_success() {
            return Err(error_message(r).await);
        }
        let body = read_capped(r, MAX_JSON_BYTES).await.map_err(|e| format!("the engine's reply to {path}: {e}"))?;
        if body.len() > MAX_JSON_BYTES {
            return Err(format!("the engine's reply to {path} is over {} MiB", MAX_JSON_BYTES >> 20));
        }
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| format!("the engine's reply to {path} is not what was expected: {e}"))
    }

    /// `POST path` with a JSON body, waiting up to `timeout` for the answer: Ok(its JSON) on success, else
    /// the error (its HTTP status when one came, and the error's `code`, `param` and message).
    pub async fn post_json(&self, path: &str, body: &Value, timeout: Duration) -> Result<Value, PostError> {
        let mut r = self.http.post(format!("{}{path}", self.endpoint.url)).json(body).timeout(timeout);
        if let Some(k) = self.endpoint.api_key.as_deref().filter(|k| !k.is_empty()) {
            r = r.bearer_auth(k);
        }
        let failed = |status: Option<u16>, message: String| PostError { status, code: None, param: None, message };
        let r = r.send().await.map_err(|e| failed(None, e.to_string()))?;
        let status = r.status();
        let bytes = read_capped(r, MAX_JSON_BYTES).await.map_err(|e| failed(Some(status.as_u16()), e.to_string()))?;
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(v);
        }
        let text = |k: &str| v["error"][k].as_str().map(str::to_owned);
        Err(PostError {
            status: Some(status.as_u16()),
            code: text("code"),
            param: text("param"),
            message: text("message").unwrap_or_else(|| format!("HTTP {status}")),
        })
    }

    /// 200 from `/health`.
    pub async fn healthy(&self) -> bool {
        matches!(self.get("/health").timeout(Duration::from_secs(2)).send().await, Ok(r) if r.status().is_success())
    }

    /// The model to ask for: the endpoint's own choice, else the first `/v1/models` lists.
    pub async fn model(&self) -> Result<String, String> {
        if !self.endpoint.model.is_empty() {
            return Ok(self.endpoint.model.clone());
        }
        let list: Option<Value> = self.get_json("/v1/models").await?;
        list.as_ref()
            .and_then(|l| l["data"][0]["id"].as_str())
            .map(str::to_owned)
            .ok_or_else(|| "the engine lists no model (GET /v1/models)".to_owned())
    }

    /// Streams a chat reply; `on_text` gets each piece, with whether it is reasoning (`reasoning_content`,
    /// a thinking model's `<think>` block) or the answer (`content`). Stops early when `cancel` turns true.
    pub async fn chat(
        &self,
        messages: &[ChatMessage],
        params: &ChatParams,
        mut on_text: impl FnMut(Piece, &str),
        cancel: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<ChatEnd, ChatFailure> {
        let model = self.model().await.map_err(ChatFailure::Gone)?;
        let body = chat_body(&model, messages, params);
        let mut req = self.http.post(format!("{}/v1/chat/completions", self.endpoint.url)).json(&body);
        if let Some(k) = self.endpoint.api_key.as_ref().filter(|k| !k.is_empty()) {
            req = req.bearer_auth(k);
        }
        let resp = tokio::select! {
            r = req.send() => r.map_err(|e| ChatFailure::Gone(e.to_string()))?,
            _ = cancel.wait_for(|c| *c) => return Ok(ChatEnd::Cancelled),
        };
        if resp.status().is_server_error() && resp.status() != reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return Err(ChatFailure::Gone(error_message(resp).await));
        }
        if !resp.status().is_success() {
            return Err(ChatFailure::Refused(error_message(resp).await));
        }
        let mut stream = resp.bytes_stream();
        let mut sse = SseParser::default();
        let mut finish_reason: Option<String> = None;
        let mut figures: Option<Box<Summary>> = None;
        loop {
            let chunk = tokio::select! {
                c = stream.next() => c,
                _ = cancel.wait_for(|c| *c) => return Ok(ChatEnd::Cancelled),
            };
            let Some(chunk) = chunk else {
                return Err(ChatFailure::Gone("the reply stopped before its end".into()));
            };
            let bytes = chunk.map_err(|e| ChatFailure::Gone(e.to_string()))?;
            // Too large an event is the engine's fault, not a lost connection: no retry.
            for ev in sse.push(&bytes).map_err(|e| ChatFailure::Refused(e.to_string()))? {
                if ev.data == "[DONE]" {
                    return Ok(ChatEnd::Done {
                        finish_reason: finish_reason.unwrap_or_else(|| "stop".into()),
                        figures,
                    });
                }
                let v: Value = serde_json::from_str(&ev.data)
                    .map_err(|e| ChatFailure::Refused(format!("the engine sent an unreadable chunk: {e}")))?;
                if let Some(err) = v.get("error") {
                    let msg = err["message"].as_str().unwrap_or("the engine failed").to_owned();
                    return Err(if err["type"] == "server_error" {
                        ChatFailure::Gone(msg)
                    } else {
                        ChatFailure::Refused(msg)
                    });
                }
                if let Some(c) = v["choices"].get(0) {
                    for (piece, key) in [(Piece::Reasoning, "reasoning_content"), (Piece::Content, "content")] {
                        if let Some(t) = c["delta"][key].as_str().filter(|t| !t.is_empty()) {
                            on_text(piece, t);
                        }
                    }
                    if let Some(f) = c["finish_reason"].as_str() {
                        finish_reason = Some(f.to_owned());
                    }
                }
                if let Some(s) = v.get("strata") {
                    figures = serde_json::from_value(s.clone()).ok();
                }
            }
        }
    }

    /// Follows `/strata/events` until it ends or `f` returns false; each event is (name, data).
    pub async fn follow_events(&self, mut f: impl FnMut(SseEvent) -> bool) -> Result<(), String> {
        let resp = self.get("/strata/events").send().await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(error_message(resp).await);
        }
        let mut stream = resp.bytes_stream();
        let mut sse = SseParser::default();
        while let Some(chunk) = stream.next().await {
            let bytes = chunk.map_err(|e| e.to_string())?;
            for ev in sse.push(&bytes).map_err(|e| e.to_string())? {
                if !f(ev) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// Which part of a reply a streamed piece belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// The reasoning before the answer (`reasoning_content`).
    Reasoning,
    /// The answer (`content`).
    Content,
}

/// The body of a streamed `POST /v1/chat/completions`: only the sampling fields that are set, so the
/// engine applies the model's defaults to the others (never a null, which a strict server refuses), and
/// `response_format: {"type": "json_object"}` when JSON mode is on. Messages go as role and content: an
/// earlier reply's reasoning stays in the app (chat templates leave it out of earlier turns, and not every
/// endpoint takes `reasoning_content`).
pub fn chat_body(model: &str, messages: &[ChatMessage], params: &ChatParams) -> Value {
    let messages: Vec<Value> = messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect();
    let mut body = json!({
        "model": model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let fields = [
        ("temperature", params.temperature.map(f32_json)),
        ("top_k", params.top_k.map(|k| json!(k))),
        ("top_p", params.top_p.map(f32_json)),
        ("min_p", params.min_p.map(f32_json)),
        ("repeat_penalty", params.repeat_penalty.map(f32_json)),
        ("max_tokens", params.max_tokens.map(|n| json!(n))),
        ("seed", params.seed.map(|s| json!(s))),
    ];
    for (name, value) in fields {
        if let Some(v) = value {
            body[name] = v;
        }
    }
    if params.json_mode == Some(true) {
        body["response_format"] = json!({"type": "json_object"});
    }
    body
}

/// An f32 as the number the user typed (0.2, not 0.20000000298023224, which widening it would give).
fn f32_json(v: f32) -> Value {
    v.to_string().parse::<f64>().map_or_else(|_| json!(v), |f| json!(f))
}

/// A reply's body, read until its end or until more than `max_bytes` arrived (then the first chunks past
/// it are all that is kept beyond: the caller tells by the length).
async fn read_capped(r: reqwest::Response, max_bytes: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    let mut stream = r.bytes_stream();
    while let Some(chunk) = stream.next().await {
        body.extend_from_slice(&chunk.map_err(|e| e.to_string())?);
        if body.len() > max_bytes {
            break;
        }
    }
    Ok(body)
}

/// The message of an error reply (OpenAI's `{"error": {"message"}}`, else the status and the start of the
/// body); at most [`MAX_ERROR_BODY_BYTES`] of the body are read.
async fn error_message(r: reqwest::Response) -> String {
    let status = r.status();
    let mut body = read_capped(r, MAX_ERROR_BODY_BYTES).await.unwrap_or_default();
    body.truncate(MAX_ERROR_BODY_BYTES);
    let text = String::from_utf8_lossy(&body);
    serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("HTTP {status}: {}", text.chars().take(300).collect::<String>()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chat_body_carries_the_set_sampling_fields_only() {
        let messages = [ChatMessage { role: crate::types::ChatRole::User, content: "hi".into(), reasoning: None }];
        let none = chat_body("m", &messages, &ChatParams::default());
        for field in
            ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "max_tokens", "seed", "response_format"]
        {
            assert!(none.get(field).is_none(), "{field} is sent unset: {none}");
        }
        let off = chat_body("m", &messages, &ChatParams { json_mode: Some(false), ..Default::default() });
        assert!(off.get("response_format").is_none(), "JSON mode off sends response_format: {off}");
        let on = chat_body("m", &messages, &ChatParams { json_mode: Some(true), ..Default::default() });
        assert_eq!(on["response_format"], json!({"type": "json_object"}));
        let all = ChatParams {
            temperature: Some(0.2),
            top_k: Some(0),
            top_p: Some(0.9),
            min_p: Some(0.05),
            repeat_penalty: Some(1.1),
            max_tokens: Some(2048),
            seed: Some(7),
            json_mode: None,
        };
        let body = chat_body("m", &messages, &all);
        assert_eq!(
            [&body["temperature"], &body["top_k"], &body["top_p"], &body["min_p"], &body["repeat_penalty"]],
            [&json!(0.2), &json!(0), &json!(0.9), &json!(0.05), &json!(1.1)]
        );
        assert_eq!((&body["max_tokens"], &body["seed"], &body["model"]), (&json!(2048), &json!(7), &json!("m")));
        assert_eq!(body["messages"], json!([{"role": "user", "content": "hi"}]));
    }

    #[test]
    fn sse_events_split_across_chunks() {
        let mut p = SseParser::default();
        assert!(p.push(b"event: sample\ndata: {\"a\"").unwrap().is_empty());
        let evs = p.push(b":1}\n\ndata: [DONE]\n\n").unwrap();
        assert_eq!(
            evs,
            vec![
                SseEvent { event: "sample".into(), data: "{\"a\":1}".into() },
                SseEvent { event: String::new(), data: "[DONE]".into() }
            ]
        );
        assert!(p.push(b": keep-alive\n\n").unwrap().is_empty());
        // An event's end split between two chunks, one byte each side.
        assert!(p.push(b"data: x\n").unwrap().is_empty());
        assert_eq!(p.push(b"\ndata: y\n\n").unwrap().iter().map(|e| e.data.as_str()).collect::<Vec<_>>(), ["x", "y"]);
    }

    #[test]
    fn an_event_past_the_limit_fails_the_stream_and_frees_the_buffer() {
        // A line that never ends, fed in small chunks: refused once it passes the limit, not buffered on.
        let mut p = SseParser::with_limit(1000);
        let mut fed = 0;
        let err = loop {
            match p.push(&[b'a'; 64]) {
                Ok(evs) => assert!(evs.is_empty()),
                Err(e) => break e,
            }
            fed += 64;
            assert!(fed <= 1000, "still buffering after {fed} bytes");
        };
        assert_eq!(err, SseError::EventTooLarge { limit_bytes: 1000 });
        assert_eq!(err.to_string(), "the engine sent an event of over 1000 bytes");
        assert_eq!(p.buf.capacity(), 0, "the buffer is freed");
        // It stays failed: no event of what follows is taken as a fresh start.
        assert_eq!(p.push(b"\n\ndata: [DONE]\n\n"), Err(SseError::EventTooLarge { limit_bytes: 1000 }));
        // A whole event over the limit in one chunk is refused too; events that fit before it are not lost.
        let mut p = SseParser::with_limit(1000);
        let mut chunk = b"data: ok\n\n".to_vec();
        assert_eq!(p.push(&chunk).unwrap().len(), 1);
        chunk = format!("data: {}\n\n", "b".repeat(1200)).into_bytes();
        assert!(p.push(&chunk).is_err());
        // At the limit exactly is fine.
        let mut p = SseParser::with_limit(1000);
        let exact = format!("data: {}", "c".repeat(994));
        assert_eq!(exact.len(), 1000);
        assert!(p.push(format!("{exact}\n").as_bytes()).unwrap().is_empty());
        assert_eq!(p.push(b"\n").unwrap()[0].data.len(), 994);
        // The default limit is 1 MiB, and its message says so.
        let mut p = SseParser::default();
        let big = vec![b'd'; MAX_EVENT_BYTES + 2];
        let e = p.push(&big).unwrap_err();
        assert_eq!(e.to_string(), "the engine sent an event of over 1 MiB");
    }
}
