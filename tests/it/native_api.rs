//! llama.cpp's native endpoints on `strata serve`: `POST /completion` answers what `/v1/completions` answers
//! (whole and streamed, in llama-server's shape), `GET /slots` shows each `--parallel` slot and which are
//! processing, `n_probs` and `return_tokens` give llama.cpp's `completion_probabilities` and `tokens`, bad
//! bodies are a 400 naming the field, and the API key guards both.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::server::Server;
use serde_json::{json, Value};

const PROMPT: &str = "The capital of France is";

fn no_panic(s: &Server) {
    let err = s.stderr();
    assert!(!err.contains("panicked"), "the server panicked: {err}");
}

/// The pieces of a native stream: every `data:` object, the last one being the one with `"stop": true`.
fn native_stream(s: &Server, body: &Value) -> Vec<Value> {
    let r = s.post("/completion", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let data = r.sse_data();
    assert!(!data.iter().any(|d| d == "[DONE]"), "llama-server's native stream has no [DONE]: {}", r.text());
    let events: Vec<Value> = data.iter().map(|d| serde_json::from_str(d).expect("a JSON object")).collect();
    let (last, pieces) = events.split_last().expect("at least the final object");
    assert_eq!(last["stop"], true, "{last}");
    assert_eq!(last["content"], "", "streamed: the text went in the pieces");
    for p in pieces {
        assert_eq!(p["stop"], false, "{p}");
        assert!(p["content"].is_string(), "{p}");
    }
    events
}

#[test]
fn completion_gives_the_text_of_v1_completions_whole_and_streamed() {
    let _one = common::one_at_a_time();
    let s = Server::start(&["-c", "512", "--parallel", "2"]);
    let v1 = s.post("/v1/completions", &json!({"prompt": PROMPT, "max_tokens": 16, "temperature": 0}));
    assert_eq!(v1.status, 200, "{}", v1.text());
    let v1 = v1.json();
    let want = v1["choices"][0]["text"].as_str().expect("text").to_owned();
    assert!(!want.is_empty());

    // cache_prompt is llama.cpp's; accepted (Strata reuses prefixes bit-exactly either way).
    let body = json!({"prompt": PROMPT, "n_predict": 16, "temperature": 0, "cache_prompt": false});
    let whole = s.post("/completion", &body);
    assert_eq!(whole.status, 200, "{}", whole.text());
    let whole = whole.json();
    assert_eq!(whole["content"], want.as_str(), "{whole}");
    assert_eq!(whole["stop"], true);
    assert_eq!(whole["tokens_predicted"], v1["usage"]["completion_tokens"], "{whole}");
    assert_eq!(whole["tokens_evaluated"], v1["usage"]["prompt_tokens"], "{whole}");
    assert_eq!(whole["timings"]["predicted_n"], whole["tokens_predicted"]);
    assert!(whole["timings"]["prompt_n"].as_u64().is_some() && whole["timings"]["cache_n"].as_u64().is_some());
    let finish = v1["choices"][0]["finish_reason"].as_str().unwrap();
    let want_type = if finish == "length" { "limit" } else { "eos" };
    assert_eq!(whole["stop_type"], want_type, "finish_reason {finish}: {whole}");
    assert_eq!(whole["truncated"], false);
    assert_eq!(whole["generation_settings"]["n_predict"], 16);

    let events = native_stream(&s, &json!({"prompt": PROMPT, "n_predict": 16, "temperature": 0, "stream": true}));
    let streamed: String = events.iter().map(|e| e["content"].as_str().unwrap()).collect();
    assert_eq!(streamed, want, "streamed /completion differs from /v1/completions");
    assert!(events.len() > 2, "the text came in pieces: {events:?}");
    let last = events.last().unwrap();
    assert_eq!(last["stop_type"], want_type);
    assert_eq!(last["tokens_predicted"], whole["tokens_predicted"]);

    // A prompt of token ids gets what /v1/completions gives for it.
    let ids = json!([1, 504, 3178, 314]);
    let v1_ids = s.post("/v1/completions", &json!({"prompt": ids, "max_tokens": 8, "temperature": 0})).json();
    let native_ids = s.post("/completion", &json!({"prompt": ids, "n_predict": 8, "temperature": 0})).json();
    assert_eq!(native_ids["content"], v1_ids["choices"][0]["text"], "{native_ids}");
    assert_eq!(native_ids["tokens_evaluated"], 4);

    // A stop string: the text up to it, stop_type "word" naming it.
    let word = want.split_whitespace().nth(2).expect("three words in 16 tokens").to_owned();
    let cut = json!({"prompt": PROMPT, "n_predict": 16, "temperature": 0, "stop": [word]});
    let r = s.post("/completion", &cut).json();
    assert_eq!(r["stop_type"], "word", "{r}");
    assert_eq!(r["stopping_word"], word.as_str(), "{r}");
    let text = r["content"].as_str().unwrap();
    assert!(want.starts_with(text) && !text.contains(&word), "{text:?} is {want:?} cut before {word:?}");
    no_panic(&s);
}

#[test]
fn slots_lists_each_slot_and_shows_two_processing_while_two_requests_run() {
    let _one = common::one_at_a_time();
    let s = Arc::new(Server::start(&["-c", "512", "--parallel", "2"]));
    let idle = s.get("/slots");
    assert_eq!(idle.status, 200, "{}", idle.text());
    let idle = idle.json();
    let list = idle.as_array().expect("an array");
    assert_eq!(list.len(), 2, "{idle}");
    for (i, slot) in list.iter().enumerate() {
        assert_eq!(slot["id"], i, "{idle}");
        assert_eq!(slot["n_ctx"], 512, "{idle}");
        assert_eq!(slot["is_processing"], false, "{idle}");
        assert!(slot.get("prompt").is_none() && slot.get("params").is_none(), "nothing of a request: {idle}");
    }
    assert_eq!(s.get("/slots?fail_on_no_slot=1").status, 200, "a slot is free");

    let long = json!({"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": true, "temperature": 0});
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (s, body) = (s.clone(), long.clone());
            std::thread::spawn(move || s.post("/completion", &body))
        })
        .collect();
    let t0 = Instant::now();
    let busy_seen = loop {
        let v = s.get("/slots").json();
        let busy: Vec<bool> = v.as_array().unwrap().iter().map(|x| x["is_processing"] == true).collect();
        if busy == [true, true] {
            break v;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "two slots never processing at once: {v}");
        std::thread::sleep(Duration::from_millis(5));
    };
    let full = s.get("/slots?fail_on_no_slot=1");
    let e = full.expect_error(503);
    assert_eq!(e["code"], "no_slot_available", "{busy_seen}");
    for c in clients {
        let r = c.join().expect("client");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["tokens_predicted"], 400);
    }
    let after = s.get("/slots").json();
    assert!(after.as_array().unwrap().iter().all(|x| x["is_processing"] == false), "{after}");
    no_panic(&s);
}

