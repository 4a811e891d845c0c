//! The app's commands through Tauri's IPC on a mock runtime (no window, no engine): every command the UI
//! calls is registered and granted, settings that cannot work are refused naming their field, the chat
//! history survives a crash between writes, chat preferences are kept and checked, a chat's user
//! message is stored (with its title) before the reply streams, and a remote endpoint's key is kept in a
//! 0600 file of its own (moved out of an older settings.json), never sent to the page, and sent to the
//! endpoint; an http:// endpoint that is not loopback needs Allow insecure; the model library's folder is a
//! setting and its Hugging Face token is kept the same way as the remote key.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;

use serde_json::{json, Value};
use tauri::ipc::{CallbackFn, InvokeBody};
use tauri::test::{get_ipc_response, mock_builder, mock_context, noop_assets, INVOKE_KEY};
use tauri::webview::InvokeRequest;
use tauri::WebviewWindowBuilder;

/// The environment (data folder) is the process's: one app at a time.
pub(crate) static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn default_model() -> Option<PathBuf> {
    let p = root().join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    p.is_file().then_some(p)
}

pub(crate) struct App {
    _app: tauri::App<tauri::test::MockRuntime>,
    pub(crate) window: tauri::WebviewWindow<tauri::test::MockRuntime>,
}

pub(crate) fn app(data: &std::path::Path) -> App {
    std::env::set_var("STRATA_APP_DATA", data);
    std::env::set_var("STRATA_NO_ENGINE", "1");
    std::env::remove_var("STRATA_MODEL");
    let app = strata_desktop::builder(mock_builder()).build(mock_context(noop_assets())).expect("the app builds");
    strata_desktop::init(app.handle()).expect("the app's state");
    let window = WebviewWindowBuilder::new(&app, "main", Default::default()).build().expect("a window");
    App { _app: app, window }
}

pub(crate) fn call(a: &App, cmd: &str, args: Value) -> Result<Value, Value> {
    invoke(&a.window, cmd, args)
}

/// A command through the window's IPC, as the page calls it; blocks until it answers.
pub(crate) fn invoke(
    window: &tauri::WebviewWindow<tauri::test::MockRuntime>,
    cmd: &str,
    args: Value,
) -> Result<Value, Value> {
    let r = get_ipc_response(
        window,
        InvokeRequest {
            cmd: cmd.into(),
            callback: CallbackFn(0),
            error: CallbackFn(1),
            url: "tauri://localhost".parse().unwrap(),
            body: InvokeBody::Json(args),
            headers: Default::default(),
            invoke_key: INVOKE_KEY.to_string(),
        },
    );
    r.map(|b| b.deserialize::<Value>().unwrap_or(Value::Null))
}

/// The command names in ui/src/transport/commands.ts (one string literal per line).
fn ui_commands() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("../ui/src/transport/commands.ts")).expect("commands.ts");
    let start = text.find("COMMANDS").expect("a COMMANDS list");
    let list = &text[start..text[start..].find(']').map_or(text.len(), |e| start + e)];
    list.lines()
        .filter_map(|l| {
            let l = l.trim();
            let q = l.chars().next().filter(|c| *c == '"' || *c == '\'')?;
            Some(l[1..].split(q).next()?.to_owned())
        })
        .collect()
}

#[test]
fn every_command_the_ui_calls_is_registered_and_granted() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let declared: Vec<String> = std::fs::read_to_string(root().join("commands.txt"))
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let cap: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("capabilities/default.json")).unwrap()).unwrap();
    let granted: Vec<&str> = cap["permissions"].as_array().unwrap().iter().filter_map(|p| p.as_str()).collect();
    let ui = ui_commands();
    assert!(ui.len() >= 15, "commands.ts lists {} commands: {ui:?}", ui.len());
    let dir = tempfile::tempdir().unwrap();
    let a = app(dir.path());
    for cmd in &ui {
        assert!(declared.contains(cmd), "the UI calls {cmd}, which commands.txt does not declare");
        let perm = format!("allow-{}", cmd.replace('_', "-"));
        assert!(granted.contains(&perm.as_str()), "capabilities/default.json does not grant {perm}");
        // Registered: the call reaches the command (its own answer or argument error), never "not found".
        let r = call(&a, cmd, json!({}));
        let text = format!("{r:?}");
        assert!(!text.contains("not found"), "{cmd} is not registered: {text}");
    }
    // Nothing granted that the app does not have.
    for p in granted.iter().filter_map(|p| p.strip_prefix("allow-")) {
        assert!(declared.contains(&p.replace('-', "_")), "{p} is granted but is no command");
    }
}

