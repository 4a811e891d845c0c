//! `strata replay SCRIPT.jsonl`: a scripted workload of several conversations and device faults, run
//! deterministically (greedy sampling) through one engine session with its conversation cache, printing the
//! story as JSON lines on stdout: every engine event (parked, restored, restore_fallback, sample_failed,
//! evicted, ...) as the session emits it, every fault applied, and every response. It reproduces a user's
//! report on a machine without their GPUs (`--devices sim:...`), and its output can be compared with the
//! same script run without the cache (`--conversation-cache-slots 0`): the tokens must not change.
//!
//! The script has one JSON object per line; blank lines and lines starting with `#` are skipped:
//!
//! ```text
//! {"op":"chat","conversation":"a","user":"text","max_tokens":32}   a user turn in conversation a (created on
//!                                                                  first use); its whole history is rendered
//!                                                                  with the chat template and served; the reply
//!                                                                  joins the history (max_tokens: default 128)
//! {"op":"together","chats":[{"conversation":"b","user":"text","max_tokens":200},
//!                            {"conversation":"a","user":"text"}]}  turns of different conversations served at
//!                                                                  once (continuous batching, --parallel N at
//!                                                                  least the count): each starts in order, all
//!                                                                  step together; responses in the listed order
//! {"op":"fork","from":"a","to":"a2","drop_last":2}                 a2 starts as a copy of a's history without
//!                                                                  its last drop_last messages (an edited turn)
//! {"op":"pressure","device":1,"mib":300}                           another process holds 300 MiB of device 1
//!                                                                  (replaces the previous amount; 0 lifts it)
//! {"op":"pressure","device":1,"leave_free_mib":40}                 ... or whatever leaves 40 MiB free now
//! {"op":"fail_samples","device":1,"count":1}                       the next free-memory samples of device 1 fail
//! {"op":"fail_alloc","device":1,"count":1}                         the next allocations on device 1 fail
//! ```
//!
//! Devices are numbered in `--devices` order and only `sim` devices take faults. A script is at most 64 MiB.
//! The whole script is checked
//! before anything runs: a bad line is one error naming the line and why. Output lines carry the script line
//! that caused them: `{"event":"response","line":3,"conversation":"a","tokens":[...],"text":"...","reused":0,
//! "read":812,"restored":null,...}`; a failed serve prints `{"event":"error",...}` (the user's turn is dropped
//! from the history) and the script goes on.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use serde::Deserialize;
use serde_json::json;

use strata::device::{Device, DeviceSet, Fault};
use strata::engine::batch::{Progress, Stream};
use strata::engine::session::{Begun, Served, Session, SessionConfig};
use strata::engine::{EngineError, GenerateParams, Observer, Quiet};
use strata::sample::SamplerConfig;
use strata::telemetry::Entry;
use strata::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

use super::{load, one_line, tokenize_prompt_templated, EngineArgs, ModelArgs};

const MIB: u64 = 1 << 20;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The script: one JSON operation per line (chat, fork, pressure, fail_samples, fail_alloc)
    #[arg(value_name = "SCRIPT.jsonl")]
    pub script: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Live sequences (`strata serve --parallel`): what "together" lines need; chat lines take the first
    #[arg(long = "parallel", visible_alias = "np", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: u32,
    #[command(flatten)]
    pub cache: super::CacheArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

fn default_max_tokens() -> usize {
    128
}

/// One script line.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Op {
    Chat {
        conversation: String,
        user: String,
        #[serde(default = "default_max_tokens")]
        max_tokens: usize,
    },
    Together {
        chats: Vec<Turn>,
    },
    Fork {
        from: String,
        to: String,
        #[serde(default)]
        drop_last: usize,
    },
    Pressure {
        device: usize,
        mib: Option<u64>,
        leave_free_mib: Option<u64>,
    },
    FailSamples {
        device: usize,
        count: u32,
    },
    FailAlloc {
        device: usize,
        count: u32,
    },
}

/// One turn of a `together` line.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Turn {
    conversation: String,
    user: String,
    #[serde(default = "default_max_tokens")]
    max_tokens: usize,
}

impl Op {
    /// The device a fault op aims at.
    fn device(&self) -> Option<usize> {
        match self {
            Op::Pressure { device, .. } | Op::FailSamples { device, .. } | Op::FailAlloc { device, .. } => {
                Some(*device)
            }
            Op::Chat { .. } | Op::Together { .. } | Op::Fork { .. } => None,
        }
    }
}

