//! The conversation cache on the default model through `Session`: a checkpoint restore after an edited last
//! message of a 300-token conversation, on a 2-way sim split. (The path does not depend on the length: a
//! checkpoint is recorded at the end of every prompt. tests/it/replay.rs restores one of a 2,000-token
//! conversation through `strata replay`.)

use crate::common;

use std::sync::Arc;

use strata::cache::RestoreKind;
use strata::device::sim::Fault;
use strata::device::{DeviceKind, DeviceSet};
use strata::engine::session::{Session, SessionConfig};
use strata::engine::{generate, GenerateParams, Quiet, Request, Sequence};
use strata::gguf::GgufFile;
use strata::model::{KvType, LoadOptions, Model};
use strata::sample::SamplerConfig;
use strata::threadpool::ThreadPool;
use strata::tokenizer::Tokenizer;

const MIB: u64 = 1 << 20;

#[test]
fn an_edited_last_message_restores_from_a_checkpoint_and_reads_only_the_rest() {
    let file = Arc::new(GgufFile::open(&common::model_path()).expect("model"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let kinds = [DeviceKind::Sim { capacity_bytes: 200 * MIB }, DeviceKind::Sim { capacity_bytes: 400 * MIB }];
    let devices = DeviceSet::from_kinds(&kinds, 16 * MIB).expect("sims");
    let opts = LoadOptions { devices, split: Some(vec![15]), ..Default::default() };
    let model = Model::from_file_with(file.clone(), &opts).expect("model");
    let cfg = SessionConfig { kv_type: KvType::F16, max_context: 8192, cache_slots: 4, cache_budget_bytes: 1024 * MIB };
    let mut session = Session::new(&model, &tok, &pool, &cfg).expect("session");
    let params =
        GenerateParams { max_tokens: 8, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };

    // Conversation a: a long first message (four pages and a part) and its reply, then a short second
    // message (300+ tokens).
    let text = std::fs::read_to_string(common::reference_path("perplexity_GPL-3.txt")).expect("text");
    let first: Vec<u32> = tok.encode(&text, false)[..300].to_vec();
    let reply = session.serve(&first, &params, &mut Quiet).expect("turn 1").generation.tokens;
    let mut turn2 = first.clone();
    turn2.extend_from_slice(&reply);
    let history = turn2.clone();
    turn2.extend(tok.encode("\nSummarize the text above in one sentence.\n", false));
    session.serve(&turn2, &params, &mut Quiet).expect("turn 2");
    assert!(turn2.len() >= 300, "{}", turn2.len());

    // The user switches to b (a is parked), then comes back having edited a's last message.
    session.serve(&tok.encode("Write a haiku about rain.", false), &params, &mut Quiet).expect("conversation b");
    let mut edited = history.clone();
    edited.extend(tok.encode("\nWho wrote this license?\n", false));
    let served = session.serve(&edited, &params, &mut Quiet).expect("edited turn");

    // a's snapshot restores at the checkpoint recorded at the end of its first prompt; the rest is read.
    assert_eq!(served.restored, Some((RestoreKind::Checkpoint, first.len())), "{:?}", served.restored);
    assert_eq!((served.reused, served.read), (first.len(), edited.len() - first.len()));
    let cpu = Model::from_file(file).expect("cpu model");
    let mut fresh = Sequence::new(&cpu, KvType::F16, 8192).expect("sequence");
    let want = generate(&cpu, &tok, &pool, &mut fresh, Request::new(&edited, &params), &mut Quiet).expect("reread");
    assert_eq!(served.generation.tokens, want.tokens, "a checkpoint restore gives the reread's tokens");
}

/// The restore gate with several streams: restoring a parked conversation into one slot must leave room
/// for what the other running stream will still take (its prompt and max_tokens). The devices are squeezed
/// to leave exactly the snapshot's pages and the reserve free: a neighbour that will not grow past its held
/// page lets the restore in; one that will grow by many pages makes it fall back (the snapshot is kept and
/// the prompt reread), so the running stream is never the one that runs out.
#[test]
fn a_restore_leaves_room_for_the_streams_running_beside_it() {
    let file = Arc::new(GgufFile::open(&common::model_path()).expect("model"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let text = std::fs::read_to_string(common::reference_path("perplexity_GPL-3.txt")).expect("text");
    let conv_a: Vec<u32> = tok.encode(&text, false)[..600].to_vec();
    let params = |n: usize| GenerateParams {
        max_tokens: n,
        sampler: SamplerConfig::greedy(),
        ignore_eos: true,
        ..Default::default()
    };
    let mut outcomes = Vec::new();
    for neighbour_tokens in [8, 3000] {
        let kinds = [DeviceKind::Sim { capacity_bytes: 400 * MIB }, DeviceKind::Sim { capacity_bytes: 400 * MIB }];
        let devices = DeviceSet::from_kinds(&kinds, 16 * MIB).expect("sims");
        let sims = devices.devices.clone();
        let opts = LoadOptions { devices, split: Some(vec![15]), ..Default::default() };
        let model = Model::from_file_with(file.clone(), &opts).expect("model");
        let cfg =
            SessionConfig { kv_type: KvType::F16, max_context: 8192, cache_slots: 4, cache_budget_bytes: 1024 * MIB };
        let mut session = Session::new(&model, &tok, &pool, &cfg).expect("session").with_parallel(2, &cfg).expect("2");
        // a, then c on slot 0 (a is parked); b starts on slot 1 and reads its prompt.
        session.serve(&conv_a, &params(4), &mut Quiet).expect("a");
        let a_live = session.live_tokens().to_vec();
        session.serve(&tok.encode("Write a haiku about rain.", false), &params(4), &mut Quiet).expect("c");
        let b = session.begin(&tok.encode("Count to three.", false), &params(neighbour_tokens)).expect("a slot");
        let mut b = b.expect("b starts");
        assert_eq!(b.slot, 1, "b takes the empty slot");
        let progress = session.step(&mut [(b.slot, &mut b.stream, &mut Quiet)], 512);
        assert!(matches!(progress[0], strata::engine::batch::Progress::Going));
        // Squeeze: each device keeps free exactly a's pages and its reserve.
        let probe = model.new_kv(KvType::F16, 8192).expect("kv");
        for (device, need) in probe.device_need_bytes(a_live.len()) {
            let d = sims.iter().find(|s| Arc::ptr_eq(s, &device)).expect("a sim device");
            d.inject(Fault::LeaveFreeBytes(need + d.reserve_bytes)).expect("squeeze");
        }
        let mut back = a_live.clone();
        back.extend(tok.encode("\nAnd then?", false));
        let a2 = session.begin(&back, &params(4)).expect("a slot").expect("a comes back");
        assert_eq!(a2.slot, 0);
        outcomes.push((a2.restored, a2.fallback.is_some()));
    }
    let admitted = matches!(outcomes[0], (Some((RestoreKind::Live, n)), false) if n > conv_a.len());
    assert!(admitted, "a neighbour that stays within its page lets the restore in: {outcomes:?}");
    assert_eq!(outcomes[1], (None, true), "a neighbour that will grow makes the restore fall back: {outcomes:?}");
}

/// A device that runs out of memory mid-batch preempts the newest stream instead of failing anything: its
/// KV is parked in host RAM and its pages freed, the starved stream goes on, and the preempted one comes
/// back after the other ends. Both replies (tokens and log-probability bits) are the ones each gets alone.
#[test]
fn an_out_of_memory_mid_batch_preempts_the_newest_stream_and_changes_no_reply() {
    use strata::engine::batch::Progress;
    use strata::engine::{Generation, Observer};
    let file = Arc::new(GgufFile::open(&common::model_path()).expect("model"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let kinds = [DeviceKind::Sim { capacity_bytes: 400 * MIB }, DeviceKind::Sim { capacity_bytes: 400 * MIB }];
    let devices = DeviceSet::from_kinds(&kinds, 16 * MIB).expect("sims");
    let sims = devices.devices.clone();
    let opts = LoadOptions { devices, split: Some(vec![15]), ..Default::default() };
    let model = Model::from_file_with(file, &opts).expect("model");
    let cfg = SessionConfig { kv_type: KvType::F16, max_context: 4096, cache_slots: 0, cache_budget_bytes: 0 };
    let mut session = Session::new(&model, &tok, &pool, &cfg).expect("session").with_parallel(2, &cfg).expect("2");
    let params = GenerateParams {
        max_tokens: 150,
        sampler: SamplerConfig::greedy(),
        ignore_eos: true,
        logprobs: true,
        ..Default::default()
    };
    let prompts = [tok.encode("Write a long story about a dragon.", false), tok.encode("List the planets.", false)];
    let reply = |g: &Generation| (g.tokens.clone(), g.token_logprobs.iter().map(|p| p.to_bits()).collect::<Vec<_>>());
    let alone: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut seq = Sequence::new(&model, KvType::F16, 4096).expect("seq");
            reply(&generate(&model, &tok, &pool, &mut seq, Request::new(p, &params), &mut Quiet).expect("alone"))
        })
        .collect();

    let mut begun: Vec<_> = prompts.iter().map(|p| session.begin(p, &params).expect("slot").expect("starts")).collect();
    let mut quiet = [Quiet, Quiet];
    let mut done: Vec<Option<(Vec<u32>, Vec<u32>)>> = vec![None, None];
    for step in 0.. {
        assert!(step < 1000, "the streams end");
        if step == 3 {
            // Both decode now; the next page either stream takes on device 0 fails.
            sims[0].inject(Fault::FailAllocs(1)).expect("fault");
        }
        let live: Vec<usize> = (0..2).filter(|&i| done[i].is_none()).collect();
        if live.is_empty() {
            break;
        }
        let mut running: Vec<(usize, &mut strata::engine::batch::Stream, &mut dyn Observer)> = Vec::new();
        for (i, (b, q)) in begun.iter_mut().zip(quiet.iter_mut()).enumerate() {
            if done[i].is_none() {
                running.push((b.slot, &mut b.stream, q));
            }
        }
        let progress = session.step(&mut running, 512);
        drop(running);
        for (i, p) in live.into_iter().zip(progress) {
            if let Progress::Done(r) = p {
                let g = r.expect("no stream fails");
                session.end(begun[i].slot, prompts[i].len(), Some(&g));
                done[i] = Some(reply(&g));
            }
        }
    }
    assert_eq!(session.preemptions, 1, "the out-of-memory preempted one stream");
    for (i, (d, a)) in done.iter().zip(&alone).enumerate() {
        assert_eq!(d.as_ref().expect("done"), a, "stream {i}: its reply differs from the one it gets alone");
    }
}

/// Idle slots keep their conversations live only within the conversation cache's budget: past it, the
/// least recently used idle slot is parked in the cache and emptied (the newest idle one stays live), and a
/// request that comes back to a parked one restores it on an empty slot instead of rereading. With room,
/// every idle slot stays live.
#[test]
fn idle_slots_keep_their_conversations_live_only_within_the_cache_budget() {
    use strata::engine::batch::Progress;
    use strata::engine::Observer;
    let file = Arc::new(GgufFile::open(&common::model_path()).expect("model"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let model = Model::from_file_with(file, &LoadOptions::default()).expect("model");
    let text = std::fs::read_to_string(common::reference_path("perplexity_GPL-3.txt")).expect("text");
    let words = tok.encode(&text, false);
    // Three conversations of 300 tokens: 5 pages of 64 positions each, about 7 MiB of f16 KV.
    let convs: Vec<Vec<u32>> = (0..3).map(|i| words[i * 400..i * 400 + 300].to_vec()).collect();
    let params =
        GenerateParams { max_tokens: 4, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let run_together = |session: &mut Session, prompts: &[Vec<u32>]| -> Vec<(usize, Vec<u32>)> {
        let mut begun: Vec<_> =
            prompts.iter().map(|p| session.begin(p, &params).expect("slot").expect("starts")).collect();
        let mut done: Vec<Option<Vec<u32>>> = vec![None; prompts.len()];
        let mut quiet: Vec<_> = prompts.iter().map(|_| Quiet).collect();
        while done.iter().any(Option::is_none) {
            let live: Vec<usize> = (0..prompts.len()).filter(|&i| done[i].is_none()).collect();
            let mut running: Vec<(usize, &mut strata::engine::batch::Stream, &mut dyn Observer)> = Vec::new();
            for (i, (b, q)) in begun.iter_mut().zip(quiet.iter_mut()).enumerate() {
                if done[i].is_none() {
                    running.push((b.slot, &mut b.stream, q));
                }
            }
            let progress = session.step(&mut running, 512);
            drop(running);
            for (i, p) in live.into_iter().zip(progress) {
                if let Progress::Done(r) = p {
                    let g = r.expect("no stream fails");
                    session.end(begun[i].slot, prompts[i].len(), Some(&g));
                    done[i] = Some([prompts[i].clone(), g.tokens.clone()].concat());
                }
            }
        }
        begun.iter().map(|b| b.slot).zip(done.into_iter().map(Option::unwrap)).collect()
    };
    for budget_mib in [1024, 10] {
        let cfg = SessionConfig {
            kv_type: KvType::F16,
            max_context: 4096,
            cache_slots: 8,
            cache_budget_bytes: budget_mib * MIB,
        };
        let mut session = Session::new(&model, &tok, &pool, &cfg).expect("session").with_parallel(3, &cfg).expect("3");
        let ended = run_together(&mut session, &convs);
        let held = session.idle_live_bytes();
        assert!(
            held + session.cache.bytes() <= cfg.cache_budget_bytes,
            "budget {budget_mib} MiB: idle slots hold {held} bytes beside {} parked",
            session.cache.bytes()
        );
        if budget_mib == 1024 {
            assert!(held > 10 * MIB, "with room, both older idle slots stay live ({held} bytes)");
            assert_eq!(session.cache.len(), 0, "nothing was parked");
            continue;
        }
        // Past the budget: the first two left RAM (the first evicted to make room for the second), the
        // third stays live.
        assert_eq!(held, 0, "only the newest idle slot holds KV");
        assert_eq!(session.cache.len(), 1, "one snapshot fits the budget");
        // The second conversation comes back: restored from the cache onto an empty slot.
        let mut back = ended[1].1.clone();
        back.extend(tok.encode(" And then?", false));
        let b = session.begin(&back, &params).expect("slot").expect("starts");
        assert_ne!(b.slot, ended[2].0, "the newest conversation's slot is not taken");
        assert!(
            // (all of it but the last token sampled, which was never read)
            matches!(b.restored, Some((RestoreKind::Live, n)) if n == ended[1].1.len() - 1),
            "the parked conversation is restored: {:?}",
            b.restored
        );
    }
}

/// A preempted stream whose client cancels ends at the next step (with what it generated so far, stop reason
/// Cancelled), not once the stream beside it has finished; its slot is idle and empty again, and the other
/// stream's reply is unchanged.
#[test]
fn a_preempted_stream_ends_at_its_clients_cancel_without_waiting_to_resume() {
    use strata::engine::batch::Progress;
    use strata::engine::{Generation, Observer, StopReason};
    struct Cancel(bool);
    impl Observer for Cancel {
        fn on_text(&mut self, _: &str, _: &Generation) {}
        fn cancelled(&mut self) -> bool {
            self.0
        }
    }
    let file = Arc::new(GgufFile::open(&common::model_path()).expect("model"));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let pool = ThreadPool::new(2);
    let kinds = [DeviceKind::Sim { capacity_bytes: 400 * MIB }, DeviceKind::Sim { capacity_bytes: 400 * MIB }];
    let devices = DeviceSet::from_kinds(&kinds, 16 * MIB).expect("sims");
    let sims = devices.devices.clone();
    let opts = LoadOptions { devices, split: Some(vec![15]), ..Default::default() };
    let model = Model::from_file_with(file, &opts).expect("model");
    let cfg = SessionConfig { kv_type: KvType::F16, max_context: 4096, cache_slots: 0, cache_budget_bytes: 0 };
    let mut session = Session::new(&model, &tok, &pool, &cfg).expect("session").with_parallel(2, &cfg).expect("2");
    let params =
        GenerateParams { max_tokens: 150, sampler: SamplerConfig::greedy(), ignore_eos: true, ..Default::default() };
    let prompts = [tok.encode("Write a long story about a dragon.", false), tok.encode("List the planets.", false)];
    let mut seq = Sequence::new(&model, KvType::F16, 4096).expect("seq");
    let alone = generate(&model, &tok, &pool, &mut seq, Request::new(&prompts[0], &params), &mut Quiet).expect("alone");

    let mut begun: Vec<_> = prompts.iter().map(|p| session.begin(p, &params).expect("slot").expect("starts")).collect();
    let mut obs = [Cancel(false), Cancel(false)];
    let mut done: Vec<Option<Generation>> = vec![None, None];
    let mut steps_after_cancel = None;
    for step in 0.. {
        assert!(step < 1000, "the streams end");
        if step == 3 {
            sims[0].inject(Fault::FailAllocs(1)).expect("fault");
        }
        if session.preemptions == 1 && steps_after_cancel.is_none() {
            // The newest (the second) was preempted: its client leaves.
            obs[1].0 = true;
            steps_after_cancel = Some(0);
        }
        let live: Vec<usize> = (0..2).filter(|&i| done[i].is_none()).collect();
        if live.is_empty() {
            break;
        }
        let mut running: Vec<(usize, &mut strata::engine::batch::Stream, &mut dyn Observer)> = Vec::new();
        for (i, (b, o)) in begun.iter_mut().zip(obs.iter_mut()).enumerate() {
            if done[i].is_none() {
                running.push((b.slot, &mut b.stream, o));
            }
        }
        let progress = session.step(&mut running, 512);
        drop(running);
        if let Some(n) = steps_after_cancel.as_mut() {
            *n += 1;
        }
        for (i, p) in live.into_iter().zip(progress) {
            if let Progress::Done(r) = p {
                let g = r.expect("no stream fails");
                session.end(begun[i].slot, prompts[i].len(), Some(&g));
                if i == 1 {
                    assert_eq!(steps_after_cancel, Some(1), "the cancelled stream ends at the next step");
                    assert!(done[0].is_none(), "it did not wait for the other stream to end");
                    assert_eq!(g.stop_reason, StopReason::Cancelled);
                    assert_eq!(session.busy_slots(), 1);
                    assert_eq!(session.suspended_slots(), 0);
                }
                done[i] = Some(g);
            }
        }
    }
    assert_eq!(session.preemptions, 1);
    assert_eq!(done[0].as_ref().expect("first").tokens, alone.tokens, "the other reply is unchanged");
    assert!(done[1].as_ref().expect("second").tokens.len() < 150, "the cancelled reply stopped early");
}
