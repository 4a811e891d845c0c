//! The engine thread of `strata serve`: one session (its live sequences and the conversation cache) fed by a
//! queue of jobs, round-robin between clients (`fair`). Up to `--parallel` jobs generate at once, one per slot, their streams advanced
//! together by one batched pass per step (continuous batching: a job starts as soon as a slot is free and
//! leaves when it is done); with speculative decoding, one job at a time. A job's replies go back over its
//! own channel; when the client goes away the channel closes, and the job ends at its next token (or is
//! dropped before it starts, if still queued). After a job the thread publishes what the HTTP side shows
//! without waiting for the engine: the cache's contents.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::Sender;

use crate::cache::RestoreKind;
use crate::engine::batch::{Progress, Stream};
use crate::engine::session::{Fallback, Served, Session, SessionConfig};
use crate::engine::spec::SpecSetup;
use crate::engine::{EngineError, GenerateParams, Generation, Observer, StopReason};
use crate::model::{Model, ModelError};
use crate::sync::LockUnpoisoned;
use crate::telemetry::{EngineEvent, Summary};
use crate::threadpool::ThreadPool;
use crate::tokenizer::reasoning::{reasoning_token_count, ReplyFormat};
use crate::tokenizer::turns::tokens_of_text;
use crate::tokenizer::Tokenizer;

use super::error::ApiError;
use super::fair::{ClientKey, FairQueue, Laned};
use super::openai::Checked;
use super::state::{CacheView, ParkedView, Shared};

/// Messages a job's reply channel holds; a client that reads none of them for [`STALL_LIMIT`] is treated
/// as gone.
pub const REPLY_BACKLOG: usize = 256;
pub const STALL_LIMIT: Duration = Duration::from_secs(30);

/// What a job asks of the engine.
pub enum Task {
    /// Generate after the job's prompt, as its `checked` fields say.
    Generate,
    /// One embedding per input (`Session::embed`), answered by one [`Msg::Embeddings`]; the job's prompt
    /// is empty.
    Embed(Vec<Vec<u32>>),
    /// Run on other parts (another model, other settings): once every job taken before it has ended, the
    /// live sequences are parked in the cache under the old model's identity, and a session over the new
    /// parts takes the cache over. Answered on its own channel, not the job's.
    Switch(Box<SwitchOrder>),
}

type SwitchReply = tokio::sync::oneshot::Sender<Result<Switched, String>>;

/// What the engine switches to, and where it says how that went.
pub struct SwitchOrder {
    pub parts: EngineParts,
    pub reply: SwitchReply,
}

/// A switch done: the conversations parked from the live sequences, and what the cache holds now (of every
/// model).
#[derive(Clone, Copy, Debug)]
pub struct Switched {
    pub parked: usize,
    pub cached: usize,
    pub ms: f64,
}

/// One request for the engine.
pub struct Job {
    pub task: Task,
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
    /// A chat reply: Some(how it carries its reasoning: a `<think>` block, opened by the prompt or not, or
    /// harmony), for the usage's reasoning tokens; None for a plain completion (no reasoning counted).
    pub reply_format: Option<ReplyFormat>,
    /// The lane it waits in.
    pub client: ClientKey,
}

impl Laned for Job {
    fn client(&self) -> &ClientKey {
        &self.client
    }
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
    /// The most likely tokens: id, bytes, log-probability.
    pub top: Vec<(u32, Vec<u8>, f32)>,
}

/// What the engine sends back for a job, in order: for each choice its text pieces then its end, then the
/// figures of the whole request; or an error.
#[derive(Debug)]
pub enum Msg {
    Text {
        choice: usize,
        text: String,
        tokens: Vec<TokenInfo>,
    },
    /// A choice ended: why (OpenAI's `finish_reason` is [`finish_reason`] of it; llama.cpp's native
    /// `stop_type` tells an end-of-generation token from a stop string), its whole text and its tokens.
    ChoiceDone {
        choice: usize,
        stop_reason: StopReason,
        text: String,
        tokens: Vec<TokenInfo>,
    },
    Done(Box<Summary>),
    /// An embedding job's vectors, one per input in order, with its figures.
    Embeddings(Vec<Vec<f32>>, Box<Summary>),
    Error(ApiError),
}

