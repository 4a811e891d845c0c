"""The desktop end-to-end test of the Strata app in its real window (run by scripts/e2e-desktop).

Drives the app through tauri-driver (WebDriver on 127.0.0.1:4444, WebKitWebDriver underneath) with Python
selenium 4. The app is started by the driver with the environment of scripts/e2e-desktop: a fresh data
folder (STRATA_APP_DATA), the engine (STRATA_ENGINE) and no STRATA_MODEL, so it starts with no model.

Checks, in order, each printed as `ok - ...` or `not ok - ...`:
 1. the app starts and its window shows the UI;
 2. with no model, the Models view inspects the GGUF whose path is typed in (architecture llama, 30
    layers), shows its plan per device, loads it with progress, and the badge says ready;
 3. the chat's Parameters panel shows the model's effective sampling (temperature 0.2 from "SmolLM2
    (model card)") with Save for this model and Reset; a short chat completes, the conversation list shows
    its title and count (target/e2e/desktop-chat-reply.png);
 4. killing the engine child (found in /proc: the app's child whose command line has `serve` and
    `--exit-with-stdin`, the pid of EngineStatus) while a longer reply streams (the list already counts
    its messages then): the app starts a new engine
    (a new pid), the Devices view shows an engine_restarted marker, and the reply, retried, completes;
 5. two conversations stream at once: a long reply streams in a new conversation while the user sends in
    a second; the list marks both as replying (target/e2e/desktop-chat-two-streaming.png), and each reply
    ends, not empty, with its figures, in its own conversation (target/e2e/desktop-chat-two-done.png);
 6. the model library (in the app's process, against the mock Hub the script starts): a search finds the
    repository, its file is planned before download, the download shows its progress and ends checked in
    the models folder, and Open inspects and plans the file in the Models view
    (target/e2e/desktop-library.png, desktop-library-opened.png);
 7. the device panel's screenshots (target/e2e/desktop-devices.png from WebDriver,
    target/e2e/desktop-window.png of the whole Xvfb screen with ImageMagick's `import`);
 8. quitting (driver.quit() closes the app) leaves no engine: no `strata serve --exit-with-stdin` of
    this run within 10 s.
Ends with `e2e desktop: N passed, M failed` and exits 1 if any check failed.
"""

import json
import os
import signal
import subprocess
import sys
import time
import traceback

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.common.options import ArgOptions
from selenium.webdriver.remote.client_config import ClientConfig
from selenium.webdriver.remote.file_detector import UselessFileDetector

APP = os.environ["E2E_APP"]
MODEL = os.environ["E2E_MODEL"]
OUT = os.environ.get("E2E_OUT", "target/e2e")
MARKER = os.environ["STRATA_E2E_RUN"]
DRIVER_URL = "http://127.0.0.1:%s" % os.environ.get("PORT", "4444")

passed = 0
failed = 0
ui_shown = False


def ok(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print("ok - %s" % what, flush=True)
    else:
        failed += 1
        print("not ok - %s%s" % (what, (": " + detail) if detail else ""), flush=True)
    return cond


def log(msg):
    print("# %s" % msg, flush=True)


def wait_for(what, fn, timeout, every=0.1):
    """fn() until it returns something truthy (returned); None after `timeout` seconds."""
    end = time.monotonic() + timeout
    last_err = None
    while True:
        try:
            v = fn()
            if v:
                return v
        except WebDriverException as e:
            last_err = e
        if time.monotonic() > end:
            if last_err is not None:
                log("%s: last error: %s" % (what, str(last_err).splitlines()[0]))
            return None
        time.sleep(every)


# --- processes (from /proc) -------------------------------------------------------------------------


def proc_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None


def proc_ppid_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[1]), rest[0]
    except (OSError, IndexError, ValueError):
        return None, None


