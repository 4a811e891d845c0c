//! The GGUF files already on this machine: in the models folder (where downloads go: `owner/name/file`,
//! or any file a person put there) and in the Hugging Face cache (`models--owner--name/snapshots/REV/..`,
//! which other tools fill). Listing reads directory entries and file sizes only, never a file's contents.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// How deep the models folder is searched (owner/name/sub/file).
const MAX_DEPTH: usize = 5;
/// A listing stops after this many files (a folder pointed at the wrong place must not hang the app).
const MAX_FILES: usize = 2000;

/// Where a local model was found.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub enum Source {
    ModelsFolder,
    HuggingFaceCache,
}

/// A GGUF file on this machine.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct LocalModel {
    pub path: PathBuf,
    /// The repository it came from, where its place says (`owner/name`).
    pub repo: Option<String>,
    /// Its path in that repository, or its file name.
    pub file: String,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub size_bytes: u64,
    pub source: Source,
}

/// The models folder when none is set: `STRATA_MODELS_DIR`, else the user's data folder's `strata/models`
/// (`~/.local/share/strata/models` on Linux).
pub fn default_models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("STRATA_MODELS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    dirs::data_local_dir().unwrap_or_else(|| PathBuf::from(".")).join("strata").join("models")
}

/// `HF_HOME`, else `~/.cache/huggingface` (`XDG_CACHE_HOME` respected).
pub fn hf_home() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HF_HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .or_else(|| dirs::home_dir().map(|h| h.join(".cache")))?;
    Some(cache.join("huggingface"))
}

/// The Hugging Face hub cache: `HF_HUB_CACHE`, else `HF_HOME/hub`.
pub fn hf_hub_cache() -> Option<PathBuf> {
    std::env::var_os("HF_HUB_CACHE")
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .or_else(|| Some(hf_home()?.join("hub")))
}

/// The GGUFs in `models_dir` and in the Hugging Face cache (`hf_cache`), each file once, in path order
/// within each source. Missing folders give nothing.
pub fn scan(models_dir: &Path, hf_cache: Option<&Path>) -> Vec<LocalModel> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut files = Vec::new();
    walk(models_dir, 0, &mut files);
    files.sort();
    for path in files {
        let Ok(rel) = path.strip_prefix(models_dir) else { continue };
        let parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        let (repo, file) = match parts.as_slice() {
            [owner, name, rest @ ..] if !rest.is_empty() => (Some(format!("{owner}/{name}")), rest.join("/")),
            _ => (None, parts.join("/")),
        };
        push(&mut out, &mut seen, path, repo, file, Source::ModelsFolder);
    }
    let Some(cache) = hf_cache else { return out };
    let Ok(entries) = std::fs::read_dir(cache) else { return out };
    let mut repos: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let repo = name.strip_prefix("models--")?.replacen("--", "/", 1);
            Some((repo, e.path().join("snapshots")))
        })
        .collect();
    repos.sort();
    for (repo, snapshots) in repos {
        let Ok(revs) = std::fs::read_dir(&snapshots) else { continue };
        for rev in revs.flatten() {
            let mut files = Vec::new();
            walk(&rev.path(), 0, &mut files);
            files.sort();
            for path in files {
                let Ok(rel) = path.strip_prefix(rev.path()) else { continue };
                let file = rel.to_string_lossy().replace('\\', "/");
                push(&mut out, &mut seen, path, Some(repo.clone()), file, Source::HuggingFaceCache);
            }
        }
    }
    out
}

fn push(
    out: &mut Vec<LocalModel>,
    seen: &mut std::collections::HashSet<PathBuf>,
    path: PathBuf,
    repo: Option<String>,
    file: String,
    source: Source,
) {
    // The cache's snapshot entries are links to its blobs: a file is itself once, whatever names it.
    let Ok(meta) = std::fs::metadata(&path) else { return };
    let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
    if meta.is_file() && out.len() < MAX_FILES && seen.insert(key) {
        out.push(LocalModel { path, repo, file, size_bytes: meta.len(), source });
    }
}

/// The `.gguf` files under `dir` (not `.part` downloads), at most [`MAX_DEPTH`] deep.
fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > MAX_DEPTH || out.len() >= MAX_FILES {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let path = e.path();
        let hidden = e.file_name().to_string_lossy().starts_with('.');
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() && !hidden => walk(&path, depth + 1, out),
            Ok(m) if m.is_file() && path.extension().is_some_and(|x| x.eq_ignore_ascii_case("gguf")) => out.push(path),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_models_folder_and_the_hugging_face_cache_are_listed_once_each() {
        let root = tempfile::tempdir().unwrap();
        let models = root.path().join("models");
        let cache = root.path().join("hub");
        let write = |p: &Path, n: usize| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, vec![0u8; n]).unwrap();
        };
        write(&models.join("bartowski/Qwen-GGUF/Qwen-Q4_K_M.gguf"), 10);
        write(&models.join("bartowski/Qwen-GGUF/Qwen-Q8_0.gguf.part"), 5);
        write(&models.join("loose.GGUF"), 3);
        write(&models.join("notes.txt"), 3);
        let blob = cache.join("models--unsloth--gemma-3-GGUF/blobs/abc");
        write(&blob, 7);
        let snap = cache.join("models--unsloth--gemma-3-GGUF/snapshots/0123/sub/gemma-Q4_0.gguf");
        std::fs::create_dir_all(snap.parent().unwrap()).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(&blob, &snap).unwrap();
        #[cfg(not(unix))]
        write(&snap, 7);
        // The same blob named by a second snapshot is one file.
        let snap2 = cache.join("models--unsloth--gemma-3-GGUF/snapshots/4567/sub/gemma-Q4_0.gguf");
        std::fs::create_dir_all(snap2.parent().unwrap()).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(&blob, &snap2).unwrap();
        let found = scan(&models, Some(&cache));
        let brief: Vec<(Option<&str>, &str, u64, Source)> =
            found.iter().map(|m| (m.repo.as_deref(), m.file.as_str(), m.size_bytes, m.source)).collect();
        assert_eq!(
            brief,
            vec![
                (Some("bartowski/Qwen-GGUF"), "Qwen-Q4_K_M.gguf", 10, Source::ModelsFolder),
                (None, "loose.GGUF", 3, Source::ModelsFolder),
                (Some("unsloth/gemma-3-GGUF"), "sub/gemma-Q4_0.gguf", 7, Source::HuggingFaceCache),
            ]
        );
        assert!(scan(&root.path().join("absent"), None).is_empty());
    }
}
