//! Parsing of a GGUF file (v2 and v3) from a memory map: header, metadata, tensor index, and bounds checks
//! of every tensor's data against the file.

use std::collections::HashMap;
use std::path::Path;

use super::error::{GgufError, GgufErrorKind};
use super::value::{ArrayData, GgufArray, GgufValue, GgufValueType};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::quant::GgmlType;

/// Arrays nested deeper than this are refused (real files use depth 1).
const MAX_NESTING: usize = 8;
/// No single string may exceed this (the longest real ones are chat templates of a few KiB).
const MAX_STRING_BYTES: u64 = 256 << 20;
/// `general.alignment` above this is refused (real files use 32; a page or a huge page is plausible).
const MAX_ALIGNMENT: u64 = 1 << 30;
/// At most this many metadata pairs, tensors or inner arrays are reserved ahead of a count read from the
/// file; beyond it, vectors grow as items are actually parsed. A count is only checked against the bytes
/// left, and these items take several times their minimum file bytes in memory (a metadata pair needs 13
/// bytes and takes 56, plus its index entry). Reserved up front, a corrupted count in a 4 GiB file could
/// ask for tens of GiB, and reservations for nested arrays would pile up level on level; grown, memory
/// stays proportional to the bytes actually parsed. (Arrays of strings are reserved in full: they are
/// leaves, so only one is being filled at a time, and a `String` is 24 bytes per 8 or more in the file.)
const MAX_RESERVE: u64 = 4096;
/// A count of metadata items or tensors whose items would need more bytes than this cannot be a real file's
/// (the largest metadata, a 256K-token vocabulary, takes a few MiB): it is refused as corrupt. Under it, a
/// count beyond the end of the file means the file ends early (a partial download) and is said so.
const MAX_PLAUSIBLE_BYTES: u64 = 1 << 30;

/// One tensor of the index.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the row length (the contiguous one).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data from the start of the file.
    pub file_offset: u64,
    /// Bytes of the data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of values. The reader refuses shapes whose count overflows; for a `TensorInfo` made by hand
    /// the product saturates rather than panicking or wrapping.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1, |acc: u64, &d| acc.saturating_mul(d))
    }
    /// Number of rows (all dimensions but the first), saturating like [`TensorInfo::n_elements`].
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).fold(1, |acc: u64, &d| acc.saturating_mul(d))
    }
}

/// The backing bytes of a GGUF file: a memory map, an owned buffer (tests, fuzzing), or only the file's
/// first bytes (a header image: a file not downloaded yet, planned from its metadata and tensor index).
/// Tensor data bytes [`GgufFile::fingerprint`] reads at each end of the data section.
pub const FINGERPRINT_SAMPLE_BYTES: usize = 64 * 1024;

/// Bytes of each tensor's data [`GgufFile::fingerprint`] reads.
pub const FINGERPRINT_TENSOR_BYTES: usize = 256;

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
    Header(HeaderImage),
}

/// The first bytes of a file of `file_bytes`: its metadata and tensor index. Tensor data beyond `prefix`
/// reads as zeros (`zeros`, made on the first such read, as long as the largest tensor up to
/// [`HEADER_IMAGE_ZEROS_MAX`]): what a plan reads of the data (norm vectors, biases) does not change a size.
struct HeaderImage {
    prefix: Vec<u8>,
    file_bytes: u64,
    zeros: std::sync::OnceLock<Vec<u8>>,
}

/// The most zero bytes a header image holds for the data of one tensor it does not have.
pub const HEADER_IMAGE_ZEROS_MAX: u64 = 64 << 20;

