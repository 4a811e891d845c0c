//! The engine thread of `strata serve`: one session (one live sequence and the conversation cache) fed by a
//! FIFO queue of jobs. A job's replies go back over its own channel; when the client goes away the channel
//! closes, and the job ends at its next token (or is dropped before it starts, if still queued). After a
//! job the thread publishes what the HTTP side shows without waiting for the engine: the cache's contents.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::Sender;

use crate::engine::session::{Served, Session, SessionConfig};
use crate::engine::spec::SpecSetup;
use crate::engine::{EngineError, GenerateParams, Generation, Observer, StopReason};
use crate::model::{Model, ModelError};
use crate::sync::LockUnpoisoned;
use crate::telemetry::{EngineEvent, Summary};
use crate::threadpool::ThreadPool;
use crate::tokenizer::reasoning::reasoning_token_count;
use crate::tokenizer::turns::tokens_of_text;
use crate::tokenizer::Tokenizer;

use super::error::ApiError;
use super::openai::Checked;
use super::state::{CacheView, ParkedView, Shared};

/// Messages a job's reply channel holds; a client that reads none of them for [`STALL_LIMIT`] is treated
/// as gone.
pub const REPLY_BACKLOG: usize = 256;
pub const STALL_LIMIT: Duration = Duration::from_secs(30);

/// One request for the engine.
pub struct Job {
    pub prompt: Vec<u32>,
    /// Tokens of the prompt that are earlier replies as they were generated (not retokenized).
    pub kept_reply_tokens: usize,
    pub checked: Checked,
    /// Top log-probabilities per token (with `checked.params.logprobs`).
    pub top_logprobs: usize,
    pub tx: Sender<Msg>,
    pub queued_at: Instant,
    /// How long it may take from `queued_at` to its last token (`--request-timeout-s`), or no limit.
    pub time_limit: Option<Duration>,
    pub endpoint: &'static str,
    pub ticket: Arc<Ticket>,
    /// A chat reply: Some(whether the prompt opened a `<think>` block), for the usage's reasoning tokens;
    /// None for a plain completion (no reasoning counted).
    pub opens_think: Option<bool>,
}

/// Who takes a queued job first: the engine (it starts) or its client (it left). Whoever wins takes the job
/// off the queue's count, so a client that leaves frees its place at once.
pub struct Ticket {
    state: AtomicU8,
    shared: Arc<Shared>,
}

const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const ABANDONED: u8 = 2;

impl Ticket {
    pub fn new(shared: Arc<Shared>) -> Arc<Ticket> {
        Arc::new(Ticket { state: AtomicU8::new(QUEUED), shared })
    }

    /// The engine takes the job; false when its client already left.
    fn start(&self) -> bool {
        let won = self.state.compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire).is_ok();
        if won {
            self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        won
    }

