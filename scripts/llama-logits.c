// llama-logits: dump llama.cpp reference outputs for a GGUF model as JSON.
//
// Built and driven by scripts/family-fixtures; it can also be used by hand:
//
//   gcc -O2 -o llama-logits scripts/llama-logits.c
//       -I $LLAMA/include -I $LLAMA/ggml/include
//       -L $LLAMA/build/bin -Wl,-rpath,$LLAMA/build/bin -lllama -lggml -lggml-base -lm
//   (one command line; $LLAMA is the llama.cpp checkout with a build in build/bin)
//
//   llama-logits MODEL.gguf [options] ID [ID ...]
//   llama-logits MODEL.gguf [options] --text "Hello world"
//
// Options:
//   --text STRING    tokenize STRING with the model's own tokenizer
//                    (add_special = true, parse_special = false) instead of ids
//   --n-predict N    number of greedy tokens to produce (default 16)
//   --n-ctx N        context size (default 512; llama.cpp pads it to a multiple
//                    of 256 and caps n_batch/n_ubatch at it)
//   --quiet          drop llama.cpp's log lines (errors are still shown)
//
// Settings (fixed, to keep the reference exact and reproducible): CPU only
// (n_gpu_layers 0, no KQV/op offload), n_batch = n_ubatch = 512, one thread,
// f32 K and V caches, flash attention off, a single sequence, full-size
// sliding-window caches (swa_full; the window is applied by the mask).
//
// The whole prompt is decoded as one batch with an output requested at every
// position. Then greedy decoding runs one token per llama_decode call: the
// first generated token is the argmax of the last prompt position, each
// following token is the argmax after feeding the previous one. EOS does not
// stop generation. Ties in argmax / top-5 go to the lower token id.
//
// JSON on stdout:
//   {"prompt": [ids], "n_vocab": V, "n_ctx": C, "n_batch": B, "n_ubatch": U,
//    (the values llama.cpp settled on: n_ctx is padded to 256, the batch sizes
//    are capped at n_ctx)
//    "logprobs_last": [V log-softmax values of the last prompt position],
//    "top5": [[[id, logprob] x 5] for each prompt position],
//    "greedy": [N ids],
//    "greedy_gap": [N values: log-prob of the chosen token minus that of the
//                   runner-up at each greedy step, to judge how robust the
//                   argmax is to small numeric differences]}
// Log-softmax is computed in double precision from llama.cpp's f32 logits and
// printed with 17 significant digits.

#include "llama.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool g_quiet = false;

// llama.cpp's log goes to stderr; debug lines are always dropped, and with
// --quiet everything below a warning is dropped too.
static void log_sink(enum ggml_log_level level, const char * text, void * user) {
    static enum ggml_log_level prev = GGML_LOG_LEVEL_INFO;
    (void) user;
    if (level == GGML_LOG_LEVEL_CONT) {
        level = prev;
    } else {
        prev = level;
    }
    if (level == GGML_LOG_LEVEL_DEBUG) {
        return;
    }
    if (g_quiet && level != GGML_LOG_LEVEL_ERROR && level != GGML_LOG_LEVEL_WARN) {
        return;
    }
    fputs(text, stderr);
}

static void die(const char * msg) {
    fprintf(stderr, "llama-logits: %s\n", msg);
    exit(1);
}

static void usage(void) {
    fprintf(stderr,
        "usage: llama-logits MODEL.gguf [--n-predict N] [--n-ctx N] [--quiet] (--text STRING | ID...)\n");
    exit(2);
}

// Index of the largest logit (the lowest index wins a tie); *gap gets the
// distance to the second largest logit (equal to the log-prob distance).
static int argmax_row(const float * row, int n, double * gap) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (row[i] > row[best]) {
            best = i;
        }
    }
    double second = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (i != best && (double) row[i] > second) {
            second = (double) row[i];
        }
    }
    *gap = (double) row[best] - second;
    return best;
}

// out[i] = row[i] - logsumexp(row), all in double.
static void log_softmax_row(const float * row, int n, double * out) {
    double hi = (double) row[0];
    for (int i = 1; i < n; i++) {
        if ((double) row[i] > hi) {
            hi = (double) row[i];
        }
    }
    double acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += exp((double) row[i] - hi);
    }
    const double lse = hi + log(acc);
    for (int i = 0; i < n; i++) {
        out[i] = (double) row[i] - lse;
    }
}

