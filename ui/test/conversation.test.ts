// The one implementation of a conversation's title, export documents and export file name
// (src/chat/conversation.ts): both transports use it (tauri.test.ts, http.test.ts), the app's backend
// stores what it computes (src-tauri history.rs, tests/app/commands.rs).
import { describe, expect, it } from "vitest";
import type { Conversation } from "../src/bindings";
import {
  cleanTitle,
  conversationMarkdown,
  DEFAULT_TITLE,
  exportDocument,
  exportFile,
  exportFileName,
  isUntitled,
  shownTitle,
  TITLE_CHARS,
  titleAfter,
  titleFrom,
} from "../src/chat/conversation";
import { conversation, summary } from "./fakes";

const user = (content: string) => ({ role: "user", content });

describe("titles", () => {
  it("come from the first line of the first user message with text, trimmed", () => {
    expect(titleFrom([{ role: "system", content: "Be brief." }, user("  \n"), user("\n  Plan a trip \nto Lisbon")])).toBe("Plan a trip");
    expect(titleFrom([user("one\r\ntwo")])).toBe("one");
    expect(titleFrom([user("a\t\tb   c")])).toBe("a b c");
    expect(titleFrom([{ role: "assistant", content: "Hello" }])).toBeNull();
    expect(titleFrom([])).toBeNull();
  });

  it("are cut at TITLE_CHARS characters with an ellipsis, never inside a character", () => {
    const long = "x".repeat(TITLE_CHARS + 10);
    const t = cleanTitle(long);
    expect(Array.from(t)).toHaveLength(TITLE_CHARS);
    expect(t).toBe("x".repeat(TITLE_CHARS - 1) + "…");
    expect(cleanTitle("x".repeat(TITLE_CHARS))).toBe("x".repeat(TITLE_CHARS));
    // Characters outside the BMP count once and are not split.
    const emoji = "🚆".repeat(TITLE_CHARS + 1);
    expect(cleanTitle(emoji)).toBe("🚆".repeat(TITLE_CHARS - 1) + "…");
    // No space before the ellipsis.
    expect(cleanTitle("a".repeat(TITLE_CHARS - 2) + " bcdef")).toBe("a".repeat(TITLE_CHARS - 2) + "…");
  });

  it("are kept on one line, and blank is no title", () => {
    expect(cleanTitle("  Trip\n  notes ")).toBe("Trip notes");
    expect(cleanTitle(" \n\t")).toBe("");
  });

  it("name an untitled conversation once, then stay", () => {
    const messages = [user("Lisbon or Porto?")];
    expect(titleAfter("", messages)).toBe("Lisbon or Porto?");
    // Conversations stored by older versions hold the label itself.
    expect(titleAfter(DEFAULT_TITLE, messages)).toBe("Lisbon or Porto?");
    expect(titleAfter("My trip", messages)).toBe("My trip");
    expect(titleAfter("", [])).toBe("");
  });

  it("are shown as the default until there is one", () => {
    expect(isUntitled("")).toBe(true);
    expect(isUntitled(" ")).toBe(true);
    expect(isUntitled(DEFAULT_TITLE)).toBe(true);
    expect(isUntitled("Trip")).toBe(false);
    expect(shownTitle("")).toBe("New conversation");
    expect(shownTitle("Trip")).toBe("Trip");
  });
});

describe("exports", () => {
  const c: Conversation = conversation({
    id: "c1",
    title: "Trip",
    messages: [
      { role: "system", content: "Be brief.", figures: null, complete: true },
      { role: "user", content: "Plan a trip\n\n", figures: null, complete: true },
      { role: "assistant", content: "Day 1: Lisbon", figures: summary({ prompt_tokens: 36, reused: 30, read: 6, completion_tokens: 3, gen_tok_s: 88.84 }), complete: true },
      { role: "assistant", content: "Day 2: ", figures: null, complete: false },
    ],
  });

  it("are Markdown: the title, a heading per message, the figures under a reply, an incomplete one marked", () => {
    expect(conversationMarkdown(c)).toBe(
      [
        "# Trip",
        "",
        "## System",
        "",
        "Be brief.",
        "",
        "## User",
        "",
        "Plan a trip",
        "",
        "## Assistant",
        "",
        "Day 1: Lisbon",
        "",
        "_36 prompt tokens (30 reused, 6 read), 3 generated at 88.8 tok/s_",
        "",
        "## Assistant (incomplete)",
        "",
        "Day 2:",
        "",
      ].join("\n"),
    );
    expect(exportDocument(c, "markdown")).toBe(conversationMarkdown(c));
    expect(conversationMarkdown(conversation({ title: "" }))).toBe("# New conversation\n");
  });

  it("are the Conversation itself as JSON", () => {
    expect(JSON.parse(exportDocument(c, "json"))).toEqual(c);
    expect(exportDocument(c, "json")).toBe(JSON.stringify(c, null, 2));
  });

  it("are named from the title as shown: letters, digits, dashes, underscores, at most 60", () => {
    expect(exportFileName("Trip: Lisbon / Porto!", "markdown")).toBe("Trip-Lisbon-Porto.md");
    expect(exportFileName("snake_case-and-dash", "json")).toBe("snake_case-and-dash.json");
    expect(exportFileName("Café à São Paulo", "markdown")).toBe("Café-à-São-Paulo.md");
    expect(exportFileName("???", "json")).toBe("conversation.json");
    expect(exportFileName("", "markdown")).toBe("New-conversation.md");
    const cut = exportFileName(`${"a".repeat(59)} b`, "markdown");
    expect(cut).toBe(`${"a".repeat(59)}.md`);
    expect(exportFileName("b".repeat(100), "markdown")).toBe(`${"b".repeat(60)}.md`);
  });

  it("are files with the name, the text and its type", () => {
    expect(exportFile(c, "markdown")).toEqual({ fileName: "Trip.md", text: conversationMarkdown(c), mime: "text/markdown" });
    expect(exportFile(c, "json")).toEqual({ fileName: "Trip.json", text: exportDocument(c, "json"), mime: "application/json" });
  });
});
