//! What a request must show before any route sees it, and the headers every answer carries. The threat is
//! a web page in the user's own browser: the server listens on loopback, and the browser can reach it.
//!
//! - DNS rebinding: a page whose name the attacker makes resolve to 127.0.0.1 reaches this server as its
//!   own origin, and its requests carry that name as `Host`. Only names that cannot be rebound are
//!   answered ([`HostPolicy`]): `localhost` and `*.localhost` (browsers resolve them to loopback without
//!   DNS), IP literals (a browser sends one only when the URL names that address, so the address is
//!   where it meant to go: the bound address and loopback among them), and the names of
//!   `--allowed-host`. Others get 403 on every path, `/health` and the UI included.
//! - Cross-site requests: any page may send a "simple" request (a `text/plain` POST, no preflight) to any
//!   server; the browser adds an `Origin`. One that is neither this server's own origin (the same
//!   host and port as `Host`) nor named by `--cors-origin` gets 403; a body that is not
//!   `application/json` gets 415, so a simple request never reaches a handler.
//! - Framing and sniffing: every answer says `nosniff`, may not be framed and sends no referrer; HTML
//!   answers (the UI) carry a Content-Security-Policy that lets the page load only its own files and talk
//!   only to this server.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::App;

/// The page's policy: its own scripts and styles (inline styles for the components that set them), images
/// from itself or data: URLs, requests only to this server, never framed.
pub const UI_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// The policy of everything that is not a page (JSON, event streams, scripts): nothing runs from it and
/// nothing frames it.
pub const API_CSP: &str = "default-src 'none'; frame-ancestors 'none'";

/// Which `Host` names the server answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPolicy {
    /// Exact names, lowercase (`strata.lan`).
    names: Vec<String>,
    /// Domains whose every subdomain is allowed too, lowercase with the leading dot (`.example.com`).
    domains: Vec<String>,
    /// `--allowed-host '*'`: no check.
    any: bool,
}

impl HostPolicy {
    /// From the `--allowed-host` values: a name (`strata.lan`), a domain with its subdomains
    /// (`.example.com`), or `*` for any name.
    pub fn parse(values: &[String]) -> Result<HostPolicy, String> {
        let mut p = HostPolicy::default();
        for v in values {
            let v = v.trim().to_ascii_lowercase();
            if v == "*" {
                p.any = true;
                continue;
            }
            let name = v.strip_prefix('.').unwrap_or(&v);
            let valid = !name.is_empty()
                && name.len() <= 253
                && name.split('.').all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
            if !valid {
                return Err(format!(
                    "--allowed-host {v:?} is not a host name (e.g. strata.lan, .example.com for a domain and its \
                     subdomains, or * for any)"
                ));
            }
            if v.starts_with('.') {
                p.domains.push(v);
            } else {
                p.names.push(v);
            }
        }
        Ok(p)
    }

    /// True when every name is answered (`--allowed-host '*'`).
    pub fn allows_any(&self) -> bool {
        self.any
    }

    /// Whether a request with this `Host` header value (a name or address, maybe with a port) is answered.
    pub fn allows(&self, host_header: &str) -> bool {
        if self.any {
            return true;
        }
        let Some(host) = host_name(host_header) else { return false };
        let host = host.to_ascii_lowercase();
        if host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok() {
            return true;
        }
        let host = host.strip_suffix('.').unwrap_or(&host);
        host == "localhost"
            || host.ends_with(".localhost")
            || self.names.iter().any(|n| n == host)
            || self.domains.iter().any(|d| host.ends_with(d.as_str()) || host == &d[1..])
    }
}

/// The name or address of a `Host` value without its port (`[::1]:8080` -> `[::1]`); None when it is
/// not one (empty, or a port that is not a number).
fn host_name(value: &str) -> Option<&str> {
    let value = value.trim();
    if value.starts_with('[') {
        let end = value.find(']')?;
        let rest = &value[end + 1..];
        return (rest.is_empty() || rest.strip_prefix(':').is_some_and(is_port)).then(|| &value[..=end]);
    }
    let host = match value.rsplit_once(':') {
        Some((h, port)) if is_port(port) => h,
        Some(_) => return None,
        None => value,
    };
    (!host.is_empty() && !host.contains(['/', '@', ' ', '\\'])).then_some(host)
}

