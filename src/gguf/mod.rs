//! GGUF reader over a memory map: header, metadata values, tensor index.
//!
//! It owns parsing and validation of the file's structure and never panics on bad bytes: every problem
//! becomes a [`GgufError`] that names what is wrong and the byte offset where it was found. It never
//! interprets tensor data; `quant` does that.

mod error;
mod reader;
mod value;
mod writer;

pub use error::{GgufError, GgufErrorKind};
pub use reader::{GgufFile, TensorInfo};
pub use value::{type_name, ArrayData, GgufArray, GgufValue, GgufValueType};
pub use writer::{GgufWriter, ImageHeader, TensorEntry};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