/// Parses the script: (line number, op) for every line that is not blank or a comment (a UTF-8 byte-order
/// mark at the start is skipped). Checks what needs no model: the JSON (errors name the line and the column
/// in it), the ops and their fields, pressure given one way, forks of known conversations that drop no more
/// messages than the conversation has by then (each chat adds the user's message and the reply).
fn parse_script(text: &str) -> anyhow::Result<Vec<(usize, Op)>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut ops = Vec::new();
    // Messages of each conversation so far, if every turn is served.
    let mut conversations: HashMap<String, usize> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let op: Op = serde_json::from_str(line).map_err(|e| {
            // serde's position is within the trimmed line; give it within the line as written.
            let column = e.column() + (raw.len() - raw.trim_start().len());
            let what = e.to_string();
            let what = what.split(" at line ").next().unwrap_or(&what).to_owned();
            anyhow::anyhow!("line {n}, column {column}: {what}")
        })?;
        match &op {
            Op::Chat { conversation, .. } => {
                *conversations.entry(conversation.clone()).or_default() += 2;
            }
            Op::Together { chats } => {
                if chats.is_empty() {
                    bail!("line {n}: together has no chats");
                }
                for (i, t) in chats.iter().enumerate() {
                    if chats[..i].iter().any(|o| o.conversation == t.conversation) {
                        bail!(
                            "line {n}: together has two turns of conversation {:?} (the second would follow the first's reply)",
                            t.conversation
                        );
                    }
                    *conversations.entry(t.conversation.clone()).or_default() += 2;
                }
            }
            Op::Fork { from, to, drop_last } => {
                let Some(&have) = conversations.get(from) else {
                    bail!("line {n}: fork from {from:?}, a conversation no earlier line chats in");
                };
                if *drop_last > have {
                    bail!("line {n}: fork drops {drop_last} messages but conversation {from:?} has {have} by then");
                }
                conversations.insert(to.clone(), have - drop_last);
            }
            Op::Pressure { mib, leave_free_mib, .. } => {
                if mib.is_some() == leave_free_mib.is_some() {
                    bail!("line {n}: pressure takes exactly one of \"mib\" and \"leave_free_mib\"");
                }
            }
            Op::FailSamples { .. } | Op::FailAlloc { .. } => {}
        }
        ops.push((n, op));
    }
    Ok(ops)
}

/// Checks that every together line has a live sequence for each of its turns.
fn check_parallel(ops: &[(usize, Op)], parallel: usize) -> anyhow::Result<()> {
    for (n, op) in ops {
        if let Op::Together { chats } = op {
            if chats.len() > parallel {
                bail!("line {n}: together runs {} turns at once but --parallel is {parallel}", chats.len());
            }
        }
    }
    Ok(())
}

/// Checks that every fault op names a GPU-like device (sim, emu, cuda) of `devices`.
fn check_devices(ops: &[(usize, Op)], devices: &DeviceSet) -> anyhow::Result<()> {
    for (n, op) in ops {
        let Some(d) = op.device() else { continue };
        let Some(device) = devices.devices.get(d) else {
            let names: Vec<String> = devices.devices.iter().map(|d| d.name()).collect();
            bail!("line {n}: device {d} is not in --devices ({})", names.join(", "));
        };
        if device.is_host() {
            bail!("line {n}: device {} is the host: only GPU-like devices (sim, emu, cuda) take faults", device.name());
        }
    }
    Ok(())
}

/// The fault a fault op applies: (device, fault, the fields of its output line).
fn fault_of(op: &Op) -> Option<(usize, Fault, serde_json::Value)> {
    Some(match *op {
        Op::Pressure { device, mib: Some(mib), .. } => (
            device,
            Fault::PressureBytes(mib.saturating_mul(MIB)),
            json!({"op": "pressure", "device": device, "mib": mib}),
        ),
        Op::Pressure { device, leave_free_mib: Some(m), .. } => (
            device,
            Fault::LeaveFreeBytes(m.saturating_mul(MIB)),
            json!({"op": "pressure", "device": device, "leave_free_mib": m}),
        ),
        Op::FailSamples { device, count } => {
            (device, Fault::FailSamples(count), json!({"op": "fail_samples", "device": device, "count": count}))
        }
        Op::FailAlloc { device, count } => {
            (device, Fault::FailAllocs(count), json!({"op": "fail_alloc", "device": device, "count": count}))
        }
        Op::Pressure { .. } | Op::Chat { .. } | Op::Together { .. } | Op::Fork { .. } => return None,
    })
}

