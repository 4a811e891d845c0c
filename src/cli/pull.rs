//! `strata pull REPO[:FILE]`: downloads a GGUF file from the Hugging Face Hub into the models folder, with
//! a progress bar, resuming a part an earlier run left (Ctrl-C keeps it), checked by the sha256 the Hub
//! lists. Prints the file's path on stdout when it is there. FILE may be a path in the repository or a
//! quantization's name (`Q4_K_M`); without it, the repository's only file or its Q4_K_M one.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use anyhow::{bail, Context};
use clap::Args;

use strata::hub::{self, download, HubClient};

#[derive(Args, Debug)]
pub struct PullArgs {
    /// owner/name, owner/name:FILE or owner/name:QUANT (a Hugging Face URL of the repository works too)
    #[arg(value_name = "REPO[:FILE]")]
    pub what: String,
    /// The models folder [default: $STRATA_MODELS_DIR, else ~/.local/share/strata/models]
    #[arg(long = "dir", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// List the repository's GGUF files with their sizes (no download)
    #[arg(long = "list")]
    pub list: bool,
}

/// `(repo, file)` of `owner/name[:file]`, a `https://huggingface.co/owner/name` URL or `hf.co/owner/name`.
fn parse_what(what: &str) -> anyhow::Result<(String, Option<String>)> {
    let w = what.trim();
    let w = ["https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "https://hf.co/", "hf.co/"]
        .iter()
        .find_map(|p| w.strip_prefix(p))
        .unwrap_or(w);
    let (repo, file) = match w.split_once(':') {
        Some((r, f)) if !f.is_empty() => (r, Some(f.to_owned())),
        Some((r, _)) => (r, None),
        None => (w, None),
    };
    // A pasted page URL: owner/name/blob/main/file.gguf or owner/name/tree/main.
    let parts: Vec<&str> = repo.trim_end_matches('/').split('/').collect();
    let (repo, file) = match parts.as_slice() {
        [o, n] => (format!("{o}/{n}"), file),
        [o, n, "blob" | "resolve", _rev, rest @ ..] if !rest.is_empty() && file.is_none() => {
            (format!("{o}/{n}"), Some(rest.join("/")))
        }
        [o, n, "tree", ..] => (format!("{o}/{n}"), file),
        _ => bail!("{what:?} is not a repository: expected owner/name or owner/name:FILE"),
    };
    hub::check_repo(&repo)?;
    Ok((repo, file))
}

pub fn main(a: PullArgs) -> anyhow::Result<()> {
    let (repo, want) = parse_what(&a.what)?;
    let dir = a.dir.unwrap_or_else(hub::local::default_models_dir);
    let client = HubClient::from_env();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("a runtime")?;
    let files = rt.block_on(client.files(&repo))?;
    if a.list {
        for f in &files {
            println!("{}\t{}", f.path, hub::human_bytes(f.size_bytes));
        }
        return Ok(());
    }
    let file = hub::pick_file(&files, want.as_deref()).map_err(|e| anyhow::anyhow!("{repo}: {e}"))?;
    if let Some((_, parts)) = file.split {
        bail!(
            "{repo}: {} is one of {parts} parts of a split model; Strata reads single-file GGUFs (join them with \
             llama-gguf-split --merge, or pick another file with --list)",
            file.path
        );
    }
    let dest = download::destination(&dir, &repo, &file.path)?;
    eprintln!("strata pull: {repo}/{} ({}) -> {}", file.path, hub::human_bytes(file.size_bytes), dest.display());
    let bar = indicatif::ProgressBar::new(file.size_bytes);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta} left")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let cancel = AtomicBool::new(false);
    let result = rt.block_on(download::download(&client, &repo, file, &dir, &cancel, &mut |p| {
        bar.set_position(p.done_bytes);
    }));
    bar.finish_and_clear();
    let path = result?;
    eprintln!(
        "strata pull: {} checked ({})",
        file.path,
        file.sha256.as_deref().map_or("size only: no sha256 listed", |_| "sha256")
    );
    println!("{}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_to_pull_reads_repo_file_and_urls() {
        let p = |w: &str| parse_what(w).map_err(|e| e.to_string());
        assert_eq!(p("a/b").unwrap(), ("a/b".into(), None));
        assert_eq!(p("a/b:Q4_K_M").unwrap(), ("a/b".into(), Some("Q4_K_M".into())));
        assert_eq!(p("https://huggingface.co/a/b").unwrap(), ("a/b".into(), None));
        assert_eq!(p("hf.co/a/b:x.gguf").unwrap(), ("a/b".into(), Some("x.gguf".into())));
        assert_eq!(
            p("https://huggingface.co/a/b/blob/main/sub/x.gguf").unwrap(),
            ("a/b".into(), Some("sub/x.gguf".into()))
        );
        assert!(p("a").unwrap_err().contains("not a repository"));
        assert!(p("../x/y").is_err());
    }
}