pub(crate) fn settings_with(base: &Value, patch: Value) -> Value {
    let mut s = base.clone();
    for (k, v) in patch.as_object().unwrap() {
        s[k] = v.clone();
    }
    s
}

#[test]
fn invalid_settings_are_refused_naming_the_field() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let a = app(dir.path());
    let base = call(&a, "get_settings", json!({})).expect("get_settings");
    assert_eq!(base["devices"], "cpu");
    let model = default_model();
    let base = settings_with(&base, json!({"model_path": model.as_ref().map(|p| p.display().to_string())}));
    let not_gguf = dir.path().join("draft-notes.gguf");
    std::fs::write(&not_gguf, b"a text file where the draft model should be").unwrap();
    let ngram = json!({"kind": "ngram"});
    let mut cases = vec![
        (json!({"speculative": ngram, "draft_max": 0}), "draft_max"),
        (json!({"speculative": ngram, "draft_max": 257}), "draft_max"),
        (json!({"speculative": ngram, "draft_max": 4, "draft_min": 5}), "draft_min"),
        (json!({"speculative": {"kind": "draft", "model_path": ""}}), "speculative.model_path"),
        (json!({"speculative": {"kind": "draft", "model_path": not_gguf}}), "speculative.model_path"),
        (
            json!({"devices": "sim:200,sim:400", "speculative": {"kind": "draft", "model_path": not_gguf},
                   "draft_devices": [2]}),
            "draft_devices",
        ),
        (json!({"devices": "tpu:0"}), "devices"),
        (json!({"devices": ""}), "devices"),
        (json!({"devices": "sim:200,sim:400", "vram_reserve_mib": 300}), "vram_reserve_mib"),
        (json!({"layer_split": "ten"}), "layer_split"),
        (json!({"threads": 0}), "threads"),
        (json!({"parallel": 0}), "parallel"),
        (json!({"speculative": ngram, "parallel": 2}), "parallel"),
        (json!({"kv_resident": 0}), "kv_resident"),
        (json!({"engine": {"kind": "remote", "url": "gpu-box:8000", "api_key": "", "model": ""}}), "engine.url"),
        (json!({"engine": {"kind": "remote", "url": "http://gpu-box:8000", "api_key": "", "model": ""}}), "engine.url"),
        (
            json!({"engine": {"kind": "remote", "url": "https://gpu-box", "api_key": {"kind": "new", "key": " "},
                              "model": ""}}),
            "engine.api_key",
        ),
    ];
    if model.is_some() {
        // Needs the model's layer count (30).
        cases.push((json!({"devices": "sim:200,sim:400", "layer_split": "45"}), "layer_split"));
        cases.push((json!({"devices": "sim:200,sim:400", "layer_split": "10,20"}), "layer_split"));
        // A draft model whose vocabulary is not the model's (a synthetic SentencePiece one).
        let spm = strata::model::synthetic::SyntheticSpec {
            vocab: strata::model::synthetic::SyntheticVocab::Spm,
            ..Default::default()
        };
        let other = dir.path().join("other-vocab.gguf");
        std::fs::write(&other, spm.to_gguf()).unwrap();
        cases.push((json!({"speculative": {"kind": "draft", "model_path": other}}), "speculative.model_path"));
    } else {
        println!("SKIPPED: the default model is not in models/: the split-beyond-layers case needs it");
    }
    for (patch, field) in cases {
        let s = settings_with(&base, patch.clone());
        let e = call(&a, "save_settings", json!({ "settings": s })).expect_err(&format!("{patch} is refused"));
        assert_eq!(e["code"], "invalid", "{patch}: {e}");
        assert_eq!(e["field"], field, "{patch}: {e}");
        assert!(e["message"].as_str().is_some_and(|m| m.len() > 10), "{patch}: {e}");
        if patch["speculative"]["model_path"] == json!(not_gguf) && field == "speculative.model_path" {
            assert!(e["message"].as_str().unwrap().contains("not a GGUF file"), "{patch}: {e}");
        }
    }
    // Nothing refused was kept; a good value is.
    assert_eq!(call(&a, "get_settings", json!({})).unwrap()["devices"], "cpu");
    let good = settings_with(
        &base,
        json!({"devices": "sim:200,sim:400", "layer_split": if model.is_some() { "15" } else { "" }}),
    );
    let saved = call(&a, "save_settings", json!({ "settings": good })).expect("good settings are saved");
    assert_eq!(saved["devices"], "sim:200,sim:400");
    // Unknown fields and wrong types never reach validation.
    let e = call(&a, "save_settings", json!({ "settings": settings_with(&base, json!({"gpu": 1})) })).unwrap_err();
    assert!(format!("{e}").contains("gpu"), "{e}");
    // They were written to the store: a new app reads them back.
    drop(a);
    let a = app(dir.path());
    assert_eq!(call(&a, "get_settings", json!({})).unwrap()["devices"], "sim:200,sim:400");
    if let Some(m) = &model {
        let facts = call(&a, "inspect_model", json!({"path": m})).expect("inspect_model");
        assert_eq!((facts["architecture"].as_str(), facts["layers"].as_u64()), (Some("llama"), Some(30)));
        let plan = call(
            &a,
            "plan",
            json!({"settings": settings_with(&base, json!({"devices": "sim:200,sim:400", "layer_split": "15"}))}),
        )
        .expect("plan");
        assert_eq!(plan["plan"]["rows"].as_array().map(|r| r.len()), Some(2), "{plan}");
        assert_eq!(plan["plan"]["fits"], true);
        let tight = call(
            &a,
            "plan",
            json!({"settings": settings_with(&base, json!({"devices": "sim:20,sim:400", "layer_split": "15"}))}),
        )
        .expect("plan");
        assert_eq!(tight["plan"]["fits"], false);
        assert!(tight["plan"]["problem"].as_str().unwrap().contains("sim:20"), "{tight}");
        // With the model as its own draft on device 1: the draft's stage is planned there, counted in that
        // device's one headroom, and its flags are the ones the engine starts with.
        let spec = json!({"devices": "sim:200,sim:400", "layer_split": "15", "max_context": 2048,
                          "speculative": {"kind": "draft", "model_path": m}, "draft_devices": [1], "draft_max": 8});
        let drafted = call(&a, "plan", json!({"settings": settings_with(&base, spec)})).expect("plan with a draft");
        let p = &drafted["plan"];
        assert_eq!(p["draft"]["rows"][0]["index"], 1, "{drafted}");
        assert_eq!(p["devices"][1]["draft_bytes"], p["draft"]["rows"][0]["total_bytes"], "{drafted}");
        assert_eq!(p["rows"][1]["headroom_bytes"], p["devices"][1]["headroom_bytes"]);
        let flags: Vec<&str> = drafted["flags"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
        let at = flags.iter().position(|f| *f == "--draft-model").expect("--draft-model");
        assert_eq!(
            flags[at + 1..],
            [m.to_str().unwrap(), "--draft-devices", "1", "--draft-max", "8", "--draft-min", "1"]
        );
    }
    let bad = dir.path().join("not-a-model.gguf");
    std::fs::write(&bad, b"this is a text file, not GGUF").unwrap();
    let e = call(&a, "inspect_model", json!({"path": bad})).unwrap_err();
    assert_eq!(e["code"], "model");
    assert!(e["message"].as_str().unwrap().contains("GGUF"), "{e}");
}

