//! The handlers of the OpenAI-compatible endpoints: `/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`. A request is read (bounded size and time), checked, rendered and tokenized off the async
//! threads, checked against the context, and queued for the engine; the reply is one JSON object or an
//! SSE stream of chunks ending with `data: [DONE]`. A chat reply's `<think>` block comes back apart, as
//! `reasoning_content` (whole, or in the deltas while the block lasts), unless the request's
//! `reasoning_format` is `none` (see `tokenizer::reasoning`).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};
use tokio::sync::mpsc::{channel, Receiver};

use crate::grammar::{Constraint, GrammarSpec};
use crate::sync::LockUnpoisoned;
use crate::telemetry::Summary;
use crate::tokenizer::reasoning::{split_reply, ReasoningSplitter, ReplyFormat, Split};
use crate::tokenizer::turns;
use crate::tools::{self, Tool, ToolCall, ToolChoice, ToolFormat, ToolSplitter};

use super::error::ApiError;
use super::fair::{ClientKey, Peer};
use super::openai::{self, ChatRequest, Checked, CompletionRequest, PromptInput};
use super::worker::{finish_reason, Job, Msg, Task, Ticket, TicketGuard, TokenInfo, REPLY_BACKLOG};
use super::App;
use crate::engine::StopReason;

/// Reads the body: at most `limit` bytes (413 beyond, checked on Content-Length first) within
/// `timeout` (408 after).
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: u64,
    timeout: Duration,
) -> Result<axum::body::Bytes, ApiError> {
    if let Some(len) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok()) {
        if len > limit {
            return Err(ApiError::too_large(limit));
        }
    }
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit as usize)).await {
        Err(_) => Err(ApiError::body_timeout(timeout.as_secs())),
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            let source = std::error::Error::source(&e);
            if source.is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit")
            {
                Err(ApiError::too_large(limit))
            } else {
                Err(ApiError::malformed(format!("the request body could not be read: {e}")))
            }
        }
    }
}

/// The model a request names, answered: with one model served, every name is answered by it and the
/// response names the served id (clients send whatever name they were configured with, as llama-server and
/// LM Studio allow). With `--strict-model`, only the served id, an alias or no name; another is a 404
/// naming what is served.
pub(super) fn check_model(app: &App, asked: &Option<String>) -> Result<String, ApiError> {
    let served = &app.model().id;
    match asked.as_deref() {
        Some(m)
            if app.opts.strict_model && !m.is_empty() && m != served && !app.opts.aliases.iter().any(|a| a == m) =>
        {
            let mut names = vec![served.clone()];
            names.extend(app.opts.aliases.iter().cloned());
            Err(ApiError::model_not_found(format!(
                "the model {:?} is not served here: this server serves {} (or send no \"model\"; --strict-model is on)",
                openai::truncate(m, 100),
                names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
            )))
        }
        _ => Ok(served.clone()),
    }
}

/// Refuses a prompt longer than the context, with both numbers.
pub(super) fn check_context(app: &App, prompt_len: usize, param: &str) -> Result<(), ApiError> {
    let max = app.model().max_context;
    if prompt_len > max {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(
                param,
                format!(
                    "the prompt is {prompt_len} tokens but the context holds {max} (--max-context): shorten it by {}",
                    prompt_len - max
                ),
            )
        });
    }
    Ok(())
}

/// Refuses early (before reading a body) what the queue could not take anyway.
pub(super) fn check_admission(app: &App) -> Result<(), ApiError> {
    let shared = &app.shared;
    if let Some(why) = shared.unhealthy() {
        return Err(ApiError::unhealthy(why));
    }
    if shared.shutting_down.load(Ordering::Acquire) {
        return Err(ApiError::shutting_down());
    }
    if shared.waiting.load(Ordering::Acquire) >= shared.queue_cap {
        return Err(ApiError::queue_full(shared.queue_cap));
    }
    Ok(())
}

