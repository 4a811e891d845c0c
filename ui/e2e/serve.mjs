// The browser end-to-end check of the built UI against the REAL `strata serve` (scripts/e2e-browser starts
// it: sim:200,sim:400, --layer-split 15, --vram-reserve-mib 32, and runs this with its address). In the
// system's Chromium at 1280x800 it checks that:
//   1. the Parameters panel shows the served model's effective sampling (temperature 0.2 from "SmolLM2
//      (model card)", as /strata/model says) as the placeholders of its empty fields; a chat reply streams
//      (its text grows over time) and ends with its figures (tok/s, reused/read); while it streams, the
//      conversation list already shows the conversation's title (not "New conversation") and its messages;
//   2. switching conversations parks one and restores the other, and the device chart shows parked and
//      restored markers that agree with GET /strata/telemetry;
//   3. squeezing device 1 through POST /strata/sim makes the next restore fall back at the gate, and the
//      restore_fallback marker's hover shows the device, free, need and reserve the server recorded;
//   4. invalid settings (layer split 45 of 30 layers; a reserve above sim:200's memory) show errors at
//      their fields, which valid values clear;
//   5. each view renders: screenshots to $E2E_SHOTS (default target/e2e/) of chat, models, settings and
//      devices at 1280x800, devices at 800x600, and chat (and devices) in the dark theme;
//   6. "Save for this model" keeps the panel's values across a reload of the page, and Reset clears them.
//   7. two conversations stream at once: a reply streams in one while the user sends in a second; the list
//      marks both as replying (screenshot chat-two-streaming), /health shows both slots busy when the
//      server has two, and each reply ends, not empty, in its own conversation.
//   8. the Parameters panel's JSON-mode switch sends `response_format: {"type": "json_object"}` and the
//      server's reply is a JSON object (it starts with `{`); screenshot chat-json-mode.
//   9. the model library (against the mock Hub the script starts): a search finds the repository, each file
//      is planned before download, a download shows bytes, speed and time left and ends checked, the file
//      is listed as here and is in the models folder, and a two-press delete removes it.
// Prints one line per check (`ok - ...` / `not ok - ...`) and `e2e browser: N passed, M failed`; exits 1 on
// any failure.
//   node ui/e2e/serve.mjs http://127.0.0.1:PORT
import { mkdir } from "node:fs/promises";
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const BASE = (process.argv[2] ?? "").replace(/\/+$/, "");
if (!/^https?:\/\//.test(BASE)) {
  console.error("usage: node ui/e2e/serve.mjs http://HOST:PORT   (scripts/e2e-browser starts the server)");
  process.exit(2);
}
const SHOTS = resolve(process.env.E2E_SHOTS ?? fileURLToPath(new URL("../../target/e2e/", import.meta.url)));
/** Replies are cut short: the test is about the UI, not the text. */
const MAX_TOKENS = "24";
const REPLY_TIMEOUT_MS = 60_000;

let passed = 0;
let failed = 0;
function check(name, ok, detail = "") {
  if (ok) passed++;
  else failed++;
  const d = detail ? `: ${String(detail).replace(/\s*\n\s*/g, " | ")}` : "";
  console.log(`${ok ? "ok" : "not ok"} - ${name}${ok && d.length > 160 ? `${d.slice(0, 157)}...` : d}`);
  return ok;
}
/** Runs one numbered check group; an exception fails it (with the message) and the run goes on. */
async function group(name, f) {
  try {
    await f();
  } catch (e) {
    check(`${name}: ran to the end`, false, e instanceof Error ? e.message.split("\n")[0] : String(e));
  }
}