impl Msg {
    /// The error a generating request's reader makes of a message only an embedding job gets.
    pub fn not_generated() -> ApiError {
        ApiError::internal("the engine answered a generation with embeddings")
    }
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
    /// Jobs generating at once (`--parallel`); one with speculative decoding.
    pub parallel: usize,
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
    let mut queue = FairQueue::new(jobs);
    let mut parts = parts;
    let mut ready = Some(ready);
    // Between sessions: the cache (with every model's snapshots), the parts to go back to when a switch
    // fails, and the switch under way.
    let mut cache: Option<crate::cache::ConversationCache> = None;
    let mut previous: Option<EngineParts> = None;
    let mut order: Option<(SwitchReply, usize, Instant)> = None;
    // A switch that failed: its answer waits until the session of the old parts runs again.
    let mut failed: Option<(SwitchReply, String)> = None;
    loop {
        let pool = ThreadPool::new(parts.threads);
        let made =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| new_session(&parts, &pool, &shared, &mut cache)))
                .unwrap_or_else(|_| Err("starting the session panicked (a bug: see the log above)".to_owned()));
        let mut session = match made {
            Ok(s) => s,
            Err(e) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Err(e));
                    return;
                }
                match (order.take(), previous.take()) {
                    (Some((reply, _, _)), Some(old)) => {
                        tracing::warn!("model switch failed: {e}; going back to the model loaded before");
                        failed = Some((reply, e));
                        parts = old;
                        continue;
                    }
                    _ => {
                        let why = format!("unhealthy: the engine cannot start again: {e}");
                        if let Some((reply, first)) = failed.take() {
                            let _ =
                                reply.send(Err(format!("{first}; and the model loaded before could not start again")));
                        }
                        return shared.set_unhealthy(why);
                    }
                }
            }
        };
        // What /health and /strata/cache show is the new session's before anyone hears it is ready.
        publish_cache(&session, &shared);
        shared.publish_slots(session.parallel(), []);
        if let Some(ready) = ready.take() {
            let _ = ready.send(Ok(()));
        }
        if let Some((reply, e)) = failed.take() {
            let _ = reply.send(Err(e));
        }
        if let Some((reply, parked, t0)) = order.take() {
            // The old model's last handle here goes: its memory is freed once the handlers let go of it.
            drop(previous.take());
            // Token ids of earlier replies are the old tokenizer's.
            *shared.replies.lock_unpoisoned() = Default::default();
            let done = Switched { parked, cached: session.cache.len(), ms: t0.elapsed().as_secs_f64() * 1e3 };
            let _ = reply.send(Ok(done));
        }
        let next = if session.drafter().is_some() {
            run_serial(&mut session, &parts.tokenizer, &shared, &mut queue)
        } else {
            let budget = parts.model.placement.batch;
            run_batched(&mut session, &parts.tokenizer, &shared, &mut queue, budget)
        };
        let Some(o) = next else { return };
        let t0 = Instant::now();
        let parked = session.park_live();
        cache = Some(session.take_cache());
        drop(session);
        drop(pool);
        tracing::info!(
            "model switch: {parked} live conversation(s) parked under the old model; the cache holds {}",
            cache.as_ref().map_or(0, |c| c.len())
        );
        let SwitchOrder { parts: next_parts, reply } = o;
        previous = Some(std::mem::replace(&mut parts, next_parts));
        order = Some((reply, parked, t0));
    }
}
/// The session over `parts` (with a drafter, or `parallel` slots), taking the cache of the session before
/// when there was one (`cache` is left as it was when this fails).
fn new_session<'a>(
    parts: &'a EngineParts,
    pool: &'a ThreadPool,
    shared: &Shared,
    cache: &mut Option<crate::cache::ConversationCache>,
) -> Result<Session<'a>, String> {
    let drafter = parts
        .spec
        .as_ref()
        .map(|s| s.drafter(parts.session.kv_type, parts.session.max_context, parts.model.cfg.n_vocab))
        .transpose();
    let session = drafter.and_then(|d| {
        let s = Session::new(&parts.model, &parts.tokenizer, pool, &parts.session)?;
        match d {
            Some(d) => Ok(s.with_drafter(d)),
            None => s.with_parallel(parts.parallel, &parts.session),
        }
    });
    let mut session = session.map_err(|e| e.to_string())?;
    session.telemetry = shared.telemetry.clone();
    if let Some(c) = cache.take() {
        session.adopt_cache(c, &parts.session);
    }
    Ok(session)
}

