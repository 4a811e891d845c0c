"""pytest plugin for running llama.cpp's server tests (tools/server/tests) against `strata serve`.

Loaded by scripts/llama-server-tests with `-p strata_plugin`. It
- leaves out the test files of features Strata does not have, and skips the cases inside the kept files that
  need a llama.cpp-only endpoint, field or flag (each with its reason), so what runs is the OpenAI-compatible
  subset plus the cases of llama.cpp's native /completion and /slots that Strata serves (parallel slots,
  seeds, batch sizes, streamed vs whole, cancelling);
- turns ServerPreset.load_all (a Hugging Face download warm-up that starts every preset once) into a no-op:
  the shim always serves the local default model;
- sends the un-prefixed OpenAI paths llama-server also serves (/chat/completions, /models) to /v1/...,
  and gives an OpenAI client whose base URL has no path the /v1 base (LLAMA_TESTS_NO_V1_REWRITE=1: as sent),
  counting the cases that needed it;
- records every HTTP exchange of a case (path, "model" sent, status, error message) to say why a case failed,
  and prints a table per file, a line per failure and the cases that failed on a model name;
- writes all of it as JSON to $LLAMA_TESTS_RESULTS.
"""
import json
import os
import re
from collections import Counter, OrderedDict, defaultdict

import pytest

# Whole files left out: the feature is not in Strata.
SKIPPED_FILES = OrderedDict([
    ("test_compat_gcp.py", "Google Vertex AI (AIP_MODE) compatibility: not in Strata"),
    ("test_ignore_eos.py", "llama.cpp's native /completion endpoint's generation_settings.logit_bias"),
    ("test_infill.py", "fill-in-the-middle (/infill): not in Strata"),
    ("test_kv_keep_only_active.py", "llama.cpp slot/KV management over the native /completion endpoint"),
    ("test_lora.py", "LoRA adapters: not in Strata"),
    ("test_mcp_servers.py", "MCP servers: not in Strata"),
    ("test_metrics.py", "llama.cpp's llamacpp:* Prometheus metric names and --metrics flag (Strata's /metrics differs)"),
    ("test_proxy.py", "the web UI's CORS/MCP proxy (/cors-proxy): not in Strata"),
    ("test_rerank.py", "reranking (/rerank): not in Strata"),
    ("test_router.py", "router mode (several models, --models-dir): not in Strata"),
    ("test_sleep.py", "idle sleep (--sleep-idle-seconds): not in Strata"),
    ("test_slot_save.py", "slot save/restore (/slots): not in Strata"),
    ("test_speculative.py", "llama-server's speculative flags over the native /completion endpoint"),
    ("test_stream.py", "resumable streams (/v1/stream) in router mode: not in Strata"),
    ("test_template.py", "chat template files and /apply-template: not in Strata"),
    ("test_tokenize.py", "/tokenize and /detokenize endpoints: not in Strata"),
    ("test_tools_builtin.py", "built-in tools (--tools): not in Strata"),
    ("test_vision_api.py", "multimodal input: not in Strata"),
])

