//! `strata serve` end to end over loopback, on the default model: the OpenAI endpoints (streamed and not,
//! choices, log-probabilities, completions), the API key, CORS, the guard against web pages (Host, Origin,
//! body type, the page's headers), the limits, the official Python client. Hostile requests,
//! load, disconnects, signals and a faulted GPU are in tests/it/server_hostile.rs; the conversation cache
//! through the API against `strata replay` (the reported scenario with a squeezed device) is in
//! tests/it/replay.rs, which shares replay's run of the scenario with it.

use crate::common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::server::{chat_body, streamed_text, Server};
use serde_json::{json, Value};

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a whole number: {v}"))
}

fn no_panic(s: &Server) {
    let err = s.stderr();
    assert!(!err.contains("panicked"), "the server panicked: {err}");
}

#[test]
fn starts_on_a_free_port_answers_health_and_models_and_stops_on_sigterm() {
    let _one = common::one_at_a_time();
    // No web UI (serve takes ./ui/dist by default when it is built, as scripts/test builds it): / is the index.
    let no_ui = tempfile::tempdir().unwrap();
    let s = Server::start(&["-c", "512", "--alias", "gpt-4o-mini", "--ui-dir", no_ui.path().to_str().unwrap()]);
    let h = s.get("/health");
    assert_eq!(h.status, 200, "{}", h.text());
    assert_eq!(h.json()["status"], "ok");
    let models = s.get("/v1/models").json();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["SmolLM2-135M-Instruct.Q4_1", "gpt-4o-mini"]);
    assert_eq!(models["object"], "list");
    // One model served: every name (the id, an alias, another name, none) is answered by it, and the
    // response names the served id.
    for model in [Some("SmolLM2-135M-Instruct.Q4_1"), Some("gpt-4o-mini"), Some("gpt-3.5-turbo"), None] {
        let mut body = chat_body("Hi", 2);
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["model"], "SmolLM2-135M-Instruct.Q4_1");
    }
    assert_eq!(s.get("/v1/models/gpt-3.5-turbo").json()["id"], "gpt-3.5-turbo");
    let m = s.get("/strata/model").json();
    assert_eq!(
        (m["architecture"].as_str(), m["layers"].as_u64(), m["context"].as_u64()),
        (Some("llama"), Some(30), Some(512))
    );
    assert_eq!(m["quantization"], "Q4_1");
    let d = s.get("/strata/devices").json();
    let cpu = &d["devices"][0];
    assert_eq!((cpu["kind"].as_str(), cpu["layers"].clone()), (Some("cpu"), json!([[0, 30]])));
    assert!(u(&cpu["by_purpose_bytes"]["weights"]) > 50 << 20, "{cpu}");
    assert!(u(&cpu["free_bytes"]) > 0 && u(&cpu["total_bytes"]) > 0);
    assert!(s.get("/").text().contains("/v1/chat/completions"));
    let metrics = s.get("/metrics");
    assert!(metrics.header("content-type").unwrap().contains("openmetrics"));
    let m = metrics.text();
    for needle in [
        "strata_requests_total{endpoint=\"chat\"} 4",
        "strata_generated_tokens_total 8",
        "strata_queue_depth 0",
        "strata_device_free_bytes{device=\"0\",kind=\"cpu\"}",
        "strata_generation_tokens_per_second",
    ] {
        assert!(m.contains(needle), "{needle} not in {m}");
    }
    // No CORS without --cors-origin.
    let pre = s.request(
        "OPTIONS",
        "/v1/chat/completions",
        &[("Origin", "http://example.com"), ("Access-Control-Request-Method", "POST")],
        b"",
    );
    assert!(pre.header("access-control-allow-origin").is_none());
    let st = s.stop();
    assert_eq!(st.code(), Some(0));
}

#[test]
fn strict_model_answers_only_the_served_id_and_its_aliases() {
    let _one = common::one_at_a_time();
    let s = Server::start(&["-c", "256", "--model-alias", "gpt-4o-mini", "--strict-model"]);
    for model in [Some("SmolLM2-135M-Instruct.Q4_1"), Some("gpt-4o-mini"), None] {
        let mut body = chat_body("Hi", 1);
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["model"], "SmolLM2-135M-Instruct.Q4_1");
    }
    let mut body = chat_body("Hi", 1);
    body["model"] = json!("llama-70b");
    let e = s.post("/v1/chat/completions", &body).expect_error(404);
    assert!(e["message"].as_str().unwrap().contains("\"SmolLM2-135M-Instruct.Q4_1\", \"gpt-4o-mini\""), "{e}");
    assert_eq!((e["param"].as_str(), e["code"].as_str()), (Some("model"), Some("model_not_found")));
    s.get("/v1/models/llama-70b").expect_error(404);
    no_panic(&s);
}