#[test]
fn history_survives_a_crash_between_writes() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let a = app(dir.path());
    let c = call(&a, "conversation_create", json!({"title": "Notes"})).unwrap();
    let id = c["id"].as_str().unwrap().to_owned();
    call(&a, "conversation_rename", json!({"id": id, "title": "Trip notes"})).unwrap();
    let shown = call(&a, "conversation_get", json!({"id": id})).unwrap();
    // The app dies in the middle of its next write of that conversation.
    let h = strata_desktop::history::History::open(dir.path().join("conversations")).unwrap();
    let mut next: strata_desktop::types::Conversation = serde_json::from_value(shown.clone()).unwrap();
    next.title = "half written".into();
    h.save_with(&next, Some(strata_desktop::history::CrashPoint::MidWrite)).unwrap();
    drop(a);
    let a = app(dir.path());
    assert_eq!(call(&a, "conversation_get", json!({"id": id})).unwrap(), shown);
    let list = call(&a, "conversations_list", json!({})).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["title"], "Trip notes", "{list}");
    let e = call(&a, "conversation_get", json!({"id": "../settings"})).unwrap_err();
    assert_eq!(e["field"], "id");
}

#[test]
fn chat_preferences_are_kept_across_launches_and_checked() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let a = app(dir.path());
    let fresh = call(&a, "get_preferences", json!({})).expect("get_preferences");
    assert_eq!(fresh, json!({"reply_limit_tokens": 2048, "params_by_model": {}}));
    // Values as an older page sends them, without JSON mode: taken, with it off.
    let params = json!({"temperature": 0.7, "top_k": 20, "top_p": null, "min_p": 0.1, "repeat_penalty": 1.1,
                        "max_tokens": null, "seed": null});
    let json_mode = json!({"temperature": null, "top_k": null, "top_p": null, "min_p": null, "repeat_penalty": null,
                           "max_tokens": null, "seed": null, "json_mode": true});
    let sent =
        json!({"reply_limit_tokens": 300, "params_by_model": {"/models/a.gguf": params, "/models/b.gguf": json_mode}});
    let mut prefs = sent.clone();
    prefs["params_by_model"]["/models/a.gguf"]["json_mode"] = Value::Null;
    assert_eq!(call(&a, "save_preferences", json!({"preferences": sent})).expect("save_preferences"), prefs);
    for (bad, field) in [
        (json!({"reply_limit_tokens": 0, "params_by_model": {}}), "reply_limit_tokens"),
        (
            json!({"reply_limit_tokens": 300, "params_by_model": {"/m.gguf": {"temperature": 3, "top_k": null,
                   "top_p": null, "min_p": null, "repeat_penalty": null, "max_tokens": null, "seed": null}}}),
            "params_by_model.temperature",
        ),
    ] {
        let e = call(&a, "save_preferences", json!({"preferences": bad})).expect_err("refused");
        assert_eq!((e["code"].as_str(), e["field"].as_str()), (Some("invalid"), Some(field)), "{e}");
    }
    let e = call(
        &a,
        "save_preferences",
        json!({"preferences": {"reply_limit_tokens": 9, "params_by_model": {},
                                                                 "theme": "dark"}}),
    )
    .unwrap_err();
    assert!(format!("{e}").contains("theme"), "{e}");
    drop(a);
    let a = app(dir.path());
    assert_eq!(call(&a, "get_preferences", json!({})).unwrap(), prefs, "kept across launches");
}