/// An open, validated GGUF file.
pub struct GgufFile {
    bytes: Bytes,
    pub version: u32,
    pub alignment: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, GgufValue)>,
    index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// Offset of the tensor data section.
    pub data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and validates the file at `path` (memory-mapped; nothing is copied).
    /// Anything but a regular file is refused before it is opened (opening a FIFO would wait forever for a
    /// writer; a directory or a device cannot be mapped), and so is an empty file.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::new(GgufErrorKind::Io { path: path.to_path_buf(), source }, 0);
        // Opened without blocking (a FIFO would wait for a writer), then checked on the open file itself.
        let mut options = std::fs::OpenOptions::new();
        options.read(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.custom_flags(libc::O_NONBLOCK);
        }
        let file = options.open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            let what = file_type_name(&meta.file_type());
            return Err(GgufError::new(GgufErrorKind::NotAFile { path: path.to_path_buf(), what }, 0));
        }
        if meta.len() == 0 {
            return Err(GgufError::new(GgufErrorKind::Empty { path: path.to_path_buf() }, 0));
        }
        // SAFETY: the map is read-only. Strata never writes model files; a file changed by another
        // process while mapped is outside what any mmap-based loader can defend against.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Bytes::Mapped(map))
    }

    /// Parses a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(Bytes::Owned(bytes))
    }

    /// Parses the first bytes of a GGUF file of `file_bytes` bytes: the header, the metadata and the tensor
    /// index, each tensor checked against `file_bytes`. A prefix too short for the index is refused as
    /// [`GgufErrorKind::Truncated`] (read more of the file and try again). Data the prefix lacks reads as
    /// zeros ([`HeaderImage`]): the image is for planning, not for running.
    pub fn from_header(prefix: Vec<u8>, file_bytes: u64) -> Result<GgufFile, GgufError> {
        Self::parse(Bytes::Header(HeaderImage { prefix, file_bytes, zeros: std::sync::OnceLock::new() }))
    }

    /// Whether this is a header image ([`GgufFile::from_header`]), whose tensor data is not at hand.
    pub fn is_header_image(&self) -> bool {
        matches!(self.bytes, Bytes::Header(_))
    }

    /// A number that tells this file from another: a hash of its header (metadata and tensor index), its
    /// length, the first and last [`FINGERPRINT_SAMPLE_BYTES`] of its tensor data and the first
    /// [`FINGERPRINT_TENSOR_BYTES`] of every tensor (two fine-tunes of one model share their header, not
    /// their weights, and a merge may differ in its middle layers only). The conversation cache keys
    /// snapshots by it, so a snapshot parked for one file never restores into another. Stable within one
    /// build of Strata.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let data = self.data();
        let mut h = std::hash::DefaultHasher::new();
        let head = (self.data_offset as usize).min(data.len());
        data[..head].hash(&mut h);
        self.file_bytes().hash(&mut h);
        let tail = &data[head..];
        let n = FINGERPRINT_SAMPLE_BYTES.min(tail.len());
        tail[..n].hash(&mut h);
        tail[tail.len() - n..].hash(&mut h);
        for t in &self.tensors {
            let start = (t.file_offset as usize).min(data.len());
            let end = (start + FINGERPRINT_TENSOR_BYTES.min(t.n_bytes as usize)).min(data.len());
            data[start..end].hash(&mut h);
        }
        h.finish()
    }

    fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
            Bytes::Header(h) => &h.prefix,
        }
    }

    /// Reads and validates the header, the metadata and the tensor index of `bytes`, and checks every
    /// tensor's data against the end of the file.
    fn parse(bytes: Bytes) -> Result<GgufFile, GgufError> {
        let (buf, file_bytes): (&[u8], u64) = match &bytes {
            Bytes::Mapped(m) => (m, m.len() as u64),
            Bytes::Owned(v) => (v, v.len() as u64),
            Bytes::Header(h) => (&h.prefix, h.file_bytes),
        };
        let mut r = Cursor { buf, pos: 0 };
        let version = r.header()?;
        let n_tensors_at = r.pos as u64;
        let n_tensors = r.u64("tensor count")?;
        let n_kv_at = r.pos as u64;
        let n_kv = r.u64("metadata count")?;
        // Each key-value pair needs at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at
        // least 8 + 4 + 4 + 8. A count that cannot fit in the rest of the file is refused before allocating.
        // (The tensor count is checked where the tensor index starts, so that a file cut inside its metadata
        // is reported where it ends.)
        r.check_count(n_kv, 13, "metadata count", "the metadata", n_kv_at)?;
        let (metadata, index) = r.metadata(n_kv)?;
        let alignment = read_alignment(index.get("general.alignment").map(|&i| &metadata[i].1), n_kv_at)?;
        r.check_count(n_tensors, 24, "tensor count", "the tensor index", n_tensors_at)?;
        let (raws, tensor_index) = r.tensor_index(n_tensors, alignment)?;
        let data_offset = align_up(r.pos as u64, alignment);
        let tensors = place_tensors(raws, data_offset, file_bytes)?;
        Ok(GgufFile { bytes, version, alignment, metadata, index, tensors, tensor_index, data_offset })
    }

    /// The metadata value under `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The data bytes of `t` (bounds were checked when the file was opened).
    /// In a header image, data past the prefix reads as zeros, up to [`HEADER_IMAGE_ZEROS_MAX`] bytes (a
    /// larger tensor reads as that many: no plan reads one).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let (start, end) = (t.file_offset as usize, (t.file_offset + t.n_bytes) as usize);
        match &self.bytes {
            Bytes::Header(h) if end > h.prefix.len() => {
                let zeros = h.zeros.get_or_init(|| {
                    let largest = self.tensors.iter().map(|t| t.n_bytes).max().unwrap_or(0);
                    vec![0u8; largest.min(HEADER_IMAGE_ZEROS_MAX) as usize]
                });
                &zeros[..(end - start).min(zeros.len())]
            }
            _ => &self.data()[start..end],
        }
    }

    /// Total size of the file in bytes (of a header image, the whole file's).
    pub fn file_bytes(&self) -> u64 {
        match &self.bytes {
            Bytes::Header(h) => h.file_bytes,
            _ => self.data().len() as u64,
        }
    }

    /// Lets the kernel drop this process's pages of `t`'s data (a tensor copied elsewhere, such as weights
    /// repacked at load): they stop counting in the resident set, and a later read faults them back in
    /// from the file. Best effort; an error is ignored.
    pub fn advise_dontneed(&self, t: &TensorInfo) {
        #[cfg(unix)]
        if let Bytes::Mapped(m) = &self.bytes {
            // SAFETY: the map is read-only and file-backed: dropped pages are read back from the file on
            // the next access, so no data is lost and no reference sees a change.
            let _ = unsafe {
                m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, t.file_offset as usize, t.n_bytes as usize)
            };
        }
    }

    /// Advises the kernel that all tensor data will be read soon (a faster first pass over the weights).
    pub fn advise_willneed(&self) {
        #[cfg(unix)]
        if let Bytes::Mapped(m) = &self.bytes {
            let _ = m.advise(memmap2::Advice::WillNeed);
        }
    }
}

