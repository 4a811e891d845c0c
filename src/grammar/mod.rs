//! Constrained sampling: the output of a request kept inside a grammar (a JSON schema, any JSON object, a
//! GBNF or Lark grammar), by masking, before every draw, the tokens that could not continue it.
//!
//! It owns the translation of a request's constraint into a token mask and nothing else: the grammar
//! engine is llguidance (made for exactly this, and the one llama.cpp links: an Earley parser over a
//! derivative-based lexer, with the vocabulary in a trie so that a mask costs far less than a pass over the
//! vocabulary per token), fed with the model's own vocabulary ([`vocab`]). The sampler never sees a
//! grammar: it gets logits where every forbidden id is NaN, the mark it already treats as banned.
//!
//! A finished grammar allows only the end-of-generation tokens, so generation stops there, and text that a
//! grammar admits is whole: the output of a JSON schema always parses and validates, unless `max_tokens`
//! or the context cut it short (the finish reason then says `length`).

pub mod gbnf;
mod vocab;

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::tokenizer::Tokenizer;

/// What a request asks its output to be.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid under this schema (`response_format.json_schema.schema`, `json_schema`).
    JsonSchema(Value),
    /// llama.cpp's `grammar` field: GBNF with a `root` rule.
    Gbnf(String),
    /// llguidance's Lark-like syntax (a GBNF grammar whose text starts with `%llguidance`, as llama.cpp
    /// takes it, and the tool-call formats built here).
    Lark(String),
}

/// A constraint that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    #[error("{0}")]
    Gbnf(#[from] gbnf::GbnfError),
    /// The grammar engine refused the grammar or schema (unsupported keyword, bad regex, ...).
    #[error("{what}: {why}")]
    Invalid { what: &'static str, why: String },
    /// The grammar engine stopped with an error mid-generation (a limit of its own, an internal error).
    #[error("the output grammar failed while generating: {0}")]
    Engine(String),
}

impl GrammarSpec {
    fn what(&self) -> &'static str {
        match self {
            GrammarSpec::JsonObject => "json_object",
            GrammarSpec::JsonSchema(_) => "the JSON schema",
            GrammarSpec::Gbnf(_) => "the grammar",
            GrammarSpec::Lark(_) => "the Lark grammar",
        }
    }

    fn top_level(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(with_json_options(json!({"type": "object"}))),
            GrammarSpec::JsonSchema(schema) => TopLevelGrammar::from_json_schema(with_json_options(schema.clone())),
            GrammarSpec::Gbnf(text) => match text.trim_start().strip_prefix("%llguidance") {
                // llama.cpp's marker for a grammar in llguidance's own syntax: `%llguidance {}` then Lark.
                Some(rest) => {
                    let rest = rest.trim_start();
                    let lark = rest.strip_prefix("{}").unwrap_or(rest);
                    TopLevelGrammar::from_lark(lark.to_owned())
                }
                None => TopLevelGrammar::from_lark(gbnf::to_lark(text)?),
            },
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        })
    }
}

/// Whitespace allowed between JSON tokens, llama.cpp's rule: nothing, one space, or a newline with up to 20
/// spaces or tabs of indentation. A model may indent as it likes, but cannot pile up blank lines (Gemma 3
/// 270M, allowed any run of whitespace, writes `\n  ` again and again before each key).
const JSON_WHITESPACE: &str = r"\x20|\x0A[\x20\x09]{0,20}";

/// The most digits a number may have after its point when its schema says nothing of `multipleOf`, and
/// the most before it ([`MAX_INTEGRAL_DIGITS`]) when it sets no bound. llama.cpp's schema grammars bound
/// numbers the same way (16 digits each side): a small model that starts `8.3333…` would otherwise write threes until
/// `max_tokens` and return JSON cut in half. Nine is the most the grammar engine's decimal arithmetic takes
/// (it counts in `u32`); it also means a number is written without an exponent.
pub const MAX_FRACTION_DIGITS: usize = 9;
/// 15 rather than llama.cpp's 16: the largest such bound a JSON reader keeps exactly in an `f64`.
pub const MAX_INTEGRAL_DIGITS: u32 = 15;

/// Applies `f` to `schema` and to every schema inside it.
fn for_each_schema(schema: &mut Value, f: &mut impl FnMut(&mut serde_json::Map<String, Value>)) {
    let Value::Object(map) = schema else { return };
    f(map);
    for (key, v) in map.iter_mut() {
        match key.as_str() {
            "properties" | "$defs" | "definitions" | "patternProperties" => {
                if let Value::Object(children) = v {
                    children.values_mut().for_each(|c| for_each_schema(c, f));
                }
            }
            "items" | "additionalProperties" | "not" | "contains" | "if" | "then" | "else" => for_each_schema(v, f),
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                if let Value::Array(list) = v {
                    list.iter_mut().for_each(|c| for_each_schema(c, f));
                }
            }
            _ => {}
        }
    }
}