def proc_marked(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return ("STRATA_E2E_RUN=" + MARKER).encode() in f.read().split(b"\0")
    except OSError:
        return False


def pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def alive(pid):
    ppid, state = proc_ppid_state(pid)
    return ppid is not None and state != "Z"


def app_pids():
    """This run's strata-desktop processes."""
    out = []
    for p in pids():
        c = proc_cmdline(p)
        if c and os.path.basename(c[0]) == "strata-desktop" and proc_marked(p) and alive(p):
            out.append(p)
    return out


def is_engine_cmd(c):
    return bool(c) and "serve" in c and "--exit-with-stdin" in c


def engine_pids():
    """This run's `strata serve ... --exit-with-stdin` processes, with their parent pids."""
    out = []
    for p in pids():
        c = proc_cmdline(p)
        if is_engine_cmd(c) and proc_marked(p) and alive(p):
            out.append((p, proc_ppid_state(p)[0]))
    return out


def engine_child_of(app_pid):
    kids = [p for p, ppid in engine_pids() if ppid == app_pid]
    return kids[0] if len(kids) == 1 else None


# --- the app through WebDriver ----------------------------------------------------------------------


def invoke(driver, cmd, args=None):
    """A Tauri command, called from the page as the UI calls it ({"error": ...} on failure)."""
    return driver.execute_async_script(
        """
        const [cmd, args, done] = arguments;
        window.__TAURI_INTERNALS__.invoke(cmd, args || {}).then(
          (v) => done({ value: v === undefined ? null : v }),
          (e) => done({ error: typeof e === "string" ? e : JSON.stringify(e) }));
        """,
        cmd,
        args or {},
    )


def engine_status(driver):
    r = invoke(driver, "engine_status")
    return r.get("value") if isinstance(r, dict) else None


def tab(driver, name):
    driver.find_element(By.ID, "tab-" + name).click()
    wait_for("tab " + name, lambda: driver.find_element(By.ID, "tab-" + name).get_attribute("aria-selected") == "true", 5)


def badge(driver):
    el = driver.find_element(By.CSS_SELECTOR, "[data-testid=status-badge]")
    return el.get_attribute("class") or "", el.text


def badge_state(driver):
    cls, _ = badge(driver)
    for c in cls.split():
        if c.startswith("state-"):
            return c[len("state-"):]
    return None


def assistant_messages(driver):
    return driver.find_elements(By.CSS_SELECTOR, "#panel-chat [data-testid=message-assistant]")


def last_reply(driver):
    """The last assistant message: (text, streaming, figures?, note, error), from one script call."""
    return driver.execute_script(
        """
        const all = document.querySelectorAll('#panel-chat [data-testid=message-assistant]');
        const m = all[all.length - 1];
        if (!m) return null;
        const q = (s) => m.querySelector(s);
        return { count: all.length, text: (q('[data-testid=markdown]') || {}).textContent || '',
                 streaming: m.getAttribute('aria-busy') === 'true', figures: !!q('[data-testid=figures]'),
                 figuresText: (q('[data-testid=figures]') || {}).textContent || '',
                 note: (q('[data-testid=reply-note]') || {}).textContent || null,
                 error: (q('[data-testid=reply-error]') || {}).textContent || null };
        """
    )


def open_params(driver):
    details = driver.find_element(By.CSS_SELECTOR, "#panel-chat details.params")
    if details.get_attribute("open") is None:
        details.find_element(By.TAG_NAME, "summary").click()
    return details


def param_input(driver, label):
    """The Parameters panel's input labelled `label` (its <label for=...>)."""
    details = open_params(driver)
    lab = details.find_element(By.XPATH, ".//label[normalize-space()='%s']" % label)
    return driver.find_element(By.ID, lab.get_attribute("for"))


def set_param(driver, label, value):
    inp = param_input(driver, label)
    inp.clear()
    inp.send_keys(str(value))


def current_conversation(driver):
    """The selected conversation in the list: (title, meta), or None."""
    return driver.execute_script(
        """
        const it = document.querySelector('#panel-chat .conversation-item[aria-current="true"]');
        return it ? [it.querySelector('.conversation-title').textContent,
                     it.querySelector('.conversation-meta').textContent] : null;
        """
    )


def send_chat(driver, text):
    box = driver.find_element(By.CSS_SELECTOR, "[data-testid=chat-input]")
    box.click()
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def screenshot(driver, name):
    path = os.path.join(OUT, "desktop-%s.png" % name)
    try:
        driver.save_screenshot(path)
        log("screenshot %s" % path)
    except Exception as e:  # noqa: BLE001 - a screenshot that fails is reported by its check
        log("screenshot %s failed: %s" % (path, str(e).splitlines()[0] if str(e) else type(e).__name__))
    return path


# --- the checks -------------------------------------------------------------------------------------


def check_start(driver):
    global ui_shown
    title = wait_for("title", lambda: driver.title, 30)
    header = wait_for("the UI", lambda: driver.find_elements(By.CSS_SELECTOR, ".app-header h1.app-title"), 30)
    tabs = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "[role=tab]")]
    ui_shown = bool(header)
    if not header:
        log("no UI: %s" % why_blank(driver))
    ok(
        bool(header) and header[0].text == "Strata" and tabs == ["Chat", "Models", "Settings", "Devices"],
        "the app starts and its window shows the UI (title %r, tabs %s)" % (title, tabs),
    )
    apps = wait_for("the app process", app_pids, 10)
    ok(bool(apps) and len(apps) == 1, "one strata-desktop process of this run (%s)" % apps)
    st = engine_status(driver)
    ok(
        st is not None and st["state"] == "stopped" and st["pid"] is None and not engine_pids(),
        "with no model the engine is stopped and none runs",
        json.dumps(st),
    )
    state = wait_for("badge", lambda: badge_state(driver), 10)
    ok(state == "stopped", "the badge says stopped", repr(badge(driver)))
    return apps[0] if apps else None