/// A switch order taken off the queue: it waits in `pending` until the jobs taken before it have ended (a
/// second one is refused). None when `job` is not one (it goes on as a job).
fn take_switch(job: Job, pending: &mut Option<SwitchOrder>) -> Option<Job> {
    let mut job = job;
    if !matches!(job.task, Task::Switch(_)) {
        return Some(job);
    }
    let Task::Switch(order) = std::mem::replace(&mut job.task, Task::Generate) else { return None };
    job.ticket.start();
    match pending {
        Some(_) => {
            let _ = order.reply.send(Err("another model switch is under way".into()));
        }
        None => *pending = Some(*order),
    }
    None
}

/// Whether a job taken off the queue may start: its client is still there, the engine is healthy, the
/// server is not stopping and the job's time is not up; otherwise it is answered (or dropped) here.
fn admit(shared: &Shared, job: &Job) -> bool {
    if !job.ticket.start() || job.tx.is_closed() {
        shared.metrics.dropped.inc();
        tracing::info!("a queued request was dropped: its client went away before it started");
        return false;
    }
    if let Some(why) = shared.unhealthy() {
        send(&job.tx, Msg::Error(ApiError::unhealthy(why)));
        return false;
    }
    if shared.shutting_down.load(Ordering::Acquire) {
        send(&job.tx, Msg::Error(ApiError::shutting_down()));
        return false;
    }
    if let Some(limit) = job.time_limit.filter(|&l| job.queued_at.elapsed() >= l) {
        tracing::info!("a queued request waited past --request-timeout-s {}: it ends", limit.as_secs());
        shared.metrics.reject("request_timeout");
        send(&job.tx, Msg::Error(ApiError::request_timeout(limit.as_secs())));
        return false;
    }
    true
}

/// The engine failed (a panic): the session may be half-updated, so it serves nothing more, and the
/// supervisor restarts the server. The jobs in flight get the reason.
fn engine_failed<'t>(shared: &Shared, txs: impl Iterator<Item = &'t Sender<Msg>>) {
    let why = "unhealthy: the engine failed (a bug: see the log above); the server exits with status 75 so that its supervisor restarts it";
    shared.set_unhealthy(why.to_owned());
    for tx in txs {
        send(tx, Msg::Error(ApiError::unhealthy(why)));
    }
}

/// One job at a time, each on slot 0 (speculative decoding).
/// Returns at the end of the queue (None), or with a switch order once the jobs before it have ended.
fn run_serial(
    session: &mut Session,
    tokenizer: &Tokenizer,
    shared: &Shared,
    queue: &mut FairQueue<Job>,
) -> Option<SwitchOrder> {
    let mut serial = 0u64;
    let mut switch = None;
    loop {
        let Some(job) = queue.next(switch.is_none()) else { return switch };
        let Some(job) = take_switch(job, &mut switch) else { continue };
        if !admit(shared, &job) {
            continue;
        }
        queue.started(&job.client);
        shared.publish_slots(1, [0]);
        serial += 1;
        let tx = job.tx.clone();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job.task {
            Task::Embed(_) => serve_embed(session, shared, job, serial),
            Task::Generate | Task::Switch(_) => serve_job(session, tokenizer, shared, job, serial),
        }));
        shared.publish_slots(1, []);
        if run.is_err() {
            engine_failed(shared, std::iter::once(&tx));
            return None;
        }
        publish_cache(session, shared);
    }
}

