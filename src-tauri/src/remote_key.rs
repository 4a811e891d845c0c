//! The remote endpoint's API key, kept out of settings.json in a file of its own (`remote-api-key` in the
//! app's data folder) that only the user can read: created 0600 on Unix (a temporary file made 0600, then
//! renamed over the old one, so no moment exists where the key sits in a wider file); on Windows it is in
//! the per-user data folder, which only that user and the system can open. The settings, the settings
//! file and the page see only `RemoteKey::Kept { hint }` or `RemoteKey::None`; the engine client asks
//! this module for the key itself. It also moves a key that an older settings.json still holds.
//!
//! Why a file and not the OS keychain (the `keyring` crate, considered): on Linux the keychain is the
//! D-Bus Secret Service, which headless machines, containers, SSH sessions and CI runners do not have, so
//! the app would have to fall back to a file there anyway; one 0600 file everywhere is one behaviour to
//! test and to reason about.
//!
//! This module never sends the key anywhere and never logs it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use strata::plan::settings::{EngineLocation, EngineSettings, RemoteKey};
use strata::sync::LockUnpoisoned;

/// The key file's name in the data folder.
pub const KEY_FILE: &str = "remote-api-key";

/// The Hugging Face token's file in the data folder (the model library's gated repositories), kept the
/// same way.
pub const HF_TOKEN_FILE: &str = "hf-token";

/// Why the key file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    #[error("cannot read the key kept in {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the key file {path} is not UTF-8 text")]
    NotText { path: PathBuf },
    #[error("cannot save the key to {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot remove the key file {path}: {source}")]
    Remove { path: PathBuf, source: std::io::Error },
}

/// The key file and the key it holds (read once, then kept in step with every write).
pub struct KeyFile {
    path: PathBuf,
    key: Mutex<Option<String>>,
}

impl KeyFile {
    /// The key kept in `dir`, read now (none when the file is absent). A file others may read, left by
    /// hand, is narrowed to 0600 first.
    pub fn open(dir: &Path) -> Result<KeyFile, KeyFileError> {
        KeyFile::open_named(dir, KEY_FILE)
    }

    /// [`KeyFile::open`] of the file `name` (another secret kept the same way: [`HF_TOKEN_FILE`]).
    pub fn open_named(dir: &Path, name: &str) -> Result<KeyFile, KeyFileError> {
        let path = dir.join(name);
        let key = read_key(&path)?;
        Ok(KeyFile { path, key: Mutex::new(key) })
    }

    /// The key file in `dir` holding no key for this run (its file could not be read); a save replaces it.
    pub fn unread(dir: &Path) -> KeyFile {
        KeyFile::unread_named(dir, KEY_FILE)
    }

    /// [`KeyFile::unread`] of the file `name`.
    pub fn unread_named(dir: &Path, name: &str) -> KeyFile {
        KeyFile { path: dir.join(name), key: Mutex::new(None) }
    }