async function api(path, body) {
  const res = await fetch(BASE + path, {
    method: body === undefined ? "GET" : "POST",
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${body === undefined ? "GET" : "POST"} ${path}: HTTP ${res.status}: ${text.slice(0, 200)}`);
  return JSON.parse(text);
}
const serverEvents = async (kind) => (await api("/strata/telemetry?since_ms=0")).events.filter((e) => e.event === kind);

await mkdir(SHOTS, { recursive: true });
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 }, colorScheme: "light" });
const page = await ctx.newPage();
page.setDefaultTimeout(15_000);
const pageErrors = [];
page.on("pageerror", (e) => pageErrors.push(String(e)));
page.on("console", (m) => {
  // The settings check gets 400s from POST /strata/plan, and a 409 from POST /strata/model/load, on purpose;
  // the browser logs those.
  if (m.type() === "error" && !/status of 40[09]/.test(m.text())) pageErrors.push(m.text());
});

const tab = (name) => page.getByRole("tab", { name, exact: true });
const chatPanel = page.locator("#panel-chat");
const assistant = () => chatPanel.getByTestId("message-assistant").last();

/**
 * Sends `text` with Enter in the open conversation and waits for the reply to end. Returns the reply's
 * distinct non-empty text lengths seen while it streamed (a MutationObserver records them in the page), its
 * figures' text per key, its text and its error, if any.
 */
async function sendAndWait(text) {
  const before = await chatPanel.getByTestId("figures").count();
  await chatPanel.evaluate((panel) => {
    const list = panel.querySelector("ol.messages");
    const seen = [];
    window.__lengths = seen;
    window.__lengthObserver?.disconnect();
    const obs = new MutationObserver(() => {
      const li = [...list.querySelectorAll('[data-testid="message-assistant"]')].pop();
      if (!li || li.querySelector('[data-testid="figures"]') || li.getAttribute("aria-busy") !== "true") return;
      const n = (li.querySelector('[data-testid="markdown"]')?.textContent ?? "").length;
      if (n > 0 && seen[seen.length - 1] !== n) seen.push(n);
    });
    obs.observe(list, { subtree: true, childList: true, characterData: true });
    window.__lengthObserver = obs;
  });
  const input = chatPanel.getByTestId("chat-input");
  await input.fill(text);
  await input.press("Enter");
  // The reply ends with its figures (one more set than before) or with an error under it.
  await page.waitForFunction(
    (n) => {
      const p = document.getElementById("panel-chat");
      return p.querySelectorAll('[data-testid="figures"]').length > n || p.querySelector('[data-testid="reply-error"]') !== null;
    },
    before,
    { timeout: REPLY_TIMEOUT_MS, polling: 100 },
  );
  const lengths = await page.evaluate(() => {
    window.__lengthObserver?.disconnect();
    return window.__lengths;
  });
  const last = assistant();
  const error = (await chatPanel.getByTestId("reply-error").count()) > 0 ? await chatPanel.getByTestId("reply-error").first().innerText() : null;
  const figures = {};
  for (const li of await last.locator('[data-testid="figures"] li').all()) figures[(await li.getAttribute("data-figure")) ?? "?"] = await li.innerText();
  return { lengths, figures, text: await last.getByTestId("markdown").innerText(), error };
}

async function openConversation(titleStart) {
  const item = chatPanel.locator(".conversation-item", { hasText: titleStart });
  await item.click();
  await chatPanel.locator('.conversation-item[aria-current="true"]', { hasText: titleStart }).waitFor();
  await chatPanel.locator(".message-user .message-text", { hasText: titleStart }).first().waitFor();
}

/** Waits until the chart shows markers of `kind`, at least `n` of them; returns how many it shows. */
async function markersShown(kind, n, timeout = 10_000) {
  const sel = `#panel-devices [data-testid="marker"][data-kind="${kind}"]`;
  try {
    await page.waitForFunction(([s, k]) => document.querySelectorAll(s).length >= k, [sel, n], { timeout, polling: 100 });
  } catch {
    /* the count below says how many */
  }
  return page.locator(sel).count();
}

async function shot(name) {
  // Two frames, so what was just rendered (a chart resize, the theme) is painted.
  await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
  await page.screenshot({ path: `${SHOTS}/${name}.png` });
}

try {
  await page.goto(BASE + "/");
  await page.getByTestId("status-badge").filter({ hasText: "ready" }).waitFor({ timeout: 20_000 });
  check("the UI loads from strata serve and its status is ready", true);

  // 1. The Parameters panel shows the model's effective values; a chat streams and ends with its figures,
  // and the conversation list has its title and count while it streams.
  await group("1 chat", async () => {
    await chatPanel.locator("details.params summary").click();
    const served = (await api("/strata/model")).sampling;
    const temperature = chatPanel.getByLabel("Temperature", { exact: true });
    const placeholder = await temperature.getAttribute("placeholder");
    const source = await chatPanel.getByTestId("param-source-temperature").innerText();
    if (served) {
      check("1 chat: /strata/model says temperature 0.2 from SmolLM2's model card", Math.abs(served.temperature.value - 0.2) < 1e-6 && served.preset === "SmolLM2 (model card)", JSON.stringify(served.temperature));
      check("1 chat: the empty Temperature field shows 0.2 from SmolLM2 (model card)", placeholder === "0.2" && source === "SmolLM2 (model card)", `placeholder ${placeholder}, source ${source}`);
      const topK = await chatPanel.getByLabel("Top k", { exact: true }).getAttribute("placeholder");
      const topKSource = await chatPanel.getByTestId("param-source-top_k").innerText();
      check("1 chat: the empty Top k field shows the server's value and Strata default", topK === String(served.top_k.value) && topKSource === "Strata default", `${topK} (${topKSource})`);
    } else {
      console.log("# SKIP 1 chat: the Parameters panel's effective values: this strata serve sends no `sampling` in /strata/model");
    }
    const maxTokens = await chatPanel.getByLabel("Max tokens", { exact: true }).getAttribute("placeholder");
    check("1 chat: the empty Max tokens field shows the reply limit, 2048", maxTokens === "2048", maxTokens ?? "none");
    await shot("chat-parameters");
    await chatPanel.getByLabel("Max tokens", { exact: true }).fill(MAX_TOKENS);
    await temperature.fill("0");
    // Every change of the conversation list, with whether the reply was streaming then.
    await chatPanel.evaluate((panel) => {
      const seen = [];
      window.__listSeen = seen;
      const obs = new MutationObserver(() => {
        const item = panel.querySelector('.conversation-item[aria-current="true"]');
        const reply = [...panel.querySelectorAll('[data-testid="message-assistant"]')].pop();
        if (!item) return;
        seen.push({
          title: item.querySelector(".conversation-title")?.textContent ?? "",
          meta: item.querySelector(".conversation-meta")?.textContent ?? "",
          streaming: reply?.getAttribute("aria-busy") === "true",
        });
      });
      obs.observe(panel.querySelector(".conversation-list"), { subtree: true, childList: true, characterData: true });
      window.__listObserver = obs;
    });
    const r = await sendAndWait("Alpha: count from one to twenty in words.");
    const listSeen = await page.evaluate(() => {
      window.__listObserver?.disconnect();
      return window.__listSeen;
    });
    check("1 chat: the reply has no error", r.error === null, r.error ?? "");
    check("1 chat: the reply text grew while it streamed (2+ distinct lengths)", r.lengths.length >= 2, `lengths seen: ${r.lengths.join(", ")}`);
    check("1 chat: the reply is not empty", r.text.trim().length > 0, JSON.stringify(r.text.slice(0, 80)));
    check("1 chat: figures show tok/s", /\d+(\.\d+)? tok\/s/.test(r.figures.speed ?? ""), JSON.stringify(r.figures));
    check("1 chat: figures show reused and read", /\d+ reused · \d+ read/.test(r.figures.tokens ?? ""), JSON.stringify(r.figures));
    const during = listSeen.filter((x) => x.streaming);
    check(
      "1 chat: while the reply streamed, the list showed the conversation's title and 2 messages",
      during.some((x) => x.title.startsWith("Alpha: count") && x.meta === "2 messages"),
      JSON.stringify(listSeen.slice(0, 4)),
    );
    check("1 chat: the list never showed it as \"New conversation\" while the reply streamed", during.every((x) => x.title !== "New conversation"), JSON.stringify(during.slice(0, 4)));
    const item = chatPanel.locator('.conversation-item[aria-current="true"]');
    const after = { title: await item.locator(".conversation-title").innerText(), meta: await item.locator(".conversation-meta").innerText() };
    check("1 chat: after the reply, the list shows the title and 2 messages", after.title.startsWith("Alpha: count") && after.meta === "2 messages", JSON.stringify(after));
    const heading = await chatPanel.locator(".conversation-heading").innerText();
    check("1 chat: the heading is the conversation's title", heading.startsWith("Alpha: count"), heading);
  });

  // 2. Switching conversations parks one and restores the other; the chart shows both.
  await group("2 park/restore", async () => {
    await chatPanel.getByRole("button", { name: "New conversation", exact: true }).click();
    await chatPanel.getByText("Say something to start.").waitFor();
    const b = await sendAndWait("Beta: name three colors.");
    check("2 park/restore: the second conversation's reply ended", b.error === null && b.text.trim() !== "", b.error ?? b.text.slice(0, 60));
    await openConversation("Alpha");
    const a = await sendAndWait("Alpha again: and backwards?");
    check("2 park/restore: back in the first conversation, the reply ended", a.error === null && a.text.trim() !== "", a.error ?? a.text.slice(0, 60));
    check("2 park/restore: its figures say the conversation was restored", /^restored (live|checkpoint)/.test(a.figures.restore ?? ""), JSON.stringify(a.figures));
    check("2 park/restore: the first reply went back as its generated tokens (N reply tokens kept)", /^[1-9]\d* reply tokens kept$/.test(a.figures.kept ?? ""), JSON.stringify(a.figures));
    const parked = await serverEvents("parked");
    const restored = await serverEvents("restored");
    check("2 park/restore: the server recorded parked events", parked.length >= 2, `${parked.length} parked`);
    check("2 park/restore: the server recorded a restored event", restored.length >= 1, restored.map((e) => `${e.kind} ${e.tokens} tokens`).join(", "));
    await tab("Devices").click();
    await page.locator("#panel-devices .chart canvas").first().waitFor();
    const shownParked = await markersShown("parked", parked.length);
    const shownRestored = await markersShown("restored", restored.length);
    check("2 park/restore: the chart has parked markers, as many as the server's events", shownParked === parked.length && shownParked > 0, `${shownParked} markers, ${parked.length} events`);
    check("2 park/restore: the chart has restored markers, as many as the server's events", shownRestored === restored.length && shownRestored > 0, `${shownRestored} markers, ${restored.length} events`);
    const variant = await page.locator('#panel-devices [data-testid="marker"][data-kind="restored"]').last().getAttribute("data-variant");
    check("2 park/restore: the restored marker's variant is its kind", variant === `restored-${restored[restored.length - 1]?.kind}`, variant ?? "none");
  });

  // 3. Pressure through /strata/sim: the restore falls back at the gate; the marker's hover has its figures.
  await group("3 fallback", async () => {
    const sim = await api("/strata/sim", { device: 1, leave_free_mib: 20 });
    check("3 fallback: POST /strata/sim squeezed device 1", sim.device === 1, JSON.stringify(sim));
    await tab("Chat").click();
    await openConversation("Beta");
    const r = await sendAndWait("Beta again: one more color?");
    check("3 fallback: the reply under pressure ended", r.error === null, r.error ?? "");
    check("3 fallback: its figures name the gate's fallback on device 1", /^fallback: gate on device 1:/.test(r.figures.fallback ?? ""), JSON.stringify(r.figures));
    const fbs = await serverEvents("restore_fallback");
    const ev = fbs[fbs.length - 1];
    check("3 fallback: the server recorded a restore_fallback on device 1", ev?.device === 1, JSON.stringify(ev ?? null));
    if (ev) {
      check(
        "3 fallback: the server's figures are the gate's (free - need < reserve 32 MiB)",
        ev.reserve_mib === 32 && ev.free_mib - ev.need_mib < ev.reserve_mib,
        `free ${ev.free_mib}, need ${ev.need_mib}, reserve ${ev.reserve_mib}`,
      );
    }
    await tab("Devices").click();
    const n = await markersShown("restore_fallback", fbs.length);
    check("3 fallback: the chart has a restore_fallback marker", n >= 1 && n === fbs.length, `${n} markers, ${fbs.length} events`);
    const marker = page.locator('#panel-devices [data-testid="marker"][data-kind="restore_fallback"]').last();
    let hovered = true;
    try {
      await marker.hover({ timeout: 5_000 });
    } catch (e) {
      hovered = false;
      check("3 fallback: the restore_fallback marker can be hovered", false, e instanceof Error ? e.message.split("\n").slice(0, 3).join(" ") : String(e));
    }
    const tip = page.locator("#panel-devices").getByTestId("marker-tooltip");
    if (hovered) {
      await tip.waitFor({ timeout: 5_000 });
      const text = await tip.innerText();
      const want = ev ? [`device ${ev.device}`, `free ${ev.free_mib} MiB`, `need ${ev.need_mib} MiB`, `reserve ${ev.reserve_mib} MiB`] : [];
      check("3 fallback: the hover tooltip is the restore fallback's", /restore fallback/.test(text), text);
      check("3 fallback: the tooltip shows device, free, need and reserve as the server recorded them", ev !== undefined && want.every((w) => text.includes(w)), `${text} (want ${want.join(", ")})`);
      // The chart redraws as samples come (twice a second), and a redraw may take the tooltip down for a
      // moment: hover again until it is there to be measured.
      let tb = await tip.boundingBox();
      for (let i = 0; tb === null && i < 5; i++) {
        await page.mouse.move(5, 5);
        await marker.hover({ timeout: 5_000 });
        await tip.waitFor({ timeout: 5_000 });
        tb = await tip.boundingBox();
      }
      check("3 fallback: the tooltip lies inside the window", tb !== null && tb.x >= 0 && tb.x + tb.width <= 1280 && tb.y >= 0, JSON.stringify(tb));
      await shot("devices-tooltip");
    }
    await page.mouse.move(5, 5);
    // Lift the pressure so the rest of the run (and the chart) sees device 1 recover.
    await api("/strata/sim", { device: 1, pressure_mib: 0 });
  });

  // 4. Invalid settings show errors at their fields; valid values clear them.
  await group("4 settings", async () => {
    await tab("Settings").click();
    const split = page.locator("#settings-layer_split");
    const reserve = page.locator("#settings-vram_reserve_mib");
    await split.waitFor();
    const check4 = page.locator("#panel-settings").getByRole("button", { name: "Check", exact: true });

    await split.fill("45");
    await check4.click();
    const splitErr = page.getByTestId("error-layer_split");
    await splitErr.waitFor();
    const splitMsg = await splitErr.innerText();
    check("4 settings: layer split 45 gets aria-invalid", (await split.getAttribute("aria-invalid")) === "true");
    check("4 settings: the error at the layer split field names 45 or the layers", /45|layers/.test(splitMsg), splitMsg);
    check("4 settings: the layer split's error is its described-by", ((await split.getAttribute("aria-describedby")) ?? "").includes("settings-layer_split-error"));
    await shot("settings-error");
    await split.fill("15");
    await splitErr.waitFor({ state: "detached" });
    check("4 settings: a valid layer split clears its error", (await split.getAttribute("aria-invalid")) === "false");

    await reserve.fill("500");
    await check4.click();
    const resErr = page.getByTestId("error-vram_reserve_mib");
    await resErr.waitFor();
    const resMsg = await resErr.innerText();
    check("4 settings: reserve 500 MiB gets aria-invalid", (await reserve.getAttribute("aria-invalid")) === "true");
    check("4 settings: the error at the reserve field names 500 and sim:200", /500/.test(resMsg) && /sim:200/.test(resMsg), resMsg);
    await reserve.fill("32");
    await resErr.waitFor({ state: "detached" });
    check("4 settings: a valid reserve clears its error", (await reserve.getAttribute("aria-invalid")) === "false");

    await check4.click();
    const flags = await page.getByTestId("restart-flags").innerText();
    check("4 settings: Check with valid values shows the restart flags", flags.includes("--layer-split 15") && flags.includes("--vram-reserve-mib 32"), flags);
    check("4 settings: no field error is left", (await page.locator("#panel-settings .field-error").count()) === 0);

    // Applied without a restart: the conversation cache's budget changes in the running server.
    const budget = page.locator("#settings-cache_mib");
    const before = (await api("/strata/cache")).budget_bytes;
    await budget.fill("192");
    await page.getByTestId("apply-in-place").click();
    await page.locator("#panel-settings .ok[role=status]").filter({ hasText: "without a restart" }).waitFor({ timeout: 60_000 });
    const after = (await api("/strata/cache")).budget_bytes;
    check("4 settings: Apply without a restart changes the running server's cache budget", after === 192 * 1024 * 1024 && before !== after, `${before} → ${after}`);
    // A setting only a restart applies is refused at its field, and the server keeps running as it was.
    const devices = page.locator("#settings-devices");
    await devices.fill("sim:300,sim:400");
    await page.getByTestId("apply-in-place").click();
    const devErr = page.getByTestId("error-devices");
    await devErr.waitFor();
    check("4 settings: changing the devices in place is refused at the field", /started again/.test(await devErr.innerText()), await devErr.innerText());
    await devices.fill("sim:200,sim:400");
    await budget.fill("256");
    await page.getByTestId("apply-in-place").click();
    await page.locator("#panel-settings .ok[role=status]").filter({ hasText: "without a restart" }).waitFor({ timeout: 60_000 });
    check("4 settings: and back", (await api("/strata/cache")).budget_bytes === 256 * 1024 * 1024);
  });

  // 5. Screenshots of each view.
  await group("5 screenshots", async () => {
    await tab("Chat").click();
    await shot("chat");
    await tab("Models").click();
    await page.locator("#panel-models").getByTestId("model-facts").first().waitFor();
    await shot("models");
    await tab("Settings").click();
    await shot("settings");
    await tab("Devices").click();
    // /health is polled every 5 s: the badge must drop "busy" once the replies have ended (the wait also
    // gives the chart samples of device 1 recovering from the lifted pressure).
    const idle = await page
      .getByTestId("status-badge")
      .filter({ hasText: "ready" })
      .filter({ hasNotText: "busy" })
      .waitFor({ timeout: 8_000 })
      .then(() => true, () => false);
    check("5 screenshots: the status badge says ready, not busy, once the replies have ended", idle, await page.getByTestId("status-badge").innerText());
    await shot("devices");
    // Markers at the same instant lie on one another; each one's figures must still be reachable (focus).
    const all = page.locator('#panel-devices [data-testid="marker"]');
    const unreachable = [];
    for (let i = 0; i < (await all.count()); i++) {
      const m = all.nth(i);
      await m.focus();
      const t = await page.locator("#panel-devices").getByTestId("marker-tooltip").innerText().catch(() => "");
      const label = ((await m.getAttribute("aria-label")) ?? "").split(" at ")[0];
      if (!t.startsWith(label)) unreachable.push(`${await m.getAttribute("data-kind")} (${t || "no tooltip"})`);
    }
    await page.locator("body").click({ position: { x: 2, y: 790 } });
    check("5 screenshots: every marker shows its own tooltip when focused", unreachable.length === 0, unreachable.join(", "));
    const kinds = await page.locator('#panel-devices [data-testid="marker"]').evaluateAll((ms) => [...new Set(ms.map((m) => m.dataset.kind))]);
    check("5 screenshots: the devices view at 1280x800 shows markers", kinds.length >= 3, kinds.join(", "));

    await page.setViewportSize({ width: 800, height: 600 });
    await page.waitForFunction(() => {
      const c = document.querySelector("#panel-devices .chart canvas");
      return c && c.getBoundingClientRect().right <= window.innerWidth;
    });
    await shot("devices-800x600");
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check("5 screenshots: the devices view has no horizontal overflow at 800x600", overflow <= 0, `${overflow}px`);
    const outside = await page.locator('#panel-devices [data-testid="marker"]').evaluateAll((ms) => {
      const chart = document.querySelector("#panel-devices .chart").getBoundingClientRect();
      return ms.filter((m) => {
        const r = m.getBoundingClientRect();
        return r.left + r.width / 2 < chart.left || r.left + r.width / 2 > chart.right;
      }).length;
    });
    check("5 screenshots: every marker lies on the chart at 800x600", outside === 0, `${outside} outside`);
    for (const name of ["Chat", "Models", "Settings"]) {
      await tab(name).click();
      const o = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      check(`5 screenshots: the ${name.toLowerCase()} view has no horizontal overflow at 800x600`, o <= 0, `${o}px`);
    }

    await page.setViewportSize({ width: 1280, height: 800 });
    await page.emulateMedia({ colorScheme: "dark" });
    await tab("Chat").click();
    await shot("chat-dark");
    // The reply's text against what it is drawn on (the first ancestor with a background), as WCAG rates it.
    const dark = await page.evaluate(() => {
      const rgb = (c) => (c.match(/[\d.]+/g) ?? []).map(Number);
      const md = document.querySelector('#panel-chat [data-testid="markdown"]');
      let el = md;
      let bg = null;
      while (el) {
        const c = rgb(getComputedStyle(el).backgroundColor);
        if (c.length >= 3 && (c[3] ?? 1) > 0) {
          bg = c;
          break;
        }
        el = el.parentElement;
      }
      const lum = ([r, g, b]) => {
        const f = (v) => ((v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4);
        return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
      };
      const fg = rgb(getComputedStyle(md).color);
      const [hi, lo] = [lum(fg), lum(bg ?? [255, 255, 255])].sort((a, b) => b - a);
      return { fg: fg.join(","), bg: (bg ?? []).join(","), bgLum: lum(bg ?? [255, 255, 255]), contrast: (hi + 0.05) / (lo + 0.05) };
    });
    check(
      "5 screenshots: in the dark theme the reply is light text on a dark card, contrast 4.5:1 or more",
      dark.bgLum < 0.2 && dark.contrast >= 4.5,
      `text ${dark.fg} on ${dark.bg}, contrast ${dark.contrast.toFixed(1)}:1`,
    );
    await tab("Devices").click();
    await shot("devices-dark");
    await page.emulateMedia({ colorScheme: "light" });
  });

  // 6. Values saved for the model come back after a reload; Reset clears them.
  await group("6 saved parameters", async () => {
    await tab("Chat").click();
    const details = chatPanel.locator("details.params");
    const open = async () => {
      if ((await details.getAttribute("open")) === null) await details.locator("summary").click();
    };
    await open();
    const temperature = chatPanel.getByLabel("Temperature", { exact: true });
    await temperature.fill("0.3");
    await chatPanel.getByRole("button", { name: "Save for this model", exact: true }).click();
    await chatPanel.getByTestId("params-status").filter({ hasText: "Saved for this model." }).waitFor();
    await page.reload();
    await page.getByTestId("status-badge").filter({ hasText: "ready" }).waitFor({ timeout: 20_000 });
    await open();
    await page.waitForFunction(() => document.querySelector("#param-temperature")?.value === "0.3", null, { timeout: 10_000 }).catch(() => {});
    const kept = { temperature: await temperature.inputValue(), maxTokens: await chatPanel.getByLabel("Max tokens", { exact: true }).inputValue() };
    check("6 saved parameters: after a reload the saved values are back", kept.temperature === "0.3" && kept.maxTokens === MAX_TOKENS, JSON.stringify(kept));
    const status = await chatPanel.getByTestId("params-status").innerText();
    check("6 saved parameters: the panel says they are saved for the model", /^Saved for /.test(status), status);
    await chatPanel.getByRole("button", { name: "Reset", exact: true }).click();
    await chatPanel.getByTestId("params-status").filter({ hasText: "Reset to the model's defaults." }).waitFor();
    await page.reload();
    await page.getByTestId("status-badge").filter({ hasText: "ready" }).waitFor({ timeout: 20_000 });
    await open();
    const cleared = await temperature.inputValue();
    const placeholder = await temperature.getAttribute("placeholder");
    check("6 saved parameters: after Reset and a reload the field is empty, showing the model's value", cleared === "" && placeholder !== "" && placeholder !== null, `value ${JSON.stringify(cleared)}, placeholder ${placeholder}`);
  });

  // 7. Two conversations at once: send in one, open a new one and send there while the first streams.
  await group("7 two at once", async () => {
    await tab("Chat").click();
    const details = chatPanel.locator("details.params");
    if ((await details.getAttribute("open")) === null) await details.locator("summary").click();
    // Replies long enough that the second is sent while the first still streams.
    await chatPanel.getByLabel("Max tokens", { exact: true }).fill("96");
    await chatPanel.getByLabel("Temperature", { exact: true }).fill("0");
    const replying = chatPanel.getByTestId("conversation-replying");
    const input = chatPanel.getByTestId("chat-input");
    const newConversation = async () => {
      await chatPanel.getByRole("button", { name: "New conversation", exact: true }).click();
      await chatPanel.getByText("Say something to start.").waitFor();
    };
    // The server's busy slots, polled while the replies stream.
    let busyMax = 0;
    let slots = 0;
    let polling = true;
    const poll = (async () => {
      while (polling) {
        const h = await api("/health").catch(() => null);
        if (h?.slots) {
          slots = h.slots.total;
          busyMax = Math.max(busyMax, h.slots.busy);
        }
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    try {
      await newConversation();
      await input.fill("Gamma: count from one to forty in words.");
      await input.press("Enter");
      await chatPanel.locator('.conversation-item[aria-busy="true"]', { hasText: "Gamma" }).waitFor();
      await newConversation();
      await input.fill("Delta: name ten animals, one per line.");
      await input.press("Enter");
      const both = await page
        .waitForFunction(() => document.querySelectorAll('#panel-chat [data-testid="conversation-replying"]').length === 2, null, { timeout: 10_000, polling: 50 })
        .then(() => true, () => false);
      check("7 two at once: the list marks both conversations as replying while both stream", both, `${await replying.count()} replying`);
      const send = await chatPanel.getByRole("button", { name: "Send" }).count();
      check("7 two at once: Send is blocked in the streaming conversation", send === 0, `${send} Send buttons`);
      if (both) await shot("chat-two-streaming");
      await page.waitForFunction(() => document.querySelectorAll('#panel-chat [data-testid="conversation-replying"]').length === 0, null, { timeout: REPLY_TIMEOUT_MS, polling: 100 });
    } finally {
      polling = false;
      await poll;
    }
    if (slots >= 2) check("7 two at once: /health showed both requests generating at once", busyMax >= 2, `busy at most ${busyMax} of ${slots} slots`);
    else console.log(`# 7 two at once: strata serve runs ${slots} request at a time here; the second reply waited in its queue`);
    // Delta is open: its reply ended here, with its figures; the other's did not join it.
    await chatPanel.getByTestId("figures").first().waitFor({ timeout: 10_000 });
    const deltaReplies = await chatPanel.getByTestId("message-assistant").count();
    const delta = (await assistant().getByTestId("markdown").innerText()).trim();
    const deltaUsers = await chatPanel.locator(".message-user .message-text").allInnerTexts();
    check("7 two at once: the open conversation's reply ended, not empty, with no error", delta !== "" && (await chatPanel.getByTestId("reply-error").count()) === 0, JSON.stringify(delta.slice(0, 60)));
    check("7 two at once: the open conversation holds its own message and one reply", deltaReplies === 1 && deltaUsers.length === 1 && deltaUsers[0].startsWith("Delta"), JSON.stringify({ deltaReplies, deltaUsers }));
    // Gamma's reply ended while Delta was open: reading Gamma shows it as the server's storage kept it.
    await openConversation("Gamma");
    await chatPanel.getByTestId("figures").first().waitFor({ timeout: 10_000 });
    const gammaReplies = await chatPanel.getByTestId("message-assistant").count();
    const gamma = (await assistant().getByTestId("markdown").innerText()).trim();
    const gammaUsers = await chatPanel.locator(".message-user .message-text").allInnerTexts();
    check("7 two at once: the other conversation's reply ended, not empty, with no error", gamma !== "" && (await chatPanel.getByTestId("reply-error").count()) === 0, JSON.stringify(gamma.slice(0, 60)));
    check("7 two at once: the other conversation holds its own message and one reply", gammaReplies === 1 && gammaUsers.length === 1 && gammaUsers[0].startsWith("Gamma"), JSON.stringify({ gammaReplies, gammaUsers }));
    check("7 two at once: the replies differ (neither is the other's)", gamma !== delta, "");
    await shot("chat-two-done");
  });

  // 8. JSON mode: the switch asks for a JSON object, and the real server constrains the reply to one.
  await group("8 JSON mode", async () => {
    await tab("Chat").click();
    const details = chatPanel.locator("details.params");
    if ((await details.getAttribute("open")) === null) await details.locator("summary").click();
    await chatPanel.getByLabel("Max tokens", { exact: true }).fill("64");
    const jsonSwitch = chatPanel.getByRole("switch", { name: "JSON mode" });
    await jsonSwitch.check();
    await chatPanel.getByRole("button", { name: "New conversation", exact: true }).click();
    await chatPanel.getByText("Say something to start.").waitFor();
    const request = page.waitForRequest((r) => r.url().endsWith("/v1/chat/completions") && r.method() === "POST");
    const reply = await sendAndWait("Epsilon: give the capital of France as a JSON object with a key 'capital'.");
    const format = (await request).postDataJSON()?.response_format;
    check("8 JSON mode: the request asks for response_format json_object", JSON.stringify(format) === '{"type":"json_object"}', JSON.stringify(format));
    const text = reply.text.trim();
    check("8 JSON mode: the reply is a JSON object, with no error", reply.error === null && text.startsWith("{"), JSON.stringify(text.slice(0, 80)));
    await chatPanel.locator("#param-json-mode-hint").scrollIntoViewIfNeeded();
    await shot("chat-json-mode");
    await jsonSwitch.uncheck();
  });

  // 9. The model library, against the mock Hub scripts/e2e-browser points the server at: a search finds the
  // repository, each file is planned on the server's devices before download, a download shows progress and
  // ends checked, the file is then listed as here, and a delete (two presses) removes it from the folder.
  await group("9 library", async () => {
    await tab("Models").click();
    const lib = page.locator("#panel-models").getByTestId("library");
    await lib.getByTestId("pick").first().waitFor();
    check("9 library: good picks for this machine are offered", (await lib.getByTestId("pick").count()) === 3, String(await lib.getByTestId("pick").count()));
    await lib.getByTestId("library-query").fill("tiny");
    await lib.getByTestId("library-search").click();
    await lib.getByTestId("result").first().click();
    const rows = lib.getByTestId("file-row");
    await rows.first().waitFor();
    const rowOf = (name) => rows.filter({ hasText: name });
    await lib.getByTestId("fit").first().waitFor({ timeout: 20_000 });
    await page.waitForFunction(() => !document.querySelector("#panel-models [data-testid=library]")?.textContent?.includes("planning…"), null, { timeout: 20_000 });
    const fitText = await rowOf("Tiny-Q4_K_M.gguf").getByTestId("fit").innerText();
    check("9 library: the real model's plan says where it fits before download", /^fits/.test(fitText), fitText);
    const bad = await rowOf("Tiny-Q8_0.gguf").innerText();
    check("9 library: a file that is no GGUF says so in its row", /GGUF/.test(bad), bad.replace(/\s+/g, " ").slice(0, 120));
    const split = await rowOf("Tiny-F16-00002-of-00002.gguf").innerText();
    check("9 library: a split model's part is marked and offers no download", /split models are not read yet/.test(split) && (await rowOf("Tiny-F16-00002-of-00002.gguf").getByTestId("file-download").count()) === 0, split.replace(/\s+/g, " "));
    await rowOf("Tiny-Q4_K_M.gguf").getByTestId("fit").click();
    await lib.getByTestId("fit-plan").getByTestId("plan-row").first().waitFor();
    check("9 library: the plan per device opens from the fit", (await lib.getByTestId("fit-plan").getByTestId("plan-row").count()) >= 1);
    await shot("models-library");
    await rowOf("Tiny-Q4_K_M.gguf").getByTestId("file-download").click();
    const figures = lib.getByTestId("download-figures").first();
    await figures.waitFor();
    let seenRunning = "";
    const t0 = Date.now();
    while (Date.now() - t0 < 30_000) {
      const text = await figures.innerText();
      if (/ of .* left$/.test(text) && !seenRunning) {
        seenRunning = text;
        await lib.locator(".downloads").scrollIntoViewIfNeeded();
        await shot("models-library-downloading");
      }
      if (text === "downloaded and checked") break;
      await page.waitForTimeout(100);
    }
    check("9 library: while it ran, the download showed bytes, speed and time left", seenRunning !== "", seenRunning);
    check("9 library: the download ended checked", (await figures.innerText()) === "downloaded and checked", await figures.innerText());
    await lib.getByTestId("file-here").waitFor({ timeout: 10_000 });
    const here = await lib.getByTestId("local-model").allInnerTexts();
    check("9 library: the file is listed as here, with its repository", here.length === 1 && here[0].includes("strata-test/Tiny-GGUF/Tiny-Q4_K_M.gguf"), here.join(" | "));
    const dir = process.env.E2E_MODELS_DIR;
    if (dir) {
      const { existsSync } = await import("node:fs");
      check("9 library: the file is in the models folder", existsSync(`${dir}/strata-test/Tiny-GGUF/Tiny-Q4_K_M.gguf`), dir);
    }
    await lib.getByTestId("local").scrollIntoViewIfNeeded();
    await shot("models-library-downloaded");
    // Load switches the running server to the downloaded model, in place: the same process serves it.
    const started = await api("/strata/settings");
    const startedId = (await api("/strata/model")).id;
    const accepted = (await api("/health")).accepted ?? null;
    await lib.getByTestId("local-load").click();
    const state = lib.getByTestId("local-load-state");
    await page.waitForFunction(
      () =>
        /switched without a restart/.test(document.querySelector("#panel-models [data-testid=local-served]")?.textContent ?? "") ||
        /does not|cannot|refused|needs|not a model/.test(document.querySelector("#panel-models [data-testid=local-load-state]")?.textContent ?? ""),
      null,
      { timeout: 60_000 },
    );
    const said = (await lib.getByTestId("local-served").allInnerTexts()).join("") || (await state.allInnerTexts()).join("");
    check("9 library: Load switches the server to the downloaded model", said === "served now: switched without a restart", said);
    const now = await api("/strata/model");
    check("9 library: the server serves it now, without a restart", now.id === "Tiny-Q4_K_M" && (await api("/health")).model === "Tiny-Q4_K_M", `${now.id}, accepted before ${accepted}`);
    check("9 library: the list marks it as served", (await lib.getByTestId("local-served").count()) === 1);
    const card = await page.locator("#panel-models section[aria-labelledby=current-model]").innerText();
    check("9 library: the served model's card shows the new model", card.includes("Tiny"), card.replace(/\s+/g, " ").slice(0, 160));
    const loads = await serverEvents("model_loaded");
    // Sooner than the 5 s between two polls of /health: the switch asks for one at once.
    await page
      .waitForFunction(() => /tiny|synthetic/i.test(document.querySelector("[data-testid=status-badge]")?.textContent ?? ""), null, { timeout: 3_000 })
      .catch(() => {});
    const badgeText = await page.getByTestId("status-badge").innerText().catch(() => "");
    check("9 library: the status badge names the new model at once", /tiny|synthetic/i.test(badgeText), badgeText);
    check("9 library: the chart's events mark the new model", loads.length >= 2 && loads.at(-1).model === "Tiny-Q4_K_M", JSON.stringify(loads.map((e) => e.model)));
    await lib.getByTestId("local").scrollIntoViewIfNeeded();
    await shot("models-library-switched");
    // Back to the model the server started with (it served it, so it may load it again).
    const back = await api("/strata/model/load", started);
    check("9 library: and back to the model it started with", back.model.id === startedId && back.switch.parked >= 0, JSON.stringify(back.switch));
    const del = lib.getByTestId("local-delete");
    await del.click();
    check("9 library: the first press of Delete asks again", (await del.innerText()) === "Delete the file?", await del.innerText());
    await del.click();
    await lib.getByText("No GGUF file yet.").waitFor({ timeout: 10_000 });
    if (dir) {
      const { existsSync } = await import("node:fs");
      check("9 library: the second press deleted the file", !existsSync(`${dir}/strata-test/Tiny-GGUF/Tiny-Q4_K_M.gguf`));
    }
    const o = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
    check("9 library: the models view has no horizontal overflow", o <= 0, `${o}px`);
  });

  check("no page errors or console errors", pageErrors.length === 0, pageErrors.slice(0, 5).join(" / "));
} catch (e) {
  check("the run finished", false, e instanceof Error ? e.message.split("\n")[0] : String(e));
  await page.screenshot({ path: `${SHOTS}/failure.png` }).catch(() => {});
} finally {
  await browser.close();
}

console.log(`e2e browser: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
