//! `strata chat`: a conversation with the model's own chat template, interactive or one turn.
//!
//! The live sequence stays between turns, and each reply goes back into the conversation as the tokens it
//! was generated as, so each turn reads only what the template added since the last one (the engine
//! reuses the common prefix).

use std::io::{IsTerminal, Write};

use anyhow::{bail, Context};
use clap::Args;

use strata::engine::{generate_with, GenerateParams, Sequence, TextOnly};
use strata::sample::defaults::SamplingDefaults;
use strata::tokenizer::turns::{encode_chat, tokens_of_text, ReplyTokens};
use strata::tokenizer::{ChatMessage, ChatTemplate};

use super::input::{read_line_capped, CHAT_LINE_CAP_BYTES};
use super::{load, EngineArgs, ModelArgs, SamplingArgs};

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
    let mut seq = Sequence::new(&loaded.model, a.engine.kv, context)?;
    let spec = super::load_spec(&a.engine, &loaded)?;
    let mut drafter = spec.as_ref().map(|s| s.drafter(a.engine.kv, context, loaded.model.cfg.n_vocab)).transpose()?;
    let mut history: Vec<ChatMessage> = Vec::new();
    let mut replies = ReplyTokens::default();
    if let Some(s) = &a.system {
        history.push(ChatMessage { role: "system".into(), content: s.clone() });
    }
    let params = GenerateParams {
        max_tokens: a.n_predict as usize,
        sampler,
        ignore_eos: false,
        stop: a.sampling.stop.clone(),
        top_logprobs: 0,
        logprobs: false,
        batch: a.engine.batch as usize,
    };
    let interactive = a.message.is_none() && std::io::stdin().is_terminal();
    if interactive {
        eprintln!("strata chat: {} (Ctrl-D to quit, /reset to start over)", loaded.path.display());
    }
    let mut one = a.message.clone();
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    loop {
        let user = match one.take() {
            Some(m) => m,
            None if a.message.is_some() => break,
            None => {
                if interactive {
                    eprint!("> ");
                    let _ = std::io::stderr().flush();
                }
                match read_line_capped(&mut input, CHAT_LINE_CAP_BYTES, "standard input")? {
                    Some(line) => line,
                    None => break,
                }
            }
        };
        if user.trim() == "/reset" {
            history.retain(|m| m.role == "system");
            seq.clear();
            continue;
        }
        if user.trim().is_empty() {
            continue;
        }
        history.push(ChatMessage { role: "user".into(), content: user });
        let prompt = match encode_chat(&template, &loaded.tokenizer, &history, |t| replies.get(t)) {
            Ok(p) => p.tokens,
            Err(e) => {
                history.pop();
                return Err(e.into());
            }
        };
        let stdout = std::io::stdout();
        let mut show = TextOnly(|t: &str| {
            let mut o = stdout.lock();
            let _ = o.write_all(t.as_bytes());
            let _ = o.flush();
        });
        let g = generate_with(
            &loaded.model,
            &loaded.tokenizer,
            &pool,
            &mut seq,
            &prompt,
            &params,
            &mut show,
            drafter.as_mut(),
        );
        let g = match g {
            Ok(g) => g,
            Err(e) => {
                // The conversation survives a failed turn: drop the message and report.
                history.pop();
                let fatal = matches!(&e, strata::engine::EngineError::Model(strata::model::ModelError::Device(d)) if d.is_fatal());
                if a.message.is_some() || fatal {
                    return Err(e).context("generation failed");
                }
                eprintln!("strata: error: {e}");
                if matches!(e, strata::engine::EngineError::Model(strata::model::ModelError::ContextOverflow { .. })) {
                    eprintln!("strata: the conversation no longer fits the context: type /reset to start over");
                }
                continue;
            }
        };
        println!();
        if g.stop_reason == strata::engine::StopReason::Context {
            eprintln!("strata: the reply stopped at the end of the context (-c); type /reset to start over");
        }
        // The reply as generated, text and tokens: the next turn reuses every one of its tokens.
        if let Some(t) = tokens_of_text(&loaded.tokenizer, &g.tokens, &g.text) {
            replies.remember(&g.text, t);
        }
        history.push(ChatMessage { role: "assistant".into(), content: g.text });
    }
    Ok(())
}
