//! The app's HTTP client of an engine: a local `strata serve` child (its port and per-launch key) or a
//! remote OpenAI-compatible endpoint. Streams chat replies (SSE), reads the Strata API (devices, cache,
//! telemetry) and follows `/strata/events`. A remote engine that is not Strata answers the Strata paths with
//! 404: those reads are then `None`.

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
    Done { finish_reason: String, figures: Option<Summary> },
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

/// One server-sent event: its `event:` name (empty for none) and its `data:` lines joined.
#[derive(Debug, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// Splits a byte stream into server-sent events, across chunk boundaries.
#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            let text = &self.buf;
            let end = text.windows(2).position(|w| w == b"\n\n");
            let Some(end) = end else { break };
            let block: Vec<u8> = self.buf.drain(..end + 2).collect();
            let block = String::from_utf8_lossy(&block);
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
            if any {
                out.push(ev);
            }
        }
        out
    }
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
        r.json::<T>().await.map(Some).map_err(|e| format!("the engine's reply to {path} is not what was expected: {e}"))
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

    /// Streams a chat reply; `on_text` gets each piece. Stops early when `cancel` turns true.
    pub async fn chat(
        &self,
        messages: &[ChatMessage],
        params: &ChatParams,
        mut on_text: impl FnMut(&str),
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
        let mut figures: Option<Summary> = None;
        loop {
            let chunk = tokio::select! {
                c = stream.next() => c,
                _ = cancel.wait_for(|c| *c) => return Ok(ChatEnd::Cancelled),
            };
            let Some(chunk) = chunk else {
                return Err(ChatFailure::Gone("the reply stopped before its end".into()));
            };
            let bytes = chunk.map_err(|e| ChatFailure::Gone(e.to_string()))?;
            for ev in sse.push(&bytes) {
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
                    if let Some(t) = c["delta"]["content"].as_str() {
                        if !t.is_empty() {
                            on_text(t);
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
            for ev in sse.push(&bytes) {
                if !f(ev) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// The body of a streamed `POST /v1/chat/completions`: only the sampling fields that are set, so the
/// engine applies the model's defaults to the others (never a null, which a strict server refuses).
pub fn chat_body(model: &str, messages: &[ChatMessage], params: &ChatParams) -> Value {
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
    body
}

/// An f32 as the number the user typed (0.2, not 0.20000000298023224, which widening it would give).
fn f32_json(v: f32) -> Value {
    v.to_string().parse::<f64>().map_or_else(|_| json!(v), |f| json!(f))
}

/// The message of an error reply (OpenAI's `{"error": {"message"}}`, else the status and body).
async fn error_message(r: reqwest::Response) -> String {
    let status = r.status();
    let text = r.text().await.unwrap_or_default();
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
        let messages = [ChatMessage { role: crate::types::ChatRole::User, content: "hi".into() }];
        let none = chat_body("m", &messages, &ChatParams::default());
        for field in ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "max_tokens", "seed"] {
            assert!(none.get(field).is_none(), "{field} is sent unset: {none}");
        }
        let all = ChatParams {
            temperature: Some(0.2),
            top_k: Some(0),
            top_p: Some(0.9),
            min_p: Some(0.05),
            repeat_penalty: Some(1.1),
            max_tokens: Some(2048),
            seed: Some(7),
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
        assert!(p.push(b"event: sample\ndata: {\"a\"").is_empty());
        let evs = p.push(b":1}\n\ndata: [DONE]\n\n");
        assert_eq!(
            evs,
            vec![
                SseEvent { event: "sample".into(), data: "{\"a\":1}".into() },
                SseEvent { event: String::new(), data: "[DONE]".into() }
            ]
        );
        assert!(p.push(b": keep-alive\n\n").is_empty());
    }
}
