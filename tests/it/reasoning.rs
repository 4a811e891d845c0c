//! Thinking models: Qwen3's real chat template (tests/data/templates/qwen3-chat-template.jinja, from
//! Qwen/Qwen3-0.6B's tokenizer_config.json) rendered with its `enable_thinking` switch and earlier replies'
//! reasoning, and `strata serve` keeping a reply's reasoning apart: a tiny synthetic model served with that
//! template, plus a kwarg of the test's own that opens the `<think>` block in the generation prompt (as
//! DeepSeek-R1's template does), so that the reply starts inside the block whatever the model writes.
//! The splitter's rules (tags across pieces, unclosed blocks) are unit tests in src/tokenizer/reasoning.rs.

use crate::common;

use serde_json::{json, Value};
use strata::gguf::{GgufFile, GgufValue, GgufWriter};
use strata::model::synthetic::SyntheticSpec;
use strata::tokenizer::{ChatMessage, ChatTemplate, TemplateKwargs};

use crate::common::server::Server;

const QWEN3: &str = include_str!("../data/templates/qwen3-chat-template.jinja");

fn kwargs(v: Value) -> TemplateKwargs {
    v.as_object().expect("an object").clone()
}

#[test]
fn qwen3_template_switches_thinking_off_with_its_kwarg() {
    let t = ChatTemplate::new(QWEN3, "", "<|im_end|>").expect("compiles");
    let hi = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")];
    let base = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(t.render(&hi, true).unwrap(), base);
    assert_eq!(t.render_with(&hi, true, &kwargs(json!({"enable_thinking": true}))).unwrap(), base);
    let off = t.render_with(&hi, true, &kwargs(json!({"enable_thinking": false}))).unwrap();
    assert_eq!(off, format!("{base}<think>\n\n</think>\n\n"));
    // The render's own variables are never replaced by kwargs.
    let k = kwargs(json!({"messages": [], "add_generation_prompt": false, "enable_thinking": false}));
    assert_eq!(t.render_with(&hi, true, &k).unwrap(), off);
}

#[test]
fn qwen3_template_keeps_reasoning_only_after_the_last_question() {
    let t = ChatTemplate::new(QWEN3, "", "<|im_end|>").expect("compiles");
    // An earlier turn: its reasoning is dropped, whether sent apart or inline in the content.
    let earlier = [
        ChatMessage::new("user", "2+2?"),
        ChatMessage::new("assistant", "4").with_reasoning("Adding."),
        ChatMessage::new("user", "3+3?"),
    ];
    let want = "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n\
<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(t.render(&earlier, true).unwrap(), want);
    let mut inline = earlier.clone();
    inline[1] = ChatMessage::new("assistant", "<think>\nAdding.\n</think>\n\n4");
    assert_eq!(t.render(&inline, true).unwrap(), want);
    // A reply after the last question (a client continuing it): its reasoning goes back in the block.
    let last = [ChatMessage::new("user", "2+2?"), ChatMessage::new("assistant", "4").with_reasoning("\nAdding.\n")];
    assert_eq!(
        t.render(&last, false).unwrap(),
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nAdding.\n</think>\n\n4<|im_end|>\n"
    );
}

/// Starts `strata serve` on a tiny synthetic model whose chat template is Qwen3's, plus: with the kwarg
/// `open_think`, the generation prompt ends with `<think>\n`.
fn thinking_server(dir: &std::path::Path) -> Server {
    let file = GgufFile::from_bytes(SyntheticSpec::default().to_gguf()).expect("synthetic GGUF");
    let template = format!(
        "{QWEN3}\n{{%- if add_generation_prompt and open_think is defined and open_think %}}{{{{- '<think>\\n' }}}}{{%- endif %}}"
    );
    let mut w = GgufWriter::from_file(&file);
    w.set("tokenizer.chat_template", GgufValue::str(&template));
    let path = dir.join("thinker.gguf");
    std::fs::write(&path, w.to_bytes(3)).unwrap();
    Server::start(&["-m", path.to_str().unwrap(), "-c", "512"])
}

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "the weather"}],
        // Sampled, with a seed, and repeats penalized: the same reply every time, and not only whitespace
        // (the random model left alone writes newlines).
        "repeat_penalty": 100,
        "repeat_last_n": 64,
        "temperature": 1.5,
        "top_k": 0,
        "top_p": 1,
        "min_p": 0,
        "seed": 7,
        "max_tokens": 12,
        "ignore_eos": true,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[test]
