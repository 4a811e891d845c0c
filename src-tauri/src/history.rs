//! Chat history in the app's data folder: one JSON file per conversation (`conversations/<id>.json`),
//! each written atomically (a temporary file in the same folder, fsync, rename over the old one, fsync of
//! the folder). A crash at any moment leaves every file either as it was or as it became: never torn.
//! Temporary files a crash left behind are ignored and swept on open.
//!
//! It stores titles as the page sends them and never makes one: what a conversation is called (from its
//! first user message, cleaned, "New conversation" while it has none) and how it is exported are rules of
//! the UI's `chat/conversation.ts`, the one implementation, which the browser without this backend runs too.
//! A conversation created without a title is stored with an empty one.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::types::{
    ChatMessage, ChatRole, CmdResult, CommandError, Conversation, ConversationSummary, ErrorCode, StoredMessage,
};

const TEMP_PREFIX: &str = ".tmp-";

pub struct History {
    dir: PathBuf,
}

/// Where an atomic write stops when a test simulates a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// Half of the bytes written to the temporary file.
    MidWrite,
    /// Written and synced, not yet renamed.
    BeforeRename,
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl History {
    /// Opens (and creates) the folder, sweeping temporary files left by a crash.
    pub fn open(dir: PathBuf) -> CmdResult<History> {
        fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
        if let Ok(entries) = fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        Ok(History { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &str) -> CmdResult<PathBuf> {
        // Ids are ours (hex); anything else could name a path outside the folder.
        if id.is_empty() || id.len() > 64 || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(CommandError {
                code: ErrorCode::Invalid,
                field: Some("id".into()),
                message: format!("{id:?} is not a conversation id"),
            });
        }
        Ok(self.dir.join(format!("{id}.json")))
    }

    /// A new conversation with no messages; `title` as given, empty when None (untitled).
    pub fn create(&self, title: Option<String>) -> CmdResult<Conversation> {
        let id = format!("{:016x}{:08x}", now_ms(), rand::random::<u32>());
        let now = now_ms();
        let c = Conversation {
            id,
            title: title.unwrap_or_default(),
            created_ms: now,
            updated_ms: now,
            messages: Vec::new(),
        };
        self.save(&c)?;
        Ok(c)
    }

    pub fn get(&self, id: &str) -> CmdResult<Conversation> {
        let path = self.path(id)?;
        let bytes = fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => CommandError::new(ErrorCode::NotFound, format!("no conversation {id}")),
            _ => io_error(&path, e),
        })?;
        serde_json::from_slice(&bytes)
            .map_err(|e| CommandError::io(format!("conversation file {} is unreadable: {e}", path.display())))
    }

    pub fn save(&self, c: &Conversation) -> CmdResult<()> {
        self.save_with(c, None)
    }

    /// Writes `c`; with a crash point, stops there as a killed process would (for tests).
    pub fn save_with(&self, c: &Conversation, crash: Option<CrashPoint>) -> CmdResult<()> {
        let path = self.path(&c.id)?;
        let bytes = serde_json::to_vec_pretty(c).map_err(|e| CommandError::io(e.to_string()))?;
        write_atomic(&self.dir, &path, &bytes, crash).map_err(|e| io_error(&path, e))
    }

    pub fn list(&self) -> CmdResult<Vec<ConversationSummary>> {
        let mut out = Vec::new();
        let entries = fs::read_dir(&self.dir).map_err(|e| io_error(&self.dir, e))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".json") else { continue };
            if name.starts_with(TEMP_PREFIX) {
                continue;
            }
            match self.get(id) {
                Ok(c) => out.push(ConversationSummary {
                    id: c.id,
                    title: c.title,
                    updated_ms: c.updated_ms,
                    messages: c.messages.len(),
                }),
                Err(err) => tracing::warn!("skipping conversation {name}: {err}"),
            }
        }
        out.sort_by(|a, b| b.updated_ms.cmp(&a.updated_ms).then_with(|| a.id.cmp(&b.id)));
        Ok(out)
    }

    /// Renames `id` to `title` as given (the page cleaned it); a blank title is refused.
    pub fn rename(&self, id: &str, title: &str) -> CmdResult<()> {
        if title.trim().is_empty() {
            return Err(CommandError {
                code: ErrorCode::Invalid,
                field: Some("title".into()),
                message: "the title is empty".into(),
            });
        }
        let mut c = self.get(id)?;
        c.title = title.to_owned();
        c.updated_ms = now_ms();
        self.save(&c)
    }

    /// Stores `messages` as conversation `id`'s messages, followed by the reply to come (empty, incomplete),
    /// and `title` as its title when one is given (None keeps the one it has). Returns what was stored.
    pub fn begin_reply(&self, id: &str, messages: &[ChatMessage], title: Option<String>) -> CmdResult<Conversation> {
        let mut c = self.get(id)?;
        if let Some(t) = title {
            c.title = t;
        }
        c.messages = messages
            .iter()
            .map(|m| StoredMessage {
                role: m.role,
                content: m.content.clone(),
                reasoning: m.reasoning.clone(),
                figures: None,
                complete: true,
            })
            .collect();
        c.messages.push(StoredMessage {
            role: ChatRole::Assistant,
            content: String::new(),
            reasoning: None,
            figures: None,
            complete: false,
        });
        c.updated_ms = now_ms();
        self.save(&c)?;
        Ok(c)
    }

    pub fn delete(&self, id: &str) -> CmdResult<()> {
        let path = self.path(id)?;
        fs::remove_file(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => CommandError::new(ErrorCode::NotFound, format!("no conversation {id}")),
            _ => io_error(&path, e),
        })?;
        sync_dir(&self.dir);
        Ok(())
    }
}

