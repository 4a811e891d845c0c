//! Errors of the HTTP API, in OpenAI's shape: `{"error":{"message","type","param","code"}}` with the status
//! that goes with them. Every handler's failure becomes one of these; nothing reaches the client as a bare
//! status or a dropped connection.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// One API error: what the client gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type`: invalid_request_error, authentication_error, not_found_error, server_error, ...
    pub kind: &'static str,
    pub message: String,
    /// The request field the error is about (`messages[1].role`), when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a Retry-After header (503 when the queue is full).
    pub retry_after_s: Option<u32>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, kind, message: message.into(), param: None, code: None, retry_after_s: None }
    }

    /// 400: the request is wrong; `param` names the field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        let param = param.into();
        ApiError {
            param: (!param.is_empty()).then_some(param),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400 for a body that is not JSON at all.
    pub fn malformed(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("invalid_json"),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or incorrect API key: send it as 'Authorization: Bearer KEY' or 'X-Api-Key: KEY' (the server was started with --api-key)",
            )
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError { code: Some("not_found"), ..ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message) }
    }

    pub fn model_not_found(message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
        }
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "this path does not take that method")
    }

    pub fn too_large(limit_bytes: u64) -> ApiError {
        ApiError {
            code: Some("request_too_large"),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!(
                    "the request body is larger than the limit of {} MiB (--max-body-mib)",
                    limit_bytes / (1 << 20)
                ),
            )
        }
    }

    pub fn body_timeout(seconds: u64) -> ApiError {
        ApiError {
            code: Some("request_timeout"),
            ..ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!("the request body did not arrive within {seconds} s"),
            )
        }
    }

    /// 403 for a `Host` this server does not answer (a DNS-rebinding page sends its own name).
    pub fn host_not_allowed(host: &str) -> ApiError {
        ApiError {
            code: Some("host_not_allowed"),
            ..ApiError::new(
                StatusCode::FORBIDDEN,
                "permission_error",
                format!(
                    "this server does not answer the host name {:?}: it answers localhost and IP addresses; to reach \
                     it by that name, start it with --allowed-host {}",
                    super::openai::truncate(host, 100),
                    super::openai::truncate(host.rsplit_once(':').map_or(host, |(h, _)| h), 100)
                ),
            )
        }
    }

    /// 403 for a browser request from another site's page.
    pub fn origin_not_allowed(origin: &str) -> ApiError {
        ApiError {
            code: Some("origin_not_allowed"),
            ..ApiError::new(
                StatusCode::FORBIDDEN,
                "permission_error",
                format!(
                    "requests from pages of {:?} are not allowed: start the server with --cors-origin {} to allow them",
                    super::openai::truncate(origin, 100),
                    super::openai::truncate(origin, 100)
                ),
            )
        }
    }

    /// 415 for a body that is not declared as JSON (a page's `text/plain` POST needs no CORS preflight).
    pub fn not_json(content_type: Option<&str>) -> ApiError {
        let given = match content_type {
            Some(t) => format!("is {:?}", super::openai::truncate(t, 100)),
            None => "is missing".to_owned(),
        };
        ApiError {
            code: Some("unsupported_media_type"),
            ..ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                format!(
                    "the request body must be JSON sent with 'Content-Type: application/json'; the Content-Type {given} \
                     (curl: -H 'Content-Type: application/json')"
                ),
            )
        }
    }

    /// 504 for a request that ran past `--request-timeout-s` (in the queue and in the engine together).
    pub fn request_timeout(limit_s: u64) -> ApiError {
        ApiError {
            code: Some("request_timeout"),
            ..ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                format!(
                    "the request took longer than the server's limit of {limit_s} s (--request-timeout-s) and was \
                     ended: ask for fewer tokens (max_tokens), or start the server with a higher limit"
                ),
            )
        }
    }

    /// 503 when as many event streams are open as `--max-event-streams` allows.
    pub fn too_many_streams(limit: usize) -> ApiError {
        ApiError {
            code: Some("too_many_event_streams"),
            retry_after_s: Some(5),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                format!("{limit} event streams are already open (--max-event-streams {limit}): close one and retry"),
            )
        }
    }

    /// 503 when as many connections are open as `--max-connections` allows.
    pub fn too_many_connections(limit: usize) -> ApiError {
        ApiError {
            code: Some("too_many_connections"),
            retry_after_s: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                format!("{limit} connections are already open (--max-connections {limit}): try again shortly"),
            )
        }
    }

    pub fn queue_full(queue: usize) -> ApiError {
        ApiError {
            code: Some("queue_full"),
            retry_after_s: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                format!("{queue} requests are already waiting (--queue {queue}): try again shortly"),
            )
        }
    }

    /// 503 of `GET /slots?fail_on_no_slot=1` (llama.cpp's): every slot has a request on it.
    pub fn no_slot_available(slots: usize) -> ApiError {
        ApiError {
            code: Some("no_slot_available"),
            retry_after_s: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                format!("no slot available: all {slots} slots are processing a request (--parallel)"),
            )
        }
    }

    /// 503: a model switch took longer than a request waits for it.
    pub fn switching_models() -> ApiError {
        ApiError {
            code: Some("model_switching"),
            retry_after_s: Some(5),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                "the server is switching models and has not finished: send the request again in a moment",
            )
        }
    }

    pub fn shutting_down() -> ApiError {
        ApiError {
            code: Some("shutting_down"),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "the server is shutting down")
        }
    }

    /// 503: the engine cannot compute any more (a GPU faulted for good); the server is exiting.
    pub fn unhealthy(why: impl Into<String>) -> ApiError {
        ApiError { code: Some("unhealthy"), ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unhealthy", why) }
    }

    /// 503 for one request the devices had no memory for; the server goes on.
    pub fn out_of_memory(why: impl Into<String>) -> ApiError {
        ApiError { code: Some("out_of_memory"), ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", why) }
    }

    /// 409: the request conflicts with what is under way (a download of the same file, too many at once).
    pub fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { code: Some(code), ..ApiError::new(StatusCode::CONFLICT, "invalid_request_error", message) }
    }

    /// 502: a server this one asked (the Hugging Face Hub) failed or refused; `message` says which and why.
    pub fn upstream(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { code: Some(code), ..ApiError::new(StatusCode::BAD_GATEWAY, "server_error", message) }
    }

    /// 500 for a failure of the engine that is not the client's doing.
    pub fn internal(why: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", why)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(Body {
            error: Inner { message: &self.message, kind: self.kind, param: self.param.as_deref(), code: self.code },
        })
        .unwrap_or(serde_json::Value::Null)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after_s {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
