//! Downloading one GGUF file of a Hub repository into the models folder: to `FILE.part` beside where it
//! goes, resumed by an HTTP range after a cut (here, up to [`ATTEMPTS`] times, and by the next download of
//! the same file after a crash), checked against the file's size and the sha256 the Hub lists, then renamed
//! into place. A file that fails its check is deleted, never left where a model is looked for.
//!
//! It never writes outside `models_dir/owner/name/`: the repository id and file path are checked first
//! ([`super::check_repo`], [`super::check_file`]). A disk without room for what is left is refused before
//! the first byte, and a write that finds the disk full stops with the same error (the part is kept, to
//! resume once there is room).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{network, HubClient, HubError, HubFile};

/// Requests per download: the first and the resumes after cuts.
pub const ATTEMPTS: u32 = 5;

/// How often progress is reported while bytes arrive.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// Why a download stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DownloadError {
    #[error(transparent)]
    Hub(#[from] HubError),
    #[error(
        "not enough disk space in {dir}: {file} needs {} more, {} is free",
        super::human_bytes(*need_bytes),
        super::human_bytes(*free_bytes)
    )]
    DiskFull { dir: PathBuf, file: String, need_bytes: u64, free_bytes: u64 },
    #[error("{file} is not the file the Hub lists: its sha256 is {found}, the Hub's is {expected}; it was deleted")]
    Checksum { file: String, expected: String, found: String },
    #[error("{file}: the Hub sent {found_bytes} bytes where it lists {expected_bytes}; the part was deleted")]
    WrongSize { file: String, expected_bytes: u64, found_bytes: u64 },
    #[error("{file}: the connection was cut {attempts} times (last at {done_bytes} of {total_bytes} bytes: {message}); the part is kept and the next download of it resumes there")]
    Interrupted { file: String, attempts: u32, done_bytes: u64, total_bytes: u64, message: String },
    #[error("the download of {file} was cancelled")]
    Cancelled { file: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where a download stands.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct Progress {
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub done_bytes: u64,
    #[cfg_attr(feature = "ts", ts(type = "number"))]
    pub total_bytes: u64,
    /// Smoothed over the last seconds; 0 until the first interval.
    pub rate_bytes_per_s: f64,
    /// Seconds left at that rate; None until there is a rate.
    pub eta_s: Option<f64>,
}

/// Where `file` of `repo` lies in `models_dir`: `models_dir/owner/name/file`.
pub fn destination(models_dir: &Path, repo: &str, file: &str) -> Result<PathBuf, HubError> {
    super::check_repo(repo)?;
    super::check_file(file)?;
    let mut p = models_dir.to_path_buf();
    p.extend(repo.split('/'));
    p.extend(file.split('/'));
    Ok(p)
}

/// The partial download of `dest`.
pub fn part_path(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

/// Downloads `file` of `repo` into `models_dir` (see the module comment) and returns its path. `progress` is
/// called as bytes arrive (and once at the end); `cancel` stops it, deleting the part. A part left by an
/// earlier run that turns out not to be this file's start (the file changed on the Hub since, or the part
/// is damaged) fails the checksum once: it is deleted and the file downloaded again from its first byte.
pub async fn download(
    client: &HubClient,
    repo: &str,
    file: &HubFile,
    models_dir: &Path,
    cancel: &AtomicBool,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<PathBuf, DownloadError> {
    let mut resumed = false;
    match download_once(client, repo, file, models_dir, cancel, progress, &mut resumed).await {
        Err(DownloadError::Checksum { .. }) if resumed => {
            tracing::warn!("{}: the part kept from before is not this file's start: downloading it again", file.path);
            download_once(client, repo, file, models_dir, cancel, progress, &mut resumed).await
        }
        r => r,
    }
}

/// One try of [`download`]; `resumed` says whether it started from a part already on disk.
async fn download_once(
    client: &HubClient,
    repo: &str,
    file: &HubFile,
    models_dir: &Path,
    cancel: &AtomicBool,
    progress: &mut (dyn FnMut(Progress) + Send),
    resumed: &mut bool,
) -> Result<PathBuf, DownloadError> {
    let dest = destination(models_dir, repo, &file.path)?;
    let url = client.resolve_url(repo, &file.path)?;
    let name = file.path.clone();
    let total = file.size_bytes;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DownloadError::Io { path, source }
    };
    if std::fs::metadata(&dest).is_ok_and(|m| m.is_file() && m.len() == total) {
        progress(Progress { done_bytes: total, total_bytes: total, ..Progress::default() });
        return Ok(dest);
    }
    let dir = dest.parent().expect("a destination has its repository's folder").to_path_buf();
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let part = part_path(&dest);
    let mut out = std::fs::OpenOptions::new().create(true).append(true).read(true).open(&part).map_err(io(&part))?;
    let mut done = out.metadata().map_err(io(&part))?.len();
    if done > total {
        out.set_len(0).map_err(io(&part))?;
        done = 0;
    }
    if let Some(free_bytes) = free_bytes(&dir) {
        if free_bytes < total - done {
            return Err(DownloadError::DiskFull { dir, file: name, need_bytes: total - done, free_bytes });
        }
    }
    let mut hasher = Sha256::new();
    *resumed = done > 0;
    if done > 0 {
        // Hashing a part of gigabytes takes seconds: not on the runtime's few threads.
        let (p, flag) = (part.clone(), Arc::new(AtomicBool::new(false)));
        let watch = flag.clone();
        let hashed = tokio::task::spawn_blocking(move || {
            let mut h = Sha256::new();
            hash_part(&p, done, &mut h, &watch).map(|()| h)
        });
        let mut hashed = std::pin::pin!(hashed);
        hasher = loop {
            tokio::select! {
                r = &mut hashed => break r.map_err(|e| DownloadError::Io { path: part.clone(), source: std::io::Error::other(e) })?.map_err(io(&part))?,
                _ = tokio::time::sleep(Duration::from_millis(100)) => flag.store(cancel.load(Ordering::Relaxed), Ordering::Relaxed),
            }
        };
        if cancel.load(Ordering::Relaxed) {
            drop(out);
            let _ = std::fs::remove_file(&part);
            return Err(DownloadError::Cancelled { file: name });
        }
    }
    let mut meter = Meter::new(done, total);
    let mut last_error = String::new();
    let mut attempt = 0;
    while done < total {
        if cancel.load(Ordering::Relaxed) {
            let _ = std::fs::remove_file(&part);
            return Err(DownloadError::Cancelled { file: name });
        }
        if attempt == ATTEMPTS {
            return Err(DownloadError::Interrupted {
                file: name,
                attempts: attempt,
                done_bytes: done,
                total_bytes: total,
                message: last_error,
            });
        }
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(250 << attempt.min(4))).await;
        }
        attempt += 1;
        let mut req = client.get(&url);
        if done > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={done}-"));
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                last_error = network(&url, e).to_string();
                continue;
            }
        };
        let status = resp.status().as_u16();
        if status == 408 || status == 429 || status >= 500 {
            // The Hub or its CDN is busy or failing for now: as a cut, tried again after a pause.
            last_error = format!("the Hub answered {status}");
            continue;
        }
        if status == 416 {
            // The range starts at or past the end: the part is no prefix of this file. Start again.
            restart(&mut out, &part, &mut hasher, &mut done)?;
            meter = Meter::new(0, total);
            continue;
        }
        let resp = client.check(resp, &name, Some(repo)).await?;
        if done > 0 && !(status == 206 && range_start(&resp) == Some(done)) {
            // A server that ignores ranges sends the whole file from its first byte.
            restart(&mut out, &part, &mut hasher, &mut done)?;
            meter = Meter::new(0, total);
            if status == 206 {
                continue;
            }
        }
        let mut resp = resp;
        loop {
            if cancel.load(Ordering::Relaxed) {
                drop(out);
                let _ = std::fs::remove_file(&part);
                return Err(DownloadError::Cancelled { file: name });
            }
            match resp.chunk().await {
                Ok(Some(bytes)) => {
                    if done + bytes.len() as u64 > total {
                        drop(out);
                        let _ = std::fs::remove_file(&part);
                        let found_bytes = done + bytes.len() as u64;
                        return Err(DownloadError::WrongSize { file: name, expected_bytes: total, found_bytes });
                    }
                    if let Err(e) = out.write_all(&bytes) {
                        return Err(write_error(e, &part, &dir, &name, total - done));
                    }
                    hasher.update(&bytes);
                    done += bytes.len() as u64;
                    if let Some(p) = meter.tick(done) {
                        progress(p);
                    }
                }
                Ok(None) => {
                    if done < total {
                        last_error = format!("the answer ended at {done} of {total} bytes");
                    }
                    break;
                }
                Err(e) => {
                    last_error = network(&url, e).to_string();
                    break;
                }
            }
        }
    }
    let synced = tokio::task::spawn_blocking(move || out.flush().and_then(|()| out.sync_all())).await;
    synced.map_err(std::io::Error::other).and_then(|r| r).map_err(io(&part))?;
    let found: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if let Some(expected) = &file.sha256 {
        if *expected != found {
            let _ = std::fs::remove_file(&part);
            return Err(DownloadError::Checksum { file: name, expected: expected.clone(), found });
        }
    }
    std::fs::rename(&part, &dest).map_err(io(&dest))?;
    progress(Progress { done_bytes: total, total_bytes: total, rate_bytes_per_s: meter.rate, eta_s: Some(0.0) });
    Ok(dest)
}

