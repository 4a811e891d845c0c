//! `strata replay` end to end on the default model: the reported scenario (a long conversation parked, its
//! restore refused by the gate on a squeezed device, then restored live, then an edited turn restored from a
//! checkpoint despite a failed free-memory sample), the same over HTTP against `strata serve` (the same
//! replies, figures and cache events as replay's), a failed turn, and bad scripts. Every run with the cache
//! gives the same tokens as the same chats without it (for the reported scenario: reported_plain.jsonl, its
//! chats one conversation at a time, so that the cache-less run reads the long conversation once).

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use crate::common::server::Server;
use serde_json::{json, Value};

/// The split of the report, scaled to the default model: layers 0..15 on a 200 MiB GPU, 15..30 on a 400 MiB
/// one, 32 MiB kept free on each, two cache slots of a 256 MiB budget.
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

const MIB: f64 = (1u64 << 20) as f64;
/// One KV page of one layer: 64 positions of K and V, 192 f16 values each.
const PAGE_BYTES: u64 = 64 * 192 * 2 * 2;
/// Layers on device 1.
const LAYERS_ON_DEVICE_1: u64 = 15;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/replay").join(name)
}

fn replay(script: &Path, args: &[&str]) -> Output {
    let _one = common::one_at_a_time();
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("replay")
        .arg(script)
        .args(args)
        .env("STRATA_MODEL", common::model_path())
        .output()
        .expect("the strata binary runs")
}

/// The output lines of a run that must have succeeded.
fn story(o: &Output) -> Vec<Value> {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "replay failed: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn of<'a>(story: &'a [Value], event: &str) -> Vec<&'a Value> {
    story.iter().filter(|v| v["event"] == event).collect()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a whole number: {v}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The response of script line `line`.
fn response(story: &[Value], line: u64) -> &Value {
    story.iter().find(|v| v["event"] == "response" && v["line"] == line).expect("a response on that line")
}

/// Each response's line and tokens, which the cache must never change.
fn tokens_by_line(story: &[Value]) -> Vec<(u64, Value)> {
    of(story, "response").iter().map(|r| (u(&r["line"]), r["tokens"].clone())).collect()
}

/// MiB as the engine reports them (one decimal).
fn mib_1(bytes: u64) -> f64 {
    (bytes as f64 / MIB * 10.0).round() / 10.0
}

/// Each response with its conversation and its turn in it (1, 2, ...), in the order of the story.
fn turns(story: &[Value]) -> Vec<((String, usize), &Value)> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    of(story, "response")
        .into_iter()
        .map(|r| {
            let conv = r["conversation"].as_str().expect("a conversation").to_owned();
            let k = seen.entry(conv.clone()).or_default();
            *k += 1;
            ((conv, *k), r)
        })
        .collect()
}

/// The reported scenario with the cache, and its chats without it (one run of each for the tests that read
/// them: the cached one reads the long conversation twice).
struct Reported {
    cached: Vec<Value>,
    /// reported_plain.jsonl with --conversation-cache-slots 0.
    plain: Vec<Value>,
    /// The cached run's log.
    log: String,
}

fn reported() -> &'static Reported {
    static RUNS: OnceLock<Reported> = OnceLock::new();
    RUNS.get_or_init(|| {
        let cached_run = replay(&script("reported.jsonl"), &[SPLIT, &["--conversation-cache-slots", "2"]].concat());
        let plain =
            story(&replay(&script("reported_plain.jsonl"), &[SPLIT, &["--conversation-cache-slots", "0"]].concat()));
        Reported { cached: story(&cached_run), plain, log: String::from_utf8_lossy(&cached_run.stderr).into_owned() }
    })
}

#[test]
fn the_cache_never_changes_a_reply() {
    let Reported { cached, plain, .. } = reported();
    // Every turn of every conversation: the same prompt and the same tokens with the cache as without it.
    let without: BTreeMap<_, _> = turns(plain).into_iter().collect();
    let with = turns(cached);
    assert_eq!(with.len(), without.len(), "turns without the cache: {:?}", without.keys());
    for (turn, r) in &with {
        let p = without.get(turn).unwrap_or_else(|| panic!("{turn:?} is not in the run without the cache"));
        assert_eq!(r["prompt_tokens"], p["prompt_tokens"], "{turn:?}: another prompt");
        assert_eq!(r["tokens"], p["tokens"], "the cache changed the reply of {turn:?}");
    }
    assert_eq!(of(cached, "response").len(), 8);
    assert!(of(cached, "error").is_empty() && of(plain, "error").is_empty());
    assert!(of(plain, "parked").is_empty() && of(plain, "restored").is_empty());
    assert_eq!(of(cached, "fault").len(), 3);
}

