//! `exp_nonpos`, the softmax's `e^x` for `x <= 0`, and its constants: a leaf that the portable steps
//! (kernel.rs, plan.rs) and their vector forms (simd.rs) share, so that every instance computes it with the
//! same operations and gives the same bits.

/// `e^x` for `x <= 0` to about 2 ulp (Cephes' `expf` polynomial after a Cody-Waite reduction), in plain
/// f32 operations that vectorize; values below -87.3 (where `e^x` leaves the normal range) give e^-87.3.
#[inline(always)]
pub fn exp_nonpos(x: f32) -> f32 {
    let x = x.max(EXP_MIN);
    let shifted = x * std::f32::consts::LOG2_E + EXP_ROUND;
    let n = shifted - EXP_ROUND;
    let r = (x - n * EXP_LN2_HI) - n * EXP_LN2_LO;
    let mut p = EXP_POLY[0];
    for &k in &EXP_POLY[1..] {
        p = p * r + k;
    }
    let e = (p * r) * r + r + 1.0;
    // `n` as an integer, read from `shifted`'s low mantissa bits (exact for |n| < 2^22) rather than by `as
    // i32`, whose saturating conversion the compiler cannot vectorize: the same value, in integer lanes.
    let n_int = shifted.to_bits().wrapping_sub(EXP_ROUND.to_bits());
    e * f32::from_bits(n_int.wrapping_add(127) << 23)
}

/// `exp_nonpos`'s constants: the lowest argument, ln 2 in two parts, 1.5 * 2^23 (adding and subtracting
/// it rounds to an integer), and the polynomial's coefficients from the highest degree.
pub(super) const EXP_MIN: f32 = -87.336_55;
pub(super) const EXP_LN2_HI: f32 = 0.693_359_4;
pub(super) const EXP_LN2_LO: f32 = -2.121_944_4e-4;
pub(super) const EXP_ROUND: f32 = 12_582_912.0;
pub(super) const EXP_POLY: [f32; 6] =
    [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5e-1];
