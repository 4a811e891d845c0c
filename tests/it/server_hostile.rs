//! `strata serve` against hostile and heavy clients: malformed and oversized requests, wrong types in every
//! field, slow clients, hang-ups, a flood against a full queue, sustained and concurrent load, and a GPU
//! that faults for good. Each time: the right status and error JSON, the server alive and serving, memory
//! back near its baseline.

use crate::common;

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::server::{chat_body, parse_response, streamed_text, Server};
use serde_json::{json, Value};

fn no_panic(s: &Server) {
    let err = s.stderr();
    assert!(!err.contains("panicked"), "the server panicked: {err}");
}

/// A valid chat request still gets its reply.
fn still_serves(s: &Server) {
    let r = s.post("/v1/chat/completions", &chat_body("Say hi.", 3));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
}

fn raw_post(body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

#[test]
fn hostile_requests_get_the_right_status_and_error_json_and_the_server_stays_up() {
    let _one = common::one_at_a_time();
    let s = Server::start(&["-c", "128", "--max-body-mib", "8"]);
    still_serves(&s);
    let baseline_kib = s.rss_kib();
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let mut count = 0;
    // (body, status, the param the error names, or a word of its message)
    let mut cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{\"messages\": [".to_vec(), 400, "invalid_json"),
        (b"[1, 2, 3]".to_vec(), 400, "invalid type"),
        (b"".to_vec(), 400, "empty"),
        (b"   ".to_vec(), 400, "empty"),
        (
            b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": NaN}".to_vec(),
            400,
            "invalid_json",
        ),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]} {}".to_vec(), 400, "invalid_json"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(), 400, "invalid_json"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\x01b\"}]}".to_vec(), 400, "invalid_json"),
        (format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(), 400, "invalid type"),
        (
            format!("{{\"messages\": [], \"prediction\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000))
                .into_bytes(),
            400,
            "messages",
        ),
        (format!("{{\"messages\": {}{}}}", "[".repeat(5000), "]".repeat(5000)).into_bytes(), 400, "invalid type"),
        (format!("{{\"tool_choice\": {}{}}}", "[".repeat(5000), "]".repeat(5000)).into_bytes(), 400, "recursion limit"),
    ];
    let field_cases: Vec<(Value, &str)> = vec![
        (json!({}), "messages"),
        (json!({"messages": []}), "messages"),
        (json!({"messages": "hi"}), "messages"),
        (json!({"messages": [5]}), "messages[0]"),
        (json!({"messages": [{"content": "hi"}]}), "messages[0]"),
        (json!({"messages": [{"role": 5, "content": "hi"}]}), "messages[0].role"),
        (json!({"messages": [{"role": "wizard", "content": "hi"}]}), "messages[0].role"),
        (json!({"messages": [{"role": "function", "content": "hi"}]}), "messages[0].role"),
        (json!({"messages": [{"role": "user", "content": 5}]}), "messages[0].content"),
        (json!({"messages": [{"role": "user"}]}), "messages[0].content"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            "messages[0].content[0].type",
        ),
        (json!({"messages": [{"role": "user", "content": "hi", "colour": "red"}]}), "messages[0]"),
        (json!({"messages": msgs, "colour": "red"}), "colour"),
        (json!({"messages": msgs, "model": 5}), "model"),
        (json!({"messages": msgs, "max_tokens": "10"}), "max_tokens"),
        (json!({"messages": msgs, "max_tokens": 0}), "max_tokens"),
        (json!({"messages": msgs, "max_tokens": -1}), "max_tokens"),
        (json!({"messages": msgs, "max_tokens": 1e30}), "max_tokens"),
        (json!({"messages": msgs, "max_completion_tokens": "x"}), "max_completion_tokens"),
        (json!({"messages": msgs, "temperature": "hot"}), "temperature"),
        (json!({"messages": msgs, "temperature": -0.5}), "temperature"),
        (json!({"messages": msgs, "temperature": 1e308}), "temperature"),
        (json!({"messages": msgs, "top_p": "x"}), "top_p"),
        (json!({"messages": msgs, "top_p": 2}), "top_p"),
        (json!({"messages": msgs, "n": "2"}), "n"),
        (json!({"messages": msgs, "n": 0}), "n"),
        (json!({"messages": msgs, "n": 9}), "n"),
        (json!({"messages": msgs, "seed": "x"}), "seed"),
        (json!({"messages": msgs, "seed": 1.5}), "seed"),
        (json!({"messages": msgs, "stop": 5}), "stop"),
        (json!({"messages": msgs, "stop": [1]}), "stop"),
        (json!({"messages": msgs, "stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"messages": msgs, "presence_penalty": "x"}), "presence_penalty"),
        (json!({"messages": msgs, "presence_penalty": 3}), "presence_penalty"),
        (json!({"messages": msgs, "frequency_penalty": []}), "frequency_penalty"),
        (json!({"messages": msgs, "logprobs": "yes"}), "logprobs"),
        (json!({"messages": msgs, "top_logprobs": "3", "logprobs": true}), "top_logprobs"),
        (json!({"messages": msgs, "top_logprobs": 21, "logprobs": true}), "top_logprobs"),
        (json!({"messages": msgs, "top_logprobs": 2}), "top_logprobs"),
        (json!({"messages": msgs, "stream": "yes"}), "stream"),
        (json!({"messages": msgs, "stream_options": 5, "stream": true}), "stream_options"),
        (json!({"messages": msgs, "stream_options": {"include_usage": true}}), "stream_options"),
        (json!({"messages": msgs, "top_k": "x"}), "top_k"),
        (json!({"messages": msgs, "top_k": -2}), "top_k"),
        (json!({"messages": msgs, "min_p": 7}), "min_p"),
        (json!({"messages": msgs, "repeat_penalty": 0}), "repeat_penalty"),
        (json!({"messages": msgs, "tools": [{"type": "function"}]}), "tools[0].function"),
        (json!({"messages": msgs, "tools": [{"type": "retrieval"}]}), "tools[0].type"),
        (
            json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "a b"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]}),
            "tools[1].function.name",
        ),
        (
            json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
        (
            json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"}),
            "tool_choice",
        ),
        (json!({"messages": msgs, "tool_choice": "required"}), "tool_choice"),
        (
            json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (json!({"messages": [{"role": "tool", "content": "18C"}]}), "messages[0].tool_call_id"),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (json!({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}), "messages[0].tool_calls"),
        (json!({"messages": msgs, "functions": [{"name": "f"}]}), "functions"),
        (json!({"messages": msgs, "logit_bias": {"50256": -100}}), "logit_bias"),
        (json!({"messages": msgs, "response_format": {"type": "sound"}}), "response_format.type"),
        (json!({"messages": msgs, "response_format": {"type": "json_schema"}}), "response_format.json_schema"),
        (
            json!({"messages": msgs, "response_format": {"type": "json_object", "schema": {"type": "hiccup"}}}),
            "response_format.schema",
        ),
        (json!({"messages": msgs, "grammar": "root ::= (", "response_format": {"type": "text"}}), "grammar"),
        (json!({"messages": msgs, "grammar": "root ::= \"a\"", "json_schema": {}}), "json_schema"),
        (json!({"messages": [{"role": "user", "content": "word ".repeat(400)}]}), "messages"),
    ];
    for (body, param) in &field_cases {
        cases.push((body.to_string().into_bytes(), 400, param));
    }
    for (body, status, needle) in &cases {
        let r = parse_response(&{
            let mut c = s.connect();
            c.write_all(&raw_post(body)).unwrap();
            let mut v = Vec::new();
            let _ = c.read_to_end(&mut v);
            v
        })
        .unwrap_or_else(|| panic!("no response to {:?}", String::from_utf8_lossy(&body[..body.len().min(200)])));
        let e = r.expect_error(*status);
        let shown = format!("{e}");
        let named = e["param"].as_str() == Some(needle)
            || e["code"].as_str() == Some(needle)
            || e["message"].as_str().unwrap().contains(needle);
        assert!(named, "{:?} -> {shown}", String::from_utf8_lossy(&body[..body.len().min(200)]));
        count += 1;
    }
    // A prompt over the context names both numbers.
    let long = s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "word ".repeat(400)}]}));
    let e = long.expect_error(400);
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("but the context holds 128") && m.contains("the prompt is 4"), "{m}");
    assert_eq!(e["code"], "context_length_exceeded");
    // Control characters in content are text: served.
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "a\u{0000}b\u{001b}[31m\u{0007}"}], "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // A huge max_tokens is served to the end of the context.
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 1_000_000_000_000_000i64, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
    count += 3;
    // Completions.
    for (body, param) in [
        (json!({"prompt": "hi", "echo": true}), "echo"),
        (json!({"prompt": [1, 2, 99999999]}), "prompt[2]"),
        (json!({"prompt": [-1]}), "prompt[0]"),
        (json!({"prompt": ["a", "b"]}), "prompt"),
        (json!({"prompt": ""}), "prompt"),
        (json!({"prompt": "hi", "logprobs": 6}), "logprobs"),
        (json!({"max_tokens": 3}), "prompt"),
    ] {
        let e = s.post("/v1/completions", &body).expect_error(400);
        assert_eq!(e["param"].as_str(), Some(param), "{body} -> {e}");
        count += 1;
    }
    // Paths and methods.
    assert_eq!(s.get("/v1/nothing").expect_error(404)["type"], "not_found_error");
    s.get("/v1/chat/completions").expect_error(405);
    s.request("DELETE", "/v1/models", &[], b"").expect_error(405);
    assert_eq!(s.post("/strata/sim", &json!({"device": 0, "pressure_mib": 1})).expect_error(404)["code"], "not_found");
    s.get("/strata/telemetry?since_ms=abc").expect_error(400);
    count += 5;
    // A 20 MB body: refused on its Content-Length, and when sent chunked without one.
    let mut c = s.connect();
    c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 20000000\r\n\r\n{\"messages\":").unwrap();
    let mut v = Vec::new();
    let _ = c.read_to_end(&mut v);
    assert_eq!(parse_response(&v).unwrap().expect_error(413)["code"], "request_too_large");
    let c = s.connect();
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..20 {
            if w.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).is_err()
                || w.write_all(&chunk).is_err()
                || w.write_all(b"\r\n").is_err()
            {
                break;
            }
        }
    });
    let mut v = Vec::new();
    let mut c = c;
    let _ = c.read_to_end(&mut v);
    let _ = writer.join();
    parse_response(&v).expect("a 413 before the connection closes").expect_error(413);
    count += 2;
    // A client that hangs up mid-stream: its generation ends at the next token, the server serves the next.
    let mut c = s.connect();
    let body = json!({"messages": msgs, "max_tokens": 100, "stream": true, "ignore_eos": true}).to_string();
    c.write_all(&raw_post(body.as_bytes())).unwrap();
    let mut first = [0u8; 512];
    let n = c.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).contains("200 OK"));
    drop(c);
    let t0 = Instant::now();
    while !s.stderr().contains("request cancelled: its client went away") {
        assert!(t0.elapsed() < Duration::from_secs(20), "the generation went on: {}", s.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    still_serves(&s);
    count += 1;
    assert!(count >= 40, "{count} hostile requests");
    // Memory is back near its baseline.
    let after_kib = s.rss_kib();
    assert!(after_kib < baseline_kib + baseline_kib / 5 + 16 * 1024, "RSS {baseline_kib} KiB -> {after_kib} KiB");
    no_panic(&s);
    eprintln!("{count} hostile requests; RSS {baseline_kib} KiB before, {after_kib} KiB after");
}

#[test]
fn slow_clients_are_bounded_by_timeouts() {
    let s = Server::start(&["-c", "128", "--header-timeout-s", "2", "--body-timeout-s", "2"]);
    // Headers that never end: the connection is closed after the header timeout.
    let t0 = Instant::now();
    let mut c = s.connect();
    c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n").unwrap();
    let mut v = Vec::new();
    let _ = c.read_to_end(&mut v);
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10), "{waited:?}");
    // A body that never ends: 408 in error JSON after the body timeout.
    let t0 = Instant::now();
    let mut c = s.connect();
    c.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mess",
    )
    .unwrap();
    let mut v = Vec::new();
    let _ = c.read_to_end(&mut v);
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(parse_response(&v).unwrap().expect_error(408)["code"], "request_timeout");
    let _one = common::one_at_a_time();
    still_serves(&s);
    no_panic(&s);
}