#[test]
fn the_reported_scenario_falls_back_then_restores() {
    let Reported { cached, log, .. } = reported();
    // a is parked when the user switches to b.
    let first_park = of(cached, "parked")[0];
    let a_tokens = u(&first_park["tokens"]);
    assert!((2000..3000).contains(&a_tokens), "a is long: {first_park}");

    // Back to a with device 1 squeezed to 20 MiB free while b (holding the pages a left) is live: the gate
    // counts b's pages as free (they go first when a restore is admitted), sees 20 MiB + those, and refuses.
    let fallbacks = of(cached, "restore_fallback");
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    let fb = fallbacks[0];
    assert_eq!((u(&fb["device"]), u(&fb["tokens"])), (1, a_tokens), "{fb}");
    assert_eq!(f(&fb["reserve_mib"]), 32.0, "{fb}");
    let need_bytes = a_tokens.div_ceil(64) * LAYERS_ON_DEVICE_1 * PAGE_BYTES;
    assert_eq!(f(&fb["free_mib"]), mib_1(20 * (1 << 20) + need_bytes), "the squeeze plus b's freed pages: {fb}");
    assert_eq!(f(&fb["need_mib"]), mib_1(need_bytes), "a's KV on device 1 in whole pages: {fb}");
    assert!(f(&fb["free_mib"]) - f(&fb["need_mib"]) < f(&fb["reserve_mib"]));
    let skipped = "strata replay: conversation cache: restore skipped: device 1 free 44 MiB - need 24 MiB < reserve 32 MiB; snapshot kept";
    assert!(log.contains(skipped), "{log}");
    // ... and the prompt is reread: all but the few template tokens it shares with the live b, which the
    // refusal left in place.
    let reread = response(cached, u(&fb["line"]));
    assert_eq!(reread["conversation"], "a");
    assert_eq!(reread["restored"], Value::Null);
    assert!(u(&reread["reused"]) < 64, "{reread}");
    assert_eq!(u(&reread["read"]) + u(&reread["reused"]), u(&reread["prompt_tokens"]));
    assert!(u(&reread["read"]) > a_tokens - 64, "{reread}");
    // The refused snapshot stayed in the cache: it is the one evicted when a is parked again.
    let evicted = of(cached, "evicted");
    assert!(!evicted.is_empty() && u(&evicted[0]["tokens"]) == a_tokens, "{evicted:?}");

    // With the pressure lifted, b and back to a: a restores live and reads only the new turn.
    let restored: Vec<&Value> =
        of(cached, "restored").into_iter().filter(|r| r["kind"] == "live" && u(&r["tokens"]) > 2000).collect();
    assert_eq!(restored.len(), 1, "{restored:?}");
    let resp = response(cached, u(&restored[0]["line"]));
    assert_eq!((&resp["conversation"], &resp["restored"]), (&Value::from("a"), &Value::from("live")));
    assert_eq!(u(&resp["reused"]), u(&restored[0]["tokens"]), "{resp}");
    assert!(u(&resp["read"]) < 64, "only the new turn is read: {resp}");
}

