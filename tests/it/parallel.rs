//! `strata serve --parallel`: requests generating at once (continuous batching) get the replies each gets
//! alone, streamed or not, with their log-probabilities bit for bit; `/health` and `/metrics` show the
//! slots in use; `/strata/settings` says how many and `/strata/plan` counts their KV.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::server::{streamed_text, Server};
use serde_json::{json, Value};

const PROMPTS: [&str; 8] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Count from one to ten.",
    "Name three colors.",
    "Why is the sky blue?",
    "Say hello in Spanish.",
    "What is two plus two?",
    "Tell me a fact about cats.",
];

fn body(user: &str, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": user}],
        "temperature": 0,
        "max_tokens": 24,
        "logprobs": true,
        "stream": stream,
    })
}

/// The reply's text and its tokens' log-probabilities (as JSON, so any change in a bit shows).
fn reply(s: &Server, user: &str, stream: bool) -> (String, Vec<Value>) {
    let r = s.post("/v1/chat/completions", &body(user, stream));
    if stream {
        let (text, chunks) = streamed_text(&r);
        let logprobs = chunks
            .iter()
            .flat_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned().unwrap_or_default())
            .collect();
        return (text, logprobs);
    }
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let text = v["choices"][0]["message"]["content"].as_str().expect("content").to_owned();
    (text, v["choices"][0]["logprobs"]["content"].as_array().cloned().expect("logprobs"))
}

#[test]
fn eight_clients_at_once_get_the_replies_each_gets_alone() {
    let _one = common::one_at_a_time();
    let s = Arc::new(Server::start(&["-c", "1024", "--parallel", "4"]));
    let h = s.get("/health").json();
    assert_eq!(h["slots"]["total"], 4, "{h}");
    let alone: Vec<(String, Vec<Value>)> = PROMPTS.iter().map(|p| reply(&s, p, false)).collect();

    // All eight at once (half of them streamed), while a watcher records how many slots were busy.
    let (done, most_busy) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let watcher = {
        let (s, done, most_busy) = (s.clone(), done.clone(), most_busy.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                let busy = s.get("/health").json()["slots"]["busy"].as_u64().unwrap_or(0);
                most_busy.fetch_max(busy, Ordering::AcqRel);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let clients: Vec<_> = PROMPTS
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let s = s.clone();
            std::thread::spawn(move || reply(&s, p, i % 2 == 1))
        })
        .collect();
    let together: Vec<(String, Vec<Value>)> = clients.into_iter().map(|c| c.join().expect("client")).collect();
    done.store(true, Ordering::Release);
    watcher.join().expect("watcher");

    for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(t.0, a.0, "client {i} ({:?}): the text differs from its reply alone", PROMPTS[i]);
        assert_eq!(t.1, a.1, "client {i} ({:?}): the log-probabilities differ", PROMPTS[i]);
        assert!(!t.1.is_empty(), "client {i}: log-probabilities were sent");
    }
    let busy = most_busy.load(Ordering::Acquire);
    assert!((2..=4).contains(&busy), "requests ran together, at most --parallel of them: {busy} slots busy at most");
    let metrics = s.get("/metrics").text();
    assert!(metrics.contains("strata_slots 4"), "{metrics}");
    assert!(metrics.contains("strata_slots_busy 0"), "{metrics}");
}

#[test]
fn parallel_with_speculative_decoding_is_refused_with_a_reason() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["serve", "--spec", "ngram", "--parallel", "2", "--port", "0"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--parallel 2") && err.contains("one request at a time"), "{err}");
}

