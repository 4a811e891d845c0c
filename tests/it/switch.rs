//! Switching the model of a running `strata serve` (`POST /strata/model/load`): the new model serves
//! without a restart, the old one's conversations wait in the cache under its identity and restore when it
//! comes back (with the same tokens as before), a snapshot never restores into the other model, requests
//! sent during the switch run on the model they were made for, and what needs a new process, or a file
//! the server does not list, is refused with the field named.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::server::Server;
use crate::common::{self, strata};

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a whole number: {v}"))
}

/// The default model requantized to q8_0 in the models folder `dir` (as a download lands:
/// `owner/name/file`): another model of the same family, with other weights.
fn second_model(dir: &Path) -> PathBuf {
    let out = dir.join("test/smol-q8/SmolLM2-135M-Instruct.Q8_0.gguf");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let o = strata(&["quantize", common::model_path().to_str().unwrap(), out.to_str().unwrap(), "--type", "q8_0"]);
    assert!(o.status.success(), "quantize failed: {}", common::stderr(&o));
    out
}

fn conversation(max_tokens: u32) -> Value {
    json!({"messages": [
        {"role": "system", "content": "You are a helpful assistant who answers in one sentence."},
        {"role": "user", "content": "Name three colours of the rainbow, and tell me which one is in the middle."}],
        "temperature": 0, "max_tokens": max_tokens})
}

/// Chats and returns (reply, cached prompt tokens).
fn chat(s: &Server, body: &Value) -> (String, u64) {
    let r = s.post("/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let reply = v["choices"][0]["message"]["content"].as_str().expect("a reply").to_owned();
    (reply, u(&v["usage"]["prompt_tokens_details"]["cached_tokens"]))
}

fn load(s: &Server, path: &Path, change: impl FnOnce(&mut Value)) -> common::server::Resp {
    let mut settings = s.get("/strata/settings").json();
    settings["model_path"] = json!(path.to_str().unwrap());
    change(&mut settings);
    s.post("/strata/model/load", &settings)
}

#[test]
fn a_running_server_switches_models_and_back_and_the_old_conversation_restores() {
    let _g = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let q8 = second_model(dir.path());
    let first = common::model_path();
    let s = Server::start(&["-c", "512", "--models-dir", dir.path().to_str().unwrap()]);
    let first_id = s.get("/strata/model").json()["id"].as_str().unwrap().to_owned();
    let (reply_a, cached) = chat(&s, &conversation(12));
    assert_eq!(cached, 0);

    // To the q8_0 model: served at once, under its own id, with the conversation parked.
    let r = load(&s, &q8, |_| {});
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["model"]["id"], "SmolLM2-135M-Instruct.Q8_0", "{v}");
    assert_eq!(u(&v["switch"]["parked"]), 1, "{v}");
    assert_eq!(s.get("/strata/model").json()["id"], "SmolLM2-135M-Instruct.Q8_0");
    assert_eq!(s.get("/v1/models").json()["data"][0]["id"], "SmolLM2-135M-Instruct.Q8_0");
    assert_eq!(s.get("/strata/settings").json()["model_path"], json!(q8.to_str().unwrap()));
    // The same conversation on the other model: nothing of the first model's snapshot is restored into it.
    let (_, cached) = chat(&s, &conversation(12));
    assert_eq!(cached, 0, "a snapshot of one model restored into another");
    let cache = s.get("/strata/cache").json();
    assert_eq!(cache["parked"].as_array().map(Vec::len), Some(1), "{cache}");

    // Back to the first model (it was served here, so it may be loaded though it is not in the folder): the
    // conversation restores from the cache, and the reply is the one it gave before.
    let r = load(&s, &first, |_| {});
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"]["id"], json!(first_id));
    let (reply_again, cached) = chat(&s, &conversation(12));
    assert!(cached > 20, "the parked conversation was not restored: {cached} cached tokens");
    assert_eq!(reply_again, reply_a, "the restored conversation answered differently");
    assert!(s.logs("model switch: 1 live conversation(s) parked"), "{}", s.stderr());
    let events = s.get("/strata/telemetry").json();
    let loaded = events["events"].as_array().unwrap().iter().filter(|e| e["event"] == "model_loaded").count();
    assert_eq!(loaded, 3, "a model_loaded marker per model: {events}");
    assert!(!s.stderr().contains("panicked"), "{}", s.stderr());
}

/// A reply's model id and text.
fn answer(r: &common::server::Resp) -> (String, String) {
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    (v["model"].as_str().unwrap().to_owned(), v["choices"][0]["message"]["content"].as_str().unwrap().to_owned())
}

/// A greedy request that generates for a while (96 tokens): it keeps the engine busy while a switch is asked for.
fn long_request() -> Value {
    json!({"messages": [{"role": "user", "content": "Count from one to sixty in words, one per line."}],
        "temperature": 0, "max_tokens": 96})
}

