//! The `strata` binary end to end: every subcommand on the default model, and bad input of every kind
//! (one clear line naming the cause, a non-zero exit, never a panic).

use crate::common::{self, stderr, stdout, strata};

use std::path::Path;
use std::process::{Command, Output};

use strata::gguf::{GgufValue, GgufWriter};

/// A failed run: non-zero exit, exactly one line on stderr that mentions `needle`, and no panic.
fn assert_clean_failure(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {err}");
    assert!(lines[0].contains(needle), "expected {needle:?} in {:?}", lines[0]);
    assert!(lines[0].starts_with("strata: error: "), "{:?}", lines[0]);
}

fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write temp file");
    p
}

#[test]
fn help_documents_every_subcommand() {
    let o = strata(&["--help"]);
    assert!(o.status.success());
    let out = stdout(&o);
    for sub in ["run", "chat", "tokenize", "perplexity", "bench", "info"] {
        assert!(out.contains(sub), "--help lacks {sub}");
    }
    let o = strata(&["run", "--help"]);
    for flag in
        ["--prompt", "--n-predict", "--temp", "--seed", "--ignore-eos", "--json", "--top-logprobs", "--threads", "--kv"]
    {
        assert!(stdout(&o).contains(flag), "run --help lacks {flag}");
    }
}

#[test]
fn an_unknown_flag_is_one_line_and_exit_2() {
    let o = strata(&["run", "--no-such-flag", "-p", "hi"]);
    assert_eq!(o.status.code(), Some(2));
    assert_clean_failure(&o, "--no-such-flag");
}

#[test]
fn a_value_outside_a_flags_set_names_the_values_there_are() {
    let o = strata(&["serve", "--reuse-figures", "maybe"]);
    assert_eq!(o.status.code(), Some(2));
    assert_clean_failure(&o, "invalid value 'maybe' for '--reuse-figures <REUSE_FIGURES>'; one of: auto, show, hide");
    let o = strata(&["run", "--spec", "magic", "-p", "hi"]);
    assert_eq!(o.status.code(), Some(2));
    assert_clean_failure(&o, "one of: ngram, draft");
}

#[test]
fn a_file_that_is_not_gguf_is_refused() {
    let p = temp_file("notes.txt", b"these are not the weights you are looking for\n");
    let o = strata(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]);
    assert_clean_failure(&o, "not a GGUF file");
}

#[test]
fn a_truncated_gguf_is_refused_with_the_offset() {
    let model = std::fs::read(common::model_path()).expect("model");
    let p = temp_file("truncated.gguf", &model[..4096]);
    let o = strata(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]);
    assert_clean_failure(&o, "truncated");
    assert!(stderr(&o).contains("byte offset"), "{}", stderr(&o));
}

#[test]
fn a_corrupted_tensor_index_is_refused() {
    let mut model = std::fs::read(common::model_path()).expect("model");
    model.truncate(60_000_000); // tensor data now runs past the end of the file
    let p = temp_file("cut.gguf", &model);
    let o = strata(&["info", "-m", p.to_str().unwrap()]);
    assert_clean_failure(&o, "outside the file");
}

#[test]
fn an_unsupported_architecture_is_named() {
    let mut w = GgufWriter::new();
    w.set("general.architecture", GgufValue::str("mamba"));
    w.set("mamba.block_count", GgufValue::U32(1));
    let p = temp_file("mamba.gguf", &w.to_bytes(3));
    let o = strata(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]);
    assert_clean_failure(&o, "unsupported model architecture \"mamba\"");
}