/// The tensor alignment: `general.alignment` (`value`, refused unless an unsigned power of two up to
/// [`MAX_ALIGNMENT`]; errors placed at `at`), else the default.
fn read_alignment(value: Option<&GgufValue>, at: u64) -> Result<u64, GgufError> {
    let Some(v) = value else { return Ok(DEFAULT_ALIGNMENT) };
    let Some(a) = v.as_u64().filter(|_| v.is_integer()) else {
        let kind = GgufErrorKind::WrongType {
            key: "general.alignment".into(),
            found: v.type_description(),
            expected: "an unsigned integer",
        };
        return Err(GgufError::new(kind, at));
    };
    if !a.is_power_of_two() || a > MAX_ALIGNMENT {
        return Err(GgufError::new(GgufErrorKind::BadAlignment(a), at));
    }
    Ok(a)
}

/// One entry of the tensor index as read, its data offset still relative to the data section.
struct RawTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    /// Offset of the data from the start of the data section.
    rel_offset: u64,
    n_bytes: u64,
    /// Where the entry starts in the file (for errors).
    at: u64,
}

/// The tensors of the index placed after the data section's start (`data_offset`), each refused when its
/// data does not end within the file's `file_bytes`.
fn place_tensors(raws: Vec<RawTensor>, data_offset: u64, file_bytes: u64) -> Result<Vec<TensorInfo>, GgufError> {
    // The size the tensor index says the file has (what a complete download would be).
    let expected_bytes = raws
        .iter()
        .map(|t| data_offset.saturating_add(t.rel_offset).saturating_add(t.n_bytes))
        .max()
        .unwrap_or(data_offset);
    let mut tensors = Vec::with_capacity(raws.len());
    for raw in raws {
        let start = data_offset.checked_add(raw.rel_offset);
        let end = start.and_then(|s| s.checked_add(raw.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_bytes => tensors.push(TensorInfo {
                name: raw.name,
                dims: raw.dims,
                ty: raw.ty,
                file_offset: start,
                n_bytes: raw.n_bytes,
            }),
            _ => {
                return Err(GgufError::new(
                    GgufErrorKind::DataOutOfBounds {
                        name: raw.name,
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_bytes,
                        expected_bytes,
                    },
                    raw.at,
                ))
            }
        }
    }
    Ok(tensors)
}

/// What a file system entry that is not a regular file is, for messages.
fn file_type_name(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Bytes of a tensor of type `ty` and dimensions `dims`, or `None` when rows are not whole blocks or the
/// size overflows.
fn tensor_bytes(ty: GgmlType, dims: &[u64]) -> Option<u64> {
    let row = ty.row_bytes(*dims.first()?)?;
    dims[1..].iter().try_fold(row, |acc, &d| acc.checked_mul(d))
}

/// Whether the product of the dimensions fits in u64 even with zeros left out, so that no partial product
/// (`n_elements`, `n_rows`, any loop over a subset of the dimensions) can overflow. A zero dimension makes
/// the data empty, which alone would let `[0, 2^40, 2^40]` through; llama.cpp refuses such shapes too.
fn element_count_fits(dims: &[u64]) -> bool {
    dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d.max(1))).is_some()
}

