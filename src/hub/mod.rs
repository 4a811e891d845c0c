//! The Hugging Face Hub, as the model library uses it: search for GGUF repositories, list a repository's
//! GGUF files with their sizes and sha256, read a file's first bytes (its metadata and tensor index, to plan
//! it before it is downloaded) and download it ([`download`]). Also the models folder and the GGUFs already
//! on this machine ([`local`]).
//!
//! The API subset: `GET /api/models?search=..&filter=gguf`, `GET /api/models/{repo}/tree/{rev}` (paged by
//! `Link: rel="next"`), and `GET /{repo}/resolve/{rev}/{file}` with `Range`, following redirects (a token is
//! not sent to another host). `HF_ENDPOINT` names another Hub (a mirror, or a test's); `HF_TOKEN`, or the
//! token file `huggingface-cli login` writes, opens gated repositories.
//!
//! Names that reach a path come from users and from the network: a repository id and a file path are
//! checked ([`check_repo`], [`check_file`]) before anything is requested or written.

pub mod download;
pub mod library;
pub mod local;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::gguf::{GgufErrorKind, GgufFile};

/// The public Hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The revision every request names.
pub const REVISION: &str = "main";

/// The first read of a file's header; doubled until the tensor index fits, up to [`HEADER_MAX_BYTES`].
const HEADER_FIRST_BYTES: u64 = 4 << 20;
/// A header past this is refused (the largest vocabularies take about 12 MiB).
pub const HEADER_MAX_BYTES: u64 = 128 << 20;

/// What went wrong talking to the Hub. Each names the repository or file and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    #[error("{0:?} is not a Hugging Face repository id (owner/name: letters, digits, '-', '_', '.')")]
    BadRepo(String),
    #[error("{0:?} is not a GGUF file path in a repository (a relative path ending in .gguf, without '..')")]
    BadFile(String),
    #[error("{what} was not found on the Hub ({url})")]
    NotFound { what: String, url: String },
    #[error(
        "{repo} is gated: it needs a Hugging Face token (set HF_TOKEN, or run huggingface-cli login) from an \
         account that accepted its terms at {endpoint}/{repo}"
    )]
    NeedsToken { repo: String, endpoint: String },
    #[error("{repo} refused the token: accept the repository's terms at {endpoint}/{repo}, or check HF_TOKEN")]
    Refused { repo: String, endpoint: String },
    #[error("the Hub answered {status} to {url}: {body}")]
    Status { status: u16, url: String, body: String },
    #[error("cannot reach the Hub at {url}: {message}")]
    Network { url: String, message: String },
    #[error("the Hub's answer to {url} is not what was expected: {message}")]
    BadAnswer { url: String, message: String },
    #[error("{file}'s header is not a GGUF header: {message}")]
    BadHeader { file: String, message: String },
}

/// A repository a search found.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct HubModel {
    pub id: String,
    #[serde(default, deserialize_with = "null_default")]
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub downloads: u64,
    #[serde(default, deserialize_with = "null_default")]
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub likes: u64,
    /// Whether the repository asks for a token (its terms accepted): the Hub says false, "auto" or "manual".
    #[serde(default, deserialize_with = "gated_flag")]
    pub gated: bool,
    #[serde(default, rename = "lastModified")]
    pub last_modified: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub tags: Vec<String>,
}

/// A field the Hub may send as null: its default then.
fn null_default<'de, D: serde::Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn gated_flag<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Bool(b) => b,
        serde_json::Value::String(s) => !s.is_empty() && s != "false",
        _ => false,
    })
}

/// A GGUF file of a repository.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct HubFile {
    pub path: String,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub size_bytes: u64,
    /// The file's sha256 (its LFS object id), lowercase hex; None for a file not stored in LFS.
    pub sha256: Option<String>,
    /// `(part, parts)` of a model split over several files (`-00001-of-00003.gguf`).
    pub split: Option<(u32, u32)>,
}

/// One entry of `GET /api/models/{repo}/tree/{rev}`.
#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    lfs: Option<TreeLfs>,
}

#[derive(Deserialize)]
struct TreeLfs {
    oid: String,
    size: u64,
}

/// A client of one Hub, with the token it sends (if any).
#[derive(Clone)]
pub struct HubClient {
    pub endpoint: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl std::fmt::Debug for HubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubClient").field("endpoint", &self.endpoint).field("token", &self.token.is_some()).finish()
    }
}

