//! Untrusted model files and inputs (issue 10): every input here once aborted, hung, or gave a wrong or
//! unclear message. Each test writes its file (the default model with one thing changed, or a special
//! file), runs the binary the way a user would, under an address-space limit where the input is about
//! memory, and checks for one error line naming the cause and a non-zero exit, or for the right behaviour.

use crate::common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use strata::gguf::{GgufFile, GgufValue, GgufWriter};

/// The address-space limit of the runs about memory (`ulimit -v`): 4 GiB, far below what a blow-up
/// reserves and well above what a normal run of the default model takes.
const LIMIT_BYTES: u64 = 4 << 30;
/// A run that takes longer than this is taken as hung and killed (no input here needs more than seconds).
const HANG_SECS: u64 = 120;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `strata args` with the default model, stdin from `stdin` (or nothing), under `limit_bytes` of
/// address space when given; kills it and fails the test when it runs past [`HANG_SECS`].
fn strata_with(args: &[&str], stdin: Option<&Path>, limit_bytes: Option<u64>, envs: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.args(args).env("STRATA_MODEL", common::model_path()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.stdin(match stdin {
        Some(p) => Stdio::from(std::fs::File::open(p).expect("stdin file")),
        None => Stdio::null(),
    });
    if let Some(limit) = limit_bytes {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let rl = libc::rlimit { rlim_cur: limit as libc::rlim_t, rlim_max: limit as libc::rlim_t };
                if libc::setrlimit(libc::RLIMIT_AS, &rl) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("the strata binary runs");
    let pid = child.id();
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(HANG_SECS);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = child.wait();
            panic!("strata {args:?} hung: killed after {HANG_SECS} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&out_reader.join().expect("reader")).into_owned(),
        stderr: String::from_utf8_lossy(&err_reader.join().expect("reader")).into_owned(),
    }
}

fn strata(args: &[&str]) -> Run {
    strata_with(args, None, None, &[])
}

fn strata_limited(args: &[&str]) -> Run {
    strata_with(args, None, Some(LIMIT_BYTES), &[])
}

/// A failed run: exit 1 or 2 (not an abort, not a signal), one line on stderr, naming `needle`.
fn assert_clean_failure(r: &Run, needle: &str) {
    assert!(
        matches!(r.code, Some(1) | Some(2)),
        "exit {:?} (an abort is 134, a kill has none); stderr: {}",
        r.code,
        r.stderr
    );
    assert!(!r.stderr.contains("panicked") && !r.stderr.contains("memory allocation"), "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {}", r.stderr);
    assert!(lines[0].starts_with("strata: error: "), "{:?}", lines[0]);
    assert!(lines[0].contains(needle), "expected {needle:?} in {:?}", lines[0]);
}

fn dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir")).path()
}

/// The default model, open.
fn default_model() -> &'static GgufFile {
    static FILE: OnceLock<GgufFile> = OnceLock::new();
    FILE.get_or_init(|| GgufFile::open(&common::model_path()).expect("the default model opens"))
}