#[test]
fn bad_completion_bodies_get_a_400_naming_the_field() {
    let _one = common::one_at_a_time();
    let s = Server::start(&["-c", "64"]);
    let long = "word ".repeat(200);
    let cases: Vec<(Value, &str)> = vec![
        (json!({"n_predict": 4}), "prompt"),
        (json!({"prompt": "x", "n_predict": 0}), "n_predict"),
        (json!({"prompt": "x", "n_predict": -2}), "n_predict"),
        (json!({"prompt": "x", "temperature": "hot"}), "temperature"),
        (json!({"prompt": "x", "temperature": 9}), "temperature"),
        (json!({"prompt": "x", "seed": -7}), "seed"),
        (json!({"prompt": "x", "n_probs": -1}), "n_probs"),
        (json!({"prompt": "x", "n_probs": 101}), "n_probs"),
        (json!({"prompt": "x", "logit_bias": [[15, -100]]}), "logit_bias"),
        (json!({"prompt": "x", "grammar": "root ::= item"}), "grammar"),
        (json!({"prompt": "x", "json_schema": {"type": "hiccup"}}), "json_schema"),
        (json!({"prompt": "x", "json_schema": 5}), "json_schema"),
        (json!({"prompt": "x", "grammar": "root ::= \"a\"", "json_schema": {}}), "json_schema"),
        (json!({"prompt": "x", "id_slot": 1}), "id_slot"),
        (json!({"prompt": "x", "colour": 1}), "colour"),
        (json!({"prompt": [4_000_000_000u64]}), "prompt[0]"),
        (json!({"prompt": long}), "prompt"),
    ];
    for (body, field) in cases {
        let e = s.post("/completion", &body).expect_error(400);
        assert_eq!(e["param"], field, "{body}: {e}");
        assert!(e["message"].as_str().unwrap().contains(field.trim_end_matches("[0]")), "{body}: {e}");
    }
    // A grammar is followed: the output is its language exactly.
    let r = s.post("/completion", &json!({"prompt": "x", "n_predict": 10, "grammar": "root ::= \"ab\"{2} [0-9]"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let content = r.json()["content"].as_str().unwrap().to_owned();
    assert!(content.len() == 5 && content.starts_with("abab"), "{content:?}");
    // What llama.cpp's tests send routinely and is harmless is taken: cache_prompt, id_slot -1, seed -1.
    let ok = json!({"prompt": "x", "n_predict": 1, "cache_prompt": true, "id_slot": -1, "seed": -1, "n_probs": 0});
    assert_eq!(s.post("/completion", &ok).status, 200);
    no_panic(&s);
}

#[test]
fn the_api_key_guards_completion_and_slots() {
    let _one = common::one_at_a_time();
    let s = Server::start(&["-c", "256", "--api-key", "sk-native"]);
    let body = json!({"prompt": PROMPT, "n_predict": 2});
    assert_eq!(s.post("/completion", &body).expect_error(401)["code"], "invalid_api_key");
    assert_eq!(s.get("/slots").expect_error(401)["code"], "invalid_api_key");
    s.post_auth("/completion", "sk-wrong", &body).expect_error(401);
    s.get_auth("/slots", "sk-wrong").expect_error(401);
    let r = s.post_auth("/completion", "sk-native", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["content"].is_string());
    let r = s.get_auth("/slots", "sk-native");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json().is_array());
    no_panic(&s);
}

#[test]
fn n_probs_and_return_tokens_give_the_figures_and_ids_of_v1_completions() {
    let _one = common::one_at_a_time();
    let s = Server::start(&["-c", "512"]);
    let v1 = s.post("/v1/completions", &json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 5}));
    assert_eq!(v1.status, 200, "{}", v1.text());
    let v1 = v1.json();
    let lp = &v1["choices"][0]["logprobs"];

    let body = json!({"prompt": PROMPT, "n_predict": 6, "temperature": 0, "n_probs": 5, "return_tokens": true});
    let whole = s.post("/completion", &body).json();
    let probs = whole["completion_probabilities"].as_array().expect("completion_probabilities");
    let ids: Vec<u64> = whole["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().unwrap()).collect();
    assert_eq!(probs.len(), lp["tokens"].as_array().unwrap().len(), "{whole}");
    assert_eq!(ids.len(), probs.len());
    for (i, p) in probs.iter().enumerate() {
        assert_eq!(p["id"].as_u64(), Some(ids[i]), "{p}");
        assert_eq!(p["token"], lp["tokens"][i], "{p}");
        assert_eq!(p["logprob"], lp["token_logprobs"][i], "the same figure as /v1: {p}");
        let top = p["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), 5, "{p}");
        let want = lp["top_logprobs"][i].as_object().unwrap();
        for t in top {
            assert_eq!(Some(&t["logprob"]), want.get(t["token"].as_str().unwrap()), "{p} against {want:?}");
            assert!(t["id"].is_u64() && t["bytes"].is_array(), "{t}");
        }
        // Greedy: the token is the most likely one.
        assert_eq!(top[0]["id"], p["id"], "{p}");
    }
    let text: String = probs.iter().map(|p| p["token"].as_str().unwrap()).collect();
    assert_eq!(whole["content"].as_str().unwrap(), text);

    // Streamed: each piece carries its own tokens' entries and ids, adding up to the whole answer's.
    let events = native_stream(
        &s,
        &json!({"prompt": PROMPT, "n_predict": 6, "temperature": 0, "n_probs": 5,
        "return_tokens": true, "stream": true}),
    );
    let pieces = &events[..events.len() - 1];
    let streamed: Vec<&Value> = pieces.iter().flat_map(|e| e["completion_probabilities"].as_array().unwrap()).collect();
    let streamed_ids: Vec<u64> =
        pieces.iter().flat_map(|e| e["tokens"].as_array().unwrap()).map(|t| t.as_u64().unwrap()).collect();
    assert_eq!(streamed, probs.iter().collect::<Vec<_>>());
    assert_eq!(streamed_ids, ids);

    // Without return_tokens, `tokens` is empty (as llama-server answers).
    let plain = s.post("/completion", &json!({"prompt": PROMPT, "n_predict": 2, "temperature": 0})).json();
    assert_eq!(plain["tokens"], json!([]), "{plain}");
    assert!(plain.get("completion_probabilities").is_none(), "{plain}");
    no_panic(&s);
}

#[test]
fn post_sampling_probs_are_the_distribution_the_sampler_draws_from() {
    let _one = common::one_at_a_time();
    let s = Server::start(&["-c", "512"]);
    // top_k 3 at temperature 1: at most three candidates, their probabilities renormalized to sum to 1.
    let body = json!({"prompt": PROMPT, "n_predict": 4, "temperature": 1.0, "top_k": 3, "top_p": 1.0, "min_p": 0.0,
        "seed": 5, "n_probs": 10, "post_sampling_probs": true});
    let whole = s.post("/completion", &body).json();
    let probs = whole["completion_probabilities"].as_array().expect("completion_probabilities");
    assert!(!probs.is_empty(), "{whole}");
    for p in probs {
        let top = p["top_probs"].as_array().expect("top_probs");
        assert!((1..=3).contains(&top.len()), "top_k 3 leaves at most 3: {p}");
        let sum: f64 = top.iter().map(|t| t["prob"].as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-4, "the kept candidates sum to 1: {sum} in {p}");
        let chosen = top.iter().find(|t| t["id"] == p["id"]).expect("the drawn token is a candidate");
        assert_eq!(chosen["prob"], p["prob"], "{p}");
        assert!(p.get("logprob").is_none() && p.get("top_logprobs").is_none(), "{p}");
    }
    // The figures are the sampler's, not the model's: the model's top-3 probabilities sum to less than 1.
    let raw = s.post("/completion", &json!({"prompt": PROMPT, "n_predict": 1, "temperature": 0, "n_probs": 3})).json();
    let model_sum: f64 = raw["completion_probabilities"][0]["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["logprob"].as_f64().unwrap().exp())
        .sum();
    assert!(model_sum < 0.999, "{raw}");
    // Asking for the figures does not change the draw: the same seed gives the same text without them.
    let mut bare = body.clone();
    bare.as_object_mut().unwrap().remove("n_probs");
    bare.as_object_mut().unwrap().remove("post_sampling_probs");
    assert_eq!(s.post("/completion", &bare).json()["content"], whole["content"]);
    no_panic(&s);
}