/// A job generating on a slot: its current choice's stream and observer, and the request's figures so far.
struct Running<'a> {
    job: Job,
    serial: u64,
    queue_ms: f64,
    params: GenerateParams,
    base_seed: u64,
    choice: usize,
    slot: usize,
    stream: Stream<'a>,
    obs: JobObserver<'a>,
    /// The first choice's start state, for the request's figures.
    restored: Option<(RestoreKind, usize)>,
    fallback: Option<Fallback>,
    summary: Option<Summary>,
}

/// Up to the session's slots of jobs at once: queued jobs start while a slot is free, every step advances
/// all of them by one batched pass (at most `budget` prompt tokens beside the decoding streams' tokens),
/// and a job's next choice starts on its slot when one ends. Returns at the end of the queue (None), or
/// with a switch order once the jobs taken before it have ended.
fn run_batched<'a>(
    session: &mut Session<'a>,
    tokenizer: &'a Tokenizer,
    shared: &'a Shared,
    queue: &mut FairQueue<Job>,
    budget: usize,
) -> Option<SwitchOrder> {
    let mut running: Vec<Running<'a>> = Vec::new();
    let mut serial = 0u64;
    let mut switch = None;
    loop {
        while running.len() < session.parallel() {
            let Some(job) = queue.next(running.is_empty() && switch.is_none()) else {
                if running.is_empty() {
                    return switch;
                }
                break;
            };
            let Some(job) = take_switch(job, &mut switch) else { continue };
            if !admit(shared, &job) {
                continue;
            }
            queue.started(&job.client);
            serial += 1;
            // An embedding job runs whole here, between two steps of the streams generating.
            let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job.task {
                Task::Embed(_) => {
                    serve_embed(session, shared, job, serial);
                    None
                }
                Task::Generate | Task::Switch(_) => start_job(session, tokenizer, shared, job, serial),
            }));
            match started {
                Ok(Some(r)) => running.push(r),
                Ok(None) => publish_cache(session, shared),
                Err(_) => {
                    engine_failed(shared, running.iter().map(|r| &r.job.tx));
                    return None;
                }
            }
        }
        shared.publish_slots(session.parallel(), running.iter().map(|r| r.slot));
        if running.is_empty() {
            continue;
        }
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut views: Vec<(usize, &mut Stream<'a>, &mut dyn Observer)> =
                running.iter_mut().map(|r| (r.slot, &mut r.stream, &mut r.obs as &mut dyn Observer)).collect();
            session.step(&mut views, budget)
        }));
        let progress = match stepped {
            Ok(p) => p,
            Err(_) => {
                engine_failed(shared, running.iter().map(|r| &r.job.tx));
                return None;
            }
        };
        let mut ended = false;
        let done: Vec<(usize, Result<Generation, EngineError>)> = progress
            .into_iter()
            .enumerate()
            .filter_map(|(i, p)| match p {
                Progress::Done(r) => Some((i, r)),
                Progress::Going | Progress::Starved => None,
            })
            .collect();
        if !done.is_empty() {
            // Their slots show free before their clients hear the end: a client that asks `/slots` right after
            // its answer sees its slot idle (a job's next choice takes its slot again below).
            let going = running.iter().enumerate().filter(|(i, _)| !done.iter().any(|d| d.0 == *i));
            shared.publish_slots(session.parallel(), going.map(|(_, r)| r.slot));
        }
        let settled = settle(&mut running, done, |r, result| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                choice_ended(session, tokenizer, shared, r, result)
            }))
            .map_err(|_| ())
        });
        match settled {
            Ok(n) => ended |= n > 0,
            Err(()) => {
                engine_failed(shared, running.iter().map(|r| &r.job.tx));
                return None;
            }
        }
        shared.publish_slots(session.parallel(), running.iter().map(|r| r.slot));
        if ended {
            publish_cache(session, shared);
        }
    }
}

