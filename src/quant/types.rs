//! The table of ggml tensor types Strata understands: their on-disk ids, block sizes and block byte sizes.
//!
//! This module owns only layout facts; it never touches data. The ids are ggml's (`enum ggml_type`), so a
//! GGUF tensor's raw type number maps here directly, and an unknown number stays an error for the caller.

/// A ggml tensor type. Block formats store `block_len()` values in `block_bytes()` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    BF16,
}

/// Values per super-block of the K-quants.
pub const QK_K: usize = 256;
/// Values per block of the legacy quants (Q4_0 .. Q8_1).
pub const QK: usize = 32;

impl GgmlType {
    /// Every type, in id order.
    pub const ALL: [GgmlType; 13] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::BF16,
    ];

    /// The types a model's weights may use (Q8_1 and Q8_K are activation formats only).
    pub const WEIGHT_TYPES: [GgmlType; 11] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
    ];

    /// The ggml id of this type, as stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Q8K => 15,
            GgmlType::BF16 => 30,
        }
    }

    /// The type with ggml id `id`, or `None` for ids Strata does not support.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The ggml name of this type ("q4_1", "f16", ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q8_1 => "q8_1",
            GgmlType::Q4K => "q4_K",
            GgmlType::Q5K => "q5_K",
            GgmlType::Q6K => "q6_K",
            GgmlType::Q8K => "q8_K",
            GgmlType::BF16 => "bf16",
        }
    }

    /// Values per block.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => QK,
            GgmlType::Q8_0 | GgmlType::Q8_1 => QK,
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K | GgmlType::Q8K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + QK / 2,
            GgmlType::Q4_1 => 4 + QK / 2,
            GgmlType::Q5_0 => 2 + 4 + QK / 2,
            GgmlType::Q5_1 => 4 + 4 + QK / 2,
            GgmlType::Q8_0 => 2 + QK,
            GgmlType::Q8_1 => 4 + QK,
            GgmlType::Q4K => 2 + 2 + 12 + QK_K / 2,
            GgmlType::Q5K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            GgmlType::Q6K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            GgmlType::Q8K => 4 + QK_K + QK_K / 16 * 2,
        }
    }

    /// Bytes of a row of `n_values` values, or `None` when `n_values` is not a whole number of blocks
    /// or the size overflows.
    pub fn row_bytes(self, n_values: u64) -> Option<u64> {
        let len = self.block_len() as u64;
        if !n_values.is_multiple_of(len) {
            return None;
        }
        (n_values / len).checked_mul(self.block_bytes() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_ggml() {
        // ggml's sizeof(block_*) for each type.
        let want = [
            (GgmlType::Q4_0, 18),
            (GgmlType::Q4_1, 20),
            (GgmlType::Q5_0, 22),
            (GgmlType::Q5_1, 24),
            (GgmlType::Q8_0, 34),
            (GgmlType::Q8_1, 36),
            (GgmlType::Q4K, 144),
            (GgmlType::Q5K, 176),
            (GgmlType::Q6K, 210),
            (GgmlType::Q8K, 292),
        ];
        for (t, bytes) in want {
            assert_eq!(t.block_bytes(), bytes, "{t}");
        }
    }

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(999), None);
    }
}
