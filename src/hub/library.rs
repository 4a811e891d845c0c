//! The model library behind the app's Models view and the server's `/strata/library/*`: search the Hub,
//! list a repository's files with what is already here, plan a file on this machine from its header before
//! it is downloaded, run several downloads at once (each a task with its progress, cancel and outcome),
//! list and delete the GGUFs here, and a short list of good defaults for this machine's memory.
//!
//! It writes only inside its models folder: downloads go to `models_dir/owner/name/`, and a delete is
//! refused for any path that is not a `.gguf` under it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::download::{self, DownloadError, Progress};
use super::local::{self, LocalModel};
use super::{HubClient, HubError, HubFile, HubModel};
use crate::plan::settings::{EngineSettings, Speculative};
use crate::plan::Plan;
use crate::sync::LockUnpoisoned;

/// Finished downloads kept in the list (the oldest finished ones go first).
const KEEP_FINISHED: usize = 20;
/// Downloads running at once; more are refused until one ends.
pub const MAX_RUNNING: usize = 4;

/// Why a library request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LibraryError {
    #[error(transparent)]
    Hub(#[from] HubError),
    #[error("{file} of {repo} is not in the repository's GGUF files")]
    NoSuchFile { repo: String, file: String },
    #[error("{0} is one part of a split model; Strata reads single-file GGUFs")]
    SplitPart(String),
    #[error("{MAX_RUNNING} downloads are running; wait for one to end or cancel one")]
    TooMany,
    #[error("{file} of {repo} is already downloading")]
    AlreadyRunning { repo: String, file: String },
    #[error("no download {0}")]
    NoSuchDownload(u64),
    #[error("{0} is not a GGUF file in the models folder; only those are deleted")]
    NotDeletable(String),
    #[error("cannot delete {path}: {message}")]
    Delete { path: String, message: String },
    #[error("{0}")]
    Plan(String),
    #[error("{0} is the model being served; it is not deleted")]
    InUse(String),
    #[error("the model library failed: {0}")]
    Internal(String),
}

/// Where a download is.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub enum DownloadState {
    Running,
    Done,
    Failed,
    Cancelled,
}

/// A download, as the Models view shows it.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct DownloadView {
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub id: u64,
    pub repo: String,
    pub file: String,
    pub state: DownloadState,
    pub progress: Progress,
    /// Where the file is, once done.
    pub path: Option<PathBuf>,
    /// Why it failed.
    pub error: Option<String>,
}

/// A repository's GGUF file and whether it is here.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct FileView {
    #[serde(flatten)]
    #[cfg_attr(feature = "ts", ts(flatten))]
    pub file: HubFile,
    pub local_path: Option<PathBuf>,
}

/// Whether a file fits this machine, in a word and a sentence.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub enum Fit {
    Fits,
    /// Fits with some layers on the CPU (a machine with GPUs).
    FitsPartly,
    DoesNotFit,
}

/// A file's plan on this machine at `context` positions.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct FitView {
    pub fit: Fit,
    /// "fits", "fits with 12 of 32 layers on the CPU", "does not fit: ...".
    pub summary: String,
    pub context: u32,
    pub layers: u32,
    pub cpu_layers: u32,
    pub plan: Plan,
}

/// A good default for a machine of some memory.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Pick {
    /// "chat", "code" or "small".
    pub role: String,
    pub repo: String,
    /// The quantization to take (`pull REPO:QUANT`).
    pub quant: String,
    pub about: String,
    /// About what it needs at a 4K context.
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub need_bytes: u64,
}