def why_blank(driver):
    """Why the UI did not render: the page's language and the error its bundle throws when run again."""
    try:
        return driver.execute_async_script(
            """
            const done = arguments[arguments.length - 1];
            const src = [...document.scripts].map((s) => s.src).find((s) => s) || "";
            const info = "navigator.language " + JSON.stringify(navigator.language) + ", body " +
              document.body.innerHTML.length + " chars, bundle " + src;
            const s = document.createElement("script");
            s.type = "module";
            s.src = src + "?again";
            const t = setTimeout(() => done(info + ": it runs without an error"), 3000);
            window.addEventListener("error", (e) => { clearTimeout(t); done(info + ": " + e.message + " at " + e.filename + ":" + e.lineno); });
            document.head.appendChild(s);
            """
        )
    except Exception as e:  # noqa: BLE001 - a diagnosis only
        return "unknown (%s)" % type(e).__name__


def check_load(driver):
    tab(driver, "models")
    panel = driver.find_element(By.ID, "panel-models")
    ok("No model is loaded." in panel.text, "the Models view says no model is loaded")
    inputs = panel.find_elements(By.CSS_SELECTOR, "[data-testid=model-path-input]")
    if not ok(bool(inputs), "the Models view has a path input (data-testid=model-path-input)"):
        return False
    inputs[0].send_keys(MODEL)
    panel.find_element(By.CSS_SELECTOR, "[data-testid=model-path-open]").click()

    def facts():
        dls = panel.find_elements(By.CSS_SELECTOR, "[data-testid=candidate] [data-testid=model-facts]")
        if not dls:
            return None
        pairs = {}
        for f in dls[0].find_elements(By.CSS_SELECTOR, ".fact"):
            pairs[f.find_element(By.TAG_NAME, "dt").text] = f.find_element(By.TAG_NAME, "dd").text
        return pairs

    fx = wait_for("facts", facts, 20) or {}
    ok(
        fx.get("Architecture") == "llama" and fx.get("Layers") == "30" and fx.get("Path") == MODEL,
        "the typed path's facts: architecture %r, %r layers" % (fx.get("Architecture"), fx.get("Layers")),
        json.dumps(fx),
    )
    rows = wait_for("plan rows", lambda: panel.find_elements(By.CSS_SELECTOR, "[data-testid=candidate] [data-testid=plan-row]"), 20)
    rows_text = [" | ".join(c.text for c in r.find_elements(By.CSS_SELECTOR, "th, td")) for r in rows or []]
    summary = panel.find_elements(By.CSS_SELECTOR, "[data-testid=candidate] .plan-summary")
    ok(
        bool(rows) and summary and "fits" in summary[0].text and all(r.endswith("| yes") for r in rows_text),
        "the fit plan per device: %s (%s)" % (rows_text, summary[0].text if summary else "no summary"),
    )
    load = [b for b in panel.find_elements(By.CSS_SELECTOR, "[data-testid=candidate] button") if b.text == "Load"]
    if not ok(bool(load) and load[0].is_enabled(), "a Load button, enabled"):
        return False
    ok(not engine_pids(), "nothing is loaded before Load is pressed")
    load[0].click()
    # Progress: the bar appears while the engine loads and ends at "ready", 1. Every (stage, value) seen is
    # kept (the 98 MiB model loads in well under a second, so few are).
    seen = []

    def progress():
        got = driver.execute_script(
            """
            const p = document.querySelector('#panel-models [data-testid=load-progress]');
            return p ? [p.querySelector('label').textContent, p.querySelector('progress').value] : null;
            """
        )
        if got and (not seen or seen[-1] != (got[0], got[1])):
            seen.append((got[0], got[1]))
        return "Loaded." in panel.text or panel.find_elements(By.CSS_SELECTOR, "[data-testid=candidate] .error")

    wait_for("load", progress, 60, every=0.03)
    progress()
    log("progress seen: %s" % seen)
    errors = [e.text for e in panel.find_elements(By.CSS_SELECTOR, "[data-testid=candidate] .error")]
    ok(
        len(seen) >= 2 and any(not label.startswith("ready") for label, _ in seen) and seen[-1] == ("ready", 1),
        "Load shows its progress (%s)" % " → ".join("%s %.2f" % (label, v) for label, v in seen),
    )
    ok("Loaded." in panel.text and not errors, "the model loaded", "; ".join(errors))
    state = wait_for("ready badge", lambda: badge_state(driver) == "ready" and badge(driver), 60)
    ok(bool(state), "the badge says ready (%r)" % (badge(driver)[1].replace("\n", " "),))
    screenshot(driver, "models")
    cur = panel.find_element(By.CSS_SELECTOR, "section[aria-labelledby=current-model]").text
    ok("SmolLM2" in cur and "Unload" in cur, "the Loaded model card shows the model")
    saved = os.path.join(os.environ["STRATA_APP_DATA"], "settings.json")
    try:
        with open(saved) as f:
            stored = json.load(f)
    except (OSError, ValueError) as e:
        stored = {"error": str(e)}
    ok(json.dumps(stored).find(MODEL) >= 0, "the model is kept in settings.json", json.dumps(stored))
    return bool(state)


