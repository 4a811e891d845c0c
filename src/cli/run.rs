//! `strata run`: one raw prompt, one continuation, as text or as one JSON object.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use strata::device::{DeviceSet, Purpose};
use strata::engine::{generate, GenerateParams, Request, Sequence, StopReason, TextOnly};
use strata::grammar::{GrammarSpec, Grammars};
use strata::sample::defaults::SamplingDefaults;

use super::{load, load_spec, tokenize_prompt, EngineArgs, ModelArgs, SamplingArgs};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt, sent raw (special tokens such as <|im_start|> are parsed)
    #[arg(short = 'p', long = "prompt")]
    pub prompt: String,
    /// Most tokens to generate
    #[arg(short = 'n', long = "n-predict", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub n_predict: u32,
    /// Do not stop at end-of-generation tokens (they are never sampled)
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Print one JSON object: {"text", "tokens", "prompt_tokens", "top_logprobs", "devices", ...}
    #[arg(long = "json")]
    pub json: bool,
    /// With --json: the K most likely tokens and their log-probabilities at every step
    #[arg(long = "top-logprobs", value_name = "K", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub top_logprobs: u16,
    /// The output follows this GBNF grammar (llama.cpp's format: a `root` rule)
    #[arg(long = "grammar", value_name = "GBNF", conflicts_with_all = ["grammar_file", "json_schema"])]
    pub grammar: Option<String>,
    /// The output follows the GBNF grammar in this file
    #[arg(long = "grammar-file", value_name = "PATH", conflicts_with = "json_schema")]
    pub grammar_file: Option<std::path::PathBuf>,
    /// The output is JSON valid under this schema (`{}`: any JSON value)
    #[arg(short = 'j', long = "json-schema", value_name = "SCHEMA")]
    pub json_schema: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl RunArgs {
    /// The grammar the flags ask for, if any.
    fn grammar_spec(&self) -> anyhow::Result<Option<GrammarSpec>> {
        if let Some(g) = &self.grammar {
            return Ok(Some(GrammarSpec::Gbnf(g.clone())));
        }
        if let Some(path) = &self.grammar_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--grammar-file {}: cannot read it", path.display()))?;
            return Ok(Some(GrammarSpec::Gbnf(text)));
        }
        match &self.json_schema {
            None => Ok(None),
            Some(s) => {
                let v: serde_json::Value = serde_json::from_str(s).context("--json-schema is not JSON")?;
                anyhow::ensure!(v.is_object(), "--json-schema must be a JSON object (a schema), got {s}");
                Ok(Some(GrammarSpec::JsonSchema(v)))
            }
        }
    }
}

pub fn main(a: RunArgs) -> anyhow::Result<()> {
    a.sampling.check()?;
    let loaded = load(&a.model, &a.engine)?;
    let sampler = a.sampling.config(&SamplingDefaults::of(&loaded.model.file))?;
    let pool = a.engine.pool();
    let prompt = tokenize_prompt(&loaded.tokenizer, &a.prompt);
    let context = a.engine.context(&loaded.model);
    let mut seq = Sequence::new(&loaded.model, a.engine.kv, context)?;
    let spec = load_spec(&a.engine, &loaded)?;
    let mut drafter = spec.as_ref().map(|s| s.drafter(a.engine.kv, context, loaded.model.cfg.n_vocab)).transpose()?;
    let tokenizer = Arc::new(loaded.tokenizer);
    let grammar = match a.grammar_spec()? {
        Some(spec) => Some(Grammars::new(tokenizer.clone()).compile(&spec).context("the output grammar")?),
        None => None,
    };
    let params = GenerateParams {
        max_tokens: a.n_predict as usize,
        sampler,
        ignore_eos: a.ignore_eos,
        stop: a.sampling.stop.clone(),
        // Only --json prints them; without it they would be computed for nothing.
        top_logprobs: if a.json { a.top_logprobs as usize } else { 0 },
        logprobs: false,
        post_sampling: false,
        batch: a.engine.batch as usize,
        grammar,
    };
    let stdout = std::io::stdout();
    let json = a.json;
    let mut show = TextOnly(|text: &str| {
        if !json {
            let mut out = stdout.lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
    });
    let req = Request::new(&prompt, &params).drafting(drafter.as_mut());
    let g = generate(&loaded.model, &tokenizer, &pool, &mut seq, req, &mut show).context("generation failed")?;
    if json {
        let obj = serde_json::json!({
            "text": g.text,
            "tokens": g.tokens,
            "prompt_tokens": g.prompt_tokens,
            "top_logprobs": g.top_logprobs,
            "stop_reason": g.stop_reason,
            "prompt_ms": g.prompt_ms,
            "gen_ms": g.gen_ms,
            "drafts_proposed": g.drafts_proposed,
            "drafts_accepted": g.drafts_accepted,
            // Read while the sequence still holds its KV.
            "devices": devices_json(&loaded.model.placement.devices),
        });
        println!("{obj}");
    } else {
        println!();
        if g.stop_reason == StopReason::Context {
            eprintln!(
                "strata: stopped: the context is full ({} positions, -c): the prompt took {} of them",
                seq.kv.max_tokens, g.prompt_tokens
            );
        }
        eprintln!(
            "strata: prompt {} tokens in {:.0} ms ({:.1} tok/s), {} generated in {:.0} ms ({:.1} tok/s), drafts accepted {} of {}",
            g.prompt_tokens,
            g.prompt_ms,
            g.prompt_tokens as f64 / (g.prompt_ms / 1e3),
            g.tokens.len(),
            g.gen_ms,
            g.tokens.len() as f64 / (g.gen_ms / 1e3).max(1e-9),
            g.drafts_accepted,
            g.drafts_proposed,
        );
    }
    Ok(())
}

/// Each device's ledger (the host included): what it holds now by purpose, its high-water mark and the
/// copies into it.
fn devices_json(devices: &DeviceSet) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = devices
        .all()
        .iter()
        .map(|d| {
            let u = d.usage();
            serde_json::json!({
                "device": d.name(),
                "total_bytes": d.total_bytes(),
                "weights_bytes": u.bytes(Purpose::Weights),
                "kv_bytes": u.bytes(Purpose::Kv),
                "scratch_bytes": u.bytes(Purpose::Scratch),
                "staging_bytes": u.bytes(Purpose::Staging),
                "high_water_bytes": u.high_water_bytes,
                "copies_in": u.copies_in,
                "copied_in_bytes": u.copied_in_bytes,
            })
        })
        .collect();
    serde_json::Value::Array(entries)
}
