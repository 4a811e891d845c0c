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
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    /// 4-bit non-linear: 32 values, an f16 scale and 16 indices into `KVALUES_IQ4NL`.
    IQ4NL,
    /// `IQ4NL`'s levels in 256-value super-blocks with 6-bit sub-block scales.
    IQ4XS,
    BF16,
    /// OCP microscaling fp4: 32 e2m1 values sharing one e8m0 (power of two) exponent.
    MXFP4,
}

/// Values per super-block of the K-quants.
pub const QK_K: usize = 256;
/// Values per block of the legacy quants (Q4_0 .. Q8_1), IQ4_NL and MXFP4.
pub const QK: usize = 32;

impl GgmlType {
    /// Every type, in id order.
    pub const ALL: [GgmlType; 18] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
        GgmlType::BF16,
        GgmlType::MXFP4,
    ];

    /// The types a model's weights may use (Q8_1 and Q8_K are activation formats only).
    pub const WEIGHT_TYPES: [GgmlType; 16] = [
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
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
        GgmlType::MXFP4,
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
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Q8K => 15,
            GgmlType::IQ4NL => 20,
            GgmlType::IQ4XS => 23,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
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
            GgmlType::Q2K => "q2_K",
            GgmlType::Q3K => "q3_K",
            GgmlType::Q4K => "q4_K",
            GgmlType::Q5K => "q5_K",
            GgmlType::Q6K => "q6_K",
            GgmlType::Q8K => "q8_K",
            GgmlType::IQ4NL => "iq4_nl",
            GgmlType::IQ4XS => "iq4_xs",
            GgmlType::BF16 => "bf16",
            GgmlType::MXFP4 => "mxfp4",
        }
    }

    /// Values per block.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => QK,
            GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::IQ4NL | GgmlType::MXFP4 => QK,
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K | GgmlType::Q8K => QK_K,
            GgmlType::IQ4XS => QK_K,
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
            GgmlType::Q2K => QK_K / 16 + QK_K / 4 + 2 + 2,
            GgmlType::Q3K => QK_K / 8 + QK_K / 4 + 12 + 2,
            GgmlType::Q4K => 2 + 2 + 12 + QK_K / 2,
            GgmlType::Q5K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            GgmlType::Q6K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            GgmlType::Q8K => 4 + QK_K + QK_K / 16 * 2,
            GgmlType::IQ4NL => 2 + QK / 2,
            GgmlType::IQ4XS => 2 + 2 + QK_K / 64 + QK_K / 2,
            GgmlType::MXFP4 => 1 + QK / 2,
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
            (GgmlType::Q2K, 84),
            (GgmlType::Q3K, 110),
            (GgmlType::IQ4NL, 18),
            (GgmlType::IQ4XS, 136),
            (GgmlType::MXFP4, 17),
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
        assert_eq!(GgmlType::from_id(16), None); // iq2_xxs: not supported
        let ids: Vec<u32> = GgmlType::ALL.iter().map(|t| t.id()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ALL is in id order: {ids:?}");
        assert_eq!((GgmlType::Q2K.id(), GgmlType::Q3K.id(), GgmlType::IQ4NL.id()), (10, 11, 20));
        assert_eq!((GgmlType::IQ4XS.id(), GgmlType::MXFP4.id()), (23, 39));
        assert_eq!(GgmlType::from_id(999), None);
    }
}