/// Writes `bytes` to `path` atomically (a temporary file beside it, fsync, rename).
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    write_atomic(dir, path, bytes, None)
}

fn io_error(path: &Path, e: std::io::Error) -> CommandError {
    CommandError::io(format!("{}: {e}", path.display()))
}

/// Temp file in `dir`, write, fsync, rename over `path`, fsync `dir`.
fn write_atomic(dir: &Path, path: &Path, bytes: &[u8], crash: Option<CrashPoint>) -> std::io::Result<()> {
    let mut tmp = tempfile::Builder::new().prefix(TEMP_PREFIX).suffix(".json").tempfile_in(dir)?;
    if crash == Some(CrashPoint::MidWrite) {
        tmp.write_all(&bytes[..bytes.len() / 2])?;
        // A killed process leaves the file behind (keep() stops tempfile's own cleanup).
        let _ = tmp.keep();
        return Ok(());
    }
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    if crash == Some(CrashPoint::BeforeRename) {
        let _ = tmp.keep();
        return Ok(());
    }
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir);
    Ok(())
}

fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::StoredMessage;

    fn msg(role: ChatRole, content: &str, complete: bool) -> StoredMessage {
        StoredMessage { role, content: content.into(), reasoning: None, figures: None, complete }
    }

    #[test]
    fn a_crash_between_writes_keeps_the_last_complete_version() {
        let dir = tempfile::tempdir().unwrap();
        let h = History::open(dir.path().join("conversations")).unwrap();
        let mut c = h.create(Some("Trip".into())).unwrap();
        c.messages = vec![msg(ChatRole::User, "Plan a trip", true), msg(ChatRole::Assistant, "Day 1: ", false)];
        h.save(&c).unwrap();
        let shown = c.clone();
        // The next write dies half way, then one dies after syncing but before the rename.
        let mut next = c.clone();
        next.messages[1].content.push_str("Lisbon. Day 2: Porto.");
        h.save_with(&next, Some(CrashPoint::MidWrite)).unwrap();
        h.save_with(&next, Some(CrashPoint::BeforeRename)).unwrap();
        let leftovers = fs::read_dir(h.dir())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(TEMP_PREFIX));
        assert_eq!(leftovers.count(), 2, "the crashes leave their temporary files");
        // The app starts again: what was shown before the crash is there, whole.
        let h = History::open(dir.path().join("conversations")).unwrap();
        assert_eq!(h.get(&c.id).unwrap(), shown);
        assert_eq!(h.list().unwrap().len(), 1);
        let swept = fs::read_dir(h.dir()).unwrap().count();
        assert_eq!(swept, 1, "temporary files are swept on open");
        // And a write that completes replaces it.
        h.save(&next).unwrap();
        assert_eq!(h.get(&c.id).unwrap(), next);
    }

    #[test]
    fn list_rename_delete() {
        let dir = tempfile::tempdir().unwrap();
        let h = History::open(dir.path().to_owned()).unwrap();
        let mut a = h.create(None).unwrap();
        a.messages.push(msg(ChatRole::User, "Hello", true));
        a.messages.push(msg(ChatRole::Assistant, "Hi! ```rust\nfn main() {}\n```", true));
        // An hour ahead, so that `a` lists first however long the save and the next create take (10 ms
        // ahead failed on a loaded machine, where an fsync can take longer).
        a.updated_ms += 3_600_000;
        h.save(&a).unwrap();
        let b = h.create(Some("second".into())).unwrap();
        let l = h.list().unwrap();
        assert_eq!(l.iter().map(|s| s.messages).collect::<Vec<_>>(), vec![2, 0]);
        assert_eq!(l.iter().map(|s| s.title.as_str()).collect::<Vec<_>>(), vec!["", "second"]);
        h.rename(&a.id, "Greetings").unwrap();
        assert_eq!(h.get(&a.id).unwrap().title, "Greetings");
        assert_eq!(h.rename(&a.id, " \n").unwrap_err().field.as_deref(), Some("title"));
        let out = dir.path().join("out.md");
        write_file_atomic(&out, b"# Greetings\n").unwrap();
        assert_eq!(fs::read_to_string(&out).unwrap(), "# Greetings\n");
        h.delete(&b.id).unwrap();
        assert_eq!(h.delete(&b.id).unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(h.get("../../etc/passwd").unwrap_err().field.as_deref(), Some("id"));
    }

    /// Titles are the page's (ui/src/chat/conversation.ts): stored exactly as sent, never made or changed here.
    #[test]
    fn titles_are_stored_as_the_page_sends_them() {
        let dir = tempfile::tempdir().unwrap();
        let h = History::open(dir.path().to_owned()).unwrap();
        // Untitled: empty, not a label of this side's (the page shows "New conversation").
        let c = h.create(None).unwrap();
        assert_eq!(c.title, "");
        // Not cleaned, cut or put on one line here: that is the page's rule.
        let odd = "  Two\nlines, and a title longer than any limit the page would keep: ".repeat(3);
        assert_eq!(h.create(Some(odd.clone())).unwrap().title, odd);
        h.rename(&c.id, &odd).unwrap();
        assert_eq!(h.get(&c.id).unwrap().title, odd);
        // A reply begins: the messages are stored with the reply to come, under the title the page sent,
        // not one made from the messages.
        let messages = [
            ChatMessage { role: ChatRole::User, content: "Plan a trip to Lisbon and Porto".into(), reasoning: None },
            ChatMessage { role: ChatRole::Assistant, content: "Day 1: Lisbon".into(), reasoning: None },
            ChatMessage { role: ChatRole::User, content: "And day 2?".into(), reasoning: None },
        ];
        let untitled = h.create(None).unwrap();
        let stored = h.begin_reply(&untitled.id, &messages[..1], None).unwrap();
        assert_eq!(stored.title, "", "no title sent: none made");
        let stored = h.begin_reply(&untitled.id, &messages, Some("Trip (the page's title)".into())).unwrap();
        assert_eq!(stored.title, "Trip (the page's title)");
        assert_eq!(h.get(&untitled.id).unwrap(), stored);
        let shape: Vec<(ChatRole, &str, bool)> =
            stored.messages.iter().map(|m| (m.role, m.content.as_str(), m.complete)).collect();
        assert_eq!(
            shape,
            [
                (ChatRole::User, "Plan a trip to Lisbon and Porto", true),
                (ChatRole::Assistant, "Day 1: Lisbon", true),
                (ChatRole::User, "And day 2?", true),
                (ChatRole::Assistant, "", false),
            ]
        );
        // None keeps the title it has.
        assert_eq!(h.begin_reply(&untitled.id, &messages, None).unwrap().title, "Trip (the page's title)");
        assert_eq!(h.list().unwrap().iter().find(|s| s.id == untitled.id).unwrap().title, "Trip (the page's title)");
    }
}
