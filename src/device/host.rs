//! Host memory as the OS reports it (sysinfo): what `cpu` samples as free and its total.

use std::sync::OnceLock;

use sysinfo::{MemoryRefreshKind, RefreshKind, System};

fn refreshed() -> System {
    System::new_with_specifics(RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram()))
}

/// Memory the OS could give to a new allocation without swapping.
pub fn available_bytes() -> u64 {
    refreshed().available_memory()
}

/// Installed memory (read once).
pub fn total_bytes() -> u64 {
    static TOTAL: OnceLock<u64> = OnceLock::new();
    *TOTAL.get_or_init(|| refreshed().total_memory())
}
