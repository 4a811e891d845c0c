//! The sampler's random stream: the numbers llama.cpp draws for the same seed.
//!
//! llama.cpp seeds a `std::mt19937` with the request's `seed` and takes each draw as
//! `std::uniform_real_distribution<double>(0, 1)`, which libstdc++ builds from two 32-bit outputs
//! (`generate_canonical<double, 53>`: `(a + b * 2^32) / 2^64`, kept below 1). Doing the same here means a
//! client that pins `seed` gets the tokens llama.cpp's Linux builds give for it wherever both see the same
//! distribution (up to the rounding of the logits, which differs between the engines). The generator is
//! `rand_mt`'s MT19937; this module owns only the seeding rule and the conversion to a uniform number.

use rand_mt::Mt;

/// MT19937 with llama.cpp's conversion to `[0, 1)`.
pub struct SamplerRng {
    mt: Mt,
}

impl SamplerRng {
    /// A seed that fits 32 bits seeds MT19937 as llama.cpp does (its seed field is a `uint32_t`); a wider
    /// one seeds it with both halves as a key (`init_by_array`), so that no two seeds share a stream.
    pub fn new(seed: u64) -> SamplerRng {
        let mt = match u32::try_from(seed) {
            Ok(s) => Mt::new(s),
            Err(_) => Mt::new_with_key([seed as u32, (seed >> 32) as u32]),
        };
        SamplerRng { mt }
    }

    /// A uniform number in `[0, 1)`: libstdc++'s `generate_canonical<double, 53>` over two outputs.
    pub fn uniform(&mut self) -> f64 {
        const TWO_32: f64 = 4_294_967_296.0;
        let low = self.mt.next_u32() as f64;
        let high = self.mt.next_u32() as f64;
        let x = (low + high * TWO_32) / (TWO_32 * TWO_32);
        // The sum rounds to 2^64 when both outputs are near their maximum: libstdc++ answers the largest
        // double below 1 then.
        if x >= 1.0 {
            1.0 - f64::EPSILON / 2.0
        } else {
            x
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first four numbers of `std::uniform_real_distribution<double>(0, 1)` over `std::mt19937(42)`,
    /// printed by g++ 12 / libstdc++ with `%.17g`.
    #[test]
    #[allow(clippy::excessive_precision)] // as printed, 17 digits
    fn seed_42_gives_libstdcpp_s_numbers() {
        let mut r = SamplerRng::new(42);
        let want = [0.79654298428784598, 0.18343478789336848, 0.77969099761266125, 0.59685016158005655];
        for w in want {
            assert_eq!(r.uniform(), w);
        }
    }

    #[test]
    fn wide_seeds_get_streams_of_their_own() {
        let first = |s: u64| SamplerRng::new(s).uniform();
        assert_ne!(first(42), first(42 | 1 << 32));
        assert_ne!(first(1 << 32), first(1 << 33));
        assert_eq!(first(1 << 40), first(1 << 40));
    }
}
