//! Reading what a user hands the command line (script files, text files, standard input) within a size cap
//! each, so that `/dev/zero`, an endless pipe or a mistaken multi-gigabyte file gives a clear error instead
//! of growing memory until the process dies. The caps are documented in the README.

use std::io::{BufRead, Read};
use std::path::Path;

use anyhow::{bail, Context};

/// `--sim-faults FILE`: a few lines of fault specs.
pub const SIM_FAULTS_CAP_BYTES: u64 = 1 << 20;
/// `strata replay SCRIPT`: a scripted workload.
pub const REPLAY_SCRIPT_CAP_BYTES: u64 = 64 << 20;
/// `strata perplexity -f FILE`: a text to score (wikitext-2's test split is 1.3 MB).
pub const PERPLEXITY_TEXT_CAP_BYTES: u64 = 256 << 20;
/// One line (one message) of `strata chat` on standard input.
pub const CHAT_LINE_CAP_BYTES: u64 = 8 << 20;
/// `strata bench --prompt-file`.
pub const PROMPT_FILE_CAP_BYTES: u64 = 8 << 20;

/// The bytes of `path` (`what` names it in messages), refused past `cap_bytes`. Any readable file works
/// (a pipe from `<(...)` too); only the size is bounded.
pub fn read_capped(path: &Path, cap_bytes: u64, what: &str) -> anyhow::Result<Vec<u8>> {
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        bail!("cannot read {what} {}: it is a directory", path.display());
    }
    let file = std::fs::File::open(path).with_context(|| format!("cannot read {what} {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(cap_bytes + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    if bytes.len() as u64 > cap_bytes {
        bail!("{what} {} is larger than the {} MiB this command reads", path.display(), cap_bytes >> 20);
    }
    Ok(bytes)
}

/// [`read_capped`] as UTF-8 text (a leading byte-order mark dropped).
pub fn read_text_capped(path: &Path, cap_bytes: u64, what: &str) -> anyhow::Result<String> {
    let bytes = read_capped(path, cap_bytes, what)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{what} {} is not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    Ok(match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_owned(),
        None => text,
    })
}

/// The next line of `input` without its line ending, `None` at the end, an error for a line longer than
/// `cap_bytes` or one that is not UTF-8.
pub fn read_line_capped(input: &mut impl BufRead, cap_bytes: u64, what: &str) -> anyhow::Result<Option<String>> {
    let mut line = Vec::new();
    let n = input
        .by_ref()
        .take(cap_bytes + 1)
        .read_until(b'\n', &mut line)
        .with_context(|| format!("cannot read {what}"))?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    } else if line.len() as u64 > cap_bytes {
        bail!("a line of {what} is longer than {} MiB", cap_bytes >> 20);
    }
    String::from_utf8(line).map(Some).map_err(|_| anyhow::anyhow!("a line of {what} is not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_capped_and_checked() {
        let mut input = std::io::Cursor::new(b"one\r\ntwo\nthree".to_vec());
        assert_eq!(read_line_capped(&mut input, 16, "stdin").unwrap().as_deref(), Some("one"));
        assert_eq!(read_line_capped(&mut input, 16, "stdin").unwrap().as_deref(), Some("two"));
        assert_eq!(read_line_capped(&mut input, 16, "stdin").unwrap().as_deref(), Some("three"));
        assert_eq!(read_line_capped(&mut input, 16, "stdin").unwrap(), None);
        let mut long = std::io::Cursor::new(vec![b'x'; 100]);
        let e = read_line_capped(&mut long, 16, "standard input").unwrap_err().to_string();
        assert!(e.contains("longer than"), "{e}");
        let mut bad = std::io::Cursor::new(vec![0xff, b'\n']);
        assert!(read_line_capped(&mut bad, 16, "stdin").unwrap_err().to_string().contains("not UTF-8"));
    }

    #[test]
    fn files_past_the_cap_are_refused_and_a_bom_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.txt");
        std::fs::write(&p, "\u{feff}hello").unwrap();
        assert_eq!(read_text_capped(&p, 64, "text").unwrap(), "hello");
        let e = read_capped(&p, 4, "text").unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        let e = read_capped(dir.path(), 4, "text").unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
    }
}