/// Puts a job in the engine's queue, or says why not (503: full, shutting down, unhealthy).
fn enqueue(app: &App, mut job: Job) -> Result<(), ApiError> {
    let shared = &app.shared;
    check_admission(app)?;
    let before = shared.waiting.fetch_add(1, Ordering::AcqRel);
    if before >= shared.queue_cap {
        shared.waiting.fetch_sub(1, Ordering::AcqRel);
        return Err(ApiError::queue_full(shared.queue_cap));
    }
    job.queued_at = Instant::now();
    let sent = app.jobs.send(job);
    if sent.is_err() {
        shared.waiting.fetch_sub(1, Ordering::AcqRel);
        return Err(ApiError::unhealthy("the engine has stopped"));
    }
    shared.accepted.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub(super) fn request_id(prefix: &str) -> String {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{:x}{n:06x}", unix_now())
}

fn usage_json(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": s.reused},
        "completion_tokens_details": {"reasoning_tokens": s.reasoning_tokens},
    })
}

/// The `strata` object of a reply: where the prompt's state came from, and the speeds.
pub fn strata_json(s: &Summary) -> Value {
    serde_json::to_value(s).unwrap_or(Value::Null)
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn chat_logprobs(tokens: &[TokenInfo]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            json!({
                "token": lossy(&t.bytes),
                "logprob": t.logprob,
                "bytes": t.bytes,
                "top_logprobs": t.top.iter().map(|(_, b, lp)| json!({"token": lossy(b), "logprob": lp, "bytes": b}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"content": content, "refusal": null})
}

fn completion_logprobs(tokens: &[TokenInfo], offset: &mut usize) -> Value {
    let mut offsets = Vec::new();
    for t in tokens {
        offsets.push(*offset);
        *offset += lossy(&t.bytes).chars().count();
    }
    json!({
        "tokens": tokens.iter().map(|t| lossy(&t.bytes)).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(|t| {
            let m: serde_json::Map<String, Value> = t.top.iter().map(|(_, b, lp)| (lossy(b), json!(lp))).collect();
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
}

/// What a response is built from.
pub(super) struct Reply {
    endpoint: Endpoint,
    id: String,
    created: u64,
    pub model: String,
    pub checked: Checked,
    logprobs: bool,
    /// Chat replies whose reasoning (a `<think>` block, or harmony's analysis messages) comes back apart:
    /// Some(how the reply carries it).
    pub reasoning: Option<ReplyFormat>,
    /// Chat replies: Some(how the reply carries its reasoning), whatever `reasoning_format` says, for the
    /// usage's `reasoning_tokens`.
    reply_format: Option<ReplyFormat>,
    /// Chat replies to a request that offered tools: the format calls are read in.
    pub tools: Option<ToolFormat>,
}

pub async fn chat(State(app): State<App>, peer: Option<Extension<Peer>>, headers: HeaderMap, body: Body) -> Response {
    let r = chat_inner(&app, peer.map(|p| p.0), &headers, body).await;
    respond(&app, r)
}

pub async fn completions(
    State(app): State<App>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = completions_inner(&app, peer.map(|p| p.0), &headers, body).await;
    respond(&app, r)
}

pub(super) fn respond(app: &App, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(r) => r,
        Err(e) => {
            app.shared.metrics.reject(e.code.unwrap_or(e.kind));
            e.into_response()
        }
    }
}

async fn chat_inner(app: &App, peer: Option<Peer>, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    check_admission(app)?;
    // Bodies being read and prepared at once are bounded, so that many clients cannot make the server hold
    // many bodies before the queue refuses them.
    let _permit = app.shared.preparing.try_acquire().map_err(|_| ApiError::queue_full(app.shared.queue_cap))?;
    let bytes = read_body(headers, body, app.opts.max_body_bytes, app.opts.body_timeout).await?;
    let req: ChatRequest = openai::parse(&bytes)?;
    drop(bytes);
    // The model does not change until the request is queued (a switch waits for it, and it for a switch).
    let lease = app.models.lease().await?;
    let (queued, reply) = prepare_chat(app, peer, req).await?;
    run_queued(app, queued, reply, lease).await
}

/// A chat request checked, rendered and tokenized: the job to queue and how to answer (the Chat shape; the
/// Responses API takes the same and answers in its own).
pub(super) async fn prepare_chat(app: &App, peer: Option<Peer>, req: ChatRequest) -> Result<(Queued, Reply), ApiError> {
    let model = check_model(app, &req.model)?;
    let mut messages = req.chat_messages()?;
    let mut checked = openai::check_common(&req.common(), &req.stop, app.opts.batch, &app.model().sampling)?;
    let (logprobs, top) = req.top_logprobs()?;
    checked.params.logprobs = logprobs;
    let mut kwargs = req.template_kwargs()?;
    let splits_reasoning = req.splits_reasoning()?;
    let tool_req = req.tool_request()?;
    let (tool_format, knows_tools) = ToolFormat::of_template(app.model().template.source());
    tools::prepare_messages(&mut messages, tool_req.as_ref().map(|t| t.tools.as_slice()), tool_format, knows_tools);
    let mut grammar = req.grammar_spec()?;
    if let Some(t) = &tool_req {
        if knows_tools {
            kwargs.insert("tools".into(), Value::Array(t.tools.iter().map(Tool::to_openai).collect()));
        }
        let only = match &t.choice {
            ToolChoice::Required => Some(None),
            ToolChoice::Named(name) => Some(Some(name.as_str())),
            ToolChoice::Auto | ToolChoice::None => None,
        };
        if let Some(only) = only {
            if let Some((_, field)) = grammar {
                return Err(ApiError::invalid(
                    field,
                    format!("{field}: a reply that must call a tool (tool_choice) cannot also follow {field}"),
                ));
            }
            let lark = tools::calls_grammar(tool_format, &t.tools, only, t.parallel, &app.model().tokenizer);
            grammar = Some((GrammarSpec::Lark(lark), "tools"));
        }
    }
    checked.params.grammar = compile_grammar(app, grammar).await?;
    let client = ClientKey::of(req.user.as_deref(), peer);
    drop(req);
    // Earlier replies the engine generated go in as their tokens (taken out now: the engine thread adds
    // to the store while this renders).
    let known: HashMap<String, Arc<[u32]>> = {
        let replies = app.shared.replies.lock_unpoisoned();
        messages
            .iter()
            .filter(|m| m.role == "assistant")
            .filter_map(|m| Some((m.content.clone(), replies.get(&m.content)?)))
            .collect()
    };
    let m = app.model();
    let prompt = tokio::task::spawn_blocking(move || {
        turns::encode_chat_with(&m.template, &m.tokenizer, &messages, &kwargs, |text| known.get(text).cloned())
            .map_err(|e| ApiError::invalid("messages", format!("the chat template cannot render these messages: {e}")))
    })
    .await
    .map_err(|e| ApiError::internal(format!("rendering failed: {e}")))??;
    check_context(app, prompt.tokens.len(), "messages")?;
    let reply = Reply {
        endpoint: Endpoint::Chat,
        id: request_id("chatcmpl"),
        created: unix_now(),
        model,
        checked,
        logprobs,
        // Harmony's markup frames every message (and its calls): it is always read, whatever
        // `reasoning_format` says.
        reasoning: (splits_reasoning || prompt.format == ReplyFormat::Harmony).then_some(prompt.format),
        reply_format: Some(prompt.format),
        tools: tool_req.map(|_| tool_format),
    };
    let queued = Queued {
        prompt: prompt.tokens,
        kept_reply_tokens: prompt.kept_reply_tokens,
        top_logprobs: top,
        endpoint: "chat",
        reply_format: reply.reply_format,
        client,
    };
    Ok((queued, reply))
}

async fn completions_inner(
    app: &App,
    peer: Option<Peer>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    check_admission(app)?;
    // Bodies being read and prepared at once are bounded, so that many clients cannot make the server hold
    // many bodies before the queue refuses them.
    let _permit = app.shared.preparing.try_acquire().map_err(|_| ApiError::queue_full(app.shared.queue_cap))?;
    let bytes = read_body(headers, body, app.opts.max_body_bytes, app.opts.body_timeout).await?;
    let req: CompletionRequest = openai::parse(&bytes)?;
    drop(bytes);
    // The model does not change until the request is queued (a switch waits for it, and it for a switch).
    let lease = app.models.lease().await?;
    let model = check_model(app, &req.model)?;
    let top = req.check()?;
    let mut checked = openai::check_common(&req.common(), &req.stop, app.opts.batch, &app.model().sampling)?;
    let logprobs = req.logprobs.is_some();
    checked.params.logprobs = logprobs;
    let prompt = completion_prompt(app, &req.prompt).await?;
    let client = ClientKey::of(req.user.as_deref(), peer);
    drop(req);
    let reply = Reply {
        endpoint: Endpoint::Completion,
        id: request_id("cmpl"),
        created: unix_now(),
        model,
        checked,
        logprobs,
        reasoning: None,
        reply_format: None,
        tools: None,
    };
    run(app, client, prompt, 0, top, reply, lease).await
}

/// The constraint of a request's grammar, compiled off the async threads (the first one also builds the
/// vocabulary's trie); a grammar the engine refuses is a 400 naming the field it came from.
pub(super) async fn compile_grammar(
    app: &App,
    spec: Option<(GrammarSpec, &'static str)>,
) -> Result<Option<Constraint>, ApiError> {
    let Some((spec, field)) = spec else { return Ok(None) };
    let m = app.model();
    tokio::task::spawn_blocking(move || m.grammars.compile(&spec))
        .await
        .map_err(|e| ApiError::internal(format!("compiling the grammar failed: {e}")))?
        .map(Some)
        .map_err(|e| ApiError::invalid(field, format!("{field}: {e}")))
}

/// A completion's `prompt` as tokens: a string tokenized (with BOS, special tokens parsed) off the async
/// threads, or token ids checked against the vocabulary; then checked against the context.
pub(super) async fn completion_prompt(app: &App, prompt: &Option<openai::Prompt>) -> Result<Vec<u32>, ApiError> {
    let input = openai::prompt_input(prompt, app.model().tokenizer.n_vocab())?;
    let m = app.model();
    let tokens = match input {
        PromptInput::Tokens(t) => t,
        PromptInput::Text(text) => tokio::task::spawn_blocking(move || m.tokenizer.encode_with_bos(&text, true))
            .await
            .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?,
    };
    check_context(app, tokens.len(), "prompt")?;
    Ok(tokens)
}

/// Queues the job and answers: one JSON object, or an SSE stream once the engine has produced its first
/// message (so that a failure before any text is still an HTTP error status).
/// `kept_reply_tokens`: tokens of the prompt that are earlier replies as they were generated.
async fn run(
    app: &App,
    client: ClientKey,
    prompt: Vec<u32>,
    kept_reply_tokens: usize,
    top_logprobs: usize,
    reply: Reply,
    lease: Lease<'_>,
) -> Result<Response, ApiError> {
    let endpoint = match reply.endpoint {
        Endpoint::Chat => "chat",
        Endpoint::Completion => "completions",
    };
    let queued = Queued { prompt, kept_reply_tokens, top_logprobs, endpoint, reply_format: reply.reply_format, client };
    run_queued(app, queued, reply, lease).await
}

/// A request's hold on the model it is prepared for ([`super::switch::ModelSlot::lease`]), let go once it
/// is queued.
pub(super) type Lease<'a> = tokio::sync::RwLockReadGuard<'a, ()>;

async fn run_queued(app: &App, queued: Queued, reply: Reply, lease: Lease<'_>) -> Result<Response, ApiError> {
    let (mut rx, guard) = submit(app, queued, reply.checked.clone())?;
    drop(lease);
    if reply.checked.stream {
        let first = first_message(&mut rx).await?;
        return Ok(stream(reply, first, rx, guard).into_response());
    }
    let _guard = guard;
    let (choices, summary) = collect(&mut rx, reply.checked.choices).await?;
    Ok(Json(whole_reply(&reply, choices, &summary)).into_response())
}

/// What a job is made of besides its checked sampling fields.
pub struct Queued {
    pub prompt: Vec<u32>,
    /// Tokens of the prompt that are earlier replies as they were generated (not retokenized).
    pub kept_reply_tokens: usize,
    pub top_logprobs: usize,
    /// The `/metrics` label of the request.
    pub endpoint: &'static str,
    /// Chat replies: how the reply carries its reasoning (for the usage's reasoning tokens); None for
    /// completions.
    pub reply_format: Option<ReplyFormat>,
    /// The lane it waits in.
    pub client: ClientKey,
}

/// Puts a job in the engine's queue: its messages come on the receiver. The guard goes with the handler
/// (or the stream): dropping it takes a job that has not started off the queue, so a client that leaves
/// frees its place.
pub(super) fn submit(app: &App, q: Queued, checked: Checked) -> Result<(Receiver<Msg>, TicketGuard), ApiError> {
    submit_task(app, Task::Generate, q, checked)
}

/// [`submit`] of any task (an embedding job's prompt is empty and its `checked` unused).
pub(super) fn submit_task(
    app: &App,
    task: Task,
    q: Queued,
    checked: Checked,
) -> Result<(Receiver<Msg>, TicketGuard), ApiError> {
    let (tx, rx) = channel(REPLY_BACKLOG);
    let ticket = Ticket::new(app.shared.clone());
    let job = Job {
        task,
        prompt: q.prompt,
        kept_reply_tokens: q.kept_reply_tokens,
        checked,
        top_logprobs: q.top_logprobs,
        tx,
        queued_at: Instant::now(),
        time_limit: app.opts.request_timeout,
        endpoint: q.endpoint,
        ticket: ticket.clone(),
        reply_format: q.reply_format,
        client: q.client,
    };
    enqueue(app, job)?;
    Ok((rx, TicketGuard(ticket)))
}

/// A streamed job's first message, or its error as the HTTP answer (nothing has been sent yet).
pub(super) async fn first_message(rx: &mut Receiver<Msg>) -> Result<Msg, ApiError> {
    match rx.recv().await {
        Some(Msg::Error(e)) => Err(e),
        Some(m) => Ok(m),
        None => Err(ApiError::internal("the engine ended the request without a reply")),
    }
}

/// One choice as the engine finished it: why it stopped, its text, and its tokens (with log-probabilities
/// when asked for).
pub(super) type Finished = (StopReason, String, Vec<TokenInfo>);

/// Waits for every choice of a job that is not streamed, and its figures.
pub(super) async fn collect(rx: &mut Receiver<Msg>, n: usize) -> Result<(Vec<Option<Finished>>, Summary), ApiError> {
    let mut choices: Vec<Option<Finished>> = (0..n).map(|_| None).collect();
    loop {
        match rx.recv().await {
            Some(Msg::Text { .. }) => {}
            Some(Msg::ChoiceDone { choice, stop_reason, text, tokens }) => {
                if let Some(c) = choices.get_mut(choice) {
                    *c = Some((stop_reason, text, tokens));
                }
            }
            Some(Msg::Done(s)) => return Ok((choices, *s)),
            Some(Msg::Error(e)) => return Err(e),
            Some(Msg::Embeddings(..)) => return Err(Msg::not_generated()),
            None => return Err(ApiError::internal("the engine ended the request without a reply")),
        }
    }
}

/// The reply that is not streamed: OpenAI's chat.completion or text_completion object, with Strata's figures.
fn whole_reply(reply: &Reply, choices: Vec<Option<Finished>>, summary: &Summary) -> Value {
    let choices: Vec<Value> = choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let (stop, text, tokens) = c.unwrap_or((StopReason::Eog, String::new(), Vec::new()));
            let mut finish = finish_reason(stop);
            match reply.endpoint {
                Endpoint::Chat => {
                    let mut message = chat_message_json(&text, reply.reasoning);
                    if let Some(format) = reply.tools {
                        let content = message["content"].as_str().unwrap_or_default().to_owned();
                        let (content, calls) = tools::parse_reply(format, &content);
                        if !calls.is_empty() {
                            message["content"] = if content.is_empty() { Value::Null } else { Value::String(content) };
                            message["tool_calls"] =
                                calls.iter().map(|c| tool_call_json(&reply.id, i, c, None)).collect();
                            finish = "tool_calls";
                        }
                    }
                    json!({
                        "index": i,
                        "message": message,
                        "logprobs": if reply.logprobs { chat_logprobs(&tokens) } else { Value::Null },
                        "finish_reason": finish,
                    })
                }
                Endpoint::Completion => json!({
                    "index": i,
                    "text": text,
                    "logprobs": if reply.logprobs { completion_logprobs(&tokens, &mut 0) } else { Value::Null },
                    "finish_reason": finish,
                }),
            }
        })
        .collect();
    let object = match reply.endpoint {
        Endpoint::Chat => "chat.completion",
        Endpoint::Completion => "text_completion",
    };
    json!({
        "id": reply.id,
        "object": object,
        "created": reply.created,
        "model": reply.model,
        "system_fingerprint": super::FINGERPRINT,
        "choices": choices,
        "usage": usage_json(summary),
        "strata": strata_json(summary),
    })
}

/// One call as OpenAI gives it: an id unique in the reply (the reply's id, the choice, the call's place),
/// the function's name and its arguments as JSON text; streamed (`index`: Some), with the call's index.
fn tool_call_json(reply_id: &str, choice: usize, call: &ToolCall, index: Option<usize>) -> Value {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let id = format!("call_{}_{choice}_{n}", reply_id.rsplit('-').next().unwrap_or(reply_id));
    let mut v = json!({"id": id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}});
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

/// A whole chat reply's message: the text as content, or its reasoning apart (`reasoning`: see [`Reply`]),
/// `reasoning_content` only when there is some.
fn chat_message_json(text: &str, reasoning: Option<ReplyFormat>) -> Value {
    let Some(format) = reasoning else {
        return json!({"role": "assistant", "content": text, "refusal": null});
    };
    let s = split_reply(text, format);
    let mut m = json!({"role": "assistant", "content": s.content, "refusal": null});
    if !s.reasoning.is_empty() {
        m["reasoning_content"] = Value::String(s.reasoning);
    }
    m
}

/// A streamed chat delta with a piece's reasoning and content (each only when there is some).
fn split_delta(s: Split) -> Value {
    let mut d = serde_json::Map::new();
    if !s.reasoning.is_empty() {
        d.insert("reasoning_content".into(), Value::String(s.reasoning));
    }
    if !s.content.is_empty() {
        d.insert("content".into(), Value::String(s.content));
    }
    Value::Object(d)
}

/// The chunks of a streamed reply, made from the engine's messages.
struct Chunks {
    reply: Reply,
    rx: Receiver<Msg>,
    _guard: TicketGuard,
    /// Token log-probabilities already sent, per choice.
    sent_tokens: Vec<usize>,
    pending: VecDeque<Event>,
    first: Option<Msg>,
    role_sent: Vec<bool>,
    /// Bytes of each choice's text so far (completion logprobs' text_offset).
    offsets: Vec<usize>,
    /// Each choice's reasoning splitter (chat replies whose reasoning comes back apart).
    splitters: Vec<Option<ReasoningSplitter>>,
    /// Each choice's tool-call splitter (chat replies to a request that offered tools), and the calls it
    /// has sent.
    tool_splitters: Vec<Option<ToolSplitter>>,
    tool_calls_sent: Vec<usize>,
    /// Tokens of text a splitter holds back (a tag's start), sent with the text when it goes out.
    held_tokens: Vec<Vec<TokenInfo>>,
    done: bool,
}

impl Chunks {
    /// Puts what a tool splitter gave into a delta: its content in place of the delta's, its calls as
    /// `tool_calls` (numbered in the order they came).
    fn tool_delta(&mut self, choice: usize, delta: &mut Value, t: tools::ToolText) {
        let Some(d) = delta.as_object_mut() else { return };
        if t.content.is_empty() {
            d.remove("content");
        } else {
            d.insert("content".into(), Value::String(t.content));
        }
        if !t.calls.is_empty() {
            let first = self.tool_calls_sent[choice];
            self.tool_calls_sent[choice] += t.calls.len();
            let calls: Vec<Value> = t
                .calls
                .iter()
                .enumerate()
                .map(|(k, c)| tool_call_json(&self.reply.id, choice, c, Some(first + k)))
                .collect();
            d.insert("tool_calls".into(), Value::Array(calls));
        }
    }

    fn chunk(&self, choice: Value) -> Event {
        self.chunk_with(vec![choice], None)
    }

    fn chunk_with(&self, choices: Vec<Value>, usage: Option<Value>) -> Event {
        let object = match self.reply.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        };
        let mut v = json!({
            "id": self.reply.id,
            "object": object,
            "created": self.reply.created,
            "model": self.reply.model,
            "system_fingerprint": super::FINGERPRINT,
            "choices": choices,
        });
        if self.reply.checked.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        Event::default().data(v.to_string())
    }

    fn role(&mut self, choice: usize) {
        if self.reply.endpoint == Endpoint::Chat && !self.role_sent.get(choice).copied().unwrap_or(true) {
            self.role_sent[choice] = true;
            // No text yet: content null, as llama-server sends it (its tests check it; clients take either).
            let e = self.chunk(json!({"index": choice, "delta": {"role": "assistant", "content": null},
                "logprobs": null, "finish_reason": null}));
            self.pending.push_back(e);
        }
    }

    /// Turns one engine message into events.
    fn on(&mut self, msg: Msg) {
        match msg {
            Msg::Text { choice, text, mut tokens } => {
                self.role(choice);
                let mut delta = json!({"content": text});
                let mut holds = false;
                if let Some(splitter) = self.splitters.get_mut(choice).and_then(Option::as_mut) {
                    delta = split_delta(splitter.push(&text));
                    holds = true;
                }
                if let Some(ts) = self.tool_splitters.get_mut(choice).and_then(Option::as_mut) {
                    let content = delta.get("content").and_then(Value::as_str).unwrap_or_default().to_owned();
                    let t = ts.push(&content);
                    self.tool_delta(choice, &mut delta, t);
                    holds = true;
                }
                if holds {
                    let held = &mut self.held_tokens[choice];
                    held.append(&mut tokens);
                    if delta.as_object().is_some_and(|d| d.is_empty()) {
                        return;
                    }
                    tokens = std::mem::take(held);
                }
                if let Some(c) = self.sent_tokens.get_mut(choice) {
                    *c += tokens.len();
                }
                let e = match self.reply.endpoint {
                    Endpoint::Chat => self.chunk(json!({
                        "index": choice,
                        "delta": delta,
                        "logprobs": if self.reply.logprobs { chat_logprobs(&tokens) } else { Value::Null },
                        "finish_reason": null,
                    })),
                    Endpoint::Completion => {
                        let last = self.offsets.len() - 1;
                        let lp = if self.reply.logprobs {
                            completion_logprobs(&tokens, &mut self.offsets[choice.min(last)])
                        } else {
                            Value::Null
                        };
                        self.chunk(json!({"index": choice, "text": text, "logprobs": lp, "finish_reason": null}))
                    }
                };
                self.pending.push_back(e);
            }
            Msg::ChoiceDone { choice, stop_reason, tokens, .. } => {
                let mut finish_reason = finish_reason(stop_reason);
                self.role(choice);
                // What the splitters held back goes out before the end (an unclosed block's last words, a
                // call that ended with the reply).
                let mut last = Value::Object(serde_json::Map::new());
                if let Some(splitter) = self.splitters.get_mut(choice).and_then(Option::as_mut) {
                    last = split_delta(splitter.finish());
                }
                if let Some(ts) = self.tool_splitters.get_mut(choice).and_then(Option::as_mut) {
                    let content = last.get("content").and_then(Value::as_str).unwrap_or_default().to_owned();
                    let mut t = ts.push(&content);
                    let end = ts.finish();
                    t.content.push_str(&end.content);
                    t.calls.extend(end.calls);
                    self.tool_delta(choice, &mut last, t);
                    if self.tool_calls_sent[choice] > 0 {
                        finish_reason = "tool_calls";
                    }
                }
                if last.as_object().is_some_and(|d| !d.is_empty()) {
                    let held = std::mem::take(&mut self.held_tokens[choice]);
                    self.sent_tokens[choice] += held.len();
                    let e = self.chunk(json!({
                        "index": choice,
                        "delta": last,
                        "logprobs": if self.reply.logprobs { chat_logprobs(&held) } else { Value::Null },
                        "finish_reason": null,
                    }));
                    self.pending.push_back(e);
                }
                // Tokens whose text was held back (a stop string's start) or never shown come last.
                let sent = self.sent_tokens.get(choice).copied().unwrap_or(0);
                let rest = &tokens[sent.min(tokens.len())..];
                let last = self.offsets.len() - 1;
                let lp = match self.reply.endpoint {
                    _ if !self.reply.logprobs || rest.is_empty() => Value::Null,
                    Endpoint::Chat => chat_logprobs(rest),
                    Endpoint::Completion => completion_logprobs(rest, &mut self.offsets[choice.min(last)]),
                };
                let e = match self.reply.endpoint {
                    Endpoint::Chat => self
                        .chunk(json!({"index": choice, "delta": {}, "logprobs": lp, "finish_reason": finish_reason})),
                    Endpoint::Completion => {
                        self.chunk(json!({"index": choice, "text": "", "logprobs": lp, "finish_reason": finish_reason}))
                    }
                };
                self.pending.push_back(e);
            }
            Msg::Done(s) => {
                if self.reply.checked.include_usage {
                    let mut e = json!({
                        "id": self.reply.id,
                        "object": if self.reply.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" },
                        "created": self.reply.created,
                        "model": self.reply.model,
                        "system_fingerprint": super::FINGERPRINT,
                        "choices": [],
                        "usage": usage_json(&s),
                    });
                    e["strata"] = strata_json(&s);
                    self.pending.push_back(Event::default().data(e.to_string()));
                }
                self.pending.push_back(Event::default().data("[DONE]"));
                self.done = true;
            }
            Msg::Embeddings(..) => self.on(Msg::Error(Msg::not_generated())),
            Msg::Error(e) => {
                self.pending.push_back(Event::default().data(e.body().to_string()));
                self.done = true;
            }
        }
    }
}

/// What an API makes of the engine's messages while a reply streams (the Responses and Anthropic event
/// shapes): events queued per message, and whether the stream has ended.
pub(super) trait EventSource: Send + 'static {
    /// Turns one engine message into events; `Msg::Error` and `Msg::Done` end the stream.
    fn on(&mut self, msg: Msg);
    fn pending(&mut self) -> &mut VecDeque<Event>;
    fn done(&self) -> bool;
}

/// The SSE stream of `ev`'s events, fed by the engine's messages (the first one already received).
pub(super) fn event_stream<E: EventSource>(
    ev: E,
    first: Msg,
    rx: Receiver<Msg>,
    guard: TicketGuard,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let state = (ev, Some(first), rx, guard);
    let s = futures_util::stream::unfold(state, |(mut ev, mut first, mut rx, guard)| async move {
        loop {
            if let Some(e) = ev.pending().pop_front() {
                return Some((Ok(e), (ev, first, rx, guard)));
            }
            if ev.done() {
                return None;
            }
            let msg = match first.take() {
                Some(m) => Some(m),
                None => rx.recv().await,
            };
            match msg {
                Some(m) => ev.on(m),
                None => ev.on(Msg::Error(ApiError::internal("the engine ended the request without finishing it"))),
            }
        }
    });
    Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

fn stream(
    reply: Reply,
    first: Msg,
    rx: Receiver<Msg>,
    guard: TicketGuard,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let n = reply.checked.choices;
    let splitters = (0..n).map(|_| reply.reasoning.map(ReasoningSplitter::new)).collect();
    let tool_splitters = (0..n).map(|_| reply.tools.map(ToolSplitter::new)).collect();
    let state = Chunks {
        reply,
        rx,
        _guard: guard,
        sent_tokens: vec![0; n],
        pending: VecDeque::new(),
        first: Some(first),
        role_sent: vec![false; n],
        offsets: vec![0; n],
        splitters,
        tool_splitters,
        tool_calls_sent: vec![0; n],
        held_tokens: vec![Vec::new(); n],
        done: false,
    };
    let s = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(e) = st.pending.pop_front() {
                return Some((Ok(e), st));
            }
            if st.done {
                return None;
            }
            let msg = match st.first.take() {
                Some(m) => Some(m),
                None => st.rx.recv().await,
            };
            match msg {
                Some(m) => st.on(m),
                None => {
                    let e = ApiError::internal("the engine ended the request without finishing it");
                    st.pending.push_back(Event::default().data(e.body().to_string()));
                    st.done = true;
                }
            }
        }
    });
    Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// `GET /v1/models`: the served model and its aliases.
pub async fn models(State(app): State<App>) -> Response {
    let created = app.model().created;
    let mut data = vec![json!({"id": app.model().id, "object": "model", "created": created, "owned_by": "strata"})];
    for a in &app.opts.aliases {
        data.push(json!({"id": a, "object": "model", "created": created, "owned_by": "strata"}));
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`: the served model under the name asked for (every name but with --strict-model).
pub async fn model(State(app): State<App>, axum::extract::Path(id): axum::extract::Path<String>) -> Response {
    if id.is_empty() {
        return ApiError::not_found("no model id given").into_response();
    }
    match check_model(&app, &Some(id.clone())) {
        Ok(_) => Json(json!({"id": id, "object": "model", "created": app.model().created, "owned_by": "strata"}))
            .into_response(),
        Err(e) => e.into_response(),
    }
}