    /// The client is gone: a job that has not started leaves the queue's count now.
    pub fn abandon(&self) {
        if self.state.compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Held by a request's handler (or its stream): dropping it abandons the job if it has not started.
pub struct TicketGuard(pub Arc<Ticket>);

impl Drop for TicketGuard {
    fn drop(&mut self) {
        self.0.abandon();
    }
}

/// Sends `msg` to a client, waiting while its channel is full (it reads slowly) up to [`STALL_LIMIT`].
/// False when the client is gone or stalled: the job ends.
fn send(tx: &Sender<Msg>, msg: Msg) -> bool {
    let mut msg = msg;
    let t0 = Instant::now();
    loop {
        match tx.try_send(msg) {
            Ok(()) => return true,
            Err(TrySendError::Closed(_)) => return false,
            Err(TrySendError::Full(m)) => {
                if t0.elapsed() > STALL_LIMIT {
                    tracing::info!("a client read nothing for {} s: its request ends", STALL_LIMIT.as_secs());
                    return false;
                }
                msg = m;
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// A token with its log-probability and the most likely alternatives (when asked for).
#[derive(Clone, Debug)]
pub struct TokenInfo {
    pub id: u32,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(Vec<u8>, f32)>,
}

/// What the engine sends back for a job, in order: for each choice its text pieces then its end, then the
/// figures of the whole request; or an error.
#[derive(Debug)]
pub enum Msg {
    Text { choice: usize, text: String, tokens: Vec<TokenInfo> },
    ChoiceDone { choice: usize, finish_reason: &'static str, text: String, tokens: Vec<TokenInfo> },
    Done(Box<Summary>),
    Error(ApiError),
}

/// OpenAI's finish_reason for an engine stop.
pub fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::Eog | StopReason::Stop => "stop",
        // A cancelled choice is never sent.
        StopReason::Length | StopReason::Context | StopReason::Cancelled => "length",
    }
}

/// What the engine thread owns.
pub struct EngineParts {
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub threads: usize,
    pub session: SessionConfig,
    pub spec: Option<SpecSetup>,
}

/// Starts the engine thread; its session is made before this returns (an error then is the caller's).
pub fn spawn(parts: EngineParts, shared: Arc<Shared>, jobs: Receiver<Job>) -> anyhow::Result<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<(), String>>(1);
    std::thread::Builder::new().name("strata-engine".into()).spawn(move || run(parts, shared, jobs, ready_tx))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => anyhow::bail!("cannot start the engine: {e}"),
        Err(_) => anyhow::bail!("cannot start the engine: its thread ended"),
    }
}

fn run(parts: EngineParts, shared: Arc<Shared>, jobs: Receiver<Job>, ready: SyncSender<Result<(), String>>) {
    let pool = ThreadPool::new(parts.threads);
    let drafter = parts
        .spec
        .as_ref()
        .map(|s| s.drafter(parts.session.kv_type, parts.session.max_context, parts.model.cfg.n_vocab))
        .transpose();
    let session = drafter.and_then(|d| {
        let s = Session::new(&parts.model, &parts.tokenizer, &pool, &parts.session)?;
        Ok(match d {
            Some(d) => s.with_drafter(d),
            None => s,
        })
    });
    let mut session = match session {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return;
        }
    };
    session.telemetry = shared.telemetry.clone();
    publish_cache(&session, &shared);
    let _ = ready.send(Ok(()));
    drop(ready);
    let mut serial = 0u64;
    while let Ok(job) = jobs.recv() {
        if !job.ticket.start() || job.tx.is_closed() {
            shared.metrics.dropped.inc();
            tracing::info!("a queued request was dropped: its client went away before it started");
            continue;
        }
        if let Some(why) = shared.unhealthy() {
            send(&job.tx, Msg::Error(ApiError::unhealthy(why)));
            continue;
        }
        if shared.shutting_down.load(Ordering::Acquire) {
            send(&job.tx, Msg::Error(ApiError::shutting_down()));
            continue;
        }
        if let Some(limit) = job.time_limit.filter(|&l| job.queued_at.elapsed() >= l) {
            tracing::info!("a queued request waited past --request-timeout-s {}: it ends", limit.as_secs());
            shared.metrics.reject("request_timeout");
            send(&job.tx, Msg::Error(ApiError::request_timeout(limit.as_secs())));
            continue;
        }
        shared.busy.store(true, Ordering::Release);
        serial += 1;
        let tx = job.tx.clone();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            serve_job(&mut session, &parts.tokenizer, &shared, job, serial)
        }));
        shared.busy.store(false, Ordering::Release);
        if run.is_err() {
            // The session may be half-updated: serve nothing more, and let the supervisor restart us.
            let why = "unhealthy: the engine failed (a bug: see the log above); the server exits with status 75 so that its supervisor restarts it";
            shared.set_unhealthy(why.to_owned());
            send(&tx, Msg::Error(ApiError::unhealthy(why)));
            break;
        }
        publish_cache(&session, &shared);
    }
}

/// Sends the text of one choice as it comes, with its tokens when log-probabilities are asked for, and
/// stops the generation when the client is gone, the request's time is up or the server must stop now.
struct JobObserver<'a> {
    tx: &'a Sender<Msg>,
    /// The client went away or stopped reading.
    gone: bool,
    /// When the request's time is up (`--request-timeout-s`), and whether it was.
    deadline: Option<Instant>,
    timed_out: bool,
    shared: &'a Shared,
    tokenizer: &'a Tokenizer,
    choice: usize,
    logprobs: bool,
    sent_tokens: usize,
}

fn token_infos(tokenizer: &Tokenizer, g: &Generation, from: usize) -> Vec<TokenInfo> {
    (from..g.tokens.len())
        .filter(|&i| !tokenizer.is_eog(g.tokens[i]))
        .map(|i| TokenInfo {
            id: g.tokens[i],
            bytes: tokenizer.token_to_piece(g.tokens[i]),
            logprob: g.token_logprobs.get(i).copied().unwrap_or(f32::NAN),
            top: g
                .top_logprobs
                .get(i)
                .map(|top| top.iter().map(|&(id, lp)| (tokenizer.token_to_piece(id), lp)).collect())
                .unwrap_or_default(),
        })
        .collect()
}

impl Observer for JobObserver<'_> {
    fn on_text(&mut self, text: &str, so_far: &Generation) {
        let tokens = if self.logprobs { token_infos(self.tokenizer, so_far, self.sent_tokens) } else { Vec::new() };
        self.sent_tokens = so_far.tokens.len();
        if !send(self.tx, Msg::Text { choice: self.choice, text: text.to_owned(), tokens }) {
            self.gone = true;
        }
    }

    fn cancelled(&mut self) -> bool {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.timed_out = true;
        }
        self.gone || self.timed_out || self.tx.is_closed() || self.shared.cancel_in_flight.load(Ordering::Acquire)
    }
}

