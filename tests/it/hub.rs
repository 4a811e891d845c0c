//! The model library against a local Hub (`common::hub`): search, a repository's files, a file planned from
//! its header before it is downloaded, and downloads that resume after a cut, refuse a file that is not the
//! one listed, need a token for a gated repository (and keep it from the CDN), refuse a disk without room,
//! and stop on cancel; `strata pull` on the command line.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use strata::hub::download::{self, DownloadError, Progress};
use strata::hub::{HubClient, HubError, HubFile};
use strata::model::synthetic::SyntheticSpec;

use crate::common::hub::{sha256_hex, MockFile, MockHub, MockRepo, GOOD_TOKEN};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn model_bytes() -> Vec<u8> {
    SyntheticSpec::default().to_gguf()
}

/// Bytes that differ at every offset mod 251 (a shifted resume would not hash the same).
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

fn hub() -> MockHub {
    let model = model_bytes();
    let mut cut = MockFile::new("Tiny-Q8_0.gguf", pattern(3 << 20));
    cut.cut_at = Some(1 << 20);
    let mut corrupt = MockFile::new("Tiny-Q6_K.gguf", pattern(300 << 10));
    corrupt.listed_sha256 = sha256_hex(b"something else");
    let mut slow = MockFile::new("Tiny-F16.gguf", pattern(4 << 20));
    slow.slow = true;
    MockHub::start(vec![
        MockRepo {
            id: "strata-test/Tiny-GGUF".into(),
            gated: false,
            downloads: 500,
            files: vec![
                MockFile::new("Tiny-Q4_K_M.gguf", model.clone()),
                cut,
                corrupt,
                slow,
                MockFile::new("Big-Q8_0-00001-of-00002.gguf", pattern(10)),
                MockFile::new("Big-Q8_0-00002-of-00002.gguf", pattern(10)),
            ],
        },
        MockRepo {
            id: "strata-test/Gated-GGUF".into(),
            gated: true,
            downloads: 90,
            files: vec![MockFile::new("Gated-Q4_0.gguf", model)],
        },
        MockRepo { id: "other/Unrelated-GGUF".into(), gated: false, downloads: 10_000, files: vec![] },
    ])
}

fn file_of(files: &[HubFile], path: &str) -> HubFile {
    files.iter().find(|f| f.path == path).cloned().unwrap_or_else(|| panic!("{path} is listed"))
}

async fn get(
    client: &HubClient,
    repo: &str,
    f: &HubFile,
    dir: &Path,
) -> (Result<std::path::PathBuf, DownloadError>, Vec<Progress>) {
    let mut seen = Vec::new();
    let cancel = AtomicBool::new(false);
    let r = download::download(client, repo, f, dir, &cancel, &mut |p| seen.push(p)).await;
    (r, seen)
}

#[test]
fn search_lists_and_a_repository_lists_its_gguf_files_over_pages() {
    let hub = hub();
    let client = HubClient::new(&hub.url, None);
    let rt = rt();
    let found = rt.block_on(client.search("gguf", 10)).expect("search");
    let ids: Vec<&str> = found.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["other/Unrelated-GGUF", "strata-test/Tiny-GGUF", "strata-test/Gated-GGUF"]);
    assert!(found[2].gated && !found[1].gated);
    assert_eq!(found[1].downloads, 500);
    assert_eq!(rt.block_on(client.search("tiny", 10)).unwrap().len(), 1);
    let files = rt.block_on(client.files("strata-test/Tiny-GGUF")).expect("files");
    // The README and the folder are not listed; the six files come over four pages.
    assert_eq!(files.len(), 6, "{files:?}");
    assert_eq!(hub.seen().iter().filter(|s| s.path.ends_with("/tree")).count(), 4);
    let m = file_of(&files, "Tiny-Q4_K_M.gguf");
    assert_eq!(m.size_bytes, model_bytes().len() as u64);
    assert_eq!(m.sha256.as_deref(), Some(sha256_hex(&model_bytes()).as_str()));
    assert_eq!(file_of(&files, "Big-Q8_0-00002-of-00002.gguf").split, Some((2, 2)));
    match rt.block_on(client.files("strata-test/Absent")) {
        Err(HubError::NotFound { what, .. }) => assert_eq!(what, "strata-test/Absent"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(rt.block_on(client.files("../etc")), Err(HubError::BadRepo(_))));
}

