//! The engine supervisor: runs `strata serve` as a child process on 127.0.0.1 with `--port 0` and a
//! per-launch API key, knows it is ready from its first stdout line and `/health`, restarts it with backoff
//! when it exits (a crash, exit 75 after a sticky GPU fault, a kill), and gives up with a clear error after
//! 3 failures in a minute. Every restart is an `engine_restarted` event on the chart. Stopping it (a new
//! model, new settings, quitting) kills the child and waits for it; the child also ends by itself when the
//! app dies (its stdin closes: `--exit-with-stdin`; on Linux also PR_SET_PDEATHSIG).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

use strata::plan::facts::ModelFacts;
use strata::sync::LockUnpoisoned;
use strata::telemetry::{EngineEvent, Telemetry};

use crate::engine::{Endpoint, EngineClient};
use crate::types::{EngineState, EngineStatus};

/// Failures within this window...
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// ...that make the supervisor give up.
pub const MAX_FAILURES: usize = 3;
/// The first restart waits this long; each further one twice as long.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// How long an engine may take to load its model and print its address.
pub const LOAD_TIMEOUT: Duration = Duration::from_secs(600);
/// Lines of the engine's stderr kept for error messages.
const STDERR_LINES: usize = 20;

/// What to run.
#[derive(Clone, Debug)]
pub struct EngineSpec {
    pub binary: PathBuf,
    pub model: PathBuf,
    /// Flags after `serve` (devices, split, KV, cache, ...).
    pub flags: Vec<String>,
    pub facts: Option<ModelFacts>,
}

struct Shared {
    status: watch::Sender<EngineStatus>,
    endpoint: watch::Sender<Option<Endpoint>>,
    /// Bumped by every start and stop: a run loop whose generation is old stops.
    generation: watch::Sender<u64>,
    telemetry: Arc<Telemetry>,
    stderr: Mutex<VecDeque<String>>,
    restarts: Mutex<u32>,
    /// What the engine runs: a restart after a crash starts it again with this (a switch in place changes
    /// it without a restart).
    spec: Mutex<Option<EngineSpec>>,
}

#[derive(Clone)]
pub struct Supervisor {
    shared: Arc<Shared>,
    rt: tokio::runtime::Handle,
}

impl Supervisor {
    pub fn new(telemetry: Arc<Telemetry>, rt: tokio::runtime::Handle) -> Supervisor {
        let status = EngineStatus { state: EngineState::Stopped, message: None, restarts: 0, pid: None, model: None };
        Supervisor {
            shared: Arc::new(Shared {
                status: watch::channel(status).0,
                endpoint: watch::channel(None).0,
                generation: watch::channel(0).0,
                telemetry,
                stderr: Mutex::new(VecDeque::new()),
                restarts: Mutex::new(0),
                spec: Mutex::new(None),
            }),
            rt,
        }
    }

    pub fn status(&self) -> EngineStatus {
        self.shared.status.borrow().clone()
    }

    pub fn subscribe_status(&self) -> watch::Receiver<EngineStatus> {
        self.shared.status.subscribe()
    }

    /// The engine's endpoint while it is ready.
    pub fn endpoint(&self) -> Option<Endpoint> {
        self.shared.endpoint.borrow().clone()
    }

    /// Waits until an engine is ready (Ok) or the supervisor has given up or stopped (Err with why).
    pub async fn ready(&self, timeout: Duration) -> Result<Endpoint, String> {
        self.ready_other_than(None, timeout).await
    }