impl HubClient {
    /// The Hub `HF_ENDPOINT` names (else the public one), with `HF_TOKEN` or the saved login token.
    pub fn from_env() -> HubClient {
        let endpoint = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.trim().is_empty());
        HubClient::new(endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT), token_from_env())
    }

    pub fn new(endpoint: &str, token: Option<String>) -> HubClient {
        let http = reqwest::Client::builder()
            .user_agent(concat!("strata/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(15))
            // A stalled read (no byte for this long) fails the request; a slow one goes on.
            .read_timeout(Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::limited(10))
            .build()
            .expect("a client with rustls and no other options builds");
        HubClient { endpoint: endpoint.trim_end_matches('/').to_owned(), token, http }
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// A GET of `url`, with the token when there is one (reqwest drops it on a redirect to another host).
    pub(crate) fn get(&self, url: &str) -> reqwest::RequestBuilder {
        let r = self.http.get(url);
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Repositories with GGUF files matching `text`, most downloaded first, at most `limit`.
    pub async fn search(&self, text: &str, limit: usize) -> Result<Vec<HubModel>, HubError> {
        let url = format!("{}/api/models", self.endpoint);
        let limit = limit.clamp(1, 100).to_string();
        let mut query = vec![
            ("search", text.trim()),
            ("filter", "gguf"),
            ("sort", "downloads"),
            ("direction", "-1"),
            ("limit", &limit),
        ];
        query.extend(["downloads", "likes", "gated", "lastModified", "tags"].map(|f| ("expand[]", f)));
        let resp = self.get(&url).query(&query).send().await.map_err(|e| network(&url, e))?;
        let resp = self.check(resp, "the search", None).await?;
        resp.json().await.map_err(|e| HubError::BadAnswer { url, message: e.to_string() })
    }

    /// The GGUF files of `repo`, in path order.
    pub async fn files(&self, repo: &str) -> Result<Vec<HubFile>, HubError> {
        check_repo(repo)?;
        let mut url = format!("{}/api/models/{repo}/tree/{REVISION}?recursive=true", self.endpoint);
        let mut files = Vec::new();
        // The Hub pages a long listing; a listing longer than this many pages is not a model repository.
        for _ in 0..50 {
            let resp = self.get(&url).send().await.map_err(|e| network(&url, e))?;
            let resp = self.check(resp, repo, Some(repo)).await?;
            let next = next_link(resp.headers());
            let entries: Vec<TreeEntry> =
                resp.json().await.map_err(|e| HubError::BadAnswer { url: url.clone(), message: e.to_string() })?;
            for e in entries {
                if e.kind != "file" || !e.path.to_ascii_lowercase().ends_with(".gguf") || check_file(&e.path).is_err() {
                    continue;
                }
                let (size_bytes, sha256) = match e.lfs {
                    Some(l) if is_sha256(&l.oid) => (l.size, Some(l.oid.to_ascii_lowercase())),
                    Some(l) => (l.size, None),
                    None => (e.size, None),
                };
                files.push(HubFile { split: split_part(&e.path), path: e.path, size_bytes, sha256 });
            }
            match next {
                // The token goes with every page: only to the Hub it was given for.
                Some(n) if n.starts_with(&format!("{}/", self.endpoint)) => url = n,
                Some(n) => {
                    return Err(HubError::BadAnswer { url, message: format!("its next page is on another host: {n}") })
                }
                None => break,
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// The URL of `file` of `repo` (checked).
    pub fn resolve_url(&self, repo: &str, file: &str) -> Result<String, HubError> {
        check_repo(repo)?;
        check_file(file)?;
        let path: Vec<String> = file.split('/').map(percent_encode).collect();
        Ok(format!("{}/{repo}/resolve/{REVISION}/{}", self.endpoint, path.join("/")))
    }

    /// `file`'s metadata and tensor index, read by ranges of its first bytes: enough to plan it
    /// ([`GgufFile::from_header`]) before downloading `size_bytes`.
    pub async fn header(&self, repo: &str, file: &str, size_bytes: u64) -> Result<GgufFile, HubError> {
        let url = self.resolve_url(repo, file)?;
        let mut want = HEADER_FIRST_BYTES.min(size_bytes);
        let mut prefix: Vec<u8> = Vec::with_capacity(want as usize);
        loop {
            // Only the bytes not read yet: the next range starts where the last one ended.
            let from = prefix.len() as u64;
            let resp = self
                .get(&url)
                .header(reqwest::header::RANGE, format!("bytes={from}-{}", want.saturating_sub(1)))
                .send()
                .await
                .map_err(|e| network(&url, e))?;
            let resp = self.check(resp, file, Some(repo)).await?;
            let mut resp = resp;
            // A server that ignores the range sends the whole file from its start: begin again from there.
            if from > 0 && resp.status().as_u16() != 206 {
                prefix.clear();
            }
            while (prefix.len() as u64) < want {
                match resp.chunk().await.map_err(|e| network(&url, e))? {
                    Some(c) => prefix.extend_from_slice(&c[..c.len().min(want as usize - prefix.len())]),
                    None => break,
                }
            }
            let bad = |message: String| HubError::BadHeader { file: file.to_owned(), message };
            match GgufFile::from_header(prefix.clone(), size_bytes) {
                Ok(f) => return Ok(f),
                Err(e) if matches!(e.kind, GgufErrorKind::Truncated { .. }) && want < size_bytes => {
                    if want >= HEADER_MAX_BYTES {
                        return Err(bad(format!("its metadata is larger than {} MiB", HEADER_MAX_BYTES >> 20)));
                    }
                    want = (want * 2).min(size_bytes);
                }
                Err(e) => return Err(bad(e.to_string())),
            }
        }
    }

    /// `resp` when it succeeded, else the error its status means (`repo` for the gated ones).
    pub(crate) async fn check(
        &self,
        resp: reqwest::Response,
        what: &str,
        repo: Option<&str>,
    ) -> Result<reqwest::Response, HubError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let url = resp.url().to_string();
        let endpoint = self.endpoint.clone();
        let repo = repo.unwrap_or(what).to_owned();
        // The Hub answers 401 for a repository that does not exist (or is private) too: its error code tells.
        let code = resp.headers().get("x-error-code").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        if matches!(code.as_str(), "RepoNotFound" | "EntryNotFound" | "RevisionNotFound") {
            return Err(HubError::NotFound { what: what.to_owned(), url });
        }
        Err(match status.as_u16() {
            401 | 403 if self.token.is_none() => HubError::NeedsToken { repo, endpoint },
            401 | 403 => HubError::Refused { repo, endpoint },
            404 => HubError::NotFound { what: what.to_owned(), url },
            s => {
                let body = resp.text().await.unwrap_or_default();
                HubError::Status { status: s, url, body: body.chars().take(300).collect() }
            }
        })
    }
}

pub(crate) fn network(url: &str, e: reqwest::Error) -> HubError {
    // The chain of sources says what failed (DNS, refused, TLS, reset): reqwest's own line does not.
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    HubError::Network { url: url.to_owned(), message }
}

/// `HF_TOKEN`, else the token `huggingface-cli login` saved (`$HF_TOKEN_PATH`, `$HF_HOME/token`,
/// `~/.cache/huggingface/token`).
pub fn token_from_env() -> Option<String> {
    if let Some(t) = std::env::var("HF_TOKEN").ok().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()) {
        return Some(t);
    }
    let path = std::env::var_os("HF_TOKEN_PATH")
        .map(std::path::PathBuf::from)
        .or_else(|| local::hf_home().map(|h| h.join("token")))?;
    std::fs::read_to_string(path).ok().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty())
}

/// Refuses what is not `owner/name` of the Hub's characters (so it can name a folder and a URL path).
pub fn check_repo(repo: &str) -> Result<(), HubError> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && !p.starts_with(['.', '-'])
            && !p.contains("..")
            && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    match repo.split_once('/') {
        Some((owner, name)) if part_ok(owner) && part_ok(name) => Ok(()),
        _ => Err(HubError::BadRepo(repo.to_owned())),
    }
}

/// Refuses a file path that could leave its repository's folder or is not a GGUF.
pub fn check_file(file: &str) -> Result<(), HubError> {
    let ok = file.len() <= 512
        && file.to_ascii_lowercase().ends_with(".gguf")
        && file.split('/').all(|c| !c.is_empty() && c != "." && c != ".." && !c.starts_with('.'))
        && !file.chars().any(|c| c == '\\' || c == ':' || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(HubError::BadFile(file.to_owned()))
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `(part, parts)` of `name-00001-of-00003.gguf`.
pub fn split_part(path: &str) -> Option<(u32, u32)> {
    let stem = path.strip_suffix(".gguf").or_else(|| path.strip_suffix(".GGUF"))?;
    let (rest, parts) = stem.rsplit_once("-of-")?;
    let (_, part) = rest.rsplit_once('-')?;
    let (part, parts): (u32, u32) = (part.parse().ok()?, parts.parse().ok()?);
    (part >= 1 && part <= parts && parts > 1).then_some((part, parts))
}

/// The URL of the `rel="next"` page in a `Link` header.
fn next_link(headers: &reqwest::header::HeaderMap) -> Option<String> {
    let link = headers.get(reqwest::header::LINK)?.to_str().ok()?;
    link.split(',').find(|l| l.contains("rel=\"next\"")).and_then(|l| {
        let (start, end) = (l.find('<')?, l.find('>')?);
        (start < end).then(|| l[start + 1..end].to_owned())
    })
}

fn percent_encode(component: &str) -> String {
    let mut out = String::with_capacity(component.len());
    for b in component.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The file `pull` takes from `files` when none is named, or when `want` is a quantization's name
/// (`Q4_K_M`) rather than a path: the one file (or first part of a split) that matches, else an error
/// listing them. With no `want`: the only file, else the Q4_K_M one.
pub fn pick_file<'a>(files: &'a [HubFile], want: Option<&str>) -> Result<&'a HubFile, String> {
    let firsts: Vec<&HubFile> = files.iter().filter(|f| f.split.is_none_or(|(p, _)| p == 1)).collect();
    let list = || firsts.iter().map(|f| format!("  {} ({})", f.path, human_bytes(f.size_bytes))).collect::<Vec<_>>();
    if firsts.is_empty() {
        return Err("the repository has no GGUF file".into());
    }
    if let Some(w) = want {
        if let Some(f) = files.iter().find(|f| f.path == w) {
            return Ok(f);
        }
        let lw = w.to_ascii_lowercase();
        let hits: Vec<&&HubFile> = firsts.iter().filter(|f| f.path.to_ascii_lowercase().contains(&lw)).collect();
        return match hits.as_slice() {
            [one] => Ok(one),
            [] => Err(format!("no GGUF file matches {w:?}; the repository has:\n{}", list().join("\n"))),
            _ => Err(format!("{w:?} matches several files; name one:\n{}", list().join("\n"))),
        };
    }
    if let [one] = firsts.as_slice() {
        return Ok(one);
    }
    let q4km: Vec<&&HubFile> = firsts.iter().filter(|f| f.path.to_ascii_lowercase().contains("q4_k_m")).collect();
    match q4km.as_slice() {
        [one] => Ok(one),
        _ => Err(format!("the repository has several GGUF files; name one (REPO:FILE):\n{}", list().join("\n"))),
    }
}

/// `1.2 GiB`, `340 MiB`, `12 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else if v < 10.0 {
        format!("{v:.1} {}", UNITS[u])
    } else {
        format!("{v:.0} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_and_file_paths_that_could_leave_the_folder_are_refused() {
        for ok in ["bartowski/Qwen2.5-7B-Instruct-GGUF", "a/b", "unsloth/gemma-3-270m-it-GGUF"] {
            assert!(check_repo(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a", "a/b/c", "../b", "a/..", "a/.hidden", "a/b c", "a\\b", "/b", "a/", "a/b%2f"] {
            assert!(check_repo(bad).is_err(), "{bad}");
        }
        for ok in ["m.gguf", "Q4/m-Q4_K_M.GGUF", "sub/dir/x.gguf"] {
            assert!(check_file(ok).is_ok(), "{ok}");
        }
        for bad in ["m.bin", "../m.gguf", "a/../m.gguf", "/m.gguf", ".m.gguf", "a//m.gguf", "c:m.gguf", "a\\m.gguf"] {
            assert!(check_file(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn split_parts_and_the_file_pull_takes() {
        assert_eq!(split_part("m-Q8_0-00002-of-00003.gguf"), Some((2, 3)));
        assert_eq!(split_part("m-Q8_0.gguf"), None);
        assert_eq!(split_part("m-00001-of-00001.gguf"), None);
        let f = |p: &str| HubFile { path: p.into(), size_bytes: 1, sha256: None, split: split_part(p) };
        let files =
            [f("m-Q4_K_M.gguf"), f("m-Q8_0-00001-of-00002.gguf"), f("m-Q8_0-00002-of-00002.gguf"), f("m-Q6_K.gguf")];
        assert_eq!(pick_file(&files, None).unwrap().path, "m-Q4_K_M.gguf");
        assert_eq!(pick_file(&files, Some("q6_k")).unwrap().path, "m-Q6_K.gguf");
        assert_eq!(pick_file(&files, Some("Q8_0")).unwrap().path, "m-Q8_0-00001-of-00002.gguf");
        assert_eq!(pick_file(&files, Some("m-Q8_0-00002-of-00002.gguf")).unwrap().path, "m-Q8_0-00002-of-00002.gguf");
        assert!(pick_file(&files, Some("Q5")).unwrap_err().contains("m-Q6_K.gguf"));
        assert!(pick_file(&files, Some("m-")).unwrap_err().contains("several"));
        assert!(pick_file(&files[1..], None).unwrap_err().contains("several"));
        assert_eq!(pick_file(&files[3..], None).unwrap().path, "m-Q6_K.gguf");
    }

    #[test]
    fn the_next_page_link_and_sizes_read_right() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(reqwest::header::LINK, "<https://hf.co/api/x?cursor=abc>; rel=\"next\"".parse().unwrap());
        assert_eq!(next_link(&h).as_deref(), Some("https://hf.co/api/x?cursor=abc"));
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 << 30), "5.0 GiB");
        assert_eq!(percent_encode("a b#.gguf"), "a%20b%23.gguf");
    }
}