/// Waits (up to 10 s) until `/health` says a request is generating.
fn wait_busy(s: &Server) {
    let t0 = std::time::Instant::now();
    while s.get("/health").json()["busy"] != json!(true) && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[test]
fn requests_sent_during_a_switch_are_answered_by_the_model_they_were_made_for() {
    let _g = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let q8 = second_model(dir.path());
    let s = Server::start(&["-c", "512", "--models-dir", dir.path().to_str().unwrap()]);
    let long = long_request();
    let (a_id, reply_a) = answer(&s.post("/v1/chat/completions", &long));
    // One request generating when the switch is asked for, two more sent while it goes on: each answer names
    // the model it was tokenized for, and is that model's own answer (greedy: the same every time).
    let (first, later, loaded) = std::thread::scope(|sc| {
        let first = sc.spawn(|| s.post("/v1/chat/completions", &long));
        wait_busy(&s);
        let loader = sc.spawn(|| {
            load(&s, &q8, |v| {
                v["max_context"] = json!(384);
                v["cache_mib"] = json!(64);
            })
        });
        std::thread::sleep(std::time::Duration::from_millis(30));
        let later: Vec<_> = (0..2).map(|_| sc.spawn(|| s.post("/v1/chat/completions", &long))).collect();
        let loaded = loader.join().unwrap();
        (first.join().unwrap(), later.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>(), loaded)
    });
    assert_eq!(loaded.status, 200, "{}", loaded.text());
    let (b_id, reply_b) = answer(&s.post("/v1/chat/completions", &long));
    assert_eq!(b_id, "SmolLM2-135M-Instruct.Q8_0");
    assert_ne!(reply_a, reply_b, "the two models answer alike: this test could not tell them apart");
    let (model, text) = answer(&first);
    assert_eq!(model, a_id, "the request generating when the switch came was the first model's");
    assert_eq!(text, reply_a, "and it was answered whole by it");
    for r in &later {
        let (model, text) = answer(r);
        let want = if model == a_id { &reply_a } else { &reply_b };
        assert!(model == a_id || model == b_id, "{model}");
        assert_eq!(&text, want, "a request made for {model} was answered by the other model");
    }
    // The settings came with the model.
    let m = s.get("/strata/model").json();
    assert_eq!(u(&m["context"]), 384, "{m}");
    assert_eq!(u(&s.get("/strata/cache").json()["budget_bytes"]), 64 << 20);
    let long_prompt = "word ".repeat(500);
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 1}),
    );
    let e = r.expect_error(400);
    assert!(e["message"].as_str().unwrap().contains("holds 384"), "{e}");
    assert!(!s.stderr().contains("panicked"), "{}", s.stderr());
}

#[test]
fn a_second_switch_asked_for_while_one_is_under_way_is_refused_busy_and_the_first_completes() {
    let _g = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let q8 = second_model(dir.path());
    let s = Server::start(&["-c", "512", "--models-dir", dir.path().to_str().unwrap()]);
    let first_id = s.get("/strata/model").json()["id"].clone();
    let long = long_request();
    // A request generating holds the first switch (it waits for that request to end), so the second switch
    // is asked for while the first is surely under way: exactly one of the two goes through.
    let (generating, loads, still_busy) = std::thread::scope(|sc| {
        let generating = sc.spawn(|| s.post("/v1/chat/completions", &long));
        wait_busy(&s);
        let a = sc.spawn(|| load(&s, &q8, |_| {}));
        std::thread::sleep(std::time::Duration::from_millis(50));
        let b = sc.spawn(|| load(&s, &q8, |_| {}));
        let b = b.join().unwrap();
        // The request was still generating when the second answer came: the first switch could not have ended.
        let still_busy = !generating.is_finished();
        (generating.join().unwrap(), [a.join().unwrap(), b], still_busy)
    });
    assert!(still_busy, "the generating request ended before the second switch was refused: no overlap was tested");
    let statuses: Vec<u16> = loads.iter().map(|r| r.status).collect();
    assert!(
        statuses.contains(&200) && statuses.contains(&409),
        "one switch goes through, one is refused: {statuses:?}"
    );
    let refused = loads.iter().find(|r| r.status == 409).unwrap();
    let e = refused.json();
    assert_eq!(e["error"]["code"], "switch_busy", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("under way"), "{e}");
    // The request made before the switch was answered whole by the first model; the switch then went through.
    let (model, _) = answer(&generating);
    assert_eq!(json!(model), first_id);
    assert_eq!(s.get("/strata/model").json()["id"], "SmolLM2-135M-Instruct.Q8_0");
    let (reply, _) = chat(&s, &conversation(4));
    assert!(!reply.is_empty());
    // Once the first switch has ended, another may start.
    let r = load(&s, &common::model_path(), |_| {});
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.get("/strata/model").json()["id"], first_id);
    assert!(!s.stderr().contains("panicked"), "{}", s.stderr());
}