fn engine_error(e: &EngineError) -> ApiError {
    match e {
        EngineError::Model(ModelError::Device(d)) if d.is_fatal() => ApiError::unhealthy(format!(
            "unhealthy: {d}; the server exits with status 75 so that its supervisor restarts it"
        )),
        EngineError::Model(ModelError::Device(d)) => ApiError::out_of_memory(format!("the request failed: {d}")),
        EngineError::Model(ModelError::ContextOverflow { needed, max }) => ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid("messages", format!("the prompt needs {needed} positions but the context holds {max}"))
        },
        other => ApiError::internal(format!("the request failed: {other}")),
    }
}

/// What became of one choice of a job.
enum ChoiceEnd {
    /// Generated: the job goes on to its next choice.
    Served(Box<Served>),
    /// The client went away (or a signal stopped it): no more choices.
    Stopped,
    /// The job has had its answer (an error was sent): nothing more to do.
    Answered,
}

/// Runs one job: each of its choices in turn on the session, their text out on the job's channel, then the
/// request's figures (or the error, or nothing for a client that went away).
fn serve_job(session: &mut Session, tokenizer: &Tokenizer, shared: &Shared, job: Job, serial: u64) {
    let queue_ms = job.queued_at.elapsed().as_secs_f64() * 1e3;
    let mut params = job.checked.params.clone();
    params.top_logprobs = job.top_logprobs;
    let logprobs = params.logprobs || params.top_logprobs > 0;
    let base_seed = params.sampler.seed;
    let mut summary: Option<Summary> = None;
    for choice in 0..job.checked.choices {
        params.sampler.seed = base_seed.wrapping_add(choice as u64);
        let served = match serve_choice(session, tokenizer, shared, &job, &params, choice, logprobs) {
            ChoiceEnd::Served(s) => s,
            ChoiceEnd::Stopped => break,
            ChoiceEnd::Answered => return,
        };
        let g = &served.generation;
        let tokens = choice_tokens(tokenizer, g, logprobs);
        if let Some(t) = tokens_of_text(tokenizer, &g.tokens, &g.text) {
            shared.replies.lock_unpoisoned().remember(&g.text, t);
        }
        send(
            &job.tx,
            Msg::ChoiceDone { choice, finish_reason: finish_reason(g.stop_reason), text: g.text.clone(), tokens },
        );
        let s = summary.get_or_insert_with(|| first_summary(&job, &served, serial, queue_ms));
        s.completion_tokens += g.tokens.len();
        if let Some(inside) = job.opens_think {
            let pieces: Vec<Vec<u8>> =
                g.tokens.iter().filter(|&&t| !tokenizer.is_eog(t)).map(|&t| tokenizer.token_to_piece(t)).collect();
            s.reasoning_tokens += reasoning_token_count(pieces.iter().map(|p| p.as_slice()), inside);
        }
        s.gen_ms += g.gen_ms;
        s.drafts_proposed += g.drafts_proposed;
        s.drafts_accepted += g.drafts_accepted;
    }
    match summary {
        Some(s) => finish_job(shared, &job, s),
        None => end_cancelled(shared, &job),
    }
}

/// Generates choice `choice` of `job` (the first reads the prompt; the others go back to its end), and
/// answers the job itself when that ends it: a time limit passed, an engine error, a shutdown.
fn serve_choice(
    session: &mut Session,
    tokenizer: &Tokenizer,
    shared: &Shared,
    job: &Job,
    params: &GenerateParams,
    choice: usize,
    logprobs: bool,
) -> ChoiceEnd {
    let deadline = job.time_limit.map(|l| job.queued_at + l);
    let mut obs = JobObserver {
        tx: &job.tx,
        gone: false,
        deadline,
        timed_out: false,
        shared,
        tokenizer,
        choice,
        logprobs,
        sent_tokens: 0,
    };
    let served = if choice == 0 {
        session.serve(&job.prompt, params, &mut obs)
    } else {
        session.serve_again(&job.prompt, params, &mut obs)
    };
    if obs.timed_out && !job.tx.is_closed() {
        let limit = job.time_limit.unwrap_or_default().as_secs();
        tracing::info!("a request ran past --request-timeout-s {limit}: it ends");
        shared.metrics.reject("request_timeout");
        send(&job.tx, Msg::Error(ApiError::request_timeout(limit)));
        return ChoiceEnd::Answered;
    }
    let served = match served {
        Ok(s) => s,
        Err(EngineError::Cancelled) => return ChoiceEnd::Stopped,
        Err(e) => {
            fail_job(shared, job, &e);
            return ChoiceEnd::Answered;
        }
    };
    if served.generation.stop_reason == StopReason::Cancelled {
        if shared.cancel_in_flight.load(Ordering::Acquire) && !job.tx.is_closed() {
            // Stopped by the second signal: say so rather than return fewer choices.
            send(&job.tx, Msg::Error(ApiError::shutting_down()));
            return ChoiceEnd::Answered;
        }
        return ChoiceEnd::Stopped;
    }
    ChoiceEnd::Served(Box::new(served))
}