#[test]
fn a_server_started_in_an_empty_folder_serves_the_app_built_into_it() {
    let _one = common::one_at_a_time();
    let empty = tempfile::tempdir().unwrap();
    let s = Server::start_in(Some(empty.path()), &["-c", "256"], &[]);
    assert!(
        s.stderr().contains("web UI at /: built into this binary"),
        "the binary has no web UI in it: build it (npm run build --prefix ui) before cargo: {}",
        s.stderr()
    );
    let page = s.get("/");
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(page.header("cache-control"), Some("no-cache"));
    let html = page.text();
    assert!(html.contains("<div id=\"app\">"), "{html}");
    // The script the page loads comes from the binary too, cached for good (its name is its hash).
    let at = html.find("src=\"./assets/").expect("the page loads a script") + "src=\"./".len();
    let src = &html[at..at + html[at..].find('"').unwrap()];
    let js = s.get(&format!("/{src}"));
    assert_eq!(js.status, 200, "{src}");
    assert!(js.header("content-type").unwrap().contains("javascript"));
    assert_eq!(js.header("cache-control"), Some("public, max-age=31536000, immutable"));
    assert!(js.text().len() > 10_000);
    // index.html is revalidated against its ETag.
    let etag = page.header("etag").expect("an ETag").to_owned();
    assert_eq!(s.request("GET", "/", &[("If-None-Match", &etag)], b"").status, 304);
    assert_eq!(s.request("GET", "/", &[("If-None-Match", "\"other\"")], b"").status, 200);
    assert_eq!(s.get("/assets/missing.js").expect_error(404)["type"], "not_found_error");
    // The API beside it, also without the /v1 prefix (llama-server's paths).
    assert_eq!(s.get("/models").json()["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    let r = s.post("/chat/completions", &chat_body("Hi", 1));
    assert_eq!(r.status, 200, "{}", r.text());
    no_panic(&s);
}

#[test]
fn a_second_turn_rereads_no_token_of_the_first_reply() {
    let _one = common::one_at_a_time();
    let s = Server::start(&["-c", "1024"]);
    let q = "What is the capital of France?";
    let first = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 64}),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    assert_eq!(first["choices"][0]["finish_reason"], "stop", "{first}");
    let reply = first["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    let p1 = u(&first["usage"]["prompt_tokens"]);
    // The generated tokens end with the end-of-turn token, which is not part of the reply's text.
    let reply_tokens = u(&first["usage"]["completion_tokens"]) - 1;
    assert!(reply_tokens >= 3, "{reply:?}");
    let turn = |content: &str| {
        let body = json!({"messages": [
            {"role": "user", "content": q},
            {"role": "assistant", "content": content},
            {"role": "user", "content": "And of Spain?"}], "temperature": 0, "max_tokens": 4});
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    // The reply sent back unchanged: every one of its tokens is reused as generated; only the end of its
    // turn and the new message are read.
    let second = turn(&reply);
    let st = &second["strata"];
    assert_eq!(u(&st["kept_reply_tokens"]), reply_tokens, "{second}");
    assert_eq!(u(&st["reused"]), p1 + reply_tokens, "{second}");
    assert_eq!(u(&second["usage"]["prompt_tokens_details"]["cached_tokens"]), p1 + reply_tokens);
    assert_eq!(u(&st["read"]), u(&second["usage"]["prompt_tokens"]) - p1 - reply_tokens);
    // Text that differs in one byte is not the reply: it is tokenized as text.
    let edited = turn(&format!("{reply} "));
    assert_eq!(u(&edited["strata"]["kept_reply_tokens"]), 0, "{edited}");
    assert!(s.logs(&format!("{reply_tokens} prompt tokens were earlier replies, kept as generated")));
    no_panic(&s);
}

#[test]
fn a_public_address_without_an_api_key_is_refused_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["serve", "--host", "0.0.0.0", "--port", "0", "-m"])
        .arg(common::model_path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("refusing to listen on 0.0.0.0 without an API key"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn the_api_key_is_required_when_set() {
    let _one = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "sk-test-123\n").unwrap();
    let s = Server::start(&["-c", "256", "--api-key-file", key_file.to_str().unwrap()]);
    let body = chat_body("Hi", 2);
    let e = s.post("/v1/chat/completions", &body).expect_error(401);
    assert_eq!(e["code"], "invalid_api_key");
    s.post_auth("/v1/chat/completions", "sk-wrong", &body).expect_error(401);
    s.get("/v1/models").expect_error(401);
    s.get("/strata/devices").expect_error(401);
    assert_eq!(s.post_auth("/v1/chat/completions", "sk-test-123", &body).status, 200);
    let r = s.request("GET", "/v1/models", &[("Authorization", "Bearer sk-test-123")], b"");
    assert_eq!(r.status, 200);
    // Health stays open for supervisors.
    assert_eq!(s.get("/health").status, 200);
    no_panic(&s);
}

#[test]
fn cors_is_off_unless_an_origin_is_allowed() {
    let s = Server::start(&["-c", "128", "--cors-origin", "http://localhost:5173"]);
    let pre = s.request(
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", "http://localhost:5173"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization,content-type"),
        ],
        b"",
    );
    assert_eq!(pre.status, 200, "{pre:?}");
    assert_eq!(pre.header("access-control-allow-origin"), Some("http://localhost:5173"));
    assert!(pre.header("access-control-allow-headers").unwrap().contains("authorization"));
    let allowed = s.request("GET", "/v1/models", &[("Origin", "http://localhost:5173")], b"");
    assert_eq!(allowed.status, 200);
    assert_eq!(allowed.header("access-control-allow-origin"), Some("http://localhost:5173"));
    // An origin not named is refused outright (not only left without CORS headers).
    let other = s.request("GET", "/v1/models", &[("Origin", "http://evil.example")], b"");
    assert_eq!(other.expect_error(403)["code"], "origin_not_allowed");
    assert!(other.header("access-control-allow-origin").is_none());
    // A foreign page's preflight runs nothing and is answered without the header, so the browser stops.
    let foreign_pre = s.request(
        "OPTIONS",
        "/v1/chat/completions",
        &[("Origin", "http://evil.example"), ("Access-Control-Request-Method", "POST")],
        b"",
    );
    assert!(foreign_pre.header("access-control-allow-origin").is_none(), "{foreign_pre:?}");
    drop(s);
    // `localhost`: every loopback origin, whatever its port (llama-server's --cors-origins localhost).
    let s = Server::start(&["-c", "128", "--cors-origin", "localhost"]);
    for (origin, status) in
        [("http://localhost:3000", 200), ("http://[::1]:5173", 200), ("http://localhost.evil.com", 403)]
    {
        assert_eq!(s.request("GET", "/v1/models", &[("Origin", origin)], b"").status, status, "{origin}");
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["serve", "--port", "0", "--cors-origin", "example.com"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not an origin"));
}

#[test]
fn streamed_and_whole_replies_agree_and_choices_logprobs_and_completions_work() {
    let _one = common::one_at_a_time();
    // 256 positions hold every request below; the last one runs to the end of the context.
    let s = Server::start(&["-c", "256"]);
    let q = "Name three colours.";
    let whole = s.post("/v1/chat/completions", &chat_body(q, 24)).json();
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    assert!(!text.is_empty());
    let mut body = chat_body(q, 24);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (streamed, chunks) = streamed_text(&s.post("/v1/chat/completions", &body));
    assert_eq!(streamed, text, "the streamed text differs from the whole reply");
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": null}), "the first chunk");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
    // The repeat reuses all but the last prompt token, and says so in OpenAI's field.
    let prompt_tokens = u(&last["usage"]["prompt_tokens"]);
    assert_eq!(u(&last["usage"]["prompt_tokens_details"]["cached_tokens"]), prompt_tokens - 1, "{last}");
    assert_eq!(u(&last["strata"]["reused"]) + u(&last["strata"]["read"]), prompt_tokens);
    let finish = chunks.iter().rev().find_map(|c| c["choices"][0]["finish_reason"].as_str()).unwrap();
    assert_eq!(finish, whole["choices"][0]["finish_reason"].as_str().unwrap());

    // n greedy choices are the same reply, each from the end of the prompt read once.
    let mut body = chat_body(q, 24);
    body["n"] = json!(3);
    let r = s.post("/v1/chat/completions", &body).json();
    let texts: Vec<&str> =
        r["choices"].as_array().unwrap().iter().map(|c| c["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(texts, [text.as_str(); 3]);
    assert_eq!(u(&r["usage"]["completion_tokens"]), 3 * u(&whole["usage"]["completion_tokens"]));
    // With temperature and a seed, the same request gives the same choices; the choices differ.
    let sampled = json!({"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 1.2,
        "seed": 7, "n": 2, "max_tokens": 16});
    let a = s.post("/v1/chat/completions", &sampled).json();
    let b = s.post("/v1/chat/completions", &sampled).json();
    assert_eq!(a["choices"], b["choices"]);
    assert_ne!(a["choices"][0]["message"]["content"], a["choices"][1]["message"]["content"]);

    // Log-probabilities: the chosen token and the top 3 (greedy: the chosen one is the most likely).
    let mut body = chat_body(q, 6);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let r = s.post("/v1/chat/completions", &body).json();
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len(), 6, "{r}");
    let mut joined = String::new();
    for c in &content {
        let top = c["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], c["token"]);
        assert_eq!(top[0]["logprob"], c["logprob"]);
        assert!(c["logprob"].as_f64().unwrap() <= 0.0);
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        joined.push_str(c["token"].as_str().unwrap());
    }
    assert_eq!(joined, r["choices"][0]["message"]["content"].as_str().unwrap());
    // Streamed, every chunk carries the log-probabilities of its tokens.
    body["stream"] = json!(true);
    let (_, chunks) = streamed_text(&s.post("/v1/chat/completions", &body));
    let streamed: Vec<Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned()).flatten().collect();
    assert_eq!(streamed, content);

    // Completions: a string, and the same as a token list, agree; logprobs in the legacy shape.
    let c = s
        .post(
            "/v1/completions",
            &json!({"prompt": "The capital of France is", "max_tokens": 8,
        "temperature": 0, "logprobs": 2}),
        )
        .json();
    assert_eq!(c["object"], "text_completion");
    let ctext = c["choices"][0]["text"].as_str().unwrap().to_owned();
    let lp = &c["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 8);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    let tok = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["tokenize", "-m"])
        .arg(common::model_path())
        .args(["The capital of France is"])
        .output()
        .unwrap();
    let ids: Vec<u64> = String::from_utf8_lossy(&tok.stdout)
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|t| t.parse().ok())
        .collect();
    assert!(!ids.is_empty(), "{}", String::from_utf8_lossy(&tok.stdout));
    let c2 = s.post("/v1/completions", &json!({"prompt": ids, "max_tokens": 8, "temperature": 0})).json();
    assert_eq!(c2["choices"][0]["text"].as_str().unwrap(), ctext);
    let mut body = json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stream": true});
    let (streamed, _) = streamed_text(&s.post("/v1/completions", &body));
    assert_eq!(streamed, ctext);
    // A stop string ends the reply before it.
    let cut = ctext.trim_start().split(' ').nth(1).map(str::to_owned);
    if let Some(word) = cut {
        body = json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stop": [word.clone()]});
        body["logprobs"] = json!(1);
        let c3 = s.post("/v1/completions", &body).json();
        assert_eq!(c3["choices"][0]["finish_reason"], "stop");
        let cut_text = c3["choices"][0]["text"].as_str().unwrap();
        assert!(!cut_text.contains(&word));
        // The log-probabilities stop where the text was cut, not after the stop string's tokens.
        let toks: Vec<&str> =
            c3["choices"][0]["logprobs"]["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        let joined: String = toks.concat();
        assert!(joined.starts_with(cut_text), "{joined:?} / {cut_text:?}");
        assert!(toks.len() < 8 && joined.len() < cut_text.len() + toks.last().map_or(0, |t| t.len()) + 1, "{toks:?}");
    }
    // A max_tokens past the context is served to the end of the context and ends with length.
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 1_000_000_000_000i64,
        "temperature": 0, "ignore_eos": true}),
        )
        .json();
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(u(&r["usage"]["total_tokens"]), 256 + 1, "{}", r["usage"]);
    no_panic(&s);
}

/// Runs `tests/SCRIPT` (an official client, from .cache/pylib) against a server started with a key, the
/// server's URL as `base`; the script prints "N checks passed".
fn official_client_passes(script: &str, package: &str, base: &str) {
    let _one = common::one_at_a_time();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pylib = root.join(".cache/pylib");
    let s = Server::start(&["-c", "1024", "--api-key", "sk-local"]);
    let out = Command::new("python3")
        .arg(root.join("tests").join(script))
        .arg(format!("http://127.0.0.1:{}{base}", s.port))
        .arg("sk-local")
        .env("PYTHONPATH", &pylib)
        .output()
        .expect("python3 runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains(&format!("No module named '{package}'")),
        "the {package} package is not in {}: run scripts/setup",
        pylib.display()
    );
    assert!(out.status.success(), "the {package} client failed: {err}\nserver: {}", s.stderr());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("checks passed"), "{said}");
    eprintln!("{}", said.trim());
    no_panic(&s);
}

#[test]
fn the_official_anthropic_python_client_works_against_the_server() {
    official_client_passes("anthropic_client.py", "anthropic", "");
}

#[test]
fn the_official_openai_python_client_works_against_the_server() {
    official_client_passes("openai_client.py", "openai", "/v1");
}

#[test]
fn speculative_decoding_counts_its_drafts_in_the_reply_the_telemetry_and_the_log_and_changes_no_text() {
    let _one = common::one_at_a_time();
    let code = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n\nprint(area(3, 4), perimeter(3, 4))\n";
    let q = format!("Repeat this code exactly:\n```python\n{code}```");
    let plain = Server::start(&["-c", "1024"]);
    let want = plain.post("/v1/chat/completions", &chat_body(&q, 64)).json();
    assert_eq!(u(&want["strata"]["drafts_proposed"]), 0, "no drafts without --spec");
    drop(plain);
    let s = Server::start(&["-c", "1024", "--spec", "ngram"]);
    let got = s.post("/v1/chat/completions", &chat_body(&q, 64)).json();
    assert_eq!(
        got["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"],
        "the same greedy text"
    );
    let (proposed, accepted) = (u(&got["strata"]["drafts_proposed"]), u(&got["strata"]["drafts_accepted"]));
    assert!(accepted > 0 && accepted <= proposed, "drafts accepted {accepted} of {proposed}");
    let t = s.get("/strata/telemetry?since_ms=0").json();
    let done = t["events"].as_array().expect("events").iter().find(|e| e["event"] == "request_done").cloned();
    let done = done.unwrap_or_else(|| panic!("no request_done event: {t}"));
    assert_eq!(u(&done["drafts_proposed"]), proposed, "{done}");
    assert_eq!(u(&done["drafts_accepted"]), accepted, "{done}");
    let line = format!("drafts accepted {accepted} of {proposed}");
    assert!(s.logs(&line), "the stats line says {line:?}: {}", s.stderr());
    no_panic(&s);
}

#[test]
fn a_rebinding_host_is_refused_on_every_path_and_loopback_names_are_answered() {
    let _g = common::one_at_a_time();
    let s = Server::start(&["-c", "128", "--allowed-host", "strata.lan"]);
    let port = s.port;
    let chat = chat_body("Hi", 2).to_string();
    for (method, path) in [
        ("GET", "/strata/model"),
        ("GET", "/health"),
        ("GET", "/"),
        ("GET", "/metrics"),
        ("POST", "/v1/chat/completions"),
    ] {
        let body = (method == "POST").then_some(("application/json", chat.as_bytes()));
        let r = s.send(method, path, &format!("attacker.example:{port}"), &[], body);
        let e = r.expect_error(403);
        assert_eq!(e["code"], "host_not_allowed", "{method} {path}");
        assert!(e["message"].as_str().unwrap().contains("--allowed-host attacker.example"), "{e}");
        // The refusal is framed like every answer.
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    }
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("[::1]:{port}"), "strata.lan".into()]
    {
        assert_eq!(s.send("GET", "/strata/model", &host, &[], None).status, 200, "{host}");
    }
    assert_eq!(s.send("GET", "/health", "evil.strata.lan", &[], None).status, 403);
    no_panic(&s);
}

