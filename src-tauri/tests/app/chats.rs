//! chat_send in two conversations at once (the page lets a reply stream in one while the user sends in
//! another), against a stand-in remote engine that serves each request on its own thread: both requests
//! reach the engine while neither reply has ended, each reply is stored in its own conversation, a cancel
//! stops only its own conversation's reply, and deleting a conversation whose reply streams stops the reply
//! first, so that its last write does not store the conversation again.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::commands::{app, call, invoke, settings_with, App, ONE_AT_A_TIME};

/// How long the test waits for anything the engine or the app should do at once.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// A chat request reached the engine.
    Arrived,
    /// The app dropped a held reply's connection (it was cancelled).
    Dropped,
    /// A held reply ran its 10 s without being dropped, and ended.
    HeldToTheEnd,
    /// A "finish" reply ended.
    Finished,
}

/// The stand-in engine. The reply depends on the request's last message: "hold…" streams "h0 h1 …" every
/// 20 ms until the app drops the connection (for at most 10 s); "finish…" streams "f0 ", waits for a
/// signal on `go`, then streams "f1" and ends. What happens to each request is sent on `events`, with the
/// message that asked for it.
struct StreamingEngine {
    url: String,
    events: mpsc::Receiver<(Event, String)>,
    go: mpsc::Sender<()>,
}

impl StreamingEngine {
    fn next(&self) -> (Event, String) {
        self.events.recv_timeout(WAIT).expect("an event from the stand-in engine")
    }
}

fn streaming_engine() -> StreamingEngine {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (events_tx, events) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let go_rx = Arc::new(Mutex::new(go_rx));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let (events, go) = (events_tx.clone(), go_rx.clone());
            std::thread::spawn(move || serve_one(stream, &events, &go));
        }
    });
    StreamingEngine { url, events, go }
}

fn read_body(stream: &TcpStream) -> Value {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    serde_json::from_slice(&body).unwrap()
}

fn serve_one(mut out: TcpStream, events: &mpsc::Sender<(Event, String)>, go: &Mutex<mpsc::Receiver<()>>) {
    let body = read_body(&out);
    let asked = body["messages"].as_array().and_then(|m| m.last()).and_then(|m| m["content"].as_str());
    let asked = asked.unwrap_or_default().to_owned();
    let _ = events.send((Event::Arrived, asked.clone()));
    let delta = |d: Value, finish: Value| {
        format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}))
    };
    let piece = |text: &str| delta(json!({ "content": text }), Value::Null);
    let end = format!("{}data: [DONE]\n\n", delta(json!({}), json!("stop")));
    let mut write = |text: &str| out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_ok();
    write("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n");
    if asked.starts_with("hold") {
        let started = Instant::now();
        for i in 0.. {
            if started.elapsed() > WAIT {
                write(&end);
                let _ = events.send((Event::HeldToTheEnd, asked));
                return;
            }
            if !write(&piece(&format!("h{i} "))) {
                let _ = events.send((Event::Dropped, asked));
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    } else {
        write(&piece("f0 "));
        let _ = go.lock().unwrap_or_else(|e| e.into_inner()).recv_timeout(WAIT);
        write(&piece("f1"));
        write(&end);
        let _ = events.send((Event::Finished, asked));
    }
}

/// An app whose remote engine is `engine`, with `n` new conversations.
fn app_with_conversations(dir: &std::path::Path, engine: &StreamingEngine, n: usize) -> (App, Vec<String>) {
    let a = app(dir);
    let base = call(&a, "get_settings", json!({})).unwrap();
    let remote =
        settings_with(&base, json!({"engine": {"kind": "remote", "url": engine.url, "api_key": "", "model": "m"}}));
    call(&a, "save_settings", json!({ "settings": remote })).expect("a remote engine");
    let ids = (0..n)
        .map(|_| call(&a, "conversation_create", json!({"title": null})).unwrap()["id"].as_str().unwrap().to_owned())
        .collect();
    (a, ids)
}

/// chat_send of `text` in conversation `id`, on a thread of its own (the page's invoke does not block it).
fn send(a: &App, id: &str, text: &str, channel: u32) -> JoinHandle<Result<Value, Value>> {
    let window = a.window.clone();
    let params = json!({"temperature": null, "top_k": null, "top_p": null, "min_p": null, "repeat_penalty": null,
                        "max_tokens": null, "seed": null});
    let args = json!({"conversationId": id, "messages": [{"role": "user", "content": text}], "params": params,
                      "onChunk": format!("__CHANNEL__:{channel}")});
    std::thread::spawn(move || invoke(&window, "chat_send", args))
}

/// The conversation's messages as (role, content, complete).
fn messages(a: &App, id: &str) -> Vec<(String, String, bool)> {
    let c = call(a, "conversation_get", json!({ "id": id })).expect("conversation_get");
    let list = c["messages"].as_array().cloned().unwrap_or_default();
    list.iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
            (s("role"), s("content"), m["complete"].as_bool().unwrap_or(false))
        })
        .collect()
}

