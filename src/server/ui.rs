//! The web UI at `/`: the files of `ui/dist` embedded in the binary when it was built (rust-embed), so that
//! `strata serve` started anywhere, the installed binary and the .deb serve the same app; or, with
//! `--ui-dir DIR`, a directory on disk (for UI development). Without either, `/` is the page that lists
//! the API ([`super::status::index`]).
//!
//! Caching: Vite names the files under `assets/` by their content's hash, so those are immutable for a
//! year; everything else (index.html above all) is revalidated on every load against its ETag (the
//! SHA-256 of its bytes), so a new binary's UI is seen at once. The embedded UI serves nothing but its
//! files: no path from the request reaches the file system. A `--ui-dir` serves only regular files whose
//! real path (symlinks resolved) lies inside the directory: a link to `/etc/passwd` in it is a 404.

use std::path::{Component, Path, PathBuf};

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

/// The largest file a `--ui-dir` serves (a built UI's files are far smaller).
const DIR_FILE_LIMIT_BYTES: u64 = 64 << 20;

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

/// The request's file path (`/` is `index.html`), for `GET` and `HEAD` only.
fn requested(req: &Request) -> Option<&str> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return None;
    }
    let path = req.uri().path().trim_start_matches('/');
    Some(if path.is_empty() { "index.html" } else { path })
}

/// Serves an embedded file for `GET`/`HEAD` of its path (`/` is `index.html`); None when there is none.
pub fn serve_embedded(req: &Request) -> Option<Response> {
    let path = requested(req)?;
    let file = Dist::get(path)?;
    let etag = format!("\"{}\"", hex(&file.metadata.sha256_hash()));
    Some(file_response(req, path, file.metadata.mimetype(), Some(&etag), file.data.into_owned()))
}

/// Serves a file of `root` (a canonical directory) for `GET`/`HEAD`: only a regular file whose real path
/// lies inside `root`; None otherwise (a missing file, `..`, a symlink that leads out, a directory).
pub fn serve_dir(root: &Path, req: &Request) -> Option<Response> {
    let path = requested(req)?;
    let file = resolve_inside(root, path)?;
    let meta = std::fs::metadata(&file).ok()?;
    if !meta.is_file() || meta.len() > DIR_FILE_LIMIT_BYTES {
        return None;
    }
    let bytes = std::fs::read(&file).ok()?;
    let mime = mime_guess::from_path(&file).first_or_octet_stream();
    // A directory under development changes under the server: revalidate everything, tag nothing.
    Some(file_response(req, "", mime.essence_str(), None, bytes))
}

/// The real path of `rel` under `root` when it stays inside: plain components only, and after symlinks
/// are resolved still under `root`.
fn resolve_inside(root: &Path, rel: &str) -> Option<PathBuf> {
    let rel = Path::new(rel);
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) || rel.to_str()?.contains(['\\', '\0']) {
        return None;
    }
    let real = root.join(rel).canonicalize().ok()?;
    real.starts_with(root).then_some(real)
}

/// One file's answer: its type, cache headers and ETag (304 when the client has it), body unless HEAD.
fn file_response(req: &Request, path: &str, mime: &str, etag: Option<&str>, data: Vec<u8>) -> Response {
    let mut headers = HeaderMap::new();
    let mime = if mime.starts_with("text/") || mime == "application/javascript" {
        format!("{mime}; charset=utf-8")
    } else {
        mime.to_owned()
    };
    if let Ok(v) = HeaderValue::from_str(&mime) {
        headers.insert(header::CONTENT_TYPE, v);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache_control(path)));
    if let Some(v) = etag.and_then(|e| HeaderValue::from_str(e).ok()) {
        headers.insert(header::ETAG, v);
    }
    let fresh = etag.is_some_and(|etag| {
        req.headers()
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|tags| tags.split(',').any(|t| t.trim() == etag || t.trim() == "*"))
    });
    if fresh {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    if req.method() == Method::HEAD {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(data.len()));
        return (StatusCode::OK, headers).into_response();
    }
    (StatusCode::OK, headers, data).into_response()
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

    #[cfg(unix)]
    #[test]
    fn a_ui_dir_serves_its_files_and_no_link_out_of_it() {
        let base = std::env::temp_dir().join(format!("strata-ui-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("ui/assets")).unwrap();
        std::fs::write(base.join("ui/index.html"), "<p>ui</p>").unwrap();
        std::fs::write(base.join("ui/assets/a.js"), "1").unwrap();
        std::fs::write(base.join("secret.txt"), "secret").unwrap();
        std::os::unix::fs::symlink(base.join("secret.txt"), base.join("ui/leak.txt")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", base.join("ui/passwd")).unwrap();
        std::os::unix::fs::symlink(base.join("ui/index.html"), base.join("ui/home.html")).unwrap();
        let root = base.join("ui").canonicalize().unwrap();
        let get = |p: &str| {
            let req = Request::builder().uri(p).body(axum::body::Body::empty()).unwrap();
            serve_dir(&root, &req).map(|r| r.status())
        };
        assert_eq!(get("/"), Some(StatusCode::OK));
        assert_eq!(get("/assets/a.js"), Some(StatusCode::OK));
        // A link that stays inside is served; one that leads out is not, nor is `..`.
        assert_eq!(get("/home.html"), Some(StatusCode::OK));
        assert_eq!(get("/leak.txt"), None);
        assert_eq!(get("/passwd"), None);
        assert_eq!(get("/../secret.txt"), None);
        assert_eq!(get("/assets"), None);
        assert_eq!(get("/missing.js"), None);
        let _ = std::fs::remove_dir_all(&base);
    }
}
