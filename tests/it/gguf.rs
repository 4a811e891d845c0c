//! The GGUF reader through its public interface: images written by `GgufWriter` read back unchanged, a
//! corpus of corrupted images each gives the error kind and byte offset that name the problem (never a
//! panic), and the default model opens with the structure we know it has.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;

use strata::gguf::{ArrayData, GgufArray, GgufError, GgufErrorKind, GgufFile, GgufValue, GgufValueType, GgufWriter};
use strata::quant::GgmlType;

// ---------------------------------------------------------------------------------------------------------
// Helpers

/// Bytes that look random enough to catch a swapped or shifted tensor.
fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt)).collect()
}

/// Adds a tensor of type `ty` and dimensions `dims` whose data is a salted pattern of the right size.
fn add(w: &mut GgufWriter, name: &str, dims: &[u64], ty: GgmlType, salt: u8) -> Vec<u8> {
    let rows: u64 = dims[1..].iter().product();
    let n_bytes = ty.row_bytes(dims[0]).expect("whole blocks") * rows;
    let data = pattern(n_bytes as usize, salt);
    w.add_tensor(name, dims, ty, data.clone());
    data
}

fn arr(elem_type: GgufValueType, values: Vec<GgufValue>) -> GgufValue {
    GgufValue::Array(GgufArray::from_values(elem_type, values).expect("values of the element type"))
}

/// One value of every type, arrays of several element types, arrays nested two and three deep.
fn all_metadata() -> Vec<(String, GgufValue)> {
    use GgufValue as V;
    let nested = arr(
        GgufValueType::Array,
        vec![arr(GgufValueType::I32, vec![V::I32(1), V::I32(-2)]), arr(GgufValueType::I32, vec![]), {
            arr(GgufValueType::I32, vec![V::I32(i32::MIN)])
        }],
    );
    let deeper = arr(
        GgufValueType::Array,
        vec![arr(GgufValueType::Array, vec![arr(GgufValueType::String, vec![V::str("deep"), V::str("")])])],
    );
    let kv = [
        ("general.architecture", V::str("llama")),
        ("t.u8", V::U8(250)),
        ("t.i8", V::I8(-120)),
        ("t.u16", V::U16(65_000)),
        ("t.i16", V::I16(-32_000)),
        ("t.u32", V::U32(4_000_000_000)),
        ("t.i32", V::I32(-2_000_000_000)),
        ("t.f32", V::F32(-1.5e-7)),
        ("t.bool.true", V::Bool(true)),
        ("t.bool.false", V::Bool(false)),
        ("t.string", V::str("héllo, wörld \u{1F600}")),
        ("t.string.empty", V::str("")),
        ("t.u64", V::U64(u64::MAX)),
        ("t.i64", V::I64(i64::MIN)),
        ("t.f64", V::F64(std::f64::consts::PI)),
        ("t.array.strings", V::strs(&["a", "bc", ""])),
        ("t.array.f32", V::f32s(&[0.5, -0.25, f32::INFINITY])),
        ("t.array.u8", arr(GgufValueType::U8, vec![V::U8(0), V::U8(255)])),
        ("t.array.bool", arr(GgufValueType::Bool, vec![V::Bool(true), V::Bool(false)])),
        ("t.array.f64", arr(GgufValueType::F64, vec![V::F64(1e300)])),
        ("t.array.empty", arr(GgufValueType::U64, vec![])),
        ("t.array.nested", nested),
        ("t.array.nested3", deeper),
    ];
    kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// A tensor as written: name, dimensions, type, data.
type Written = (&'static str, Vec<u64>, GgmlType, Vec<u8>);

/// A writer with all metadata and tensors of several types; returns it with the expected tensors.
fn rich_writer() -> (GgufWriter, Vec<Written>) {
    let mut w = GgufWriter::new();
    for (k, v) in all_metadata() {
        w.set(&k, v);
    }
    let specs: [(&str, &[u64], GgmlType); 9] = [
        ("f32.vec", &[7], GgmlType::F32),
        ("f16.mat", &[5, 3], GgmlType::F16),
        ("bf16.mat", &[4, 2], GgmlType::BF16),
        ("q4_0.mat", &[64, 3], GgmlType::Q4_0),
        ("q4_1.mat", &[32, 2, 2], GgmlType::Q4_1),
        ("q8_0.mat", &[96, 1], GgmlType::Q8_0),
        ("q4_k.mat", &[256, 2], GgmlType::Q4K),
        ("q6_k.4d", &[256, 1, 2, 1], GgmlType::Q6K),
        ("empty", &[0, 3], GgmlType::F32),
    ];
    let mut want = Vec::new();
    for (i, (name, dims, ty)) in specs.into_iter().enumerate() {
        let data = add(&mut w, name, dims, ty, i as u8 * 17);
        want.push((name, dims.to_vec(), ty, data));
    }
    (w, want)
}

fn parse_err(bytes: Vec<u8>) -> GgufError {
    match GgufFile::from_bytes(bytes) {
        Ok(f) => panic!("a corrupt image was accepted: {f:?}"),
        Err(e) => e,
    }
}

/// The error is reported at `offset`, and its message says so and contains each of `words`.
fn check_message(e: &GgufError, offset: u64, words: &[&str]) {
    let msg = e.to_string();
    assert_eq!(e.offset, offset, "wrong offset in {msg:?}");
    assert!(msg.contains(&format!("at byte offset {offset}")), "{msg:?} does not name offset {offset}");
    for w in words {
        assert!(msg.contains(w), "{msg:?} does not mention {w:?}");
    }
}

/// A hand-made image, for corruptions the writer cannot produce. The header is 24 bytes.
struct Raw(Vec<u8>);

const HEADER_BYTES: u64 = 24;

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw(b"GGUF".to_vec()).u32(version).u64(n_tensors).u64(n_kv)
    }
    fn pos(&self) -> u64 {
        self.0.len() as u64
    }
    fn u32(mut self, v: u32) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key).u32(GgufValueType::U32 as u32).u32(v)
    }
    fn tensor(self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(type_id).u64(offset)
    }
    /// Pads to 32 bytes and appends `n` bytes of tensor data.
    fn data(mut self, n: usize) -> Raw {
        while !self.0.len().is_multiple_of(32) {
            self.0.push(0);
        }
        self.0.extend(pattern(n, 1));
        self
    }
}