#[test]
fn an_edited_turn_restores_from_a_checkpoint_despite_a_failed_sample() {
    let Reported { cached, log, .. } = reported();
    // a2 is a without its last turn, plus a different question: a's snapshot restores up to the end of the
    // prompt whose reply a2 keeps (a's third), and the rest (that reply and the new question) is read.
    let kept_turn = of(cached, "response").into_iter().filter(|r| r["conversation"] == "a").nth(2).expect("a's 3rd");
    let checkpoint = u(&kept_turn["prompt_tokens"]);
    assert!(checkpoint > 2000, "{kept_turn}");
    let restored: Vec<&Value> = of(cached, "restored").into_iter().filter(|r| r["kind"] == "checkpoint").collect();
    assert_eq!(restored.len(), 1, "{restored:?}");
    assert_eq!(u(&restored[0]["tokens"]), checkpoint, "{}", restored[0]);
    let line = u(&restored[0]["line"]);
    let edited = response(cached, line);
    assert_eq!((&edited["conversation"], &edited["restored"]), (&Value::from("a2"), &Value::from("checkpoint")));
    assert_eq!(u(&edited["reused"]), checkpoint, "{edited}");
    assert_eq!(u(&edited["read"]), u(&edited["prompt_tokens"]) - checkpoint);
    assert!(u(&edited["read"]) < 64, "the kept reply and the new question: {edited}");
    assert_eq!(of(cached, "fork").len(), 1);

    // Device 1's free-memory sample failed at that gate decision: reported, and the restore went ahead.
    let failed = of(cached, "sample_failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!((u(&failed[0]["device"]), u(&failed[0]["count"]), u(&failed[0]["line"])), (1, 1, line));
    assert!(log.contains("strata replay: conversation cache: free-memory sample of device 1 failed"), "{log}");
}

/// The reported scenario with two sequences generating at once (reported_parallel.jsonl, --parallel 2):
/// a's restore beside the generating b falls back because b's growth would squeeze device 1 (alone it would
/// fit), a is reread while b generates; later b is restored beside a. Every reply is the one the same chats
/// give one conversation at a time without the cache.
#[test]
fn the_reported_scenario_with_two_sequences_at_once_falls_back_then_restores() {
    let run = replay(
        &script("reported_parallel.jsonl"),
        &[SPLIT, &["--conversation-cache-slots", "2", "--parallel", "2"]].concat(),
    );
    let log = String::from_utf8_lossy(&run.stderr).into_owned();
    let cached = story(&run);
    let plain = story(&replay(
        &script("reported_parallel_plain.jsonl"),
        &[SPLIT, &["--conversation-cache-slots", "0", "--parallel", "1"]].concat(),
    ));
    let without: BTreeMap<_, _> = turns(&plain).into_iter().collect();
    let with = turns(&cached);
    assert_eq!(with.len(), 8, "{with:?}");
    assert_eq!(with.len(), without.len());
    for (turn, r) in &with {
        let p = without.get(turn).unwrap_or_else(|| panic!("{turn:?} is not in the run one at a time"));
        assert_eq!(r["prompt_tokens"], p["prompt_tokens"], "{turn:?}: another prompt");
        assert_eq!(r["tokens"], p["tokens"], "batching beside another sequence or the cache changed {turn:?}");
    }
    assert!(of(&cached, "error").is_empty() && of(&plain, "error").is_empty());

    // a is parked when b takes the first sequence.
    let a_tokens = u(&of(&cached, "parked")[0]["tokens"]);
    assert!((2000..3000).contains(&a_tokens));
    // The together line: one fallback, on device 1, whose need is a's KV there plus b's growth.
    let fallbacks = of(&cached, "restore_fallback");
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    let fb = fallbacks[0];
    let a_alone = a_tokens.div_ceil(64) * LAYERS_ON_DEVICE_1 * PAGE_BYTES;
    assert_eq!((u(&fb["device"]), u(&fb["tokens"])), (1, a_tokens), "{fb}");
    assert!(f(&fb["need_mib"]) > mib_1(a_alone) + 5.0, "b's growth is counted: {fb}");
    assert!(f(&fb["free_mib"]) - mib_1(a_alone) >= f(&fb["reserve_mib"]), "alone, a's restore would fit: {fb}");
    assert!(log.contains("restore skipped: device 1 free 60 MiB - need 34 MiB < reserve 32 MiB"), "{log}");
    let line = u(&fb["line"]);
    let at_line: Vec<&Value> = of(&cached, "response").into_iter().filter(|r| u(&r["line"]) == line).collect();
    assert_eq!(at_line.len(), 2, "both turns of the together line answered");
    let (b, a) = (at_line[0], at_line[1]);
    assert_eq!((&b["conversation"], &a["conversation"]), (&Value::from("b"), &Value::from("a")));
    assert_eq!((&a["restored"], u(&a["read"])), (&Value::Null, u(&a["prompt_tokens"])), "a is reread: {a}");
    assert!(u(&b["reused"]) > 0, "b went on in its live sequence: {b}");

    // With the pressure lifted: a goes on in its live sequence while b is restored beside it.
    let last = of(&cached, "response").into_iter().rfind(|r| r["conversation"] == "b").expect("b");
    assert_eq!(last["restored"], "live", "{last}");
    let a_last = of(&cached, "response").into_iter().rfind(|r| r["conversation"] == "a").expect("a");
    assert_eq!(a_last["line"], last["line"], "the two turns ran together");
    assert!(u(&a_last["read"]) < 64 && a_last["restored"] == Value::Null, "a continued live: {a_last}");
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
    let mut histories: HashMap<String, Vec<Value>> = Default::default();
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

/// `strata serve` on the same flags, the script sent over HTTP (chats as chat completions, faults through
/// /strata/sim): replay's replies, figures and cache events (its cached run is the one the tests above read),
/// and every reply that of the chats without the cache.
#[test]
fn the_reported_scenario_over_http_parks_falls_back_and_restores_exactly_as_replay_does() {
    let Reported { cached: story, plain, .. } = reported();
    let ops = script_ops(&script("reported.jsonl"));
    let replayed = turns(story);
    let _one = common::one_at_a_time();

    // The same over HTTP, with the event stream open the whole time.
    let s = Server::start(&[SPLIT, &["--conversation-cache-slots", "2"]].concat());
    let mut events_conn = s.connect();
    events_conn.write_all(b"GET /strata/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let served = replay_over_http(&s, &ops);
    assert_eq!(served.len(), replayed.len());
    for (http, (_, rep)) in served.iter().zip(&replayed) {
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

    // Every reply, the one after the fallback included, is the one the chats give without the cache.
    let without: BTreeMap<_, _> = turns(plain).into_iter().collect();
    for (http, (turn, _)) in served.iter().zip(&replayed) {
        assert_eq!(http["choices"][0]["message"]["content"], without[turn]["text"], "{turn:?}");
    }
    let err = s.stderr();
    assert!(!err.contains("panicked"), "the server panicked: {err}");
}

fn temp_script(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write temp script");
    p
}

#[test]
fn a_failed_turn_is_reported_and_dropped_and_the_script_goes_on() {
    let failing = temp_script(
        "failing.jsonl",
        "{\"op\":\"fail_alloc\",\"device\":1,\"count\":1000}\n\
         {\"op\":\"chat\",\"conversation\":\"a\",\"user\":\"hi\",\"max_tokens\":4}\n\
         {\"op\":\"fail_alloc\",\"device\":1,\"count\":0}\n\
         {\"op\":\"chat\",\"conversation\":\"a\",\"user\":\"Name a fruit.\",\"max_tokens\":6}\n",
    );
    let clean = temp_script(
        "clean.jsonl",
        "{\"op\":\"chat\",\"conversation\":\"a\",\"user\":\"Name a fruit.\",\"max_tokens\":6}\n",
    );
    let s = story(&replay(&failing, SPLIT));
    let errors = of(&s, "error");
    assert_eq!(errors.len(), 1, "{s:?}");
    assert_eq!((u(&errors[0]["line"]), &errors[0]["conversation"]), (2, &Value::from("a")));
    assert!(errors[0]["error"].as_str().is_some_and(|e| e.contains("device 1 (sim:400)")), "{}", errors[0]);
    // The failed turn left the history: the next turn's prompt is the one of a fresh conversation.
    let after = response(&s, 4);
    let fresh = story(&replay(&clean, SPLIT));
    assert_eq!((&after["prompt_tokens"], &after["tokens"]), (&fresh[0]["prompt_tokens"], &fresh[0]["tokens"]));
}

/// A run that must fail before doing anything: exit 1, no output, one line on stderr naming `needles`.
fn assert_script_refused(text: &str, devices: &[&str], needles: &[&str]) {
    let p = temp_script("bad.jsonl", text);
    let o = Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("replay")
        .arg(&p)
        .args(devices)
        .env("STRATA_MODEL", common::model_path())
        .output()
        .expect("the strata binary runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(o.stdout.is_empty(), "nothing runs: {}", String::from_utf8_lossy(&o.stdout));
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(lines[0].starts_with("strata: error: "), "{err}");
    for n in needles {
        assert!(lines[0].contains(n), "{n:?} not in {err}");
    }
}

#[test]
fn a_bad_script_line_is_one_error_naming_the_line() {
    let chat = "{\"op\":\"chat\",\"conversation\":\"a\",\"user\":\"hi\",\"max_tokens\":4}\n";
    let split = ["--devices", "sim:200,sim:400", "--layer-split", "15"];
    assert_script_refused(&format!("# comment\n{chat}{{\"op\":\"explode\"}}\n"), &split, &["line 3", "explode"]);
    assert_script_refused(&format!("{chat}\n{{\"op\":\"chat\",\n"), &split, &["line 3", "EOF"]);
    assert_script_refused(
        &format!("{chat}{{\"op\":\"chat\",\"conversation\":\"a\",\"user\":\"hi\",\"temperature\":1}}\n"),
        &split,
        &["line 2", "unknown field `temperature`"],
    );
    assert_script_refused(
        &format!("{chat}{{\"op\":\"pressure\",\"device\":9,\"mib\":10}}\n"),
        &split,
        &["line 2", "device 9 is not in --devices"],
    );
    assert_script_refused(
        &format!("{chat}{{\"op\":\"pressure\",\"device\":1}}\n"),
        &split,
        &["line 2", "exactly one of \"mib\" and \"leave_free_mib\""],
    );
    assert_script_refused(
        &format!("{chat}{{\"op\":\"fail_samples\",\"device\":0,\"count\":1}}\n"),
        &["--devices", "cpu,sim:400", "--layer-split", "15"],
        &["line 2", "device 0 (cpu) is the host"],
    );
    assert_script_refused(
        &format!("{chat}{{\"op\":\"fork\",\"from\":\"z\",\"to\":\"y\"}}\n"),
        &split,
        &["line 2", "fork from \"z\""],
    );
    let missing = Path::new("/nonexistent/script.jsonl");
    let o = Command::new(env!("CARGO_BIN_EXE_strata")).arg("replay").arg(missing).output().expect("runs");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot read script /nonexistent/script.jsonl"));
}

/// The reported scenario's shape on two emulated GPUs (the CUDA backend on the CPU emulator) with a tiny
/// synthetic model: device 1 squeezed under its reserve gives a fallback, lifting the squeeze a restore, and
/// every answer equals the cache-less run. scripts/gpu-check runs the full-size script on a real GPU.
#[test]
fn the_scenario_on_two_emulated_gpus_falls_back_then_restores() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = common::tiny_model_file(dir.path());
    // A 142-token first message: three pages, the shape of the report at the smallest size that has it.
    let long = "the quick brown fox jumps over the lazy dog. ".repeat(5);
    let lines = [
        serde_json::json!({"op": "chat", "conversation": "a", "user": long, "max_tokens": 4}),
        serde_json::json!({"op": "chat", "conversation": "b", "user": "hello world", "max_tokens": 4}),
        serde_json::json!({"op": "pressure", "device": 1, "leave_free_mib": 7}),
        serde_json::json!({"op": "chat", "conversation": "a", "user": "the sea is calm", "max_tokens": 4}),
        serde_json::json!({"op": "pressure", "device": 1, "mib": 0}),
        serde_json::json!({"op": "chat", "conversation": "b", "user": "then there were three", "max_tokens": 4}),
        serde_json::json!({"op": "chat", "conversation": "a", "user": "these are the things", "max_tokens": 4}),
    ];
    let path = dir.path().join("scenario.jsonl");
    std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let run = |slots: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_strata"))
            .arg("replay")
            .arg(&path)
            .args(["--devices", "emu:64,emu:64", "--layer-split", "1", "--vram-reserve-mib", "8"])
            .args(["--conversation-cache-slots", slots, "-m"])
            .arg(&model)
            .output()
            .expect("runs");
        story(&o)
    };
    let cached = run("2");
    let fallback = of(&cached, "restore_fallback");
    assert_eq!(fallback.len(), 1, "{cached:?}");
    assert_eq!((u(&fallback[0]["line"]), u(&fallback[0]["device"])), (4, 1));
    let restored = of(&cached, "restored");
    // (A checkpoint restore here: the random model's 4-token reply re-tokenizes differently in the
    // template, so the prompt extends a's snapshot only up to its last checkpoint, the end of line 4's prompt.)
    let line_4_prompt = u(&response(&cached, 4)["prompt_tokens"]);
    assert!(restored.iter().any(|r| r["line"] == 7 && u(&r["tokens"]) >= line_4_prompt), "{restored:?}");
    assert_eq!(tokens_by_line(&cached), tokens_by_line(&run("0")), "the cache never changes an answer");
}
