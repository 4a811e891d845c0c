//! llama.cpp's native endpoints, for clients (and llama.cpp's own server tests) written against
//! llama-server: `POST /completion` and `GET /slots`. They are a thin mapping onto what the OpenAI path
//! already does: the same body limits, field checks, queue, engine jobs and errors (OpenAI's JSON shape, a
//! 400 naming the field); only the request's field names and the answer's shape are llama.cpp's.
//!
//! `/completion` takes llama.cpp's names (`n_predict`, `temperature`, `seed`, `stop`, `top_k`, ...) and
//! answers as llama.cpp does, with `completion_probabilities` for `n_probs` (the model's log-probabilities,
//! or with `post_sampling_probs` the probabilities of the distribution the sampler drew from) and the
//! generated ids in `tokens` for `return_tokens`, and `grammar` (GBNF) or `json_schema` for the output to
//! follow; a field this server cannot honour (`logit_bias`, a chosen `id_slot`, ...) is refused by name
//! rather than ignored. `/slots` shows per slot only what is
//! safe to show to every key holder: its number, its context, whether it drafts and whether a request is on
//! it, never a prompt or a reply. `/completions` stays the OpenAI path (as documented), unlike llama-server.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use crate::grammar::GrammarSpec;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc::Receiver;

use crate::engine::StopReason;
use crate::telemetry::Summary;

use super::api::{self, Queued};
use super::error::ApiError;
use super::fair::{ClientKey, Peer};
use super::openai::{self, Checked, Common, Prompt, Stop};
use super::worker::{Msg, TicketGuard, TokenInfo};
use super::App;

/// The body of `POST /completion`, as llama-server reads it (the fields Strata has).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NativeRequest {
    /// A string (tokenized with BOS, special tokens parsed) or a list of token ids.
    pub prompt: Option<Prompt>,
    /// Tokens to generate; -1 (or absent): until an end-of-generation token or the context's end.
    pub n_predict: Option<i64>,
    /// llama-server's fallback for `n_predict`.
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_k: Option<i64>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    /// -1: a fresh seed, as llama-server takes it.
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub ignore_eos: Option<bool>,
    pub stream: Option<bool>,
    /// Accepted either way and honest: Strata always reuses the longest common prefix of a live sequence
    /// (or a parked conversation), and a reused prefix gives bit-identical results to reading it again,
    /// so there is no cache to turn off and nothing a client could observe changes.
    pub cache_prompt: Option<bool>,
    /// With one model served, any name is answered by it (as on /v1; `--strict-model` checks it).
    pub model: Option<String>,
    /// The most likely tokens to show beside each generated one (0 to [`MAX_N_PROBS`]).
    pub n_probs: Option<i64>,
    /// `n_probs` figures from the sampler's distribution (`prob`, `top_probs`) instead of the model's
    /// (`logprob`, `top_logprobs`).
    pub post_sampling_probs: Option<bool>,
    /// The generated token ids in the answer's `tokens`.
    pub return_tokens: Option<bool>,
    // Refused unless they ask for nothing (see `refuse_unsupported`).
    pub logit_bias: Option<Value>,
    pub grammar: Option<String>,
    pub json_schema: Option<Value>,
    pub id_slot: Option<i64>,
}

/// The most `n_probs` a request may ask for.
pub const MAX_N_PROBS: i64 = 100;

impl NativeRequest {
    /// The grammar the output must follow: `grammar` (GBNF) or `json_schema`, not both.
    fn grammar_spec(&self) -> Result<Option<(GrammarSpec, &'static str)>, ApiError> {
        let grammar = self.grammar.as_ref().filter(|g| !g.trim().is_empty());
        let schema = self.json_schema.as_ref().filter(|s| !s.is_null());
        match (grammar, schema) {
            (Some(_), Some(_)) => {
                Err(ApiError::invalid("json_schema", "json_schema: send grammar or json_schema, not both"))
            }
            (Some(g), None) => Ok(Some((GrammarSpec::Gbnf(g.clone()), "grammar"))),
            (None, Some(s)) => {
                Ok(Some((GrammarSpec::JsonSchema(openai::schema_object("json_schema", s)?), "json_schema")))
            }
            (None, None) => Ok(None),
        }
    }

