// The list of conversations: new, select, and for the selected one rename (inline), delete (asked twice)
// and export as Markdown or JSON. Titles are shown by shownTitle (an untitled one as "New conversation").
// Each conversation whose reply streams is marked "replying" (and aria-busy); any conversation can be
// opened, and a new one made, while others stream. A replying conversation cannot be renamed (the reply's
// writes would put the old title back), and deleting one stops its reply first, as the confirmation says.
import { useState } from "preact/hooks";
import type { ConversationSummary, ExportFormat } from "../../bindings";
import { DEFAULT_TITLE, shownTitle } from "../../chat/conversation";

export interface ConversationListProps {
  items: ConversationSummary[];
  selected: string | null;
  /** The ids of the conversations whose reply streams. */
  replying: readonly string[];
  onNew: () => void;
  onSelect: (id: string) => void;
  onRename: (id: string, title: string) => void;
  onDelete: (id: string) => void;
  onExport: (id: string, format: ExportFormat) => void;
}

export function ConversationList(p: ConversationListProps) {
  const [renaming, setRenaming] = useState<string | null>(null);
  const [title, setTitle] = useState("");
  const [confirming, setConfirming] = useState<string | null>(null);
  const current = p.items.find((c) => c.id === p.selected) ?? null;
  const replying = (id: string) => p.replying.includes(id);
  const currentReplying = current !== null && replying(current.id);
  return (
    <aside class="conversations" aria-label="Conversations">
      <button type="button" class="primary" onClick={p.onNew}>
        {DEFAULT_TITLE}
      </button>
      <ul class="conversation-list">
        {p.items.map((c) => (
          <li key={c.id}>
            <button
              type="button"
              class="conversation-item"
              aria-current={c.id === p.selected ? "true" : undefined}
              aria-busy={replying(c.id) ? "true" : undefined}
              onClick={() => p.onSelect(c.id)}
            >
              <span class="conversation-title">{shownTitle(c.title)}</span>
              <span class="conversation-line">
                <span class="conversation-meta">{c.messages} messages</span>
                {replying(c.id) && (
                  <span class="conversation-replying" data-testid="conversation-replying">
                    replying…
                  </span>
                )}
              </span>
            </button>
          </li>
        ))}
        {p.items.length === 0 && <li class="muted">No conversations yet.</li>}
      </ul>
      {current && (
        <div class="conversation-actions" aria-label="This conversation">
          {renaming === current.id ? (
            <form
              class="rename"
              onSubmit={(e) => {
                e.preventDefault();
                if (title.trim()) p.onRename(current.id, title.trim());
                setRenaming(null);
              }}
            >
              <label for="rename-input">Title</label>
              <input id="rename-input" value={title} onInput={(e) => setTitle((e.target as HTMLInputElement).value)} />
              <button type="submit">Save</button>
              <button type="button" onClick={() => setRenaming(null)}>
                Cancel
              </button>
            </form>
          ) : confirming === current.id ? (
            <div class="confirm" role="group" aria-label="Delete this conversation?">
              <span>
                Delete “{shownTitle(current.title)}”?{currentReplying && " Its reply is stopped first."}
              </span>
              <button
                type="button"
                class="danger"
                onClick={() => {
                  setConfirming(null);
                  p.onDelete(current.id);
                }}
              >
                Delete
              </button>
              <button type="button" onClick={() => setConfirming(null)}>
                Keep
              </button>
            </div>
          ) : (
            <div class="button-row">
              <button
                type="button"
                onClick={() => {
                  setTitle(current.title);
                  setRenaming(current.id);
                }}
                disabled={currentReplying}
                title={currentReplying ? "Rename once the reply has ended" : undefined}
              >
                Rename
              </button>
              <button type="button" onClick={() => setConfirming(current.id)}>
                Delete
              </button>
              <button type="button" onClick={() => p.onExport(current.id, "markdown")}>
                Export Markdown
              </button>
              <button type="button" onClick={() => p.onExport(current.id, "json")}>
                Export JSON
              </button>
            </div>
          )}
        </div>
      )}
    </aside>
  );
}