/// Capacity to reserve for `count` items read from the file (see [`MAX_RESERVE`]).
fn reserve(count: u64) -> usize {
    count.min(MAX_RESERVE) as usize
}

fn align_up(x: u64, alignment: u64) -> u64 {
    x.div_ceil(alignment) * alignment
}

/// A bounds-checked reader over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::new(
                GgufErrorKind::Truncated { what, needed: n, available: self.remaining() },
                self.pos as u64,
            ));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Refuses a count of items of at least `min_item_bytes` each that cannot fit in the rest of the file:
    /// as too large when no file could hold it, as the file ending early when a longer file would.
    /// `what` names the count, `items` what it counts (for the message of a file that ends early).
    fn check_count(
        &self,
        count: u64,
        min_item_bytes: u64,
        what: &'static str,
        items: &'static str,
        at: u64,
    ) -> Result<(), GgufError> {
        match count.checked_mul(min_item_bytes) {
            Some(need) if need <= self.remaining() => Ok(()),
            Some(need) if need <= MAX_PLAUSIBLE_BYTES => Err(GgufError::new(
                GgufErrorKind::Truncated { what: items, needed: need, available: self.remaining() },
                self.pos as u64,
            )),
            _ => Err(GgufError::new(GgufErrorKind::TooLarge { what, value: count }, at)),
        }
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(what)?;
        if len > MAX_STRING_BYTES {
            return Err(GgufError::new(GgufErrorKind::TooLarge { what: "string length", value: len }, at));
        }
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::new(GgufErrorKind::BadUtf8 { what }, at + 8)),
        }
    }

    fn value(&mut self, ty: GgufValueType, depth: usize) -> Result<GgufValue, GgufError> {
        const W: &str = "metadata value";
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(self.array::<1>(W)?[0]),
            GgufValueType::I8 => GgufValue::I8(self.array::<1>(W)?[0] as i8),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(W)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(W)?)),
            GgufValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.array(W)?)),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(W)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(W)?)),
            GgufValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.array(W)?)),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(W)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(W)?)),
            GgufValueType::Bool => {
                let at = self.pos as u64;
                match self.array::<1>(W)?[0] {
                    0 => GgufValue::Bool(false),
                    1 => GgufValue::Bool(true),
                    b => {
                        return Err(GgufError::new(GgufErrorKind::TooLarge { what: "bool value", value: b as u64 }, at))
                    }
                }
            }
            GgufValueType::String => GgufValue::String(self.string("metadata string")?),
            GgufValueType::Array => GgufValue::Array(self.array_value(depth)?),
        })
    }

    /// An array (type tag already read) at nesting `depth`: element type, length, elements.
    fn array_value(&mut self, depth: usize) -> Result<GgufArray, GgufError> {
        let at = self.pos as u64;
        if depth >= MAX_NESTING {
            return Err(GgufError::new(GgufErrorKind::TooDeep(MAX_NESTING), at));
        }
        let elem = self.u32("array element type")?;
        let elem_type =
            GgufValueType::from_u32(elem).ok_or_else(|| GgufError::new(GgufErrorKind::UnknownValueType(elem), at))?;
        let len_at = self.pos as u64;
        let len = self.u64("array length")?;
        let min_bytes = match elem_type {
            GgufValueType::String => 8,
            GgufValueType::Array => 12,
            t => t.fixed_bytes().unwrap_or(1),
        };
        self.check_count(len, min_bytes, "array length", "a metadata array", len_at)?;
        // From here `len * min_bytes` fits in the bytes left, so the fixed-size reads below cannot overflow
        // and each allocates exactly the bytes it takes from the file.
        const W: &str = "metadata array";
        let data = match elem_type {
            GgufValueType::U8 => ArrayData::U8(self.take(len, W)?.to_vec()),
            GgufValueType::I8 => ArrayData::I8(self.take(len, W)?.iter().map(|&b| b as i8).collect()),
            GgufValueType::U16 => ArrayData::U16(self.le_values(len, u16::from_le_bytes)?),
            GgufValueType::I16 => ArrayData::I16(self.le_values(len, i16::from_le_bytes)?),
            GgufValueType::U32 => ArrayData::U32(self.le_values(len, u32::from_le_bytes)?),
            GgufValueType::I32 => ArrayData::I32(self.le_values(len, i32::from_le_bytes)?),
            GgufValueType::F32 => ArrayData::F32(self.le_values(len, f32::from_le_bytes)?),
            GgufValueType::U64 => ArrayData::U64(self.le_values(len, u64::from_le_bytes)?),
            GgufValueType::I64 => ArrayData::I64(self.le_values(len, i64::from_le_bytes)?),
            GgufValueType::F64 => ArrayData::F64(self.le_values(len, f64::from_le_bytes)?),
            GgufValueType::Bool => {
                let start = self.pos as u64;
                let bytes = self.take(len, W)?;
                let mut v = Vec::with_capacity(bytes.len());
                for (i, &b) in bytes.iter().enumerate() {
                    match b {
                        0 | 1 => v.push(b == 1),
                        _ => {
                            let what = "bool value";
                            return Err(GgufError::new(
                                GgufErrorKind::TooLarge { what, value: b as u64 },
                                start + i as u64,
                            ));
                        }
                    }
                }
                ArrayData::Bool(v)
            }
            GgufValueType::String => {
                let mut v = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    v.push(self.string("metadata string")?);
                }
                ArrayData::String(v)
            }
            GgufValueType::Array => {
                let mut v = Vec::with_capacity(reserve(len));
                for _ in 0..len {
                    v.push(self.array_value(depth + 1)?);
                }
                ArrayData::Array(v)
            }
        };
        Ok(GgufArray::new(data))
    }

    /// `len` little-endian values of `N` bytes each, decoded with `from`.
    fn le_values<T, const N: usize>(&mut self, len: u64, from: fn([u8; N]) -> T) -> Result<Vec<T>, GgufError> {
        let n_bytes = len.saturating_mul(N as u64);
        let bytes = self.take(n_bytes, "metadata array")?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                from(a)
            })
            .collect())
    }
}