/// What the stand-in engine saw of the chat request: its body, what the conversations' files held when it
/// arrived, and its Authorization header.
struct Seen {
    body: Value,
    stored: Vec<Value>,
    authorization: Option<String>,
}

/// A one-request stand-in for a remote engine: when the chat request arrives it records the request's
/// body, its Authorization header and what the conversation's file holds at that moment, then streams a
/// short reply.
fn stub_engine(conversations: PathBuf) -> (String, std::thread::JoinHandle<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut length = 0usize;
        let mut authorization = None;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            if line.to_ascii_lowercase().starts_with("authorization:") {
                authorization = Some(line["authorization:".len()..].trim().to_owned());
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let stored: Vec<Value> = std::fs::read_dir(&conversations)
            .unwrap()
            .filter_map(|e| serde_json::from_slice(&std::fs::read(e.ok()?.path()).ok()?).ok())
            .collect();
        let mut out = stream;
        let delta = |d: Value, finish: Value| {
            format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}))
        };
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n{}{}data: [DONE]\n\n",
            delta(json!({"content": "Lisbon, then Porto."}), Value::Null),
            delta(json!({}), json!("stop")),
        );
        out.write_all(reply.as_bytes()).unwrap();
        Seen { body: serde_json::from_slice(&body).unwrap(), stored, authorization }
    });
    (url, handle)
}