/// The default model rewritten with `edit` applied, as `name` in the test directory.
fn edited(name: &str, edit: impl FnOnce(&mut GgufWriter)) -> PathBuf {
    let mut w = GgufWriter::from_file(default_model());
    edit(&mut w);
    let p = dir().join(name);
    std::fs::write(&p, w.to_bytes(3)).expect("write the edited model");
    p
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir().join(name);
    std::fs::write(&p, bytes).expect("write");
    p
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

// 1. Hyper-parameters are checked against the tensors before anything is allocated by them.

#[test]
fn a_huge_block_count_is_refused_before_allocating_by_it() {
    let m = edited("blocks-huge.gguf", |w| {
        w.set("llama.block_count", GgufValue::U32(16_777_215));
    });
    let m = path_str(&m);
    let script =
        write("one-chat.jsonl", b"{\"op\":\"chat\",\"conversation\":\"a\",\"user\":\"hi\",\"max_tokens\":2}\n");
    for args in [
        vec!["run", "-m", m, "-p", "hi", "-n", "2"],
        vec!["chat", "-m", m, "--message", "hi", "-n", "2"],
        vec!["plan", "-m", m],
        vec!["bench", "-m", m, "-p", "8", "-n", "2", "-r", "1"],
        vec!["replay", path_str(&script), "-m", m],
    ] {
        let r = strata_limited(&args);
        assert_clean_failure(
            &r,
            "llama.block_count is 16777215 but the file has tensors for 30 blocks (blk.0 to blk.29)",
        );
    }
}

#[test]
fn more_block_tensors_than_the_block_count_are_refused() {
    let m = edited("blocks-fewer.gguf", |w| {
        w.set("llama.block_count", GgufValue::U32(29));
    });
    let r = strata(&["run", "-m", path_str(&m), "-p", "hi", "-n", "2"]);
    assert_clean_failure(&r, "llama.block_count is 29 but the file has tensors for 30 blocks");
}

// 2. Chat templates render within a budget of steps and output.

#[test]
fn a_template_that_writes_without_end_fails_fast_naming_the_template() {
    // The reported template (10 bytes per inner loop) runs out of steps or of output, whichever is first.
    let src = "{% for a in range(100000) %}{% for b in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}";
    let m = edited("template-writes.gguf", |w| {
        w.set("tokenizer.chat_template", GgufValue::str(src));
    });
    let r = strata_limited(&["chat", "-m", path_str(&m), "--message", "hi", "-n", "2"]);
    assert_clean_failure(&r, "the model's chat template (tokenizer.chat_template) ");
    assert!(r.stderr.contains("ran more than") || r.stderr.contains("wrote more than"), "{}", r.stderr);
    // A megabyte per step meets the output cap.
    let m = edited("template-floods.gguf", |w| {
        w.set("tokenizer.chat_template", GgufValue::str("{% for a in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}"));
    });
    let r = strata_limited(&["chat", "-m", path_str(&m), "--message", "hi", "-n", "2"]);
    assert_clean_failure(
        &r,
        "the model's chat template (tokenizer.chat_template) wrote more than its output cap of 16 MiB",
    );
}

#[test]
fn a_broken_or_missing_chat_template_file_is_refused_naming_the_file() {
    let bad = write("broken.jinja", b"{% for m in messages %}{{ m.content ");
    let r = strata(&["serve", "--port", "0", "--chat-template-file", path_str(&bad)]);
    assert_clean_failure(&r, "broken.jinja");
    let r = strata(&["serve", "--port", "0", "--chat-template-file", "/nonexistent/t.jinja"]);
    assert_clean_failure(&r, "/nonexistent/t.jinja");
    let r = strata(&["serve", "--port", "0", "--pooling", "rank"]);
    assert!(r.code == Some(2) && r.stderr.contains("none, mean, cls or last"), "{}", r.stderr);
}

#[test]
fn a_template_that_loops_without_end_fails_fast_naming_the_template() {
    let src = "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}{% endfor %}\
               {% endfor %}{% endfor %}";
    let m = edited("template-loops.gguf", |w| {
        w.set("tokenizer.chat_template", GgufValue::str(src));
    });
    let script =
        write("loop-chat.jsonl", b"{\"op\":\"chat\",\"conversation\":\"a\",\"user\":\"hi\",\"max_tokens\":2}\n");
    for args in [
        vec!["chat", "-m", path_str(&m), "--message", "hi", "-n", "2"],
        vec!["replay", path_str(&script), "-m", path_str(&m)],
    ] {
        let r = strata_limited(&args);
        assert_clean_failure(&r, "the model's chat template (tokenizer.chat_template) ran more than");
    }
}

// 3. bench is bounded by the context and by memory.

#[test]
fn bench_sizes_are_bounded_by_the_context_and_memory() {
    let r = strata_limited(&["bench", "-p", "1000000000000", "-n", "0", "-r", "1"]);
    assert_clean_failure(
        &r,
        "bench -p 1000000000000: the test needs 1000000000000 positions but the context holds 8192",
    );
    let r = strata_limited(&["bench", "-p", "0", "-n", "800000", "-r", "1"]);
    assert_clean_failure(&r, "bench -n 800000: the test needs 800000 positions but the context holds 8192");
    let r = strata_limited(&["bench", "--bandwidth", "--kv-tokens", "4294967295", "-p", "0", "-n", "0"]);
    assert_clean_failure(&r, "bench --kv-tokens 4294967295: the test needs 4294967295 positions");
    // -c is honoured (item 15): a test longer than it is refused.
    let r = strata_limited(&["bench", "-c", "64", "-p", "128", "-n", "0", "-r", "1"]);
    assert_clean_failure(&r, "the context holds 64");
    // A context that allows it: the KV of 800,000 positions (18 GB) does not fit 4 GiB of address space.
    let r = strata_limited(&["bench", "-c", "1000000", "-p", "0", "-n", "800000", "-r", "1"]);
    assert!(matches!(r.code, Some(1)), "exit {:?}: {}", r.code, r.stderr);
    let last = r.stderr.lines().last().unwrap_or("");
    assert!(last.starts_with("strata: error: "), "{}", r.stderr);
    assert!(last.contains("the KV cache of 800000 positions needs") || last.contains("the OS refused"), "{last}");
}

// 4. The host and simulated GPUs promise no more than the host has.

#[test]
fn a_sim_device_larger_than_the_host_refuses_what_the_host_cannot_hold() {
    let r =
        strata_limited(&["bench", "--devices", "sim:16777216", "-c", "1000000", "-p", "0", "-n", "800000", "-r", "1"]);
    assert!(matches!(r.code, Some(1)), "exit {:?}: {}", r.code, r.stderr);
    let last = r.stderr.lines().last().unwrap_or("");
    assert!(last.starts_with("strata: error: ") && !r.stderr.contains("memory allocation"), "{}", r.stderr);
    assert!(last.contains("needs") || last.contains("the OS refused"), "{last}");
    // Directly: an allocation beyond what the host has is refused, naming the need and what is available.
    use strata::device::{Device, Purpose};
    let sim = Device::sim(0, 16 << 40, 0);
    let e = sim.alloc(Purpose::Kv, 8 << 40).unwrap_err().to_string();
    assert!(e.contains("KV allocation of 8388608.0 MiB refused: a simulated GPU keeps its data in host memory"), "{e}");
    // Weights are mapped from the file, not allocated: the OS pages them, so the host check leaves them be.
    assert!(sim.alloc(Purpose::Weights, 8 << 40).is_ok());
    let cpu = Device::cpu(0);
    let e = cpu.alloc(Purpose::Kv, cpu.total_bytes()).unwrap_err().to_string();
    assert!(e.contains("the host keeps its data in host memory, which has"), "{e}");
}

// 5. Whole-file reads are capped.

#[test]
fn endless_inputs_are_capped() {
    let zero = Path::new("/dev/zero");
    let r = strata_limited(&["run", "-p", "hi", "--sim-faults", "/dev/zero"]);
    assert_clean_failure(&r, "--sim-faults /dev/zero is larger than the 1 MiB this command reads");
    let r = strata_limited(&["replay", "/dev/zero"]);
    assert_clean_failure(&r, "script /dev/zero is larger than the 64 MiB this command reads");
    let r = strata_limited(&["perplexity", "-f", "/dev/zero"]);
    assert_clean_failure(&r, "text file /dev/zero is larger than the 256 MiB this command reads");
    let r = strata_with(&["chat", "-n", "2"], Some(zero), Some(LIMIT_BYTES), &[]);
    assert_clean_failure(&r, "a line of standard input is longer than 8 MiB");
}

// 6 and 12. A model must be a regular file; the model's location is named.

#[test]
fn a_model_that_is_not_a_regular_file_is_refused_without_waiting() {
    let fifo = dir().join("model.fifo");
    let c = std::ffi::CString::new(path_str(&fifo)).expect("path");
    // SAFETY: a plain mkfifo on a path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let r = strata(&["run", "-m", path_str(&fifo), "-p", "hi"]);
    assert_clean_failure(&r, "model.fifo is a FIFO (named pipe), not a GGUF file");
    let r = strata(&["info", "-m", path_str(dir())]);
    assert_clean_failure(&r, "is a directory, not a GGUF file");
    let r = strata(&["run", "-m", "/dev/null", "-p", "hi"]);
    assert_clean_failure(&r, "/dev/null is a character device, not a GGUF file");
    assert!(!r.stderr.contains("No such device") && !r.stderr.contains("byte offset"), "{}", r.stderr);
    let empty = write("empty.gguf", b"");
    let r = strata(&["run", "-m", path_str(&empty), "-p", "hi"]);
    assert_clean_failure(&r, "empty.gguf is empty (0 bytes), not a GGUF file");
    let r = strata_with(&["run", "-p", "hi"], None, None, &[("STRATA_MODEL", "")]);
    assert_clean_failure(&r, "STRATA_MODEL is set but empty");
}

// 7. A truncated file says that it ends early, where, and how much was expected.

#[test]
fn a_truncated_model_says_it_ends_early() {
    let bytes = std::fs::read(common::model_path()).expect("model");
    let head = write("first-4k.gguf", &bytes[..4096]);
    let r = strata(&["run", "-m", path_str(&head), "-p", "hi"]);
    assert_clean_failure(&r, "the file ends early (truncated: a partial download?)");
    assert!(r.stderr.contains("bytes here but the file ends") && r.stderr.contains("at byte offset"), "{}", r.stderr);
    assert!(!r.stderr.contains("too large"), "{}", r.stderr);
    let part = write("partial.gguf", &bytes[..60_000_000]);
    let r = strata(&["info", "-m", path_str(&part)]);
    assert_clean_failure(
        &r,
        &format!("the file ends early (its tensors need {} bytes: a partial download?)", bytes.len()),
    );
}

// 8. A key of the wrong type names the key, the type found and the type expected.

#[test]
fn a_key_of_the_wrong_type_is_named_with_both_types() {
    let m = edited("alignment-string.gguf", |w| {
        w.set("general.alignment", GgufValue::str("32"));
    });
    let r = strata(&["run", "-m", path_str(&m), "-p", "hi"]);
    assert_clean_failure(&r, "metadata key general.alignment is a string (\"32\"), expected an unsigned integer");
    let m = edited("arch-u32.gguf", |w| {
        w.set("general.architecture", GgufValue::U32(7));
    });
    let r = strata(&["run", "-m", path_str(&m), "-p", "hi"]);
    assert_clean_failure(&r, "model metadata general.architecture is a u32 (7), expected a string");
    let m = edited("heads-float.gguf", |w| {
        w.set("llama.attention.head_count", GgufValue::F32(9.0));
    });
    let r = strata(&["run", "-m", path_str(&m), "-p", "hi"]);
    assert_clean_failure(&r, "llama.attention.head_count is an f32 (9), expected an unsigned integer");
    let m = edited("bos-string.gguf", |w| {
        w.set("tokenizer.ggml.bos_token_id", GgufValue::str("1"));
    });
    let r = strata(&["run", "-m", path_str(&m), "-p", "hi"]);
    assert_clean_failure(&r, "`tokenizer.ggml.bos_token_id` is a string (\"1\"), expected a token id");
}

// 9. Heads that do not divide the embedding, and heads or an FFN the matrices do not have.

#[test]
fn hyper_parameters_the_matrices_do_not_have_are_named() {
    let m = edited("heads-6.gguf", |w| {
        w.set("llama.attention.head_count", GgufValue::U32(6));
    });
    let r = strata(&["plan", "-m", path_str(&m)]);
    assert_clean_failure(
        &r,
        "blk.0.attn_k.weight has shape [576, 192], but the hyper-parameters (3 KV heads of 96) make it [576, 288]",
    );
}

/// The qwen3moe fixture rewritten with `edit` applied, as `name` in the test directory.
fn edited_moe(name: &str, edit: impl FnOnce(&mut GgufWriter)) -> PathBuf {
    let file = GgufFile::open(&common::families::file("qwen3moe.gguf")).expect("the qwen3moe fixture opens");
    let mut w = GgufWriter::from_file(&file);
    edit(&mut w);
    let p = dir().join(name);
    std::fs::write(&p, w.to_bytes(3)).expect("write the edited model");
    p
}

#[test]
fn expert_counts_the_tensors_do_not_have_are_named() {
    let m = edited_moe("moe-used-9.gguf", |w| {
        w.set("qwen3moe.expert_used_count", GgufValue::U32(9));
    });
    assert_clean_failure(
        &strata(&["plan", "-m", path_str(&m)]),
        "qwen3moe.expert_used_count is 9, more than the 8 experts",
    );
    let m = edited_moe("moe-count-huge.gguf", |w| {
        w.set("qwen3moe.expert_count", GgufValue::U32(4_000_000));
    });
    assert_clean_failure(&strata(&["plan", "-m", path_str(&m)]), "qwen3moe.expert_count");
    let m = edited_moe("moe-count-16.gguf", |w| {
        w.set("qwen3moe.expert_count", GgufValue::U32(16));
    });
    assert_clean_failure(&strata(&["plan", "-m", path_str(&m)]), "blk.0.ffn_gate_inp.weight has shape [64, 8]");
    let m = edited_moe("moe-no-count.gguf", |w| {
        w.remove("qwen3moe.expert_count");
    });
    assert_clean_failure(&strata(&["plan", "-m", path_str(&m)]), "qwen3moe.expert_count");
    let m = edited_moe("moe-no-router.gguf", |w| {
        w.remove_tensor("blk.1.ffn_gate_inp.weight");
    });
    assert_clean_failure(&strata(&["run", "-m", path_str(&m), "-p", "hi"]), "blk.1.ffn_gate_inp.weight");
    // A family without experts refuses a count rather than ignore it.
    let m = edited("dense-with-experts.gguf", |w| {
        w.set("general.architecture", GgufValue::str("qwen2"));
        for (k, v) in &default_model().metadata {
            if let Some(rest) = k.strip_prefix("llama.") {
                w.set(&format!("qwen2.{rest}"), v.clone());
            }
        }
        w.set("qwen2.expert_count", GgufValue::U32(4));
    });
    assert_clean_failure(
        &strata(&["plan", "-m", path_str(&m)]),
        "Strata runs mixtures of experts for llama, qwen3moe, gpt-oss only",
    );
}

#[test]
fn a_head_count_that_does_not_divide_the_embedding_is_named() {
    let m = edited("heads-7.gguf", |w| {
        w.set("llama.attention.head_count", GgufValue::U32(7));
        w.remove("llama.attention.key_length");
    });
    let r = strata(&["run", "-m", path_str(&m), "-p", "hi"]);
    assert_clean_failure(&r, "llama.embedding_length 576 is not a multiple of llama.attention.head_count 7");
}

// 10. BOS and EOS ids outside the vocabulary.

#[test]
fn special_ids_outside_the_vocabulary_are_refused_not_replaced() {
    for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"] {
        let m = edited("bad-special.gguf", |w| {
            w.set(key, GgufValue::U32(100_000));
        });
        let r = strata(&["run", "-m", path_str(&m), "-p", "hi", "-n", "1"]);
        assert_clean_failure(&r, &format!("`{key}` is 100000, outside the vocabulary of 49152 tokens"));
    }
    // Other special ids are ignored with a warning, as llama.cpp does, and the model runs.
    let m = edited("bad-padding.gguf", |w| {
        w.set("tokenizer.ggml.padding_token_id", GgufValue::U32(100_000));
    });
    let r = strata(&["run", "-m", path_str(&m), "-p", "hi", "-n", "1", "--temp", "0"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("ignoring tokenizer.ggml.padding_token_id 100000"), "{}", r.stderr);
    // -1 stands for none in some files: ignored the same way.
    let m = edited("minus-one-padding.gguf", |w| {
        w.set("tokenizer.ggml.padding_token_id", GgufValue::I32(-1));
    });
    let r = strata(&["run", "-m", path_str(&m), "-p", "hi", "-n", "1", "--temp", "0"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("ignoring tokenizer.ggml.padding_token_id -1"), "{}", r.stderr);
}

// 11. The tokenizer's vocabulary against the embedding rows.

#[test]
fn a_tokenizer_smaller_than_the_embedding_is_refused() {
    let tokens: Vec<String> = default_model()
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .and_then(|a| a.strings())
        .expect("tokens")
        .iter()
        .take(1000)
        .map(|s| s.to_string())
        .collect();
    let m = edited("vocab-1000.gguf", |w| {
        w.set("tokenizer.ggml.tokens", GgufValue::strs(&tokens));
        w.remove("llama.vocab_size");
    });
    let r = strata(&["run", "-m", path_str(&m), "-p", "hi"]);
    assert_clean_failure(
        &r,
        "the tokenizer (tokenizer.ggml.tokens) has 1000 tokens but token_embd.weight has 49152 rows",
    );
    let m = edited("vocab-size.gguf", |w| {
        w.set("tokenizer.ggml.tokens", GgufValue::strs(&tokens));
        w.set("llama.vocab_size", GgufValue::U32(49152));
    });
    let r = strata(&["plan", "-m", path_str(&m)]);
    assert_clean_failure(&r, "llama.vocab_size is 49152 but the tokenizer (tokenizer.ggml.tokens) has 1000 tokens");
}

// 13. Negative numbers are values, refused by their range.

#[test]
fn negative_numbers_get_the_range_message() {
    for (flag, needle) in [("-n", "-1 is not in 1..=4294967295"), ("-c", "-1 is not in 1..=4294967295")] {
        let r = strata(&["run", "-p", "hi", flag, "-1"]);
        assert_eq!(r.code, Some(2), "{}", r.stderr);
        assert_clean_failure(&r, needle);
        assert!(!r.stderr.contains("unexpected argument"), "{}", r.stderr);
    }
    let r = strata(&["run", "-p", "hi", "--temp", "-1"]);
    assert_clean_failure(&r, "--temp must be a number >= 0, got -1");
    let r = strata(&["bench", "-p", "-5"]);
    assert_clean_failure(&r, "-5 is negative: a token count is 0 or more");
}

// 14. plan checks the host and the KV.

#[test]
fn plan_refuses_a_context_the_host_cannot_hold() {
    let r = strata(&["plan", "-c", "4294967295"]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_clean_failure(&r, "the host needs");
    assert!(r.stderr.contains("at 4294967295 positions") && r.stderr.contains("short by"), "{}", r.stderr);
    let r = strata(&["plan", "-c", "4096"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
}

// 15. The smaller messages.

#[test]
fn small_misuses_get_clear_messages() {
    let text = write("short.txt", "the quick brown fox ".repeat(200).as_bytes());
    let r = strata(&["perplexity", "-f", path_str(&text), "--chunks", "0"]);
    assert_clean_failure(&r, "0 is not in 1..");
    assert!(!r.stderr.contains("short.txt"), "--chunks 0 is not the file's fault: {}", r.stderr);
    let r = strata(&["chat", "--message", ""]);
    assert_clean_failure(&r, "--message is empty");
    let m = edited("template-empty.gguf", |w| {
        w.set("tokenizer.chat_template", GgufValue::str(""));
    });
    let r = strata(&["chat", "-m", path_str(&m), "--message", "hi"]);
    assert_clean_failure(&r, "the model's chat template (tokenizer.chat_template) rendered nothing");
}

#[test]
fn replay_scripts_are_checked_whole_before_anything_runs() {
    let chat = "{\"op\":\"chat\",\"conversation\":\"a\",\"user\":\"hi\",\"max_tokens\":2}";
    let bad_fork = "{\"op\":\"fork\",\"from\":\"a\",\"to\":\"b\",\"drop_last\":5}";
    let script = write("bad-fork.jsonl", format!("{chat}\n{bad_fork}\n").as_bytes());
    let r = strata(&["replay", path_str(&script)]);
    assert_clean_failure(&r, "line 2: fork drops 5 messages but conversation \"a\" has 2 by then");
    assert!(r.stdout.is_empty(), "nothing ran: {}", r.stdout);
    let script = write("bad-json.jsonl", format!("{chat}\n   {{\"op\" \"chat\"}}\n").as_bytes());
    let r = strata(&["replay", path_str(&script)]);
    assert_clean_failure(&r, "line 2, column 10: expected `:`");
    // A script saved with a byte-order mark runs.
    let script = write("bom.jsonl", format!("\u{feff}{chat}\n").as_bytes());
    let r = strata(&["replay", path_str(&script)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("\"event\":\"response\""), "{}", r.stdout);
}

// 16. Every type synth offers is accepted.

#[test]
fn synth_takes_every_type_its_help_offers() {
    for ty in ["q4_k", "q5_k", "q6_k", "Q4_K", "q8_0"] {
        let out = dir().join(format!("synth-{ty}.gguf"));
        let r = strata(&["synth", "-o", path_str(&out), "--type", ty, "--layers", "1"]);
        assert_eq!(r.code, Some(0), "--type {ty}: {}", r.stderr);
        let r = strata(&["run", "-m", path_str(&out), "-p", "hello", "-n", "2", "--temp", "0"]);
        assert_eq!(r.code, Some(0), "--type {ty}: {}", r.stderr);
    }
}

// 17. A full context is said.

#[test]
fn a_prompt_that_fills_the_context_says_so() {
    let prompt = "The capital of France is";
    let r = strata(&["run", "-p", prompt, "-n", "1", "--temp", "0", "--json"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("json");
    let n = v["prompt_tokens"].as_u64().expect("prompt_tokens").to_string();
    let r = strata(&["run", "-p", prompt, "-c", &n, "-n", "8", "--temp", "0"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("stopped: the context is full ({n} positions, -c): the prompt took {n} of them")),
        "{}",
        r.stderr
    );
}

/// Writes the seeds of the `model_load` fuzz target (fuzz/seeds/model_load): micro models of each
/// tokenizer kind and architecture, and the hostile cases above made small. Run by hand:
/// `cargo test --release --test it -- --ignored hardening::write_model_fuzz_seeds`.
#[test]
#[ignore = "writes fuzz seeds into the source tree"]
fn write_model_fuzz_seeds() {
    use strata::model::synthetic::{SyntheticSpec, SyntheticVocab};
    use strata::quant::GgmlType;
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/model_load");
    std::fs::create_dir_all(&out).expect("seed dir");
    let micro = SyntheticSpec {
        n_layer: 1,
        n_embd: 64,
        n_head: 2,
        n_head_kv: 1,
        n_ff: 128,
        n_ctx_train: 64,
        embd_type: GgmlType::Q8_0,
        ..SyntheticSpec::default()
    };
    let spm = SyntheticSpec { vocab: SyntheticVocab::Spm, matrix_types: vec![GgmlType::Q4_0], ..micro.clone() };
    let qwen = SyntheticSpec { arch: "qwen2", qkv_bias: true, output_type: Some(GgmlType::F16), ..micro.clone() };
    let mut seeds: Vec<(&str, Vec<u8>)> = vec![
        ("micro-llama-bpe.gguf", micro.to_gguf()),
        ("micro-llama-spm.gguf", spm.to_gguf()),
        ("micro-qwen2.gguf", qwen.to_gguf()),
    ];
    let edit = |image: &[u8], f: &dyn Fn(&mut GgufWriter)| {
        let mut w = GgufWriter::from_file(&GgufFile::from_bytes(image.to_vec()).expect("seed parses"));
        f(&mut w);
        w.to_bytes(3)
    };
    let base = micro.to_gguf();
    seeds.push((
        "blocks-huge.gguf",
        edit(&base, &|w| {
            w.set("llama.block_count", GgufValue::U32(16_777_215));
        }),
    ));
    seeds.push((
        "template-loops.gguf",
        edit(&base, &|w| {
            w.set(
                "tokenizer.chat_template",
                GgufValue::str("{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"),
            );
        }),
    ));
    seeds.push((
        "template-llama3.gguf",
        edit(&base, &|w| {
            w.set(
            "tokenizer.chat_template",
            GgufValue::str(
                "{% for m in messages %}{% if loop.first %}{{ bos_token }}{% endif %}<|start_header_id|>{{ m.role }}\
                 <|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}\
                 <|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
            ),
        );
        }),
    ));
    seeds.push((
        "bos-out-of-range.gguf",
        edit(&base, &|w| {
            w.set("tokenizer.ggml.bos_token_id", GgufValue::U32(1 << 20));
        }),
    ));
    for (name, bytes) in seeds {
        std::fs::write(out.join(name), &bytes).expect("write seed");
    }
}