/// Hands each finished entry of `running` (`done`: its index and result, indices ascending) to `next`,
/// which gives it back (its next choice goes on) or not (it ended); back to front, so that taking one out
/// and putting it back leaves the indices before it as they were, whichever of them end. The number that
/// ended; `Err` as soon as `next` fails (the entries not yet handled stay in `running`).
fn settle<T, R>(
    running: &mut Vec<T>,
    done: Vec<(usize, R)>,
    mut next: impl FnMut(T, R) -> Result<Option<T>, ()>,
) -> Result<usize, ()> {
    let mut ended = 0;
    for (i, result) in done.into_iter().rev() {
        let r = running.remove(i);
        match next(r, result)? {
            Some(r) => running.insert(i, r),
            None => ended += 1,
        }
    }
    Ok(ended)
}

/// Starts `job`'s first choice on a free slot; None when the job was answered instead (an error).
fn start_job<'a>(
    session: &mut Session<'a>,
    tokenizer: &'a Tokenizer,
    shared: &'a Shared,
    job: Job,
    serial: u64,
) -> Option<Running<'a>> {
    let queue_ms = job.queued_at.elapsed().as_secs_f64() * 1e3;
    let mut params = job.checked.params.clone();
    params.top_logprobs = job.top_logprobs;
    let base_seed = params.sampler.seed;
    let obs = JobObserver::new(&job, shared, tokenizer, 0, params.logprobs || params.top_logprobs > 0);
    let begun = match session.begin(&job.prompt, &params) {
        Some(Ok(b)) => b,
        Some(Err(e)) => {
            fail_job(shared, &job, &e);
            return None;
        }
        None => {
            fail_job(shared, &job, &EngineError::Cancelled);
            return None;
        }
    };
    Some(Running {
        serial,
        queue_ms,
        params,
        base_seed,
        choice: 0,
        slot: begun.slot,
        stream: begun.stream,
        obs,
        restored: begun.restored,
        fallback: begun.fallback,
        summary: None,
        job,
    })
}

/// A running job's choice ended with `result`: its slot is idle again, the choice goes out, and the job
/// either starts its next choice on the same slot (returned) or ends.
fn choice_ended<'a>(
    session: &mut Session<'a>,
    tokenizer: &'a Tokenizer,
    shared: &'a Shared,
    mut r: Running<'a>,
    result: Result<Generation, EngineError>,
) -> Option<Running<'a>> {
    let (reused, read) = session.end(r.slot, r.job.prompt.len(), result.as_ref().ok());
    let (restored, fallback) = (r.restored.take(), r.fallback.take());
    let served = result.map(|generation| Served { generation, reused, read, restored, fallback, draft_read: None });
    let logprobs = r.obs.logprobs;
    let served = match choice_outcome(shared, &r.job, served, r.obs.timed_out) {
        ChoiceEnd::Served(s) => s,
        ChoiceEnd::Stopped => {
            match r.summary {
                Some(s) => finish_job(shared, &r.job, s),
                None => end_cancelled(shared, &r.job),
            }
            return None;
        }
        ChoiceEnd::Answered => return None,
    };
    record_choice(tokenizer, shared, &r.job, &served, r.choice, logprobs, &mut r.summary, r.serial, r.queue_ms);
    if r.choice + 1 >= r.job.checked.choices {
        if let Some(s) = r.summary.take() {
            finish_job(shared, &r.job, s);
        }
        return None;
    }
    r.choice += 1;
    r.params.sampler.seed = r.base_seed.wrapping_add(r.choice as u64);
    r.obs = JobObserver::new(&r.job, shared, tokenizer, r.choice, logprobs);
    match session.begin_again(r.slot, &r.job.prompt, &r.params) {
        Ok(b) => {
            r.stream = b.stream;
            Some(r)
        }
        Err(e) => {
            fail_job(shared, &r.job, &e);
            None
        }
    }
}