    /// Keeps what `key` says: a new key replaces the file's, `None` removes it, `Kept` leaves it. What is
    /// kept then, masked.
    pub fn keep(&self, key: &RemoteKey) -> Result<RemoteKey, KeyFileError> {
        match key {
            RemoteKey::New { key } => self.set(Some(key.trim()))?,
            RemoteKey::None => self.set(None)?,
            RemoteKey::Kept { .. } => {}
        }
        Ok(self.masked())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The key itself, for the engine client only.
    pub fn key(&self) -> Option<String> {
        self.key.lock_unpoisoned().clone()
    }

    /// What the settings may say of the key: kept (with its hint) or none.
    pub fn masked(&self) -> RemoteKey {
        self.key().map_or(RemoteKey::None, |k| RemoteKey::kept_of(&k))
    }

    /// Takes the key out of `s` before it is stored or shown: a new key is written to the file (replacing
    /// any), `None` removes the file, `Kept` leaves it as it is. A local engine uses no key, so the file
    /// is removed then too (a secret no setting refers to is not left behind). Afterwards `s` says only
    /// `Kept { hint }` (of the key really kept) or `None`.
    pub fn absorb(&self, s: &mut EngineSettings) -> Result<(), KeyFileError> {
        match &mut s.engine {
            EngineLocation::Local => self.set(None),
            EngineLocation::Remote { api_key, .. } => {
                match api_key {
                    RemoteKey::New { key } => self.set(Some(key.trim()))?,
                    RemoteKey::None => self.set(None)?,
                    RemoteKey::Kept { .. } => {}
                }
                *api_key = self.masked();
                Ok(())
            }
        }
    }

    /// Moves a key that settings read from an older settings.json still hold into the file; true when
    /// one was moved (the settings file must then be written again, without it). `s` is masked even when
    /// the file cannot be written: the key is then held for this run only, and settings.json keeps it
    /// until a save succeeds.
    pub fn migrate(&self, s: &mut EngineSettings) -> Result<bool, KeyFileError> {
        let EngineLocation::Remote { api_key, .. } = &mut s.engine else { return Ok(false) };
        let RemoteKey::New { key } = std::mem::take(api_key) else {
            *api_key = self.masked();
            return Ok(false);
        };
        let key = key.trim().to_owned();
        let written = self.write(Some(key.as_str()).filter(|k| !k.is_empty()));
        *self.key.lock_unpoisoned() = Some(key).filter(|k| !k.is_empty());
        *api_key = self.masked();
        written.map(|()| true)
    }

    /// Keeps `key` (None or empty: no key) in the file and in memory.
    fn set(&self, key: Option<&str>) -> Result<(), KeyFileError> {
        let key = key.filter(|k| !k.is_empty());
        self.write(key)?;
        *self.key.lock_unpoisoned() = key.map(str::to_owned);
        Ok(())
    }

    fn write(&self, key: Option<&str>) -> Result<(), KeyFileError> {
        match key {
            Some(k) => write_private(&self.path, k.as_bytes())
                .map_err(|source| KeyFileError::Write { path: self.path.clone(), source }),
            None => match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(KeyFileError::Remove { path: self.path.clone(), source: e })
                }
                _ => Ok(()),
            },
        }
    }
}

fn read_key(path: &Path) -> Result<Option<String>, KeyFileError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(KeyFileError::Read { path: path.to_owned(), source }),
    };
    narrow_mode(path);
    let text = String::from_utf8(bytes).map_err(|_| KeyFileError::NotText { path: path.to_owned() })?;
    // A file written by hand may end with a newline.
    let key = text.trim();
    Ok((!key.is_empty()).then(|| key.to_owned()))
}

