//! The sampling a request gets for the fields it does not send: one rule, used by every front end (the
//! server's endpoints, `strata chat` and `strata run`, the app). For each field, the first of:
//!
//! 1. the model's own recommendation, where the GGUF carries it: the `general.sampling.*` keys llama.cpp
//!    reads (`temp`, `top_k`, `top_p`, `min_p`, `penalty_repeat`, `penalty_last_n`);
//! 2. a preset for a known model family, taken from its model card or `generation_config.json`
//!    ([`PRESETS`]: SmolLM2 recommends temperature 0.2 and top_p 0.9);
//! 3. Strata's default: llama.cpp's filter chain (top_k 40, top_p 0.95, min_p 0.05, no penalties) at
//!    [`DEFAULT_TEMPERATURE`], chosen by measuring (BENCHMARKS.md, "Sampling defaults").
//!
//! A field a request sends is taken exactly as sent; nothing here overrides it. A key of the wrong type or
//! out of range in a file is not the model's recommendation: it is logged and the next source applies.
//! This module owns the rule and the table; it never samples.

use serde::{Deserialize, Serialize};

use crate::gguf::GgufFile;

use super::SamplerConfig;

/// Strata's temperature when neither the file nor a preset gives one (see the module comment).
pub const DEFAULT_TEMPERATURE: f64 = 0.6;

/// Where an effective value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(rename_all = "snake_case")]
pub enum SamplingSource {
    /// The model file's `general.sampling.*` key.
    Model,
    /// The preset of the model's family ([`SamplingDefaults::preset`] names it).
    Preset,
    /// Strata's default.
    Default,
}

/// A value and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Sourced<T> {
    pub value: T,
    pub source: SamplingSource,
}

/// The effective sampling of a model for requests that send no sampling fields, each value with its source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct SamplingDefaults {
    // Floats as f64 holding the shortest decimal of the f32 the sampler uses, so that JSON shows 0.2, not
    // 0.20000000298023224.
    pub temperature: Sourced<f64>,
    pub top_k: Sourced<u32>,
    pub top_p: Sourced<f64>,
    pub min_p: Sourced<f64>,
    pub repeat_penalty: Sourced<f64>,
    pub repeat_last_n: Sourced<u32>,
    /// The family preset that applied, with where its values come from ("SmolLM2 (model card)").
    pub preset: Option<String>,
}

/// A family's recommended values; `None`: the preset says nothing about that field.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    /// Shown to users, with its origin.
    pub name: &'static str,
    /// `general.architecture` values it applies to (empty: any).
    pub architectures: &'static [&'static str],
    /// Any of these in the model's normalized name (`general.basename` and `general.name`, lowercased,
    /// spaces and underscores as `-`) selects it; empty: the architecture alone does.
    pub names: &'static [&'static str],
    pub temperature: Option<f64>,
    pub top_k: Option<u32>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
}

const NONE: Preset = Preset {
    name: "",
    architectures: &[],
    names: &[],
    temperature: None,
    top_k: None,
    top_p: None,
    min_p: None,
    repeat_penalty: None,
};

/// Known families, first match wins. Values are the ones their authors publish.
pub const PRESETS: &[Preset] = &[
    // HuggingFaceTB/SmolLM2-*-Instruct model card: "temperature=0.2, top_p=0.9".
    Preset {
        name: "SmolLM2 (model card)",
        architectures: &["llama"],
        names: &["smollm2"],
        temperature: Some(0.2),
        top_p: Some(0.9),
        ..NONE
    },
    // Qwen3 model card, "Best Practices" for the default thinking mode.
    Preset {
        name: "Qwen3 (model card, thinking mode)",
        architectures: &["qwen3", "qwen3moe"],
        names: &[],
        temperature: Some(0.6),
        top_k: Some(20),
        top_p: Some(0.95),
        min_p: Some(0.0),
        ..NONE
    },
    // Qwen2.5-*-Instruct generation_config.json.
    Preset {
        name: "Qwen2.5 (generation_config.json)",
        architectures: &["qwen2"],
        names: &["qwen2.5", "qwen2-5"],
        temperature: Some(0.7),
        top_k: Some(20),
        top_p: Some(0.8),
        repeat_penalty: Some(1.05),
        ..NONE
    },
    // Gemma 3 generation_config.json (top_k 64, top_p 0.95) at temperature 1, as Google recommends.
    Preset {
        name: "Gemma 3 (generation_config.json)",
        architectures: &["gemma3", "gemma3n"],
        names: &[],
        temperature: Some(1.0),
        top_k: Some(64),
        top_p: Some(0.95),
        min_p: Some(0.0),
        ..NONE
    },
    // Llama-3.x-Instruct generation_config.json.
    Preset {
        name: "Llama 3 (generation_config.json)",
        architectures: &["llama"],
        names: &["llama-3", "llama3"],
        temperature: Some(0.6),
        top_p: Some(0.9),
        ..NONE
    },
];

