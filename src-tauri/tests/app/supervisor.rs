//! The engine supervisor with stand-in engines (shell scripts): an engine that cannot start is retried
//! with backoff and, after 3 failures within a minute, the supervisor gives up with the engine's own error
//! line; every retry is an `engine_restarted` event. (Restarting a real engine that was killed, and the
//! reply retried on it, is checked in the app's real window: scripts/e2e-desktop.)

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata::telemetry::Telemetry;
use strata_desktop::supervisor::{EngineSpec, Supervisor, MAX_FAILURES};
use strata_desktop::types::EngineState;

fn fake_engine(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
    let p = dir.join("fake-strata");
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn an_engine_that_keeps_failing_is_given_up_after_three_failures_with_its_error() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bin =
        fake_engine(dir.path(), "echo 'strata serve: error: cannot load model /m.gguf: not a GGUF file' >&2\nexit 1");
    let telemetry = Arc::new(Telemetry::new());
    let sup = Supervisor::new(telemetry.clone(), rt.handle().clone());
    let started = Instant::now();
    sup.start(EngineSpec { binary: bin, model: "/m.gguf".into(), flags: vec![], facts: None });
    let mut status = sup.subscribe_status();
    let failed = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), status.wait_for(|s| s.state == EngineState::Failed))
            .await
            .map(|r| r.map(|s| s.clone()))
    });
    let s = failed.expect("the supervisor gives up within 20 s").expect("status");
    let msg = s.message.unwrap_or_default();
    assert!(msg.contains("failed 3 times in a minute"), "{msg}");
    assert!(msg.contains("not a GGUF file"), "the engine's error line is in the message: {msg}");
    // Two restarts with backoff (0.5 s, then 1 s) between the three attempts.
    assert!(started.elapsed() >= Duration::from_millis(1400), "{:?}", started.elapsed());
    assert_eq!(s.restarts as usize, MAX_FAILURES - 1);
    let (_, events) = telemetry.since(-1.0);
    let restarts: Vec<_> = events.iter().filter(|e| e.event == "engine_restarted").collect();
    assert_eq!(restarts.len(), MAX_FAILURES - 1, "{events:?}");
    assert!(restarts[0].fields["reason"].as_str().unwrap().contains("exited while loading"), "{restarts:?}");
    assert_eq!(sup.endpoint(), None);
    // Waiting for a ready engine now answers at once, with why.
    let why = rt.block_on(sup.ready(Duration::from_secs(5))).unwrap_err();
    assert!(why.contains("failed 3 times"), "{why}");
}

#[test]
fn an_engine_that_prints_no_address_is_an_error_not_a_hang() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bin = fake_engine(dir.path(), "echo hello\nsleep 30");
    let sup = Supervisor::new(Arc::new(Telemetry::new()), rt.handle().clone());
    sup.start(EngineSpec { binary: bin, model: "/m.gguf".into(), flags: vec![], facts: None });
    let mut status = sup.subscribe_status();
    let s = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.state == EngineState::Restarting)).await
        })
        .expect("a restart within 10 s")
        .expect("status")
        .clone();
    assert!(s.message.unwrap_or_default().contains("first line is not its address"));
    // Stopping ends it for good: no engine, no restart.
    rt.block_on(sup.stop(Duration::from_secs(5)));
    assert_eq!(sup.status().state, EngineState::Stopped);
    assert_eq!(sup.status().pid, None);
}

#[test]
fn a_start_while_a_stop_waits_is_not_reported_stopped() {
    // What Settings does when switching to a remote engine and straight back: stop (in the background, up
    // to its timeout), then start. Neither the stop nor the old engine's end may overwrite the new engine's
    // status. The stand-in ignores SIGTERM, so the old one takes 3 s to go (then it is killed).
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bin = fake_engine(dir.path(), "trap '' TERM\necho 'strata serve: listening on http://127.0.0.1:9'\nsleep 30");
    let sup = Supervisor::new(Arc::new(Telemetry::new()), rt.handle().clone());
    let spec = || EngineSpec { binary: bin.clone(), model: "/m.gguf".into(), flags: vec![], facts: None };
    sup.start(spec());
    std::thread::sleep(Duration::from_millis(300));
    let old = sup.status().pid;
    assert!(old.is_some(), "{:?}", sup.status());
    let stopping = {
        let sup = sup.clone();
        rt.spawn(async move { sup.stop(Duration::from_millis(1500)).await })
    };
    std::thread::sleep(Duration::from_millis(200));
    sup.start(spec());
    rt.block_on(stopping).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let s = sup.status();
    assert_ne!(s.state, EngineState::Stopped, "the stop that timed out said Stopped over the new engine: {s:?}");
    assert!(s.pid.is_some() && s.pid != old, "the new engine runs: {s:?}");
    // The old engine is gone by now (killed after 3 s): its end leaves the new engine's pid.
    std::thread::sleep(Duration::from_millis(3000));
    assert_eq!(sup.status().pid, s.pid, "{:?}", sup.status());
    rt.block_on(sup.stop(Duration::from_secs(5)));
    assert_eq!(sup.status().state, EngineState::Stopped);
}