#[test]
fn cross_site_requests_get_415_for_a_body_that_is_not_json_and_403_for_a_foreign_origin() {
    let _g = common::one_at_a_time();
    let s = Server::start(&["-c", "128"]);
    let host = format!("127.0.0.1:{}", s.port);
    let chat = chat_body("Hi", 2).to_string();
    // What a page can send without a CORS preflight: text/plain, a form, no type at all (a Blob).
    for ct in ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""] {
        let r = s.send("POST", "/v1/chat/completions", &host, &[], Some((ct, chat.as_bytes())));
        let e = r.expect_error(415);
        assert_eq!(e["code"], "unsupported_media_type", "{ct:?}");
        assert!(e["message"].as_str().unwrap().contains("Content-Type: application/json"), "{e}");
    }
    let r = s.send("POST", "/strata/sim", &host, &[], Some(("text/plain", b"{}")));
    assert_eq!(r.status, 415);
    // A foreign page, even with a JSON body (its preflight would fail, but the request is refused too).
    for origin in ["https://attacker.example", "null", "http://127.0.0.1:1"] {
        let r = s.send(
            "POST",
            "/v1/chat/completions",
            &host,
            &[("Origin", origin)],
            Some(("application/json", chat.as_bytes())),
        );
        assert_eq!(r.expect_error(403)["code"], "origin_not_allowed", "{origin}");
        let r = s.send("GET", "/strata/model", &host, &[("Origin", origin)], None);
        assert_eq!(r.status, 403, "{origin}");
    }
    // The server's own page, and clients that send no Origin, are served.
    let own = format!("http://{host}");
    let r = s.send(
        "POST",
        "/v1/chat/completions",
        &host,
        &[("Origin", &own)],
        Some(("application/json; charset=utf-8", chat.as_bytes())),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["choices"][0]["message"]["content"].is_string());
    assert_eq!(s.post("/v1/chat/completions", &chat_body("Hi", 2)).status, 200);
    no_panic(&s);
}