def check_params(driver):
    tab(driver, "chat")
    open_params(driver)
    # "default" until the engine's status carries the model's facts.
    temp = wait_for(
        "temperature placeholder",
        lambda: (lambda p: p if p != "default" else None)(param_input(driver, "Temperature").get_attribute("placeholder")),
        20,
    )
    src = driver.find_element(By.CSS_SELECTOR, "[data-testid=param-source-temperature]").text
    ok(
        temp == "0.2" and src == "SmolLM2 (model card)",
        "the Parameters panel shows the model's temperature 0.2 from SmolLM2 (model card) (%r, %r)" % (temp, src),
    )
    fields = driver.find_elements(By.CSS_SELECTOR, "#panel-chat details.params .params-grid input:not([role=switch])")
    switch = driver.find_elements(By.CSS_SELECTOR, "#panel-chat details.params .params-grid input[role=switch]")
    buttons = [b.text for b in driver.find_elements(By.CSS_SELECTOR, "#panel-chat .params-footer button")]
    limit = param_input(driver, "Max tokens").get_attribute("placeholder")
    json_mode = switch[0].find_element(By.XPATH, "./ancestor::label").text if switch else None
    ok(
        len(fields) == 8 and len(switch) == 1 and buttons == ["Save for this model", "Reset"] and limit == "2048",
        "the Parameters panel has its 7 fields, the reply limit (%s), the JSON-mode switch (%r, %s) and %s"
        % (limit, json_mode, "on" if switch and switch[0].is_selected() else "off", buttons),
        "%d inputs, %d switches" % (len(fields), len(switch)),
    )


def check_chat(driver, app_pid):
    tab(driver, "chat")
    set_param(driver, "Temperature", 0)
    set_param(driver, "Max tokens", 12)
    before = len(assistant_messages(driver))
    t0 = time.monotonic()
    send_chat(driver, "Say hello in three words.")
    r = wait_for(
        "short reply",
        lambda: (lambda x: x if x and x["count"] > before and not x["streaming"] else None)(last_reply(driver)),
        60,
    )
    ok(
        r is not None and r["text"].strip() != "" and r["figures"] and not r["error"],
        "a chat completes in %.1f s: %r" % (time.monotonic() - t0, (r or {}).get("text", "")[:80]),
        json.dumps(r),
    )
    if r:
        log("figures: %s" % r["figuresText"])
    cur = current_conversation(driver)
    ok(
        cur is not None and cur[0] == "Say hello in three words." and cur[1] == "2 messages",
        "the conversation list shows the title and the count (%r)" % (cur,),
    )
    screenshot(driver, "chat-reply")