#[test]
fn a_file_is_planned_from_its_first_bytes_before_it_is_downloaded() {
    let hub = hub();
    let client = HubClient::new(&hub.url, None);
    let rt = rt();
    let files = rt.block_on(client.files("strata-test/Tiny-GGUF")).unwrap();
    let m = file_of(&files, "Tiny-Q4_K_M.gguf");
    let image = rt.block_on(client.header("strata-test/Tiny-GGUF", &m.path, m.size_bytes)).expect("header");
    assert!(image.is_header_image());
    let whole = strata::gguf::GgufFile::from_bytes(model_bytes()).unwrap();
    assert_eq!(image.metadata, whole.metadata);
    // One ranged read of the first bytes, not the file.
    let reads: Vec<_> = hub.seen().into_iter().filter(|s| s.path.starts_with("/cdn/")).collect();
    assert_eq!(reads.len(), 1);
    assert!(reads[0].range.as_deref().is_some_and(|r| r.starts_with("bytes=0-")), "{reads:?}");
    let opts = strata::model::LoadOptions { max_context: Some(256), ..Default::default() };
    let plan = strata::plan::plan(&Arc::new(image), &opts, None).expect("plan");
    assert!(plan.fits && plan.rows[0].weights_bytes > 0);
    // A file that is no GGUF says so.
    let bad = file_of(&files, "Tiny-Q8_0.gguf");
    match rt.block_on(client.header("strata-test/Tiny-GGUF", &bad.path, bad.size_bytes)) {
        Err(HubError::BadHeader { file, message }) => {
            assert_eq!(file, "Tiny-Q8_0.gguf");
            assert!(message.contains("GGUF"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_cut_download_resumes_by_range_and_is_checked() {
    let hub = hub();
    let client = HubClient::new(&hub.url, None);
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let files = rt.block_on(client.files("strata-test/Tiny-GGUF")).unwrap();
    let f = file_of(&files, "Tiny-Q8_0.gguf");
    let (r, progress) = rt.block_on(get(&client, "strata-test/Tiny-GGUF", &f, dir.path()));
    let path = r.expect("the download ends after the cut");
    assert_eq!(path, dir.path().join("strata-test/Tiny-GGUF/Tiny-Q8_0.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), pattern(3 << 20));
    assert!(!download::part_path(&path).exists());
    let cdn: Vec<_> = hub.seen().into_iter().filter(|s| s.path.starts_with("/cdn/")).collect();
    assert_eq!(cdn.len(), 2, "{cdn:?}");
    assert_eq!(cdn[0].range, None);
    // The second request resumes after the bytes that arrived before the cut (the server had sent 1 MiB).
    let resumed_at: u64 = cdn[1]
        .range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
        .expect("a range");
    assert!(resumed_at > 0 && resumed_at <= 1 << 20, "{cdn:?}");
    let last = progress.last().expect("progress");
    assert_eq!((last.done_bytes, last.total_bytes), (3 << 20, 3 << 20));
    assert!(progress.windows(2).all(|w| w[0].done_bytes <= w[1].done_bytes));
    // Asked again, the file is there: no request.
    let before = hub.seen().len();
    let (r, _) = rt.block_on(get(&client, "strata-test/Tiny-GGUF", &f, dir.path()));
    assert_eq!(r.unwrap(), path);
    assert_eq!(hub.seen().len(), before);
}

#[test]
fn a_part_left_by_a_crash_is_resumed_and_a_wrong_one_is_not_kept() {
    let hub = hub();
    let client = HubClient::new(&hub.url, None);
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let files = rt.block_on(client.files("strata-test/Tiny-GGUF")).unwrap();
    let f = file_of(&files, "Tiny-Q4_K_M.gguf");
    let dest = download::destination(dir.path(), "strata-test/Tiny-GGUF", &f.path).unwrap();
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    let model = model_bytes();
    std::fs::write(download::part_path(&dest), &model[..1000]).unwrap();
    let (r, _) = rt.block_on(get(&client, "strata-test/Tiny-GGUF", &f, dir.path()));
    assert_eq!(std::fs::read(r.expect("resumed")).unwrap(), model);
    let last = hub.seen().into_iter().rfind(|s| s.path.starts_with("/cdn/")).unwrap();
    assert_eq!(last.range.as_deref(), Some("bytes=1000-"));
    // A part whose bytes are not the file's start fails the checksum: it is thrown away and the file comes
    // again from its first byte (a request with no range), not resumed forever.
    std::fs::remove_file(&dest).unwrap();
    std::fs::write(download::part_path(&dest), vec![7u8; 1000]).unwrap();
    let before = hub.seen().len();
    let (r, _) = rt.block_on(get(&client, "strata-test/Tiny-GGUF", &f, dir.path()));
    assert_eq!(std::fs::read(r.expect("downloaded again")).unwrap(), model);
    let cdn: Vec<_> = hub.seen()[before..].iter().filter(|s| s.path.starts_with("/cdn/")).cloned().collect();
    assert_eq!(cdn.iter().map(|s| s.range.as_deref()).collect::<Vec<_>>(), [Some("bytes=1000-"), None], "{cdn:?}");
    assert!(!download::part_path(&dest).exists());
}

#[test]
fn a_file_that_is_not_the_one_listed_is_refused_and_deleted() {
    let hub = hub();
    let client = HubClient::new(&hub.url, None);
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let files = rt.block_on(client.files("strata-test/Tiny-GGUF")).unwrap();
    let f = file_of(&files, "Tiny-Q6_K.gguf");
    let (r, _) = rt.block_on(get(&client, "strata-test/Tiny-GGUF", &f, dir.path()));
    let e = r.unwrap_err();
    match &e {
        DownloadError::Checksum { file, expected, found } => {
            assert_eq!(file, "Tiny-Q6_K.gguf");
            assert_eq!(expected, &sha256_hex(b"something else"));
            assert_eq!(found, &sha256_hex(&pattern(300 << 10)));
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("deleted"), "{e}");
    let dest = download::destination(dir.path(), "strata-test/Tiny-GGUF", &f.path).unwrap();
    assert!(!dest.exists() && !download::part_path(&dest).exists());
}

#[test]
fn a_gated_repository_needs_the_token_and_the_cdn_never_sees_it() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let repo = "strata-test/Gated-GGUF";
    let e = rt.block_on(HubClient::new(&hub.url, None).files(repo)).unwrap_err();
    assert!(matches!(e, HubError::NeedsToken { .. }), "{e:?}");
    assert!(e.to_string().contains("HF_TOKEN") && e.to_string().contains(repo), "{e}");
    let e = rt.block_on(HubClient::new(&hub.url, Some("hf_wrong".into())).files(repo)).unwrap_err();
    assert!(matches!(e, HubError::Refused { .. }), "{e:?}");
    // A download asked without the token (the file known from before) fails the same way, writing nothing.
    let f =
        HubFile { path: "Gated-Q4_0.gguf".into(), size_bytes: model_bytes().len() as u64, sha256: None, split: None };
    let (r, _) = rt.block_on(get(&HubClient::new(&hub.url, None), repo, &f, dir.path()));
    assert!(matches!(r, Err(DownloadError::Hub(HubError::NeedsToken { .. }))), "{r:?}");
    let client = HubClient::new(&hub.url, Some(GOOD_TOKEN.into()));
    let files = rt.block_on(client.files(repo)).expect("the token opens it");
    let (r, _) = rt.block_on(get(&client, repo, &files[0], dir.path()));
    assert_eq!(std::fs::read(r.expect("downloads")).unwrap(), model_bytes());
    let seen = hub.seen();
    assert!(seen
        .iter()
        .any(|s| s.path.contains("/resolve/") && s.authorization.as_deref() == Some(&format!("Bearer {GOOD_TOKEN}"))));
    let cdn: Vec<_> = seen.iter().filter(|s| s.path.starts_with("/cdn/")).collect();
    assert!(!cdn.is_empty() && cdn.iter().all(|s| s.authorization.is_none()), "{cdn:?}");
}

#[test]
fn a_disk_without_room_is_refused_before_the_first_byte() {
    let hub = hub();
    let client = HubClient::new(&hub.url, None);
    let dir = tempfile::tempdir().unwrap();
    let f = HubFile { path: "Tiny-Q4_K_M.gguf".into(), size_bytes: 1 << 60, sha256: None, split: None };
    let (r, _) = rt().block_on(get(&client, "strata-test/Tiny-GGUF", &f, dir.path()));
    match r {
        Err(e @ DownloadError::DiskFull { .. }) => assert!(e.to_string().contains("not enough disk space"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(hub.seen().iter().all(|s| !s.path.starts_with("/cdn/")), "nothing was requested");
}

/// A disk that fills up while the file is written (ENOSPC on a write, after the check before the first byte
/// passed) is reported as full, not as a cut connection retried: here the part is a link to /dev/full,
/// whose every write fails so.
#[cfg(target_os = "linux")]
#[test]
fn a_disk_that_fills_up_during_the_download_is_reported_full() {
    let hub = hub();
    let client = HubClient::new(&hub.url, None);
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let files = rt.block_on(client.files("strata-test/Tiny-GGUF")).unwrap();
    let f = file_of(&files, "Tiny-Q4_K_M.gguf");
    let dest = download::destination(dir.path(), "strata-test/Tiny-GGUF", &f.path).unwrap();
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/dev/full", download::part_path(&dest)).unwrap();
    let (r, seen) = rt.block_on(get(&client, "strata-test/Tiny-GGUF", &f, dir.path()));
    match r {
        Err(e @ DownloadError::DiskFull { .. }) => assert!(e.to_string().contains("not enough disk space"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(!dest.exists(), "nothing was put in place");
    // Said at the first failed write: one request, not five tries.
    let gets = hub.seen().iter().filter(|s| s.path.starts_with("/cdn/")).count();
    assert_eq!(gets, 1, "{:?}", hub.seen());
    assert!(seen.iter().all(|p| p.done_bytes == 0), "no byte counted as written");
}

#[test]
fn a_cancelled_download_stops_and_leaves_nothing() {
    let hub = hub();
    let client = HubClient::new(&hub.url, None);
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let files = rt.block_on(client.files("strata-test/Tiny-GGUF")).unwrap();
    let f = file_of(&files, "Tiny-F16.gguf");
    let cancel = Arc::new(AtomicBool::new(false));
    let c = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(500));
        c.store(true, Ordering::Relaxed);
    });
    let mut last = Progress::default();
    let r =
        rt.block_on(download::download(&client, "strata-test/Tiny-GGUF", &f, dir.path(), &cancel, &mut |p| last = p));
    assert!(matches!(r, Err(DownloadError::Cancelled { .. })), "{r:?}");
    assert!(last.done_bytes > 0 && last.done_bytes < f.size_bytes, "{last:?}");
    assert!(last.rate_bytes_per_s > 0.0 && last.eta_s.is_some_and(|s| s > 0.0), "{last:?}");
    let dest = download::destination(dir.path(), "strata-test/Tiny-GGUF", &f.path).unwrap();
    assert!(!dest.exists() && !download::part_path(&dest).exists());
}

/// `strata pull ARGS` against `hub`, with no token but `token`, and no saved login.
fn pull(hub: &MockHub, home: &Path, token: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.arg("pull").args(args).env("HF_ENDPOINT", &hub.url).env("HF_HOME", home).env_remove("HF_TOKEN");
    if let Some(t) = token {
        cmd.env("HF_TOKEN", t);
    }
    cmd.output().expect("strata runs")
}

#[test]
fn strata_pull_downloads_a_runnable_model_and_says_why_when_it_cannot() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("models");
    let d = d.to_str().unwrap();
    let o = pull(&hub, dir.path(), None, &["strata-test/Tiny-GGUF", "--dir", d]);
    assert!(o.status.success(), "{}", crate::common::stderr(&o));
    let path = crate::common::stdout(&o).trim().to_owned();
    assert_eq!(Path::new(&path), dir.path().join("models/strata-test/Tiny-GGUF/Tiny-Q4_K_M.gguf"), "Q4_K_M by default");
    assert_eq!(std::fs::read(&path).unwrap(), model_bytes());
    // The file it wrote is a model that runs.
    let run = crate::common::strata(&["run", "-m", &path, "-p", "Hello", "-n", "3", "--temp", "0"]);
    assert!(run.status.success(), "{}", crate::common::stderr(&run));
    // A quantization's name picks its file; --list lists them.
    let o = pull(&hub, dir.path(), None, &["https://huggingface.co/strata-test/Tiny-GGUF", "--list"]);
    assert!(o.status.success());
    let listed = crate::common::stdout(&o);
    assert!(listed.contains("Tiny-Q8_0.gguf\t3.0 MiB") && listed.lines().count() == 6, "{listed}");
    let o = pull(&hub, dir.path(), None, &["strata-test/Tiny-GGUF:q6_k", "--dir", d]);
    assert!(!o.status.success());
    let err = crate::common::stderr(&o);
    assert!(err.contains("sha256") && err.contains("deleted"), "{err}");
    let o = pull(&hub, dir.path(), None, &["strata-test/Tiny-GGUF:Big", "--dir", d]);
    assert!(crate::common::stderr(&o).contains("split model"), "{}", crate::common::stderr(&o));
    let o = pull(&hub, dir.path(), None, &["strata-test/Tiny-GGUF:Q5", "--dir", d]);
    assert!(crate::common::stderr(&o).contains("no GGUF file matches \"Q5\""), "{}", crate::common::stderr(&o));
    // A gated repository: the error names HF_TOKEN; with it, the file comes.
    let o = pull(&hub, dir.path(), None, &["strata-test/Gated-GGUF", "--dir", d]);
    assert_eq!(o.status.code(), Some(1));
    assert!(crate::common::stderr(&o).contains("set HF_TOKEN"), "{}", crate::common::stderr(&o));
    std::fs::write(dir.path().join("token"), format!("{GOOD_TOKEN}\n")).unwrap();
    let o = pull(&hub, dir.path(), None, &["strata-test/Gated-GGUF", "--dir", d]);
    assert!(o.status.success(), "the saved login token is used: {}", crate::common::stderr(&o));
    let o = pull(
        &hub,
        dir.path(),
        Some("hf_wrong"),
        &["strata-test/Gated-GGUF:Q4_0", "--dir", dir.path().join("m2").to_str().unwrap()],
    );
    assert!(
        crate::common::stderr(&o).contains("refused the token"),
        "HF_TOKEN comes first: {}",
        crate::common::stderr(&o)
    );
}

#[test]
fn the_server_searches_plans_downloads_lists_and_deletes_models() {
    use serde_json::{json, Value};
    let _one = crate::common::one_at_a_time();
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let s = crate::common::server::Server::start_env(
        &["-c", "256", "--models-dir", models.to_str().unwrap()],
        &[("HF_ENDPOINT", &hub.url), ("HF_HOME", dir.path().to_str().unwrap()), ("HF_TOKEN", "")],
    );
    let found = s.get("/strata/library/search?q=tiny").json();
    assert_eq!(found["models"][0]["id"], "strata-test/Tiny-GGUF", "{found}");
    let files = s.get("/strata/library/files?repo=strata-test/Tiny-GGUF").json();
    assert_eq!(files["files"].as_array().unwrap().len(), 6, "{files}");
    assert!(files["files"].as_array().unwrap().iter().all(|f| f["local_path"].is_null()));
    // The fit of a file before it is here: this machine's CPU holds its 2 layers at the context asked.
    let fit = s.get("/strata/library/fit?repo=strata-test/Tiny-GGUF&file=Tiny-Q4_K_M.gguf&context=512");
    assert_eq!(fit.status, 200, "{}", fit.text());
    let fit = fit.json();
    assert_eq!(
        (fit["fit"].as_str(), fit["summary"].as_str(), fit["layers"].as_u64()),
        (Some("fits"), Some("fits"), Some(2)),
        "{fit}"
    );
    assert_eq!(fit["context"], 512);
    assert!(fit["plan"]["rows"][0]["weights_bytes"].as_u64().unwrap() > 0);
    let e = s.get("/strata/library/fit?repo=strata-test/Tiny-GGUF&file=Tiny-Q8_0.gguf").expect_error(400);
    assert_eq!(e["param"], "file");
    let picks = s.get("/strata/library/picks").json();
    assert_eq!(picks["picks"].as_array().unwrap().len(), 3, "{picks}");
    // Two downloads at once; the slow one is cancelled.
    let start =
        |file: &str| s.post("/strata/library/downloads", &json!({"repo": "strata-test/Tiny-GGUF", "file": file}));
    let a = start("Tiny-Q4_K_M.gguf");
    assert_eq!(a.status, 202, "{}", a.text());
    let slow = start("Tiny-F16.gguf").json()["id"].as_u64().expect("an id");
    assert_eq!(start("Tiny-F16.gguf").expect_error(409)["code"], "download_busy");
    let downloads =
        || -> Vec<Value> { s.get("/strata/library/downloads").json()["downloads"].as_array().unwrap().clone() };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while downloads()[0]["state"] != "done" {
        assert!(std::time::Instant::now() < deadline, "{:?}", downloads());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(s.post(&format!("/strata/library/downloads/{slow}/cancel"), &json!({})).status, 204);
    while downloads()[1]["state"] == "running" {
        assert!(std::time::Instant::now() < deadline, "{:?}", downloads());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let d = downloads();
    assert_eq!(d[1]["state"], "cancelled", "{d:?}");
    let path = d[0]["path"].as_str().expect("a path").to_owned();
    assert_eq!(d[0]["progress"]["done_bytes"], d[0]["progress"]["total_bytes"]);
    assert_eq!(std::fs::read(&path).unwrap(), model_bytes());
    // Here now: listed with its repository, and the repository's listing says where it is.
    let local = s.get("/strata/library/local").json();
    assert_eq!(local["models"].as_array().unwrap().len(), 1, "{local}");
    assert_eq!(local["models"][0]["repo"], "strata-test/Tiny-GGUF");
    let files = s.get("/strata/library/files?repo=strata-test/Tiny-GGUF").json();
    let here: Vec<&Value> = files["files"].as_array().unwrap().iter().filter(|f| !f["local_path"].is_null()).collect();
    assert_eq!(here.len(), 1);
    assert_eq!(here[0]["local_path"], path.as_str());
    // Only a GGUF in the models folder is deleted.
    let outside = dir.path().join("outside.gguf");
    std::fs::write(&outside, b"x").unwrap();
    for bad in [outside.to_str().unwrap(), "/etc/passwd", &format!("{}/../outside.gguf", models.display())] {
        let e = s.post("/strata/library/delete", &json!({"path": bad})).expect_error(400);
        assert_eq!(e["param"], "path", "{bad}");
    }
    assert!(outside.exists());
    assert_eq!(s.post("/strata/library/delete", &json!({"path": path})).status, 204);
    assert!(!Path::new(&path).exists() && !models.join("strata-test").exists());
    assert_eq!(s.get("/strata/library/local").json()["models"].as_array().unwrap().len(), 0);
    // Bad requests are named.
    assert_eq!(s.get("/strata/library/files?repo=..%2Fetc").expect_error(400)["param"], "repo");
    assert_eq!(s.get("/strata/library/files?repo=strata-test/Absent").status, 404);
    assert_eq!(s.post("/strata/library/downloads/999/cancel", &json!({})).status, 404);
    let e = s.get("/strata/library/files?repo=strata-test/Gated-GGUF").expect_error(502);
    assert_eq!(e["code"], "hub_token");
    assert!(e["message"].as_str().unwrap().contains("HF_TOKEN"), "{e}");
}