    /// The fields asked for that Strata does not have: a 400 naming the first, not a silent default.
    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        if let Some(n) = self.n_probs.filter(|n| !(0..=MAX_N_PROBS).contains(n)) {
            return Err(ApiError::invalid("n_probs", format!("n_probs must be from 0 to {MAX_N_PROBS}, got {n}")));
        }
        let bias_empty = match &self.logit_bias {
            None | Some(Value::Null) => true,
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Object(o)) => o.is_empty(),
            Some(_) => false,
        };
        if !bias_empty {
            return Err(ApiError::invalid("logit_bias", "logit_bias is not supported"));
        }
        if let Some(id) = self.id_slot.filter(|&id| id != -1) {
            return Err(ApiError::invalid(
                "id_slot",
                format!("id_slot {id}: a request cannot choose its slot here; send -1 (any) or leave it out"),
            ));
        }
        Ok(())
    }

    /// The shared sampling and length fields under llama.cpp's names.
    fn common(&self) -> Result<Common, ApiError> {
        let (n_predict, field) = match (self.n_predict, self.max_tokens) {
            (Some(n), _) => (Some(n), "n_predict"),
            (None, m) => (m, "max_tokens"),
        };
        let max_tokens = match n_predict {
            None | Some(-1) => None,
            Some(n) if n >= 1 => Some(n),
            Some(n) => {
                return Err(ApiError::invalid(field, format!("{field} must be -1 (no limit) or at least 1, got {n}")))
            }
        };
        let seed = match self.seed {
            None | Some(-1) => None,
            Some(s) if s >= 0 => Some(s),
            Some(s) => {
                return Err(ApiError::invalid("seed", format!("seed must be -1 (a fresh one) or 0 or more, got {s}")))
            }
        };
        Ok(Common {
            max_tokens,
            max_tokens_field: field,
            // llama.cpp samples greedily at any temperature <= 0.
            temperature: self.temperature.map(|t| t.max(0.0)),
            top_p: self.top_p,
            n: None,
            seed,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            top_k: self.top_k,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            ignore_eos: self.ignore_eos,
            stream: self.stream,
            include_usage: None,
            has_stream_options: false,
            logit_bias_len: 0,
        })
    }
}

/// `POST /completion`.
pub async fn completion(
    State(app): State<App>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = completion_inner(&app, peer.map(|p| p.0), &headers, body).await;
    api::respond(&app, r)
}

async fn completion_inner(
    app: &App,
    peer: Option<Peer>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    api::check_admission(app)?;
    // Bodies being read and prepared at once are bounded, as on /v1.
    let _permit = app.shared.preparing.try_acquire().map_err(|_| ApiError::queue_full(app.shared.queue_cap))?;
    let bytes = api::read_body(headers, body, app.opts.max_body_bytes, app.opts.body_timeout).await?;
    let req: NativeRequest = openai::parse(&bytes)?;
    drop(bytes);
    // The model does not change until the request is queued (a switch waits for it, and it for a switch).
    let lease = app.models.lease().await?;
    api::check_model(app, &req.model)?;
    req.refuse_unsupported()?;
    let mut checked = openai::check_common(&req.common()?, &req.stop, app.opts.batch, &app.model().sampling)?;
    checked.params.grammar = super::api::compile_grammar(app, req.grammar_spec()?).await?;
    let n_probs = req.n_probs.unwrap_or(0) as usize;
    let return_tokens = req.return_tokens.unwrap_or(false);
    let post_sampling = n_probs > 0 && req.post_sampling_probs.unwrap_or(false);
    // Token ids and figures travel with the engine's messages only when log-probabilities are on.
    checked.params.logprobs = n_probs > 0 || return_tokens;
    checked.params.post_sampling = post_sampling;
    let prompt = api::completion_prompt(app, &req.prompt).await?;
    drop(req);
    let answer = Answer {
        model: app.model().id.clone(),
        prompt_tokens: prompt.len(),
        checked: checked.clone(),
        n_probs,
        post_sampling,
        return_tokens,
    };
    // llama.cpp's request has no `user` field: the lane is the client's address.
    let client = ClientKey::of(None, peer);
    let queued = Queued {
        prompt,
        kept_reply_tokens: 0,
        top_logprobs: n_probs,
        endpoint: "completion",
        reply_format: None,
        client,
    };
    let (mut rx, guard) = api::submit(app, queued, checked)?;
    drop(lease);
    if answer.checked.stream {
        let first = api::first_message(&mut rx).await?;
        return Ok(stream(answer, first, rx, guard).into_response());
    }
    let _guard = guard;
    let (mut choices, summary) = api::collect(&mut rx, 1).await?;
    let (stop, text, tokens) = choices.pop().flatten().unwrap_or((StopReason::Eog, String::new(), Vec::new()));
    let mut last = answer.last(&text, stop, &text, &summary);
    answer.add_tokens(&mut last, &tokens);
    Ok(Json(last).into_response())
}