// ---------------------------------------------------------------------------------------------------------
// Round trips

#[test]
fn every_value_type_and_tensor_type_round_trips_in_v2_and_v3() {
    let (w, want) = rich_writer();
    for version in [2, 3] {
        let bytes = w.to_bytes(version);
        let n_file = bytes.len() as u64;
        let f = GgufFile::from_bytes(bytes).unwrap_or_else(|e| panic!("v{version}: {e}"));
        assert_eq!(f.version, version);
        assert_eq!(f.alignment, 32);
        assert_eq!(f.file_bytes(), n_file);
        assert_eq!(f.metadata, all_metadata(), "metadata differs (values or order) in v{version}");
        for (k, v) in all_metadata() {
            assert_eq!(f.get(&k), Some(&v), "{k}");
        }
        assert_eq!(f.get("no.such.key"), None);
        assert_eq!(f.data_offset % 32, 0);
        assert_eq!(f.tensors.len(), want.len());
        for (t, (name, dims, ty, data)) in f.tensors.iter().zip(&want) {
            assert_eq!(&t.name, name);
            assert_eq!(&t.dims, dims, "{name}");
            assert_eq!(t.ty, *ty, "{name}");
            assert_eq!(t.n_bytes, data.len() as u64, "{name}");
            assert_eq!(t.file_offset % 32, 0, "{name} is not aligned");
            assert_eq!(f.tensor_data(t), &data[..], "{name}: data differs");
            assert_eq!(f.tensor(name).map(|t| &t.name), Some(&t.name));
            assert_eq!(t.n_elements(), dims.iter().product::<u64>());
        }
    }
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = GgufWriter::new();
    w.set("general.alignment", GgufValue::U32(256));
    let a = add(&mut w, "a", &[3], GgmlType::F32, 1);
    let b = add(&mut w, "b", &[5], GgmlType::F32, 2);
    let f = GgufFile::from_bytes(w.to_bytes(3)).expect("valid image");
    assert_eq!(f.alignment, 256);
    assert_eq!(f.data_offset % 256, 0);
    let (ta, tb) = (f.tensor("a").expect("a"), f.tensor("b").expect("b"));
    assert_eq!(tb.file_offset - ta.file_offset, 256);
    assert_eq!((f.tensor_data(ta), f.tensor_data(tb)), (&a[..], &b[..]));
}

#[test]
fn metadata_only_image_opens() {
    let mut w = GgufWriter::new();
    w.set("general.name", GgufValue::str("none"));
    let f = GgufFile::from_bytes(w.to_bytes(3)).expect("valid image");
    assert!(f.tensors.is_empty());
    assert_eq!(f.get("general.name").and_then(|v| v.as_str()), Some("none"));
}

// ---------------------------------------------------------------------------------------------------------
// Corrupted images

#[test]
fn bad_magic() {
    let mut bytes = GgufWriter::new().to_bytes(3);
    bytes[3] = b'X';
    let e = parse_err(bytes);
    assert!(matches!(e.kind, GgufErrorKind::BadMagic), "{e}");
    check_message(&e, 0, &["not a GGUF file", "GGUF signature"]);
    // The message quotes none of the file's bytes: a path to a file the user cannot read (/etc/shadow
    // begins with "root") must not tell them how it begins.
    let e = parse_err(b"root:$6$secret\n\x03\x00\x00\x00".to_vec());
    let msg = e.to_string();
    assert!(matches!(e.kind, GgufErrorKind::BadMagic), "{msg}");
    assert!(!msg.contains("root") && !msg.contains("secret"), "{msg}");
    assert!(!format!("{e:?}").contains("root"), "{e:?}");
}