# What Strata's /completion does not have (it refuses these fields by name, or leaves the answer's field out).
NATIVE_TOKENS = "token ids in /completion's answer (tokens, return_tokens): not in Strata"
TRUNCATED = "stories260K's token counts at the context's end (predicted_n 248, truncated) and llama.cpp's context error text"
# Cases skipped inside the files that run (file::function: reason).
SKIPPED_TESTS = {
    "test_basic.py::test_server_props": "llama.cpp's /props endpoint",
    "test_basic.py::test_server_slots": "--no-slots (a 501 for /slots): strata serves /slots always",
    "test_basic.py::test_load_split_model": "a split GGUF from Hugging Face (the shim serves the local default model)",
    "test_basic.py::test_no_ui": "--no-ui (strata serve cannot turn its web UI off)",
    "test_chat_completion.py::test_chat_template": "--chat-template override and the __verbose debug prompt",
    "test_chat_completion.py::test_chat_template_assistant_prefill": "llama.cpp's __verbose debug prompt",
    "test_chat_completion.py::test_chat_template_continue_final_message_vllm_compat": "llama.cpp's __verbose debug prompt",
    "test_chat_completion.py::test_chat_template_continue_final_message_mutual_exclusion": "--chat-template override (add_generation_prompt/continue_final_message)",
    "test_chat_completion.py::test_apply_chat_template": "llama.cpp's /apply-template endpoint",
    "test_compat_oai_responses.py::test_responses_stream_with_llama_telemetry": "llama-server's timings_per_token and return_progress events (prompt_progress, timings)",
    "test_security.py::test_correct_api_key_anthropic_header": "llama-server's native /completions alias (strata's /completions is the OpenAI path); X-Api-Key itself is taken",
    "test_compat_anthropic.py::test_anthropic_tool_result_with_image": "multimodal input (strata answers an image block 400 naming it; llama.cpp 500)",
    "test_compat_anthropic.py::test_anthropic_vision_format_accepted": "multimodal input (strata answers an image block 400 naming it; llama.cpp 500)",
    "test_compat_anthropic.py::test_anthropic_vision_base64_with_multimodal_model": "multimodal input, and a download from the network",
    "test_compat_anthropic.py::test_anthropic_thinking_history_in_template": "llama.cpp's /apply-template endpoint",
    "test_compat_anthropic.py::test_anthropic_empty_messages": "an empty conversation: strata answers 400 naming messages, llama.cpp 200",
    "test_chat_completion.py::test_logit_bias": "llama.cpp's /tokenize endpoint, and logit_bias (refused by Strata)",
    "test_chat_completion.py::test_chat_completions_token_count": "llama.cpp's /chat/completions/input_tokens endpoint",
    "test_chat_completion.py::test_verbose_debug": "llama.cpp's __verbose debug output",
    "test_security.py::test_access_static_assets_without_api_key": "llama.cpp web UI asset names (/sw.js, /_app/version.json)",
    "test_security.py::test_correct_api_key": "llama-server's native /completions alias: strata's /completions is the OpenAI path (native: /completion)",
    "test_security.py::test_cors_origins_defaults_to_localhost_with_tools_enabled": "built-in tools (--tools): not in Strata",
    "test_security.py::test_cors_proxy_only_forwards_explicit_proxy_headers": "the web UI's /cors-proxy: not in Strata",
    "test_security.py::test_local_media_file": "multimodal input: not in Strata",
    "test_ctx_shift.py::test_ctx_shift_enabled": "context shift (--context-shift): not in Strata",
    "test_ctx_shift.py::test_ctx_shift_disabled_short_prompt": TRUNCATED,
    "test_ctx_shift.py::test_ctx_shift_disabled_long_prompt": TRUNCATED,
    # test_completion.py: the OpenAI-client cases and the native cases Strata answers run; these need what
    # Strata's /completion does not have.
    "test_completion.py::test_completion_stream": NATIVE_TOKENS + " (and generation_settings' adaptive_*)",
    "test_completion.py::test_completion_prompt_cache": NATIVE_TOKENS + " (and --kv-unified)",
    "test_completion.py::test_completion_unified": "--kv-unified (one context shared by all slots): not in Strata",
    "test_completion.py::test_json_prompt_no_mtmd": "a JSON object prompt (multimodal prompts): not in Strata",
    "test_completion.py::test_json_prompt_mtm_error_when_not_supported": "a JSON object prompt (multimodal prompts): not in Strata",
    "test_completion.py::test_completion_with_tokens_input": "llama.cpp's /tokenize endpoint and several prompts per request",
    "test_completion.py::test_completion_response_fields": "response_fields (a chosen subset of the answer): not in Strata",
    "test_completion.py::test_n_probs_post_backend_sampling": "n_probs and backend sampling: not in Strata",
    "test_completion.py::test_logit_bias": "llama.cpp's /tokenize endpoint, and logit_bias (refused by Strata)",
    "test_completion.py::test_completion_stream_vs_non_stream": "llama-server's --seed (a default seed for requests that send none): strata serve draws a fresh one per request",
    "test_completion.py::test_nocache_long_input_prompt": "stories260K's tokenizer: the prompt is over the 256-token slot there, 225 tokens with SmolLM2 (Strata's 400 for a prompt over the context is tested in tests/it)",
}