fn the_server_passes_template_kwargs_and_keeps_the_reasoning_apart() {
    let _one = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let s = thinking_server(dir.path());
    let prompt_tokens = |body: Value| {
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    // enable_thinking reaches the template: off, the prompt ends with an empty closed block.
    let on = prompt_tokens(ask(json!({})));
    let off = prompt_tokens(ask(json!({"chat_template_kwargs": {"enable_thinking": false}})));
    assert!(off > on, "{off} vs {on}");
    assert_eq!(prompt_tokens(ask(json!({"enable_thinking": false}))), off);
    // An earlier reply's reasoning is accepted, and Qwen3's template drops it before the last question.
    let history = |reasoning: Option<&str>| {
        let mut a = json!({"role": "assistant", "content": "calm"});
        if let Some(r) = reasoning {
            a["reasoning_content"] = json!(r);
        }
        ask(json!({"messages": [{"role": "user", "content": "the sea"}, a, {"role": "user", "content": "and?"}]}))
    };
    assert_eq!(prompt_tokens(history(Some("the sea is calm today"))), prompt_tokens(history(None)));

    // The raw reply, then the same reply with the block opened by the prompt: all reasoning, no content.
    let raw = s.post(
        "/v1/chat/completions",
        &ask(json!({"reasoning_format": "none", "chat_template_kwargs": {"open_think": true}})),
    );
    let raw_msg = &raw.json()["choices"][0]["message"];
    let raw_text = raw_msg["content"].as_str().unwrap().to_owned();
    assert!(raw_msg.get("reasoning_content").is_none(), "{raw_msg}");
    assert!(!raw_text.trim().is_empty() && !raw_text.contains("</think>"), "{raw_text:?}");
    let whole = s.post("/v1/chat/completions", &ask(json!({"chat_template_kwargs": {"open_think": true}})));
    let msg = &whole.json()["choices"][0]["message"];
    assert_eq!(
        (msg["content"].as_str(), msg["reasoning_content"].as_str()),
        (Some(""), Some(raw_text.trim())),
        "{msg}"
    );
    // Without the block, the same kind of reply is all content and has no reasoning_content.
    let plain = s.post("/v1/chat/completions", &ask(json!({})));
    let plain_msg = &plain.json()["choices"][0]["message"];
    assert!(plain_msg.get("reasoning_content").is_none(), "{plain_msg}");
    let plain_raw = s.post("/v1/chat/completions", &ask(json!({"reasoning_format": "none"})));
    assert_eq!(plain_msg["content"], plain_raw.json()["choices"][0]["message"]["content"]);
    // The usage counts the block's tokens as reasoning (all 12: it never closes), whichever way the reply
    // comes back; a reply without a block has none.
    let reasoning_tokens =
        |r: &common::server::Resp| r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"].clone();
    assert_eq!(reasoning_tokens(&raw), json!(12), "{}", raw.text());
    assert_eq!(reasoning_tokens(&whole), json!(12), "{}", whole.text());
    assert_eq!(reasoning_tokens(&plain), json!(0), "{}", plain.text());

    // Streamed: reasoning_content deltas only, adding up to the whole reply's reasoning.
    let mut body = ask(json!({"chat_template_kwargs": {"open_think": true}, "logprobs": true}));
    body["stream"] = json!(true);
    let r = s.post("/v1/chat/completions", &body);
    let (content, chunks) = common::server::streamed_text(&r);
    assert_eq!(content, "");
    let mut reasoning = String::new();
    let mut logprob_tokens = 0;
    for c in &chunks {
        let choice = &c["choices"][0];
        if let Some(t) = choice["delta"]["reasoning_content"].as_str() {
            reasoning.push_str(t);
        }
        logprob_tokens += choice["logprobs"]["content"].as_array().map_or(0, Vec::len);
    }
    assert_eq!(reasoning, raw_text.trim());
    // Every generated token's log-probability is sent once, held-back text or not.
    assert_eq!(logprob_tokens, 12, "{chunks:?}");

    // Refused: a kwarg that would replace the render's own variables, an unknown reasoning_format, and
    // reasoning on a user message.
    for (extra, param) in [
        (json!({"chat_template_kwargs": {"messages": []}}), "chat_template_kwargs.messages"),
        (json!({"chat_template_kwargs": "x"}), "chat_template_kwargs"),
        (json!({"reasoning_format": "magic"}), "reasoning_format"),
        (
            json!({"messages": [{"role": "user", "content": "x", "reasoning_content": "y"}]}),
            "messages[0].reasoning_content",
        ),
    ] {
        let r = s.post("/v1/chat/completions", &ask(extra.clone()));
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{extra}");
    }
    let err = s.stderr();
    assert!(!err.contains("panicked"), "{err}");
}

/// `strata chat` on the synthetic model with Qwen3's template, the generation prompt ending with `<think>\n`
/// when `open` (every reply starts inside the block): the reasoning goes to standard error, the answer
/// alone to standard output.
#[test]
fn strata_chat_prints_the_reasoning_apart_from_the_answer() {
    let _one = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let chat = |open: bool| {
        let file = GgufFile::from_bytes(SyntheticSpec::default().to_gguf()).expect("synthetic GGUF");
        let opener = if open { "{%- if add_generation_prompt %}{{- '<think>\\n' }}{%- endif %}" } else { "" };
        let mut w = GgufWriter::from_file(&file);
        w.set("tokenizer.chat_template", GgufValue::str(&format!("{QWEN3}\n{opener}")));
        let path = dir.path().join(format!("chat-{open}.gguf"));
        std::fs::write(&path, w.to_bytes(3)).unwrap();
        let args = [
            "chat",
            "-m",
            path.to_str().unwrap(),
            "--message",
            "the weather",
            "-n",
            "12",
            "--temp",
            "1.5",
            "--top-k",
            "0",
            "--top-p",
            "1",
            "--min-p",
            "0",
            "--seed",
            "7",
            "--repeat-penalty",
            "100",
            "--repeat-last-n",
            "64",
        ];
        let o = common::strata(&args);
        assert!(o.status.success(), "{}", common::stderr(&o));
        (common::stdout(&o), common::stderr(&o))
    };
    let (plain_out, plain_err) = chat(false);
    let (think_out, think_err) = chat(true);
    // Without the block the reply is the answer, on standard output.
    assert!(!plain_out.trim().is_empty(), "{plain_out:?}");
    // Inside a block that never closes, the reply is all reasoning: on standard error, none on standard
    // output (the line break that ends a reply aside).
    assert_eq!(think_out.trim(), "", "{think_out:?}");
    assert!(think_err.trim().len() > plain_err.trim().len(), "{think_err:?} vs {plain_err:?}");
}
