//! Tool calling through a template that knows tools: Qwen3's real chat template (Hermes `<tool_call>`
//! format) renders the offered tools, earlier calls and their results as the model was trained on them; and
//! `strata serve` on a random-weights model with that template answers `tool_choice` required with calls
//! valid under their schemas, whole and streamed, because the grammar leaves it no other choice. The call
//! formats themselves (parsing in any slicing, Llama 3, Mistral) are unit tests in src/tools/tests.rs; the
//! official client on the default model (a template without tools) is in tests/openai_client.py.

use serde_json::{json, Value};

use strata::gguf::{GgufFile, GgufValue, GgufWriter};
use strata::model::synthetic::{SyntheticSpec, SyntheticVocab, HARMONY_TEMPLATE};
use strata::tokenizer::{ChatMessage, ChatTemplate};
use strata::tools::{prepare_messages, Tool, ToolFormat};

use crate::common;
use crate::common::server::{streamed_text, Server};

const QWEN3: &str = include_str!("../data/templates/qwen3-chat-template.jinja");

fn weather() -> Tool {
    Tool {
        name: "get_weather".into(),
        description: Some("The weather in a city".into()),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}),
    }
}

/// An assistant turn that called `get_weather` for Oslo, 2 days (id c1).
fn oslo_call() -> ChatMessage {
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls.push(json!({"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}));
    call
}

#[test]
fn qwen3_renders_tools_calls_and_results_itself() {
    assert_eq!(ToolFormat::of_template(QWEN3), (ToolFormat::Hermes, true));
    let t = ChatTemplate::new(QWEN3, "", "<|im_end|>").expect("compiles");
    let call = oslo_call();
    let mut result = ChatMessage::new("tool", "rain");
    result.tool_call_id = Some("c1".into());
    let mut messages = vec![ChatMessage::new("user", "Weather in Oslo?"), call, result];
    // A template that knows tools gets the messages as they are.
    prepare_messages(&mut messages, Some(&[weather()]), ToolFormat::Hermes, true);
    assert_eq!(messages.len(), 3);
    let kwargs = json!({"tools": [weather().to_openai()]}).as_object().unwrap().clone();
    let text = t.render_with(&messages, true, &kwargs).unwrap();
    assert!(text.contains("<tools>") && text.contains("\"name\": \"get_weather\""), "{text}");
    assert!(
        text.contains(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>"
        ),
        "{text}"
    );
    assert!(text.contains("<tool_response>\nrain\n</tool_response>"), "{text}");
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
}

#[test]
fn a_template_without_tools_reads_them_in_the_system_message_and_results_as_user_turns() {
    let call = oslo_call();
    let mut r1 = ChatMessage::new("tool", "rain");
    r1.tool_call_id = Some("c1".into());
    let mut r2 = ChatMessage::new("tool", "wind");
    r2.tool_call_id = Some("c2".into());
    let mut messages = vec![ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Oslo?"), call, r1, r2];
    prepare_messages(&mut messages, Some(&[weather()]), ToolFormat::Hermes, false);
    let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert!(messages[0].content.starts_with("Be brief.\n\n") && messages[0].content.contains("get_weather"));
    assert!(messages[2].content.starts_with("<tool_call>\n{") && messages[2].tool_calls.is_empty());
    assert_eq!(messages[3].content, "<tool_response>\nrain\n</tool_response>\n<tool_response>\nwind\n</tool_response>");
}

/// `strata serve` on the synthetic model with Qwen3's template.
fn qwen_server(dir: &std::path::Path) -> Server {
    let file = GgufFile::from_bytes(SyntheticSpec::default().to_gguf()).expect("synthetic GGUF");
    let mut w = GgufWriter::from_file(&file);
    w.set("tokenizer.chat_template", GgufValue::str(QWEN3));
    let path = dir.join("toolish.gguf");
    std::fs::write(&path, w.to_bytes(3)).unwrap();
    Server::start(&["-m", path.to_str().unwrap(), "-c", "2048"])
}

fn valid_weather_args(arguments: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(arguments) else { return false };
    let Some(o) = v.as_object() else { return false };
    let city_ok = o.get("city").and_then(Value::as_str).is_some_and(|c| c.chars().count() <= 12);
    let days_ok = o.get("days").and_then(Value::as_i64).is_some_and(|d| (1..=7).contains(&d));
    o.len() == 2 && city_ok && days_ok
}

#[test]
fn a_random_model_must_answer_required_with_valid_calls_whole_and_streamed() {
    let _one = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let s = qwen_server(dir.path());
    let tools = json!([weather().to_openai(), {"type": "function", "function": {"name": "noop"}}]);
    for seed in 0..6 {
        let body = json!({
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "temperature": 1.0, "seed": seed, "max_tokens": 300, "parallel_tool_calls": false,
        });
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let choice = &r.json()["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "seed {seed}: {choice}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{choice}");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let args = calls[0]["function"]["arguments"].as_str().unwrap();
        assert!(valid_weather_args(args), "seed {seed}: {args}");
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));

        // Streamed: one delta with the call, the same call, and the finish reason.
        let mut stream_body = body.clone();
        stream_body["stream"] = json!(true);
        let sr = s.post("/v1/chat/completions", &stream_body);
        let (text, chunks) = streamed_text(&sr);
        assert!(text.is_empty(), "no content besides the call: {text:?}");
        let deltas: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
        assert_eq!(deltas.len(), 1, "{chunks:?}");
        assert_eq!(deltas[0][0]["index"], 0);
        assert_eq!(deltas[0][0]["function"]["arguments"].as_str().unwrap(), args, "seed {seed}");
        let finish: Vec<&Value> =
            chunks.iter().map(|c| &c["choices"][0]["finish_reason"]).filter(|f| !f.is_null()).collect();
        assert_eq!(finish, [&json!("tool_calls")]);
    }
}

/// A tiny random-weight gpt-oss with the harmony vocabulary and chat template (`SyntheticVocab::Harmony`).
fn harmony_server(dir: &std::path::Path) -> Server {
    let spec = SyntheticSpec {
        arch: "gpt-oss",
        n_head: 4,
        n_head_kv: 2,
        n_ff: 128,
        experts: Some((4, 2)),
        expert_type: Some(strata::quant::GgmlType::MXFP4),
        output_type: Some(strata::quant::GgmlType::Q8_0),
        vocab: SyntheticVocab::Harmony,
        ..SyntheticSpec::default()
    };
    let path = dir.join("harmony.gguf");
    std::fs::write(&path, spec.to_gguf()).unwrap();
    Server::start(&["-m", path.to_str().unwrap(), "-c", "2048"])
}

/// The harmony template (gpt-oss's format): tools offered in the developer message, an earlier call as a
/// commentary message to `functions.NAME`, its result as a message from it, and the generation prompt.
#[test]
fn the_harmony_template_renders_tools_calls_and_results() {
    assert_eq!(ToolFormat::of_template(HARMONY_TEMPLATE), (ToolFormat::Harmony, true));
    let t = ChatTemplate::new(HARMONY_TEMPLATE, "<|startoftext|>", "<|return|>").expect("compiles");
    let call = oslo_call();
    let mut result = ChatMessage::new("tool", "rain");
    result.name = Some("get_weather".into());
    let messages = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Oslo?"), call, result];
    let kwargs = json!({"tools": [weather().to_openai()]}).as_object().unwrap().clone();
    let text = t.render_with(&messages, true, &kwargs).unwrap();
    assert!(text.contains("<|start|>developer<|message|># Instructions\n\nBe brief."), "{text}");
    assert!(text.contains("type get_weather = (_: {"), "{text}");
    assert!(
        text.contains(
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\", \
             \"days\": 2}<|call|>"
        ),
        "{text}"
    );
    assert!(text.contains("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>rain<|end|>"));
    assert!(text.ends_with("<|start|>assistant"), "{text}");
}

/// gpt-oss answers `tool_choice` required with a harmony call message (the grammar writes its header, the
/// arguments under the tool's schema): the server reads it as a call, whole and streamed, with no content.
/// A reply the grammar shapes as an analysis message then a final one comes back as reasoning and content.
#[test]
fn a_harmony_model_answers_with_calls_and_keeps_its_analysis_apart() {
    let _one = common::one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let s = harmony_server(dir.path());
    let tools = json!([weather().to_openai(), {"type": "function", "function": {"name": "noop"}}]);
    for seed in 0..3 {
        let body = json!({
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": tools, "tool_choice": "required",
            "temperature": 1.0, "seed": seed, "max_tokens": 300,
        });
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let choice = &r.json()["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "seed {seed}: {choice}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{choice}");
        let name = calls[0]["function"]["name"].as_str().unwrap();
        let args = calls[0]["function"]["arguments"].as_str().unwrap();
        assert!(name == "noop" || valid_weather_args(args), "seed {seed}: {name} {args}");
        assert!(choice["message"]["content"].is_null(), "{choice}");

        let mut stream_body = body.clone();
        stream_body["stream"] = json!(true);
        let (text, chunks) = streamed_text(&s.post("/v1/chat/completions", &stream_body));
        assert!(text.is_empty(), "no content besides the call: {text:?}");
        let deltas: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
        assert_eq!(deltas.len(), 1, "{chunks:?}");
        assert_eq!(deltas[0][0]["function"]["arguments"].as_str().unwrap(), args, "seed {seed}");
    }
    let grammar = r#"root ::= "<|channel|>analysis<|message|>" [a-z]{3,12} "<|end|><|start|>assistant<|channel|>final<|message|>" [a-z]{3,12}"#;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "grammar": grammar, "max_tokens": 80});
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let m = &r.json()["choices"][0]["message"];
    let (reasoning, content) = (m["reasoning_content"].as_str().unwrap_or(""), m["content"].as_str().unwrap_or(""));
    let plain = |t: &str| (3..=12).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_lowercase());
    assert!(plain(reasoning) && plain(content), "{m}");
}
