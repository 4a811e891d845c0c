//! The chat preferences (`ChatPreferences`: the reply limit, sampling values saved per model) in one small
//! JSON file in the app's data folder, written atomically as the history is (a temporary file, fsync,
//! rename, fsync of the folder), so a crash leaves the old file or the new one, never a torn one. Values
//! are checked here before they are kept; this module never talks to the engine.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use strata::sync::LockUnpoisoned;

use crate::types::{ChatParams, ChatPreferences, CmdResult, CommandError, ErrorCode};

/// The file's name in the data folder.
pub const PREFERENCES_FILE: &str = "chat-preferences.json";
/// The longest reply limit accepted (a context window larger than any model's).
pub const MAX_REPLY_LIMIT_TOKENS: u32 = 1 << 20;
/// The most models that can have saved values (the file stays small).
pub const MAX_SAVED_MODELS: usize = 256;

pub struct Preferences {
    path: PathBuf,
    /// One read-modify-write at a time (a save replaces the whole file).
    lock: Mutex<()>,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> CommandError {
    CommandError { code: ErrorCode::Invalid, field: Some(field.into()), message: message.into() }
}

/// Checks one reply's sampling values; the error names the field (`temperature`, `top_p`, ...). JSON mode
/// (`json_mode`) is a switch: any value is valid.
pub fn check_params(p: &ChatParams) -> CmdResult<()> {
    if p.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
        return Err(invalid("temperature", "between 0 and 2"));
    }
    if p.top_p.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
        return Err(invalid("top_p", "between 0 and 1"));
    }
    if p.min_p.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
        return Err(invalid("min_p", "between 0 and 1"));
    }
    if p.repeat_penalty.is_some_and(|r| !(r > 0.0 && r <= 100.0)) {
        return Err(invalid("repeat_penalty", "above 0 and at most 100"));
    }
    if p.max_tokens == Some(0) {
        return Err(invalid("max_tokens", "at least 1"));
    }
    Ok(())
}

/// Checks preferences before they are kept; the error names the field (`reply_limit_tokens`, or
/// `params_by_model.temperature` for a model's value).
pub fn check_preferences(p: &ChatPreferences) -> CmdResult<()> {
    if !(1..=MAX_REPLY_LIMIT_TOKENS).contains(&p.reply_limit_tokens) {
        return Err(invalid("reply_limit_tokens", format!("from 1 to {MAX_REPLY_LIMIT_TOKENS} tokens")));
    }
    if p.params_by_model.len() > MAX_SAVED_MODELS {
        return Err(invalid("params_by_model", format!("values can be saved for at most {MAX_SAVED_MODELS} models")));
    }
    for (path, params) in &p.params_by_model {
        if path.trim().is_empty() {
            return Err(invalid("params_by_model", "a model's path is empty"));
        }
        check_params(params).map_err(|e| CommandError {
            field: e.field.map(|f| format!("params_by_model.{f}")),
            message: format!("{}: {}", path, e.message),
            ..e
        })?;
    }
    Ok(())
}