/// What the answer's objects are made from besides the engine's messages.
struct Answer {
    model: String,
    prompt_tokens: usize,
    checked: Checked,
    n_probs: usize,
    post_sampling: bool,
    return_tokens: bool,
}

impl Answer {
    /// The final object (`"stop": true`): the reply's `content` (empty when streamed: the pieces went
    /// before), how it stopped and the figures. `whole` is the reply's whole text.
    fn last(&self, content: &str, stop: StopReason, whole: &str, s: &Summary) -> Value {
        let (stop_type, stopping_word) = stop_type(stop, &self.checked.params.stop);
        json!({
            "index": 0,
            "content": content,
            "stop": true,
            "model": self.model,
            "tokens_predicted": s.completion_tokens,
            "tokens_evaluated": s.prompt_tokens,
            "generation_settings": self.settings(),
            "has_new_line": whole.contains('\n'),
            // As llama-server without context shift: the reply stopped at the context's end. (A prompt over
            // the context is refused with a 400, never cut.)
            "truncated": stop == StopReason::Context,
            "stop_type": stop_type,
            "stopping_word": stopping_word,
            "timings": timings(s),
            "strata": api::strata_json(s),
        })
    }

    /// One streamed piece of text, made of `tokens`.
    fn piece(&self, text: &str, tokens: &[TokenInfo]) -> Value {
        let mut v = json!({"index": 0, "content": text, "stop": false, "tokens_evaluated": self.prompt_tokens});
        self.add_tokens(&mut v, tokens);
        v
    }

    /// llama.cpp's `tokens` (the ids, with `return_tokens`; otherwise empty) and `completion_probabilities`
    /// (with `n_probs`) of `tokens`, added to an answer object.
    fn add_tokens(&self, v: &mut Value, tokens: &[TokenInfo]) {
        let ids: Vec<u32> = if self.return_tokens { tokens.iter().map(|t| t.id).collect() } else { Vec::new() };
        v["tokens"] = json!(ids);
        if self.n_probs > 0 {
            v["completion_probabilities"] = tokens.iter().map(|t| self.probabilities(t)).collect();
        }
    }

    /// One entry of `completion_probabilities`: the token and its most likely alternatives, as
    /// log-probabilities, or with `post_sampling_probs` as probabilities (those the sampler could not draw
    /// left out).
    fn probabilities(&self, t: &TokenInfo) -> Value {
        let entry = |id: u32, bytes: &[u8]| json!({"id": id, "token": String::from_utf8_lossy(bytes), "bytes": bytes});
        let mut e = entry(t.id, &t.bytes);
        if self.post_sampling {
            e["prob"] = json!(t.logprob.exp());
            e["top_probs"] = t
                .top
                .iter()
                .filter(|(_, _, lp)| *lp > f32::NEG_INFINITY)
                .map(|(id, b, lp)| {
                    let mut x = entry(*id, b);
                    x["prob"] = json!(lp.exp());
                    x
                })
                .collect();
        } else {
            e["logprob"] = json!(t.logprob);
            e["top_logprobs"] = t
                .top
                .iter()
                .map(|(id, b, lp)| {
                    let mut x = entry(*id, b);
                    x["logprob"] = json!(lp);
                    x
                })
                .collect();
        }
        e
    }

    /// llama.cpp's `generation_settings`: the sampling the request ran with (the seed as drawn).
    fn settings(&self) -> Value {
        let p = &self.checked.params;
        let n_predict = if p.max_tokens == usize::MAX { -1 } else { p.max_tokens as i64 };
        json!({
            "n_predict": n_predict,
            "seed": p.sampler.seed,
            "temperature": p.sampler.temperature,
            "top_k": p.sampler.top_k,
            "top_p": p.sampler.top_p,
            "min_p": p.sampler.min_p,
            "repeat_penalty": p.sampler.repeat_penalty,
            "repeat_last_n": p.sampler.repeat_last_n,
            "presence_penalty": p.sampler.presence_penalty,
            "frequency_penalty": p.sampler.frequency_penalty,
            "ignore_eos": p.ignore_eos,
            "stop": p.stop,
            "stream": self.checked.stream,
        })
    }
}