#[test]
fn two_conversations_stream_at_once_and_a_cancel_stops_only_its_own() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let engine = streaming_engine();
    let (a, ids) = app_with_conversations(dir.path(), &engine, 2);
    let (held, finishing) = (&ids[0], &ids[1]);
    let sent_held = send(&a, held, "hold: count for ever", 21);
    let sent_finishing = send(&a, finishing, "finish: count to two", 22);

    // Both requests reach the engine while neither reply has ended (the held one never ends by itself):
    // the app streams them at once.
    let mut arrived = vec![engine.next(), engine.next()];
    arrived.sort_by(|x, y| x.1.cmp(&y.1));
    assert_eq!(
        arrived,
        [(Event::Arrived, "finish: count to two".into()), (Event::Arrived, "hold: count for ever".into())]
    );
    // Both stream for a while (the history is written every 100 ms), then the held one is cancelled.
    std::thread::sleep(Duration::from_millis(300));
    call(&a, "chat_cancel", json!({ "conversationId": held })).expect("chat_cancel");
    assert_eq!(engine.next(), (Event::Dropped, "hold: count for ever".into()), "the cancel dropped its request");
    // The other reply was not cancelled: it goes on after the cancel and ends.
    engine.go.send(()).unwrap();
    assert_eq!(engine.next(), (Event::Finished, "finish: count to two".into()));
    sent_held.join().unwrap().expect("chat_send of the cancelled reply");
    sent_finishing.join().unwrap().expect("chat_send of the other reply");

    // Each reply is stored, complete, in its own conversation, and only there.
    let h = messages(&a, held);
    assert_eq!(h.len(), 2, "{h:?}");
    assert_eq!(h[0], ("user".into(), "hold: count for ever".into(), true));
    let (role, text, complete) = &h[1];
    assert!(role == "assistant" && *complete && text.starts_with("h0 h1 "), "{h:?}");
    assert!(text.split_whitespace().all(|w| w.starts_with('h')), "another reply's text in it: {text}");
    let f = messages(&a, finishing);
    assert_eq!(f, [("user".into(), "finish: count to two".into(), true), ("assistant".into(), "f0 f1".into(), true)]);
}

#[test]
fn deleting_a_conversation_whose_reply_streams_stops_the_reply_and_it_stays_deleted() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let engine = streaming_engine();
    let (a, ids) = app_with_conversations(dir.path(), &engine, 2);
    let (doomed, kept) = (&ids[0], &ids[1]);
    let sent = send(&a, doomed, "hold: count for ever", 23);
    assert_eq!(engine.next(), (Event::Arrived, "hold: count for ever".into()));
    std::thread::sleep(Duration::from_millis(250));

    call(&a, "conversation_delete", json!({ "id": doomed })).expect("conversation_delete");
    assert_eq!(engine.next(), (Event::Dropped, "hold: count for ever".into()), "the delete stopped the reply");
    sent.join().unwrap().expect("chat_send of the stopped reply");
    // The reply's last write came before the delete: the conversation does not come back.
    let e = call(&a, "conversation_get", json!({ "id": doomed })).unwrap_err();
    assert_eq!(e["code"], "not_found", "{e}");
    let list = call(&a, "conversations_list", json!({})).unwrap();
    let listed: Vec<&str> = list.as_array().unwrap().iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(listed, [kept.as_str()]);
}
