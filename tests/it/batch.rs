//! Continuous batching (`engine::batch`): streams advanced together, joining and leaving between steps,
//! each give the reply that `generate` gives on a sequence of their own.

use std::sync::Arc;

use proptest::prelude::*;

use strata::engine::batch::{step, Active, Progress, Stream};
use strata::engine::{generate, EngineError, GenerateParams, Generation, Observer, Request, Sequence};
use strata::gguf::GgufFile;
use strata::model::synthetic::SyntheticSpec;
use strata::model::{KvType, Model};
use strata::sample::SamplerConfig;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

fn setup() -> (Model, Tokenizer) {
    let file = Arc::new(GgufFile::from_bytes(SyntheticSpec::default().to_gguf()).expect("parses"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    (Model::from_file(file).expect("model"), tok)
}

/// Collects the text it is given and cancels once it has had `cancel_after` pieces (None: never).
#[derive(Default)]
struct Recorder {
    text: String,
    pieces: usize,
    cancel_after: Option<usize>,
}

impl Observer for Recorder {
    fn on_text(&mut self, text: &str, _: &Generation) {
        self.text.push_str(text);
        self.pieces += 1;
    }

    fn cancelled(&mut self) -> bool {
        self.cancel_after.is_some_and(|k| self.pieces >= k)
    }
}

/// One request of a scenario: its prompt, how it generates, the step it joins at, and when its client
/// leaves (cancels after that many pieces of text).
#[derive(Clone, Debug)]
struct Req {
    prompt: Vec<u32>,
    params: GenerateParams,
    join: usize,
    cancel_after: Option<usize>,
}

/// What a request gave: its tokens, the bits of their log-probabilities (so any change in the logits
/// shows, not only one that flips a token), its text, stop reason and the text its observer saw; or the
/// error (a cancellation before the first token).
type Reply = Result<(Vec<u32>, Vec<u32>, String, String, String), String>;

fn reply(r: Result<Generation, EngineError>, rec: &Recorder) -> Reply {
    r.map(|g| {
        let logprobs = g.token_logprobs.iter().map(|p| p.to_bits()).collect();
        (g.tokens, logprobs, g.text, format!("{:?}", g.stop_reason), rec.text.clone())
    })
    .map_err(|e| e.to_string())
}

fn alone(model: &Model, tok: &Tokenizer, pool: &ThreadPool, r: &Req) -> Reply {
    let mut seq = Sequence::new(model, KvType::F16, 256).expect("seq");
    let mut rec = Recorder { cancel_after: r.cancel_after, ..Default::default() };
    let g = generate(model, tok, pool, &mut seq, Request::new(&r.prompt, &r.params), &mut rec);
    reply(g, &rec)
}

/// Runs the requests together: each joins at its step, and a finished one frees its place.
fn together(model: &Model, tok: &Tokenizer, pool: &ThreadPool, reqs: &[Req], budget: usize) -> Vec<Reply> {
    let mut seqs: Vec<Sequence> = reqs.iter().map(|_| Sequence::new(model, KvType::F16, 256).expect("seq")).collect();
    let mut recs: Vec<Recorder> =
        reqs.iter().map(|r| Recorder { cancel_after: r.cancel_after, ..Default::default() }).collect();
    let mut streams: Vec<Option<Stream>> = reqs.iter().map(|_| None).collect();
    let mut replies: Vec<Option<Reply>> = reqs.iter().map(|_| None).collect();
    for t in 0.. {
        for (i, r) in reqs.iter().enumerate() {
            if r.join == t {
                match Stream::start(model, tok, pool, &mut seqs[i], &r.prompt, &r.params) {
                    Ok(s) => streams[i] = Some(s),
                    Err(e) => replies[i] = Some(Err(e.to_string())),
                }
            }
        }
        if replies.iter().all(Option::is_some) {
            break;
        }
        let mut ids = Vec::new();
        let mut active: Vec<Active> = Vec::new();
        for (i, ((seq, stream), obs)) in seqs.iter_mut().zip(&mut streams).zip(&mut recs).enumerate() {
            if let Some(stream) = stream {
                ids.push(i);
                active.push(Active { seq, stream, obs });
            }
        }
        let progress = step(model, pool, &mut active, budget);
        drop(active);
        for (i, p) in ids.into_iter().zip(progress) {
            if let Progress::Done(r) = p {
                streams[i] = None;
                replies[i] = Some(reply(r, &recs[i]));
            }
        }
    }
    replies.into_iter().map(|r| r.expect("every request answered")).collect()
}

fn params(max_tokens: usize, batch: usize, temperature: f32, seed: u64, ignore_eos: bool) -> GenerateParams {
    let sampler = if temperature > 0.0 {
        SamplerConfig { temperature, seed, ..SamplerConfig::default() }
    } else {
        SamplerConfig::greedy()
    };
    GenerateParams { max_tokens, sampler, ignore_eos, batch, logprobs: true, ..Default::default() }
}

#[test]
fn streams_together_give_each_the_reply_it_has_alone() {
    let (model, tok) = setup();
    let pool = ThreadPool::new(2);
    let texts = ["the quick brown fox", "hello world, hello", "a", "jumps over the lazy dog again and again", "x y"];
    let reqs: Vec<Req> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| Req {
            prompt: tok.encode(t, true),
            params: params(6 + 3 * i, 1 + 2 * i, if i % 2 == 1 { 0.9 } else { 0.0 }, i as u64, true),
            join: i,
            cancel_after: (i == 3).then_some(2),
        })
        .collect();
    let solo: Vec<Reply> = reqs.iter().map(|r| alone(&model, &tok, &pool, r)).collect();
    for budget in [1, 3, 16, 512] {
        assert_eq!(together(&model, &tok, &pool, &reqs, budget), solo, "token budget {budget}");
    }
    // The checks can fail: a stream cancelled after two pieces stops short of its max_tokens.
    let cut = solo[3].as_ref().expect("reply");
    assert!(cut.0.len() < reqs[3].params.max_tokens, "the cancelled request stopped early");
}

fn req(n_vocab: u32) -> impl Strategy<Value = Req> {
    req_of(n_vocab, 40, 12)
}

/// A request with a prompt of fewer than `prompt` tokens and at most `max_tokens` of reply.
fn req_of(n_vocab: u32, prompt: usize, max_tokens: usize) -> impl Strategy<Value = Req> {
    (
        proptest::collection::vec(0..n_vocab, 1..prompt),
        1usize..max_tokens,
        1usize..24,
        prop_oneof![Just(0.0f32), Just(0.8f32)],
        any::<u64>(),
        any::<bool>(),
        0usize..6,
        proptest::option::of(0usize..6),
    )
        .prop_map(|(prompt, max_tokens, batch, temperature, seed, ignore_eos, join, cancel_after)| Req {
            prompt,
            params: params(max_tokens, batch, temperature, seed, ignore_eos),
            join,
            cancel_after,
        })
}

fn cases() -> u32 {
    std::env::var("STRATA_SOAK_CASES").ok().and_then(|v| v.parse::<u32>().ok()).map_or(48, |n| n.min(200))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Whatever joins, leaves (finishes, or its client cancels) and shares the steps, every reply is the
    /// one its request gets alone.
    #[test]
    fn batching_never_changes_a_reply(reqs in proptest::collection::vec(req(256), 1..6), budget in 1usize..48) {
        let (model, tok) = setup();
        let pool = ThreadPool::new(2);
        let solo: Vec<Reply> = reqs.iter().map(|r| alone(&model, &tok, &pool, r)).collect();
        prop_assert_eq!(together(&model, &tok, &pool, &reqs, budget), solo);
    }
}

/// A scenario for the session: requests joining at their steps (waiting for a free slot), and the steps at
/// which device 0 or 1 fails its next allocation.
fn session_case() -> impl Strategy<Value = (Vec<Req>, usize, Vec<(usize, usize)>)> {
    (
        // Long enough to cross KV pages (64 tokens) while others run: that is when pages are allocated.
        proptest::collection::vec(req_of(256, 150, 40), 2..6),
        2usize..4,
        proptest::collection::vec((0usize..30, 0usize..2), 1..6),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases() / 2, ..ProptestConfig::default() })]

    /// Through the session's slots on a two-device sim split: requests join (queued while every slot is
    /// busy), leave, and devices fail allocations mid-batch (each while at least two streams share the
    /// pass, so the newest is preempted and resumed later). Every reply is the one its request gets alone.
    #[test]
    fn slots_joins_leaves_and_preemptions_never_change_a_reply((reqs, parallel, faults) in session_case()) {
        use strata::device::sim::Fault;
        use strata::device::{DeviceKind, DeviceSet};
        use strata::engine::session::{Session, SessionConfig};
        use strata::model::LoadOptions;
        let file = Arc::new(GgufFile::from_bytes(SyntheticSpec::default().to_gguf()).expect("parses"));
        let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
        let kinds = [DeviceKind::Sim { capacity_bytes: 256 << 20 }, DeviceKind::Sim { capacity_bytes: 256 << 20 }];
        let devices = DeviceSet::from_kinds(&kinds, 0).expect("sims");
        let sims = devices.devices.clone();
        let opts = LoadOptions { devices, split: Some(vec![1]), ..Default::default() };
        let model = Model::from_file_with(file, &opts).expect("split model");
        let pool = ThreadPool::new(2);
        let solo: Vec<Reply> = reqs.iter().map(|r| alone(&model, &tok, &pool, r)).collect();

        let cfg = SessionConfig { kv_type: KvType::F16, max_context: 256, cache_slots: 2, cache_budget_bytes: 64 << 20 };
        let mut session = Session::new(&model, &tok, &pool, &cfg).expect("session").with_parallel(parallel, &cfg).expect("slots");
        let mut recs: Vec<Recorder> = reqs.iter().map(|r| Recorder { cancel_after: r.cancel_after, ..Default::default() }).collect();
        let mut running: Vec<Option<(usize, Stream)>> = reqs.iter().map(|_| None).collect();
        let mut replies: Vec<Option<Reply>> = reqs.iter().map(|_| None).collect();
        let mut started = vec![false; reqs.len()];
        for t in 0.. {
            prop_assert!(t < 5000, "the requests end");
            for (i, r) in reqs.iter().enumerate() {
                if !started[i] && r.join <= t && session.busy_slots() < session.parallel() {
                    started[i] = true;
                    match session.begin(&r.prompt, &r.params).expect("a free slot") {
                        Ok(b) => running[i] = Some((b.slot, b.stream)),
                        Err(e) => replies[i] = Some(Err(e.to_string())),
                    }
                }
            }
            if replies.iter().all(Option::is_some) {
                break;
            }
            // Streams that will share the pass: running, not preempted, and not about to end on their client's
            // cancellation before it.
            let leaving = |rec: &Recorder| rec.cancel_after.is_some_and(|k| rec.pieces >= k);
            let n_running = running.iter().zip(&recs).filter(|(r, rec)| r.is_some() && !leaving(rec)).count();
            if n_running >= session.suspended_slots() + 2 {
                for &(_, d) in faults.iter().filter(|&&(at, _)| at == t) {
                    sims[d].inject(Fault::FailAllocs(1)).expect("fault");
                }
            }
            let mut ids = Vec::new();
            let mut views: Vec<(usize, &mut Stream, &mut dyn Observer)> = Vec::new();
            for (i, (r, obs)) in running.iter_mut().zip(&mut recs).enumerate() {
                if let Some((slot, stream)) = r {
                    ids.push(i);
                    views.push((*slot, stream, obs));
                }
            }
            let progress = session.step(&mut views, 24);
            drop(views);
            // A failure not taken in this shared step is withdrawn: one taken by a stream alone in its pass is
            // that request's error (nothing to preempt), which is not what this property is about.
            for d in &sims {
                d.inject(Fault::FailAllocs(0)).expect("reset");
            }
            for (i, p) in ids.into_iter().zip(progress) {
                if let Progress::Done(r) = p {
                    let (slot, _) = running[i].take().expect("running");
                    session.end(slot, reqs[i].prompt.len(), r.as_ref().ok());
                    replies[i] = Some(reply(r, &recs[i]));
                }
            }
        }
        let got: Vec<Reply> = replies.into_iter().map(|r| r.expect("answered")).collect();
        prop_assert_eq!(got, solo);
    }
}
