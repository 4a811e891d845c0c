//! OpenAI's embeddings API, `POST /v1/embeddings` (and `/embeddings`): one vector per input, pooled as the
//! model's `pooling_type` says (mean by default; `strata serve --pooling` overrides it) and L2-normalized
//! (`Model::embed`).
//!
//! `input` is what OpenAI takes (a string, a list of strings, a list of token ids, a list of token-id
//! lists) and what llama.cpp's server takes beside it: a list that mixes ids and strings is one input
//! (the strings tokenized in place), and an input may be an object, `{"prompt_string": text}` or
//! `{"content": [{"type": "text", "text": ...}, ...]}` (text parts only: this engine reads no images or
//! sound). A text is tokenized as a completion prompt is (BOS when the model asks for it, special tokens
//! parsed), with EOS after it when the model's tokenizer asks for one (`add_eos_token`: the embedding
//! models that pool the last token). `encoding_format` is `float` (a JSON array) or `base64` (the
//! little-endian f32 bytes, what the official Python client asks for).
//!
//! With `--pooling none` every token's vector comes back unnormalized, which OpenAI's format cannot carry:
//! `/v1/embeddings` refuses it with a 400, and `/embeddings` answers llama.cpp's form,
//! `[{"index": i, "embedding": [[...], ...]}]`, one list of vectors per input. The job goes through the
//! engine's queue like any other and runs between two steps of the replies generating.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::GenerateParams;
use crate::model::Pooling;

use super::api::{self, check_admission, check_model, read_body, Queued};
use super::error::ApiError;
use super::fair::{ClientKey, Peer};
use super::openai::{self, Checked};
use super::worker::{Msg, Task};
use super::App;

/// Inputs one request may embed (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: Option<Value>,
    pub encoding_format: Option<String>,
    pub dimensions: Option<i64>,
    pub user: Option<String>,
}

/// How the vectors are written in the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    Float,
    Base64,
}

/// Where a request came in: the OpenAI path, or the `/embeddings` path that also speaks llama.cpp's
/// per-token form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    OpenAi,
    Bare,
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(app): State<App>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = embeddings_inner(&app, peer.map(|p| p.0), &headers, body, Path::OpenAi).await;
    api::respond(&app, r)
}

/// `POST /embeddings`: the same, and the per-token vectors with `--pooling none`.
pub async fn embeddings_bare(
    State(app): State<App>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = embeddings_inner(&app, peer.map(|p| p.0), &headers, body, Path::Bare).await;
    api::respond(&app, r)
}

async fn embeddings_inner(
    app: &App,
    peer: Option<Peer>,
    headers: &HeaderMap,
    body: Body,
    path: Path,
) -> Result<Response, ApiError> {
    check_admission(app)?;
    let _permit = app.shared.preparing.try_acquire().map_err(|_| ApiError::queue_full(app.shared.queue_cap))?;
    let bytes = read_body(headers, body, app.opts.max_body_bytes, app.opts.body_timeout).await?;
    let req: EmbeddingRequest = openai::parse(&bytes)?;
    drop(bytes);
    // The model does not change until the request is queued (a switch waits for it, and it for a switch).
    let lease = app.models.lease().await?;
    let model = check_model(app, &req.model)?;
    let encoding = match req.encoding_format.as_deref() {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format must be \"float\" or \"base64\", got {:?}", openai::truncate(other, 40)),
            ))
        }
    };
    let n_embd = app.model().model.cfg.n_embd;
    if let Some(d) = req.dimensions.filter(|&d| d != n_embd as i64) {
        return Err(ApiError::invalid(
            "dimensions",
            format!("dimensions {d}: this model's embeddings have {n_embd} dimensions (send {n_embd} or none)"),
        ));
    }
    let pooling = app.model().model.cfg.pooling;
    if let Pooling::Unsupported(n) = pooling {
        return Err(ApiError::invalid(
            "model",
            format!(
                "this model's pooling_type is {n} ({}): it makes no embeddings (mean, cls and last are supported)",
                pooling.name()
            ),
        ));
    }
    let per_token = pooling == Pooling::None;
    if per_token && path == Path::OpenAi {
        return Err(ApiError::invalid(
            "model",
            "the server runs with --pooling none (one vector per token), which OpenAI's embeddings format cannot \
             carry: POST /embeddings for the per-token vectors, or start the server with --pooling mean, cls or last",
        ));
    }
    let inputs = input_tokens(app, req.input).await?;
    let client = ClientKey::of(req.user.as_deref(), peer);
    let queued = Queued {
        prompt: Vec::new(),
        kept_reply_tokens: 0,
        top_logprobs: 0,
        endpoint: "embeddings",
        reply_format: None,
        client,
    };
    let checked = Checked { params: GenerateParams::default(), choices: 1, stream: false, include_usage: false };
    let (mut rx, _guard) = api::submit_task(app, Task::Embed(inputs), queued, checked)?;
    drop(lease);
    let (vectors, summary) = match rx.recv().await {
        Some(Msg::Embeddings(v, s)) => (v, s),
        Some(Msg::Error(e)) => return Err(e),
        _ => return Err(ApiError::internal("the engine ended the embedding request without a reply")),
    };
    if per_token {
        let data: Vec<Value> = vectors
            .iter()
            .enumerate()
            .map(|(index, v)| {
                let rows: Vec<Value> = v.chunks_exact(n_embd).map(|row| encode(row, encoding)).collect();
                json!({"index": index, "embedding": rows})
            })
            .collect();
        return Ok(Json(Value::Array(data)).into_response());
    }
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| json!({"object": "embedding", "index": index, "embedding": encode(v, encoding)}))
        .collect();
    let tokens = summary.prompt_tokens;
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