// The k best entries of lp (descending value, lower id first on ties).
static void top_k(const double * lp, int n, int k, int * ids) {
    for (int j = 0; j < k; j++) {
        int pick = -1;
        for (int i = 0; i < n; i++) {
            bool taken = false;
            for (int t = 0; t < j; t++) {
                if (ids[t] == i) {
                    taken = true;
                    break;
                }
            }
            if (taken) {
                continue;
            }
            if (pick < 0 || lp[i] > lp[pick]) {
                pick = i;
            }
        }
        ids[j] = pick;
    }
}

static void put_double(double v) {
    if (isinf(v)) {
        // JSON has no infinity; a masked-out logit would show up here.
        printf("%s", v < 0 ? "-1e308" : "1e308");
    } else {
        printf("%.17g", v);
    }
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        usage();
    }

    const char * model_path = argv[1];
    const char * text       = NULL;
    int          n_predict  = 16;
    int          n_ctx      = 512;

    int   n_ids_arg = 0;
    int * ids_arg   = (int *) calloc((size_t) argc, sizeof(int));

    for (int a = 2; a < argc; a++) {
        if (strcmp(argv[a], "--text") == 0 && a + 1 < argc) {
            text = argv[++a];
        } else if (strcmp(argv[a], "--n-predict") == 0 && a + 1 < argc) {
            n_predict = atoi(argv[++a]);
        } else if (strcmp(argv[a], "--n-ctx") == 0 && a + 1 < argc) {
            n_ctx = atoi(argv[++a]);
        } else if (strcmp(argv[a], "--quiet") == 0) {
            g_quiet = true;
        } else if (argv[a][0] == '-' && argv[a][1] == '-') {
            usage();
        } else {
            char * end = NULL;
            long   v   = strtol(argv[a], &end, 10);
            if (end == argv[a] || *end != '\0' || v < 0) {
                usage();
            }
            ids_arg[n_ids_arg++] = (int) v;
        }
    }
    if ((text == NULL) == (n_ids_arg == 0) || n_predict < 1) {
        usage();
    }

    llama_log_set(log_sink, NULL);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;

    struct llama_model * model = llama_model_load_from_file(model_path, mp);
    if (model == NULL) {
        die("failed to load the model");
    }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    // the prompt: either the ids given, or the text run through the tokenizer
    int           n_prompt = 0;
    llama_token * prompt   = NULL;
    if (text != NULL) {
        const int len  = (int) strlen(text);
        const int need = -llama_tokenize(vocab, text, len, NULL, 0, true, false);
        if (need <= 0) {
            die("tokenization produced no tokens");
        }
        prompt   = (llama_token *) malloc(sizeof(llama_token) * (size_t) need);
        n_prompt = llama_tokenize(vocab, text, len, prompt, need, true, false);
        if (n_prompt != need) {
            die("tokenization failed");
        }
        fprintf(stderr, "llama-logits: %d tokens:", n_prompt);
        for (int i = 0; i < n_prompt; i++) {
            fprintf(stderr, " %d", prompt[i]);
        }
        fprintf(stderr, "\n");
    } else {
        n_prompt = n_ids_arg;
        prompt   = (llama_token *) malloc(sizeof(llama_token) * (size_t) n_prompt);
        for (int i = 0; i < n_prompt; i++) {
            if (ids_arg[i] >= n_vocab) {
                die("token id out of range");
            }
            prompt[i] = ids_arg[i];
        }
    }
    if (n_prompt + n_predict > n_ctx) {
        die("prompt plus generated tokens do not fit in n_ctx");
    }
    if (n_prompt > 512) {
        die("prompt longer than the batch size (512)");
    }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = (uint32_t) n_ctx;
    cp.n_batch         = 512;
    cp.n_ubatch        = 512;
    cp.n_seq_max       = 1;
    cp.n_threads       = 1;
    cp.n_threads_batch = 1;
    cp.type_k          = GGML_TYPE_F32;
    cp.type_v          = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.offload_kqv     = false;
    cp.op_offload      = false;
    cp.no_perf         = true;
    cp.swa_full        = true;  // the default: a full-size cache for sliding-window layers too

    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == NULL) {
        die("failed to create the context");
    }

    // one batch with the whole prompt, an output at every position
    struct llama_batch batch = llama_batch_init(n_prompt, 0, 1);
    batch.n_tokens = n_prompt;
    for (int i = 0; i < n_prompt; i++) {
        batch.token[i]     = prompt[i];
        batch.pos[i]       = i;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i]    = 1;
    }
    if (llama_decode(ctx, batch) != 0) {
        die("llama_decode failed on the prompt");
    }

    double * lp     = (double *) malloc(sizeof(double) * (size_t) n_vocab);
    int    * top    = (int *) malloc(sizeof(int) * 5 * (size_t) n_prompt);
    double * top_lp = (double *) malloc(sizeof(double) * 5 * (size_t) n_prompt);
    double * last   = (double *) malloc(sizeof(double) * (size_t) n_vocab);

    for (int i = 0; i < n_prompt; i++) {
        const float * row = llama_get_logits_ith(ctx, i);
        if (row == NULL) {
            die("no logits for a prompt position");
        }
        log_softmax_row(row, n_vocab, lp);
        top_k(lp, n_vocab, 5, top + 5 * i);
        for (int j = 0; j < 5; j++) {
            top_lp[5 * i + j] = lp[top[5 * i + j]];
        }
        if (i == n_prompt - 1) {
            memcpy(last, lp, sizeof(double) * (size_t) n_vocab);
        }
    }

    // greedy continuation, one token per decode
    int    * greedy = (int *) malloc(sizeof(int) * (size_t) n_predict);
    double * gaps   = (double *) malloc(sizeof(double) * (size_t) n_predict);
    greedy[0] = argmax_row(llama_get_logits_ith(ctx, n_prompt - 1), n_vocab, &gaps[0]);

    struct llama_batch step = llama_batch_init(1, 0, 1);
    for (int k = 1; k < n_predict; k++) {
        step.n_tokens     = 1;
        step.token[0]     = greedy[k - 1];
        step.pos[0]       = n_prompt + k - 1;
        step.n_seq_id[0]  = 1;
        step.seq_id[0][0] = 0;
        step.logits[0]    = 1;
        if (llama_decode(ctx, step) != 0) {
            die("llama_decode failed while generating");
        }
        greedy[k] = argmax_row(llama_get_logits_ith(ctx, -1), n_vocab, &gaps[k]);
    }

    // JSON out
    printf("{\"prompt\": [");
    for (int i = 0; i < n_prompt; i++) {
        printf(i ? ", %d" : "%d", prompt[i]);
    }
    printf("], \"n_vocab\": %d, \"n_ctx\": %u, \"n_batch\": %u, \"n_ubatch\": %u, \"logprobs_last\": [",
           n_vocab, llama_n_ctx(ctx), llama_n_batch(ctx), llama_n_ubatch(ctx));
    for (int i = 0; i < n_vocab; i++) {
        if (i) {
            printf(", ");
        }
        put_double(last[i]);
    }
    printf("], \"top5\": [");
    for (int i = 0; i < n_prompt; i++) {
        printf(i ? ", [" : "[");
        for (int j = 0; j < 5; j++) {
            printf(j ? ", [%d, " : "[%d, ", top[5 * i + j]);
            put_double(top_lp[5 * i + j]);
            printf("]");
        }
        printf("]");
    }
    printf("], \"greedy\": [");
    for (int k = 0; k < n_predict; k++) {
        printf(k ? ", %d" : "%d", greedy[k]);
    }
    printf("], \"greedy_gap\": [");
    for (int k = 0; k < n_predict; k++) {
        if (k) {
            printf(", ");
        }
        put_double(gaps[k]);
    }
    printf("]}\n");
    fflush(stdout);

    llama_batch_free(step);
    llama_batch_free(batch);
    free(gaps);
    free(greedy);
    free(last);
    free(top_lp);
    free(top);
    free(lp);
    free(prompt);
    free(ids_arg);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
