//! Errors of the GGUF reader: what went wrong and where in the file.

use std::path::PathBuf;

/// A GGUF file could not be read. `offset` is the byte offset in the file where the problem was found (shown
/// for problems of the contents, not for a file that could not be opened at all).
#[derive(Debug, thiserror::Error)]
#[error("{kind}{}", if kind.is_about_contents() { format!(" (at byte offset {offset})") } else { String::new() })]
pub struct GgufError {
    pub kind: GgufErrorKind,
    pub offset: u64,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufErrorKind {
    #[error("cannot open {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file's first bytes are not kept: the message may reach whoever named the file (the app's model
    /// picker takes any path), and must not show them what a file they cannot read begins with.
    #[error("not a GGUF file: it does not begin with the GGUF signature (is it a model file, fully downloaded?)")]
    BadMagic,
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error(
        "the file ends early (truncated: a partial download?): {what} needs at least {needed} bytes here but the file \
         ends {available} bytes later"
    )]
    Truncated { what: &'static str, needed: u64, available: u64 },
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),
    #[error("string is not valid UTF-8 ({what})")]
    BadUtf8 { what: &'static str },
    #[error("{what} is too large: {value}")]
    TooLarge { what: &'static str, value: u64 },
    #[error("metadata arrays nested deeper than {0} levels")]
    TooDeep(usize),
    #[error("duplicate {what} {name:?}")]
    Duplicate { what: &'static str, name: String },
    #[error("tensor {name:?} has unknown tensor type {type_id}")]
    UnknownTensorType { name: String, type_id: u32 },
    #[error("tensor {name:?} has {n_dims} dimensions (at most 4 are allowed)")]
    BadDims { name: String, n_dims: u32 },
    #[error(
        "tensor {name:?}: shape {dims:?} does not fit type {ty} (rows must be whole blocks; size must not overflow)"
    )]
    BadShape { name: String, dims: Vec<u64>, ty: crate::quant::GgmlType },
    #[error("tensor {name:?}: data offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned { name: String, offset: u64, alignment: u64 },
    #[error(
        "tensor {name:?}: data [{start}, {end}) lies outside the file's {file_bytes} bytes: the file ends early \
         (its tensors need {expected_bytes} bytes: a partial download?) or its tensor index is corrupt"
    )]
    DataOutOfBounds { name: String, start: u64, end: u64, file_bytes: u64, expected_bytes: u64 },
    #[error("general.alignment {0} is not a power of two up to 2^30 (1 GiB)")]
    BadAlignment(u64),
    #[error("metadata key {key} is {found}, expected {expected}")]
    WrongType { key: String, found: String, expected: &'static str },
    #[error("{path} is {what}, not a GGUF file (a model must be a regular file)")]
    NotAFile { path: PathBuf, what: &'static str },
    #[error("{path} is empty (0 bytes), not a GGUF file")]
    Empty { path: PathBuf },
}

impl GgufErrorKind {
    /// False for a file that could not be opened or is no file to read (no offset to name).
    fn is_about_contents(&self) -> bool {
        !matches!(self, GgufErrorKind::Io { .. } | GgufErrorKind::NotAFile { .. } | GgufErrorKind::Empty { .. })
    }
}

impl GgufError {
    pub(crate) fn new(kind: GgufErrorKind, offset: u64) -> Self {
        GgufError { kind, offset }
    }
}