REWRITE = os.environ.get("LLAMA_TESTS_NO_V1_REWRITE", "") not in ("1", "true", "yes")
V1_ALIASES = ("/chat/completions", "/models")

_current = {"nodeid": None}
_exchanges = defaultdict(list)   # nodeid -> [dict]
_rewritten = defaultdict(set)    # nodeid -> {original path}
_results = OrderedDict()         # nodeid -> dict


def _rewrite(nodeid, path):
    if not REWRITE or not isinstance(path, str):
        return path
    bare = path.split("?", 1)[0]
    if any(bare == p or bare.startswith(p + "/") for p in V1_ALIASES):
        _rewritten[nodeid].add(bare)
        return "/v1" + path
    return path


def _error_text(body):
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            parts = [str(err.get(k)) for k in ("type", "code") if err.get(k) is not None]
            return " ".join(parts) + ": " + str(err.get("message", ""))
        return json.dumps(body)[:200]
    return str(body)[:200]


def _record(method, path, sent, status, body=None):
    nodeid = _current["nodeid"]
    if nodeid is None or _current.get("starting"):
        return  # the /health polls of ServerProcess.start are not the case's exchanges
    model = sent.get("model", "<absent>") if isinstance(sent, dict) else "<absent>"
    entry = {"method": method, "path": path, "model": model, "status": status}
    if (status is None or not (200 <= status < 300)) and body is not None:
        entry["error"] = _error_text(body)
    _exchanges[nodeid].append(entry)


def _patch():
    import requests
    import utils  # llama.cpp's tests/utils.py (on sys.path: the script runs pytest from its folder)

    utils.ServerPreset.load_all = staticmethod(lambda: None)

    orig_request = utils.ServerProcess.make_request
    orig_stream = utils.ServerProcess.make_stream_request

    def make_request(self, method, path, data=None, headers=None, *args, **kwargs):
        path = _rewrite(_current["nodeid"], path)
        try:
            res = orig_request(self, method, path, data, headers, *args, **kwargs)
        except Exception as e:
            _record(method, path, data, None, f"{type(e).__name__}: {e}")
            raise
        _record(method, path, data, res.status_code, res.body)
        # HTTP header names are case-insensitive; utils.py turns them into a plain dict, which makes a test's
        # `"Access-Control-Allow-Origin" in res.headers` depend on the server's spelling (strata's are lower case).
        res.headers = requests.structures.CaseInsensitiveDict(res.headers)
        return res

    def make_stream_request(self, method, path, data=None, headers=None, *args, **kwargs):
        path = _rewrite(_current["nodeid"], path)
        try:
            yield from orig_stream(self, method, path, data, headers, *args, **kwargs)
        except utils.ServerError as e:
            _record(method, path, data, e.code, e.body)
            raise
        _record(method, path, data, 200)

    orig_start = utils.ServerProcess.start

    def start(self, *args, **kwargs):
        _current["starting"] = True
        try:
            return orig_start(self, *args, **kwargs)
        finally:
            _current["starting"] = False

    utils.ServerProcess.start = start
    utils.ServerProcess.make_request = make_request
    utils.ServerProcess.make_stream_request = make_stream_request

    import openai
    import httpx

    def on_response(response):
        req = response.request
        try:
            sent = json.loads(req.content or b"{}")
        except ValueError:
            sent = {}
        body = None
        if response.status_code >= 300:
            try:
                response.read()
                body = response.json()
            except Exception:
                body = response.text if hasattr(response, "text") else None
        _record(req.method, req.url.path, sent, response.status_code, body)

    orig_init = openai.OpenAI.__init__

    def init(self, *args, **kwargs):
        base = kwargs.get("base_url")
        if REWRITE and isinstance(base, str) and httpx.URL(base).path in ("", "/"):
            _rewritten[_current["nodeid"]].add("OpenAI(base_url=" + base + ")")
            kwargs["base_url"] = base.rstrip("/") + "/v1"
        if "http_client" not in kwargs:
            kwargs["http_client"] = openai.DefaultHttpxClient(event_hooks={"response": [on_response]})
        orig_init(self, *args, **kwargs)

    openai.OpenAI.__init__ = init