#[test]
fn a_switch_that_needs_a_restart_or_names_a_file_not_listed_is_refused_and_the_model_goes_on() {
    let _g = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&["-c", "256", "--models-dir", dir.path().to_str().unwrap()]);
    let served = common::model_path();
    // Another device list needs a new process.
    let e = load(&s, &served, |v| v["devices"] = json!("sim:300")).expect_error(409);
    assert_eq!(e["code"], "needs_restart", "{e}");
    assert_eq!(e["param"], "devices", "{e}");
    // A file outside the models folder that this server never served: refused, naming the field, without
    // saying whether it exists.
    let outside = dir.path().join("../not-listed.gguf");
    let e = load(&s, &outside, |_| {}).expect_error(400);
    assert_eq!(e["param"], "model_path", "{e}");
    assert!(e["message"].as_str().unwrap().contains("/strata/library/local"), "{e}");
    let e = load(&s, Path::new("/etc/passwd"), |_| {}).expect_error(400);
    assert_eq!(e["param"], "model_path", "{e}");
    // A file in the folder that is not a model: refused before anything changes.
    let junk = dir.path().join("a/b/junk.gguf");
    std::fs::create_dir_all(junk.parent().unwrap()).unwrap();
    std::fs::write(&junk, b"GGUF but not really").unwrap();
    let e = load(&s, &junk, |_| {}).expect_error(400);
    assert_eq!(e["param"], "model_path", "{e}");
    // Settings that do not parse are named too.
    let e = load(&s, &served, |v| v["layer_split"] = json!("x")).expect_error(400);
    assert_eq!(e["param"], "layer_split", "{e}");
    // The model served at the start still answers.
    let (reply, _) = chat(&s, &conversation(4));
    assert!(!reply.is_empty());
    assert!(!s.stderr().contains("panicked"), "{}", s.stderr());
}

#[test]
fn a_model_that_does_not_fit_beside_the_served_one_is_refused_and_the_served_one_goes_on() {
    let _g = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let q8 = second_model(dir.path());
    // A 200 MiB simulated GPU holds the 94 MiB q4_1 model, or the 136 MiB q8_0 one, not both.
    let s = Server::start(&["--devices", "sim:200", "-c", "256", "--models-dir", dir.path().to_str().unwrap()]);
    let id = s.get("/strata/model").json()["id"].clone();
    let free_before = sim_device(&s);
    let e = load(&s, &q8, |_| {}).expect_error(409);
    assert_eq!(e["code"], "model_does_not_fit", "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("does not fit beside the model served now") && msg.contains("strata serve -m"), "{e}");
    // Nothing was loaded: the device holds what it held, and the served model answers.
    assert_eq!(s.get("/strata/model").json()["id"], id);
    let free_after = sim_device(&s);
    assert!(free_before["free_bytes"].as_u64().is_some(), "{free_before}");
    assert_eq!(free_before["free_bytes"], free_after["free_bytes"], "{free_after}");
    let (reply, _) = chat(&s, &conversation(4));
    assert!(!reply.is_empty());
    assert!(!s.stderr().contains("panicked"), "{}", s.stderr());
}

/// The simulated GPU's entry of `/strata/devices`.
fn sim_device(s: &Server) -> Value {
    let d = s.get("/strata/devices").json();
    d["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "sim")
        .cloned()
        .unwrap_or_else(|| panic!("no sim device: {d}"))
}

#[test]
fn after_a_switch_the_device_holds_the_new_model_only() {
    let _g = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let q8 = second_model(dir.path());
    let weights = |s: &Server| u(&sim_device(s)["by_purpose_bytes"]["weights"]);
    // What the q8_0 model holds on the device when a server starts with it.
    let fresh = Server::start(&["--devices", "sim:400", "-c", "256", "-m", q8.to_str().unwrap()]);
    let q8_weights = weights(&fresh);
    drop(fresh);
    // A server that started with the q4_1 model and switched to the q8_0 one holds the same: the old
    // model's weights left the device.
    let s = Server::start(&["--devices", "sim:400", "-c", "256", "--models-dir", dir.path().to_str().unwrap()]);
    let q4_weights = weights(&s);
    assert!(q4_weights > 0 && q4_weights < q8_weights, "{q4_weights} {q8_weights}");
    let r = load(&s, &q8, |_| {});
    assert_eq!(r.status, 200, "{}", r.text());
    let t0 = std::time::Instant::now();
    while weights(&s) != q8_weights && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(weights(&s), q8_weights, "the device still holds the old model's weights");
    assert!(!s.stderr().contains("panicked"), "{}", s.stderr());
}