/// Prints one output line: `{"event":..,"line":..,` then the other fields of `fields` (a JSON object).
fn emit(event: &str, line: usize, fields: serde_json::Value) {
    let mut text = format!("{{\"event\":{},\"line\":{line}", json!(event));
    if let serde_json::Value::Object(map) = fields {
        for (k, v) in map.iter().filter(|(k, _)| !matches!(k.as_str(), "event" | "line")) {
            text.push_str(&format!(",{}:{v}", json!(k)));
        }
    }
    text.push('}');
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// Prints every event the session emitted since the last drain, in order, tagged with the script line.
fn drain(events: &Receiver<Entry>, line: usize) {
    for entry in events.try_iter() {
        if let Entry::Event(e) = entry {
            let fields = serde_json::to_value(&e).unwrap_or(serde_json::Value::Null);
            emit(&e.event, line, fields);
        }
    }
}

/// Runs the script through one engine session, printing its story as JSON lines; a device fault stops it.
pub fn main(a: ReplayArgs) -> anyhow::Result<()> {
    let text = super::input::read_text_capped(&a.script, super::input::REPLAY_SCRIPT_CAP_BYTES, "script")?;
    let ops = parse_script(&text).with_context(|| format!("bad script {}", a.script.display()))?;
    let cache_budget_bytes = a.cache.budget_bytes()?;
    // Fault lines are checked against the devices before the model loads, together lines against
    // --parallel.
    check_devices(&ops, &a.engine.load_options()?.devices)
        .and_then(|()| check_parallel(&ops, a.parallel as usize))
        .with_context(|| format!("bad script {}", a.script.display()))?;

    let loaded = load(&a.model, &a.engine)?;
    let template = ChatTemplate::from_gguf(&loaded.model.file).context("cannot read the chat template")?;
    let pool = a.engine.pool();
    let cfg = SessionConfig {
        kv_type: a.engine.kv,
        max_context: a.engine.context(&loaded.model),
        cache_slots: a.cache.cache_slots,
        cache_budget_bytes,
    };
    let spec = super::load_spec(&a.engine, &loaded)?;
    let mut session = Session::new(&loaded.model, &loaded.tokenizer, &pool, &cfg)?;
    if let Some(s) = &spec {
        if a.parallel > 1 {
            bail!("--parallel {}: speculative decoding runs one sequence; drop one of the two", a.parallel);
        }
        session = session.with_drafter(s.drafter(cfg.kv_type, cfg.max_context, loaded.model.cfg.n_vocab)?);
    }
    let session = session.with_parallel(a.parallel as usize, &cfg)?;
    let mut replay = Replay {
        events: session.telemetry.subscribe(),
        session,
        template,
        tokenizer: &loaded.tokenizer,
        devices: &loaded.model.placement.devices.devices,
        histories: HashMap::new(),
        batch: a.engine.batch as usize,
    };
    for (line, op) in &ops {
        replay.step(*line, op)?;
    }
    Ok(())
}

/// A replay in progress: the session, the events it emits, and each conversation's messages so far.
struct Replay<'a> {
    session: Session<'a>,
    /// The session's telemetry, drained into the output after each step.
    events: Receiver<Entry>,
    template: ChatTemplate,
    tokenizer: &'a Tokenizer,
    /// The devices in `--devices` order, which fault ops name by index.
    devices: &'a [Arc<Device>],
    histories: HashMap<String, Vec<ChatMessage>>,
    /// `-b`: the batch prompts are read in.
    batch: usize,
}