    /// As `ready`, for an engine other than `gone` (each launch has its own key).
    pub async fn ready_other_than(&self, gone: Option<&Endpoint>, timeout: Duration) -> Result<Endpoint, String> {
        let mut rx = self.shared.endpoint.subscribe();
        let mut st = self.shared.status.subscribe();
        let wait = async {
            loop {
                if let Some(e) = rx.borrow_and_update().clone().filter(|e| Some(e) != gone) {
                    return Ok(e);
                }
                let s = st.borrow_and_update().clone();
                match s.state {
                    EngineState::Failed | EngineState::Stopped => {
                        return Err(s.message.unwrap_or_else(|| "no model is loaded".into()))
                    }
                    _ => {}
                }
                tokio::select! {
                    r = rx.changed() => if r.is_err() { return Err("the app is closing".into()) },
                    r = st.changed() => if r.is_err() { return Err("the app is closing".into()) },
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or_else(|_| Err("the engine did not become ready in time".into()))
    }

    /// Starts (or restarts) the engine with `spec`; returns at once (see `ready`).
    pub fn start(&self, spec: EngineSpec) {
        *self.shared.spec.lock_unpoisoned() = Some(spec.clone());
        let generation = self.bump();
        self.shared.endpoint.send_replace(None);
        self.set_status(EngineState::Starting, None, None, spec.facts.clone());
        let this = self.clone();
        self.rt.spawn(async move { this.run(spec, generation).await });
    }

    /// What the engine runs now, while one is started.
    pub fn spec(&self) -> Option<EngineSpec> {
        self.shared.spec.lock_unpoisoned().clone()
    }

    /// Which start or stop came last (a switch asked for before another start must not name its model).
    pub fn generation(&self) -> u64 {
        *self.shared.generation.borrow()
    }

    /// The running engine switched to `spec` in place (`POST /strata/model/load`): a later restart starts
    /// it with `spec`, and the status names its model. Nothing is restarted. Ignored (false) when the engine
    /// was started or stopped since `generation`: that engine runs something else.
    pub fn switched(&self, generation: u64, spec: EngineSpec) -> bool {
        let mut kept = self.shared.spec.lock_unpoisoned();
        if self.generation() != generation {
            return false;
        }
        let facts = spec.facts.clone();
        *kept = Some(spec);
        drop(kept);
        self.shared.status.send_modify(|s| s.model = facts);
        true
    }

    /// Stops the engine (no restart) and waits up to `timeout` for the child to be gone.
    /// A start that comes while it waits wins: the status is then that engine's, not Stopped.
    pub async fn stop(&self, timeout: Duration) {
        *self.shared.spec.lock_unpoisoned() = None;
        let generation = self.bump();
        self.shared.endpoint.send_replace(None);
        let mut st = self.shared.status.subscribe();
        let _ = tokio::time::timeout(timeout, st.wait_for(|s| s.pid.is_none())).await;
        if self.current(generation) {
            self.set_status(EngineState::Stopped, None, None, None);
        }
    }

    /// For the app's exit: stops the engine from a thread that is not the runtime's.
    pub fn stop_blocking(&self, timeout: Duration) {
        let this = self.clone();
        let _ = std::thread::spawn(move || this.rt.block_on(this.stop(timeout))).join();
    }

    fn bump(&self) -> u64 {
        let mut g = 0;
        self.shared.generation.send_modify(|v| {
            *v += 1;
            g = *v;
        });
        g
    }

    fn current(&self, generation: u64) -> bool {
        *self.shared.generation.borrow() == generation
    }

    fn set_status(&self, state: EngineState, message: Option<String>, pid: Option<u32>, model: Option<ModelFacts>) {
        let restarts = *self.shared.restarts.lock_unpoisoned();
        self.shared.status.send_modify(|s| {
            s.state = state;
            s.message = message;
            s.pid = pid;
            s.restarts = restarts;
            if model.is_some() || state == EngineState::Stopped {
                s.model = model;
            }
        });
    }

    /// The engine's last error line since it was last ready (empty when it printed none: a kill leaves
    /// only ordinary log lines, which say nothing about why it went).
    fn stderr_tail(&self) -> String {
        let lines = self.shared.stderr.lock_unpoisoned();
        lines.iter().rev().find(|l| l.contains("error")).cloned().unwrap_or_default()
    }

    /// One engine after another until stopped or given up.
    async fn run(self, spec: EngineSpec, generation: u64) {
        let mut failures: VecDeque<Instant> = VecDeque::new();
        let mut spec = spec;
        loop {
            let outcome = self.run_once(&spec, generation).await;
            if let Some(now) = self.spec() {
                // A switch in place since: the restart runs what the engine ran last.
                spec = now;
            }
            if !self.current(generation) {
                return;
            }
            self.shared.endpoint.send_replace(None);
            let reason = match outcome {
                Ok(status) => format!("the engine exited ({status})"),
                Err(e) => e,
            };
            let tail = self.stderr_tail();
            let reason = if tail.is_empty() { reason } else { format!("{reason}: {tail}") };
            tracing::warn!("{reason}");
            let now = Instant::now();
            failures.push_back(now);
            while failures.front().is_some_and(|t| now.duration_since(*t) > FAILURE_WINDOW) {
                failures.pop_front();
            }
            if failures.len() >= MAX_FAILURES {
                let msg = format!("the engine failed {} times in a minute; last: {reason}", failures.len());
                self.set_status(EngineState::Failed, Some(msg), None, None);
                return;
            }
            let restarts = {
                let mut r = self.shared.restarts.lock_unpoisoned();
                *r += 1;
                *r
            };
            self.shared.telemetry.emit(EngineEvent::EngineRestarted { reason: reason.clone(), restarts });
            self.set_status(EngineState::Restarting, Some(reason), None, None);
            let backoff = FIRST_BACKOFF * 2u32.pow(failures.len().saturating_sub(1) as u32);
            tokio::time::sleep(backoff).await;
            if !self.current(generation) {
                return;
            }
        }
    }

    /// Runs one engine until it exits (Ok: its exit status) or this generation is over (the child is then
    /// killed); Err when it could not start.
    async fn run_once(&self, spec: &EngineSpec, generation: u64) -> Result<String, String> {
        let key = per_launch_key();
        let key_file = tempfile::Builder::new().prefix("strata-key-").tempfile().map_err(|e| e.to_string())?;
        std::fs::write(key_file.path(), format!("{key}\n")).map_err(|e| e.to_string())?;
        let mut cmd = engine_command(spec, key_file.path());
        let mut child: Child =
            cmd.spawn().map_err(|e| format!("cannot start the engine {}: {e}", spec.binary.display()))?;
        let pid = child.id();
        tracing::info!("engine started: pid {pid:?}, {} {}", spec.binary.display(), spec.flags.join(" "));
        let state =
            if *self.shared.restarts.lock_unpoisoned() > 0 { EngineState::Restarting } else { EngineState::Starting };
        self.set_status(state, Some("loading the model".into()), pid, spec.facts.clone());
        // Its stdin stays open as long as this child handle lives.
        let _stdin = child.stdin.take();
        let stderr = child.stderr.take();
        let stderr_task = stderr.map(|stderr| self.keep_stderr(stderr));
        // An engine that exits has its last words read before they are quoted.
        let last_words = |task: Option<tokio::task::JoinHandle<()>>| async move {
            if let Some(t) = task {
                let _ = tokio::time::timeout(Duration::from_secs(1), t).await;
            }
        };
        let mut gen_rx = self.shared.generation.subscribe();
        let stdout = child.stdout.take().ok_or("the engine has no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::select! {
            l = tokio::time::timeout(LOAD_TIMEOUT, lines.next_line()) => l,
            st = child.wait() => {
                last_words(stderr_task).await;
                return Err(format!("the engine exited while loading ({})", describe(st)));
            }
            _ = superseded(&mut gen_rx, generation) => return self.end(child).await,
        };
        let addr = match first {
            Ok(Ok(Some(l))) => l.strip_prefix("strata serve: listening on ").map(str::to_owned),
            Ok(Ok(None)) => {
                // Its stdout closed: it is exiting (its exit status says how).
                let st = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                last_words(stderr_task).await;
                return Err(match st {
                    Ok(st) => format!("the engine exited while loading ({})", describe(st)),
                    Err(_) => "the engine closed its output while loading".to_owned(),
                });
            }
            Ok(Err(_)) => None,
            Err(_) => return Err(format!("the engine did not start within {} s", LOAD_TIMEOUT.as_secs())),
        };
        let Some(url) = addr else {
            let _ = child.start_kill();
            return Err("the engine's first line is not its address".into());
        };
        // Drain the rest of stdout so the child never blocks on it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let client = EngineClient::new(Endpoint { url: url.clone(), api_key: Some(key), model: String::new() });
        tokio::select! {
            ok = wait_healthy(&client) => if !ok {
                let _ = child.start_kill();
                return Err("the engine never reported healthy (/health)".into());
            },
            st = child.wait() => {
                last_words(stderr_task).await;
                return Err(format!("the engine exited at start ({})", describe(st)));
            }
            _ = superseded(&mut gen_rx, generation) => return self.end(child).await,
        }
        self.shared.stderr.lock_unpoisoned().clear();
        self.shared.endpoint.send_replace(Some(client.endpoint.clone()));
        self.set_status(EngineState::Ready, None, pid, spec.facts.clone());
        tracing::info!("engine ready at {url}");
        let follower = tokio::spawn(follow(client, self.shared.telemetry.clone()));
        let result = tokio::select! {
            st = child.wait() => {
                last_words(stderr_task).await;
                Ok(describe(st))
            }
            _ = superseded(&mut gen_rx, generation) => self.end(child).await,
        };
        follower.abort();
        self.clear_pid(pid);
        result
    }

    /// Reads the engine's stderr into the log and the last `STDERR_LINES` lines kept for error messages.
    fn keep_stderr(&self, stderr: tokio::process::ChildStderr) -> tokio::task::JoinHandle<()> {
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                tracing::info!(target: "engine", "{l}");
                let mut q = shared.stderr.lock_unpoisoned();
                if q.len() >= STDERR_LINES {
                    q.pop_front();
                }
                q.push_back(l);
            }
        })
    }

