//! `strata chat`: a conversation with the model's own chat template, interactive or one turn.
//!
//! The live sequence stays between turns, and each reply goes back into the conversation as the tokens it
//! was generated as, so each turn reads only what the template added since the last one (the engine
//! reuses the common prefix). A reply's `<think>` block (Qwen3, DeepSeek-R1) goes to standard error,
//! dimmed on a terminal, and the answer to standard output, so a piped answer is the answer alone; the
//! conversation keeps the reply whole, as the model wrote it (the template decides what goes back).

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{bail, Context};
use clap::Args;

use strata::engine::spec::Drafter;
use strata::engine::{generate, EngineError, GenerateParams, Generation, Request, Sequence, StopReason, TextOnly};
use strata::model::ModelError;
use strata::sample::defaults::SamplingDefaults;
use strata::sample::SamplerConfig;
use strata::threadpool::ThreadPool;
use strata::tokenizer::reasoning::{ReasoningSplitter, ReplyFormat, Split};
use strata::tokenizer::turns::{encode_chat, tokens_of_text, ReplyTokens};
use strata::tokenizer::{ChatMessage, ChatTemplate};

use super::input::{read_line_capped, CHAT_LINE_CAP_BYTES};
use super::{load, EngineArgs, Loaded, ModelArgs, SamplingArgs};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Send this one message, print the reply and exit
    #[arg(long = "message")]
    pub message: Option<String>,
    /// A system message at the start of the conversation
    #[arg(long = "system")]
    pub system: Option<String>,
    /// Most tokens per reply
    #[arg(short = 'n', long = "n-predict", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub n_predict: u32,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Runs the conversation: one turn for --message, else one turn per line of standard input until its end.
pub fn main(a: ChatArgs) -> anyhow::Result<()> {
    a.sampling.check()?;
    if a.message.as_deref().is_some_and(|m| m.trim().is_empty()) {
        bail!("--message is empty: give the text to send");
    }
    let loaded = load(&a.model, &a.engine)?;
    let defaults = SamplingDefaults::of(&loaded.model.file);
    let sampler = a.sampling.config(&defaults)?;
    tracing::debug!("sampling defaults: {}", defaults.describe());
    let template = ChatTemplate::from_gguf(&loaded.model.file).context("cannot read the chat template")?;
    let pool = a.engine.pool();
    let context = a.engine.context(&loaded.model);
    let seq = Sequence::new(&loaded.model, a.engine.kv, context)?;
    let spec = super::load_spec(&a.engine, &loaded)?;
    let drafter = spec.as_ref().map(|s| s.drafter(a.engine.kv, context, loaded.model.cfg.n_vocab)).transpose()?;
    let system = a.system.iter().map(|s| ChatMessage::new("system", s.clone()));
    let mut chat = Chat {
        loaded: &loaded,
        template,
        pool,
        seq,
        drafter,
        params: generate_params(&a, sampler),
        history: system.collect(),
        replies: ReplyTokens::default(),
        one_turn: a.message.is_some(),
    };
    let interactive = a.message.is_none() && std::io::stdin().is_terminal();
    if interactive {
        eprintln!("strata chat: {} (Ctrl-D to quit, /reset to start over)", loaded.path.display());
    }
    let mut one = a.message.clone();
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    while let Some(user) = next_message(&mut one, chat.one_turn, interactive, &mut input)? {
        chat.turn(user)?;
    }
    Ok(())
}

/// How each reply is generated: up to `-n` tokens, sampled and stopped as the flags say.
fn generate_params(a: &ChatArgs, sampler: SamplerConfig) -> GenerateParams {
    GenerateParams {
        max_tokens: a.n_predict as usize,
        sampler,
        ignore_eos: false,
        stop: a.sampling.stop.clone(),
        top_logprobs: 0,
        logprobs: false,
        post_sampling: false,
        batch: a.engine.batch as usize,
        grammar: None,
    }
}

/// The user's next message: --message's the first time (`one_turn`), then none; else the next line of
/// `input` (none at its end), after a prompt on the terminal when `interactive`.
fn next_message(
    one: &mut Option<String>,
    one_turn: bool,
    interactive: bool,
    input: &mut impl BufRead,
) -> anyhow::Result<Option<String>> {
    if one_turn {
        return Ok(one.take());
    }
    if interactive {
        eprint!("> ");
        let _ = std::io::stderr().flush();
    }
    read_line_capped(input, CHAT_LINE_CAP_BYTES, "standard input")
}

