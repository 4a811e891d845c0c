//! `strata serve` end to end over loopback, on the default model: the OpenAI endpoints (streamed and not,
//! choices, log-probabilities, completions), the API key, the conversation cache through the API against
//! `strata replay` (the reported scenario with a squeezed device), hostile requests, load, disconnects,
//! signals and a faulted GPU.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use common::server::{chat_body, streamed_text, Server};
use serde_json::{json, Value};

/// Servers that compute run one at a time: each uses both cores.
static MODEL_RUNS: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    MODEL_RUNS.lock().unwrap_or_else(|e| e.into_inner())
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a whole number: {v}"))
}

fn no_panic(s: &Server) {
    let err = s.stderr();
    assert!(!err.contains("panicked"), "the server panicked: {err}");
}

#[test]
fn starts_on_a_free_port_answers_health_and_models_and_stops_on_sigterm() {
    let _one = one_at_a_time();
    let s = Server::start(&["-c", "512", "--alias", "gpt-4o-mini"]);
    let h = s.get("/health");
    assert_eq!(h.status, 200, "{}", h.text());
    assert_eq!(h.json()["status"], "ok");
    let models = s.get("/v1/models").json();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["SmolLM2-135M-Instruct.Q4_1", "gpt-4o-mini"]);
    assert_eq!(models["object"], "list");
    // The id, the alias and no model field select the model; another name is a 404 naming what is served.
    for model in [Some("SmolLM2-135M-Instruct.Q4_1"), Some("gpt-4o-mini"), None] {
        let mut body = chat_body("Hi", 2);
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["model"], model.unwrap_or("SmolLM2-135M-Instruct.Q4_1"));
    }
    let mut body = chat_body("Hi", 2);
    body["model"] = json!("llama-70b");
    let e = s.post("/v1/chat/completions", &body).expect_error(404);
    assert!(e["message"].as_str().unwrap().contains("\"SmolLM2-135M-Instruct.Q4_1\", \"gpt-4o-mini\""), "{e}");
    assert_eq!((e["param"].as_str(), e["code"].as_str()), (Some("model"), Some("model_not_found")));
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
        "strata_requests_total{endpoint=\"chat\"} 3",
        "strata_generated_tokens_total 6",
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
    let _one = one_at_a_time();
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
    let other = s.request("GET", "/v1/models", &[("Origin", "http://evil.example")], b"");
    assert_eq!(other.status, 200);
    assert!(other.header("access-control-allow-origin").is_none());
    let bad = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["serve", "--port", "0", "--cors-origin", "localhost"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not an origin"));
}

#[test]
fn streamed_and_whole_replies_agree_and_choices_logprobs_and_completions_work() {
    let _one = one_at_a_time();
    let s = Server::start(&["-c", "1024"]);
    let q = "Name three colours.";
    let whole = s.post("/v1/chat/completions", &chat_body(q, 24)).json();
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    assert!(!text.is_empty());
    let mut body = chat_body(q, 24);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (streamed, chunks) = streamed_text(&s.post("/v1/chat/completions", &body));
    assert_eq!(streamed, text, "the streamed text differs from the whole reply");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
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
    assert_eq!(u(&r["usage"]["total_tokens"]), 1024 + 1, "{}", r["usage"]);
    no_panic(&s);
}

