//! The `strata` binary end to end: every subcommand on the default model, and bad input of every kind
//! (one clear line naming the cause, a non-zero exit, never a panic).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use strata::gguf::{GgufValue, GgufWriter};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .env("STRATA_MODEL", common::model_path())
        .output()
        .expect("the strata binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

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
    // 30 layers * 192 * 2 (K, V) * 2 bytes.
    assert!(out.contains("23040 bytes/token"), "{out}");
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
    for (k, v) in [("block_count", 1), ("embedding_length", 4), ("feed_forward_length", 4), ("attention.head_count", 8)]
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
}