def check_restart(driver, app_pid):
    st = engine_status(driver) or {}
    old = st.get("pid")
    child = engine_child_of(app_pid) if app_pid else None
    cmd = proc_cmdline(child) if child else None
    ok(
        child is not None and child == old and is_engine_cmd(cmd) and proc_ppid_state(child)[0] == app_pid,
        "the engine is the app's child %s (EngineStatus.pid %s): %s" % (child, old, " ".join(cmd or [])[:160]),
        "engines of this run: %s" % engine_pids(),
    )
    if child is None:
        return
    restarts0 = st.get("restarts", 0)
    # A longer reply; kill the engine while it streams.
    set_param(driver, "Max tokens", 200)
    before = len(assistant_messages(driver))
    # Its greedy reply runs to the 200-token limit (a prompt whose reply stops early, as counting did once
    # attention's rounding moved its continuation, would end before the engine could be killed mid-stream).
    send_chat(driver, "Write a long story about a dragon.")
    streaming = wait_for(
        "reply streaming",
        lambda: (lambda x: x if x and x["count"] > before and x["streaming"] and len(x["text"]) >= 10 else None)(
            last_reply(driver)
        ),
        60,
        every=0.05,
    )
    ok(bool(streaming), "a longer reply streams (%r…)" % ((streaming or {}).get("text", "")[:40],))
    if not streaming:
        return
    cur = current_conversation(driver)
    ok(cur is not None and cur[1] == "4 messages", "while it streams, the list counts its messages (%r)" % (cur,))
    t_kill = time.monotonic()
    os.kill(child, signal.SIGKILL)
    log("killed the engine %d (SIGKILL) while the reply streamed" % child)
    gone = wait_for("old engine gone", lambda: not alive(child) or None, 5)
    ok(bool(gone), "the killed engine is gone")
    new = wait_for(
        "new engine",
        lambda: (lambda s: s if s and s["state"] == "ready" and s["pid"] and s["pid"] != old else None)(engine_status(driver)),
        60,
    )
    new_pid = (new or {}).get("pid")
    ok(
        bool(new) and engine_child_of(app_pid) == new_pid and new["restarts"] == restarts0 + 1,
        "the app restarted the engine in %.1f s: new pid %s (was %s), %s restart(s)"
        % (time.monotonic() - t_kill, new_pid, old, (new or {}).get("restarts")),
        json.dumps(new),
    )
    _, btext = badge(driver)
    ok("restart" in btext, "the badge counts the restart (%r)" % btext.replace("\n", " "))
    r = wait_for(
        "retried reply",
        lambda: (lambda x: x if x and x["count"] > before and not x["streaming"] else None)(last_reply(driver)),
        90,
    )
    ok(
        r is not None and not r["error"] and r["figures"] and r["text"].strip() != "",
        "the reply in flight was retried and completed (%d chars, %s)"
        % (len((r or {}).get("text", "")), (r or {}).get("figuresText", "")),
        json.dumps(r),
    )
    ok(
        r is not None and r["note"] is not None and "retrying" in r["note"],
        "the UI shows the reply was retried (%r)" % ((r or {}).get("note"),),
    )
    screenshot(driver, "chat")
    # On disk the reply is complete.
    conv_dir = os.path.join(os.environ["STRATA_APP_DATA"], "conversations")
    last = None
    try:
        files = sorted((os.path.join(conv_dir, f) for f in os.listdir(conv_dir) if f.endswith(".json")), key=os.path.getmtime)
        with open(files[-1]) as f:
            last = json.load(f)["messages"][-1]
    except (OSError, ValueError, IndexError, KeyError) as e:
        log("no conversation on disk: %s" % e)
    ok(
        last is not None and last["role"] == "assistant" and last["complete"] and last["content"].strip() == r["text"].strip()
        if r
        else False,
        "the retried reply is stored complete",
        json.dumps(last)[:300],
    )
    # The Devices view: an engine_restarted marker on the chart, and the event in the table.
    tab(driver, "devices")
    marker = wait_for(
        "restart marker",
        lambda: driver.find_elements(By.CSS_SELECTOR, "#panel-devices [data-testid=marker][data-kind=engine_restarted]"),
        15,
    )
    label = marker[0].get_attribute("aria-label") if marker else None
    ok(bool(marker), "the Devices view shows an engine_restarted marker (%r)" % label)
    rows = driver.find_elements(By.CSS_SELECTOR, "#panel-devices [data-testid=events-table] tr[data-kind=engine_restarted]")
    ok(bool(rows), "the events table lists the restart (%r)" % (rows[0].text if rows else None,))


def replying_count(driver):
    return len(driver.find_elements(By.CSS_SELECTOR, "#panel-chat [data-testid=conversation-replying]"))


def new_conversation(driver):
    driver.find_element(By.XPATH, "//*[@id='panel-chat']//button[normalize-space()='New conversation']").click()
    wait_for("an empty conversation", lambda: driver.find_elements(By.CSS_SELECTOR, "#panel-chat .messages .empty"), 10)


def check_two_at_once(driver):
    tab(driver, "chat")
    set_param(driver, "Temperature", 0)
    # The first reply runs to this limit (the story prompt of check_restart), so it still streams when
    # the second is sent.
    set_param(driver, "Max tokens", 300)
    new_conversation(driver)
    send_chat(driver, "Gamma: write a long story about a dragon.")
    first = wait_for("the first reply streaming", lambda: replying_count(driver) == 1 or None, 30, every=0.05)
    ok(bool(first), "the list marks the first conversation as replying")
    new_conversation(driver)
    send_chat(driver, "Delta: name ten animals, one per line.")
    both = wait_for("both replying", lambda: replying_count(driver) == 2 or None, 20, every=0.05)
    ok(bool(both), "two conversations stream at once: the list marks both as replying")
    if both:
        screenshot(driver, "chat-two-streaming")
    done = wait_for("both replies ended", lambda: replying_count(driver) == 0 or None, 90)
    ok(bool(done), "both replies end")
    r = wait_for("the open reply's figures", lambda: (lambda x: x if x and x["figures"] else None)(last_reply(driver)), 10)
    ok(
        r is not None and r["count"] == 1 and r["text"].strip() != "" and not r["error"],
        "the second conversation's reply ended in it, alone (%r)" % ((r or {}).get("text", "")[:60],),
        json.dumps(r),
    )
    # The first reply ended while the second conversation was open: reading it back shows it, stored.
    item = driver.find_element(
        By.XPATH, "//*[@id='panel-chat']//button[contains(@class,'conversation-item')][starts-with(normalize-space(), 'Gamma')]"
    )
    item.click()
    # The heading and the messages are read in separate calls: wait until the messages shown are no longer the
    # second conversation's (if the first conversation held the second's reply, this times out and fails below).
    r_text = (r or {}).get("text")
    g = wait_for(
        "the first conversation's stored reply",
        lambda: (
            lambda x: x
            if x and x["figures"] and x["text"] != r_text and (current_conversation(driver) or [""])[0].startswith("Gamma")
            else None
        )(last_reply(driver)),
        10,
    )
    ok(
        g is not None and g["count"] == 1 and g["text"].strip() != "" and not g["error"] and g["text"] != (r or {}).get("text"),
        "the first conversation's reply ended in it, alone (%d chars, %s)" % (len((g or {}).get("text", "")), (g or {}).get("figuresText", "")),
        json.dumps(g),
    )
    screenshot(driver, "chat-two-done")