def pytest_sessionstart(session):
    _patch()


def pytest_ignore_collect(collection_path, config):
    return collection_path.name in SKIPPED_FILES


def _key(item):
    return f"{item.path.name}::{item.originalname}"


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        fname, name = item.path.name, item.originalname
        reason = SKIPPED_TESTS.get(_key(item))
        params = getattr(item, "callspec", None)
        if reason is None and params is not None and params.params.get("chat_template") is not None:
            reason = "--chat-template override: Strata uses the model's own template"
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_setup(item):
    _current["nodeid"] = item.nodeid


def _one_line(text, limit=220):
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _startup_error(report):
    """The strata/shim error line of a server that did not start, from the captured output."""
    out = "\n".join(content for _, content in report.sections)
    found = re.findall(r"^(?:strata: error: .*|llama-server-shim: .*)$", out, re.M)
    return found[-1] if found else None


def _classify(item, report, excinfo):
    nodeid = item.nodeid
    exc = excinfo.value
    exc_line = _one_line(excinfo.exconly(), 200)
    ex = _exchanges.get(nodeid, [])
    bad = [e for e in ex if e["status"] is None or not (200 <= e["status"] < 300)]
    text = excinfo.exconly()
    if isinstance(exc, (RuntimeError, TimeoutError)) and ("Server process died" in text or "did not start" in text):
        return "server-start", _startup_error(report) or exc_line
    model_404 = [e for e in bad if e["status"] == 404 and "model" in e.get("error", "").lower()]
    if model_404 or ("404" in text and "model" in text.lower() and "NotFoundError" in type(exc).__name__):
        e = model_404[-1] if model_404 else None
        if e:
            return "model-name", f'{e["method"]} {e["path"]} "model": {json.dumps(e["model"])} -> 404 {e.get("error", "")}'
        return "model-name", exc_line
    where = _failing_statement(item, excinfo)
    last = ex[-1] if ex else None
    answer = ""
    if last is not None and (last["status"] is None or not (200 <= last["status"] < 300)):
        answer = f'{last["method"]} {last["path"]} -> {last["status"]} {last.get("error", "")}'.strip()
    unreachable = [e for e in ex if e["status"] is None]
    if not answer and unreachable:  # e.g. a request a helper thread made, whose exception the test swallowed
        e = unreachable[-1]
        answer = f'{e["method"]} {e["path"]} -> no answer: {e.get("error", "")}'
    status_exc = type(exc).__name__ in ("ServerError", "ReadTimeout", "ConnectionError") or isinstance(
        getattr(exc, "status_code", None), int)
    if answer and (status_exc or isinstance(exc, KeyError) or re.search(r"status_code|\be\.code\b", where)):
        return "http-status", _one_line(" | ".join(x for x in (answer, where, exc_line) if x))
    if isinstance(exc, KeyError):
        return "missing-field", _one_line(f"the response has no field {exc}: {where}")
    if isinstance(exc, AssertionError):
        cls = "assertion"
        # len(content) > 10: stories260K never ends a reply that early; SmolLM2 may sample its end token first.
        if re.search(r"match_regex|prompt_tokens|completion_tokens|n_prompt|n_predicted|cached_tokens"
                     r"|len\(res\.body\[.content.\]\) >", where):
            cls = "model-output"
        return cls, _one_line(" | ".join(x for x in (where, exc_line, answer) if x))
    return "error", _one_line(" | ".join(x for x in (where, exc_line, answer) if x))


