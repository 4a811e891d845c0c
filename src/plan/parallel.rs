//! How many sequences `strata serve` runs at once: the range `--parallel` accepts and, without it, the
//! number the server picks from the memory plan of its stages. The server (what it runs) and the settings'
//! plan (what the fit bars count) both ask here, so that the two cannot disagree. It reads stage plans and
//! samples the host's available memory; it never allocates.

use crate::device::{Device, HOST_MARGIN_BYTES};
use crate::model::placement::StagePlan;

/// The most requests `--parallel` lets generate at once.
pub const MAX_PARALLEL: u32 = 256;

/// Sequences the CPU default allows at most (more would lengthen every reply on a few cores).
pub const CPU_PARALLEL_DEFAULT: usize = 4;

/// Why `--parallel` above 1 with speculative decoding is refused (the CLI and the settings both say it).
pub const SPECULATIVE_ONE_AT_A_TIME: &str = "speculative decoding runs one request at a time";

/// The number of sequences the server runs without `--parallel`, and what decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultParallel {
    /// Speculative decoding: one request at a time.
    Speculative,
    /// A stage runs on a GPU: one. `--parallel N` batches the sequences there too (one pass, the products
    /// over all rows), but every sequence's KV takes device memory that the reserve and the conversation
    /// cache's restores share, so more than one is the user's choice, not a default.
    GpuStages,
    /// Every stage computes on the CPU (host or sim devices): as many sequences of `per_sequence_bytes`
    /// (KV at the full context) as the host's `available_bytes` less its margin hold, 1 to
    /// [`CPU_PARALLEL_DEFAULT`].
    Host { sequences: usize, per_sequence_bytes: u64, available_bytes: u64 },
}

impl DefaultParallel {
    /// Sequences run at once.
    pub fn sequences(&self) -> usize {
        match self {
            DefaultParallel::Speculative | DefaultParallel::GpuStages => 1,
            DefaultParallel::Host { sequences, .. } => *sequences,
        }
    }
}

/// What the server runs without `--parallel` for a model placed as `stages`, at `max_context` positions
/// per sequence with `kv_resident` positions kept on the devices; `host` is sampled now (a host that
/// cannot be sampled counts as unlimited).
pub fn default_parallel(
    stages: &[StagePlan],
    max_context: usize,
    kv_resident: Option<usize>,
    host: &Device,
    speculative: bool,
) -> DefaultParallel {
    if speculative {
        return DefaultParallel::Speculative;
    }
    if stages.iter().any(|s| s.device.kind.is_gpu()) {
        return DefaultParallel::GpuStages;
    }
    let per_sequence_bytes: u64 = stages
        .iter()
        .map(|s| s.kv_device_bytes(max_context, kv_resident) + s.kv_host_bytes(max_context, kv_resident))
        .sum();
    let available_bytes = host.sample_free().unwrap_or(u64::MAX);
    let sequences = cpu_parallel(per_sequence_bytes, available_bytes.saturating_sub(HOST_MARGIN_BYTES));
    DefaultParallel::Host { sequences, per_sequence_bytes, available_bytes }
}

/// Sequences of `per_sequence_bytes` each that `available_bytes` holds, from 1 to [`CPU_PARALLEL_DEFAULT`].
pub fn cpu_parallel(per_sequence_bytes: u64, available_bytes: u64) -> usize {
    let fits = available_bytes.checked_div(per_sequence_bytes).unwrap_or(u64::MAX);
    usize::try_from(fits).unwrap_or(usize::MAX).clamp(1, CPU_PARALLEL_DEFAULT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_default_is_what_the_host_holds_at_the_full_context_up_to_four() {
        const MIB: u64 = 1 << 20;
        assert_eq!(cpu_parallel(180 * MIB, 20_000 * MIB), 4);
        assert_eq!(cpu_parallel(180 * MIB, 4 * 180 * MIB), 4);
        assert_eq!(cpu_parallel(180 * MIB, 4 * 180 * MIB - 1), 3);
        assert_eq!(cpu_parallel(5_000 * MIB, 11_000 * MIB), 2);
        // Never below one: a lone sequence pages to the host ledger's limits as before.
        assert_eq!(cpu_parallel(5_000 * MIB, 100 * MIB), 1);
        assert_eq!(cpu_parallel(0, 0), 4);
    }
}