impl Replay<'_> {
    /// Runs script line `line`: a chat turn, a fork or a fault.
    fn step(&mut self, line: usize, op: &Op) -> anyhow::Result<()> {
        match op {
            Op::Chat { conversation, user, max_tokens } => self.chat(line, conversation, user, *max_tokens),
            Op::Together { chats } => self.together(line, chats),
            Op::Fork { from, to, drop_last } => self.fork(line, from, to, *drop_last),
            Op::Pressure { .. } | Op::FailSamples { .. } | Op::FailAlloc { .. } => self.fault(line, op),
        }
    }

    /// Serves `user`'s turn in `conversation`, greedily: its response (the reply joins the history) or its
    /// error (the turn is dropped), after the events it caused; an error of a faulted device stops the replay.
    fn chat(&mut self, line: usize, conversation: &str, user: &str, max_tokens: usize) -> anyhow::Result<()> {
        let prompt = self.user_turn(line, conversation, user)?;
        let served = self.session.serve(&prompt, &self.params(max_tokens), &mut Quiet);
        drain(&self.events, line);
        self.answer(line, conversation, prompt.len(), served)
    }

    /// Adds `user`'s message to `conversation` (created on first use) and renders its whole history: the
    /// prompt.
    fn user_turn(&mut self, line: usize, conversation: &str, user: &str) -> anyhow::Result<Vec<u32>> {
        let history = self.histories.entry(conversation.to_owned()).or_default();
        history.push(ChatMessage::new("user", user));
        let rendered = self.template.render(history, true).with_context(|| format!("line {line}"))?;
        Ok(tokenize_prompt_templated(self.tokenizer, &rendered))
    }

    /// Greedy sampling, at most `max_tokens`, prompts read in batches of `-b`.
    fn params(&self, max_tokens: usize) -> GenerateParams {
        GenerateParams {
            max_tokens,
            sampler: SamplerConfig::greedy(),
            ignore_eos: false,
            stop: Vec::new(),
            top_logprobs: 0,
            logprobs: false,
            post_sampling: false,
            batch: self.batch,
            grammar: None,
        }
    }

    /// Prints a served turn's response (its reply joins the history) or its error (the user's message
    /// leaves it); an error of a faulted device stops the replay.
    fn answer(
        &mut self,
        line: usize,
        conversation: &str,
        prompt_tokens: usize,
        served: Result<Served, EngineError>,
    ) -> anyhow::Result<()> {
        let history = self.histories.entry(conversation.to_owned()).or_default();
        match served {
            Ok(s) => {
                history.push(ChatMessage::new("assistant", s.generation.text.trim()));
                emit("response", line, response_fields(conversation, prompt_tokens, &s));
            }
            Err(e) => {
                history.pop();
                let e = anyhow::Error::from(e);
                emit("error", line, json!({"conversation": conversation, "error": one_line(&e)}));
                if super::device_fault(&e).is_some() {
                    // A faulted GPU computes nothing more: stop, and let main exit with its code.
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Serves the turns of a together line at once: each starts in order on a free live sequence (restored,
    /// fallen back or continued as a lone turn would be, the gate counting what the turns started before
    /// it will still take), then they step together until each is done. The events come as they happen;
    /// the responses (or errors) in the listed order.
    fn together(&mut self, line: usize, chats: &[Turn]) -> anyhow::Result<()> {
        let mut prompts = Vec::with_capacity(chats.len());
        for t in chats {
            prompts.push(self.user_turn(line, &t.conversation, &t.user)?);
        }
        let mut begun: Vec<Option<Begun>> = Vec::with_capacity(chats.len());
        let mut outcomes: Vec<Option<Result<Served, EngineError>>> = Vec::with_capacity(chats.len());
        for (t, prompt) in chats.iter().zip(&prompts) {
            let params = self.params(t.max_tokens);
            match self.session.begin(prompt, &params) {
                Some(Ok(b)) => {
                    begun.push(Some(b));
                    outcomes.push(None);
                }
                Some(Err(e)) => {
                    begun.push(None);
                    outcomes.push(Some(Err(e)));
                }
                // check_parallel vouched for the slots.
                None => bail!("line {line}: no free live sequence for conversation {:?}", t.conversation),
            }
        }
        drain(&self.events, line);
        let mut quiet: Vec<Quiet> = chats.iter().map(|_| Quiet).collect();
        loop {
            let mut running: Vec<(usize, &mut Stream, &mut dyn Observer)> = Vec::new();
            let mut which = Vec::new();
            for (i, (b, q)) in begun.iter_mut().zip(quiet.iter_mut()).enumerate() {
                if let Some(b) = b {
                    running.push((b.slot, &mut b.stream, q));
                    which.push(i);
                }
            }
            if running.is_empty() {
                break;
            }
            let progress = self.session.step(&mut running, self.batch);
            drop(running);
            for (i, p) in which.into_iter().zip(progress) {
                let Progress::Done(result) = p else { continue };
                let Some(b) = begun[i].take() else { continue };
                let prompt_len = prompts[i].len();
                outcomes[i] = Some(match result {
                    Ok(generation) => {
                        let (reused, read) = self.session.end(b.slot, prompt_len, Some(&generation));
                        let (restored, fallback) = (b.restored, b.fallback);
                        Ok(Served { generation, reused, read, restored, fallback, draft_read: None })
                    }
                    Err(e) => {
                        self.session.end(b.slot, prompt_len, None);
                        Err(e)
                    }
                });
            }
            drain(&self.events, line);
        }
        for ((t, prompt), outcome) in chats.iter().zip(&prompts).zip(outcomes) {
            let served = outcome.unwrap_or(Err(EngineError::Cancelled));
            self.answer(line, &t.conversation, prompt.len(), served)?;
        }
        Ok(())
    }

    /// Starts conversation `to` as a copy of `from` without its last `drop_last` messages.
    fn fork(&mut self, line: usize, from: &str, to: &str, drop_last: usize) -> anyhow::Result<()> {
        let source = self.histories.get(from).cloned().unwrap_or_default();
        if drop_last > source.len() {
            bail!("line {line}: fork drops {drop_last} messages but conversation {from:?} has {}", source.len());
        }
        let kept = source.len() - drop_last;
        self.histories.insert(to.to_owned(), source[..kept].to_vec());
        emit("fork", line, json!({"from": from, "to": to, "messages": kept}));
        Ok(())
    }

    /// Applies a fault op to its device, then prints it and the events it caused.
    fn fault(&self, line: usize, op: &Op) -> anyhow::Result<()> {
        // parse_script vouched for the fields, check_devices for the index and the kind.
        let (d, fault, fields) = fault_of(op).with_context(|| format!("line {line}: not a fault"))?;
        let device = self.devices.get(d).with_context(|| format!("line {line}: no device {d}"))?;
        device.inject(fault).with_context(|| format!("line {line}"))?;
        emit("fault", line, fields);
        drain(&self.events, line);
        Ok(())
    }
}

/// The fields of a response line: the reply, the prompt's `prompt_tokens` and what of them the session
/// reused, read or restored, the timings and the drafts.
fn response_fields(conversation: &str, prompt_tokens: usize, s: &Served) -> serde_json::Value {
    let g = &s.generation;
    json!({
        "conversation": conversation,
        "tokens": g.tokens,
        "text": g.text,
        "prompt_tokens": prompt_tokens,
        "reused": s.reused,
        "read": s.read,
        "restored": s.restored.map(|(kind, _)| kind),
        "restored_tokens": s.restored.map(|(_, n)| n),
        "prompt_ms": g.prompt_ms,
        "gen_ms": g.gen_ms,
        "drafts_proposed": g.drafts_proposed,
        "drafts_accepted": g.drafts_accepted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ops_and_names_the_bad_line() {
        let text = "# a comment\n\n{\"op\":\"chat\",\"conversation\":\"a\",\"user\":\"hi\"}\n\
                    {\"op\":\"pressure\",\"device\":1,\"leave_free_mib\":40}\n\
                    {\"op\":\"fork\",\"from\":\"a\",\"to\":\"b\",\"drop_last\":2}\n";
        let ops = parse_script(text).unwrap();
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[0], (3, Op::Chat { conversation: "a".into(), user: "hi".into(), max_tokens: 128 }));
        assert_eq!(ops[1], (4, Op::Pressure { device: 1, mib: None, leave_free_mib: Some(40) }));
        for (bad, why) in [
            ("{\"op\":\"explode\"}", "unknown variant"),
            ("{\"op\":\"chat\",\"conversation\":\"a\",\"user\":\"hi\",\"colour\":1}", "unknown field"),
            ("{\"op\":\"chat\",\"user\":\"hi\"}", "missing field"),
            ("{not json", "column 2: key must be a string"),
            ("  {not json", "column 4: key must be a string"),
            ("{\"op\":\"pressure\",\"device\":1}", "exactly one"),
            ("{\"op\":\"pressure\",\"device\":1,\"mib\":1,\"leave_free_mib\":1}", "exactly one"),
            ("{\"op\":\"fork\",\"from\":\"nobody\",\"to\":\"b\"}", "no earlier line"),
        ] {
            let e = parse_script(&format!("# first\n{bad}\n")).unwrap_err();
            let msg = one_line(&e);
            assert!(msg.starts_with("line 2"), "{msg}");
            assert!(msg.contains(why), "{why:?} not in {msg}");
        }
    }

    #[test]
    fn a_byte_order_mark_is_skipped_and_forks_are_checked_before_anything_runs() {
        let chat = "{\"op\":\"chat\",\"conversation\":\"a\",\"user\":\"hi\"}";
        let ops = parse_script(&format!("\u{feff}{chat}\n")).unwrap();
        assert_eq!(ops.len(), 1);
        let fork = |n: usize| format!("{{\"op\":\"fork\",\"from\":\"a\",\"to\":\"b\",\"drop_last\":{n}}}");
        assert_eq!(parse_script(&format!("{chat}\n{}\n", fork(2))).unwrap().len(), 2);
        let e = one_line(&parse_script(&format!("{chat}\n{}\n", fork(3))).unwrap_err());
        assert_eq!(e, "line 2: fork drops 3 messages but conversation \"a\" has 2 by then");
        // A fork of a fork counts what the first one kept.
        let text =
            format!("{chat}\n{chat}\n{}\n{{\"op\":\"fork\",\"from\":\"b\",\"to\":\"c\",\"drop_last\":4}}\n", fork(1));
        let e = one_line(&parse_script(&text).unwrap_err());
        assert!(e.starts_with("line 4: fork drops 4 messages but conversation \"b\" has 3"), "{e}");
    }

    #[test]
    fn together_lines_need_distinct_conversations_and_enough_sequences() {
        let t = |a: &str, b: &str| {
            format!(
                "{{\"op\":\"together\",\"chats\":[{{\"conversation\":\"{a}\",\"user\":\"hi\"}},{{\"conversation\":\"{b}\",\"user\":\"yo\",\"max_tokens\":5}}]}}"
            )
        };
        let ops = parse_script(&format!(
            "{}\n{{\"op\":\"fork\",\"from\":\"b\",\"to\":\"c\",\"drop_last\":2}}\n",
            t("a", "b")
        ))
        .unwrap();
        let Op::Together { chats } = &ops[0].1 else { panic!("{ops:?}") };
        assert_eq!(chats[1], Turn { conversation: "b".into(), user: "yo".into(), max_tokens: 5 });
        // Each turn adds two messages to its conversation, as a chat line does.
        assert_eq!(ops.len(), 2);
        check_parallel(&ops, 2).unwrap();
        let e = one_line(&check_parallel(&ops, 1).unwrap_err());
        assert_eq!(e, "line 1: together runs 2 turns at once but --parallel is 1");
        let e = one_line(&parse_script(&t("a", "a")).unwrap_err());
        assert!(e.starts_with("line 1: together has two turns of conversation \"a\""), "{e}");
        let e = one_line(&parse_script("{\"op\":\"together\",\"chats\":[]}").unwrap_err());
        assert_eq!(e, "line 1: together has no chats");
    }

    #[test]
    fn faults_need_a_gpu_like_device_in_the_list() {
        let devices = DeviceSet::parse("sim:100,cpu,emu:64", 0).unwrap();
        let ops = parse_script("{\"op\":\"pressure\",\"device\":2,\"mib\":1}\n").unwrap();
        check_devices(&ops, &devices).unwrap();
        let ops = parse_script("{\"op\":\"fail_alloc\",\"device\":0,\"count\":1}\n").unwrap();
        check_devices(&ops, &devices).unwrap();
        let ops = parse_script("{\"op\":\"fail_alloc\",\"device\":1,\"count\":1}\n").unwrap();
        assert!(one_line(&check_devices(&ops, &devices).unwrap_err()).contains("is the host"));
        let ops = parse_script("\n{\"op\":\"fail_samples\",\"device\":9,\"count\":1}\n").unwrap();
        let msg = one_line(&check_devices(&ops, &devices).unwrap_err());
        assert!(msg.starts_with("line 2: device 9 is not in --devices"), "{msg}");
    }
}