#[test]
fn unsupported_versions() {
    for version in [0, 1, 4, u32::MAX] {
        let e = parse_err(GgufWriter::new().to_bytes(version));
        assert!(matches!(e.kind, GgufErrorKind::UnsupportedVersion(v) if v == version), "{e}");
        check_message(&e, 4, &["unsupported GGUF version", &version.to_string()]);
    }
}

#[test]
fn every_truncation_is_an_error() {
    // The last tensor's data is a whole number of alignment units, so the image has no trailing padding
    // and every byte of it is needed.
    let mut w = GgufWriter::new();
    w.set("general.architecture", GgufValue::str("llama"));
    w.set("a.list", GgufValue::strs(&["x", "yz"]));
    w.set("a.nested", arr(GgufValueType::Array, vec![GgufValue::i32s(&[1, 2])]));
    w.set("a.f", GgufValue::F64(2.0));
    add(&mut w, "w", &[32, 1], GgmlType::Q8_0, 3);
    add(&mut w, "v", &[8], GgmlType::F32, 4);
    let full = w.to_bytes(3);
    GgufFile::from_bytes(full.clone()).expect("the full image is valid");
    for len in 0..full.len() {
        let e = parse_err(full[..len].to_vec());
        assert!(
            matches!(
                e.kind,
                GgufErrorKind::Truncated { .. }
                    | GgufErrorKind::DataOutOfBounds { .. }
                    | GgufErrorKind::TooLarge { .. }
            ),
            "prefix of {len} bytes: {e}"
        );
        assert!(e.offset <= len as u64, "prefix of {len} bytes: error beyond the end: {e}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("at byte offset {}", e.offset)), "{msg}");
    }
    // A cut inside the second key ("a.list", after the 45 bytes of the first pair) reports what was
    // being read, how much it needed, and where.
    let key_at = HEADER_BYTES + 45 + 8;
    let e = parse_err(full[..key_at as usize + 2].to_vec());
    assert!(matches!(e.kind, GgufErrorKind::Truncated { what: "metadata key", needed: 6, available: 2 }), "{e}");
    check_message(&e, key_at, &["truncated", "metadata key needs at least 6 bytes", "ends 2 bytes later"]);
}

#[test]
fn tensor_data_out_of_bounds() {
    let raw = Raw::header(3, 1, 0).tensor("t", &[8], GgmlType::F32.id(), 64).data(32);
    let n_file = raw.pos();
    let e = parse_err(raw.0);
    let data_offset = 64; // header (24) + tensor info (8 + 1 + 4 + 8 + 4 + 8 = 33), aligned to 32
    match &e.kind {
        GgufErrorKind::DataOutOfBounds { name, start, end, file_bytes, expected_bytes } => {
            assert_eq!((name.as_str(), *start, *end, *file_bytes), ("t", data_offset + 64, data_offset + 96, n_file));
            // The size a complete file would have: the end of its last tensor's data.
            assert_eq!(*expected_bytes, data_offset + 96);
        }
        _ => panic!("{e}"),
    }
    check_message(&e, HEADER_BYTES, &["\"t\"", "outside the file"]);

    // An offset so large that offset + size overflows u64 is out of bounds too, not a wrap-around.
    let raw = Raw::header(3, 1, 0).tensor("t", &[8], GgmlType::F32.id(), u64::MAX - 31).data(32);
    let e = parse_err(raw.0);
    assert!(matches!(e.kind, GgufErrorKind::DataOutOfBounds { .. }), "{e}");
    check_message(&e, HEADER_BYTES, &["outside the file"]);
}

#[test]
fn unknown_tensor_type() {
    // 4 was Q4_2, removed from ggml; 1000 was never anything.
    for type_id in [4, 1000, u32::MAX] {
        let raw = Raw::header(3, 1, 0).tensor("t", &[8], type_id, 0).data(32);
        let e = parse_err(raw.0);
        assert!(
            matches!(&e.kind, GgufErrorKind::UnknownTensorType { name, type_id: t } if name == "t" && *t == type_id),
            "{e}"
        );
        // At the type field: header, name (8 + 1), n_dims (4), one dim (8).
        check_message(&e, HEADER_BYTES + 21, &["unknown tensor type", &type_id.to_string()]);
    }
}

#[test]
fn unknown_value_type() {
    let raw = Raw::header(3, 0, 1).str("k").u32(13).u32(0);
    let e = parse_err(raw.0);
    assert!(matches!(e.kind, GgufErrorKind::UnknownValueType(13)), "{e}");
    check_message(&e, HEADER_BYTES + 9, &["unknown metadata value type 13"]);

    // The element type of an array.
    let raw = Raw::header(3, 0, 1).str("k").u32(GgufValueType::Array as u32).u32(99).u64(0);
    let e = parse_err(raw.0);
    assert!(matches!(e.kind, GgufErrorKind::UnknownValueType(99)), "{e}");
    check_message(&e, HEADER_BYTES + 13, &["unknown metadata value type 99"]);
}

#[test]
fn dims_whose_product_overflows() {
    let dims = [1 << 32, 1 << 32, 1 << 32];
    let raw = Raw::header(3, 1, 0).tensor("big", &dims, GgmlType::F32.id(), 0).data(32);
    let e = parse_err(raw.0);
    assert!(matches!(&e.kind, GgufErrorKind::BadShape { name, dims: d, .. } if name == "big" && d == &dims), "{e}");
    check_message(&e, HEADER_BYTES, &["\"big\"", "does not fit type f32"]);

    // A row length that overflows on its own (4 bytes per f32).
    let raw = Raw::header(3, 1, 0).tensor("row", &[1 << 62], GgmlType::F32.id(), 0).data(32);
    assert!(matches!(parse_err(raw.0).kind, GgufErrorKind::BadShape { .. }));

    // Rows that are not whole blocks.
    let raw = Raw::header(3, 1, 0).tensor("q", &[31, 2], GgmlType::Q4_0.id(), 0).data(64);
    let e = parse_err(raw.0);
    assert!(matches!(e.kind, GgufErrorKind::BadShape { ty: GgmlType::Q4_0, .. }), "{e}");
    check_message(&e, HEADER_BYTES, &["q4_0", "whole blocks"]);
}

#[test]
fn counts_and_lengths_of_u64_max() {
    let e = parse_err(Raw::header(3, u64::MAX, 0).0);
    assert!(matches!(e.kind, GgufErrorKind::TooLarge { what: "tensor count", value: u64::MAX }), "{e}");
    check_message(&e, 8, &["tensor count is too large", &u64::MAX.to_string()]);

    let e = parse_err(Raw::header(3, 0, u64::MAX).0);
    assert!(matches!(e.kind, GgufErrorKind::TooLarge { what: "metadata count", value: u64::MAX }), "{e}");
    check_message(&e, 16, &["metadata count is too large"]);

    // A count that is merely more than the file can hold is the file ending early, refused before
    // allocating, at the offset where the file's bytes run out.
    let e = parse_err(Raw::header(3, 0, 1_000_000).kv_u32("k", 1).0);
    assert!(
        matches!(e.kind, GgufErrorKind::Truncated { what: "the metadata", needed: 13_000_000, available: 17 }),
        "{e}"
    );
    check_message(&e, HEADER_BYTES, &["the file ends early", "the metadata needs at least 13000000 bytes"]);

    let array_at = HEADER_BYTES + 9 + 4 + 4; // key "k", value type, element type
    let e = parse_err(Raw::header(3, 0, 1).str("k").u32(9).u32(GgufValueType::U8 as u32).u64(u64::MAX).0);
    assert!(matches!(e.kind, GgufErrorKind::TooLarge { what: "array length", value: u64::MAX }), "{e}");
    check_message(&e, array_at, &["array length is too large"]);
    // Arrays of strings and of arrays: the per-element minimum must not overflow either.
    for elem in [GgufValueType::String, GgufValueType::Array, GgufValueType::U64] {
        let e = parse_err(Raw::header(3, 0, 1).str("k").u32(9).u32(elem as u32).u64(u64::MAX / 4).0);
        assert!(matches!(e.kind, GgufErrorKind::TooLarge { what: "array length", .. }), "{elem:?}: {e}");
    }

    // String lengths: a key, a string value, a tensor name.
    let e = parse_err(Raw::header(3, 0, 1).u64(u64::MAX).bytes(&[0; 16]).0);
    assert!(matches!(e.kind, GgufErrorKind::TooLarge { what: "string length", value: u64::MAX }), "{e}");
    check_message(&e, HEADER_BYTES, &["string length is too large"]);
    let e = parse_err(Raw::header(3, 0, 1).str("k").u32(8).u64(u64::MAX).bytes(&[0; 16]).0);
    assert!(matches!(e.kind, GgufErrorKind::TooLarge { what: "string length", .. }), "{e}");
    check_message(&e, HEADER_BYTES + 13, &["string length"]);
    let e = parse_err(Raw::header(3, 1, 0).u64(u64::MAX).bytes(&[0; 32]).0);
    assert!(matches!(e.kind, GgufErrorKind::TooLarge { what: "string length", .. }), "{e}");
    check_message(&e, HEADER_BYTES, &["string length"]);
    // A length under the cap but beyond the file is a truncation.
    let e = parse_err(Raw::header(3, 0, 1).u64(1000).bytes(b"abc").bytes(&[0; 16]).0);
    assert!(matches!(e.kind, GgufErrorKind::Truncated { what: "metadata key", needed: 1000, .. }), "{e}");
    check_message(&e, HEADER_BYTES + 8, &["truncated"]);
}

#[test]
fn misaligned_offsets() {
    let raw = Raw::header(3, 1, 0).tensor("t", &[8], GgmlType::F32.id(), 7).data(64);
    let e = parse_err(raw.0);
    assert!(matches!(&e.kind, GgufErrorKind::Misaligned { name, offset: 7, alignment: 32 } if name == "t"), "{e}");
    check_message(&e, HEADER_BYTES, &["\"t\"", "not a multiple of the alignment 32"]);

    // With general.alignment = 64, an offset of 32 is misaligned.
    let raw = Raw::header(3, 1, 1).kv_u32("general.alignment", 64);
    let at = raw.pos();
    let raw = raw.tensor("t", &[8], GgmlType::F32.id(), 32).data(128);
    let e = parse_err(raw.0);
    assert!(matches!(e.kind, GgufErrorKind::Misaligned { offset: 32, alignment: 64, .. }), "{e}");
    check_message(&e, at, &["alignment 64"]);
}

#[test]
fn bad_alignment_value() {
    // Powers of two above 1 GiB are refused too: no file needs them, and they would make padding absurd.
    for a in [0, 3, 48, 1 << 31] {
        let e = parse_err(Raw::header(3, 0, 1).kv_u32("general.alignment", a).0);
        assert!(matches!(e.kind, GgufErrorKind::BadAlignment(v) if v == a as u64), "{e}");
        check_message(&e, 16, &["not a power of two"]);
    }
}

#[test]
fn dimension_counts_other_than_one_to_four() {
    for dims in [&[][..], &[32, 1, 1, 1, 1][..]] {
        let raw = Raw::header(3, 1, 0).tensor("t", dims, GgmlType::F32.id(), 0).data(128);
        let e = parse_err(raw.0);
        let n = dims.len() as u32;
        assert!(matches!(&e.kind, GgufErrorKind::BadDims { name, n_dims } if name == "t" && *n_dims == n), "{e}");
        check_message(&e, HEADER_BYTES, &[&format!("has {n} dimensions"), "at most 4"]);
    }
}

#[test]
fn duplicate_keys_and_tensor_names() {
    let raw = Raw::header(3, 0, 2).kv_u32("dup", 1);
    let second = raw.pos();
    let e = parse_err(raw.kv_u32("dup", 2).0);
    assert!(matches!(&e.kind, GgufErrorKind::Duplicate { what: "metadata key", name } if name == "dup"), "{e}");
    check_message(&e, second, &["duplicate metadata key \"dup\""]);

    let raw = Raw::header(3, 2, 0).tensor("t", &[8], GgmlType::F32.id(), 0);
    let second = raw.pos();
    let e = parse_err(raw.tensor("t", &[8], GgmlType::F32.id(), 32).data(64).0);
    assert!(matches!(&e.kind, GgufErrorKind::Duplicate { what: "tensor name", name } if name == "t"), "{e}");
    check_message(&e, second, &["duplicate tensor name \"t\""]);
}

#[test]
fn bad_utf8_bool_and_nesting() {
    let e = parse_err(Raw::header(3, 0, 1).u64(2).bytes(&[0xC3, 0x28]).u32(4).u32(0).0);
    assert!(matches!(e.kind, GgufErrorKind::BadUtf8 { what: "metadata key" }), "{e}");
    check_message(&e, HEADER_BYTES + 8, &["not valid UTF-8"]);

    let e = parse_err(Raw::header(3, 0, 1).str("b").u32(GgufValueType::Bool as u32).bytes(&[2]).0);
    assert!(matches!(e.kind, GgufErrorKind::TooLarge { what: "bool value", value: 2 }), "{e}");
    check_message(&e, HEADER_BYTES + 13, &["bool value"]);

    // Arrays nested nine deep (the reader allows eight).
    let mut raw = Raw::header(3, 0, 1).str("n").u32(9);
    for _ in 0..9 {
        raw = raw.u32(9).u64(1);
    }
    let raw = raw.u32(4).u64(0).bytes(&[0; 64]);
    let e = parse_err(raw.0);
    assert!(matches!(e.kind, GgufErrorKind::TooDeep(8)), "{e}");
    check_message(&e, HEADER_BYTES + 13 + 8 * 12, &["nested deeper than 8"]);
}

/// A tensor with a zero dimension has no data, so the reader accepts its shape however large the other
/// dimensions are, but `n_elements()` and `n_rows()` multiply the dimensions in order: 2^63 * 2 (or
/// 2^40 * 2^40) overflows before the 0 is reached, which panics in debug builds (tests, fuzzing) and
/// wraps in release (2^80 rows is not a u64 at all). The reader should refuse a shape whose element
/// count overflows u64 at any step, as its `BadShape` message promises ("size must not overflow") and as
/// llama.cpp does. Found by reading the reader; the fuzz target hits both within seconds.
#[test]
fn shape_whose_element_count_overflows_is_refused_even_when_empty() {
    let cases: [(&[u64], GgmlType); 2] = [(&[1 << 63, 2, 0], GgmlType::Q4_0), (&[0, 1 << 40, 1 << 40], GgmlType::F32)];
    for (dims, ty) in cases {
        let raw = Raw::header(3, 1, 0).tensor("z", dims, ty.id(), 0).data(32);
        match GgufFile::from_bytes(raw.0) {
            Err(e) => {
                assert!(matches!(e.kind, GgufErrorKind::BadShape { .. }), "{dims:?}: {e}");
                check_message(&e, HEADER_BYTES, &["\"z\"", "overflow"]);
            }
            Ok(f) => panic!("{dims:?} accepted: n_bytes {}, and n_elements()/n_rows() overflow", f.tensors[0].n_bytes),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Memory in proportion to the file

/// Counts the bytes each thread has allocated and not yet freed, and the peak since the last reset, so
/// that a test (one thread) can measure what parsing an image costs while other tests run alongside.
struct PeakPerThread;

thread_local! {
    static LIVE_BYTES: Cell<u64> = const { Cell::new(0) };
    static PEAK_BYTES: Cell<u64> = const { Cell::new(0) };
}

fn count(grow: u64, shrink: u64) {
    let _ = LIVE_BYTES.try_with(|live| {
        let now = (live.get() + grow).saturating_sub(shrink);
        live.set(now);
        let _ = PEAK_BYTES.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is passed to `System` unchanged; the counters use const-initialised thread locals,
// which neither allocate nor run destructors.
unsafe impl GlobalAlloc for PeakPerThread {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as u64, 0);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(0, layout.size() as u64);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as u64, layout.size() as u64);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: PeakPerThread = PeakPerThread;

/// Parses `bytes` and returns the result with the peak bytes this thread held meanwhile, beyond what it
/// held before (the image itself is moved in, not copied).
fn parse_measured(bytes: Vec<u8>) -> (Result<GgufFile, GgufError>, u64) {
    let before = LIVE_BYTES.with(Cell::get);
    PEAK_BYTES.with(|p| p.set(before));
    let result = GgufFile::from_bytes(bytes);
    (result, PEAK_BYTES.with(Cell::get) - before)
}

/// A metadata-only image whose single value is an array of `elem` with `n` elements of `elem_bytes`.
fn array_image(elem: GgufValueType, n: u64, elements: &[u8]) -> Vec<u8> {
    Raw::header(3, 0, 1).str("a").u32(GgufValueType::Array as u32).u32(elem as u32).u64(n).bytes(elements).0
}

/// Each element of an array takes about as many bytes in memory as in the file. Before arrays were stored
/// by type, every element was a 32-byte `GgufValue`: a 4 MiB u8 array took 128 MiB, and a corrupted
/// length in a 4 GiB model would have asked for 128 GiB, which aborts the process.
#[test]
fn arrays_take_memory_in_proportion_to_their_file_bytes() {
    const N: usize = 4 << 20;
    let elements = pattern(N, 9);
    let (f, peak) = parse_measured(array_image(GgufValueType::U8, N as u64, &elements));
    let f = f.expect("a 4 MiB u8 array parses");
    let a = f.get("a").and_then(GgufValue::as_array).expect("an array");
    assert!(matches!(a.data(), ArrayData::U8(v) if v == &elements));
    assert_eq!(a.len(), N);
    assert_eq!(a.get(N - 1), Some(GgufValue::U8(elements[N - 1])));
    assert_eq!(a.get(N), None);
    assert!(peak < N as u64 + (64 << 10), "{peak} bytes to parse {N} u8 values");

    // Wider numbers and bools are stored as themselves too.
    let cases: [(GgufValueType, u64); 4] =
        [(GgufValueType::I16, 2), (GgufValueType::F32, 4), (GgufValueType::F64, 8), (GgufValueType::Bool, 1)];
    for (elem, width) in cases {
        let n = 1 << 16;
        let (f, peak) = parse_measured(array_image(elem, n, &vec![0; (n * width) as usize]));
        let f = f.unwrap_or_else(|e| panic!("{elem:?}: {e}"));
        let a = f.get("a").and_then(GgufValue::as_array).expect("an array");
        assert_eq!((a.elem_type(), a.len()), (elem, n as usize));
        assert!(peak < n * width + (64 << 10), "{elem:?}: {peak} bytes");
    }

    // Empty strings are the worst case: 8 bytes in the file, a 24-byte `String` in memory.
    let n = 1 << 16;
    let (f, peak) = parse_measured(array_image(GgufValueType::String, n, &vec![0; n as usize * 8]));
    let f = f.expect("empty strings parse");
    let a = f.get("a").and_then(GgufValue::as_array).expect("an array");
    assert!(matches!(a.data(), ArrayData::String(v) if v.len() == n as usize));
    assert!(peak <= 3 * 8 * n + (64 << 10), "{peak} bytes for {n} empty strings");
}

/// A declared length the file cannot hold is refused before anything is allocated for it, and a length it
/// could hold but whose elements are garbage costs no more than the bytes left allow.
#[test]
fn huge_array_lengths_fail_fast_and_small() {
    for (elem, width) in [(GgufValueType::U8, 1), (GgufValueType::U64, 8)] {
        let (e, peak) = parse_measured(array_image(elem, 1 << 40, &[0; 64]));
        let e = e.expect_err("a 2^40-element array in a 100-byte file");
        assert!(matches!(e.kind, GgufErrorKind::TooLarge { what: "array length", value } if value == 1 << 40), "{e}");
        assert!(peak < 4096, "{elem:?}: {peak} bytes");
        // One element more than the rest of the file holds: the file ends early.
        let (e, _) = parse_measured(array_image(elem, 64 / width + 1, &[0; 64]));
        assert!(matches!(e.map(|_| ()).unwrap_err().kind, GgufErrorKind::Truncated { what: "a metadata array", .. }));
    }
    // 2^17 strings of which the first claims to be 2^64-1 bytes long.
    let garbage = vec![0xff; 1 << 20];
    let (e, peak) = parse_measured(array_image(GgufValueType::String, 1 << 17, &garbage));
    let e = e.expect_err("garbage strings");
    assert!(matches!(e.kind, GgufErrorKind::TooLarge { what: "string length", .. }), "{e}");
    assert!(peak <= 3 * garbage.len() as u64 + 4096, "{peak} bytes");
    // Arrays of arrays, nested to the limit, each declaring as many inner arrays as the rest could hold
    // (2^18 of at least 12 bytes): reserved in full that would be 8 MiB per level, 64 MiB in all, for a
    // 4 MiB file. Reservations must not pile up level on level.
    let mut raw = Raw::header(3, 0, 1).str("n").u32(GgufValueType::Array as u32);
    for _ in 0..8 {
        raw = raw.u32(GgufValueType::Array as u32).u64(1 << 18);
    }
    let garbage = vec![0xff; 4 << 20];
    let (e, peak) = parse_measured(raw.bytes(&garbage).0);
    assert!(e.is_err());
    assert!(peak < garbage.len() as u64 / 2, "{peak} bytes");
}

#[test]
fn array_accessors() {
    let strings = GgufValue::strs(&["a", "bc"]);
    let a = strings.as_array().expect("an array");
    assert_eq!(a.elem_type(), GgufValueType::String);
    assert_eq!(a.strings(), Some(vec!["a", "bc"]));
    assert_eq!(a.get_str(1), Some("bc"));
    assert_eq!(a.get(0), Some(GgufValue::str("a")));
    assert_eq!((a.f32s(), a.i64s()), (None, None));
    assert_eq!(strings.display_short(), r#"["a", "bc"]"#);

    let ints = GgufValue::i32s(&(0..20).collect::<Vec<_>>());
    let a = ints.as_array().expect("an array");
    assert_eq!(a.i64s(), Some((0..20).collect()));
    assert_eq!(a.f32s(), Some((0..20).map(|x| x as f32).collect()));
    assert_eq!((a.strings(), a.get_str(0)), (None, None));
    assert_eq!(a.iter().nth(3), Some(GgufValue::I32(3)));
    assert_eq!(ints.display_short(), "[0, 1, 2, 3, ... (20 I32 values)]");

    // An empty array is an empty list of anything, as before arrays were stored by type.
    let empty = GgufArray::new(ArrayData::Bool(Vec::new()));
    assert!(empty.is_empty());
    assert_eq!(empty.strings(), Some(vec![]));
    assert_eq!(empty.f32s(), Some(vec![]));
    // Bools and u64 above i64::MAX are not numbers for f32s/i64s, as single values are not.
    assert_eq!(GgufArray::new(ArrayData::Bool(vec![true])).i64s(), None);
    assert_eq!(GgufArray::new(ArrayData::U64(vec![u64::MAX])).i64s(), None);
    assert_eq!(GgufArray::from_values(GgufValueType::U8, vec![GgufValue::I8(1)]), None);
}

// ---------------------------------------------------------------------------------------------------------
// The default model

#[test]
fn default_model_has_the_known_structure() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-model to download it", path.display());
    let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.file_bytes(), 98_362_432);
    assert_eq!(f.get("general.architecture").and_then(|v| v.as_str()), Some("llama"));
    assert_eq!(f.get("llama.block_count").and_then(|v| v.as_u64()), Some(30));
    assert_eq!(f.tensors.len(), 272);
    let mut by_type: HashMap<GgmlType, usize> = HashMap::new();
    for t in &f.tensors {
        *by_type.entry(t.ty).or_default() += 1;
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        assert_eq!(t.file_offset % 32, 0, "{}", t.name);
    }
    assert_eq!(by_type.get(&GgmlType::Q4_1), Some(&210));
    assert_eq!(by_type.get(&GgmlType::Q8_0), Some(&1));
    assert_eq!(by_type.get(&GgmlType::F32), Some(&61));
    assert_eq!(by_type.len(), 3, "{by_type:?}");
    // The last tensor's data ends at the end of the file (give or take alignment padding).
    let end = f.tensors.iter().map(|t| t.file_offset + t.n_bytes).max().unwrap_or(0);
    assert!(f.file_bytes() - end < 32, "data ends at {end}");
}

// ---------------------------------------------------------------------------------------------------------
// Header images (a file planned before it is downloaded)

#[test]
fn a_header_image_plans_as_the_whole_file_and_a_short_one_asks_for_more() {
    use std::sync::Arc;
    use strata::model::synthetic::SyntheticSpec;
    use strata::model::LoadOptions;
    let bytes = SyntheticSpec::default().to_gguf();
    let whole = Arc::new(GgufFile::from_bytes(bytes.clone()).expect("parses"));
    let header_len = whole.data_offset as usize;
    let image = GgufFile::from_header(bytes[..header_len].to_vec(), bytes.len() as u64).expect("the header parses");
    assert!(image.is_header_image() && !whole.is_header_image());
    assert_eq!(image.file_bytes(), whole.file_bytes());
    assert_eq!(image.metadata, whole.metadata);
    assert_eq!(format!("{:?}", image.tensors), format!("{:?}", whole.tensors));
    // Data it lacks reads as zeros of the tensor's size.
    let norm = image.tensor("blk.0.attn_norm.weight").expect("a norm");
    assert_eq!(image.tensor_data(norm), vec![0u8; norm.n_bytes as usize].as_slice());
    let image = Arc::new(image);
    let opts = LoadOptions { max_context: Some(512), ..Default::default() };
    let (a, b) = (
        strata::plan::plan(&whole, &opts, None).expect("plan"),
        strata::plan::plan(&image, &opts, None).expect("plan"),
    );
    assert_eq!(serde_json::to_value(&a.rows).unwrap(), serde_json::to_value(&b.rows).unwrap());
    assert_eq!((a.fits, a.tokens), (b.fits, b.tokens));
    // A prefix that ends inside the tensor index says so; a file size that the index does not fit is refused.
    let e = GgufFile::from_header(bytes[..header_len - 40].to_vec(), bytes.len() as u64).unwrap_err();
    assert!(matches!(e.kind, GgufErrorKind::Truncated { .. }), "{e}");
    let e = GgufFile::from_header(bytes[..header_len].to_vec(), bytes.len() as u64 - 1).unwrap_err();
    assert!(matches!(e.kind, GgufErrorKind::DataOutOfBounds { .. }), "{e}");
}

/// A file's fingerprint (what the conversation cache keys snapshots by) is the same each time it is read
/// and differs between two models whose headers are byte-identical but whose weights are not (two
/// fine-tunes of one model), and between a file and its header image.
#[test]
fn two_files_with_one_header_and_other_weights_have_other_fingerprints() {
    use strata::model::synthetic::SyntheticSpec;
    let a = SyntheticSpec { seed: 1, ..Default::default() }.to_gguf();
    let b = SyntheticSpec { seed: 2, ..Default::default() }.to_gguf();
    let (fa, fb) = (GgufFile::from_bytes(a.clone()).unwrap(), GgufFile::from_bytes(b).unwrap());
    assert_eq!(fa.data_offset, fb.data_offset);
    assert_eq!(fa.metadata, fb.metadata, "the two headers are meant to be the same");
    assert_ne!(fa.fingerprint(), fb.fingerprint());
    assert_eq!(fa.fingerprint(), GgufFile::from_bytes(a.clone()).unwrap().fingerprint());
    let header = a[..fa.data_offset as usize].to_vec();
    let image = GgufFile::from_header(header, a.len() as u64).unwrap();
    assert_ne!(image.fingerprint(), fa.fingerprint());
}

// ---------------------------------------------------------------------------------------------------------
// Fuzzing seeds

/// Rewrites the seed corpus of the `gguf_reader` fuzz target (`fuzz/seeds/gguf_reader`): small valid images
/// that reach every part of the reader. Run with `--ignored` after changing the writer or the format.
#[test]
#[ignore = "a tool, not a check: regenerates fuzz/seeds (cargo test --test it -- --ignored gguf::write_fuzz_seeds)"]
fn write_fuzz_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/gguf_reader");
    std::fs::create_dir_all(&dir).expect("create the seed directory");
    let (rich, _) = rich_writer();
    let mut small = GgufWriter::new();
    small.set("general.architecture", GgufValue::str("llama"));
    small.set("general.alignment", GgufValue::U32(64));
    add(&mut small, "q", &[32, 2], GgmlType::Q4_1, 5);
    add(&mut small, "f", &[4], GgmlType::F32, 6);
    let mut meta = GgufWriter::new();
    meta.set("tokens", GgufValue::strs(&["<s>", "</s>", "a"]));
    meta.set("nested", all_metadata().remove(21).1);
    let seeds = [
        ("rich_v3.gguf", rich.to_bytes(3)),
        ("rich_v2.gguf", rich.to_bytes(2)),
        ("small_v3.gguf", small.to_bytes(3)),
        ("metadata_only_v3.gguf", meta.to_bytes(3)),
    ];
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).expect("write a seed");
    }
}