/// A key file others may read (written by hand, copied in) is made 0600.
fn narrow_mode(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = std::fs::metadata(path) else { return };
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!("{} could be read by others: narrowing it to 0600", path.display());
            if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
                tracing::warn!("cannot narrow {}: {e}", path.display());
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Writes `bytes` to `path` atomically, the file never readable by others: a temporary file beside it
/// created 0600 on Unix, written, fsynced, renamed over `path`, the folder fsynced.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut builder = tempfile::Builder::new();
    builder.prefix(".key-").suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o600));
    }
    let mut tmp = builder.tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    #[cfg(unix)]
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-live-0123456789wxyz";

    fn remote(api_key: RemoteKey) -> EngineSettings {
        EngineSettings {
            engine: EngineLocation::Remote {
                url: "https://gpu-box:8000".into(),
                api_key,
                model: String::new(),
                allow_insecure: false,
            },
            ..EngineSettings::default()
        }
    }

    fn key_of(s: &EngineSettings) -> &RemoteKey {
        match &s.engine {
            EngineLocation::Remote { api_key, .. } => api_key,
            EngineLocation::Local => panic!("a local engine"),
        }
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_new_key_goes_to_a_0600_file_and_the_settings_keep_only_its_hint() {
        let dir = tempfile::tempdir().unwrap();
        let file = KeyFile::open(dir.path()).unwrap();
        assert_eq!((file.key(), file.masked()), (None, RemoteKey::None));
        let mut s = remote(RemoteKey::New { key: format!(" {KEY}\n") });
        file.absorb(&mut s).unwrap();
        assert_eq!(key_of(&s), &RemoteKey::Kept { hint: "wxyz".into() });
        let stored = serde_json::to_string(&s).unwrap();
        assert!(!stored.contains(KEY) && !stored.contains("sk-live"), "{stored}");
        assert_eq!(std::fs::read_to_string(file.path()).unwrap(), KEY);
        #[cfg(unix)]
        assert_eq!(mode(file.path()), 0o600);
        assert_eq!(file.key().as_deref(), Some(KEY));
        // No temporary file is left beside it.
        let names: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names, [KEY_FILE]);
        // A new app reads it back.
        assert_eq!(KeyFile::open(dir.path()).unwrap().key().as_deref(), Some(KEY));
    }

    #[test]
    fn kept_keeps_the_key_none_clears_it_and_a_local_engine_drops_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = KeyFile::open(dir.path()).unwrap();
        file.absorb(&mut remote(RemoteKey::New { key: KEY.into() })).unwrap();
        // The page sends back what it read (whatever hint it shows): the key stays.
        let mut s = remote(RemoteKey::Kept { hint: "????".into() });
        file.absorb(&mut s).unwrap();
        assert_eq!((key_of(&s), file.key().as_deref()), (&RemoteKey::Kept { hint: "wxyz".into() }, Some(KEY)));
        // A new one replaces it.
        let mut s = remote(RemoteKey::New { key: "sk-other-key-abcdef".into() });
        file.absorb(&mut s).unwrap();
        assert_eq!(std::fs::read_to_string(file.path()).unwrap(), "sk-other-key-abcdef");
        // Cleared: no file, no key.
        let mut s = remote(RemoteKey::None);
        file.absorb(&mut s).unwrap();
        assert_eq!((key_of(&s), file.key()), (&RemoteKey::None, None));
        assert!(!file.path().exists());
        // Kept when none is: the settings say none.
        let mut s = remote(RemoteKey::Kept { hint: "wxyz".into() });
        file.absorb(&mut s).unwrap();
        assert_eq!(key_of(&s), &RemoteKey::None);
        // A local engine: the file goes.
        file.absorb(&mut remote(RemoteKey::New { key: KEY.into() })).unwrap();
        file.absorb(&mut EngineSettings::default()).unwrap();
        assert!(!file.path().exists() && file.key().is_none());
    }

    #[test]
    fn an_old_settings_key_is_moved_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let old = format!(
            r#"{{"model_path":null,"devices":"cpu","layer_split":"","kv":"f16","kv_resident":null,
            "max_context":null,"vram_reserve_mib":0,"cache_slots":4,"cache_mib":4096,"threads":null,
            "engine":{{"kind":"remote","url":"https://gpu-box:8000","api_key":"{KEY}","model":"m"}}}}"#
        );
        let mut s: EngineSettings = serde_json::from_str(&old).expect("old settings read");
        let file = KeyFile::open(dir.path()).unwrap();
        assert!(file.migrate(&mut s).unwrap(), "a key was moved");
        assert_eq!(key_of(&s), &RemoteKey::Kept { hint: "wxyz".into() });
        assert!(!serde_json::to_string(&s).unwrap().contains(KEY));
        assert_eq!(std::fs::read_to_string(file.path()).unwrap(), KEY);
        #[cfg(unix)]
        assert_eq!(mode(file.path()), 0o600);
        // Settings already without the key: nothing to move; a kept hint is recomputed from the file.
        let mut again = remote(RemoteKey::Kept { hint: "abcd".into() });
        assert!(!file.migrate(&mut again).unwrap());
        assert_eq!(key_of(&again), &RemoteKey::Kept { hint: "wxyz".into() });
        // An old empty key is none.
        let mut empty: EngineSettings = serde_json::from_str(&old.replace(KEY, "")).unwrap();
        assert!(!file.migrate(&mut empty).unwrap());
    }

    #[cfg(unix)]
    #[test]
    fn a_failed_move_keeps_the_key_for_this_run_and_a_readable_file_is_narrowed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // A data folder the key cannot be written to (a file where the folder should be).
        let blocked = dir.path().join("not-a-folder");
        std::fs::write(&blocked, b"").unwrap();
        let file = KeyFile { path: blocked.join(KEY_FILE), key: Mutex::new(None) };
        let mut s = remote(RemoteKey::New { key: KEY.into() });
        assert!(matches!(file.migrate(&mut s), Err(KeyFileError::Write { .. })));
        assert_eq!((key_of(&s), file.key().as_deref()), (&RemoteKey::Kept { hint: "wxyz".into() }, Some(KEY)));
        // A key file left readable by others is narrowed when read.
        let path = dir.path().join(KEY_FILE);
        std::fs::write(&path, format!("{KEY}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(KeyFile::open(dir.path()).unwrap().key().as_deref(), Some(KEY));
        assert_eq!(mode(&path), 0o600);
    }
}