/// Empties the part and the hash: the download starts from the first byte.
fn restart(out: &mut std::fs::File, part: &Path, hasher: &mut Sha256, done: &mut u64) -> Result<(), DownloadError> {
    out.set_len(0).map_err(|source| DownloadError::Io { path: part.to_path_buf(), source })?;
    *hasher = Sha256::new();
    *done = 0;
    Ok(())
}

/// A write that failed: the disk is full (said as such), or another I/O error.
fn write_error(e: std::io::Error, part: &Path, dir: &Path, file: &str, need_bytes: u64) -> DownloadError {
    if e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(28) {
        let free_bytes = free_bytes(dir).unwrap_or(0);
        return DownloadError::DiskFull { dir: dir.to_path_buf(), file: file.to_owned(), need_bytes, free_bytes };
    }
    DownloadError::Io { path: part.to_path_buf(), source: e }
}

/// The first byte of a 206's `Content-Range: bytes START-END/TOTAL`.
fn range_start(resp: &reqwest::Response) -> Option<u64> {
    let v = resp.headers().get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?;
    v.strip_prefix("bytes ")?.split('-').next()?.trim().parse().ok()
}

/// Hashes the first `len` bytes of the part already on disk (a resumed download's checksum covers them).
fn hash_part(part: &Path, len: u64, hasher: &mut Sha256, cancel: &AtomicBool) -> std::io::Result<()> {
    let mut f = std::fs::File::open(part)?.take(len);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Ok(());
        }
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
    }
}

