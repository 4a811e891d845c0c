//! OpenAI's embeddings API, `POST /v1/embeddings` (and `/embeddings`): one vector per input, pooled as the
//! model's `pooling_type` says (mean by default) and L2-normalized (`Model::embed`).
//!
//! `input` is a string, a list of strings, a list of token ids or a list of token-id lists (as OpenAI
//! takes it). A text is tokenized as a completion prompt is (BOS when the model asks for it, special
//! tokens parsed), with EOS after it when the model's tokenizer asks for one (`add_eos_token`: the
//! embedding models that pool the last token). `encoding_format` is `float` (a JSON array) or `base64`
//! (the little-endian f32 bytes, what the official Python client asks for). The job goes through the
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
use super::openai::{self, Checked, Prompt};
use super::worker::{Msg, Task};
use super::App;

/// Inputs one request may embed (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: Option<Prompt>,
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

pub async fn embeddings(
    State(app): State<App>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = embeddings_inner(&app, peer.map(|p| p.0), &headers, body).await;
    api::respond(&app, r)
}

async fn embeddings_inner(
    app: &App,
    peer: Option<Peer>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    check_admission(app)?;
    let _permit = app.shared.preparing.try_acquire().map_err(|_| ApiError::queue_full(app.shared.queue_cap))?;
    let bytes = read_body(headers, body, app.opts.max_body_bytes, app.opts.body_timeout).await?;
    let req: EmbeddingRequest = openai::parse(&bytes)?;
    drop(bytes);
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
    let n_embd = app.model.model.cfg.n_embd;
    if let Some(d) = req.dimensions.filter(|&d| d != n_embd as i64) {
        return Err(ApiError::invalid(
            "dimensions",
            format!("dimensions {d}: this model's embeddings have {n_embd} dimensions (send {n_embd} or none)"),
        ));
    }
    let pooling = app.model.model.cfg.pooling;
    if let Pooling::Unsupported(n) = pooling {
        return Err(ApiError::invalid(
            "model",
            format!(
                "this model's pooling_type is {n} ({}): it makes no embeddings (mean, cls and last are supported)",
                pooling.name()
            ),
        ));
    }
    let inputs = input_tokens(app, req.input).await?;
    let client = ClientKey::of(req.user.as_deref(), peer);
    let queued = Queued {
        prompt: Vec::new(),
        kept_reply_tokens: 0,
        top_logprobs: 0,
        endpoint: "embeddings",
        opens_think: None,
        client,
    };
    let checked = Checked { params: GenerateParams::default(), choices: 1, stream: false, include_usage: false };
    let (mut rx, _guard) = api::submit_task(app, Task::Embed(inputs), queued, checked)?;
    let (vectors, summary) = match rx.recv().await {
        Some(Msg::Embeddings(v, s)) => (v, s),
        Some(Msg::Error(e)) => return Err(e),
        _ => return Err(ApiError::internal("the engine ended the embedding request without a reply")),
    };
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

/// The request's inputs as token lists: texts tokenized off the async threads, ids checked against the
/// vocabulary, each checked against the context; an empty one is refused by its index.
async fn input_tokens(app: &App, input: Option<Prompt>) -> Result<Vec<Vec<u32>>, ApiError> {
    let n_vocab = app.model.tokenizer.n_vocab();
    let texts: Vec<Result<String, Vec<i64>>> = match input {
        None => return Err(ApiError::invalid("input", "input is required: a string, a list of strings or token ids")),
        Some(Prompt::Text(t)) => vec![Ok(t)],
        Some(Prompt::Texts(list)) => list.into_iter().map(Ok).collect(),
        // `[]` reads as an empty token list: an empty list of inputs either way.
        Some(Prompt::Tokens(ids)) if ids.is_empty() => Vec::new(),
        Some(Prompt::Tokens(ids)) => vec![Err(ids)],
        Some(Prompt::TokenLists(lists)) => lists.into_iter().map(Err).collect(),
    };
    if texts.is_empty() {
        return Err(ApiError::invalid("input", "input is an empty list: send at least one input"));
    }
    if texts.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!("input lists {} inputs: at most {MAX_INPUTS} per request", texts.len()),
        ));
    }
    let mut out = Vec::with_capacity(texts.len());
    let mut to_encode = Vec::new();
    for (i, item) in texts.into_iter().enumerate() {
        let field = format!("input[{i}]");
        match item {
            Ok(text) if text.is_empty() => return Err(ApiError::invalid(field.clone(), format!("{field} is empty"))),
            Ok(text) => {
                to_encode.push((out.len(), text));
                out.push(Vec::new());
            }
            Err(ids) if ids.is_empty() => {
                return Err(ApiError::invalid(field.clone(), format!("{field} is an empty token list")))
            }
            Err(ids) => out.push(openai::token_ids(&field, &ids, n_vocab)?),
        }
    }
    if !to_encode.is_empty() {
        let m = app.model.clone();
        let encoded = tokio::task::spawn_blocking(move || {
            let tok = &m.tokenizer;
            let eos = tok.eos_id().filter(|_| tok.add_eos_token());
            to_encode
                .into_iter()
                .map(|(at, text)| {
                    let mut ids = tok.encode_with_bos(&text, true);
                    ids.extend(eos);
                    (at, ids)
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?;
        for (at, ids) in encoded {
            out[at] = ids;
        }
    }
    for (i, ids) in out.iter().enumerate() {
        api::check_context(app, ids.len(), &format!("input[{i}]"))?;
    }
    Ok(out)
}