#[test]
fn a_chat_stores_the_user_message_and_title_before_the_reply_streams() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let a = app(dir.path());
    let (url, engine) = stub_engine(dir.path().join("conversations"));
    let base = call(&a, "get_settings", json!({})).unwrap();
    let remote = settings_with(&base, json!({"engine": {"kind": "remote", "url": url, "api_key": "", "model": "m"}}));
    call(&a, "save_settings", json!({ "settings": remote })).expect("a remote engine");
    // Untitled until the page names it (the page shows "New conversation"; this side makes no title).
    let c = call(&a, "conversation_create", json!({"title": null})).unwrap();
    assert_eq!(c["title"], "");
    let id = c["id"].as_str().unwrap().to_owned();
    let params = json!({"temperature": null, "top_k": 5, "top_p": null, "min_p": 0.05, "repeat_penalty": null,
                        "max_tokens": 2048, "seed": null, "json_mode": true});
    // The title is the one the page sent (ui/src/chat/conversation.ts), not one made from the message.
    let sent = call(
        &a,
        "chat_send",
        json!({"conversationId": id, "messages": [{"role": "user", "content": "Plan a trip to Lisbon and Porto"}],
               "title": "Trip: Lisbon, Porto", "params": params, "onChunk": "__CHANNEL__:7"}),
    );
    let Seen { body, stored, authorization } = engine.join().expect("the stub engine got the chat request");
    sent.expect("chat_send");
    assert_eq!(authorization, None, "no key is kept: none is sent");
    // When the request reached the engine, the conversation was already stored with its title, the user's
    // message and the reply to come.
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0]["title"], "Trip: Lisbon, Porto");
    let roles: Vec<(&str, bool)> = stored[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap(), m["complete"].as_bool().unwrap()))
        .collect();
    assert_eq!(roles, [("user", true), ("assistant", false)]);
    // Only the set sampling fields went to the engine.
    assert_eq!((&body["top_k"], &body["min_p"], &body["max_tokens"]), (&json!(5), &json!(0.05), &json!(2048)));
    for unset in ["temperature", "top_p", "repeat_penalty", "seed", "json_mode"] {
        assert!(body.get(unset).is_none(), "{unset} was sent: {body}");
    }
    // JSON mode on asks the engine for a JSON object.
    assert_eq!(body["response_format"], json!({"type": "json_object"}), "{body}");
    let list = call(&a, "conversations_list", json!({})).unwrap();
    assert_eq!((&list[0]["title"], &list[0]["messages"]), (&json!("Trip: Lisbon, Porto"), &json!(2)));
    let conv = call(&a, "conversation_get", json!({"id": id})).unwrap();
    assert_eq!(conv["messages"][1]["content"], "Lisbon, then Porto.");
    assert_eq!(conv["messages"][1]["complete"], true);
    // A value out of range is refused naming its field, before anything is stored or sent.
    let e = call(
        &a,
        "chat_send",
        json!({"conversationId": id, "messages": [{"role": "user", "content": "again"}],
               "params": {"temperature": null, "top_k": null, "top_p": null, "min_p": 1.5, "repeat_penalty": null,
                          "max_tokens": null, "seed": null}, "onChunk": "__CHANNEL__:8"}),
    )
    .unwrap_err();
    assert_eq!((e["code"].as_str(), e["field"].as_str()), (Some("invalid"), Some("min_p")), "{e}");
    assert_eq!(call(&a, "conversation_get", json!({"id": id})).unwrap(), conv);
}

