// A conversation as a document, for the browser (the desktop app's backend makes its own): Markdown with a
// heading per message, or the Conversation as pretty JSON. Pure.
import type { Conversation, ExportFormat } from "../../bindings";

const ROLE_TITLE = { system: "System", user: "User", assistant: "Assistant" } as const;

export function conversationToMarkdown(c: Conversation): string {
  const parts = [`# ${c.title}`, ""];
  for (const m of c.messages) {
    parts.push(`## ${ROLE_TITLE[m.role]}${m.complete ? "" : " (incomplete)"}`, "", m.content, "");
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

export function exportDocument(c: Conversation, format: ExportFormat): string {
  return format === "json" ? JSON.stringify(c, null, 2) : conversationToMarkdown(c);
}
