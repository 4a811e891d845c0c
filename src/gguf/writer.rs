//! A GGUF writer: metadata and tensors into a byte image. Test code and `strata`'s synthetic-model tool use
//! it to make small models with random weights; it is the inverse of the reader. For images too large to
//! hold in memory (`strata quantize`), [`GgufWriter::header_for`] gives the bytes before the data section
//! and where each tensor goes, and the caller writes the data itself.

use super::value::{ArrayData, GgufArray, GgufValue};
use super::GGUF_MAGIC;
use crate::quant::GgmlType;

/// A tensor's entry in the index of an image whose data the caller writes (see [`GgufWriter::header_for`]).
#[derive(Clone, Copy, Debug)]
pub struct TensorEntry<'a> {
    pub name: &'a str,
    /// ggml dimensions, row length first.
    pub dims: &'a [u64],
    pub ty: GgmlType,
    /// Bytes of the tensor's data.
    pub n_bytes: u64,
}

/// The part of an image before its data section, and where the data goes.
#[derive(Clone, Debug)]
pub struct ImageHeader {
    /// Magic, version, counts, metadata, tensor index, and zero padding up to the alignment.
    pub bytes: Vec<u8>,
    /// Offset of each tensor's data from the start of the data section (`bytes.len()`), in entry order.
    pub data_offsets: Vec<u64>,
    /// The data alignment: the gap before each tensor and the end of the image are zero padding up to a
    /// multiple of it.
    pub alignment: u64,
}

/// A GGUF image under construction.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    alignment: u64,
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter { metadata: Vec::new(), tensors: Vec::new(), alignment: super::DEFAULT_ALIGNMENT }
    }

    /// A copy of an open file: its metadata in file order and its tensors with their data (to write an
    /// edited or converted model).
    pub fn from_file(file: &super::GgufFile) -> Self {
        let mut w = GgufWriter::new();
        for (k, v) in &file.metadata {
            w.set(k, v.clone());
        }
        w.alignment = file.alignment;
        for t in &file.tensors {
            w.add_tensor(&t.name, &t.dims, t.ty, file.tensor_data(t).to_vec());
        }
        w
    }

    /// Drops a metadata key (if present).
    pub fn remove(&mut self, key: &str) -> &mut Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    /// Drops a tensor (if present).
    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|(n, ..)| n != name);
        self
    }

    pub fn set(&mut self, key: &str, value: GgufValue) -> &mut Self {
        if key == "general.alignment" {
            if let Some(a) = value.as_u64() {
                self.alignment = a.max(1);
            }
        }
        self.metadata.retain(|(k, _)| k != key);
        self.metadata.push((key.to_owned(), value));
        self
    }

    /// Adds a tensor with ggml dimensions `dims` (row length first) and its raw data.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_owned(), dims.to_vec(), ty, data));
        self
    }

    /// The file image, in GGUF `version` (2 or 3; they share a layout).
    pub fn to_bytes(&self, version: u32) -> Vec<u8> {
        let entries: Vec<TensorEntry> = self
            .tensors
            .iter()
            .map(|(name, dims, ty, data)| TensorEntry { name, dims, ty: *ty, n_bytes: data.len() as u64 })
            .collect();
        let header = self.header_for(version, &entries);
        let mut out = header.bytes;
        let base = out.len() as u64;
        for ((_, _, _, data), off) in self.tensors.iter().zip(header.data_offsets) {
            out.resize((base + off) as usize, 0);
            out.extend_from_slice(data);
        }
        pad(&mut out, self.alignment);
        out
    }

    /// The header of an image with this writer's metadata and the tensors `entries` (the writer's own
    /// tensors are not part of it), in GGUF `version`. The image is `bytes`, then each tensor's data at
    /// `bytes.len() + data_offsets[i]` with zeros in the gaps, then zeros up to a multiple of the alignment:
    /// exactly what [`GgufWriter::to_bytes`] writes for the same tensors.
    pub fn header_for(&self, version: u32, entries: &[TensorEntry]) -> ImageHeader {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut data_offsets = Vec::with_capacity(entries.len());
        for e in entries {
            put_str(&mut out, e.name);
            out.extend_from_slice(&(e.dims.len() as u32).to_le_bytes());
            for d in e.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&e.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            data_offsets.push(offset);
            offset = (offset + e.n_bytes).div_ceil(self.alignment) * self.alignment;
        }
        pad(&mut out, self.alignment);
        ImageHeader { bytes: out, data_offsets, alignment: self.alignment }
    }
}

/// Zeros up to a multiple of `alignment`.
fn pad(out: &mut Vec<u8>, alignment: u64) {
    while !(out.len() as u64).is_multiple_of(alignment) {
        out.push(0);
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(a) => put_array(out, a),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &GgufArray) {
    out.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! put_le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a.data() {
        ArrayData::U8(v) => out.extend_from_slice(v),
        ArrayData::I8(v) => put_le!(v),
        ArrayData::U16(v) => put_le!(v),
        ArrayData::I16(v) => put_le!(v),
        ArrayData::U32(v) => put_le!(v),
        ArrayData::I32(v) => put_le!(v),
        ArrayData::F32(v) => put_le!(v),
        ArrayData::Bool(v) => out.extend(v.iter().map(|&b| b as u8)),
        ArrayData::String(v) => v.iter().for_each(|s| put_str(out, s)),
        ArrayData::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
        ArrayData::U64(v) => put_le!(v),
        ArrayData::I64(v) => put_le!(v),
        ArrayData::F64(v) => put_le!(v),
    }
}

/// Shorthands for building metadata values.
impl GgufValue {
    pub fn str(s: &str) -> GgufValue {
        GgufValue::String(s.to_owned())
    }
    pub fn strs<S: AsRef<str>>(items: &[S]) -> GgufValue {
        let strings = items.iter().map(|s| s.as_ref().to_owned()).collect();
        GgufValue::Array(GgufArray::new(ArrayData::String(strings)))
    }
    pub fn f32s(items: &[f32]) -> GgufValue {
        GgufValue::Array(GgufArray::new(ArrayData::F32(items.to_vec())))
    }
    pub fn i32s(items: &[i32]) -> GgufValue {
        GgufValue::Array(GgufArray::new(ArrayData::I32(items.to_vec())))
    }
}