fn is_port(s: &str) -> bool {
    !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `origin` may make requests: this server's own origin (its `host:port` is the request's
/// `Host`), or one `--cors-origin` names ([`cors_allows`]). `null` (a sandboxed frame, a file) is foreign.
pub fn origin_allowed(origin: &str, host: Option<&str>, cors: &[HeaderValue]) -> bool {
    if cors_allows(cors, origin) {
        return true;
    }
    let Some((_scheme, authority)) = origin.split_once("://") else { return false };
    host.is_some_and(|h| !authority.is_empty() && authority.eq_ignore_ascii_case(h.trim()))
}

/// Whether the `--cors-origin` values name `origin`: `*` any, `localhost` any http(s) origin on a loopback
/// name or address (`http://localhost:5173`, `http://127.0.0.1`, `http://[::1]:3000`, as llama-server's
/// `--cors-origins localhost`), else the exact origin.
pub fn cors_allows(cors: &[HeaderValue], origin: &str) -> bool {
    cors.iter().any(|c| {
        c == "*"
            || (c == "localhost" && is_loopback_origin(origin))
            || c.as_bytes().eq_ignore_ascii_case(origin.as_bytes())
    })
}

fn is_loopback_origin(origin: &str) -> bool {
    let Some(authority) = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) else {
        return false;
    };
    let Some(host) = host_name(authority) else { return false };
    let host = host.to_ascii_lowercase();
    host == "localhost"
        || host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// True when a `Content-Type` says JSON (`application/json`, any parameters).
pub fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(v) = content_type.and_then(|v| v.to_str().ok()) else { return false };
    let essence = v.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// The checks, before the key check and any route; then the headers on the answer.
pub async fn check(State(app): State<App>, req: Request, next: Next) -> Response {
    if let Err(e) = admit(&app, req.method(), req.headers()) {
        app.shared.metrics.reject(e.code.unwrap_or(e.kind));
        let mut r = e.into_response();
        secure_headers(r.headers_mut());
        return r;
    }
    let mut r = next.run(req).await;
    secure_headers(r.headers_mut());
    r
}

fn admit(app: &App, method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
    let host = headers.get(header::HOST).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    // HTTP/1.0 clients may send no Host; a browser always does.
    if let Some(h) = host {
        if !app.opts.allowed_hosts.allows(h) {
            return Err(ApiError::host_not_allowed(h));
        }
    }
    // A preflight runs nothing: the CORS layer answers it, without Access-Control-Allow-Origin for an
    // origin not allowed, so the browser does not send the request (and if it is sent, it is refused here).
    if let Some(origin) = headers.get(header::ORIGIN).filter(|_| method != Method::OPTIONS) {
        let o = origin.to_str().unwrap_or("\u{fffd}");
        if !origin_allowed(o, host, &app.opts.cors_origins) {
            return Err(ApiError::origin_not_allowed(o));
        }
    }
    let has_body = matches!(*method, Method::POST | Method::PUT | Method::PATCH);
    if has_body && !is_json(headers.get(header::CONTENT_TYPE)) {
        let given = headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or("\u{fffd}"));
        return Err(ApiError::not_json(given));
    }
    Ok(())
}

/// The headers every answer carries (a handler's own CSP is kept).
fn secure_headers(h: &mut HeaderMap) {
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert("cross-origin-resource-policy", HeaderValue::from_static("same-origin"));
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        let html = h
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.trim_start().to_ascii_lowercase().starts_with("text/html"));
        h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(if html { UI_CSP } else { API_CSP }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(v: &[&str]) -> HostPolicy {
        HostPolicy::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn loopback_names_and_addresses_are_answered_and_other_names_are_not() {
        let p = HostPolicy::default();
        for ok in
            ["localhost", "LOCALHOST:8080", "127.0.0.1:8080", "[::1]:8080", "[::1]", "10.0.0.5", "app.localhost:1"]
        {
            assert!(p.allows(ok), "{ok}");
        }
        for bad in [
            "attacker.example",
            "attacker.example:8080",
            "127.0.0.1.nip.io",
            "localhost.attacker.example",
            "",
            "localhost:http",
            "[::1]x",
            "a b",
            "user@localhost",
        ] {
            assert!(!p.allows(bad), "{bad}");
        }
    }

    #[test]
    fn allowed_hosts_add_names_and_domains_and_star_turns_the_check_off() {
        let p = policy(&["strata.lan", ".example.com"]);
        assert!(p.allows("strata.lan:8080"));
        assert!(p.allows("example.com") && p.allows("gpu.example.com:80"));
        assert!(!p.allows("badexample.com") && !p.allows("other.lan"));
        assert!(policy(&["*"]).allows("anything.example"));
        let e = HostPolicy::parse(&["http://x".into()]).unwrap_err();
        assert!(e.contains("--allowed-host") && e.contains("http://x"), "{e}");
    }

    #[test]
    fn origins_are_own_or_named() {
        let none: Vec<HeaderValue> = Vec::new();
        assert!(origin_allowed("http://127.0.0.1:8080", Some("127.0.0.1:8080"), &none));
        assert!(origin_allowed("http://LOCALHOST:8080", Some("localhost:8080"), &none));
        assert!(!origin_allowed("http://127.0.0.1:9999", Some("127.0.0.1:8080"), &none));
        assert!(!origin_allowed("https://attacker.example", Some("127.0.0.1:8080"), &none));
        assert!(!origin_allowed("null", Some("127.0.0.1:8080"), &none));
        assert!(!origin_allowed("http://127.0.0.1:8080", None, &none));
        let named = vec![HeaderValue::from_static("http://localhost:5173")];
        assert!(origin_allowed("http://localhost:5173", Some("127.0.0.1:8080"), &named));
        assert!(origin_allowed("null", None, &[HeaderValue::from_static("*")]));
        let local = vec![HeaderValue::from_static("localhost")];
        for ok in
            ["http://localhost", "http://localhost:8080", "http://127.0.0.1:3000", "http://[::1]", "https://[::1]:3000"]
        {
            assert!(origin_allowed(ok, Some("127.0.0.1:8080"), &local), "{ok}");
        }
        for bad in
            ["http://web.mydomain.fr", "http://notlocalhost", "http://localhost.evil.com", "null", "file://localhost"]
        {
            assert!(!origin_allowed(bad, Some("127.0.0.1:8080"), &local), "{bad}");
        }
    }

    #[test]
    fn json_content_types() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert!(is_json(Some(&v("application/json"))));
        assert!(is_json(Some(&v("Application/JSON; charset=utf-8"))));
        assert!(!is_json(Some(&v("text/plain"))));
        assert!(!is_json(Some(&v("text/plain; application/json"))));
        assert!(!is_json(Some(&v("application/x-www-form-urlencoded"))));
        assert!(!is_json(Some(&v("multipart/form-data; boundary=x"))));
        assert!(!is_json(None));
    }

    #[test]
    fn pages_get_the_ui_policy_and_the_rest_the_strict_one() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
        secure_headers(&mut h);
        assert_eq!(h[header::CONTENT_SECURITY_POLICY], UI_CSP);
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        secure_headers(&mut h);
        assert_eq!(h[header::CONTENT_SECURITY_POLICY], API_CSP);
    }
}