#[cfg(unix)]
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn the_remote_key_is_kept_in_a_0600_file_and_never_sent_to_the_page() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const OLD_KEY: &str = "sk-old-key-from-settings-1234";
    const NEW_KEY: &str = "sk-new-key-typed-in-the-form-wxyz";
    let dir = tempfile::tempdir().unwrap();
    let settings_file = dir.path().join(strata_desktop::SETTINGS_FILE);
    let key_file = dir.path().join(strata_desktop::remote_key::KEY_FILE);
    // A settings.json of an older app, the key in it in plain text.
    let old = json!({"engine": {"model_path": null, "devices": "cpu", "layer_split": "", "kv": "f16",
        "kv_resident": null, "max_context": null, "vram_reserve_mib": 0, "cache_slots": 4, "cache_mib": 4096,
        "threads": null, "engine": {"kind": "remote", "url": "https://gpu-box:8000", "api_key": OLD_KEY, "model": "m"}}});
    std::fs::write(&settings_file, serde_json::to_vec_pretty(&old).unwrap()).unwrap();

    // Migrated on load: the key moved to its file, settings.json written again without it.
    let a = app(dir.path());
    let got = call(&a, "get_settings", json!({})).expect("get_settings");
    assert_eq!(got["engine"]["api_key"], json!({"kind": "kept", "hint": "1234"}), "{got}");
    assert_eq!(got["engine"]["allow_insecure"], false);
    assert!(!got.to_string().contains(OLD_KEY), "the page got the key: {got}");
    let on_disk = std::fs::read_to_string(&settings_file).unwrap();
    assert!(!on_disk.contains(OLD_KEY) && on_disk.contains("\"kept\""), "{on_disk}");
    assert_eq!(std::fs::read_to_string(&key_file).unwrap(), OLD_KEY);
    #[cfg(unix)]
    assert_eq!(mode(&key_file), 0o600);

    // Saved as the page read it (the key untouched): the key stays.
    let saved = call(&a, "save_settings", json!({ "settings": got })).expect("save, key kept");
    assert_eq!(saved["engine"]["api_key"], json!({"kind": "kept", "hint": "1234"}));
    assert_eq!(std::fs::read_to_string(&key_file).unwrap(), OLD_KEY);

    // A new key from the page replaces it; the answer and settings.json are masked.
    let (url, engine) = stub_engine(dir.path().join("conversations"));
    let mut with_new = got.clone();
    with_new["engine"] = json!({"kind": "remote", "url": url, "api_key": {"kind": "new", "key": NEW_KEY}, "model": "m",
                                "allow_insecure": false});
    let saved = call(&a, "save_settings", json!({ "settings": with_new })).expect("save, new key");
    assert_eq!(saved["engine"]["api_key"], json!({"kind": "kept", "hint": "wxyz"}));
    assert!(!saved.to_string().contains(NEW_KEY));
    assert_eq!(std::fs::read_to_string(&key_file).unwrap(), NEW_KEY);
    #[cfg(unix)]
    assert_eq!(mode(&key_file), 0o600);
    let on_disk = std::fs::read_to_string(&settings_file).unwrap();
    assert!(!on_disk.contains(NEW_KEY) && !on_disk.contains(OLD_KEY), "{on_disk}");
    assert!(!call(&a, "get_settings", json!({})).unwrap().to_string().contains(NEW_KEY));

    // The engine client sends the real key, read from the file.
    let c = call(&a, "conversation_create", json!({"title": null})).unwrap();
    let params = json!({"temperature": null, "top_k": null, "top_p": null, "min_p": null, "repeat_penalty": null,
                        "max_tokens": null, "seed": null});
    let sent = call(
        &a,
        "chat_send",
        json!({"conversationId": c["id"], "messages": [{"role": "user", "content": "hi"}], "params": params,
               "onChunk": "__CHANNEL__:9"}),
    );
    let seen = engine.join().expect("the stub engine got the chat request");
    sent.expect("chat_send");
    assert_eq!(seen.authorization.as_deref(), Some(format!("Bearer {NEW_KEY}").as_str()));

    // Kept across launches, still masked.
    drop(a);
    let a = app(dir.path());
    let got = call(&a, "get_settings", json!({})).unwrap();
    assert_eq!(got["engine"]["api_key"], json!({"kind": "kept", "hint": "wxyz"}));

    // Cleared explicitly: the file goes.
    let mut cleared = got.clone();
    cleared["engine"]["api_key"] = json!({"kind": "none"});
    let saved = call(&a, "save_settings", json!({ "settings": cleared })).expect("save, key cleared");
    assert_eq!(saved["engine"]["api_key"], json!({"kind": "none"}));
    assert!(!key_file.exists());
}

#[test]
fn an_http_endpoint_needs_loopback_or_allow_insecure() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let a = app(dir.path());
    let base = call(&a, "get_settings", json!({})).unwrap();
    let remote = |url: &str, allow_insecure: bool| {
        settings_with(
            &base,
            json!({"engine": {"kind": "remote", "url": url, "api_key": {"kind": "new", "key": "sk-0123456789abcdef"},
                              "model": "", "allow_insecure": allow_insecure}}),
        )
    };
    let e = call(&a, "save_settings", json!({ "settings": remote("http://gpu-box:8000/v1", false) })).unwrap_err();
    assert_eq!((e["code"].as_str(), e["field"].as_str()), (Some("invalid"), Some("engine.url")), "{e}");
    assert_eq!(e["message"], "an http:// endpoint sends the key in clear text: use https:// or tick Allow insecure");
    // Nothing was kept of the refused settings, the key neither.
    assert!(!dir.path().join(strata_desktop::remote_key::KEY_FILE).exists());
    assert_eq!(call(&a, "get_settings", json!({})).unwrap()["engine"], json!({"kind": "local"}));
    for (url, allow) in [
        ("http://gpu-box:8000/v1", true),
        ("http://127.0.0.1:8080/v1", false),
        ("http://localhost:8080", false),
        ("http://[::1]:8080", false),
        ("https://gpu-box", false),
    ] {
        let saved = call(&a, "save_settings", json!({ "settings": remote(url, allow) }))
            .unwrap_or_else(|e| panic!("{url} (allow_insecure {allow}): {e}"));
        assert_eq!(saved["engine"]["url"], url);
    }
}