/// One vector as the reply writes it.
fn encode(v: &[f32], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => json!(v),
        Encoding::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

/// One piece of an input: a text to tokenize or token ids as sent.
#[derive(Debug, PartialEq)]
enum Piece {
    Text(String),
    Ids(Vec<i64>),
}

/// The request's `input` as inputs, each a list of pieces (see the module comment for the forms).
fn inputs_of(input: Option<Value>) -> Result<Vec<Vec<Piece>>, ApiError> {
    let bad = |field: &str, why: String| ApiError::invalid(field.to_owned(), format!("{field} {why}"));
    let input = match input {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("input", "input is required: a string, a list of strings or token ids"))
        }
        Some(v) => v,
    };
    match input {
        Value::String(t) => Ok(vec![vec![Piece::Text(t)]]),
        Value::Object(_) => Ok(vec![object_input("input", &input)?]),
        Value::Array(items) if items.is_empty() => {
            Err(ApiError::invalid("input", "input is an empty list: send at least one input"))
        }
        Value::Array(items) if is_mixed(&items) => Ok(vec![mixed_input("input", &items)?]),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let field = format!("input[{i}]");
                match item {
                    Value::String(t) => Ok(vec![Piece::Text(t.clone())]),
                    Value::Array(list) if list.is_empty() => Err(bad(&field, "is an empty token list".into())),
                    Value::Array(list) => mixed_input(&field, list),
                    Value::Object(_) => object_input(&field, item),
                    other => Err(bad(
                        &field,
                        format!("is {}: each input is a string, a list of token ids or an object", kind(other)),
                    )),
                }
            })
            .collect(),
        other => Err(bad("input", format!("is {}: send a string, a list of strings or token ids", kind(&other)))),
    }
}

/// Whether a list is one input that mixes token ids and strings (llama.cpp's rule): at least one id, and
/// nothing but ids and strings.
fn is_mixed(items: &[Value]) -> bool {
    items.iter().any(Value::is_number) && items.iter().all(|v| v.is_number() || v.is_string())
}

/// One input from a list of token ids and strings, in order.
fn mixed_input(field: &str, items: &[Value]) -> Result<Vec<Piece>, ApiError> {
    let mut pieces: Vec<Piece> = Vec::new();
    for (j, v) in items.iter().enumerate() {
        match v {
            Value::String(t) => pieces.push(Piece::Text(t.clone())),
            Value::Number(n) => {
                let id = n.as_i64().ok_or_else(|| {
                    ApiError::invalid(format!("{field}[{j}]"), format!("{field}[{j}]: {n} is not a token id"))
                })?;
                match pieces.last_mut() {
                    Some(Piece::Ids(ids)) => ids.push(id),
                    _ => pieces.push(Piece::Ids(vec![id])),
                }
            }
            other => {
                return Err(ApiError::invalid(
                    format!("{field}[{j}]"),
                    format!("{field}[{j}] is {}: a list input holds token ids and strings", kind(other)),
                ))
            }
        }
    }
    Ok(pieces)
}