/// Closes an object schema that lists `properties` and says nothing of `additionalProperties`: the output
/// has the properties the schema names and no others, as llama.cpp's schema grammars and OpenAI's strict
/// mode give it (JSON Schema itself would allow any extra key, and small models add junk ones).
fn close_object(map: &mut serde_json::Map<String, Value>) {
    if map.contains_key("properties") && !map.contains_key("additionalProperties") {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
}

/// Bounds the digits of a `number` or `integer` schema (see [`MAX_FRACTION_DIGITS`]) where its own
/// bounds leave them open, and never so as to exclude a value its own bounds, `const` or `enum` name. The
/// output still validates against the schema as the request sent it.
fn bound_number(map: &mut serde_json::Map<String, Value>) {
    // A constant or a list of values is already bounded, and may hold a number past the bounds.
    if map.contains_key("const") || map.contains_key("enum") {
        return;
    }
    let is = |t: &str| match map.get("type") {
        Some(Value::String(s)) => s == t,
        Some(Value::Array(list)) => list.iter().any(|v| v == t),
        _ => false,
    };
    let (number, integer) = (is("number"), is("integer"));
    if !(number || integer) {
        return;
    }
    let limit = 10i64.pow(MAX_INTEGRAL_DIGITS) - 1;
    let bound = |keys: [&str; 2]| keys.iter().filter_map(|k| map.get(*k).and_then(Value::as_f64)).next();
    let (low, high) = (bound(["minimum", "exclusiveMinimum"]), bound(["maximum", "exclusiveMaximum"]));
    // A bound the schema sets is kept; the other side is bounded only where that leaves room (a schema
    // whose minimum is past the limit keeps its open maximum).
    if low.is_none() && high.is_none_or(|h| h >= -(limit as f64)) {
        map.insert("minimum".into(), json!(-limit));
    }
    if high.is_none() && low.is_none_or(|l| l <= limit as f64) {
        map.insert("maximum".into(), json!(limit));
    }
    // The fraction too, unless a bound of the schema's own needs more digits than that.
    let scale = 10f64.powi(MAX_FRACTION_DIGITS as i32);
    let whole_at_scale = |v: f64| ((v * scale).round() - v * scale).abs() <= (v * scale).abs() * 1e-12 + 1e-6;
    let bounds_fit = low.into_iter().chain(high).all(|v| v.abs() < limit as f64 && whole_at_scale(v));
    if number && !integer && bounds_fit && !map.contains_key("multipleOf") {
        map.insert("multipleOf".into(), json!(10f64.powi(-(MAX_FRACTION_DIGITS as i32))));
    }
}

/// `schema` with the JSON options above, unless it sets llguidance's own (`x-guidance`), its objects
/// closed ([`close_object`]) and its numbers bounded ([`bound_number`]).
pub fn with_json_options(mut schema: Value) -> Value {
    for_each_schema(&mut schema, &mut |map| {
        close_object(map);
        bound_number(map);
    });
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(|| json!({ "whitespace_pattern": JSON_WHITESPACE }));
    }
    schema
}

/// The grammar engine for one model's vocabulary: its trie and the precomputed token classes, built once
/// (on first use: tens of milliseconds for a large vocabulary) and shared by every request.
pub struct Grammars {
    tokenizer: Arc<Tokenizer>,
    factory: OnceLock<Result<ParserFactory, String>>,
}

impl Grammars {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Grammars {
        Grammars { tokenizer, factory: OnceLock::new() }
    }

    fn factory(&self) -> Result<&ParserFactory, GrammarError> {
        let made = self.factory.get_or_init(|| {
            let env = vocab::Vocab::new(self.tokenizer.clone()).env();
            let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            // Errors come back as values; nothing is written to stderr.
            f.set_stderr_log_level(0);
            Ok(f)
        });
        made.as_ref().map_err(|e| GrammarError::Invalid { what: "the model's vocabulary", why: e.clone() })
    }

    /// The constraint for `spec`, ready to mask the first token. The grammar is checked here: a bad one is
    /// an error for the request, before anything is queued.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        let factory = self.factory()?;
        let parser = factory
            .create_parser(spec.top_level()?)
            .map_err(|e| GrammarError::Invalid { what: spec.what(), why: first_line(&e.to_string()) })?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid { what: spec.what(), why: first_line(&e) });
        }
        // A grammar that admits nothing at all is refused now rather than at the first token.
        match matcher.compute_mask() {
            Ok(m) if m.num_set() == 0 => {
                return Err(GrammarError::Invalid { what: spec.what(), why: "it admits no output".into() })
            }
            Ok(_) => {}
            Err(e) => return Err(GrammarError::Invalid { what: spec.what(), why: first_line(&e.to_string()) }),
        }
        Ok(Constraint { matcher, n_vocab: self.tokenizer.n_vocab() })
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).chars().take(400).collect()
}

/// One generation's grammar state: which tokens may come next, advanced by every token chosen.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    n_vocab: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("finished", &self.finished()).finish()
    }
}

impl Constraint {
    /// Writes NaN over the logit of every token the grammar does not allow next (ids past the vocabulary
    /// too). When the grammar is complete only the end-of-generation tokens stay.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let allowed =
            self.matcher.compute_mask_or_eos().map_err(|e| GrammarError::Engine(first_line(&e.to_string())))?;
        let n = logits.len().min(self.n_vocab);
        for (id, l) in logits[..n].iter_mut().enumerate() {
            if !allowed.is_allowed(id as u32) {
                *l = f32::NAN;
            }
        }
        logits[n..].fill(f32::NAN);
        Ok(())
    }

    /// Advances past `id`, which the last mask allowed.
    pub fn commit(&mut self, id: u32) -> Result<(), GrammarError> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher.consume_token(id).map_err(|e| GrammarError::Engine(first_line(&e.to_string())))
    }

    /// Whether the grammar admits nothing more: the output is complete.
    pub fn finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
