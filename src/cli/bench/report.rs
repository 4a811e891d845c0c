//! What `strata bench` prints: the measured tests as llama-bench's markdown table or as one JSON object, and
//! the --bandwidth figures (each GPU's bandwidths, the decode floor, parking and restoring a conversation's KV).

use strata::model::profile::Part;
use strata::model::weights::QTensor;
use strata::model::Model;
use strata::threadpool::ThreadPool;

use super::{mean_sd, spec_kind, BenchArgs, Kind, Measured, SpecRate};
use crate::cli::bandwidth::{self, GpuBandwidth, KvCopies};
use crate::cli::stages_summary;

/// The --bandwidth figures: each GPU's bandwidths, and parking and restoring a conversation's KV.
pub(super) struct Memory {
    gpus: Vec<GpuBandwidth>,
    kv_copies: Option<KvCopies>,
    /// --host-bandwidth: this machine's memory read bandwidth, GB/s.
    host_gbps: Option<f64>,
}

impl Memory {
    /// Measures them when --bandwidth asks; none otherwise.
    pub(super) fn measure(a: &BenchArgs, model: &Model, pool: &ThreadPool) -> anyhow::Result<Memory> {
        let host_gbps = a.host_bandwidth.then(|| bandwidth::measure_host(pool));
        if !a.bandwidth {
            return Ok(Memory { gpus: Vec::new(), kv_copies: None, host_gbps });
        }
        let gpus = model
            .placement
            .devices
            .devices
            .iter()
            .filter(|d| d.gpu().is_some())
            .map(|d| bandwidth::measure_gpu(d, 256 << 20))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let batch = a.engine.batch as usize;
        let kv = bandwidth::measure_kv(model, pool, a.engine.kv, batch, a.kv_tokens as usize)?;
        Ok(Memory { gpus, kv_copies: Some(kv), host_gbps })
    }

    /// The CPU's decode floor: the weight bytes one token reads at the host's read bandwidth.
    fn host_floor_tg(&self, model: &Model) -> Option<f64> {
        self.host_gbps.map(|bw| bw * 1e9 / model.decode_read_bytes() as f64)
    }

    /// The decode floor: every weight byte read once per token at the slowest GPU's device bandwidth.
    fn floor_tg(&self, model: &Model) -> Option<f64> {
        self.gpus.iter().map(|g| g.device_gbps).reduce(f64::min).map(|bw| bw * 1e9 / model.weight_bytes() as f64)
    }
}

/// What one run measured, printed as a markdown table or as one JSON object.
pub(super) struct Report<'a> {
    pub(super) a: &'a BenchArgs,
    pub(super) model: &'a Model,
    /// The model file's name.
    pub(super) name: String,
    pub(super) threads: usize,
    pub(super) context: usize,
    pub(super) tests: Vec<Measured>,
    /// The first tg test with drafts: its rates and the drafts counted.
    pub(super) spec_tg: Option<SpecRate>,
    /// Tokens of the --prompt-file prompt, when there is one.
    pub(super) prompt_file_tokens: Option<usize>,
    pub(super) memory: Memory,
}