#[test]
fn the_ui_is_sent_with_a_content_security_policy_and_may_not_be_framed() {
    let _g = common::one_at_a_time();
    let s = Server::start(&["-c", "128"]);
    let page = s.get("/");
    assert_eq!(page.status, 200);
    let csp = page.header("content-security-policy").expect("a CSP on the page");
    for part in
        ["default-src 'self'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "object-src 'none'"]
    {
        assert!(csp.contains(part), "{csp}");
    }
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(page.header("referrer-policy"), Some("no-referrer"));
    let api = s.get("/v1/models");
    assert_eq!(api.header("content-security-policy"), Some("default-src 'none'; frame-ancestors 'none'"));
    assert_eq!(api.header("x-frame-options"), Some("DENY"));
    no_panic(&s);
}

#[cfg(unix)]
#[test]
fn a_ui_dir_does_not_serve_a_symlink_that_leads_out_of_it() {
    let _g = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let ui = dir.path().join("ui");
    std::fs::create_dir(&ui).unwrap();
    std::fs::write(ui.join("index.html"), "<!doctype html><p>dev ui</p>").unwrap();
    std::fs::write(dir.path().join("secret.txt"), "the secret").unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret.txt"), ui.join("secret.txt")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", ui.join("passwd")).unwrap();
    let s = Server::start(&["-c", "128", "--ui-dir", ui.to_str().unwrap()]);
    let page = s.get("/");
    assert_eq!(page.status, 200);
    assert!(page.text().contains("dev ui"));
    assert!(page.header("content-security-policy").unwrap().contains("frame-ancestors 'none'"));
    for path in ["/secret.txt", "/passwd", "/../secret.txt", "/%2e%2e/secret.txt"] {
        let r = s.get(path);
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert!(!r.text().contains("the secret") && !r.text().contains("root:"), "{path}");
    }
    no_panic(&s);
}