    /// Ends a child this generation no longer wants: SIGTERM, then a kill after 3 s.
    async fn end(&self, mut child: Child) -> Result<String, String> {
        let ended = child.id();
        #[cfg(unix)]
        if let Some(pid) = ended {
            // SAFETY: signalling our own child by its pid.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
        let st = match tokio::time::timeout(Duration::from_secs(3), child.wait()).await {
            Ok(st) => describe(st),
            Err(_) => {
                let _ = child.kill().await;
                describe(child.wait().await)
            }
        };
        self.clear_pid(ended);
        Ok(st)
    }

    /// The status no longer names `pid` as running; only that pid: a newer engine may already be running
    /// and reported.
    fn clear_pid(&self, pid: Option<u32>) {
        self.shared.status.send_if_modified(|s| {
            let mine = s.pid.is_some() && s.pid == pid;
            if mine {
                s.pid = None;
            }
            mine
        });
    }
}

/// `strata serve` for `spec` on a free loopback port, with the per-launch key in `key_path`, ending with the
/// app: it exits when its stdin closes and, on Linux, when the app dies.
fn engine_command(spec: &EngineSpec, key_path: &std::path::Path) -> Command {
    let mut cmd = Command::new(&spec.binary);
    cmd.arg("serve")
        // The app switches models in place (POST /strata/model/load) with any file the person opens.
        .args(["--host", "127.0.0.1", "--port", "0", "--exit-with-stdin", "--load-any-path", "--api-key-file"])
        .arg(key_path)
        .arg("-m")
        .arg(&spec.model)
        .args(&spec.flags)
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    cmd
}

/// Polls the engine's /health for up to 30 s; true once it answers healthy.
async fn wait_healthy(client: &EngineClient) -> bool {
    for _ in 0..300 {
        if client.healthy().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Returns once a newer start or a stop has superseded `generation`.
async fn superseded(rx: &mut watch::Receiver<u64>, generation: u64) {
    let _ = rx.wait_for(|g| *g != generation).await;
}

fn describe(st: std::io::Result<std::process::ExitStatus>) -> String {
    match st {
        Ok(s) => match s.code() {
            Some(75) => "exit 75: a device fault made it unhealthy".into(),
            Some(c) => format!("exit {c}"),
            None => {
                #[cfg(unix)]
                {
                    use std::os::unix::process::ExitStatusExt;
                    format!("killed by signal {}", s.signal().unwrap_or(0))
                }
                #[cfg(not(unix))]
                "killed".to_owned()
            }
        },
        Err(e) => e.to_string(),
    }
}

/// 32 random bytes, hex.
fn per_launch_key() -> String {
    (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect()
}

/// Copies the engine's telemetry into the app's ring (stamped on the app's clock, which survives engine
/// restarts): its backlog, then every sample and event as it comes.
async fn follow(client: EngineClient, telemetry: Arc<Telemetry>) {
    if let Ok(Some(v)) = client.get_json::<strata::server::status::TelemetryView>("/strata/telemetry").await {
        for e in v.events {
            ingest_event(&telemetry, &e.event, e.fields);
        }
    }
    loop {
        let t = telemetry.clone();
        let r = client
            .follow_events(move |ev| {
                match ev.event.as_str() {
                    "sample" => {
                        if let Ok(s) = serde_json::from_str::<strata::telemetry::DeviceSample>(&ev.data) {
                            t.sample(s.device, s.free_bytes, s.total_bytes);
                        }
                    }
                    "engine" => {
                        if let Ok(e) = serde_json::from_str::<strata::telemetry::Event>(&ev.data) {
                            ingest_event(&t, &e.event, e.fields);
                        }
                    }
                    _ => {}
                }
                true
            })
            .await;
        if let Err(e) = r {
            tracing::info!("telemetry stream ended: {e}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn ingest_event(t: &Telemetry, kind: &str, mut fields: serde_json::Map<String, serde_json::Value>) {
    fields.insert("event".into(), kind.into());
    match serde_json::from_value::<EngineEvent>(serde_json::Value::Object(fields)) {
        Ok(e) => t.emit(e),
        Err(err) => tracing::debug!("unknown engine event {kind}: {err}"),
    }
}