/// Answers `job` with the error `e` became; a fatal device error marks the engine unhealthy.
fn fail_job(shared: &Shared, job: &Job, e: &EngineError) {
    let err = engine_error(e);
    tracing::warn!("request failed: {e}");
    shared.metrics.failed.inc();
    if let EngineError::Model(ModelError::Device(d)) = e {
        if d.is_fatal() {
            shared.set_unhealthy(err.message.clone());
        }
    }
    send(&job.tx, Msg::Error(err));
}

/// The tokens of a choice with their log-probabilities, when asked for; cut where a stop string cut the
/// text.
fn choice_tokens(tokenizer: &Tokenizer, g: &Generation, logprobs: bool) -> Vec<TokenInfo> {
    let mut tokens = if logprobs { token_infos(tokenizer, g, 0) } else { Vec::new() };
    if g.stop_reason == StopReason::Stop {
        let mut start = 0;
        tokens.retain(|t| {
            let keep = start < g.text.len();
            start += t.bytes.len();
            keep
        });
    }
    tokens
}

/// The request's figures as of its first choice (the prompt's side; later choices add their tokens).
fn first_summary(job: &Job, served: &Served, serial: u64, queue_ms: f64) -> Summary {
    let g = &served.generation;
    Summary {
        job: serial,
        prompt_tokens: job.prompt.len(),
        completion_tokens: 0,
        reasoning_tokens: 0,
        reused: served.reused,
        read: served.read,
        kept_reply_tokens: job.kept_reply_tokens,
        prompt_ms: g.prompt_ms,
        gen_ms: 0.0,
        prompt_tok_s: served.read as f64 / (g.prompt_ms / 1e3).max(1e-9),
        gen_tok_s: 0.0,
        queue_ms,
        drafts_accepted: 0,
        drafts_proposed: 0,
        restored: served.restored.map(|(k, _)| k),
        restored_tokens: served.restored.map(|(_, n)| n),
        fallback: served.fallback.clone(),
    }
}

/// Ends a job that produced at least one choice: its figures to the metrics, telemetry and the client
/// (without the reuse figures unless `--reuse-figures` shows them).
fn finish_job(shared: &Shared, job: &Job, mut s: Summary) {
    s.gen_tok_s = s.completion_tokens as f64 / (s.gen_ms / 1e3).max(1e-9);
    if s.kept_reply_tokens > 0 {
        tracing::info!("{} prompt tokens were earlier replies, kept as generated", s.kept_reply_tokens);
    }
    if !shared.reuse_figures {
        s = s.without_reuse();
    }
    shared.metrics.record(job.endpoint, &s);
    shared.telemetry.emit(EngineEvent::RequestDone(s.clone()));
    send(&job.tx, Msg::Done(Box::new(s)));
}

/// Ends a job whose client went away before its first choice was done (or a shutdown that stopped it).
fn end_cancelled(shared: &Shared, job: &Job) {
    if shared.cancel_in_flight.load(Ordering::Acquire) {
        send(&job.tx, Msg::Error(ApiError::shutting_down()));
    }
    shared.metrics.cancelled.inc();
    tracing::info!("request cancelled: its client went away");
}

/// Publishes the cache's contents for `/strata/cache`.
fn publish_cache(session: &Session, shared: &Shared) {
    let now_ms = shared.telemetry.now_ms();
    let c = &session.cache;
    let mut view = CacheView {
        slots: c.slots,
        slots_used: 0,
        budget_bytes: c.budget_bytes,
        bytes: c.bytes(),
        evictions: c.evictions(),
        live_tokens: session.live_tokens().len(),
        parked: c
            .snapshots()
            .map(|s| ParkedView {
                tokens: s.tokens.len(),
                bytes: s.bytes(),
                last_use_ms: now_ms - s.parked_at.elapsed().as_secs_f64() * 1e3,
                checkpoints: s.checkpoints.clone(),
            })
            .collect(),
    };
    view.slots_used = view.parked.len();
    *shared.cache.lock_unpoisoned() = view;
}