impl Preset {
    fn matches(&self, arch: &str, name: &str) -> bool {
        let arch_ok = self.architectures.is_empty() || self.architectures.contains(&arch);
        let name_ok = self.names.is_empty() || self.names.iter().any(|n| name.contains(n));
        arch_ok && name_ok
    }
}

/// The model's name as presets match it: `general.basename` and `general.name`, lowercased, with spaces and
/// underscores as `-`.
fn normalized_name(file: &GgufFile) -> String {
    ["general.basename", "general.name"]
        .iter()
        .filter_map(|k| file.get(k).and_then(|v| v.as_str()))
        .map(|s| s.to_lowercase().replace([' ', '_'], "-"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The preset for a model of architecture `arch` named `name` (normalized), if a family matches.
pub fn preset_for(arch: &str, name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.matches(arch, name))
}

/// A `general.sampling.*` number that `valid` accepts, as the shortest decimal of its f32 (the file's f32
/// 0.2 is 0.2); a key that is there but wrong is logged and skipped.
fn model_value(file: &GgufFile, key: &str, valid: impl Fn(f64) -> bool, what: &str) -> Option<f64> {
    let v = file.get(key)?;
    match v.as_f64().map(|x| (x as f32).to_string().parse::<f64>().unwrap_or(x)) {
        Some(x) if x.is_finite() && valid(x) => Some(x),
        _ => {
            tracing::warn!("the model's {key} is {v:?}, not {what}: ignored");
            None
        }
    }
}

/// An f32 as the shortest decimal that reads back as it (0.95f32 is 0.95, not 0.949999988079071).
fn short(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

fn pick<T: Copy>(model: Option<T>, preset: Option<T>, default: T) -> Sourced<T> {
    match (model, preset) {
        (Some(value), _) => Sourced { value, source: SamplingSource::Model },
        (None, Some(value)) => Sourced { value, source: SamplingSource::Preset },
        (None, None) => Sourced { value: default, source: SamplingSource::Default },
    }
}

/// The `general.sampling.*` values a file carries (valid ones only).
#[derive(Default)]
struct FileValues {
    temperature: Option<f64>,
    top_k: Option<f64>,
    top_p: Option<f64>,
    min_p: Option<f64>,
    repeat_penalty: Option<f64>,
    repeat_last_n: Option<f64>,
}

/// The rule: each field from the file, else the preset, else Strata's chain.
fn resolve(keys: &FileValues, preset: Option<&'static Preset>) -> SamplingDefaults {
    let p = preset.copied().unwrap_or(NONE);
    let chain = SamplerConfig::default();
    SamplingDefaults {
        temperature: pick(keys.temperature, p.temperature, DEFAULT_TEMPERATURE),
        top_k: pick(keys.top_k.map(|x| x as u32), p.top_k, chain.top_k as u32),
        top_p: pick(keys.top_p, p.top_p, short(chain.top_p)),
        min_p: pick(keys.min_p, p.min_p, short(chain.min_p)),
        repeat_penalty: pick(keys.repeat_penalty, p.repeat_penalty, short(chain.repeat_penalty)),
        repeat_last_n: pick(keys.repeat_last_n.map(|x| x as u32), None, chain.repeat_last_n as u32),
        preset: preset.map(|p| p.name.to_owned()),
    }
}

impl SamplingDefaults {
    /// The effective defaults of the model in `file`.
    pub fn of(file: &GgufFile) -> SamplingDefaults {
        let arch = file.get("general.architecture").and_then(|v| v.as_str()).unwrap_or("");
        let probability = |x: f64| (0.0..=1.0).contains(&x);
        let count = |x: f64| x >= 0.0 && x <= u32::MAX as f64 && x.fract() == 0.0;
        let keys = FileValues {
            temperature: model_value(file, "general.sampling.temp", |x| x >= 0.0, "a temperature >= 0"),
            top_k: model_value(file, "general.sampling.top_k", count, "a count >= 0"),
            top_p: model_value(file, "general.sampling.top_p", probability, "a probability"),
            min_p: model_value(file, "general.sampling.min_p", probability, "a probability"),
            repeat_penalty: model_value(file, "general.sampling.penalty_repeat", |x| x > 0.0, "a penalty > 0"),
            repeat_last_n: model_value(file, "general.sampling.penalty_last_n", count, "a count >= 0"),
        };
        resolve(&keys, preset_for(arch, &normalized_name(file)))
    }

    /// Strata's defaults alone (no file, no preset).
    pub fn fallback() -> SamplingDefaults {
        resolve(&FileValues::default(), None)
    }

    /// The sampler these defaults make (penalties other than repeat off), with `seed`.
    pub fn config(&self, seed: u64) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature.value as f32,
            top_k: self.top_k.value as usize,
            top_p: self.top_p.value as f32,
            min_p: self.min_p.value as f32,
            repeat_penalty: self.repeat_penalty.value as f32,
            repeat_last_n: self.repeat_last_n.value as usize,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed,
        }
    }

    /// One line for logs: `temperature 0.2 (preset), top_k 40 (default), ...`.
    pub fn describe(&self) -> String {
        fn part(name: &str, value: impl std::fmt::Display, source: SamplingSource) -> String {
            let source = match source {
                SamplingSource::Model => "model",
                SamplingSource::Preset => "preset",
                SamplingSource::Default => "default",
            };
            format!("{name} {value} ({source})")
        }
        let mut line = [
            part("temperature", self.temperature.value, self.temperature.source),
            part("top_k", self.top_k.value, self.top_k.source),
            part("top_p", self.top_p.value, self.top_p.source),
            part("min_p", self.min_p.value, self.min_p.source),
            part("repeat_penalty", self.repeat_penalty.value, self.repeat_penalty.source),
            part("repeat_last_n", self.repeat_last_n.value, self.repeat_last_n.source),
        ]
        .join(", ");
        if let Some(p) = &self.preset {
            line.push_str(&format!("; preset: {p}"));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufValue;
    use crate::gguf::GgufWriter;

    fn file(kv: &[(&str, GgufValue)]) -> GgufFile {
        let mut w = GgufWriter::new();
        for (k, v) in kv {
            w.set(k, v.clone());
        }
        GgufFile::from_bytes(w.to_bytes(3)).unwrap()
    }

    fn s(v: &str) -> GgufValue {
        GgufValue::String(v.to_owned())
    }

    #[test]
    fn the_model_file_wins_then_the_preset_then_the_default() {
        let f = file(&[
            ("general.architecture", s("llama")),
            ("general.basename", s("smollm2")),
            ("general.sampling.top_p", GgufValue::F32(0.8)),
            ("general.sampling.top_k", GgufValue::I32(30)),
        ]);
        let d = SamplingDefaults::of(&f);
        assert_eq!(d.preset.as_deref(), Some("SmolLM2 (model card)"));
        assert_eq!(d.top_p, Sourced { value: 0.8, source: SamplingSource::Model });
        assert_eq!(d.top_k, Sourced { value: 30, source: SamplingSource::Model });
        assert_eq!(d.temperature, Sourced { value: 0.2, source: SamplingSource::Preset });
        assert_eq!(d.min_p, Sourced { value: 0.05, source: SamplingSource::Default });
        // JSON shows the decimals people wrote, not the f32's widening.
        let json = serde_json::to_string(&d).unwrap();
        assert!(json.contains(r#""top_p":{"value":0.8,"source":"model"}"#), "{json}");
        assert!(json.contains(r#""min_p":{"value":0.05,"source":"default"}"#), "{json}");
        let c = d.config(7);
        assert_eq!((c.temperature, c.top_k, c.top_p, c.min_p, c.seed), (0.2, 30, 0.8, 0.05, 7));
    }

    #[test]
    fn an_unknown_model_gets_the_chain_at_the_measured_temperature() {
        let f = file(&[("general.architecture", s("llama")), ("general.name", s("My Model"))]);
        let d = SamplingDefaults::of(&f);
        assert_eq!(d, SamplingDefaults::fallback());
        assert_eq!(d.temperature.value, DEFAULT_TEMPERATURE);
        assert_eq!((d.top_k.value, d.top_p.value, d.min_p.value), (40, 0.95, 0.05));
    }

    #[test]
    fn presets_match_by_architecture_and_name() {
        assert_eq!(preset_for("qwen3", "qwen3-8b").map(|p| p.name), Some("Qwen3 (model card, thinking mode)"));
        assert_eq!(preset_for("qwen2", "qwen2.5-0.5b-instruct").map(|p| p.temperature), Some(Some(0.7)));
        assert!(preset_for("qwen2", "qwen2-7b").is_none());
        assert_eq!(preset_for("llama", "meta-llama-3.1-8b-instruct").map(|p| p.top_p), Some(Some(0.9)));
        assert!(preset_for("llama", "tinyllama").is_none());
        // A name alone does not select a preset of another architecture.
        assert!(preset_for("mistral", "smollm2").is_none());
    }

    #[test]
    fn wrong_keys_are_not_a_recommendation() {
        let f = file(&[
            ("general.architecture", s("llama")),
            ("general.sampling.temp", s("hot")),
            ("general.sampling.top_p", GgufValue::F32(1.5)),
            ("general.sampling.top_k", GgufValue::F32(2.5)),
            ("general.sampling.penalty_repeat", GgufValue::F32(-1.0)),
        ]);
        assert_eq!(SamplingDefaults::of(&f), SamplingDefaults::fallback());
    }
}