def check_library(driver):
    """The model library, in the app's own process, against the mock Hub scripts/e2e-desktop starts."""
    if not os.environ.get("HF_ENDPOINT"):
        ok(False, "the library: HF_ENDPOINT names the mock Hub")
        return
    tab(driver, "models")
    lib = driver.find_element(By.CSS_SELECTOR, "#panel-models [data-testid=library]")
    picks = wait_for("picks", lambda: lib.find_elements(By.CSS_SELECTOR, "[data-testid=pick]"), 10) or []
    ok(len(picks) == 3, "the library offers a chat, a code and a small pick for this machine (%d)" % len(picks))
    q = lib.find_element(By.CSS_SELECTOR, "[data-testid=library-query]")
    q.clear()
    q.send_keys("tiny")
    lib.find_element(By.CSS_SELECTOR, "[data-testid=library-search]").click()
    results = wait_for("results", lambda: lib.find_elements(By.CSS_SELECTOR, "[data-testid=result]"), 20) or []
    ok(bool(results) and "strata-test/Tiny-GGUF" in results[0].text, "the search finds the repository",
       " | ".join(r.text for r in results))
    if not results:
        return
    results[0].click()

    def row(name):
        for r in lib.find_elements(By.CSS_SELECTOR, "[data-testid=file-row]"):
            if name in r.text:
                return r
        return None

    def fitted():
        r = row("Tiny-Q4_K_M.gguf")
        f = r.find_elements(By.CSS_SELECTOR, "[data-testid=fit]") if r else []
        return f[0].text if f else None

    fit = wait_for("fit", fitted, 30)
    ok(bool(fit) and fit.startswith("fits"), "the file is planned on the app's devices before download (%r)" % fit)
    screenshot(driver, "library")
    row("Tiny-Q4_K_M.gguf").find_element(By.CSS_SELECTOR, "[data-testid=file-download]").click()
    seen = []

    def done():
        figs = lib.find_elements(By.CSS_SELECTOR, "[data-testid=download-figures]")
        t = figs[0].text if figs else ""
        if t and (not seen or seen[-1] != t):
            seen.append(t)
        return t == "downloaded and checked"

    wait_for("download", done, 60, every=0.05)
    ok(any(t.endswith("left") for t in seen), "the download showed bytes, speed and time left", " → ".join(seen[:4]))
    ok(bool(seen) and seen[-1] == "downloaded and checked", "the download ended checked", seen[-1] if seen else "")
    path = os.path.join(os.environ.get("STRATA_MODELS_DIR", ""), "strata-test", "Tiny-GGUF", "Tiny-Q4_K_M.gguf")
    ok(os.path.isfile(path), "the file is in the models folder", path)
    opened = wait_for("local", lambda: lib.find_elements(By.CSS_SELECTOR, "[data-testid=local-open]"), 10) or []
    if not ok(len(opened) == 1, "the downloaded model is listed here with Open"):
        return
    opened[0].click()
    panel = driver.find_element(By.ID, "panel-models")

    def candidate_facts():
        for f in panel.find_elements(By.CSS_SELECTOR, "[data-testid=candidate] .fact"):
            if f.find_element(By.TAG_NAME, "dt").text == "Path":
                return f.find_element(By.TAG_NAME, "dd").text
        return None

    shown = wait_for("candidate", candidate_facts, 20)
    ok(shown == path, "Open inspects and plans it in the Models view before any Load", repr(shown))
    screenshot(driver, "library-opened")
    form = lib.find_elements(By.CSS_SELECTOR, "[data-testid=library-settings]")
    if ok(bool(form), "the library's settings are in the Models view"):
        driver.execute_script("arguments[0].scrollIntoView()", form[0])
        hint = form[0].text
        ok(os.environ.get("STRATA_MODELS_DIR", "?") in hint and "token" in hint.lower(),
           "they name the models folder in use and where the Hub's token comes from", hint.replace("\n", " | ")[:200])
        screenshot(driver, "library-settings")
        tab(driver, "models")
    before = engine_status(driver) or {}
    if before.get("state") != "ready":
        return
    # Load switches the running engine to it in place: the same child process, no restart counted.
    if not load_candidate(driver, panel):
        return
    after = engine_status(driver) or {}
    ok(
        after.get("pid") == before.get("pid") and after.get("restarts") == before.get("restarts")
        and (after.get("model") or {}).get("path") == path,
        "Load switched the engine in place: pid %s → %s, restarts %s → %s, model %s"
        % (before.get("pid"), after.get("pid"), before.get("restarts"), after.get("restarts"),
           (after.get("model") or {}).get("path")),
    )
    cur = panel.find_element(By.CSS_SELECTOR, "section[aria-labelledby=current-model]").text
    ok("Tiny" in cur, "the Loaded model card shows the library's model", cur.replace("\n", " ")[:160])
    screenshot(driver, "library-switched")
    # And back to the first model, in place again, for the checks after this one.
    inp = panel.find_element(By.CSS_SELECTOR, "[data-testid=model-path-input]")
    inp.clear()
    inp.send_keys(MODEL)
    panel.find_element(By.CSS_SELECTOR, "[data-testid=model-path-open]").click()
    wait_for("candidate", lambda: candidate_facts() == MODEL, 20)
    if load_candidate(driver, panel):
        back = engine_status(driver) or {}
        ok(
            back.get("pid") == before.get("pid") and (back.get("model") or {}).get("path") == MODEL,
            "and back to the first model in place (pid %s, %s)" % (back.get("pid"), (back.get("model") or {}).get("path")),
        )


