// What a conversation is called and how it is exported: its title (taken from the first user message, or
// typed in a rename), the Markdown and JSON documents, and the export's file name. This module is the only
// implementation of these rules: both transports apply them (the browser's store in localStorage, and the
// desktop app, whose backend stores the title it is sent and writes the document it is given, deciding
// neither), and the views show titles through `shownTitle`. Pure: no transport, no view, no I/O.
import type { Conversation, ExportFormat } from "../bindings";

/** What an untitled conversation is shown as (and exported under). */
export const DEFAULT_TITLE = "New conversation";
/** The longest title, in characters (code points); a longer one is cut and ends with "…". */
export const TITLE_CHARS = 48;
/** The longest file name before its extension, in characters. */
export const FILE_NAME_CHARS = 60;

/**
 * A title as kept: on one line (runs of whitespace, newlines included, become one space), trimmed, and cut
 * at TITLE_CHARS with an ellipsis. "" when nothing is left.
 */
export function cleanTitle(text: string): string {
  const line = text.replace(/\s+/gu, " ").trim();
  const chars = Array.from(line);
  if (chars.length <= TITLE_CHARS) return line;
  return chars.slice(0, TITLE_CHARS - 1).join("").trimEnd() + "…";
}

/** Whether a stored title is no title yet: empty, or the label older versions stored in its place. */
export function isUntitled(title: string): boolean {
  return title.trim() === "" || title === DEFAULT_TITLE;
}

/** The title as shown: DEFAULT_TITLE while the conversation has none. */
export function shownTitle(title: string): string {
  return isUntitled(title) ? DEFAULT_TITLE : title;
}

/** A title from the first user message that has text: its first line, cleaned; null when there is none. */
export function titleFrom(messages: readonly { role: string; content: string }[]): string | null {
  for (const m of messages) {
    if (m.role !== "user") continue;
    const line = m.content.trim().split(/\r?\n/u)[0] ?? "";
    const title = cleanTitle(line);
    if (title !== "") return title;
  }
  return null;
}

/**
 * The title a conversation has once `messages` are stored as its messages: the one it has, or, while it
 * is untitled, one from the first user message.
 */
export function titleAfter(current: string, messages: readonly { role: string; content: string }[]): string {
  return isUntitled(current) ? (titleFrom(messages) ?? current) : current;
}

const ROLE_HEADING = { system: "System", user: "User", assistant: "Assistant" } as const;

/** The conversation as Markdown: its title, a heading per message, the figures under each reply. */
export function conversationMarkdown(c: Conversation): string {
  const parts = [`# ${shownTitle(c.title)}`, ""];
  for (const m of c.messages) {
    parts.push(`## ${ROLE_HEADING[m.role]}${m.complete ? "" : " (incomplete)"}`, "", m.content.trimEnd(), "");
    const f = m.figures;
    if (f) {
      parts.push(
        `_${f.prompt_tokens} prompt tokens (${f.reused} reused, ${f.read} read), ${f.completion_tokens} generated at ${f.gen_tok_s.toFixed(1)} tok/s_`,
        "",
      );
    }
  }
  return parts.join("\n");
}

/** The conversation as a document: Markdown, or the Conversation itself as indented JSON. */
export function exportDocument(c: Conversation, format: ExportFormat): string {
  return format === "json" ? JSON.stringify(c, null, 2) : conversationMarkdown(c);
}

const EXTENSION: Record<ExportFormat, string> = { markdown: "md", json: "json" };
const MIME: Record<ExportFormat, string> = { markdown: "text/markdown", json: "application/json" };

/**
 * The export's file name, from the title as shown: letters, digits, dashes and underscores (each run of
 * anything else one dash), at most FILE_NAME_CHARS of them, "conversation" when none is left.
 */
export function exportFileName(title: string, format: ExportFormat): string {
  const dashed = shownTitle(title).replace(/[^\p{L}\p{N}_-]+/gu, "-").replace(/^-+|-+$/gu, "");
  const base = Array.from(dashed).slice(0, FILE_NAME_CHARS).join("").replace(/-+$/u, "");
  return `${base || "conversation"}.${EXTENSION[format]}`;
}

/** An export ready to be written: the file name offered, the text, and its MIME type. */
export interface ExportFile {
  fileName: string;
  text: string;
  mime: string;
}

export function exportFile(c: Conversation, format: ExportFormat): ExportFile {
  return { fileName: exportFileName(c.title, format), text: exportDocument(c, format), mime: MIME[format] };
}
