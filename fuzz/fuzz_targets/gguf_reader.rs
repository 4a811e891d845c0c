//! Feeds arbitrary bytes to the GGUF reader. It must return an error or a file whose every tensor's data
//! and every metadata value can be read: no panic, no hang, no allocation out of proportion to the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata::gguf::{GgufFile, GgufValue};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let mut checksum = 0u64;
    for (key, value) in &file.metadata {
        assert!(
            file.get(key).is_some(),
            "metadata key {key:?} is not indexed"
        );
        checksum = checksum.wrapping_add(touch(value));
    }
    let file_bytes = file.file_bytes();
    for t in &file.tensors {
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes);
        assert!(t.file_offset + t.n_bytes <= file_bytes);
        assert!(
            file.tensor(&t.name).is_some(),
            "tensor {:?} is not indexed",
            t.name
        );
        checksum = checksum.wrapping_add(bytes.iter().map(|&b| b as u64).sum::<u64>());
        checksum = checksum
            .wrapping_add(t.n_elements())
            .wrapping_add(t.n_rows());
    }
    std::hint::black_box(checksum);
});

/// Reads a value through every accessor, recursing into arrays.
fn touch(value: &GgufValue) -> u64 {
    let mut sum = value.display_short().len() as u64;
    sum = sum.wrapping_add(value.as_u64().unwrap_or(0));
    sum = sum.wrapping_add(value.as_i64().unwrap_or(0) as u64);
    sum = sum.wrapping_add(value.as_f64().unwrap_or(0.0).to_bits());
    sum = sum.wrapping_add(value.as_bool().unwrap_or(false) as u64);
    sum = sum.wrapping_add(value.as_str().map_or(0, |s| s.len() as u64));
    if let Some(array) = value.as_array() {
        sum = sum.wrapping_add(array.strings().map_or(0, |s| s.len() as u64));
        sum = sum.wrapping_add(array.f32s().map_or(0, |v| v.len() as u64));
        sum = sum.wrapping_add(array.i64s().map_or(0, |v| v.len() as u64));
        for v in array.iter() {
            sum = sum.wrapping_add(touch(&v));
        }
    }
    sum
}