/// A stand-in Hub that answers one search with no repository and says what Authorization it got.
fn stub_hub() -> (String, std::thread::JoinHandle<Option<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut authorization = None;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line.to_ascii_lowercase().starts_with("authorization:") {
                authorization = Some(line["authorization:".len()..].trim().to_owned());
            }
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        let mut out = stream;
        out.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n[]",
        )
        .unwrap();
        authorization
    });
    (url, handle)
}

#[test]
fn the_library_keeps_its_folder_and_a_hub_token_in_a_0600_file_never_sent_to_the_page() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const TOKEN: &str = "hf_secretTokenTyped0123";
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("my models");
    let token_file = dir.path().join(strata_desktop::remote_key::HF_TOKEN_FILE);
    std::env::remove_var("HF_TOKEN");
    std::env::set_var("HF_HOME", dir.path().join("no-hf-home"));
    let (hub, seen) = stub_hub();
    std::env::set_var("HF_ENDPOINT", &hub);
    let a = app(dir.path());
    let got = call(&a, "library_settings", json!({})).expect("library_settings");
    assert_eq!(got["settings"], json!({"models_dir": "", "hf_token": {"kind": "none"}}), "{got}");
    assert_eq!(got["token_from"], "none");

    // A folder named by a relative path, and a token of two words, are refused at their fields.
    let e =
        call(&a, "library_save_settings", json!({"settings": {"models_dir": "models", "hf_token": {"kind": "none"}}}))
            .unwrap_err();
    assert_eq!(e["field"], "models_dir", "{e}");
    let e = call(
        &a,
        "library_save_settings",
        json!({"settings": {"models_dir": "", "hf_token": {"kind": "new", "key": "hf two words"}}}),
    )
    .unwrap_err();
    assert_eq!(e["field"], "hf_token", "{e}");

    // Saved: the folder is made and used, the token is in its own 0600 file, the page reads it masked.
    let saved = call(
        &a,
        "library_save_settings",
        json!({"settings": {"models_dir": models.to_str().unwrap(), "hf_token": {"kind": "new", "key": TOKEN}}}),
    )
    .expect("save");
    assert_eq!(saved["settings"]["hf_token"], json!({"kind": "kept", "hint": "0123"}), "{saved}");
    assert_eq!(saved["token_from"], "settings");
    assert!(!saved.to_string().contains(TOKEN));
    assert!(models.is_dir());
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), TOKEN);
    #[cfg(unix)]
    assert_eq!(mode(&token_file), 0o600);
    let local = call(&a, "library_local", json!({})).expect("library_local");
    assert_eq!(local["models_dir"], json!(models.to_str().unwrap()));
    let on_disk = std::fs::read_to_string(dir.path().join(strata_desktop::SETTINGS_FILE)).unwrap();
    assert!(!on_disk.contains(TOKEN) && on_disk.contains("my models"), "{on_disk}");

    // The Hub gets the token.
    call(&a, "library_search", json!({"text": "qwen"})).expect("search");
    assert_eq!(seen.join().unwrap().as_deref(), Some(format!("Bearer {TOKEN}").as_str()));

    // Kept across launches; forgotten when the page says none.
    drop(a);
    let a = app(dir.path());
    let got = call(&a, "library_settings", json!({})).unwrap();
    assert_eq!(got["settings"]["models_dir"], json!(models.to_str().unwrap()));
    assert_eq!(got["settings"]["hf_token"], json!({"kind": "kept", "hint": "0123"}));
    let cleared =
        call(&a, "library_save_settings", json!({"settings": {"models_dir": "", "hf_token": {"kind": "none"}}}))
            .unwrap();
    assert_eq!(cleared["settings"]["hf_token"], json!({"kind": "none"}));
    assert!(!token_file.exists());
    std::env::remove_var("HF_ENDPOINT");
    std::env::remove_var("HF_HOME");
}