/// One input from llama.cpp's object form: `{"prompt_string": text}` or `{"content": [text parts]}`.
fn object_input(field: &str, v: &Value) -> Result<Vec<Piece>, ApiError> {
    if let Some(t) = v.get("prompt_string") {
        return match t {
            Value::String(t) => Ok(vec![Piece::Text(t.clone())]),
            other => Err(ApiError::invalid(
                format!("{field}.prompt_string"),
                format!("{field}.prompt_string is {}: it is a string", kind(other)),
            )),
        };
    }
    let Some(Value::Array(parts)) = v.get("content") else {
        return Err(ApiError::invalid(
            field.to_owned(),
            format!(
                "{field} is an object without prompt_string or a content list: send {{\"prompt_string\": text}} or \
                 {{\"content\": [{{\"type\": \"text\", \"text\": ...}}]}}"
            ),
        ));
    };
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{field}.content[{j}]");
        match (part.get("type").and_then(Value::as_str), part.get("text")) {
            (Some("text"), Some(Value::String(t))) => text.push_str(t),
            (Some("text"), _) => return Err(ApiError::invalid(at.clone(), format!("{at} has no text string"))),
            (Some(t @ ("image_url" | "input_audio" | "input_video" | "image" | "audio" | "video")), _) => {
                return Err(ApiError::invalid(
                    at.clone(),
                    format!("{at} is a {t} part: this model reads text only (no images, sound or video)"),
                ))
            }
            (Some(t), _) => {
                return Err(ApiError::invalid(
                    at.clone(),
                    format!("{at} has type {:?}: only \"text\" parts are read", openai::truncate(t, 40)),
                ))
            }
            (None, _) => return Err(ApiError::invalid(at.clone(), format!("{at} has no type"))),
        }
    }
    Ok(vec![Piece::Text(text)])
}

/// A JSON value's kind, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The request's inputs as token lists: texts tokenized off the async threads (BOS before an input that
/// starts with text, when the model asks for one; EOS after one that ends with text, when it asks for
/// one), ids checked against the vocabulary, each checked against the context; an input without tokens is
/// refused by its index.
async fn input_tokens(app: &App, input: Option<Value>) -> Result<Vec<Vec<u32>>, ApiError> {
    let n_vocab = app.model().tokenizer.n_vocab();
    let inputs = inputs_of(input)?;
    if inputs.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!("input lists {} inputs: at most {MAX_INPUTS} per request", inputs.len()),
        ));
    }
    // Ids are checked here; texts go to the blocking pool below.
    let mut checked: Vec<Vec<Result<Vec<u32>, String>>> = Vec::with_capacity(inputs.len());
    for (i, pieces) in inputs.into_iter().enumerate() {
        let field = format!("input[{i}]");
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces {
            out.push(match p {
                Piece::Text(t) => Err(t),
                Piece::Ids(ids) => Ok(openai::token_ids(&field, &ids, n_vocab)?),
            });
        }
        checked.push(out);
    }
    let m = app.model();
    let out = tokio::task::spawn_blocking(move || {
        let tok = &m.tokenizer;
        let eos = tok.eos_id().filter(|_| tok.add_eos_token());
        checked
            .into_iter()
            .map(|pieces| {
                let n = pieces.len();
                let mut ids = Vec::new();
                for (j, p) in pieces.into_iter().enumerate() {
                    match p {
                        Ok(list) => ids.extend(list),
                        Err(text) => {
                            ids.extend(tok.encode_with_bos(&text, j == 0));
                            if j + 1 == n {
                                ids.extend(eos);
                            }
                        }
                    }
                }
                ids
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?;
    for (i, ids) in out.iter().enumerate() {
        let field = format!("input[{i}]");
        if ids.is_empty() {
            return Err(ApiError::invalid(
                field.clone(),
                format!("{field} has no tokens: the text is empty and this model adds no BOS token to it"),
            ));
        }
        check_length(app, ids.len(), &field)?;
    }
    Ok(out)
}

/// An input longer than the context is refused (an embedding reads its whole input in one sequence).
fn check_length(app: &App, n_tokens: usize, field: &str) -> Result<(), ApiError> {
    let max = app.model().max_context;
    if n_tokens > max {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(
                field.to_owned(),
                format!(
                    "{field} is {n_tokens} tokens, too large for the context of {max} (--max-context): shorten it by {}",
                    n_tokens - max
                ),
            )
        });
    }
    Ok(())
}
