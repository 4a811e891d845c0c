//! Loads a whole model from arbitrary bytes, as `strata run` and the desktop app do with a file a user
//! dropped: the GGUF reader, the hyper-parameters, the weights (on the CPU), the tokenizer, the chat
//! template rendered over a fixed conversation, the rendered prompt tokenized, and one forward step. Every
//! stage must end in a value or an error: no panic, no abort, no hang, no allocation out of proportion.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use strata::gguf::GgufFile;
use strata::model::{KvType, Model};
use strata::threadpool::ThreadPool;
use strata::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

fn pool() -> &'static ThreadPool {
    static POOL: OnceLock<ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| ThreadPool::new(1))
}

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let file = Arc::new(file);
    // The tokenizer and the template do not need the weights: try them whatever the model says.
    let tokenizer = Tokenizer::from_gguf(&file).ok();
    let messages = [
        ChatMessage::new("system", "You are brief."),
        ChatMessage::new("user", "Hello <|im_start|> world"),
        ChatMessage::new("assistant", "Hi!"),
        ChatMessage::new("user", "What is 2 + 2?"),
    ];
    let rendered = ChatTemplate::from_gguf(&file).ok().and_then(|t| t.render(&messages, true).ok());
    let mut prompt = Vec::new();
    if let (Some(tok), Some(text)) = (&tokenizer, &rendered) {
        prompt = tok.encode(text, true);
        let mut decoder = strata::tokenizer::StreamDecoder::new();
        for &id in prompt.iter().take(64) {
            std::hint::black_box(decoder.push(tok, id));
        }
    }
    let Ok(model) = Model::from_file(file) else {
        return;
    };
    let Some(tok) = tokenizer else {
        return;
    };
    let first = prompt.first().copied().or(tok.bos_id()).unwrap_or(0);
    if (first as usize) < model.cfg.n_vocab {
        if let Ok(mut kv) = model.new_kv(KvType::F16, 8) {
            let _ = std::hint::black_box(model.forward(pool(), &mut kv, &[first], &[0]));
        }
    }
});
