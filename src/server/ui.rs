//! The web UI at `/`: the files of `ui/dist` embedded in the binary when it was built (rust-embed), so that
//! `strata serve` started anywhere, the installed binary and the .deb serve the same app; or, with
//! `--ui-dir DIR`, a directory on disk (for UI development). Without either, `/` is the page that lists
//! the API ([`super::status::index`]).
//!
//! Caching: Vite names the files under `assets/` by their content's hash, so those are immutable for a
//! year; everything else (index.html above all) is revalidated on every load against its ETag (the
//! SHA-256 of its bytes), so a new binary's UI is seen at once. It never serves anything but the embedded
//! files: no path from the request reaches the file system.

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

#[derive(rust_embed::Embed)]
#[folder = "ui/dist"]
#[allow_missing = true]
struct Dist;

/// True when this binary was built with a web UI in it.
pub fn embedded() -> bool {
    Dist::get("index.html").is_some()
}

/// Files the embedded UI holds (for logs and tests).
pub fn embedded_files() -> usize {
    Dist::iter().count()
}

/// The `Cache-Control` of a file: hashed assets for a year, the rest revalidated every time.
fn cache_control(path: &str) -> &'static str {
    if path.starts_with("assets/") {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    }
}

/// Serves an embedded file for `GET`/`HEAD` of its path (`/` is `index.html`); None when there is none.
pub fn serve_embedded(req: &Request) -> Option<Response> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return None;
    }
    let path = req.uri().path().trim_start_matches('/');
    let path = if path.is_empty() { "index.html" } else { path };
    let file = Dist::get(path)?;
    let etag = format!("\"{}\"", hex(&file.metadata.sha256_hash()));
    let mut headers = HeaderMap::new();
    let mime = file.metadata.mimetype();
    let mime = if mime.starts_with("text/") || mime == "application/javascript" {
        format!("{mime}; charset=utf-8")
    } else {
        mime.to_owned()
    };
    if let Ok(v) = HeaderValue::from_str(&mime) {
        headers.insert(header::CONTENT_TYPE, v);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache_control(path)));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, v);
    }
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    if fresh {
        return Some((StatusCode::NOT_MODIFIED, headers).into_response());
    }
    if req.method() == Method::HEAD {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(file.data.len()));
        return Some((StatusCode::OK, headers).into_response());
    }
    Some((StatusCode::OK, headers, file.data.into_owned()).into_response())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_assets_are_immutable_and_the_rest_revalidated() {
        assert_eq!(cache_control("assets/index-abc123.js"), "public, max-age=31536000, immutable");
        assert_eq!(cache_control("index.html"), "no-cache");
        assert_eq!(cache_control("favicon.svg"), "no-cache");
    }
}