/// Four requests of one client are queued and running one at a time (`--parallel 1`) when another client
/// sends one: the order in which the five finish (labels).
fn finish_order(agent_user: Option<&str>, editor_user: Option<&str>) -> Vec<String> {
    let s = Arc::new(Server::start(&["-c", "1024", "--parallel", "1"]));
    let body = |user: Option<&str>| {
        let mut b = json!({"prompt": "Once upon a time", "max_tokens": 160, "temperature": 0, "ignore_eos": true});
        if let Some(u) = user {
            b["user"] = json!(u);
        }
        b
    };
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let send = |label: String, b: Value| {
        let (s, order) = (s.clone(), order.clone());
        std::thread::spawn(move || {
            let r = s.post("/v1/completions", &b);
            assert_eq!(r.status, 200, "{label}: {}", r.text());
            order.lock().unwrap().push(label);
        })
    };
    let mut clients: Vec<_> = (0..4).map(|i| send(format!("agent {i}"), body(agent_user))).collect();
    // All four are in the queue (one of them running) before the other client sends.
    while s.get("/health").json()["accepted"].as_u64().unwrap_or(0) < 4 {
        std::thread::sleep(Duration::from_millis(2));
    }
    clients.push(send("editor".into(), body(editor_user)));
    for c in clients {
        c.join().expect("client");
    }
    let order = order.lock().unwrap().clone();
    order
}

#[test]
fn a_client_with_many_queued_requests_takes_turns_with_another_client() {
    let _one = common::one_at_a_time();
    // Different `user` fields: two lanes. The editor's request starts as soon as the agent's first is done,
    // not after all four.
    let order = finish_order(Some("agent"), Some("editor"));
    assert_eq!(order[1], "editor", "{order:?}");
    // No `user`: both connect from loopback, one lane, served in the order sent.
    let order = finish_order(None, None);
    assert_eq!(order[4], "editor", "{order:?}");
}

/// The KV bytes a `/strata/plan` reply counts, every stage on the device and on the host.
fn planned_kv_bytes(reply: &Value) -> u64 {
    let rows = reply["plan"]["rows"].as_array().expect("rows");
    rows.iter().map(|r| r["kv_device_bytes"].as_u64().unwrap() + r["kv_host_bytes"].as_u64().unwrap()).sum()
}

#[test]
fn the_settings_say_the_requests_at_once_and_their_plan_counts_them() {
    let s = Server::start(&["-c", "1024", "--parallel", "3"]);
    let settings = s.get("/strata/settings").json();
    assert_eq!(settings["parallel"], 3, "{settings}");
    let plan_at = |parallel: Value| {
        let mut body = settings.clone();
        body["parallel"] = parallel;
        let r = s.post("/strata/plan", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let (one, two) = (plan_at(json!(1)), plan_at(json!(2)));
    assert!(planned_kv_bytes(&one) > 0, "{one}");
    assert_eq!(planned_kv_bytes(&two), 2 * planned_kv_bytes(&one), "{two}");
    assert_eq!((one["plan"]["sequences"].as_u64(), two["plan"]["sequences"].as_u64()), (Some(1), Some(2)));
    let flags: Vec<&str> = two["flags"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(flags.windows(2).any(|w| w == ["--parallel", "2"]), "{flags:?}");
    // As the server was started: its own figure.
    assert_eq!(planned_kv_bytes(&plan_at(json!(3))), 3 * planned_kv_bytes(&one));
    // Refused naming the field: out of range, or above 1 with speculative decoding.
    let mut bad = settings.clone();
    bad["parallel"] = json!(0);
    let e = s.post("/strata/plan", &bad).expect_error(400);
    assert_eq!(e["param"], "parallel", "{e}");
    bad["parallel"] = json!(2);
    bad["speculative"] = json!({"kind": "ngram"});
    let e = s.post("/strata/plan", &bad).expect_error(400);
    assert_eq!(e["param"], "parallel", "{e}");
    assert!(e["message"].as_str().unwrap().contains("one request at a time"), "{e}");
    drop(s);
    // Without --parallel the settings leave it empty (saved back, they keep the default a default) and
    // their plan counts the number the server picked: its slots, on the CPU up to 4; 1 with speculative
    // decoding.
    for (args, want) in [(&["-c", "1024"][..], None), (&["-c", "1024", "--spec", "ngram"][..], Some(1))] {
        let s = Server::start(args);
        let settings = s.get("/strata/settings").json();
        assert!(settings["parallel"].is_null(), "{settings}");
        let slots = s.get("/health").json()["slots"]["total"].as_u64().expect("slots");
        assert!((1..=4).contains(&slots) && want.is_none_or(|w| w == slots), "{args:?}: {slots} slots");
        let r = s.post("/strata/plan", &settings);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["plan"]["sequences"].as_u64(), Some(slots), "{args:?}");
    }
}
