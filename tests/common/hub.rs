//! A local HTTP server that speaks the subset of the Hugging Face Hub's API Strata uses, with the faults a
//! real download meets: search, a repository's tree (paged), resolve with a redirect to another host (the
//! CDN: `localhost` where the Hub is `127.0.0.1`) that serves ranges, a connection cut partway, a file
//! whose bytes are not the sha256 listed, a slow file, and a gated repository (401 without a token, 403
//! with a wrong one). Every request is logged for the tests to read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The token a gated repository takes.
pub const GOOD_TOKEN: &str = "hf_good_token";

#[derive(Clone)]
pub struct MockFile {
    pub path: String,
    pub bytes: Arc<Vec<u8>>,
    /// The sha256 the tree lists (by default the bytes' own).
    pub listed_sha256: String,
    /// The first request without a range sends this many bytes, then the connection is cut.
    pub cut_at: Option<usize>,
    /// Sent in 64 KiB pieces 40 ms apart.
    pub slow: bool,
}

impl MockFile {
    pub fn new(path: &str, bytes: Vec<u8>) -> MockFile {
        let listed_sha256 = sha256_hex(&bytes);
        MockFile { path: path.into(), bytes: Arc::new(bytes), listed_sha256, cut_at: None, slow: false }
    }
}

#[derive(Clone)]
pub struct MockRepo {
    pub id: String,
    pub gated: bool,
    pub downloads: u64,
    pub files: Vec<MockFile>,
}

/// One request the mock saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

#[derive(Clone)]
struct Hub {
    repos: Arc<Vec<MockRepo>>,
    log: Arc<Mutex<Vec<Seen>>>,
    /// Full-file requests served per CDN path (the first one of a `cut_at` file is cut).
    served: Arc<Mutex<HashMap<String, usize>>>,
    port: u16,
}

pub struct MockHub {
    /// `http://127.0.0.1:PORT`: what `HF_ENDPOINT` is set to.
    pub url: String,
    log: Arc<Mutex<Vec<Seen>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl MockHub {
    pub fn start(repos: Vec<MockRepo>) -> MockHub {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let hub = Hub { repos: Arc::new(repos), log: log.clone(), served: Default::default(), port };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let app = Router::new()
                    .route("/api/models", get(search))
                    .route("/api/models/{owner}/{name}/tree/{rev}", get(tree))
                    .route("/{owner}/{name}/resolve/{rev}/{*file}", get(resolve))
                    .route("/cdn/{owner}/{name}/{*file}", get(cdn))
                    .with_state(hub);
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        MockHub { url: format!("http://127.0.0.1:{port}"), log, _stop: stop }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn record(hub: &Hub, path: String, headers: &HeaderMap) {
    let h = |n: header::HeaderName| headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
    hub.log.lock().unwrap().push(Seen { path, range: h(header::RANGE), authorization: h(header::AUTHORIZATION) });
}

/// 401 without a token, 403 with a wrong one, None with the right one (or an open repository).
fn gate(repo: &MockRepo, headers: &HeaderMap) -> Option<Response> {
    if !repo.gated {
        return None;
    }
    match headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        None => Some((StatusCode::UNAUTHORIZED, "Access to this model is restricted").into_response()),
        Some(a) if a == format!("Bearer {GOOD_TOKEN}") => None,
        Some(_) => Some((StatusCode::FORBIDDEN, "Access to this model is restricted").into_response()),
    }
}

fn find<'a>(hub: &'a Hub, owner: &str, name: &str) -> Option<&'a MockRepo> {
    hub.repos.iter().find(|r| r.id == format!("{owner}/{name}"))
}

async fn search(State(hub): State<Hub>, Query(q): Query<Vec<(String, String)>>, headers: HeaderMap) -> Response {
    record(&hub, "/api/models".into(), &headers);
    let text = q.iter().find(|(k, _)| k == "search").map(|(_, v)| v.to_lowercase()).unwrap_or_default();
    let limit: usize = q.iter().find(|(k, _)| k == "limit").and_then(|(_, v)| v.parse().ok()).unwrap_or(20);
    let mut hits: Vec<&MockRepo> = hub.repos.iter().filter(|r| r.id.to_lowercase().contains(&text)).collect();
    hits.sort_by_key(|r| std::cmp::Reverse(r.downloads));
    let v: Vec<Value> = hits
        .iter()
        .take(limit)
        .map(|r| {
            json!({"_id": "x", "id": r.id, "downloads": r.downloads, "likes": 3,
                   "gated": if r.gated { json!("manual") } else { json!(false) },
                   "lastModified": "2026-11-01T00:00:00.000Z", "tags": ["gguf"]})
        })
        .collect();
    axum::Json(v).into_response()
}