/// Sends the text of one choice as it comes, with its tokens when log-probabilities are asked for, and
/// stops the generation when the client is gone, the request's time is up or the server must stop now.
struct JobObserver<'a> {
    tx: Sender<Msg>,
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
                .map(|top| top.iter().map(|&(id, lp)| (id, tokenizer.token_to_piece(id), lp)).collect())
                .unwrap_or_default(),
        })
        .collect()
}

impl<'a> JobObserver<'a> {
    /// The observer of choice `choice` of `job`, whose time runs from the job's arrival.
    fn new(job: &Job, shared: &'a Shared, tokenizer: &'a Tokenizer, choice: usize, logprobs: bool) -> JobObserver<'a> {
        JobObserver {
            tx: job.tx.clone(),
            gone: false,
            deadline: job.time_limit.map(|l| job.queued_at + l),
            timed_out: false,
            shared,
            tokenizer,
            choice,
            logprobs,
            sent_tokens: 0,
        }
    }
}

impl Observer for JobObserver<'_> {
    fn on_text(&mut self, text: &str, so_far: &Generation) {
        let tokens = if self.logprobs { token_infos(self.tokenizer, so_far, self.sent_tokens) } else { Vec::new() };
        self.sent_tokens = so_far.tokens.len();
        if !send(&self.tx, Msg::Text { choice: self.choice, text: text.to_owned(), tokens }) {
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
        EngineError::Model(ModelError::NoEmbedding(why)) => ApiError::invalid("input", format!("input: {why}")),
        EngineError::Model(ModelError::ContextOverflow { needed, max }) => ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid("messages", format!("the prompt needs {needed} positions but the context holds {max}"))
        },
        other => ApiError::internal(format!("the request failed: {other}")),
    }
}

/// Answers an embedding job: its inputs read one after another into a throwaway cache (the live
/// sequences keep their state), ended early when its client goes away.
fn serve_embed(session: &mut Session, shared: &Shared, job: Job, serial: u64) {
    let Task::Embed(inputs) = &job.task else { return };
    let queue_ms = job.queued_at.elapsed().as_secs_f64() * 1e3;
    let t0 = Instant::now();
    let tx = job.tx.clone();
    let limit = job.time_limit.map(|l| job.queued_at + l);
    let embedded = session.embed(inputs, || tx.is_closed() || limit.is_some_and(|l| Instant::now() >= l));
    match embedded {
        Ok(vectors) => {
            let tokens: usize = inputs.iter().map(Vec::len).sum();
            let prompt_ms = t0.elapsed().as_secs_f64() * 1e3;
            let s = Summary {
                job: serial,
                prompt_tokens: tokens,
                read: tokens,
                prompt_ms,
                prompt_tok_s: tokens as f64 / (prompt_ms / 1e3).max(1e-9),
                queue_ms,
                ..Summary::default()
            };
            shared.metrics.record(job.endpoint, &s);
            send(&job.tx, Msg::Embeddings(vectors, Box::new(s)));
        }
        Err(EngineError::Cancelled) if !tx.is_closed() => {
            let secs = job.time_limit.map_or(0, |l| l.as_secs());
            shared.metrics.reject("request_timeout");
            send(&job.tx, Msg::Error(ApiError::request_timeout(secs)));
        }
        Err(EngineError::Cancelled) => end_cancelled(shared, &job),
        Err(e) => fail_job(shared, &job, &e),
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
        let mut obs = JobObserver::new(&job, shared, tokenizer, choice, logprobs);
        let served = if choice == 0 {
            session.serve(&job.prompt, &params, &mut obs)
        } else {
            session.serve_again(&job.prompt, &params, &mut obs)
        };
        let served = match choice_outcome(shared, &job, served, obs.timed_out) {
            ChoiceEnd::Served(s) => s,
            ChoiceEnd::Stopped => break,
            ChoiceEnd::Answered => return,
        };
        record_choice(tokenizer, shared, &job, &served, choice, logprobs, &mut summary, serial, queue_ms);
    }
    match summary {
        Some(s) => finish_job(shared, &job, s),
        None => end_cancelled(shared, &job),
    }
}

