// A browser check of the built UI (dist/) against the mock `strata serve` (mock-server.mjs), in the
// system's Chromium through playwright-core (no browser download): at 800x600 in the light and the dark
// theme it enters the API key, streams a chat reply (checking that model output ran no script), switches
// JSON mode on in the Parameters panel (the next request carries response_format) and gets a reply that
// calls a tool (shown folded as "Tool call: get_weather", its arguments inside), hovers a marker on the
// live device chart, gets a field error in Settings, and checks nothing overflows the window. Screenshots
// go to $SHOTS (default /tmp/strata-ui-shots). Run: npm run e2e
import { mkdir } from "node:fs/promises";
import { chromium } from "playwright-core";
import { startMockServer } from "./mock-server.mjs";
import { TAURI_SIM } from "./tauri-sim.mjs";

const SHOTS = process.env.SHOTS ?? "/tmp/strata-ui-shots";
const KEY = "k-e2e";
const checks = [];
function check(name, ok, detail = "") {
  checks.push({ name, ok });
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${detail ? `: ${detail}` : ""}`);
}

await mkdir(SHOTS, { recursive: true });
const { server, url, chatBodies } = await startMockServer({ apiKey: KEY });
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});

try {
  for (const scheme of ["light", "dark"]) {
    const ctx = await browser.newContext({ viewport: { width: 800, height: 600 }, colorScheme: scheme });
    const page = await ctx.newPage();
    const errors = [];
    const external = [];
    page.on("console", (m) => {
      if (m.type() === "error" && !/status of (401|400)/.test(m.text())) errors.push(m.text());
    });
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("request", (r) => {
      if (!r.url().startsWith(url) && !r.url().startsWith("data:") && !r.url().startsWith("blob:")) external.push(r.url());
    });
    await page.goto(url);

    await page.getByTestId("api-key-form").waitFor({ timeout: 10_000 });
    await page.getByLabel("API key of strata serve").fill(KEY);
    await page.getByRole("button", { name: "Use this key" }).click();
    await page.getByTestId("api-key-form").waitFor({ state: "detached" });
    await page.getByTestId("status-badge").filter({ hasText: "ready" }).waitFor();
    check(`${scheme}: API key accepted, status ready`, true);

    const input = page.getByTestId("chat-input");
    await input.fill("Show me some code");
    await input.press("Enter");
    await page.getByTestId("figures").waitFor({ timeout: 10_000 });
    const md = page.getByTestId("markdown").last();
    const pwned = await page.evaluate(() => window.__pwned);
    check(`${scheme}: model output ran no script`, pwned === undefined, `__pwned=${pwned}`);
    check(`${scheme}: no img/script in the reply`, (await md.locator("img, script").count()) === 0);
    check(`${scheme}: code highlighted`, (await md.locator("code.language-python .hljs-keyword").count()) > 0);
    check(`${scheme}: no navigable link`, (await md.locator("a[href]").count()) === 0);
    const figs = await page.getByTestId("figures").last().innerText();
    check(`${scheme}: figures shown`, /120\.5 tok\/s/.test(figs) && /restored checkpoint/.test(figs), figs.replace(/\n/g, " | "));
    await page.screenshot({ path: `${SHOTS}/${scheme}-chat.png` });

    // JSON mode: off until switched on, then sent as response_format; a reply's tool call folded.
    check(`${scheme}: JSON mode off sends no response_format`, chatBodies.length > 0 && !("response_format" in chatBodies[chatBodies.length - 1]));
    await page.locator("details.params summary").click();
    const jsonSwitch = page.getByRole("switch", { name: "JSON mode" });
    await jsonSwitch.check();
    const hint = await page.locator("#param-json-mode-hint").innerText();
    check(`${scheme}: the JSON mode switch is on, with its hint`, (await jsonSwitch.isChecked()) && hint === "Replies are a JSON object", hint);
    const paramsOver = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check(`${scheme}: the Parameters panel with the switch has no horizontal overflow`, paramsOver <= 0, `${paramsOver}px`);
    // The panel scrolls within its part of the window at 800x600: the switch and its hint brought into view.
    await page.locator("#param-json-mode-hint").scrollIntoViewIfNeeded();
    await page.getByTestId("params").screenshot({ path: `${SHOTS}/${scheme}-params-json-mode.png` });
    await page.screenshot({ path: `${SHOTS}/${scheme}-chat-params-json-mode.png` });
    const sentBefore = chatBodies.length;
    const figuresBefore = await page.getByTestId("figures").count();
    await input.fill("What's the weather in Paris?");
    await input.press("Enter");
    await page.waitForFunction((n) => document.querySelectorAll('[data-testid="figures"]').length > n, figuresBefore, { timeout: 10_000 });
    const sent = chatBodies[sentBefore];
    check(`${scheme}: JSON mode on sends response_format json_object`, JSON.stringify(sent?.response_format) === '{"type":"json_object"}', JSON.stringify(sent?.response_format));
    await page.locator("details.params summary").click();
    const call = page.getByTestId("tool-call").last();
    const summary = await call.getByTestId("tool-call-summary").innerText();
    const closed = (await call.getAttribute("open")) === null && !(await call.getByTestId("tool-call-args").isVisible());
    check(`${scheme}: the reply's tool call is folded as "Tool call: get_weather"`, summary === "Tool call: get_weather" && closed, summary);
    const replyText = await page.getByTestId("message-assistant").last().innerText();
    check(`${scheme}: no tool-call markup shown`, !replyText.includes("<tool_call>") && replyText.includes("Let me look that up."), replyText.replace(/\n/g, " | "));
    await call.getByTestId("tool-call-summary").click();
    const args = call.getByTestId("tool-call-args");
    const argsText = (await args.isVisible()) ? await args.innerText() : "";
    check(`${scheme}: opened, the tool call shows its arguments as JSON`, argsText.includes('"city": "Paris"') && argsText.includes('"unit": "celsius"'), argsText);
    const chatOver = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check(`${scheme}: the opened tool call has no horizontal overflow`, chatOver <= 0, `${chatOver}px`);
    await call.scrollIntoViewIfNeeded();
    await page.screenshot({ path: `${SHOTS}/${scheme}-chat-toolcall.png` });

    await page.getByRole("tab", { name: "Devices" }).click();
    await page.locator(".chart canvas").first().waitFor();
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="marker"]').length >= 8);
    const fb = page.locator('[data-testid="marker"][data-kind="restore_fallback"]');
    await fb.hover();
    const tip = await page.getByTestId("marker-tooltip").innerText();
    check(`${scheme}: marker tooltip on hover`, tip.includes("device 1: free 40 MiB, need 120 MiB, reserve 64 MiB, 812 tokens"), tip.replace(/\n/g, " "));
    const chartBox = await page.locator(".chart").boundingBox();
    check(`${scheme}: chart fits the window`, chartBox !== null && chartBox.x + chartBox.width <= 800, JSON.stringify(chartBox));
    await page.screenshot({ path: `${SHOTS}/${scheme}-devices.png` });
    await page.screenshot({ path: `${SHOTS}/${scheme}-devices-full.png`, fullPage: true });

    await page.getByRole("tab", { name: "Settings" }).click();
    const split = page.locator("#settings-layer_split");
    await split.fill("40");
    await page.getByTestId("error-layer_split").waitFor();
    check(`${scheme}: field error at layer_split`, (await split.getAttribute("aria-invalid")) === "true");
    await page.screenshot({ path: `${SHOTS}/${scheme}-settings-error.png` });
    await split.fill("12");
    await page.getByTestId("error-layer_split").waitFor({ state: "detached" });
    await page.getByRole("button", { name: "Check" }).click();
    const flags = await page.getByTestId("restart-flags").innerText();
    check(`${scheme}: restart flags shown`, flags.includes("--layer-split 12"), flags.replace(/\n/g, " "));
    // Speculative decoding from the keyboard: the select, then the fields it shows, in order, in the window.
    await page.locator("#settings-speculative_kind").focus();
    await page.keyboard.press("ArrowDown");
    await page.keyboard.press("ArrowDown");
    await page.locator("#settings-draft_model_path").waitFor();
    const order = [];
    for (let i = 0; i < 4; i++) {
      await page.keyboard.press("Tab");
      order.push(await page.evaluate(() => document.activeElement?.id ?? ""));
      if (i === 0) await page.keyboard.type("8");
      if (i === 2) await page.keyboard.type("/models/draft.gguf");
      if (i === 3) await page.keyboard.type("1");
    }
    const want = ["settings-draft_max", "settings-draft_min", "settings-draft_model_path", "settings-draft_devices"];
    check(`${scheme}: drafting fields reached in order by Tab`, order.join() === want.join(), order.join(" "));
    check(`${scheme}: drafting values typed`, (await page.locator("#settings-draft_max").inputValue()) === "8");
    // The path was empty when "A draft model" was chosen (an error at it); typed in, the error goes.
    await page.getByTestId("error-draft_model_path").waitFor({ state: "detached" });
    const over = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check(`${scheme}: Settings with drafting fields has no horizontal overflow`, over <= 0, `${over}px`);
    await page.locator("#settings-speculative_kind").scrollIntoViewIfNeeded();
    await page.screenshot({ path: `${SHOTS}/${scheme}-settings-draft.png` });

    await page.getByRole("tab", { name: "Models" }).click();
    await page.getByTestId("model-facts").waitFor();
    await page.screenshot({ path: `${SHOTS}/${scheme}-models.png` });

    for (const tab of ["Chat", "Models", "Settings", "Devices"]) {
      await page.getByRole("tab", { name: tab }).click();
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      check(`${scheme}: ${tab} has no horizontal overflow at 800x600`, overflow <= 0, `${overflow}px`);
    }
    check(`${scheme}: no console errors`, errors.length === 0, errors.join(" / "));
    check(`${scheme}: no external requests`, external.length === 0, external.join(", "));
    await ctx.close();
  }

  // The desktop app's flows, with the Tauri runtime simulated in the page (tauri-sim.mjs).
  {
    const ctx = await browser.newContext({ viewport: { width: 800, height: 600 } });
    await ctx.addInitScript(TAURI_SIM);
    const page = await ctx.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
    await page.goto(url);
    await page.getByTestId("status-badge").filter({ hasText: "ready" }).waitFor();
    await page.evaluate(() => window.__simDrop(["/models/Dropped-7B.gguf"]));
    await page.getByTestId("candidate").getByTestId("model-facts").waitFor();
    const models = await page.getByRole("tab", { name: "Models" }).getAttribute("aria-selected");
    check("tauri: a dropped file opens the models view with its facts", models === "true");
    await page.getByTestId("candidate").getByTestId("plan-row").first().waitFor();
    check("tauri: the plan is shown before loading", (await page.getByTestId("candidate").getByTestId("plan-row").count()) === 2);
    await page.getByRole("button", { name: "Load", exact: true }).click();
    await page.getByTestId("load-progress").waitFor();
    await page.screenshot({ path: `${SHOTS}/tauri-loading.png` });
    await page.getByText("Loaded.").waitFor();
    check("tauri: load progress then loaded", true);
    await page.evaluate(() => window.__simDrop(["/models/big-70B.gguf"]));
    const fit = await page.getByTestId("fit-message").innerText();
    check("tauri: a model that does not fit names the device and shortfall", /does not fit on cuda:1 \(device 1\): short by 2\.45 GiB/.test(fit), fit);
    await page.screenshot({ path: `${SHOTS}/tauri-nofit.png` });
    await page.evaluate(() => window.__simDrop(["/home/me/notes.txt"]));
    const err = await page.getByTestId("model-error").innerText();
    check("tauri: a file that is not GGUF shows the message as is", err === "/home/me/notes.txt is not a GGUF file (it starts with 'hell', not 'GGUF')", err);
    await page.getByRole("button", { name: /Choose a \.gguf/ }).click();
    await page.locator(".candidate .path code", { hasText: "/models/picked.gguf" }).waitFor();
    check("tauri: the dialog's pick is inspected", true);

    await page.getByRole("tab", { name: "Chat" }).click();
    await page.getByTestId("chat-input").fill("hello");
    await page.getByTestId("chat-input").press("Enter");
    await page.getByTestId("figures").waitFor();
    const reply = await page.getByTestId("message-assistant").innerText();
    const note = await page.getByTestId("reply-note").innerText();
    check("tauri: retrying discarded the partial reply", !reply.includes("Partial") && reply.includes("Fresh answer"), reply.replace(/\n/g, " | "));
    check("tauri: retry note shown", note === "engine restarted, retrying", note);
    const sent = await page.evaluate(() => window.__simSent);
    check(
      "tauri: with no parameter set, chat_send gets the reply limit as max_tokens and no sampling field",
      sent.length === 1 && sent[0].max_tokens === 2048 && ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed"].every((k) => sent[0][k] === null),
      JSON.stringify(sent),
    );
    const item = page.locator('.conversation-item[aria-current="true"]');
    const listed = `${await item.locator(".conversation-title").innerText()} | ${await item.locator(".conversation-meta").innerText()}`;
    check("tauri: the list shows the backend's title and the count", listed === "hello | 2 messages", listed);
    await page.locator("details.params summary").click();
    const ph = await page.getByLabel("Temperature", { exact: true }).getAttribute("placeholder");
    const src = await page.getByTestId("param-source-temperature").innerText();
    check("tauri: the Parameters panel shows the model's temperature and its source", ph === "0.2" && src === "SmolLM2 (model card)", `${ph} (${src})`);
    const over = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check("tauri: the chat with the Parameters panel open has no horizontal overflow at 800x600", over <= 0, `${over}px`);
    await page.screenshot({ path: `${SHOTS}/tauri-chat-parameters.png` });
    await page.screenshot({ path: `${SHOTS}/tauri-chat.png` });
    // JSON mode reaches the app's backend in chat_send's params (engine.rs sends it as response_format).
    await page.getByRole("switch", { name: "JSON mode" }).check();
    await page.getByTestId("chat-input").fill("again");
    await page.getByTestId("chat-input").press("Enter");
    await page.waitForFunction(() => window.__simSent.length === 2);
    const sentOn = await page.evaluate(() => window.__simSent[1]);
    check("tauri: with JSON mode on, chat_send gets json_mode true", sentOn?.json_mode === true, JSON.stringify(sentOn));
    await page.getByTestId("figures").nth(1).waitFor();

    await page.getByRole("tab", { name: "Devices" }).click();
    await page.locator('[data-testid="marker"][data-kind="engine_restarted"]').waitFor();
    await page.evaluate(() => window.__simEmit("telemetry", { t_ms: 20500, event: "oom_averted", error: "KV page refused on cuda:0", tokens: 900 }));
    await page.locator('[data-testid="marker"][data-kind="oom_averted"]').waitFor();
    await page.locator('[data-testid="marker"][data-kind="oom_averted"]').focus();
    const tip = await page.getByTestId("marker-tooltip").innerText();
    check("tauri: a live event gets a marker with its figures", tip.includes("900 tokens: KV page refused on cuda:0"), tip.replace(/\n/g, " "));
    await page.evaluate(() => window.__simEmit("engine_status", { state: "restarting", message: "the engine exited: restarting", restarts: 2, pid: null, model: null }));
    await page.getByTestId("status-badge").filter({ hasText: "restarting" }).waitFor();
    check("tauri: engine_status events reach the badge", true);
    await page.screenshot({ path: `${SHOTS}/tauri-devices.png` });
    check("tauri: no page errors", errors.length === 0, errors.join(" / "));
    await ctx.close();
  }
} catch (e) {
  check("the run finished", false, String(e));
} finally {
  await browser.close();
  server.close();
}

const failed = checks.filter((c) => !c.ok).length;
console.log(`${checks.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
