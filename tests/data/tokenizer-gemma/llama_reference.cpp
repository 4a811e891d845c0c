// Writes llama.cpp's tokenization, detokenization, end-of-generation set and chat-template renders for a
// Gemma 3 GGUF file, as the JSON that tests/it/tokenizer.rs checks Strata against. Not part of the build;
// see README.md in this folder for how to compile and run it.
//
// usage: llama_reference MODEL.gguf IN.json GEMMA3_TEMPLATE.jinja > OUT.json
//
// IN.json holds the inputs (each case's "text", each chat's "messages" and "add_generation_prompt"); every
// other field is (re)computed, so the committed llama-cpp.json can be its own input.

#include "chat.h"
#include "common.h"
#include "llama.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using json = nlohmann::ordered_json;

static std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool add_special,
                                         bool parse_special) {
    int n = -llama_tokenize(vocab, text.data(), (int32_t) text.size(), nullptr, 0, add_special, parse_special);
    std::vector<llama_token> out(n);
    if (n > 0) {
        llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), n, add_special, parse_special);
    }
    return out;
}

static std::string detokenize(const llama_vocab * vocab, const std::vector<llama_token> & ids) {
    // remove_special = false, unparse_special = true: every token rendered, as Strata's decode does.
    std::string out(ids.size() * 64 + 16, '\0');
    int n = llama_detokenize(vocab, ids.data(), (int32_t) ids.size(), out.data(), (int32_t) out.size(), false, true);
    if (n < 0) {
        out.resize(-n);
        n = llama_detokenize(vocab, ids.data(), (int32_t) ids.size(), out.data(), (int32_t) out.size(), false, true);
    }
    out.resize(n);
    return out;
}

static std::vector<int> piece_bytes(const llama_vocab * vocab, llama_token id, bool special) {
    char buf[256];
    int n = llama_token_to_piece(vocab, id, buf, sizeof buf, 0, special);
    std::vector<int> out;
    for (int i = 0; i < n; i++) {
        out.push_back((unsigned char) buf[i]);
    }
    return out;
}

// Order-sensitive checksum of a token sequence: h = h * 1000003 + id + 1 (mod 2^64).
static uint64_t ids_checksum(const std::vector<llama_token> & ids) {
    uint64_t h = 0;
    for (llama_token id : ids) {
        h = h * 1000003ull + (uint64_t) id + 1;
    }
    return h;
}

static std::string read_file(const char * path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

static json render_chat(const common_chat_templates * tmpls, const llama_vocab * vocab, const json & chat) {
    common_chat_templates_inputs inputs;
    for (const auto & m : chat["messages"]) {
        common_chat_msg msg;
        msg.role    = m["role"];
        msg.content = m["content"];
        inputs.messages.push_back(msg);
    }
    inputs.add_generation_prompt = chat["add_generation_prompt"];
    inputs.use_jinja             = true;
    json out;
    try {
        std::string prompt = common_chat_templates_apply(tmpls, inputs).prompt;
        out["prompt"]      = prompt;
        // llama-server tokenizes the prompt with add_special and parse_special.
        out["ids"] = tokenize(vocab, prompt, true, true);
    } catch (const std::exception & e) {
        out["error"] = e.what();
    }
    return out;
}

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf IN.json GEMMA3_TEMPLATE.jinja > OUT.json\n", argv[0]);
        return 2;
    }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only         = true;
    llama_model * model   = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    json                doc   = json::parse(read_file(argv[2]));
    std::string         gemma = read_file(argv[3]);

    json vocab_facts;
    vocab_facts["n_vocab"] = llama_vocab_n_tokens(vocab);
    vocab_facts["bos"]     = llama_vocab_bos(vocab);
    vocab_facts["eos"]     = llama_vocab_eos(vocab);
    vocab_facts["eot"]     = llama_vocab_eot(vocab);
    vocab_facts["pad"]     = llama_vocab_pad(vocab);
    vocab_facts["add_bos"] = llama_vocab_get_add_bos(vocab);
    vocab_facts["add_eos"] = llama_vocab_get_add_eos(vocab);
    std::vector<llama_token> eog;
    for (llama_token id = 0; id < llama_vocab_n_tokens(vocab); id++) {
        if (llama_vocab_is_eog(vocab, id)) {
            eog.push_back(id);
        }
    }
    vocab_facts["eog"] = eog;
    doc["vocab"]       = vocab_facts;

    for (auto & c : doc["cases"]) {
        const std::string text = c["text"];
        auto              ids  = tokenize(vocab, text, false, true);
        auto              raw  = tokenize(vocab, text, false, false);
        c["ids"]               = ids;
        c["ids_no_parse_special"] = raw;
        c["ids_with_bos"]      = tokenize(vocab, text, true, true);
        c["detokenized"]       = detokenize(vocab, ids);
        c["detokenized_no_parse_special"] = detokenize(vocab, raw);
    }

    // One long text: its count and checksum only (no id dump).
    for (auto & l : doc["long_texts"]) {
        std::string text = read_file(std::string(l["path"]).c_str());
        auto        ids  = tokenize(vocab, text, false, false);
        l["n_tokens"]    = ids.size();
        l["checksum"]    = std::to_string(ids_checksum(ids));
        l["round_trips"] = detokenize(vocab, ids) == text;
    }

    // token_to_piece of chosen tokens, with special tokens rendered and not.
    for (auto & p : doc["pieces"]) {
        llama_token id       = p["id"];
        p["bytes_special"]   = piece_bytes(vocab, id, true);
        p["bytes_plain"]     = piece_bytes(vocab, id, false);
        p["attr"]            = (int) llama_vocab_get_attr(vocab, id);
    }

    // What llama.cpp renders for this file (it has no tokenizer.chat_template: the ChatML fallback), and for
    // Gemma 3's own template given as an override (llama-server --chat-template-file).
    auto file_tmpls  = common_chat_templates_init(model, "");
    auto gemma_tmpls = common_chat_templates_init(model, gemma);
    for (auto & chat : doc["chats"]) {
        chat["file_template"]  = render_chat(file_tmpls.get(), vocab, chat);
        chat["gemma3_template"] = render_chat(gemma_tmpls.get(), vocab, chat);
    }

    printf("%s\n", doc.dump(1, ' ', false).c_str());
    llama_model_free(model);
    return 0;
}