impl Report<'_> {
    /// The mean and standard deviation of the first pp (`pp`) or tg test without drafts.
    fn first(&self, pp: bool) -> Option<(f64, f64)> {
        self.tests.iter().find(|t| t.spec.is_none() && matches!(t.kind, Kind::Pp(_)) == pp).map(Measured::mean_sd)
    }

    /// The KV type as the flags name it.
    fn kv(&self) -> String {
        format!("{:?}", self.a.engine.kv).to_lowercase()
    }

    /// Prints one JSON object: the setup, every test, the first pp and tg rates, drafts and memory figures.
    pub(super) fn print_json(&self) {
        let (a, model) = (self.a, self.model);
        let (pp, tg) = (self.first(true), self.first(false));
        let obj = serde_json::json!({
            "model": self.name,
            "threads": self.threads,
            "kv": self.kv(),
            "devices": a.engine.placement.devices,
            "stages": self.json_stages(),
            "context": self.context,
            "n_prompt": a.n_prompt.first(),
            "n_gen": a.n_gen.first(),
            "n_depth": a.n_depth.first(),
            "repetitions": a.reps,
            "tests": self.tests.iter().map(Measured::json).collect::<Vec<_>>(),
            "pp_tok_s": pp.map(|s| s.0),
            "pp_tok_s_stddev": pp.map(|s| s.1),
            "tg_tok_s": tg.map(|s| s.0),
            "tg_tok_s_stddev": tg.map(|s| s.1),
            "prompt_file_tokens": self.prompt_file_tokens,
            "spec": self.json_spec(tg),
            "weight_bytes": model.weight_bytes(),
            "gpus": self.memory.gpus,
            "floor_tg_tok_s": self.memory.floor_tg(model),
            "kv_copies": self.memory.kv_copies,
            "host_read_gbps": self.memory.host_gbps,
            "host_floor_tg_tok_s": self.memory.host_floor_tg(model),
            "tg_fraction_of_host_floor": tg.zip(self.memory.host_floor_tg(model)).map(|(t, f)| t.0 / f),
            "type_report_types": self.a.type_report.then(|| {
                Part::ALL.iter().map(|&p| (p.name().to_owned(), serde_json::json!(part_types(model, p)))).collect::<serde_json::Map<_, _>>()
            }),
        });
        println!("{obj}");
    }

    /// Each stage's device and layers, for the JSON object.
    fn json_stages(&self) -> Vec<serde_json::Value> {
        let stages = self.model.placement.stages.iter();
        stages
            .map(|s| serde_json::json!({"device": s.device.name(), "layers": [s.layers.start, s.layers.end]}))
            .collect()
    }

    /// The tg rate with drafts, its speedup over plain decoding (`tg`) and the drafts counted, for the JSON.
    fn json_spec(&self, tg: Option<(f64, f64)>) -> Option<serde_json::Value> {
        let s = self.spec_tg.as_ref()?;
        let (spec_mean, spec_sd) = mean_sd(&s.samples);
        Some(serde_json::json!({
            "kind": spec_kind(&self.a.engine),
            "tg_tok_s": spec_mean,
            "tg_tok_s_stddev": spec_sd,
            "speedup": tg.map(|t| spec_mean / t.0),
            "drafts_proposed": s.proposed,
            "drafts_accepted": s.accepted,
        }))
    }

    /// Prints llama-bench's markdown table, one row a test, then the drafts and memory figures.
    pub(super) fn print_table(&self) {
        println!("| model | size | threads | kv | devices [layers] | test | t/s |");
        println!("| --- | ---: | ---: | --- | --- | --- | ---: |");
        let (name, threads, kv) = (&self.name, self.threads, self.kv());
        let size = format!("{:.2} MiB", self.model.weight_bytes() as f64 / (1 << 20) as f64);
        let stages = stages_summary(self.model);
        for t in &self.tests {
            let (mean, sd) = t.mean_sd();
            println!("| {name} | {size} | {threads} | {kv} | {stages} | {} | {mean:.2} ± {sd:.2} |", t.name());
        }
        if let Some(floor) = self.memory.host_floor_tg(self.model) {
            let gbps = self.memory.host_gbps.unwrap_or(0.0);
            println!(
                "memory read bandwidth {gbps:.1} GB/s: decode floor {floor:.1} tok/s ({:.1} MiB of weights read per token)",
                self.model.decode_read_bytes() as f64 / (1 << 20) as f64
            );
            for t in self.tests.iter().filter(|t| matches!(t.kind, Kind::Tg(_))) {
                println!("  {}: {:.2} of the floor", t.name(), t.mean_sd().0 / floor);
            }
        }
        self.print_parts();
        if let Some(s) = &self.spec_tg {
            let tg = self.first(false);
            let speedup = tg.map_or(String::new(), |t| format!(", {:.2}x plain decoding", mean_sd(&s.samples).0 / t.0));
            println!("drafts accepted {} of {} over the timed runs{speedup}", s.accepted, s.proposed);
        }
        self.print_memory();
    }

    /// Prints the --type-report table: milliseconds per token by part (share of the test's time), then the
    /// weight types and layouts each part's matrices use.
    fn print_parts(&self) {
        if !self.a.type_report {
            return;
        }
        println!();
        let names: Vec<&str> = Part::ALL.iter().map(|p| p.name()).chain(["other"]).collect();
        println!("| test | {} |", names.join(" | "));
        println!("| --- |{}", " ---: |".repeat(names.len()));
        for t in &self.tests {
            let Some(parts) = t.parts else { continue };
            let cells: Vec<String> = parts
                .rows()
                .iter()
                .map(|&(_, s)| format!("{:.3} ms ({:.0}%)", s * 1e3, 100.0 * s / parts.total_per_token_s))
                .collect();
            println!("| {} | {} |", t.name(), cells.join(" | "));
        }
        println!("(milliseconds per token, share of the test's time)");
        for p in Part::ALL {
            println!("{}: {}", p.name(), part_types(self.model, p));
        }
    }

    /// Prints the --bandwidth figures: each GPU's bandwidths, the decode floor, the KV park and restore rates.
    fn print_memory(&self) {
        for g in &self.memory.gpus {
            println!(
                "{} ({}): device {:.1} GB/s, host-to-device pinned {:.1} GB/s, pageable {:.1} GB/s",
                g.device, g.name, g.device_gbps, g.h2d_pinned_gbps, g.h2d_pageable_gbps
            );
        }
        if let Some(f) = self.memory.floor_tg(self.model) {
            println!("decode floor (weight bytes / device bandwidth): {f:.1} tok/s");
        }
        if let Some(k) = &self.memory.kv_copies {
            println!(
                "KV of {} tokens ({:.1} MiB): park {:.2} GB/s (into reused buffers {:.2}), restore {:.2} GB/s",
                k.tokens,
                k.bytes as f64 / (1 << 20) as f64,
                k.park_gbps,
                k.park_reused_gbps,
                k.restore_gbps
            );
        }
    }
}

/// The weight types and layouts of a part's matrices, e.g. `q4_0 16-row interleaved x4` for each layer's
/// attention projections (attention itself: the KV cache's type).
fn part_types(model: &Model, part: Part) -> String {
    let w = &model.weights;
    let Some(l) = w.layers.first() else { return String::new() };
    let mats: Vec<&QTensor> = match part {
        Part::AttnProducts => vec![&l.wq, &l.wk, &l.wv, &l.wo],
        Part::FfnProducts => l.ffn.matrices(),
        Part::Output => vec![&w.output],
        Part::Attention => return "KV cache (see kv)".to_owned(),
    };
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for m in mats {
        let k = format!("{} {}", m.ty, m.layout().name());
        match kinds.iter_mut().find(|e| e.0 == k) {
            Some(e) => e.1 += 1,
            None => kinds.push((k, 1)),
        }
    }
    let first = if matches!(part, Part::Output) { "" } else { " (layer 0)" };
    let list: Vec<String> = kinds.into_iter().map(|(k, n)| if n > 1 { format!("{k} x{n}") } else { k }).collect();
    format!("{}{first}", list.join(", "))
}