/// (role, repo, about, GiB needed at 4K), each role's entries from the smallest up.
const PICKS: &[(&str, &str, &str, f64)] = &[
    ("small", "unsloth/gemma-3-270m-it-GGUF", "Gemma 3 270M: tiny and quick, for simple tasks", 0.4),
    ("small", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "Qwen2.5 0.5B Instruct", 0.7),
    ("small", "bartowski/SmolLM2-1.7B-Instruct-GGUF", "SmolLM2 1.7B Instruct", 1.4),
    ("chat", "bartowski/Llama-3.2-3B-Instruct-GGUF", "Llama 3.2 3B Instruct", 2.6),
    ("chat", "unsloth/Qwen3-8B-GGUF", "Qwen3 8B: thinks before it answers", 5.6),
    ("chat", "unsloth/gemma-3-12b-it-GGUF", "Gemma 3 12B", 8.6),
    ("chat", "unsloth/gpt-oss-20b-GGUF", "gpt-oss 20B (mixture of experts)", 13.5),
    ("chat", "unsloth/Qwen3-30B-A3B-GGUF", "Qwen3 30B-A3B (mixture of experts)", 19.5),
    ("code", "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "Qwen2.5 Coder 1.5B Instruct", 1.3),
    ("code", "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF", "Qwen2.5 Coder 7B Instruct", 5.2),
    ("code", "unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF", "Qwen3 Coder 30B-A3B (mixture of experts)", 19.5),
];

/// For each role, the largest pick that needs at most 70% of `memory_bytes` (the host's and the GPUs'
/// memory together), else the role's smallest.
pub fn picks(memory_bytes: u64) -> Vec<Pick> {
    let budget = memory_bytes as f64 * 0.7;
    let mut out = Vec::new();
    for role in ["chat", "code", "small"] {
        let of_role: Vec<_> = PICKS.iter().filter(|p| p.0 == role).collect();
        let best = of_role.iter().rev().find(|p| p.3 * (1u64 << 30) as f64 <= budget).or(of_role.first());
        if let Some(&&(role, repo, about, gib)) = best {
            out.push(Pick {
                role: role.into(),
                repo: repo.into(),
                quant: "Q4_K_M".into(),
                about: about.into(),
                need_bytes: (gib * (1u64 << 30) as f64) as u64,
            });
        }
    }
    out
}

struct Entry {
    view: DownloadView,
    cancel: Arc<AtomicBool>,
}

/// The library of one models folder, with the Hub it downloads from.
pub struct Library {
    pub client: HubClient,
    pub models_dir: PathBuf,
    pub hf_cache: Option<PathBuf>,
    downloads: Mutex<(u64, Vec<Entry>)>,
    /// Fit plans under way at once.
    fits: tokio::sync::Semaphore,
}

impl Library {
    pub fn new(client: HubClient, models_dir: PathBuf, hf_cache: Option<PathBuf>) -> Arc<Library> {
        let fits = tokio::sync::Semaphore::new(2);
        Arc::new(Library { client, models_dir, hf_cache, downloads: Mutex::new((0, Vec::new())), fits })
    }

    /// The library of the environment's Hub (`HF_ENDPOINT`, `HF_TOKEN`), this folder and the HF cache.
    pub fn from_env(models_dir: PathBuf) -> Arc<Library> {
        Library::new(HubClient::from_env(), models_dir, local::hf_hub_cache())
    }

    pub async fn search(&self, text: &str) -> Result<Vec<HubModel>, LibraryError> {
        Ok(self.client.search(text, 30).await?)
    }

    /// `repo`'s GGUF files, each with its path here when it is in the models folder or the HF cache.
    pub async fn files(&self, repo: &str) -> Result<Vec<FileView>, LibraryError> {
        let files = self.client.files(repo).await?;
        let (dir, cache) = (self.models_dir.clone(), self.hf_cache.clone());
        let here = tokio::task::spawn_blocking(move || local::scan(&dir, cache.as_deref()))
            .await
            .map_err(|e| LibraryError::Internal(e.to_string()))?;
        Ok(files
            .into_iter()
            .map(|file| {
                let local_path = here
                    .iter()
                    .find(|m| m.repo.as_deref() == Some(repo) && m.file == file.path && m.size_bytes == file.size_bytes)
                    .map(|m| m.path.clone());
                FileView { file, local_path }
            })
            .collect())
    }

    /// `file` as `repo`'s listing has it (its size and sha256), refused when it is not listed or is one
    /// part of a split model.
    async fn listed(&self, repo: &str, file: &str) -> Result<HubFile, LibraryError> {
        let f = self
            .client
            .files(repo)
            .await?
            .into_iter()
            .find(|f| f.path == file)
            .ok_or_else(|| LibraryError::NoSuchFile { repo: repo.into(), file: file.into() })?;
        match f.split {
            Some(_) => Err(LibraryError::SplitPart(file.into())),
            None => Ok(f),
        }
    }

    /// `file` of `repo` planned under `settings` (this machine's devices) at `context` positions, from its
    /// header alone. The settings' split points and draft model are the served model's: not used here.
    pub async fn fit(
        &self,
        repo: &str,
        file: &str,
        settings: &EngineSettings,
        context: Option<u32>,
    ) -> Result<FitView, LibraryError> {
        let f = self.listed(repo, file).await?;
        // A few headers are read at once; more wait (each may take megabytes and a plan).
        let _turn = self.fits.acquire().await.map_err(|e| LibraryError::Internal(e.to_string()))?;
        let image = Arc::new(self.client.header(repo, file, f.size_bytes).await?);
        let train = crate::model::config::ModelConfig::from_gguf(&image)
            .map_err(|e| LibraryError::Plan(format!("{file}: {e}")))?
            .n_ctx_train;
        let context = context.unwrap_or(4096).min(train as u32).max(1);
        let mut s = settings.clone();
        s.model_path = None;
        s.layer_split = String::new();
        if matches!(s.speculative, Speculative::Draft { .. }) {
            s.speculative = Speculative::Off;
        }
        s.max_context = Some(context);
        let plan = tokio::task::spawn_blocking(move || s.plan(&image))
            .await
            .map_err(|e| LibraryError::Internal(e.to_string()))?
            .map_err(|e| LibraryError::Plan(format!("{file}: {}", e.message)))?;
        Ok(fit_view(plan, context))
    }

    /// Starts downloading `file` of `repo` (checked against the repository's listing) and returns its id.
    pub async fn start(self: &Arc<Self>, repo: &str, file: &str) -> Result<u64, LibraryError> {
        let f = self.listed(repo, file).await?;
        let cancel = Arc::new(AtomicBool::new(false));
        let id = {
            let mut d = self.downloads.lock_unpoisoned();
            let running = d.1.iter().filter(|e| e.view.state == DownloadState::Running).collect::<Vec<_>>();
            // Case folded: on macOS and Windows `Owner/X` and `owner/x` are one folder, one part file.
            let same = |e: &&Entry| e.view.repo.eq_ignore_ascii_case(repo) && e.view.file.eq_ignore_ascii_case(file);
            if running.iter().any(same) {
                return Err(LibraryError::AlreadyRunning { repo: repo.into(), file: file.into() });
            }
            if running.len() >= MAX_RUNNING {
                return Err(LibraryError::TooMany);
            }
            d.0 += 1;
            let id = d.0;
            let progress = Progress { total_bytes: f.size_bytes, ..Progress::default() };
            let view = DownloadView {
                id,
                repo: repo.into(),
                file: file.into(),
                state: DownloadState::Running,
                progress,
                path: None,
                error: None,
            };
            d.1.push(Entry { view, cancel: cancel.clone() });
            forget_finished(&mut d.1);
            id
        };
        let lib = self.clone();
        let repo = repo.to_owned();
        tokio::spawn(async move {
            let me = lib.clone();
            // Run apart, so that even a panic ends the entry (as failed) instead of leaving it running.
            let task = tokio::spawn(async move {
                let lib = me.clone();
                let mut report = move |p: Progress| me.update(id, |v| v.progress = p);
                download::download(&lib.client, &repo, &f, &lib.models_dir, &cancel, &mut report).await
            });
            let r = task.await.unwrap_or_else(|e| {
                Err(DownloadError::Io { path: lib.models_dir.clone(), source: std::io::Error::other(e.to_string()) })
            });
            lib.update(id, |v| match r {
                Ok(path) => {
                    v.state = DownloadState::Done;
                    v.path = Some(path);
                }
                Err(DownloadError::Cancelled { .. }) => v.state = DownloadState::Cancelled,
                Err(e) => {
                    tracing::warn!("model library: {e}");
                    v.state = DownloadState::Failed;
                    v.error = Some(e.to_string());
                }
            });
        });
        Ok(id)
    }

    fn update(&self, id: u64, f: impl FnOnce(&mut DownloadView)) {
        if let Some(e) = self.downloads.lock_unpoisoned().1.iter_mut().find(|e| e.view.id == id) {
            f(&mut e.view);
        }
    }

    /// The downloads, running and finished, oldest first.
    pub fn downloads(&self) -> Vec<DownloadView> {
        self.downloads.lock_unpoisoned().1.iter().map(|e| e.view.clone()).collect()
    }

    /// Stops a running download (its part is deleted), or forgets a finished one.
    pub fn cancel(&self, id: u64) -> Result<(), LibraryError> {
        let mut d = self.downloads.lock_unpoisoned();
        let at = d.1.iter().position(|e| e.view.id == id).ok_or(LibraryError::NoSuchDownload(id))?;
        if d.1[at].view.state == DownloadState::Running {
            d.1[at].cancel.store(true, Ordering::Relaxed);
        } else {
            d.1.remove(at);
        }
        Ok(())
    }

    /// The GGUFs here: the models folder's, then the HF cache's.
    pub fn local(&self) -> Vec<LocalModel> {
        local::scan(&self.models_dir, self.hf_cache.as_deref())
    }

    /// Deletes a GGUF of the models folder (never another file, never one elsewhere, never a link, never
    /// `in_use`: the model being served), and its folder when that is left empty.
    pub fn delete(&self, path: &Path, in_use: Option<&Path>) -> Result<(), LibraryError> {
        let refuse = || LibraryError::NotDeletable(path.display().to_string());
        let root = std::fs::canonicalize(&self.models_dir).map_err(|_| refuse())?;
        if !std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file()) {
            return Err(refuse());
        }
        let file = std::fs::canonicalize(path).map_err(|_| refuse())?;
        if in_use.and_then(|p| std::fs::canonicalize(p).ok()).is_some_and(|p| p == file) {
            return Err(LibraryError::InUse(path.display().to_string()));
        }
        let is_gguf = file.extension().is_some_and(|x| x.eq_ignore_ascii_case("gguf"));
        if !is_gguf || !file.starts_with(&root) || !std::fs::metadata(&file).is_ok_and(|m| m.is_file()) {
            return Err(refuse());
        }
        std::fs::remove_file(&file)
            .map_err(|e| LibraryError::Delete { path: file.display().to_string(), message: e.to_string() })?;
        // Empty owner/name folders go too; the models folder itself stays.
        let mut dir = file.parent();
        while let Some(d) = dir.filter(|d| *d != root && d.starts_with(&root)) {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
        Ok(())
    }
}

fn forget_finished(entries: &mut Vec<Entry>) {
    while entries.iter().filter(|e| e.view.state != DownloadState::Running).count() > KEEP_FINISHED {
        let Some(at) = entries.iter().position(|e| e.view.state != DownloadState::Running) else { break };
        entries.remove(at);
    }
}

/// The verdict of a plan: layers on a GPU-less host are "fits"; on a machine with GPUs, layers on the host
/// are said ("fits with N of M layers on the CPU").
fn fit_view(plan: Plan, context: u32) -> FitView {
    let layers: usize = plan.rows.iter().map(|r| r.layers.1 - r.layers.0).sum();
    let has_gpu = plan.rows.iter().any(|r| !r.host);
    let cpu_layers: usize = plan.rows.iter().filter(|r| r.host).map(|r| r.layers.1 - r.layers.0).sum();
    let (fit, summary) = if !plan.fits {
        (Fit::DoesNotFit, format!("does not fit: {}", plan.problem.as_deref().unwrap_or("not enough memory")))
    } else if has_gpu && cpu_layers > 0 {
        (Fit::FitsPartly, format!("fits with {cpu_layers} of {layers} layers on the CPU"))
    } else {
        (Fit::Fits, "fits".to_owned())
    };
    FitView { fit, summary, context, layers: layers as u32, cpu_layers: cpu_layers as u32, plan }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_gguf_of_the_models_folder_that_is_not_in_use_is_deleted() {
        let root = tempfile::tempdir().unwrap();
        let models = root.path().join("models");
        std::fs::create_dir_all(models.join("o/n")).unwrap();
        let a = models.join("o/n/a.gguf");
        std::fs::write(&a, b"x").unwrap();
        std::fs::write(models.join("notes.txt"), b"x").unwrap();
        let lib = Library::new(HubClient::new("http://127.0.0.1:9", None), models.clone(), None);
        #[cfg(unix)]
        {
            let link = models.join("link.gguf");
            std::os::unix::fs::symlink(&a, &link).unwrap();
            assert!(matches!(lib.delete(&link, None), Err(LibraryError::NotDeletable(_))));
            std::fs::remove_file(&link).unwrap();
        }
        assert!(matches!(lib.delete(&models.join("notes.txt"), None), Err(LibraryError::NotDeletable(_))));
        assert!(matches!(lib.delete(&models.join("o/n/../n/absent.gguf"), None), Err(LibraryError::NotDeletable(_))));
        assert!(matches!(lib.delete(&a, Some(&a)), Err(LibraryError::InUse(_))));
        assert!(a.exists());
        lib.delete(&models.join("o/./n/a.gguf"), None).expect("deleted");
        assert!(
            !a.exists() && !models.join("o").exists() && models.exists(),
            "empty folders go, the models folder stays"
        );
    }

    #[test]
    fn picks_grow_with_memory_and_every_role_has_one() {
        let small = picks(768 << 20);
        assert_eq!(small.iter().map(|p| p.role.as_str()).collect::<Vec<_>>(), ["chat", "code", "small"]);
        assert_eq!(small[0].repo, "bartowski/Llama-3.2-3B-Instruct-GGUF", "the smallest chat model when none fits");
        assert_eq!(small[2].repo, "unsloth/gemma-3-270m-it-GGUF");
        let big = picks(64 << 30);
        assert_eq!(big[0].repo, "unsloth/Qwen3-30B-A3B-GGUF");
        assert_eq!(big[1].repo, "unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF");
        assert_eq!(big[2].repo, "bartowski/SmolLM2-1.7B-Instruct-GGUF");
        let mid = picks(16 << 30);
        assert_eq!(mid[0].repo, "unsloth/gemma-3-12b-it-GGUF");
        assert!(mid.iter().all(|p| p.need_bytes as f64 <= 0.7 * (16u64 << 30) as f64));
    }
}