/// One line of a replay script.
fn script_ops(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Runs a replay script over HTTP: chats as chat completions (the whole history, greedy), faults through
/// /strata/sim. Returns each reply's response JSON in order.
fn replay_over_http(s: &Server, ops: &[Value]) -> Vec<Value> {
    let mut histories: std::collections::HashMap<String, Vec<Value>> = Default::default();
    let mut out = Vec::new();
    for op in ops {
        match op["op"].as_str().unwrap() {
            "chat" => {
                let conv = op["conversation"].as_str().unwrap().to_owned();
                let h = histories.entry(conv).or_default();
                h.push(json!({"role": "user", "content": op["user"]}));
                let body =
                    json!({"messages": h, "temperature": 0, "max_tokens": op["max_tokens"].as_u64().unwrap_or(128)});
                let r = s.post("/v1/chat/completions", &body);
                assert_eq!(r.status, 200, "{}", r.text());
                let r = r.json();
                h.push(json!({"role": "assistant", "content": r["choices"][0]["message"]["content"].as_str().unwrap().trim()}));
                out.push(r);
            }
            "fork" => {
                let from = histories[op["from"].as_str().unwrap()].clone();
                let keep = from.len() - op["drop_last"].as_u64().unwrap_or(0) as usize;
                histories.insert(op["to"].as_str().unwrap().to_owned(), from[..keep].to_vec());
            }
            "pressure" => {
                let body = match op.get("mib") {
                    Some(m) => json!({"device": op["device"], "pressure_mib": m}),
                    None => json!({"device": op["device"], "leave_free_mib": op["leave_free_mib"]}),
                };
                assert_eq!(s.post("/strata/sim", &body).status, 200);
            }
            "fail_samples" => {
                let body = json!({"device": op["device"], "fail_samples": op["count"]});
                assert_eq!(s.post("/strata/sim", &body).status, 200);
            }
            other => panic!("op {other}"),
        }
    }
    out
}

const SPLIT: &[&str] = &[
    "--devices",
    "sim:200,sim:400",
    "--layer-split",
    "15",
    "--vram-reserve-mib",
    "32",
    "--conversation-cache-mib",
    "256",
    "-c",
    "8192",
];

const CACHE_EVENTS: &[&str] =
    &["parked", "restored", "restore_fallback", "sample_failed", "evicted", "oom_averted", "not_parked"];

/// The cache events of a list of telemetry events, as (kind, tokens, restore kind).
fn cache_story(events: &[Value]) -> Vec<(String, u64, Value)> {
    events
        .iter()
        .filter(|e| CACHE_EVENTS.contains(&e["event"].as_str().unwrap_or("")))
        .map(|e| (e["event"].as_str().unwrap().to_owned(), e["tokens"].as_u64().unwrap_or(0), e["kind"].clone()))
        .collect()
}

#[test]
fn the_reported_scenario_over_http_parks_falls_back_and_restores_exactly_as_replay_does() {
    let _one = one_at_a_time();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/replay/reported.jsonl");
    let ops = script_ops(&script);
    // What replay does with the script.
    let rep = Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("replay")
        .arg(&script)
        .args(SPLIT)
        .args(["--conversation-cache-slots", "2", "-t", "2", "-m"])
        .arg(common::model_path())
        .output()
        .unwrap();
    assert!(rep.status.success(), "{}", String::from_utf8_lossy(&rep.stderr));
    let story: Vec<Value> =
        String::from_utf8_lossy(&rep.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let replayed: Vec<&Value> = story.iter().filter(|v| v["event"] == "response").collect();

    // The same over HTTP, with the event stream open the whole time.
    let s = Server::start(&[SPLIT, &["--conversation-cache-slots", "2"]].concat());
    let mut events_conn = s.connect();
    events_conn.write_all(b"GET /strata/events HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let served = replay_over_http(&s, &ops);
    assert_eq!(served.len(), replayed.len());
    for (http, rep) in served.iter().zip(&replayed) {
        assert_eq!(http["choices"][0]["message"]["content"], rep["text"], "a reply differs from replay's");
        assert_eq!(http["strata"]["reused"], rep["reused"]);
        assert_eq!(http["strata"]["read"], rep["read"]);
        assert_eq!(http["strata"]["restored"], rep["restored"]);
        assert_eq!(http["usage"]["prompt_tokens_details"]["cached_tokens"], rep["reused"]);
    }
    // The same cache events in the same order, with their figures.
    let t = s.get("/strata/telemetry?since_ms=0").json();
    let events = t["events"].as_array().unwrap();
    let replay_events: Vec<Value> =
        story.iter().filter(|v| CACHE_EVENTS.contains(&v["event"].as_str().unwrap())).cloned().collect();
    assert_eq!(cache_story(events), cache_story(&replay_events));
    let fb: Vec<&Value> = events.iter().filter(|e| e["event"] == "restore_fallback").collect();
    assert_eq!(fb.len(), 1);
    let rfb = replay_events.iter().find(|e| e["event"] == "restore_fallback").unwrap();
    for k in ["device", "free_mib", "need_mib", "reserve_mib", "tokens"] {
        assert_eq!(fb[0][k], rfb[k], "{k}");
    }
    assert_eq!(fb[0]["device"], 1);
    // The reply that fell back says so, with the gate's figures; the next return to a restores live.
    let fell_back = served.iter().find(|r| !r["strata"]["fallback"].is_null()).unwrap();
    assert_eq!(fell_back["strata"]["fallback"]["reason"], "gate");
    assert_eq!(fell_back["strata"]["fallback"]["device"], 1);
    let i = served.iter().position(|r| !r["strata"]["fallback"].is_null()).unwrap();
    assert!(served[i + 2]["strata"]["restored"] == "live" && u(&served[i + 2]["strata"]["restored_tokens"]) > 2000);
    assert!(events.iter().filter(|e| e["event"] == "request_done").count() == served.len());
    let samples = t["samples"].as_array().unwrap();
    assert!(samples.iter().any(|x| x["device"] == 1 && x["free_bytes"].is_u64()), "gate samples are recorded");

    // The event stream showed the same events as they happened, and device samples.
    let cache = s.get("/strata/cache").json();
    assert_eq!((cache["slots"].as_u64(), cache["budget_bytes"].as_u64()), (Some(2), Some(256 << 20)));
    let parked = cache["parked"].as_array().unwrap();
    assert!(!parked.is_empty() && parked.len() <= 2, "{cache}");
    assert_eq!(u(&cache["bytes"]), parked.iter().map(|p| u(&p["bytes"])).sum::<u64>());
    assert!(parked.iter().all(|p| u(&p["tokens"]) > 0 && p["checkpoints"].is_array() && p["last_use_ms"].is_f64()));
    assert_eq!(cache["evictions"], json!(story.iter().filter(|v| v["event"] == "evicted").count()));
    // Samples keep coming twice a second: read what is there for a second and a half.
    events_conn.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(1500) {
        match events_conn.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => {}
        }
    }
    let text = String::from_utf8_lossy(&buf);
    let streamed: Vec<Value> = text
        .split("\n\n")
        .filter(|e| e.contains("event: engine"))
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(cache_story(&streamed), cache_story(events), "the event stream missed events");
    assert!(text.contains("event: sample"), "no device samples on the stream");
    drop(events_conn);

    // The reply after the fallback is the one a server without the cache gives.
    drop(s);
    let plain = Server::start(&[SPLIT, &["--conversation-cache-slots", "0"]].concat());
    let uncached = replay_over_http(&plain, &ops);
    for (a, b) in served.iter().zip(&uncached) {
        assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
    }
    assert!(uncached.iter().all(|r| r["strata"]["restored"].is_null()));
    no_panic(&plain);
}

#[test]
fn the_official_openai_python_client_works_against_the_server() {
    let _one = one_at_a_time();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pylib = root.join(".cache/pylib");
    let s = Server::start(&["-c", "1024", "--api-key", "sk-local"]);
    let out = Command::new("python3")
        .arg(root.join("tests/openai_client.py"))
        .arg(format!("http://127.0.0.1:{}/v1", s.port))
        .arg("sk-local")
        .env("PYTHONPATH", &pylib)
        .output()
        .expect("python3 runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("No module named 'openai'"),
        "the openai package is not in {}: run scripts/setup",
        pylib.display()
    );
    assert!(out.status.success(), "the openai client failed: {err}\nserver: {}", s.stderr());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("checks passed"), "{said}");
    eprintln!("{}", said.trim());
    no_panic(&s);
}
