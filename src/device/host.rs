//! Host memory as the OS reports it (sysinfo): what `cpu` samples as free and its total. What is free is
//! the least of three limits a process can meet: the memory the OS has available, the room left under the
//! process's cgroup limit (a container's memory.max), and the address space left under `ulimit -v`.

use std::sync::OnceLock;

use sysinfo::{MemoryRefreshKind, RefreshKind, System};

fn refreshed() -> System {
    System::new_with_specifics(RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram()))
}

/// Memory the OS could give to a new allocation without swapping, within the process's limits.
pub fn available_bytes() -> u64 {
    let sys = refreshed();
    let mut free = sys.available_memory();
    if let Some(cg) = sys.cgroup_limits() {
        // The limit less the anonymous memory charged to the cgroup: its page cache (the model file among
        // it) is reclaimed under pressure, so it does not count as taken.
        free = free.min(cg.total_memory.saturating_sub(cg.rss));
    }
    free.min(address_space_left().unwrap_or(u64::MAX))
}

/// Installed memory (read once).
pub fn total_bytes() -> u64 {
    static TOTAL: OnceLock<u64> = OnceLock::new();
    *TOTAL.get_or_init(|| refreshed().total_memory())
}

/// Address space left under `RLIMIT_AS` (`ulimit -v`), if one is set: the process's mappings already count
/// against it, so allocations fail there long before the machine runs out of memory.
#[cfg(target_os = "linux")]
fn address_space_left() -> Option<u64> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rl) } != 0 || rl.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    #[allow(clippy::useless_conversion)] // rlim_t is narrower on 32-bit targets
    let limit_bytes = u64::from(rl.rlim_cur);
    Some(limit_bytes.saturating_sub(pages.saturating_mul(page_bytes)))
}

#[cfg(not(target_os = "linux"))]
fn address_space_left() -> Option<u64> {
    None
}