def load_candidate(driver, panel):
    """Presses Load on the opened model and waits for "Loaded." (or an error): whether it loaded."""
    buttons = wait_for(
        "Load",
        lambda: [b for b in panel.find_elements(By.CSS_SELECTOR, "[data-testid=candidate] button")
                 if b.text == "Load" and b.is_enabled()],
        20,
    ) or []
    if not ok(bool(buttons), "the opened model has an enabled Load"):
        return False
    buttons[0].click()
    done = wait_for(
        "loaded",
        lambda: "Loaded." in panel.text or panel.find_elements(By.CSS_SELECTOR, "[data-testid=candidate] .error"),
        60,
    )
    errors = [e.text for e in panel.find_elements(By.CSS_SELECTOR, "[data-testid=candidate] .error")]
    return ok(bool(done) and "Loaded." in panel.text and not errors, "Load ended loaded", "; ".join(errors))


def check_devices(driver):
    tab(driver, "devices")
    # Give the chart a few samples after the restart (the engine samples every half second).
    tel = wait_for(
        "samples",
        lambda: (lambda r: r["value"] if r.get("value") and len(r["value"]["samples"]) >= 4 else None)(
            invoke(driver, "telemetry", {"sinceMs": 0})
        ),
        20,
    )
    n = len(tel["samples"]) if tel else 0
    ok(n >= 4, "telemetry has free-memory samples (%d; events %s)" % (n, [e["event"] for e in (tel or {}).get("events", [])]))
    legend = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#panel-devices .u-legend .u-series .u-label")]
    ok(any("free" in x for x in legend), "the chart has free-memory series (%s)" % legend)
    time.sleep(1.5)
    path = screenshot(driver, "devices")
    ok(os.path.getsize(path) > 10000 if os.path.exists(path) else False, "screenshot %s" % path)
    wpath = os.path.join(OUT, "desktop-window.png")
    r = subprocess.run(["import", "-window", "root", wpath], capture_output=True, text=True, timeout=30)
    ok(r.returncode == 0 and os.path.exists(wpath), "screenshot %s (import -window root on %s)" % (wpath, os.environ.get("DISPLAY")), r.stderr.strip())