#[test]
fn connections_event_streams_and_request_time_are_limited_with_clear_errors() {
    let _g = common::one_at_a_time();
    let s = Server::start(&[
        "-c",
        "4096",
        "--max-connections",
        "3",
        "--max-event-streams",
        "1",
        "--request-timeout-s",
        "1",
        // The idle connections below must outlive a loaded machine's slowest step.
        "--header-timeout-s",
        "120",
    ]);
    // One event stream is held open; the second is refused.
    let mut events = s.connect();
    events.write_all(format!("GET /strata/events HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", s.port).as_bytes()).unwrap();
    let mut head = [0u8; 12];
    events.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let e = s.get("/strata/events").expect_error(503);
    assert_eq!(e["code"], "too_many_event_streams");
    assert!(e["message"].as_str().unwrap().contains("--max-event-streams 1"), "{e}");
    // Two more idle connections fill the three allowed: the next is answered 503 and closed.
    // A connection's slot is counted from when the server accepts it until the server sees it closed, which
    // on a loaded machine may lag the client: an idle connection may itself be refused while the refused
    // event stream's slot is still held. Such a one is replaced, and the refusal counts only once both idle
    // connections are held (a server that never refuses fails here after 60 s).
    let refused = |c: &std::net::TcpStream| {
        c.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        !matches!(c.peek(&mut [0u8; 1]), Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
    };
    let mut idle: Vec<std::net::TcpStream> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let r = loop {
        idle.retain(|c| !refused(c));
        while idle.len() < 2 {
            idle.push(s.connect());
        }
        std::thread::sleep(Duration::from_millis(200));
        let r = s.get("/health");
        let held = idle.iter().filter(|c| !refused(c)).count();
        if (r.status != 200 && held == 2) || std::time::Instant::now() > deadline {
            break r;
        }
    };
    assert_eq!(r.status, 503, "{}; the server's log: {}", r.text(), s.stderr());
    assert_eq!(r.expect_error(503)["code"], "too_many_connections");
    assert_eq!(r.header("retry-after"), Some("1"));
    drop(idle);
    drop(events);
    std::thread::sleep(Duration::from_millis(500));
    // A generation that would run for many seconds ends at the limit with 504.
    let t0 = std::time::Instant::now();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": true, "temperature": 0});
    let e = s.post("/v1/completions", &body).expect_error(504);
    assert_eq!(e["code"], "request_timeout");
    assert!(e["message"].as_str().unwrap().contains("--request-timeout-s"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    // The server goes on.
    assert_eq!(s.post("/v1/chat/completions", &chat_body("Hi", 2)).status, 200);
    no_panic(&s);
}

#[test]
fn reuse_figures_are_hidden_on_a_network_address_unless_asked_for() {
    let _g = common::one_at_a_time();
    let body = chat_body("Tell me about the sea.", 4);
    let cached = |s: &Server| {
        let r = s.post_auth("/v1/chat/completions", "k", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        (u(&v["usage"]["prompt_tokens_details"]["cached_tokens"]), u(&v["strata"]["reused"]), u(&v["strata"]["read"]))
    };
    // On 0.0.0.0 (a key is required there): the second identical prompt is reused but not said to be.
    // Nor in the request_done events or /metrics, which every holder of the key reads too.
    let elsewhere = |s: &Server| {
        let t = s.get_auth("/strata/telemetry", "k").json();
        let done: Vec<Value> =
            t["events"].as_array().expect("events").iter().filter(|e| e["event"] == "request_done").cloned().collect();
        assert_eq!(done.len(), 2, "{t}");
        let reused: u64 = done.iter().map(|e| u(&e["reused"])).sum();
        let metrics = s.get_auth("/metrics", "k").text();
        let line = metrics.lines().find(|l| l.starts_with("strata_reused_tokens_total")).expect("the reuse counter");
        (reused, line.rsplit(' ').next().unwrap().parse::<u64>().expect("a count"))
    };
    let s = Server::start(&["-c", "256", "--host", "0.0.0.0", "--api-key", "k"]);
    cached(&s);
    let (c, reused, read) = cached(&s);
    assert_eq!((c, reused), (0, 0));
    assert!(read > 0);
    assert_eq!(elsewhere(&s), (0, 0));
    drop(s);
    let s = Server::start(&["-c", "256", "--host", "0.0.0.0", "--api-key", "k", "--reuse-figures", "show"]);
    cached(&s);
    let (c, reused, _) = cached(&s);
    assert!(c > 0 && c == reused, "{c} {reused}");
    assert_eq!(elsewhere(&s), (reused, reused));
}

#[test]
fn embeddings_give_one_unit_vector_per_input_and_refuse_bad_inputs_by_name() {
    let _one = common::one_at_a_time();
    let s = Server::start(&["-c", "64"]);
    let r = s.post("/v1/embeddings", &json!({"input": ["a red apple", "a green pear", "a red apple"]}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.len(), 3, "{v}");
    let vec_of = |d: &Value| -> Vec<f64> {
        d["embedding"].as_array().expect("floats").iter().map(|x| x.as_f64().unwrap()).collect()
    };
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i as u64);
        assert_eq!(d["object"], "embedding");
        let e = vec_of(d);
        assert_eq!(e.len(), 576, "n_embd of the default model");
        assert!((e.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-4);
    }
    assert_eq!(vec_of(&data[0]), vec_of(&data[2]), "the same text, the same vector");
    assert_ne!(vec_of(&data[0]), vec_of(&data[1]));
    assert_eq!(v["usage"]["prompt_tokens"], v["usage"]["total_tokens"]);
    assert!(u(&v["usage"]["prompt_tokens"]) >= 9, "{}", v["usage"]);
    // Token ids: lists of them, or one list.
    let ids = s.post("/v1/embeddings", &json!({"input": [[1, 2, 3], [4, 5]]})).json();
    assert_eq!(ids["data"].as_array().map(Vec::len), Some(2), "{ids}");
    assert_eq!(u(&ids["usage"]["prompt_tokens"]), 5);
    let one = s.post("/v1/embeddings", &json!({"input": [1, 2, 3]})).json();
    assert_eq!(one["data"][0]["embedding"], ids["data"][0]["embedding"]);
    // base64: the same floats' little-endian bytes; the path without /v1 too.
    let b = s.post("/embeddings", &json!({"input": "a red apple", "encoding_format": "base64"})).json();
    let text = b["data"][0]["embedding"].as_str().expect("a base64 string").to_owned();
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).expect("base64");
    let floats: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let printed: Vec<f32> = vec_of(&data[0]).iter().map(|&x| x as f32).collect();
    assert_eq!(floats, printed, "base64 and JSON give the same f32s");
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": ""}), "input[0]"),
        (json!({"input": [[1, 2], [1, 99999999]]}), "input[1][1]"),
        (json!({"input": "x", "encoding_format": "hex"}), "encoding_format"),
        (json!({"input": "x", "dimensions": 8}), "dimensions"),
        (json!({"input": vec!["x"; 2049]}), "input"),
        (json!({"inputs": "x"}), "inputs"),
    ] {
        let e = s.post("/v1/embeddings", &body).expect_error(400);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    let long = s.post("/v1/embeddings", &json!({"input": ["ok", "word ".repeat(100)]})).expect_error(400);
    assert_eq!(long["code"], "context_length_exceeded", "{long}");
    assert_eq!(long["param"], "input[1]", "{long}");
    assert!(long["message"].as_str().is_some_and(|m| m.contains("too large")), "{long}");
    // llama.cpp's forms: an object with prompt_string or text parts is the text; a list that mixes ids and
    // strings is one input, the text tokenized in place.
    let forms = s.post(
        "/v1/embeddings",
        &json!({"input": [
            {"prompt_string": "a red apple"},
            {"content": [{"type": "text", "text": "a red "}, {"type": "text", "text": "apple"}]},
            "a green pear",
        ]}),
    );
    let forms = forms.json();
    assert_eq!(forms["data"][0]["embedding"], data[0]["embedding"], "prompt_string is the text");
    assert_eq!(forms["data"][1]["embedding"], data[0]["embedding"], "text parts are the text joined");
    assert_eq!(forms["data"][2]["embedding"], data[1]["embedding"]);
    let text_tokens = u(&s.post("/v1/embeddings", &json!({"input": "a red apple"})).json()["usage"]["prompt_tokens"]);
    let mixed = s.post("/v1/embeddings", &json!({"input": [1, 2, "a red apple", 3]})).json();
    assert_eq!(mixed["data"].as_array().map(Vec::len), Some(1), "ids and strings mixed are one input: {mixed}");
    assert_eq!(u(&mixed["usage"]["prompt_tokens"]), text_tokens + 3, "{mixed}");
    for (body, param) in [
        (json!({"input": {"content": "a string"}}), "input"),
        (json!({"input": {"content": [{"type": "unknown"}]}}), "input.content[0]"),
        (
            json!({"input": {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}}),
            "input.content[0]",
        ),
        (json!({"input": [1, true]}), "input[0]"),
        (json!({"input": ["ok", [1, "x", null]]}), "input[1][2]"),
        (json!({"input": {"prompt_string": 7}}), "input.prompt_string"),
    ] {
        let e = s.post("/v1/embeddings", &body).expect_error(400);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    no_panic(&s);
}

#[test]
fn pooling_none_gives_every_token_s_vector_whose_mean_and_last_are_the_pooled_ones() {
    let _one = common::one_at_a_time();
    let text = "a red apple on the table";
    let floats =
        |v: &Value| -> Vec<f64> { v.as_array().expect("floats").iter().map(|x| x.as_f64().unwrap()).collect() };
    let unit = |v: Vec<f64>| -> Vec<f64> {
        let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        v.iter().map(|x| x / n).collect()
    };
    let close = |a: &[f64], b: &[f64]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
    let s = Server::start(&["-c", "64", "--pooling", "none"]);
    let e = s.post("/v1/embeddings", &json!({"input": text})).expect_error(400);
    assert!(e["message"].as_str().is_some_and(|m| m.contains("/embeddings")), "{e}");
    let r = s.post("/embeddings", &json!({"input": [text, "pear"]}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let list = v.as_array().expect("llama.cpp's form: a list, one entry per input");
    assert_eq!(list.len(), 2);
    assert_eq!(list[1]["index"], 1);
    let rows: Vec<Vec<f64>> = list[0]["embedding"].as_array().expect("a vector per token").iter().map(floats).collect();
    assert!(rows.len() >= 5, "one vector per token: {}", rows.len());
    assert!(rows.iter().all(|r| r.len() == 576));
    assert!(rows.iter().all(|r| (r.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() > 1e-3), "not normalized");
    no_panic(&s);
    drop(s);
    let mean: Vec<f64> = (0..576).map(|i| rows.iter().map(|r| r[i]).sum::<f64>() / rows.len() as f64).collect();
    let s = Server::start(&["-c", "64"]);
    let pooled = floats(&s.post("/v1/embeddings", &json!({"input": text})).json()["data"][0]["embedding"]);
    assert!(close(&unit(mean), &pooled), "the mean of the token vectors, normalized, is the default (mean) embedding");
    drop(s);
    let s = Server::start(&["-c", "64", "--pooling", "last"]);
    let last = floats(&s.post("/v1/embeddings", &json!({"input": text})).json()["data"][0]["embedding"]);
    assert!(close(&unit(rows[rows.len() - 1].clone()), &last), "--pooling last: the last token's vector");
    assert!(!close(&last, &pooled));
}

#[test]
fn a_chat_template_file_renders_the_conversation_instead_of_the_model_s_own() {
    let _one = common::one_at_a_time();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("plain.jinja");
    std::fs::write(&path, "{% for m in messages %}{{ m['content'] }}{% endfor %}").expect("write");
    let s = Server::start(&["-c", "128", "--chat-template-file", path.to_str().unwrap()]);
    let prompt = "The capital of France is";
    let chat = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 6, "temperature": 0}),
        )
        .json();
    let plain = s.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 6, "temperature": 0})).json();
    assert_eq!(chat["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"], "{chat} {plain}");
    assert_eq!(
        chat["choices"][0]["message"]["content"], plain["choices"][0]["text"],
        "the same prompt, the same reply"
    );
    drop(s);
    // The model's own template wraps the text in its turn markers: more tokens.
    let s = Server::start(&["-c", "128"]);
    let own = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 1, "temperature": 0}),
        )
        .json();
    assert!(u(&own["usage"]["prompt_tokens"]) > u(&plain["usage"]["prompt_tokens"]), "{own}");
}
