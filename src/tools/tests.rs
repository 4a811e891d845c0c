use super::*;

fn call(name: &str, args: &str) -> ToolCall {
    ToolCall { name: name.into(), arguments: args.into() }
}

/// Feeds `text` in pieces of `n` bytes (on character boundaries) and gathers what came out.
fn streamed(format: ToolFormat, text: &str, n: usize) -> (String, Vec<ToolCall>) {
    let mut s = ToolSplitter::new(format);
    let (mut content, mut calls) = (String::new(), Vec::new());
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = n.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let t = s.push(&rest[..cut]);
        content.push_str(&t.content);
        calls.extend(t.calls);
        rest = &rest[cut..];
    }
    let t = s.finish();
    content.push_str(&t.content);
    calls.extend(t.calls);
    (content, calls)
}

#[test]
fn formats_come_from_the_template() {
    assert_eq!(ToolFormat::of_template("{% for tool in tools %}<tool_call>{% endfor %}"), (ToolFormat::Hermes, true));
    assert_eq!(ToolFormat::of_template("[TOOL_CALLS] {{ tools }}"), (ToolFormat::Mistral, true));
    assert_eq!(ToolFormat::of_template("<|start_header_id|>ipython {{ tools }}"), (ToolFormat::Llama3, true));
    assert_eq!(ToolFormat::of_template("<|im_start|>{{ message.content }}"), (ToolFormat::Hermes, false));
}

#[test]
fn hermes_calls_come_out_of_the_text_in_any_slicing() {
    let text =
        "Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
                <tool_call>\n{\"name\": \"time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>\n";
    for n in [1, 2, 3, 5, 7, 11, 1000] {
        let (content, calls) = streamed(ToolFormat::Hermes, text, n);
        assert_eq!(content, "Let me look.", "pieces of {n}");
        assert_eq!(
            calls,
            vec![call("weather", r#"{"city":"Paris"}"#), call("time", r#"{"tz": "CET"}"#)],
            "pieces of {n}"
        );
    }
    assert_eq!(parse_reply(ToolFormat::Hermes, text).1.len(), 2);
}

#[test]
fn text_that_only_looks_like_a_call_is_kept() {
    for n in [1, 4, 100] {
        let (content, calls) = streamed(ToolFormat::Hermes, "a <tool_call>not json</tool_call> b <tool_c", n);
        assert_eq!(content, "a <tool_call>not json</tool_call> b <tool_c", "pieces of {n}");
        assert!(calls.is_empty());
        let (content, calls) = streamed(ToolFormat::Hermes, "Plain reply with <b>tags</b>.\n", n);
        assert_eq!((content.as_str(), calls.len()), ("Plain reply with <b>tags</b>.\n", 0));
    }
    // A call the reply ended inside still counts when its JSON is whole.
    let (content, calls) = streamed(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}", 3);
    assert_eq!((content.as_str(), calls), ("", vec![call("f", "{}")]));
}

#[test]
fn llama_and_mistral_calls() {
    for n in [1, 3, 100] {
        let (content, calls) = streamed(
            ToolFormat::Llama3,
            " {\"name\": \"f\", \"parameters\": {\"x\": 1}}; {\"name\": \"g\", \"parameters\": {}}",
            n,
        );
        assert_eq!((content.as_str(), calls), ("", vec![call("f", r#"{"x":1}"#), call("g", "{}")]), "pieces of {n}");
        let (content, calls) = streamed(ToolFormat::Llama3, "{not a call} and text", n);
        assert_eq!((content.as_str(), calls.len()), ("{not a call} and text", 0));
        let (content, calls) = streamed(ToolFormat::Llama3, "Hello {there}", n);
        assert_eq!((content.as_str(), calls.len()), ("Hello {there}", 0));
        let (content, calls) =
            streamed(ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}]", n);
        assert_eq!((content.as_str(), calls), ("", vec![call("f", r#"{"a":"b"}"#)]));
    }
}

#[test]
fn earlier_calls_are_written_back_in_the_format() {
    let c = [call("f", r#"{"x":1}"#)];
    for f in [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral] {
        assert_eq!(parse_reply(f, &f.calls_text(&c)), (String::new(), c.to_vec()), "{f:?}");
    }
    assert!(ToolFormat::Hermes.calls_text(&c).starts_with("<tool_call>\n{"));
    assert!(ToolFormat::Mistral.calls_text(&c).starts_with("[TOOL_CALLS][{"));
    assert!(ToolFormat::Llama3.call_json(&c[0]).get("parameters").is_some());
    let p = system_prompt(&[Tool {
        name: "f".into(),
        description: Some("does f".into()),
        parameters: json!({"type": "object"}),
    }]);
    assert!(p.contains("<tools>") && p.contains("\"does f\"") && p.contains("<tool_call>"), "{p}");
}

#[test]
fn mistral_templates_get_call_ids_of_nine_letters_and_digits_that_still_match() {
    assert_eq!(mistral_id("a1B2c3D4e"), "a1B2c3D4e", "an id Mistral takes stays");
    let (a, b) = (mistral_id("call_abc_0_1"), mistral_id("call_abc_0_2"));
    assert!(a.len() == 9 && a.bytes().all(|c| c.is_ascii_alphanumeric()), "{a}");
    assert_ne!(a, b);
    assert_eq!(a, mistral_id("call_abc_0_1"), "the same every turn");
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls
        .push(json!({"id": "toolu_01XYZ", "type": "function", "function": {"name": "f", "arguments": "{}"}}));
    let mut result = ChatMessage::new("tool", "ok");
    result.tool_call_id = Some("toolu_01XYZ".into());
    let mut messages = vec![ChatMessage::new("user", "go"), call, result];
    prepare_messages(&mut messages, None, ToolFormat::Mistral, true);
    let id = messages[1].tool_calls[0]["id"].as_str().expect("id").to_owned();
    assert_eq!(id, mistral_id("toolu_01XYZ"));
    assert_eq!(messages[2].tool_call_id.as_deref(), Some(id.as_str()), "the result keeps matching its call");
    // Other formats keep the ids as sent.
    let mut hermes = messages.clone();
    hermes[1].tool_calls[0]["id"] = json!("toolu_01XYZ");
    prepare_messages(&mut hermes, None, ToolFormat::Hermes, true);
    assert_eq!(hermes[1].tool_calls[0]["id"], "toolu_01XYZ");
}