/// Metadata pairs in file order.
type Metadata = Vec<(String, GgufValue)>;

/// The sections of the file, in the order they are read.
impl Cursor<'_> {
    /// The magic and the version (2 or 3).
    fn header(&mut self) -> Result<u32, GgufError> {
        let magic_bytes = self.take(4, "magic")?;
        if magic_bytes != GGUF_MAGIC {
            return Err(GgufError::new(GgufErrorKind::BadMagic, 0));
        }
        let version = self.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::new(GgufErrorKind::UnsupportedVersion(version), 4));
        }
        Ok(version)
    }

    /// `n_kv` metadata pairs in file order, and the position of each key; a key twice is refused.
    fn metadata(&mut self, n_kv: u64) -> Result<(Metadata, HashMap<String, usize>), GgufError> {
        let mut metadata = Vec::with_capacity(reserve(n_kv));
        let mut index = HashMap::with_capacity(reserve(n_kv));
        for _ in 0..n_kv {
            let key_at = self.pos as u64;
            let key = self.string("metadata key")?;
            let ty_at = self.pos as u64;
            let ty = self.u32("metadata value type")?;
            let ty = GgufValueType::from_u32(ty)
                .ok_or_else(|| GgufError::new(GgufErrorKind::UnknownValueType(ty), ty_at))?;
            let value = self.value(ty, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::new(GgufErrorKind::Duplicate { what: "metadata key", name: key }, key_at));
            }
            metadata.push((key, value));
        }
        Ok((metadata, index))
    }

    /// `n_tensors` entries of the tensor index, and the position of each name; a name twice is refused.
    fn tensor_index(
        &mut self,
        n_tensors: u64,
        alignment: u64,
    ) -> Result<(Vec<RawTensor>, HashMap<String, usize>), GgufError> {
        let mut raws = Vec::with_capacity(reserve(n_tensors));
        let mut tensor_index = HashMap::with_capacity(reserve(n_tensors));
        for i in 0..n_tensors as usize {
            let raw = self.tensor_info(alignment)?;
            if tensor_index.insert(raw.name.clone(), i).is_some() {
                let kind = GgufErrorKind::Duplicate { what: "tensor name", name: raw.name };
                return Err(GgufError::new(kind, raw.at));
            }
            raws.push(raw);
        }
        Ok((raws, tensor_index))
    }

    /// One entry of the tensor index: its shape refused when it has no whole rows or overflows, its offset
    /// when not a multiple of `alignment`.
    fn tensor_info(&mut self, alignment: u64) -> Result<RawTensor, GgufError> {
        let at = self.pos as u64;
        let name = self.string("tensor name")?;
        let n_dims = self.u32("tensor dimension count")?;
        if n_dims == 0 || n_dims > 4 {
            return Err(GgufError::new(GgufErrorKind::BadDims { name, n_dims }, at));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64("tensor dimension")?);
        }
        let ty_at = self.pos as u64;
        let type_id = self.u32("tensor type")?;
        let ty = GgmlType::from_id(type_id)
            .ok_or_else(|| GgufError::new(GgufErrorKind::UnknownTensorType { name: name.clone(), type_id }, ty_at))?;
        let rel_offset = self.u64("tensor data offset")?;
        let n_bytes = match tensor_bytes(ty, &dims) {
            Some(n) if element_count_fits(&dims) => n,
            _ => return Err(GgufError::new(GgufErrorKind::BadShape { name, dims, ty }, at)),
        };
        if rel_offset % alignment != 0 {
            return Err(GgufError::new(GgufErrorKind::Misaligned { name, offset: rel_offset, alignment }, at));
        }
        Ok(RawTensor { name, dims, ty, rel_offset, n_bytes, at })
    }
}