impl Preferences {
    /// The preferences kept in `dir` (the file need not exist yet).
    pub fn in_dir(dir: &Path) -> Preferences {
        Preferences { path: dir.join(PREFERENCES_FILE), lock: Mutex::new(()) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The preferences as stored; the defaults when nothing was saved yet.
    pub fn get(&self) -> CmdResult<ChatPreferences> {
        let _one = self.lock.lock_unpoisoned();
        self.read()
    }

    /// Checks `p` and keeps it (replacing what was stored); returns what is stored now.
    pub fn save(&self, p: &ChatPreferences) -> CmdResult<ChatPreferences> {
        check_preferences(p)?;
        let _one = self.lock.lock_unpoisoned();
        let bytes = serde_json::to_vec_pretty(p).map_err(|e| CommandError::io(e.to_string()))?;
        crate::history::write_file_atomic(&self.path, &bytes).map_err(|e| {
            CommandError::io(format!("cannot save the chat preferences to {}: {e}", self.path.display()))
        })?;
        Ok(p.clone())
    }

    fn read(&self) -> CmdResult<ChatPreferences> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ChatPreferences::default()),
            Err(e) => return Err(CommandError::io(format!("{}: {e}", self.path.display()))),
        };
        serde_json::from_slice(&bytes).map_err(|e| {
            CommandError::io(format!(
                "the chat preferences in {} are unreadable ({e}); saving new ones replaces them",
                self.path.display()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: Option<f32>) -> ChatParams {
        ChatParams { temperature, ..Default::default() }
    }

    #[test]
    fn saved_preferences_are_read_back_and_bad_ones_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let prefs = Preferences::in_dir(dir.path());
        assert_eq!(prefs.get().unwrap(), ChatPreferences::default());
        assert_eq!(prefs.get().unwrap().reply_limit_tokens, 2048);
        let mut p = ChatPreferences { reply_limit_tokens: 512, ..Default::default() };
        p.params_by_model.insert("/models/a.gguf".into(), ChatParams { top_k: Some(20), ..params(Some(0.7)) });
        prefs.save(&p).unwrap();
        assert_eq!(Preferences::in_dir(dir.path()).get().unwrap(), p);

        let cases = [
            (ChatPreferences { reply_limit_tokens: 0, ..p.clone() }, "reply_limit_tokens"),
            (ChatPreferences { reply_limit_tokens: MAX_REPLY_LIMIT_TOKENS + 1, ..p.clone() }, "reply_limit_tokens"),
        ];
        for (bad, field) in cases {
            assert_eq!(prefs.save(&bad).unwrap_err().field.as_deref(), Some(field));
        }
        let with = |params: ChatParams| {
            let mut q = p.clone();
            q.params_by_model.insert("/models/b.gguf".into(), params);
            q
        };
        for (bad, field) in [
            (params(Some(2.5)), "params_by_model.temperature"),
            (ChatParams { top_p: Some(1.5), ..Default::default() }, "params_by_model.top_p"),
            (ChatParams { min_p: Some(-0.1), ..Default::default() }, "params_by_model.min_p"),
            (ChatParams { repeat_penalty: Some(0.0), ..Default::default() }, "params_by_model.repeat_penalty"),
            (ChatParams { max_tokens: Some(0), ..Default::default() }, "params_by_model.max_tokens"),
        ] {
            let e = prefs.save(&with(bad)).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{e:?}");
            assert!(e.message.starts_with("/models/b.gguf: "), "{e:?}");
        }
        // Nothing refused was kept.
        assert_eq!(prefs.get().unwrap(), p);
        // JSON mode is kept per model like the sampling values.
        let json = with(ChatParams { json_mode: Some(true), ..Default::default() });
        prefs.save(&json).unwrap();
        assert_eq!(prefs.get().unwrap().params_by_model["/models/b.gguf"].json_mode, Some(true));
        // A file saved before JSON mode existed still loads, with it off.
        std::fs::write(
            prefs.path(),
            br#"{"reply_limit_tokens": 300, "params_by_model": {"/models/a.gguf": {"temperature": 0.5,
                "top_k": null, "top_p": null, "min_p": null, "repeat_penalty": null, "max_tokens": null,
                "seed": null}}}"#,
        )
        .unwrap();
        let old = prefs.get().unwrap();
        assert_eq!(old.params_by_model["/models/a.gguf"], ChatParams { temperature: Some(0.5), ..Default::default() });
        prefs.save(&p).unwrap();
        // A file that is not what was written is an error that says so, not silently the defaults.
        std::fs::write(prefs.path(), b"{\"reply_limit_tokens\": ").unwrap();
        let e = prefs.get().unwrap_err();
        assert_eq!(e.code, ErrorCode::Io);
        assert!(e.message.contains("unreadable"), "{e:?}");
    }
}