#[test]
fn a_missing_model_file_is_named() {
    let o = strata(&["run", "-m", "/nonexistent/model.gguf", "-p", "hi"]);
    assert_clean_failure(&o, "/nonexistent/model.gguf");
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_with_both_numbers() {
    let prompt = "word ".repeat(40);
    let o = strata(&["run", "-p", &prompt, "-c", "16", "-n", "4"]);
    assert_clean_failure(&o, "positions but the context holds 16");
    assert!(stderr(&o).contains("the prompt needs 41"), "{}", stderr(&o));
}

#[test]
fn bad_sampling_values_are_refused() {
    let o = strata(&["run", "-p", "hi", "--top-p", "3"]);
    assert_clean_failure(&o, "--top-p");
}

#[test]
fn run_json_prints_tokens_text_and_top_logprobs() {
    let o = strata(&[
        "run",
        "-p",
        "The quick brown fox",
        "-n",
        "8",
        "--temp",
        "0",
        "--ignore-eos",
        "--json",
        "--top-logprobs",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("one JSON object");
    let tokens = v["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), 8);
    assert_eq!(v["prompt_tokens"], 4);
    // llama.cpp's first greedy token for this prompt is " with" (351).
    assert_eq!(tokens[0], 351);
    let steps = v["top_logprobs"].as_array().expect("top_logprobs");
    assert_eq!(steps.len(), 8);
    for (i, step) in steps.iter().enumerate() {
        let step = step.as_array().expect("step");
        assert_eq!(step.len(), 3);
        // Greedy: the chosen token is the most likely one, and log-probs are sorted and <= 0.
        assert_eq!(step[0][0], tokens[i]);
        let lps: Vec<f64> = step.iter().map(|p| p[1].as_f64().expect("logprob")).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]) && lps[0] <= 0.0);
    }
    assert!(v["text"].as_str().expect("text").starts_with(" with"));
}

#[test]
fn run_is_deterministic_for_a_seed() {
    let a = strata(&["run", "-p", "Once upon a time", "-n", "12", "--seed", "7", "--json"]);
    let b = strata(&["run", "-p", "Once upon a time", "-n", "12", "--seed", "7", "--json"]);
    let tok = |o: &Output| serde_json::from_str::<serde_json::Value>(stdout(o).trim()).expect("json")["tokens"].clone();
    assert_eq!(tok(&a), tok(&b));
}

#[test]
fn tokenize_prints_llama_cpp_ids() {
    let o = strata(&["tokenize", "--json", "Hello world"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "[19556,905]");
    let o = strata(&["tokenize", "--json", "--no-parse-special", "<|im_start|>"]);
    let ids: Vec<u32> = serde_json::from_str(stdout(&o).trim()).expect("ids");
    assert!(ids.len() > 1, "special text parsed as text splits into pieces");
    let o = strata(&["tokenize", "--json", "<|im_start|>"]);
    assert_eq!(stdout(&o).trim(), "[1]");
}

#[test]
fn chat_answers_one_message_with_the_template() {
    // The reply must be the greedy continuation of the template's rendering, which llama.cpp's reference
    // records (SmolLM2's template inserts its default system prompt).
    let reference = common::reference_json("greedy.json");
    let rendered = reference["chat_template_check"]["prompt"].as_str().expect("prompt");
    let chat = strata(&["chat", "--message", "What is the capital of France?", "--temp", "0", "-n", "16"]);
    assert!(chat.status.success(), "{}", stderr(&chat));
    let run = strata(&["run", "-p", rendered, "--temp", "0", "-n", "16"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(!stdout(&chat).trim().is_empty());
    assert_eq!(stdout(&chat).trim(), stdout(&run).trim());
}

#[test]
fn info_shows_metadata_types_and_memory() {
    let o = strata(&["info", "-c", "8192"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("general.architecture = \"llama\""));
    assert!(out.contains("q4_1:  210 tensors"));
    assert!(out.contains("memory at context 8192"));
    // 30 layers * 192 * 2 (K, V) * 2 bytes; f32 KV twice that, int8 6 blocks of 34 bytes a row.
    assert!(out.contains("--kv f16 : ") && out.contains("23040 bytes/token"), "{out}");
    assert!(out.contains("--kv f32 : ") && out.contains("46080 bytes/token"), "{out}");
    assert!(out.contains("--kv int8: ") && out.contains("12240 bytes/token"), "{out}");
    // The default model's sampling: its model card's preset, the rest Strata's chain.
    assert!(
        out.contains("sampling for fields a request does not send: temperature 0.2 (preset), top_k 40 (default), top_p 0.9 (preset), min_p 0.05 (default)"),
        "{out}"
    );
    assert!(out.contains("preset: SmolLM2 (model card)"), "{out}");
    // The tied q8_0 embedding is the output head: repacked for the CPU, as are the 210 q4_1 matrices.
    assert!(out.contains("q8_0: 1 matrices repacked for the CPU at load (16-row interleaved)"), "{out}");
    assert!(out.contains("q4_1: 210 matrices repacked for the CPU at load (16-row interleaved)"), "{out}");
}

#[test]
fn bench_host_bandwidth_gives_tg_as_a_fraction_of_the_decode_floor() {
    let o = strata(&["bench", "-p", "0", "-n", "4", "-r", "1", "-t", "2", "--json", "--host-bandwidth"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    let gbps = v["host_read_gbps"].as_f64().expect("bandwidth");
    let floor = v["host_floor_tg_tok_s"].as_f64().expect("floor");
    let tg = v["tg_tok_s"].as_f64().expect("tg");
    assert!(gbps > 0.1, "{v}");
    assert!((v["tg_fraction_of_host_floor"].as_f64().expect("fraction") - tg / floor).abs() < 1e-9, "{v}");
    // Without the flag nothing is measured.
    let o = strata(&["bench", "-p", "0", "-n", "2", "-r", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    assert!(v["host_read_gbps"].is_null() && v["tg_fraction_of_host_floor"].is_null(), "{v}");
    let o = strata(&["bench", "-p", "0", "-n", "2", "-r", "1", "--host-bandwidth"]);
    assert!(stdout(&o).contains("  tg2: "), "{}", stdout(&o));
    assert!(stdout(&o).contains("of the floor"), "{}", stdout(&o));
}

#[test]
fn bench_type_report_says_where_the_time_goes() {
    let o = strata(&["bench", "-p", "32", "-n", "8", "-r", "1", "-t", "2", "--json", "--type-report"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    let parts = ["attention products", "attention", "FFN products", "output", "other"];
    for t in v["tests"].as_array().expect("tests") {
        let r = &t["type_report"];
        let ms: Vec<f64> = parts.iter().map(|p| r[*p].as_f64().unwrap_or_else(|| panic!("{p} in {t}"))).collect();
        assert!(ms.iter().all(|&m| m >= 0.0), "{t}");
        // Every matrix product and the attention took time; the parts add up to at most the whole.
        assert!(ms[0] > 0.0 && ms[1] > 0.0 && ms[2] > 0.0 && ms[3] > 0.0, "{t}");
        let whole_ms = 1e3 / t["tok_s"].as_f64().expect("rate");
        assert!(ms[..4].iter().sum::<f64>() <= whole_ms * 1.01, "{t}: {ms:?} vs {whole_ms} ms per token");
    }
    let types = &v["type_report_types"];
    assert!(types["FFN products"].as_str().expect("ffn").contains("q4_1 16-row interleaved x3"), "{types}");
    assert!(types["output"].as_str().expect("output").contains("q8_0 16-row interleaved"), "{types}");
    // Without the flag there is no report; as a table it follows the rates.
    let o = strata(&["bench", "-p", "16", "-n", "0", "-r", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    assert!(v["tests"][0]["type_report"].is_null() && v["type_report_types"].is_null(), "{v}");
    let o = strata(&["bench", "-p", "16", "-n", "4", "-r", "1", "--type-report"]);
    let out = stdout(&o);
    assert!(out.contains("| test | attention products | attention | FFN products | output | other |"), "{out}");
    assert!(out.contains("| tg4 | "), "{out}");
}

#[test]
fn bench_json_reports_both_rates() {
    let o = strata(&["bench", "-p", "32", "-n", "8", "-r", "1", "-t", "2", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    assert!(v["pp_tok_s"].as_f64().expect("pp") > 0.0);
    assert!(v["tg_tok_s"].as_f64().expect("tg") > 0.0);
    assert_eq!(v["threads"], 2);
}

#[test]
fn bench_runs_every_size_at_every_depth() {
    let o = strata(&["bench", "-p", "16,32", "-n", "4", "-d", "0,40", "-r", "2", "-t", "2", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    let tests = v["tests"].as_array().expect("tests");
    let names: Vec<&str> = tests.iter().map(|t| t["test"].as_str().expect("name")).collect();
    assert_eq!(names, ["pp16", "pp32", "tg4", "pp16 @ d40", "pp32 @ d40", "tg4 @ d40"]);
    for t in tests {
        let depth = if t["test"].as_str().unwrap().contains("@ d40") { 40 } else { 0 };
        assert_eq!(t["n_depth"], depth, "{t}");
        assert_eq!(t["samples_tok_s"].as_array().expect("samples").len(), 2, "{t}");
        assert!(t["tok_s"].as_f64().expect("rate") > 0.0, "{t}");
    }
    assert_eq!(tests[1]["n_prompt"], 32);
    assert_eq!(tests[2]["n_gen"], 4);
    // The first configuration keeps its flat fields.
    assert_eq!(v["pp_tok_s"], tests[0]["tok_s"]);
    assert_eq!(v["tg_tok_s"], tests[2]["tok_s"]);
    // The depth counts against the context.
    let o = strata(&["bench", "-c", "64", "-d", "40", "-p", "32", "-n", "0"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("bench -p 32 at -d 40: the test needs 72 positions but the context holds 64 (-c)"),
        "{}",
        stderr(&o)
    );
}

/// `--streams 3`: the tg tests decode three sequences at once (named `tgN x3`, aggregate tok/s); the pp
/// tests are unchanged; after a real prompt it is refused.
#[test]
fn bench_streams_decodes_several_sequences_at_once() {
    let o = strata(&["bench", "-p", "16", "-n", "4", "-d", "0,40", "-r", "1", "-t", "2", "--streams", "3", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    let tests = v["tests"].as_array().expect("tests");
    let names: Vec<&str> = tests.iter().map(|t| t["test"].as_str().expect("name")).collect();
    assert_eq!(names, ["pp16", "tg4 x3", "pp16 @ d40", "tg4 x3 @ d40"]);
    let streams: Vec<u64> = tests.iter().map(|t| t["streams"].as_u64().expect("streams")).collect();
    assert_eq!(streams, [1, 3, 1, 3]);
    let text = common::reference_path("perplexity_GPL-3.txt");
    let o = strata(&["bench", "-p", "16", "-n", "4", "--streams", "2", "--prompt-file", text.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--streams 2: the tg tests after a real prompt"), "{}", stderr(&o));
}

#[test]
fn perplexity_of_the_gpl3_text_matches_llama_cpp() {
    let text = common::reference_path("perplexity_GPL-3.txt");
    let o = strata(&["perplexity", "-f", text.to_str().unwrap(), "-c", "512", "-t", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let last = out.lines().last().expect("output");
    let ppl: f64 = last.strip_prefix("PPL = ").expect("last line is PPL = x").parse().expect("a number");
    assert_eq!(last, format!("PPL = {ppl:.4}"), "four decimals");
    println!("{last} (llama.cpp: 18.3914 with flash attention, 18.3541 without)");
    assert!((18.25..=18.45).contains(&ppl), "PPL {ppl} outside 18.25..18.45");
    assert!(Path::new(&text).exists());
}

#[test]
fn a_closed_output_pipe_is_not_a_panic() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["run", "-p", "Once upon a time", "-n", "64", "--temp", "0", "--ignore-eos"])
        .env("STRATA_MODEL", common::model_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take()); // the reader goes away before the first token is printed
    let out = child.wait_with_output().expect("wait");
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

#[test]
fn a_stop_string_cuts_the_output_before_it() {
    let args = ["run", "-p", "The quick brown fox", "-n", "24", "--temp", "0", "--ignore-eos", "--json"];
    let full = strata(&args);
    let text = serde_json::from_str::<serde_json::Value>(stdout(&full).trim()).expect("json")["text"]
        .as_str()
        .expect("text")
        .to_owned();
    // Stop at the third word of the greedy continuation.
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    assert!(words.len() > 4, "{text:?}");
    let stop = words[3].trim();
    let cut = text.find(stop).expect("stop string in text");
    let mut with_stop = args.to_vec();
    with_stop.extend(["--stop", stop]);
    let o = strata(&with_stop);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    assert_eq!(v["text"].as_str().expect("text"), &text[..cut]);
    assert_eq!(v["stop_reason"], "stop");
}

#[test]
fn chat_reads_turns_from_standard_input() {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["chat", "--temp", "0", "-n", "12"])
        .env("STRATA_MODEL", common::model_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child.stdin.take().expect("stdin").write_all(b"Hello!\nWhat is the capital of France?\n").expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", stderr(&out));
    let replies: Vec<&str> =
        std::str::from_utf8(&out.stdout).expect("utf8").lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(replies.len() >= 2, "two turns, two replies: {replies:?}");
}

#[test]
fn weights_that_produce_nan_are_an_error_not_a_panic() {
    use strata::gguf::GgufFile;
    use strata::model::synthetic::SyntheticSpec;
    let mut image = SyntheticSpec::default().to_gguf();
    let file = GgufFile::from_bytes(image.clone()).expect("parses");
    let norm = file.tensor("output_norm.weight").expect("output norm");
    let start = norm.file_offset as usize;
    for v in image[start..start + norm.n_bytes as usize].chunks_mut(4) {
        v.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    let p = temp_file("nan.gguf", &image);
    let o = strata(&["run", "-m", p.to_str().unwrap(), "-p", "the quick brown fox", "-n", "4"]);
    assert_clean_failure(&o, "no token can be sampled");
}

#[test]
fn a_model_with_an_empty_vocabulary_is_refused() {
    let mut w = GgufWriter::new();
    w.set("general.architecture", GgufValue::str("llama"));
    for (k, v) in
        [("block_count", 1), ("embedding_length", 16), ("feed_forward_length", 4), ("attention.head_count", 8)]
    {
        w.set(&format!("llama.{k}"), GgufValue::U32(v));
    }
    w.set("tokenizer.ggml.tokens", GgufValue::strs::<&str>(&[]));
    let p = temp_file("empty-vocab.gguf", &w.to_bytes(3));
    let o = strata(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]);
    assert_clean_failure(&o, "must be positive");
}

#[test]
fn the_kv_type_flag_is_honoured_and_checked() {
    let o = strata(&["run", "-p", "The quick brown fox", "-n", "4", "--temp", "0", "--kv", "int8", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    assert_eq!(v["tokens"][0], 351, "int8 KV keeps the greedy first token");
    let o = strata(&["run", "-p", "hi", "--kv", "int4"]);
    assert_eq!(o.status.code(), Some(2));
    assert_clean_failure(&o, "unknown KV type");
    assert!(stderr(&o).contains("expected f16, f32 or int8"), "{}", stderr(&o));
}

#[test]
fn f32_kv_runs_on_the_cpu_and_sim_devices_and_is_refused_on_a_gpu() {
    // The values exactly (llama.cpp's -ctk f32 -ctv f32): the same greedy tokens on the CPU and split over
    // two sim devices, which compute on the CPU.
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-p", "The quick brown fox", "-n", "4", "--temp", "0", "--kv", "f32", "--json"];
        args.extend_from_slice(extra);
        json_of(&strata(&args))["tokens"].clone()
    };
    let cpu = run(&[]);
    assert_eq!(cpu[0], 351, "f32 KV keeps the greedy first token");
    assert_eq!(run(&["--devices", "sim:200,sim:400", "--layer-split", "15"]), cpu);
    // The plan counts 4 bytes a value: 15 layers * (K + V) * 192 values.
    let plan = ["plan", "--devices", "sim:200,sim:400", "--layer-split", "15", "--kv", "f32", "--tokens", "100"];
    let v = json_of(&strata(&[&plan[..], &["--json"]].concat()));
    for s in v["stages"].as_array().expect("stages") {
        assert_eq!(u(&s["kv_bytes_per_token"]), 15 * 2 * 192 * 4, "{s}");
    }
    // A GPU stage (the CUDA backend, here on its emulator) is refused before anything is allocated.
    let dir = tempfile::tempdir().unwrap();
    let tiny = common::tiny_model_file(dir.path());
    let tiny = tiny.to_str().unwrap();
    for args in [
        &["run", "-p", "hi", "-n", "1", "--kv", "f32", "--devices", "emu:64", "-m", tiny][..],
        &["plan", "--kv", "f32", "--devices", "cpu,emu:64", "-m", tiny][..],
    ] {
        let o = strata(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains("--kv f32 runs on the CPU and sim devices only, and device ")
                && err.contains(" (emu:64) is a GPU (the CUDA kernels read f16 or int8 KV)"),
            "{args:?}: {err}"
        );
    }
}

// Devices and layer split: `plan`, `devices`, and the engine flags (--devices, --layer-split,
// --vram-reserve-mib, --kv-resident, --sim-fault, --sim-faults) on run.

const MIB: u64 = 1 << 20;

fn json_of(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_str(stdout(o).trim()).unwrap_or_else(|e| panic!("not one JSON object ({e}): {}", stdout(o)))
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

#[test]
fn help_lists_plan_devices_and_the_placement_flags() {
    let out = stdout(&strata(&["--help"]));
    assert!(out.contains("plan") && out.contains("devices"), "{out}");
    let out = stdout(&strata(&["run", "--help"]));
    for flag in [
        "--devices",
        "--layer-split",
        "--vram-reserve-mib",
        "--kv-resident",
        "--experts",
        "--sim-fault",
        "--sim-faults",
    ] {
        assert!(out.contains(flag), "run --help lacks {flag}");
    }
}

/// A mixture of experts' plan shows each stage's weights by class: its experts on the device (at least
/// their tensors' bytes in the file, less than the stage's weights) or, with `--experts cpu` or a layer
/// range, in host memory, the stage's weights smaller by exactly what moved (0 for a dense model).
#[test]
fn plan_of_a_mixture_of_experts_shows_the_weights_per_device_per_class() {
    let moe = common::families::file("qwen3moe.gguf");
    let file = strata::gguf::GgufFile::open(&moe).expect("fixture");
    let experts_in = |layer: usize| -> u64 {
        ["gate", "up", "down"]
            .map(|t| file.tensor(&format!("blk.{layer}.ffn_{t}_exps.weight")).expect("an expert tensor").n_bytes)
            .iter()
            .sum()
    };
    let plan = |experts: &str, json: bool| {
        let mut args = vec!["plan", "-m", moe.to_str().unwrap(), "--devices", "sim:64,sim:64", "--layer-split", "1"];
        args.extend(["--experts", experts]);
        if json {
            args.push("--json");
        }
        strata(&args)
    };
    let on_device = json_of(&plan("gpu", true));
    let stages = |v: &serde_json::Value| v["stages"].as_array().expect("stages").clone();
    for (l, s) in stages(&on_device).iter().enumerate() {
        assert!(u(&s["experts_bytes"]) >= experts_in(l) && u(&s["experts_bytes"]) < u(&s["weights_bytes"]), "{s}");
        assert_eq!(u(&s["host_experts_bytes"]), 0, "{s}");
    }
    let ranged = json_of(&plan("cpu:1..2", true));
    for (l, (a, b)) in stages(&on_device).iter().zip(&stages(&ranged)).enumerate() {
        let moved = if l == 1 { u(&a["experts_bytes"]) } else { 0 };
        assert_eq!(u(&b["host_experts_bytes"]), moved, "layer {l}: {b}");
        assert_eq!(u(&b["weights_bytes"]), u(&a["weights_bytes"]) - moved, "layer {l}: {b}");
    }
    let text = stdout(&plan("cpu", false));
    let at = text.find("weights by class (8 experts per layer, 2 read per token):").unwrap_or_else(|| panic!("{text}"));
    let table: Vec<&str> = text[at..].lines().skip(1).take(4).collect();
    assert!(table[0].contains("shared") && table[0].contains("experts in host memory"), "{text}");
    assert!(table[1].contains("sim:64") && table[1].contains(" 0.0 MiB"), "{text}");
    assert!(table[3].trim_start().starts_with("host"), "{text}");
    let e = stderr(&strata(&["plan", "-m", moe.to_str().unwrap(), "--experts", "cpu:3"]));
    assert!(e.contains("--experts") && e.contains("cpu:0..12"), "{e}");
    let e = stderr(&strata(&["plan", "-m", moe.to_str().unwrap(), "--experts", "cpu:0..99"]));
    assert!(e.contains("bad --experts \"cpu:0..99\": the model has 2 layers (0..2)"), "{e}");
    let dense = json_of(&strata(&["plan", "--json"]));
    assert_eq!(dense["stages"][0]["experts_bytes"], 0, "{dense}");
}

#[test]
fn plan_of_a_two_sim_split_shows_each_stage() {
    let args = [
        "plan",
        "--devices",
        "sim:200,sim:400",
        "--layer-split",
        "15",
        "--kv",
        "int8",
        "--max-context",
        "8192",
        "--tokens",
        "4000",
        "--json",
    ];
    let v = json_of(&strata(&args));
    assert_eq!(v["tokens"], 4000);
    let stages = v["stages"].as_array().expect("stages");
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[0]["layers"], serde_json::json!([0, 15]));
    assert_eq!(stages[1]["layers"], serde_json::json!([15, 30]));
    let mut weights = 0;
    for (s, free_mib) in stages.iter().zip([200, 400]) {
        // 15 layers * (K + V) * 192 values as int8 blocks (6 blocks of 34 bytes).
        assert_eq!(u(&s["kv_bytes_per_token"]), 15 * 2 * 6 * 34, "{s}");
        // 4000 positions fill 63 pages of 64, all on the device (no --kv-resident).
        assert_eq!(u(&s["kv_device_bytes"]), 63 * 64 * u(&s["kv_bytes_per_token"]), "{s}");
        assert_eq!(u(&s["kv_host_bytes"]), 0);
        let load = u(&s["weights_bytes"]) + u(&s["scratch_bytes"]) + u(&s["staging_bytes"]);
        assert_eq!(u(&s["total_bytes"]), load + u(&s["kv_device_bytes"]), "{s}");
        assert_eq!(u(&s["free_bytes"]), free_mib * MIB);
        assert_eq!(u(&s["reserve_bytes"]), 0);
        let headroom = s["headroom_bytes"].as_i64().expect("headroom");
        assert_eq!(headroom, (free_mib * MIB) as i64 - u(&s["total_bytes"]) as i64);
        assert!(u(&s["scratch_bytes"]) > 0 && u(&s["staging_bytes"]) > 0, "{s}");
        weights += u(&s["weights_bytes"]);
    }
    // The last stage holds the (tied) head: more than the first's half of the layers.
    assert!(u(&stages[1]["weights_bytes"]) > u(&stages[0]["weights_bytes"]));
    // Every weight is placed once (92 MiB of quantized tensors, plus the cached outlier columns).
    assert!((90 * MIB..160 * MIB).contains(&weights), "{weights}");
}

#[test]
fn plan_applies_faults_from_a_file_and_warns_when_kv_outgrows_a_device() {
    let faults = temp_file("faults.txt", b"# another process on the second card\n1:pressure-mib=300\n");
    let o = strata(&[
        "plan",
        "--devices",
        "sim:200,sim:400",
        "--layer-split",
        "15",
        "-c",
        "8192",
        "--sim-faults",
        faults.to_str().unwrap(),
        "--json",
    ]);
    let v = json_of(&o);
    let s1 = &v["stages"][1];
    assert_eq!(u(&s1["free_bytes"]), 100 * MIB, "{s1}");
    assert!(s1["headroom_bytes"].as_i64().expect("headroom") < 0, "{s1}");
    // The load still fits, so this is a warning about KV going to the host, not an error.
    let err = stderr(&o);
    assert!(err.contains("warning: device 1 (sim:400)") && err.contains("positions stay resident"), "{err}");
    assert!(!err.contains("device 0 (sim:200)"), "{err}");
}

#[test]
fn plan_refuses_a_device_too_small_naming_it_and_the_shortfall() {
    let o = strata(&["plan", "--devices", "sim:20"]);
    assert_eq!(o.status.code(), Some(1));
    assert_clean_failure(&o, "short by");
    assert!(stderr(&o).contains("device 0 (sim:20) cannot hold layers 0..30"), "{}", stderr(&o));
}

#[test]
fn bad_placement_flags_are_one_clear_line() {
    let two = ["--devices", "sim:200,sim:400"];
    let cases: [(&[&str], &str); 8] = [
        (&["--layer-split", "31"], "31 is beyond the model's 30 layers"),
        (&["--layer-split", "10,20"], "3 stages but --devices lists 2"),
        (&["--layer-split", "30"], "stage 1 (device 1 (sim:400)) with no layers"),
        (&["--layer-split", "x"], "bad --layer-split"),
        (&["--sim-fault", "5:fail-allocs=1"], "names device 5"),
        (&["--sim-fault", "1:bogus=1"], "--sim-fault"),
        (&["--kv-resident", "0"], "--kv-resident"),
        (&["--vram-reserve-mib", "lots"], "--vram-reserve-mib"),
    ];
    for (extra, needle) in cases {
        for sub in ["run", "plan"] {
            let mut args = vec![sub];
            if sub == "run" {
                args.extend(["-p", "hi", "-n", "1"]);
            }
            args.extend(two);
            args.extend(extra);
            let o = strata(&args);
            assert!(matches!(o.status.code(), Some(1 | 2)), "{args:?}: {:?}", o.status);
            assert_clean_failure(&o, needle);
        }
    }
    for sub in [&["run", "-p", "hi"][..], &["plan"], &["devices"]] {
        let mut args = sub.to_vec();
        args.extend(["--devices", "cuda:0"]);
        let o = strata(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert_clean_failure(&o, "cuda:0 is not available");
    }
    let o = strata(&["run", "-p", "hi", "--devices", "cpu", "--sim-fault", "0:fail-allocs=1"]);
    assert_clean_failure(&o, "faults can only be injected into GPU-like devices");
}

#[test]
fn devices_lists_the_host_with_its_memory() {
    let o = strata(&["devices"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.lines().any(|l| l.starts_with("0  cpu")), "{out}");
    assert!(out.contains("CUDA devices: none (") || out.lines().any(|l| l.starts_with("cuda:")), "{out}");
    let v = json_of(&strata(&["devices", "--json"]));
    let d = &v["devices"][0];
    assert_eq!(d["kind"], "cpu");
    assert!(u(&d["total_bytes"]) > 0 && u(&d["free_bytes"]) <= u(&d["total_bytes"]), "{d}");
    assert_eq!(v["cuda_available"], false);
    let v = json_of(&strata(&["devices", "--devices", "sim:300", "--vram-reserve-mib", "64", "--json"]));
    let d = &v["devices"][0];
    assert_eq!((u(&d["total_bytes"]), u(&d["free_bytes"]), u(&d["reserve_bytes"])), (300 * MIB, 300 * MIB, 64 * MIB));
}

#[test]
fn run_on_a_two_sim_split_gives_the_cpu_tokens_and_shows_the_ledgers() {
    let base = ["run", "-p", "The quick brown fox", "--temp", "0", "-n", "16", "--ignore-eos", "--json"];
    let cpu = json_of(&strata(&base));
    let mut split = base.to_vec();
    split.extend(["--devices", "sim:200,sim:400", "--layer-split", "15"]);
    let v = json_of(&strata(&split));
    assert_eq!(v["tokens"], cpu["tokens"]);
    assert_eq!(v["tokens"].as_array().expect("tokens").len(), 16);
    let devices = v["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 3, "two sims and the host: {devices:?}");
    assert_eq!(devices[0]["device"], "0 (sim:200)");
    assert_eq!(devices[2]["device"], "2 (cpu)");
    for d in &devices[..2] {
        assert!(u(&d["weights_bytes"]) > 0 && u(&d["kv_bytes"]) > 0, "{d}");
        assert!(u(&d["high_water_bytes"]) >= u(&d["weights_bytes"]) + u(&d["kv_bytes"]), "{d}");
    }
    assert_eq!(u(&devices[0]["total_bytes"]), 200 * MIB);
    // Hidden states cross from stage 0 to stage 1 at every forward pass.
    assert!(u(&devices[1]["copies_in"]) > 0 && u(&devices[1]["copied_in_bytes"]) > 0, "{}", devices[1]);
    assert_eq!(u(&devices[2]["weights_bytes"]), 0);
    // On the host alone the one device holds everything.
    let cpu_devices = cpu["devices"].as_array().expect("devices");
    assert_eq!(cpu_devices.len(), 1);
    assert!(u(&cpu_devices[0]["weights_bytes"]) > 0 && u(&cpu_devices[0]["copies_in"]) == 0);
}

#[test]
fn an_injected_allocation_failure_ends_the_run_cleanly() {
    let args = [
        "run",
        "-p",
        "The quick brown fox",
        "-n",
        "8",
        "--devices",
        "sim:200,sim:400",
        "--layer-split",
        "15",
        "--sim-fault",
        "1:fail-allocs=1000",
    ];
    let o = strata(&args);
    assert_eq!(o.status.code(), Some(1));
    assert_clean_failure(&o, "device 1 (sim:400)");
    assert!(stderr(&o).contains("injected fault"), "{}", stderr(&o));
}

#[test]
fn a_kv_resident_window_moves_old_kv_to_the_host() {
    let prompt = "The history of the city is long and full of events. ".repeat(12);
    let base = ["run", "-p", &prompt, "--temp", "0", "-n", "16", "--ignore-eos", "--json"];
    let cpu = json_of(&strata(&base));
    let mut windowed = base.to_vec();
    windowed.extend(["--devices", "sim:200,sim:400", "--layer-split", "15", "--kv-resident", "64"]);
    let v = json_of(&strata(&windowed));
    assert!(u(&v["prompt_tokens"]) > 128, "{}", v["prompt_tokens"]);
    // Where a page lives does not change the arithmetic that decides the greedy tokens.
    assert_eq!(v["tokens"], cpu["tokens"]);
    let devices = v["devices"].as_array().expect("devices");
    let host = &devices[2];
    assert!(u(&host["kv_bytes"]) > 0, "older pages are on the host: {host}");
    // Each sim keeps only the window: at most two pages of 64 positions per layer (the newest 64 positions
    // can straddle a page boundary), a page being 64 positions * 192 values * f16 * (K, V).
    let page_bytes = 64 * 192 * 2 * 2;
    for d in &devices[..2] {
        assert!((15 * page_bytes..=15 * 2 * page_bytes).contains(&u(&d["kv_bytes"])), "{d}");
    }
}

#[test]
fn pressure_scripted_mid_prefill_moves_kv_to_the_host_and_keeps_the_tokens() {
    let prompt = "The history of the city is long and full of events. ".repeat(40);
    let base = ["run", "-p", &prompt, "--temp", "0", "-n", "8", "--ignore-eos", "--json", "-b", "128"];
    let cpu = json_of(&strata(&base));
    let faults = temp_file(
        "pressure.faults",
        b"# squeeze device 1 to its reserve once 256 positions are read\n1:leave-free-mib=8@tokens=256\n",
    );
    let mut squeezed = base.to_vec();
    let faults_arg = faults.to_str().expect("utf-8 path");
    squeezed.extend(["--devices", "sim:200,sim:400", "--layer-split", "15", "--vram-reserve-mib", "8"]);
    squeezed.extend(["--sim-faults", faults_arg]);
    let out = strata(&squeezed);
    let log = stderr(&out);
    assert!(log.contains("1 scheduled fault(s) applied at 256 tokens"), "{log}");
    assert!(log.contains("resident window shrank") && log.contains("reserve 8.0 MiB"), "{log}");
    let v = json_of(&out);
    assert!(u(&v["prompt_tokens"]) > 400, "{}", v["prompt_tokens"]);
    assert_eq!(v["tokens"], cpu["tokens"]);
    let devices = v["devices"].as_array().expect("devices");
    assert!(u(&devices[2]["kv_bytes"]) > 0, "device 1's older KV is on the host");
}

#[test]
fn synth_writes_the_same_runnable_model_for_the_same_seed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b, c) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"), dir.path().join("c.gguf"));
    for (path, seed) in [(&a, "7"), (&b, "7"), (&c, "8")] {
        let o = strata(&["synth", "-o", path.to_str().unwrap(), "--preset", "1b", "--layers", "1", "--seed", seed]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("n_embd 2048, FFN 5632"), "{}", stderr(&o));
    }
    let (ba, bb, bc) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), std::fs::read(&c).unwrap());
    assert!(ba == bb, "same seed, same file");
    assert!(ba != bc && ba.len() == bc.len(), "another seed, other weights of the same shape");
    let v =
        json_of(&strata(&["run", "-m", a.to_str().unwrap(), "-p", "the quick", "-n", "4", "--temp", "0", "--json"]));
    assert_eq!(v["tokens"].as_array().map(Vec::len), Some(4), "{v}");
    assert_clean_failure(&strata(&["synth", "-o", a.to_str().unwrap(), "--preset", "7b"]), "unknown --preset");
    assert_clean_failure(&strata(&["synth", "-o", a.to_str().unwrap(), "--type", "q9"]), "unknown --type");
}

#[test]
fn a_faulted_gpu_context_ends_the_process_with_the_restart_code() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model_file(dir.path());
    // Eight tokens in, the emulated GPU's context faults (as an illegal address would on a real one).
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "run",
            "-p",
            "hello there",
            "-n",
            "20",
            "--devices",
            "emu:64",
            "--sim-fault",
            "0:fault-context=1@tokens=8",
            "-m",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(err.contains("unhealthy") && err.contains("the context faulted"), "{err}");
    // Without the fault the same run succeeds on the emulated GPU.
    let ok = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["run", "-p", "hello there", "-n", "20", "--devices", "emu:64", "-m"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
}

#[test]
fn bench_on_an_emulated_gpu_reports_bandwidth_the_decode_floor_and_kv_copies() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model_file(dir.path());
    let o = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "bench",
            "-p",
            "32",
            "-n",
            "4",
            "-r",
            "1",
            "--devices",
            "emu:64",
            "--bandwidth",
            "--kv-tokens",
            "256",
            "--json",
            "-m",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    let g = &v["gpus"][0];
    for k in ["device_gbps", "h2d_pinned_gbps", "h2d_pageable_gbps"] {
        assert!(g[k].as_f64().expect(k) > 0.0, "{k}: {g}");
    }
    let floor = v["floor_tg_tok_s"].as_f64().expect("floor");
    let weights = v["weight_bytes"].as_f64().expect("weight bytes");
    assert!(
        (floor - g["device_gbps"].as_f64().unwrap() * 1e9 / weights).abs() < 1e-6 * floor,
        "floor = bandwidth / weights"
    );
    let kv = &v["kv_copies"];
    assert_eq!(kv["tokens"], 256);
    assert!(kv["restore_gbps"].as_f64().unwrap() > 0.0 && kv["park_gbps"].as_f64().unwrap() > 0.0, "{kv}");
}