/// llama.cpp's `stop_type` and `stopping_word`: `eos` (an end-of-generation token), `word` (a stop string)
/// or `limit` (`n_predict` or the context's end). The engine cuts the text at the stop string without
/// saying which one matched: with one stop string it is that one; with several it is left empty.
fn stop_type(stop: StopReason, stops: &[String]) -> (&'static str, String) {
    match stop {
        StopReason::Eog => ("eos", String::new()),
        StopReason::Stop => ("word", if stops.len() == 1 { stops[0].clone() } else { String::new() }),
        StopReason::Length | StopReason::Context | StopReason::Cancelled => ("limit", String::new()),
    }
}

/// llama.cpp's `timings`, from the request's figures (`cache_n` is 0 where reuse figures are hidden).
fn timings(s: &Summary) -> Value {
    let per_token_ms = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
    json!({
        "cache_n": s.reused,
        "prompt_n": s.read,
        "prompt_ms": s.prompt_ms,
        "prompt_per_token_ms": per_token_ms(s.prompt_ms, s.read),
        "prompt_per_second": s.prompt_tok_s,
        "predicted_n": s.completion_tokens,
        "predicted_ms": s.gen_ms,
        "predicted_per_token_ms": per_token_ms(s.gen_ms, s.completion_tokens),
        "predicted_per_second": s.gen_tok_s,
    })
}

/// The streamed answer: `data: {"content": piece, "stop": false}` per piece of text, then the final object
/// with `"stop": true`; no `[DONE]` (llama-server ends its native stream without one).
fn stream(
    answer: Answer,
    first: Msg,
    rx: Receiver<Msg>,
    guard: TicketGuard,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    struct St {
        answer: Answer,
        rx: Receiver<Msg>,
        _guard: TicketGuard,
        first: Option<Msg>,
        /// How the reply stopped and its whole text, once its choice is done.
        ended: Option<(StopReason, String)>,
        done: bool,
    }
    let st = St { answer, rx, _guard: guard, first: Some(first), ended: None, done: false };
    let s = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            let msg = match st.first.take() {
                Some(m) => Some(m),
                None => st.rx.recv().await,
            };
            let data = match msg {
                Some(Msg::Text { text, .. }) if text.is_empty() => continue,
                Some(Msg::Text { text, tokens, .. }) => st.answer.piece(&text, &tokens),
                Some(Msg::ChoiceDone { stop_reason, text, .. }) => {
                    st.ended = Some((stop_reason, text));
                    continue;
                }
                Some(Msg::Done(s)) => {
                    st.done = true;
                    let (stop, whole) = st.ended.take().unwrap_or((StopReason::Eog, String::new()));
                    st.answer.last("", stop, &whole, &s)
                }
                Some(Msg::Error(e)) => {
                    st.done = true;
                    e.body()
                }
                Some(Msg::Embeddings(..)) => {
                    st.done = true;
                    Msg::not_generated().body()
                }
                None => {
                    st.done = true;
                    ApiError::internal("the engine ended the request without finishing it").body()
                }
            };
            return Some((Ok(Event::default().data(data.to_string())), st));
        }
    });
    Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// `GET /slots`: one object per slot (`--parallel`), llama-server's fields that are safe to show: `id`,
/// `n_ctx` (each slot's context, `--max-context`), `speculative`, `is_processing`. With
/// `?fail_on_no_slot=1`, 503 when every slot has a request on it (as llama-server answers).
pub async fn slots(State(app): State<App>, Query(query): Query<HashMap<String, String>>) -> Response {
    let flags = app.shared.slot_flags();
    if query.get("fail_on_no_slot").is_some_and(|v| !v.is_empty()) && flags.iter().all(|&busy| busy) {
        let e = ApiError::no_slot_available(flags.len());
        app.shared.metrics.reject(e.code.unwrap_or(e.kind));
        return e.into_response();
    }
    let speculative = app.opts.spec.is_some();
    let list: Vec<Value> = flags
        .iter()
        .enumerate()
        .map(|(id, &busy)| {
            json!({"id": id, "n_ctx": app.model().max_context, "speculative": speculative, "is_processing": busy})
        })
        .collect();
    Json(Value::Array(list)).into_response()
}