/// The tree, two entries a page (`?cursor=N`), with a README and a folder among the files.
async fn tree(
    State(hub): State<Hub>,
    Path((owner, name, _rev)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    record(&hub, format!("/api/models/{owner}/{name}/tree"), &headers);
    let Some(repo) = find(&hub, &owner, &name) else {
        // As the Hub answers a client without a token: 401, and the error code says what is missing.
        return (StatusCode::UNAUTHORIZED, [("x-error-code", "RepoNotFound")], "Repository not found").into_response();
    };
    if let Some(r) = gate(repo, &headers) {
        return r;
    }
    let mut entries = vec![
        json!({"type": "file", "oid": "1", "size": 12, "path": "README.md"}),
        json!({"type": "directory", "oid": "2", "size": 0, "path": "extra"}),
    ];
    for f in &repo.files {
        entries.push(json!({"type": "file", "oid": "3", "size": 135, "path": f.path,
                            "lfs": {"oid": f.listed_sha256, "size": f.bytes.len(), "pointerSize": 135}}));
    }
    let at: usize = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
    let page: Vec<Value> = entries.iter().skip(at).take(2).cloned().collect();
    let mut resp = axum::Json(page).into_response();
    if at + 2 < entries.len() {
        let next = format!(
            "<http://127.0.0.1:{}/api/models/{owner}/{name}/tree/main?recursive=true&cursor={}>; rel=\"next\"",
            hub.port,
            at + 2
        );
        resp.headers_mut().insert(header::LINK, next.parse().unwrap());
    }
    resp
}

/// A redirect to the CDN on another host name (the token must not follow it).
async fn resolve(
    State(hub): State<Hub>,
    Path((owner, name, _rev, file)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    record(&hub, format!("/{owner}/{name}/resolve/{file}"), &headers);
    let Some(repo) = find(&hub, &owner, &name) else {
        return (StatusCode::NOT_FOUND, "Repository not found").into_response();
    };
    if let Some(r) = gate(repo, &headers) {
        return r;
    }
    if !repo.files.iter().any(|f| f.path == file) {
        return (StatusCode::NOT_FOUND, "Entry not found").into_response();
    }
    let to = format!("http://localhost:{}/cdn/{owner}/{name}/{file}", hub.port);
    (StatusCode::FOUND, [(header::LOCATION, to)]).into_response()
}

async fn cdn(
    State(hub): State<Hub>,
    Path((owner, name, file)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/cdn/{owner}/{name}/{file}");
    record(&hub, path.clone(), &headers);
    let Some(f) = find(&hub, &owner, &name).and_then(|r| r.files.iter().find(|f| f.path == file)).cloned() else {
        return (StatusCode::NOT_FOUND, "no such object").into_response();
    };
    let len = f.bytes.len();
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok()).and_then(|r| {
        let (a, b) = r.strip_prefix("bytes=")?.split_once('-')?;
        let start: usize = a.parse().ok()?;
        let end: usize = if b.is_empty() { len - 1 } else { b.parse::<usize>().ok()?.min(len - 1) };
        Some((start, end))
    });
    let (start, end, status) = match range {
        Some((s, _)) if s >= len => {
            return (StatusCode::RANGE_NOT_SATISFIABLE, [(header::CONTENT_RANGE, format!("bytes */{len}"))])
                .into_response()
        }
        Some((s, e)) => (s, e, StatusCode::PARTIAL_CONTENT),
        None => (0, len - 1, StatusCode::OK),
    };
    let first_full = range.is_none() && {
        let mut served = hub.served.lock().unwrap();
        let n = served.entry(path).or_insert(0);
        *n += 1;
        *n == 1
    };
    let cut = if first_full { f.cut_at } else { None };
    let bytes = f.bytes.clone();
    let slow = f.slow;
    let stream = async_stream(bytes, start, end + 1, cut, slow);
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_LENGTH, (end + 1 - start).to_string().parse().unwrap());
    h.insert(header::ACCEPT_RANGES, "bytes".parse().unwrap());
    if status == StatusCode::PARTIAL_CONTENT {
        h.insert(header::CONTENT_RANGE, format!("bytes {start}-{end}/{len}").parse().unwrap());
    }
    resp
}

/// Bytes `start..end` in 64 KiB pieces; with `cut`, an error after that many bytes (the connection drops).
fn async_stream(
    bytes: Arc<Vec<u8>>,
    start: usize,
    end: usize,
    cut: Option<usize>,
    slow: bool,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    futures_util::stream::unfold(start, move |at| {
        let bytes = bytes.clone();
        async move {
            if at >= end {
                return None;
            }
            if cut.is_some_and(|c| at >= c) {
                return Some((Err(std::io::Error::other("cut")), end));
            }
            if slow {
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            let stop = (at + (64 << 10)).min(end).min(cut.unwrap_or(usize::MAX).max(at + 1));
            Some((Ok(bytes[at..stop].to_vec()), stop))
        }
    })
}