def _failing_statement(item, excinfo):
    """The statement of the test's own file that raised, as one line."""
    entries = [e for e in excinfo.traceback if str(e.path) == str(item.path)]
    if not entries:
        return ""
    try:
        return _one_line(str(entries[-1].statement), 160)
    except Exception:
        return ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    nodeid = item.nodeid
    entry = _results.setdefault(nodeid, {"file": item.path.name, "name": item.name, "outcome": "passed"})
    if report.skipped:
        entry["outcome"] = "skipped"
        if isinstance(report.longrepr, tuple):
            entry["reason"] = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif report.failed:
        if entry["outcome"] != "failed":
            entry["outcome"] = "failed"
            category, why = _classify(item, report, call.excinfo) if call.excinfo else ("error", "failed")
            entry["phase"] = report.when
            entry["category"] = category
            entry["why"] = _one_line(why, 300)
    if call.when == "teardown" or report.skipped:
        entry["exchanges"] = _exchanges.get(nodeid, [])
        if _rewritten.get(nodeid):
            entry["rewritten"] = sorted(_rewritten[nodeid])
        models = sorted({str(e["model"]) for e in entry["exchanges"] if e["model"] not in ("<absent>", None)})
        if models:
            entry["models_sent"] = models
        _current["nodeid"] = None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tr = terminalreporter
    per_file = OrderedDict()
    for r in _results.values():
        per_file.setdefault(r["file"], Counter())[r["outcome"]] += 1
    tr.section("strata: llama.cpp server tests, per file")
    tr.write_line(f"{'file':<28} {'passed':>6} {'failed':>6} {'skipped':>7}")
    total = Counter()
    for f, c in per_file.items():
        total.update(c)
        tr.write_line(f"{f:<28} {c['passed']:>6} {c['failed']:>6} {c['skipped']:>7}")
    tr.write_line(f"{'total':<28} {total['passed']:>6} {total['failed']:>6} {total['skipped']:>7}")
    tr.write_line("")
    tr.write_line(f"files left out ({len(SKIPPED_FILES)}):")
    for f, why in SKIPPED_FILES.items():
        tr.write_line(f"  {f:<30} {why}")
    reasons = Counter(r.get("reason", "?") for r in _results.values() if r["outcome"] == "skipped")
    if reasons:
        tr.write_line("cases skipped in the files that ran:")
        for why, n in reasons.most_common():
            tr.write_line(f"  {n:>3}  {why}")
    rewritten = [n for n, r in _results.items() if r.get("rewritten") and r["outcome"] != "skipped"]
    if rewritten:
        paths = sorted({p for n in rewritten for p in _results[n]["rewritten"]})
        tr.write_line(f"{len(rewritten)} cases send un-prefixed OpenAI paths that llama-server also serves "
                      f"({', '.join(paths)}); strata serves /v1 only, so they were sent to /v1 "
                      "(LLAMA_TESTS_NO_V1_REWRITE=1 sends them as written)")
    failed = [(n, r) for n, r in _results.items() if r["outcome"] == "failed"]
    if failed:
        tr.section("strata: failures, one line each: [class] why")
        for n, r in failed:
            tr.write_line(f"{n} [{r['category']}] {r['why']}")
        model = [n for n, r in failed if r["category"] == "model-name"]
        if model:
            tr.write_line("")
            tr.write_line(f"failed on the model name ({len(model)}):")
            for n in model:
                tr.write_line(f"  {n}  (sent {', '.join(_results[n].get('models_sent', ['?']))})")
    other = sorted({m for r in _results.values() if r["outcome"] != "skipped"
                    for m in r.get("models_sent", []) if m != "None"})
    if other:
        tr.write_line(f"model names sent by the cases that ran: {', '.join(other)}")
    path = os.environ.get("LLAMA_TESTS_RESULTS")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"results": _results, "skipped_files": SKIPPED_FILES}, f, indent=1)
        tr.write_line(f"details (every case, its HTTP exchanges): {path}")