/// Bytes free to this user on the file system holding `dir` (None where that cannot be asked).
pub fn free_bytes(dir: &Path) -> Option<u64> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a NUL-terminated path and `s` a statvfs the call fills.
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return None;
        }
        Some(s.f_bavail as u64 * s.f_frsize as u64)
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        None
    }
}

/// The rate and time left, smoothed over intervals of [`PROGRESS_EVERY`].
struct Meter {
    total: u64,
    at: Instant,
    at_bytes: u64,
    rate: f64,
}

impl Meter {
    fn new(done: u64, total: u64) -> Meter {
        Meter { total, at: Instant::now(), at_bytes: done, rate: 0.0 }
    }

    /// A progress report when an interval has passed.
    fn tick(&mut self, done: u64) -> Option<Progress> {
        let dt = self.at.elapsed();
        if dt < PROGRESS_EVERY {
            return None;
        }
        let now = done.saturating_sub(self.at_bytes) as f64 / dt.as_secs_f64();
        self.rate = if self.rate == 0.0 { now } else { 0.7 * self.rate + 0.3 * now };
        self.at = Instant::now();
        self.at_bytes = done;
        let eta_s = (self.rate > 0.0).then(|| self.total.saturating_sub(done) as f64 / self.rate);
        Some(Progress { done_bytes: done, total_bytes: self.total, rate_bytes_per_s: self.rate, eta_s })
    }
}