/// What a choice's end means for its job: served, stopped (the client went away, or a signal), or answered
/// here (its time ran out, an engine error, a shutdown).
fn choice_outcome(shared: &Shared, job: &Job, served: Result<Served, EngineError>, timed_out: bool) -> ChoiceEnd {
    if timed_out && !job.tx.is_closed() {
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

/// Sends a served choice's end to its client and adds it to the request's figures (made from the first
/// choice's).
#[allow(clippy::too_many_arguments)]
fn record_choice(
    tokenizer: &Tokenizer,
    shared: &Shared,
    job: &Job,
    served: &Served,
    choice: usize,
    logprobs: bool,
    summary: &mut Option<Summary>,
    serial: u64,
    queue_ms: f64,
) {
    let g = &served.generation;
    let tokens = choice_tokens(tokenizer, g, logprobs);
    if let Some(t) = tokens_of_text(tokenizer, &g.tokens, &g.text) {
        shared.replies.lock_unpoisoned().remember(&g.text, t);
    }
    send(&job.tx, Msg::ChoiceDone { choice, stop_reason: g.stop_reason, text: g.text.clone(), tokens });
    let s = summary.get_or_insert_with(|| first_summary(job, served, serial, queue_ms));
    s.completion_tokens += g.tokens.len();
    if let Some(format) = job.reply_format {
        let pieces: Vec<Vec<u8>> =
            g.tokens.iter().filter(|&&t| !tokenizer.is_eog(t)).map(|&t| tokenizer.token_to_piece(t)).collect();
        s.reasoning_tokens += reasoning_token_count(pieces.iter().map(|p| p.as_slice()), format);
    }
    s.gen_ms += g.gen_ms;
    s.drafts_proposed += g.drafts_proposed;
    s.drafts_accepted += g.drafts_accepted;
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
        live_tokens: session.live_token_count(),
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

#[cfg(test)]
mod tests {
    use super::settle;

    /// Two jobs finish a choice in the same step: the first ends, the second goes on to its next choice
    /// (`n` 2). Each keeps its place, and nothing is put back past the end of the list.
    #[test]
    fn jobs_ending_and_going_on_in_one_step_keep_their_places() {
        for ends in [[true, false], [false, true], [true, true], [false, false]] {
            let mut running = vec!["a", "b", "c"];
            let done = vec![(0, ends[0]), (2, ends[1])];
            let ended = settle(&mut running, done, |r, end| Ok(if end { None } else { Some(r) })).unwrap();
            let want: Vec<&str> = [("a", ends[0]), ("b", false), ("c", ends[1])]
                .into_iter()
                .filter(|&(_, end)| !end)
                .map(|(r, _)| r)
                .collect();
            assert_eq!(running, want, "{ends:?}");
            assert_eq!(ended, ends.iter().filter(|&&e| e).count());
        }
        // The case that once panicked: the only two jobs finish together, the first ends.
        let mut running = vec!["a", "b"];
        settle(&mut running, vec![(0, true), (1, false)], |r, end| Ok(if end { None } else { Some(r) })).unwrap();
        assert_eq!(running, ["b"]);
        // A failure stops at once; what was not handled stays.
        let mut running = vec!["a", "b"];
        assert!(settle(&mut running, vec![(0, false), (1, false)], |_, _| Err::<Option<&str>, ()>(())).is_err());
        assert_eq!(running, ["a"]);
    }
}