/// A conversation in progress: the live sequence, the messages so far and the tokens each reply was
/// generated as.
struct Chat<'a> {
    loaded: &'a Loaded,
    template: ChatTemplate,
    pool: ThreadPool,
    seq: Sequence,
    drafter: Option<Drafter<'a>>,
    params: GenerateParams,
    history: Vec<ChatMessage>,
    replies: ReplyTokens,
    /// --message: one turn, and a failed generation ends the chat.
    one_turn: bool,
}

impl Chat<'_> {
    /// One turn for `user`'s line: `/reset` starts over, a blank line is skipped, a message gets a reply
    /// streamed to standard output.
    fn turn(&mut self, user: String) -> anyhow::Result<()> {
        if user.trim() == "/reset" {
            self.history.retain(|m| m.role == "system");
            self.seq.clear();
            return Ok(());
        }
        if user.trim().is_empty() {
            return Ok(());
        }
        self.history.push(ChatMessage::new("user", user));
        let (prompt, format) =
            match encode_chat(&self.template, &self.loaded.tokenizer, &self.history, |t| self.replies.get(t)) {
                Ok(p) => (p.tokens, p.format),
                Err(e) => {
                    self.history.pop();
                    return Err(e.into());
                }
            };
        match self.generate(&prompt, format) {
            Ok(g) => self.keep_reply(g),
            Err(e) => self.failed_turn(e)?,
        }
        Ok(())
    }

    /// Generates the reply to `prompt`, its text streamed as it comes: the reasoning to standard error, the
    /// answer to standard output (`format`: a `<think>` block, opened by the prompt or not, or harmony).
    fn generate(&mut self, prompt: &[u32], format: ReplyFormat) -> Result<Generation, EngineError> {
        let mut printer = ReplyPrinter::new(format);
        let g = {
            let mut show = TextOnly(|t: &str| printer.piece(t));
            let req = Request::new(prompt, &self.params).drafting(self.drafter.as_mut());
            generate(&self.loaded.model, &self.loaded.tokenizer, &self.pool, &mut self.seq, req, &mut show)
        };
        printer.finish();
        g
    }

    /// Drops the message whose reply failed, then ends the chat (--message, or a fatal device error) or
    /// reports the error so that the conversation goes on.
    fn failed_turn(&mut self, e: EngineError) -> anyhow::Result<()> {
        // The conversation survives a failed turn: drop the message and report.
        self.history.pop();
        let fatal = matches!(&e, EngineError::Model(ModelError::Device(d)) if d.is_fatal());
        if self.one_turn || fatal {
            return Err(e).context("generation failed");
        }
        eprintln!("strata: error: {e}");
        if matches!(e, EngineError::Model(ModelError::ContextOverflow { .. })) {
            eprintln!("strata: the conversation no longer fits the context: type /reset to start over");
        }
        Ok(())
    }

    /// Ends the reply's line and adds the reply to the conversation.
    fn keep_reply(&mut self, g: Generation) {
        println!();
        if g.stop_reason == StopReason::Context {
            eprintln!("strata: the reply stopped at the end of the context (-c); type /reset to start over");
        }
        // The reply as generated, text and tokens: the next turn reuses every one of its tokens.
        if let Some(t) = tokens_of_text(&self.loaded.tokenizer, &g.tokens, &g.text) {
            self.replies.remember(&g.text, t);
        }
        self.history.push(ChatMessage::new("assistant", g.text));
    }
}

/// Prints a streamed reply: its reasoning to standard error (dimmed when that is a terminal, and ended with
/// a line break), its answer to standard output.
struct ReplyPrinter {
    split: ReasoningSplitter,
    dim: bool,
    /// Reasoning was printed and its line not yet ended.
    reasoning_open: bool,
}

impl ReplyPrinter {
    fn new(format: ReplyFormat) -> ReplyPrinter {
        ReplyPrinter {
            split: ReasoningSplitter::new(format),
            dim: std::io::stderr().is_terminal(),
            reasoning_open: false,
        }
    }

    fn piece(&mut self, text: &str) {
        let s = self.split.push(text);
        self.print(s);
    }

    fn finish(&mut self) {
        let s = self.split.finish();
        self.print(s);
        self.end_reasoning();
    }

    fn print(&mut self, s: Split) {
        if !s.reasoning.is_empty() {
            let mut e = std::io::stderr().lock();
            let _ = if self.dim { write!(e, "\x1b[2m{}\x1b[0m", s.reasoning) } else { write!(e, "{}", s.reasoning) };
            let _ = e.flush();
            self.reasoning_open = true;
        }
        if !s.content.is_empty() {
            self.end_reasoning();
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(s.content.as_bytes());
            let _ = o.flush();
        }
    }

    fn end_reasoning(&mut self) {
        if std::mem::take(&mut self.reasoning_open) {
            eprintln!();
        }
    }
}