def check_remote_key(driver):
    """The remote endpoint's key, as a user enters it in Settings: an http:// URL to another machine is refused at
    its field; allowed, the key is kept in a 0600 file and never in settings.json or the page; back to the
    local engine, the file goes."""
    tab(driver, "settings")
    panel = driver.find_element(By.ID, "panel-settings")
    panel.find_element(By.CSS_SELECTOR, "input[name=engine_kind][value=remote]").click()
    url = wait_for("url field", lambda: panel.find_elements(By.ID, "settings-engine_url"), 5)
    url[0].clear()
    url[0].send_keys("http://gpu-box.invalid:8000")
    key = "sk-e2e-secret-0123456789abcd"
    panel.find_element(By.ID, "settings-engine_api_key").send_keys(key)
    panel.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    err = wait_for("url error", lambda: panel.find_elements(By.CSS_SELECTOR, "[data-testid=error-engine_url]"), 10)
    ok(bool(err) and "https://" in err[0].text, "an http:// URL to another machine is refused at its field: %r" % (err[0].text if err else None))
    screenshot(driver, "settings-remote-refused")
    panel.find_element(By.ID, "settings-engine_allow_insecure").click()
    panel.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    data = os.environ["STRATA_APP_DATA"]
    key_file = os.path.join(data, "remote-api-key")
    kept = wait_for("key file", lambda: os.path.exists(key_file) or None, 20)
    mode = oct(os.stat(key_file).st_mode & 0o777) if kept else None
    ok(bool(kept) and mode == "0o600", "ticked Allow insecure and applied: the key is kept in remote-api-key, mode %s" % mode)
    with open(os.path.join(data, "settings.json")) as f:
        stored = f.read()
    ok(key not in stored and '"kept"' in stored, "settings.json has no key, only that one is kept", stored)
    shown = invoke(driver, "get_settings")
    ok(key not in json.dumps(shown) and "abcd" in json.dumps(shown), "the page reads the key masked, with its hint", json.dumps(shown))
    status = wait_for("key status", lambda: panel.find_elements(By.CSS_SELECTOR, "[data-testid=key-status]"), 10)
    ok(bool(status) and "abcd" in status[0].text, "the form says a key is kept: %r" % (status[0].text if status else None))
    screenshot(driver, "settings-remote-kept")
    panel.find_element(By.CSS_SELECTOR, "input[name=engine_kind][value=local]").click()
    panel.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    gone = wait_for("key file removed", lambda: (not os.path.exists(key_file)) or None, 20)
    ok(bool(gone), "back to the local engine, the key file is removed")
    with open(os.path.join(data, "settings.json")) as f:
        back = json.load(f)["engine"]
    ok(back["model_path"] == MODEL, "and it keeps the model loaded in Models (%r)" % back["model_path"])
    ready = wait_for("ready again", lambda: badge_state(driver) == "ready" or None, 60)
    ok(bool(ready), "the local engine is ready again (%r)" % (badge(driver)[1].replace("\n", " "),))


def check_quit(driver, app_pid):
    engines = [p for p, _ in engine_pids()]
    t0 = time.monotonic()
    try:
        driver.quit()
    except WebDriverException as e:
        log("quit: %s" % e)
    left = wait_for("no engine", lambda: (not engine_pids()) or None, 10)
    ok(
        bool(left),
        "quitting leaves no engine process (%s gone in %.1f s)" % (engines, time.monotonic() - t0),
        "left: %s" % [(p, " ".join(proc_cmdline(p) or [])) for p, _ in engine_pids()],
    )
    app_gone = wait_for("app gone", lambda: (app_pid is None or not alive(app_pid)) or None, 10)
    ok(bool(app_gone), "the app is gone")


def main():
    os.makedirs(OUT, exist_ok=True)
    opts = ArgOptions()
    opts.set_capability("browserName", "wry")
    opts.set_capability("tauri:options", {"application": APP})
    t0 = time.monotonic()
    driver = None
    app_pid = None
    try:
        # No WebDriver command may hang the run: each gets 40 s, and none is sent again after a timeout.
        config = ClientConfig(
            remote_server_addr=DRIVER_URL,
            timeout=40,
            init_args_for_pool_manager={"init_args_for_pool_manager": {"retries": False}},
        )
        driver = webdriver.Remote(command_executor=DRIVER_URL, options=opts, client_config=config)
        driver.set_script_timeout(20)
        # The model's path is typed as text: selenium must not take it for a file to upload (tauri-driver
        # has no /se/file, and the session breaks after it).
        driver.file_detector = UselessFileDetector()
        log("session in %.1f s" % (time.monotonic() - t0))
        app_pid = check_start(driver)
        loaded = check_load(driver)
        if loaded:
            check_params(driver)
            check_chat(driver, app_pid)
            check_restart(driver, app_pid)
            check_two_at_once(driver)
        check_library(driver)
        check_devices(driver)
        if loaded:
            check_remote_key(driver)
        screenshot(driver, "final")
    except Exception:  # noqa: BLE001 - any failure is a failed check, with its traceback
        ok(False, "the test ran to its end", traceback.format_exc())
        # (WebKitWebDriver's screenshot of a page that never painted hangs.)
        if driver is not None and ui_shown:
            screenshot(driver, "error")
    finally:
        if driver is not None:
            check_quit(driver, app_pid)
        else:
            ok(False, "a WebDriver session with the app")
    log("test time %.0f s" % (time.monotonic() - t0))
    print("e2e desktop: %d passed, %d failed" % (passed, failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