#[test]
fn a_flood_against_a_full_queue_gets_503_with_retry_after_and_queued_clients_that_leave_are_dropped() {
    let _one = common::one_at_a_time();
    let s = Arc::new(Server::start(&["-c", "4096", "--queue", "16", "--parallel", "1"]));
    // A long reply keeps the engine busy.
    let mut long = s.connect();
    let body = json!({"messages": [{"role": "user", "content": "Count."}], "max_tokens": 3000, "ignore_eos": true, "temperature": 0}).to_string();
    long.write_all(&raw_post(body.as_bytes())).unwrap();
    let t0 = Instant::now();
    while s.get("/health").json()["busy"] != true {
        assert!(t0.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(10));
    }
    // 16 clients wait in the queue, then leave.
    let mut queued = Vec::new();
    for _ in 0..16 {
        let mut c = s.connect();
        c.write_all(&raw_post(chat_body("Hi", 2).to_string().as_bytes())).unwrap();
        queued.push(c);
    }
    while s.get("/health").json()["queue"] != 16 {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", s.get("/health").text());
        std::thread::sleep(Duration::from_millis(10));
    }
    // 1,000 more requests, 50 at a time: every one is refused at once with 503 and Retry-After.
    let refused = Arc::new(Mutex::new(0));
    for _ in 0..20 {
        let threads: Vec<_> = (0..50)
            .map(|_| {
                let s = s.clone();
                let refused = refused.clone();
                std::thread::spawn(move || {
                    let r = s.post("/v1/chat/completions", &chat_body("Hi", 2));
                    let e = r.expect_error(503);
                    assert_eq!(e["code"], "queue_full");
                    assert_eq!(r.header("retry-after"), Some("1"));
                    *refused.lock().unwrap() += 1;
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    assert_eq!(*refused.lock().unwrap(), 1000);
    // The queued clients leave, then the long one: the queued requests are dropped before they start.
    drop(queued);
    // Their places are free at once, while the long reply still runs.
    let t0 = Instant::now();
    loop {
        let h = s.get("/health").json();
        assert_eq!(h["busy"], true, "the long reply ended early");
        if h["queue"] == 0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the queue kept the clients that left: {h}");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(long);
    let t0 = Instant::now();
    while !s.stderr().contains("request cancelled") || s.stderr().matches("a queued request was dropped").count() < 16 {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", s.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    still_serves(&s);
    let m = s.get("/metrics").text();
    assert!(m.contains("strata_requests_dropped_total 16"), "{m}");
    assert!(m.contains("strata_requests_rejected_total{kind=\"queue_full\"} 1000"), "{m}");
    no_panic(&s);
}

#[test]
fn sustained_and_concurrent_streaming_load_keeps_fifo_order_and_every_reply() {
    let _one = common::one_at_a_time();
    let questions =
        ["What is rain?", "Name a fruit.", "Say hello.", "What is two plus two?", "Name a colour.", "What is a cat?"];
    let body = |q: &str| {
        let mut b = chat_body(q, 8);
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
        b
    };
    // Each request alone, on a server without a cache.
    let alone: Vec<String> = {
        let s = Server::start(&["-c", "512", "--conversation-cache-slots", "0"]);
        questions.iter().map(|q| streamed_text(&s.post("/v1/chat/completions", &body(q))).0).collect()
    };
    // The telemetry ring is a bounded buffer that fills over the first ~1,400 requests at its default
    // size; a small one is full after the warm-up, so what grows after that would be a leak.
    let s = Arc::new(Server::start(&["-c", "512", "--queue", "64", "--telemetry-entries", "128"]));
    // Warm up to the steady state: every question once in a row, then all at once.
    for q in &questions {
        streamed_text(&s.post("/v1/chat/completions", &body(q)));
    }
    let warm: Vec<_> = questions
        .iter()
        .map(|q| {
            let (s2, b) = (s.clone(), body(q));
            std::thread::spawn(move || streamed_text(&s2.post("/v1/chat/completions", &b)))
        })
        .collect();
    warm.into_iter().for_each(|t| drop(t.join().unwrap()));
    let baseline_kib = s.rss_kib();
    // 200 in a row.
    for i in 0..200 {
        let (text, _) = streamed_text(&s.post("/v1/chat/completions", &body(questions[i % questions.len()])));
        assert_eq!(text, alone[i % questions.len()], "request {i}");
    }
    // 32 at once, each sent after the one before it was queued: served in that order.
    let mut threads = Vec::new();
    let accepted_before = s.get("/health").json()["accepted"].as_u64().unwrap();
    for i in 0..32 {
        let s2 = s.clone();
        let q = questions[i % questions.len()];
        let b = body(q);
        threads.push(std::thread::spawn(move || {
            let (text, chunks) = streamed_text(&s2.post("/v1/chat/completions", &b));
            (i, text, chunks.last().unwrap()["strata"]["job"].as_u64().unwrap())
        }));
        // Wait until the queue has it before sending the next.
        let t0 = Instant::now();
        while s.get("/health").json()["accepted"].as_u64().unwrap() < accepted_before + i as u64 + 1 {
            assert!(t0.elapsed() < Duration::from_secs(30), "request {i} was not queued");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let mut results: Vec<(usize, String, u64)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    results.sort_by_key(|r| r.0);
    for (i, text, _) in &results {
        assert_eq!(text, &alone[i % questions.len()], "concurrent request {i}");
    }
    let jobs: Vec<u64> = results.iter().map(|r| r.2).collect();
    let mut sorted = jobs.clone();
    sorted.sort();
    assert_eq!(jobs, sorted, "not served in arrival order");
    let after_kib = s.rss_kib();
    assert!(after_kib <= baseline_kib + baseline_kib / 10, "RSS {baseline_kib} KiB -> {after_kib} KiB");
    no_panic(&s);
    eprintln!("load: RSS {baseline_kib} KiB before, {after_kib} KiB after 232 requests");
}

#[test]
fn sigterm_finishes_the_request_in_flight_refuses_the_queue_and_exits_0() {
    let _one = common::one_at_a_time();
    let s = Server::start(&["-c", "1024", "--parallel", "1"]);
    let mut c = s.connect();
    let body = json!({"messages": [{"role": "user", "content": "Count."}], "max_tokens": 60, "ignore_eos": true, "temperature": 0}).to_string();
    c.write_all(&raw_post(body.as_bytes())).unwrap();
    let t0 = Instant::now();
    while s.get("/health").json()["busy"] != true {
        assert!(t0.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut queued = s.connect();
    queued.write_all(&raw_post(chat_body("Hi", 2).to_string().as_bytes())).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let st = s.stop();
    assert_eq!(st.code(), Some(0));
    let mut v = Vec::new();
    let _ = c.read_to_end(&mut v);
    let r = parse_response(&v).expect("the reply in flight was sent");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["usage"]["completion_tokens"], 60, "it finished");
    let mut v = Vec::new();
    let _ = queued.read_to_end(&mut v);
    assert_eq!(parse_response(&v).unwrap().expect_error(503)["code"], "shutting_down");
}

#[test]
fn a_faulted_gpu_answers_503_unhealthy_and_exits_75() {
    let _one = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model_file(dir.path());
    let mut s = Server::start(&[
        "-m",
        model.to_str().unwrap(),
        "--devices",
        "emu:64",
        "--sim-fault",
        "0:fault-context=1@tokens=8",
    ]);
    let r = s.post("/v1/completions", &json!({"prompt": "hello there", "max_tokens": 20, "temperature": 0}));
    let e = r.expect_error(503);
    assert_eq!(e["type"], "unhealthy");
    assert!(e["message"].as_str().unwrap().contains("the context faulted"), "{e}");
    let st = s.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(75), "{}", s.stderr());
    assert!(s.logs("unhealthy"));
}

#[test]
fn a_request_that_runs_out_of_device_memory_gets_an_error_and_the_next_is_served() {
    let _one = common::one_at_a_time();
    let s = Server::start(&["--devices", "sim:200,sim:400", "--layer-split", "15", "-c", "2048"]);
    still_serves(&s);
    assert_eq!(s.post("/strata/sim", &json!({"device": 1, "fail_alloc": 1000})).status, 200);
    let r = s.post("/v1/chat/completions", &chat_body(&"Tell me about the sea. ".repeat(20), 4));
    let e = r.expect_error(503);
    assert_eq!(e["code"], "out_of_memory");
    assert_eq!(s.get("/health").status, 200);
    assert_eq!(s.post("/strata/sim", &json!({"device": 1, "fail_alloc": 0})).status, 200);
    still_serves(&s);
    let bad = s.post("/strata/sim", &json!({"device": 5, "pressure_mib": 1})).expect_error(400);
    assert!(bad["message"].as_str().unwrap().contains("not a sim device"));
    s.post("/strata/sim", &json!({"device": 1})).expect_error(400);
    no_panic(&s);
}
