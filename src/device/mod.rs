//! Devices and their memory: `cpu` (the host), `cuda:N` (an NVIDIA GPU, `cuda:N@MIB` capped to act as a
//! smaller card), `sim:MIB` (a simulated GPU that computes on the CPU) and `emu:MIB` (the CUDA backend run
//! on the CPU emulator of a GPU).
//!
//! Every byte the engine places on a device goes through that device's ledger: [`Device::alloc`] checks the
//! request against the device's capacity and, for a GPU, against its sampled free memory minus the
//! `--vram-reserve-mib` reserve, and returns an [`Allocation`] whose drop gives the bytes back. Nothing here
//! ever panics or aborts on a refused allocation: the caller gets a [`DeviceError`] it can branch on
//! (spill KV to the host, fall back, or fail one request).
//!
//! A `sim` device computes on the CPU like `cpu` does (its data lives in host memory), but keeps the books
//! of a GPU with a fixed capacity and can be given faults (`sim::Fault`): memory held by another process,
//! failing free-memory samples, failing allocations. `emu` keeps the same books and takes the same faults
//! but computes through the CUDA backend (real allocations on the emulated card, kernels, page tables). On
//! `cuda`, an allocation is a real `cuMemAlloc` after the ledger's checks; free memory is `cuMemGetInfo`
//! (within the cap); and a pressure fault really takes device memory, as another process would.

pub mod cuda;
mod host;
pub mod sim;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::sync::LockUnpoisoned;

use cuda::gpu::{Buffer, Gpu, GpuError};

pub use sim::{Fault, FaultSpec};

const MIB: u64 = 1 << 20;

/// Host memory no ledger allocation may take: what the rest of the process needs to go on (and to report
/// the refusal).
pub const HOST_MARGIN_BYTES: u64 = 128 * MIB;

/// Bytes as MiB with one decimal for messages (KiB below a tenth of a MiB, so small pages do not read 0.0).
pub fn mib(bytes: u64) -> String {
    if bytes > 0 && bytes < MIB / 10 {
        return format!("{:.1} KiB", bytes as f64 / 1024.0);
    }
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

/// What kind of device, and its fixed properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// The host: CPU compute, host memory.
    Cpu,
    /// A simulated GPU with `capacity_bytes` of memory (CPU compute).
    Sim { capacity_bytes: u64 },
    /// CUDA device `ordinal`; with a cap, it acts as a card of `cap_bytes` (the gate and ledger see that).
    Cuda { ordinal: usize, cap_bytes: Option<u64> },
    /// A GPU of `capacity_bytes` emulated on the CPU: the CUDA backend's code and kernels, run slowly.
    Emu { capacity_bytes: u64 },
}

impl DeviceKind {
    /// Parses one entry of `--devices`: `cpu`, `cuda:N`, `cuda:N@MIB`, `sim:MIB`, `emu:MIB`.
    pub fn parse(s: &str) -> Result<DeviceKind, DeviceError> {
        let bad = |why: &str| DeviceError::BadSpec { spec: s.to_owned(), why: why.to_owned() };
        let size = |m: &str, what: &str| -> Result<u64, DeviceError> {
            match m.parse::<u64>() {
                Ok(mib) if mib > 0 && mib <= 1 << 24 => Ok(mib * MIB),
                _ => Err(bad(&format!("{what} is a whole number of MiB from 1 to 16777216"))),
            }
        };
        let s = s.trim();
        if s == "cpu" {
            return Ok(DeviceKind::Cpu);
        }
        if let Some(m) = s.strip_prefix("sim:") {
            return Ok(DeviceKind::Sim { capacity_bytes: size(m, "the size of a sim device")? });
        }
        if let Some(m) = s.strip_prefix("emu:") {
            return Ok(DeviceKind::Emu { capacity_bytes: size(m, "the size of an emu device")? });
        }
        if let Some(n) = s.strip_prefix("cuda:") {
            let (n, cap) = match n.split_once('@') {
                Some((n, cap)) => (n, Some(size(cap, "the cap of a CUDA device (cuda:N@MIB)")?)),
                None => (n, None),
            };
            let ordinal: usize = n.parse().map_err(|_| bad("a CUDA device is cuda:N with N its index"))?;
            return Ok(DeviceKind::Cuda { ordinal, cap_bytes: cap });
        }
        Err(bad("expected cpu, cuda:N, cuda:N@MIB, sim:MIB or emu:MIB"))
    }

    /// True for the kinds that compute through the CUDA backend (`cuda`, `emu`).
    pub fn is_gpu(&self) -> bool {
        matches!(self, DeviceKind::Cuda { .. } | DeviceKind::Emu { .. })
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            DeviceKind::Cpu => write!(f, "cpu"),
            DeviceKind::Sim { capacity_bytes } if capacity_bytes % MIB == 0 => {
                write!(f, "sim:{}", capacity_bytes / MIB)
            }
            DeviceKind::Sim { capacity_bytes } => write!(f, "sim:{capacity_bytes}B"),
            DeviceKind::Emu { capacity_bytes } => write!(f, "emu:{}", capacity_bytes / MIB),
            DeviceKind::Cuda { ordinal, cap_bytes: None } => write!(f, "cuda:{ordinal}"),
            DeviceKind::Cuda { ordinal, cap_bytes: Some(c) } => write!(f, "cuda:{ordinal}@{}", c / MIB),
        }
    }
}

/// What an allocation holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    Weights,
    Kv,
    Scratch,
    Staging,
}

impl Purpose {
    pub const ALL: [Purpose; 4] = [Purpose::Weights, Purpose::Kv, Purpose::Scratch, Purpose::Staging];

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Purpose::Weights => "weights",
            Purpose::Kv => "KV",
            Purpose::Scratch => "scratch",
            Purpose::Staging => "staging",
        })
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    #[error("bad device {spec:?}: {why}")]
    BadSpec { spec: String, why: String },
    #[error("bad fault {spec:?}: {why}")]
    BadFault { spec: String, why: String },
    #[error("device {device} is not available: {why}")]
    Unavailable { device: String, why: String },
    #[error(
        "device {device}: {purpose} allocation of {} refused: free {} - need {} < reserve {}",
        mib(*need_bytes), mib(*free_bytes), mib(*need_bytes), mib(*reserve_bytes)
    )]
    BelowReserve { device: String, purpose: Purpose, need_bytes: u64, free_bytes: u64, reserve_bytes: u64 },
    #[error(
        "device {device}: out of memory: {purpose} allocation of {} with {} free of {}",
        mib(*need_bytes), mib(*free_bytes), mib(*capacity_bytes)
    )]
    OutOfMemory { device: String, purpose: Purpose, need_bytes: u64, free_bytes: u64, capacity_bytes: u64 },
    #[error(
        "device {device}: {purpose} allocation of {} refused: {} keeps its data in host memory, which has {} \
         available ({} of it kept free for the rest of the process)",
        mib(*need_bytes), if *is_host { "the host" } else { "a simulated GPU" }, mib(*available_bytes),
        mib(HOST_MARGIN_BYTES)
    )]
    HostShort { device: String, purpose: Purpose, need_bytes: u64, available_bytes: u64, is_host: bool },
    #[error(
        "device {device}: the OS refused {} more of host memory for {purpose} (Strata holds {} there): out of \
         memory, or a limit such as ulimit -v",
        mib(*need_bytes), mib(*held_bytes)
    )]
    HostRefused { device: String, purpose: Purpose, need_bytes: u64, held_bytes: u64 },
    #[error("device {device}: {purpose} allocation of {} failed (injected fault)", mib(*need_bytes))]
    AllocFailed { device: String, purpose: Purpose, need_bytes: u64 },
    #[error("device {device}: free-memory sample failed")]
    SampleFailed { device: String },
    /// The GPU failed a call. A `sticky` failure (a faulted context) leaves the device unusable: the
    /// engine reports itself unhealthy and exits instead of computing on.
    #[error("device {device}: {msg}")]
    Gpu { device: String, msg: String, sticky: bool },
}

impl DeviceError {
    /// True when the device refused for lack of room (reserve or capacity): the caller may move data to the
    /// host and try again. Other failures end the request.
    pub fn is_no_room(&self) -> bool {
        matches!(self, DeviceError::BelowReserve { .. } | DeviceError::OutOfMemory { .. })
    }

    /// True when the host itself has no room (the host, or a simulated GPU whose memory is host memory):
    /// moving data to the host would not help.
    pub fn is_host_short(&self) -> bool {
        matches!(self, DeviceError::HostShort { .. })
    }

    /// True when a device faulted for good (a sticky CUDA error): nothing more can run on it.
    pub fn is_fatal(&self) -> bool {
        matches!(self, DeviceError::Gpu { sticky: true, .. })
    }
}

/// The ledger of a device at one moment.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Usage {
    /// Bytes held now, by purpose (index: `Purpose as usize`).
    pub by_purpose_bytes: [u64; 4],
    pub total_bytes: u64,
    /// The most bytes ever held at once, and per purpose.
    pub high_water_bytes: u64,
    pub high_water_by_purpose_bytes: [u64; 4],
    pub allocations: u64,
    pub refused_allocations: u64,
    pub failed_samples: u64,
    /// Copies into this device (hidden states between stages, KV pages moving to or from it) and bytes.
    pub copies_in: u64,
    pub copied_in_bytes: u64,
}

impl Usage {
    pub fn bytes(&self, p: Purpose) -> u64 {
        self.by_purpose_bytes[p.index()]
    }
}

struct State {
    usage: Usage,
    sim: sim::SimState,
    /// Last successful free-memory sample and the ledger total when it was taken: a failed sample is
    /// replaced by that sample minus what the engine allocated since.
    last_sample: Option<(u64, u64)>,
    /// CUDA: device memory held by a pressure fault, as another process would hold it.
    hold: Option<Buffer>,
    /// Host-backed kinds (cpu, sim): the host's last availability reading, the ledger total then and when
    /// it was taken. A small allocation soon after is checked against it less what was booked since, so
    /// that KV pages (one per 64 positions per layer) do not each read /proc.
    host_sample: Option<(u64, u64, std::time::Instant)>,
}

/// A host availability reading stands for this long for allocations of at most [`HOST_SAMPLE_SMALL_BYTES`].
const HOST_SAMPLE_FRESH: std::time::Duration = std::time::Duration::from_millis(50);
const HOST_SAMPLE_SMALL_BYTES: u64 = 4 * MIB;

/// One device: its kind, its reserve and its ledger.
pub struct Device {
    pub index: usize,
    pub kind: DeviceKind,
    /// No engine allocation may leave less than this free (GPUs only; the host is not held to it).
    pub reserve_bytes: u64,
    state: Mutex<State>,
    has_scheduled: AtomicBool,
    /// The GPU behind a `cuda` or `emu` device.
    gpu: Option<Arc<dyn Gpu>>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Device({})", self.name())
    }
}

impl Device {
    /// A device of `kind` at position `index` of its set. `cuda:N` opens the GPU (its context, stream and
    /// kernels); when that is not possible the error says what the driver probe found.
    pub fn new(index: usize, kind: DeviceKind, reserve_bytes: u64) -> Result<Arc<Device>, DeviceError> {
        let gpu: Option<Arc<dyn Gpu>> = match kind {
            DeviceKind::Cuda { ordinal, cap_bytes } => {
                let unavailable = |why: String| DeviceError::Unavailable { device: kind.to_string(), why };
                let probe = cuda::probe();
                if let Some(why) = probe.why_none() {
                    return Err(unavailable(why));
                }
                if let cuda::Probe::Devices(found) = &probe {
                    let Some(info) = found.iter().find(|d| d.ordinal == ordinal) else {
                        let why = format!("the driver reports {} CUDA device(s), numbered from 0", found.len());
                        return Err(unavailable(why));
                    };
                    if let Some(cap) = cap_bytes.filter(|&c| c > info.total_bytes) {
                        let why = format!("a cap of {} is more than the card's {}", mib(cap), mib(info.total_bytes));
                        return Err(unavailable(why));
                    }
                }
                let gpu = cuda::driver::CudaGpu::open(ordinal).map_err(|e| unavailable(e.to_string()))?;
                Some(Arc::new(gpu))
            }
            DeviceKind::Emu { capacity_bytes } => Some(Arc::new(cuda::emu::EmuGpu::new(capacity_bytes))),
            DeviceKind::Cpu | DeviceKind::Sim { .. } => None,
        };
        let reserve_bytes = if kind == DeviceKind::Cpu { 0 } else { reserve_bytes };
        Ok(Arc::new(Device {
            index,
            kind,
            reserve_bytes,
            state: Mutex::new(State {
                usage: Usage::default(),
                sim: sim::SimState::default(),
                last_sample: None,
                host_sample: None,
                hold: None,
            }),
            has_scheduled: AtomicBool::new(false),
            gpu,
        }))
    }

    /// The GPU of a `cuda` or `emu` device.
    pub fn gpu(&self) -> Option<&Arc<dyn Gpu>> {
        self.gpu.as_ref()
    }

    /// The fixed capacity of a `sim` or `emu` device (whose free memory is simulated).
    fn simulated_capacity(&self) -> Option<u64> {
        match self.kind {
            DeviceKind::Sim { capacity_bytes } | DeviceKind::Emu { capacity_bytes } => Some(capacity_bytes),
            _ => None,
        }
    }

    fn gpu_error(&self, e: GpuError) -> DeviceError {
        DeviceError::Gpu { device: self.name(), msg: e.to_string(), sticky: e.is_sticky() }
    }

    /// A simulated GPU of `capacity_bytes` (tests use byte sizes; the CLI whole MiB).
    pub fn sim(index: usize, capacity_bytes: u64, reserve_bytes: u64) -> Arc<Device> {
        Device::new(index, DeviceKind::Sim { capacity_bytes }, reserve_bytes).expect("sim devices always exist")
    }

    pub fn cpu(index: usize) -> Arc<Device> {
        Device::new(index, DeviceKind::Cpu, 0).expect("the cpu always exists")
    }

    /// `cpu`, `sim:200`, ... with the index: `1 (sim:400)`.
    pub fn name(&self) -> String {
        format!("{} ({})", self.index, self.kind)
    }

    /// True for the host (data there needs no residency management).
    pub fn is_host(&self) -> bool {
        self.kind == DeviceKind::Cpu
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock_unpoisoned()
    }

    /// Total memory of the device.
    pub fn total_bytes(&self) -> u64 {
        match self.kind {
            DeviceKind::Cpu => host::total_bytes(),
            DeviceKind::Sim { capacity_bytes } | DeviceKind::Emu { capacity_bytes } => capacity_bytes,
            DeviceKind::Cuda { cap_bytes: Some(c), .. } => c,
            DeviceKind::Cuda { cap_bytes: None, .. } => {
                self.gpu.as_ref().and_then(|g| g.mem_info().ok()).map_or(0, |(_, total)| total)
            }
        }
    }

    /// Free memory as the device reports it now: for a GPU, capacity minus what everyone (Strata and
    /// other processes) holds; for the host, the OS's available memory.
    pub fn sample_free(&self) -> Result<u64, DeviceError> {
        let mut st = self.lock();
        self.sample_locked(&mut st)
    }

    fn sample_locked(&self, st: &mut State) -> Result<u64, DeviceError> {
        let free = match self.kind {
            DeviceKind::Cpu => Some(host::available_bytes()),
            DeviceKind::Sim { capacity_bytes } | DeviceKind::Emu { capacity_bytes } => {
                st.sim.sample(capacity_bytes, st.usage.total_bytes)
            }
            DeviceKind::Cuda { cap_bytes, .. } => {
                if st.sim.take_sample_failure() {
                    None
                } else {
                    let real = self.gpu.as_ref().map(|g| g.mem_info());
                    match real {
                        Some(Ok((free, _))) => {
                            // Within a cap, what the engine and the pressure hold come off the cap.
                            let held = st.usage.total_bytes + st.hold.as_ref().map_or(0, Buffer::bytes);
                            Some(cap_bytes.map_or(free, |c| free.min(c.saturating_sub(held))))
                        }
                        _ => None,
                    }
                }
            }
        };
        match free {
            Some(f) => {
                st.last_sample = Some((f, st.usage.total_bytes));
                Ok(f)
            }
            None => {
                st.usage.failed_samples += 1;
                Err(DeviceError::SampleFailed { device: self.name() })
            }
        }
    }

    /// Free memory for a chart or a status page: what [`Device::sample_free`] reports, except that it never
    /// uses up a scripted sample failure (those are for the engine's decisions) and is not recorded as the
    /// last sample. None when the device cannot say.
    pub fn observe_free(&self) -> Option<u64> {
        let st = self.lock();
        match self.kind {
            DeviceKind::Cpu => Some(host::available_bytes()),
            DeviceKind::Sim { capacity_bytes } | DeviceKind::Emu { capacity_bytes } => {
                Some(st.sim.true_free(capacity_bytes, st.usage.total_bytes))
            }
            DeviceKind::Cuda { cap_bytes, .. } => {
                let (free, _) = self.gpu.as_ref()?.mem_info().ok()?;
                let held = st.usage.total_bytes + st.hold.as_ref().map_or(0, Buffer::bytes);
                Some(cap_bytes.map_or(free, |c| free.min(c.saturating_sub(held))))
            }
        }
    }

    /// The ledger now.
    pub fn usage(&self) -> Usage {
        self.lock().usage.clone()
    }

    /// Takes `bytes` of device memory for `purpose`. Refused when it does not fit the device, or (GPUs)
    /// when it would leave the sampled free memory under the reserve. When the sample itself fails, the
    /// last good sample moved by what was allocated or freed since stands in for it.
    pub fn alloc(self: &Arc<Self>, purpose: Purpose, bytes: u64) -> Result<Allocation, DeviceError> {
        self.alloc_reusing(purpose, bytes, 0)
    }

    /// [`Device::alloc`] for memory of which `reused_bytes` the process already holds (buffers of an
    /// evicted snapshot about to be written again): the host check counts only the rest as new.
    pub fn alloc_reusing(
        self: &Arc<Self>,
        purpose: Purpose,
        bytes: u64,
        reused_bytes: u64,
    ) -> Result<Allocation, DeviceError> {
        let mut st = self.lock();
        match self.admit_locked(&mut st, purpose, bytes, reused_bytes) {
            Ok(mem) => Ok(self.book(&mut st, purpose, bytes, mem)),
            Err(e) => {
                st.usage.refused_allocations += 1;
                tracing::debug!("{e}");
                Err(e)
            }
        }
    }

    /// Runs the checks of an allocation in order (a scripted failure, the room, the host's available
    /// memory, the reserve) and takes the GPU memory: the first refusal is returned, nothing is booked.
    fn admit_locked(
        &self,
        st: &mut State,
        purpose: Purpose,
        bytes: u64,
        reused_bytes: u64,
    ) -> Result<Option<Buffer>, DeviceError> {
        if st.sim.take_alloc_failure() {
            return Err(DeviceError::AllocFailed { device: self.name(), purpose, need_bytes: bytes });
        }
        let capacity_bytes = self.check_room_locked(st, purpose, bytes)?;
        self.check_host_available_locked(st, purpose, bytes.saturating_sub(reused_bytes))?;
        if !self.is_host() {
            self.check_reserve_locked(st, purpose, bytes, capacity_bytes)?;
        }
        self.take_gpu_memory(purpose, bytes)
    }

    /// Refuses `bytes` that could not fit at all (out of memory); else returns the capacity it was
    /// measured against (`u64::MAX` for an uncapped card).
    fn check_room_locked(&self, st: &State, purpose: Purpose, bytes: u64) -> Result<u64, DeviceError> {
        // What could fit at all (else out of memory): the host's total (its own allocator is the arbiter),
        // a simulated card's capacity minus everything held, a capped card's cap minus what Strata and the
        // pressure hold; an uncapped card's driver decides in `take_gpu_memory`.
        let used = st.usage.total_bytes;
        let (room, capacity_bytes) = match self.kind {
            DeviceKind::Cpu => {
                let total = host::total_bytes();
                (total.saturating_sub(used), total)
            }
            DeviceKind::Sim { capacity_bytes } | DeviceKind::Emu { capacity_bytes } => {
                (st.sim.true_free(capacity_bytes, used), capacity_bytes)
            }
            DeviceKind::Cuda { cap_bytes: Some(cap), .. } => {
                (cap.saturating_sub(used + st.hold.as_ref().map_or(0, Buffer::bytes)), cap)
            }
            DeviceKind::Cuda { cap_bytes: None, .. } => (u64::MAX, u64::MAX),
        };
        if bytes > room {
            return Err(DeviceError::OutOfMemory {
                device: self.name(),
                purpose,
                need_bytes: bytes,
                free_bytes: room,
                capacity_bytes,
            });
        }
        Ok(capacity_bytes)
    }

    /// Refuses `new_bytes` of host memory (on the host or a simulated GPU, weights aside) that would leave
    /// less than the margin of what the OS has available.
    ///
    /// The host, and a simulated GPU (its pages are host memory), never promise more than the OS has
    /// available now: a ledger over total RAM (or a 16 TiB sim card) would let the real allocation fail
    /// later, where it aborts the process instead of refusing one request.
    /// A margin stays free for everything else the process allocates (buffers, messages, the stack of a
    /// new thread): a ledger that hands out the last byte leaves the next small allocation to abort.
    /// Weights there are mapped from the file, not allocated: the OS pages them, as llama.cpp's mmap does.
    fn check_host_available_locked(&self, st: &mut State, purpose: Purpose, new_bytes: u64) -> Result<(), DeviceError> {
        let host_memory = matches!(self.kind, DeviceKind::Cpu | DeviceKind::Sim { .. });
        if !host_memory || purpose == Purpose::Weights || new_bytes == 0 {
            return Ok(());
        }
        let available_bytes = self.host_available_locked(st, new_bytes);
        if new_bytes.saturating_add(HOST_MARGIN_BYTES) > available_bytes {
            return Err(DeviceError::HostShort {
                device: self.name(),
                purpose,
                need_bytes: new_bytes,
                available_bytes,
                is_host: self.is_host(),
            });
        }
        Ok(())
    }

    /// The host's available memory for a request of `new_bytes`: a recent sample moved by what was
    /// allocated since, for a small request, else a fresh sample (kept as the recent one).
    fn host_available_locked(&self, st: &mut State, new_bytes: u64) -> u64 {
        let used = st.usage.total_bytes;
        let recent = st
            .host_sample
            .filter(|&(_, _, at)| new_bytes <= HOST_SAMPLE_SMALL_BYTES && at.elapsed() < HOST_SAMPLE_FRESH);
        match recent {
            Some((available, used_then, _)) => available.saturating_sub(used.saturating_sub(used_then)),
            None => {
                let available = host::available_bytes();
                st.host_sample = Some((available, used, std::time::Instant::now()));
                available
            }
        }
    }

    /// Refuses `bytes` on a GPU that would leave its free memory under the reserve: free memory from a
    /// fresh sample, or when sampling fails the last good sample moved by what Strata allocated (or
    /// freed) since.
    fn check_reserve_locked(
        &self,
        st: &mut State,
        purpose: Purpose,
        bytes: u64,
        capacity_bytes: u64,
    ) -> Result<(), DeviceError> {
        let used = st.usage.total_bytes;
        let free = match self.sample_locked(st) {
            Ok(f) => f,
            // (Never sampled: a simulated or capped card is taken as empty, an uncapped one as full.)
            Err(_) => st
                .last_sample
                .map_or(if capacity_bytes == u64::MAX { 0 } else { capacity_bytes }, |(f, at_total)| f + at_total)
                .saturating_sub(used)
                .min(capacity_bytes.saturating_sub(used)),
        };
        if free < bytes.saturating_add(self.reserve_bytes) {
            return Err(DeviceError::BelowReserve {
                device: self.name(),
                purpose,
                need_bytes: bytes,
                free_bytes: free,
                reserve_bytes: self.reserve_bytes,
            });
        }
        Ok(())
    }

    /// The memory itself, on a GPU (None elsewhere); the driver may still say no (another process took
    /// it meanwhile).
    fn take_gpu_memory(&self, purpose: Purpose, bytes: u64) -> Result<Option<Buffer>, DeviceError> {
        let Some(gpu) = &self.gpu else {
            return Ok(None);
        };
        match Buffer::device(gpu, bytes) {
            Ok(b) => Ok(Some(b)),
            Err(GpuError::OutOfMemory { .. }) => {
                let free = gpu.mem_info().map_or(0, |(f, _)| f);
                Err(DeviceError::OutOfMemory {
                    device: self.name(),
                    purpose,
                    need_bytes: bytes,
                    free_bytes: free,
                    capacity_bytes: self.total_bytes(),
                })
            }
            Err(e) => Err(self.gpu_error(e)),
        }
    }

    /// Pinned host memory that `gpu` reads directly (KV pages a GPU layer keeps on the host), booked on
    /// this device (the host).
    pub fn alloc_pinned(
        self: &Arc<Self>,
        gpu: &Arc<dyn Gpu>,
        purpose: Purpose,
        bytes: u64,
    ) -> Result<Allocation, DeviceError> {
        let mut book = self.alloc(purpose, bytes)?;
        match Buffer::pinned_host(gpu, bytes) {
            Ok(b) => {
                book.mem = Some(b);
                Ok(book)
            }
            Err(GpuError::OutOfMemory { .. }) => Err(DeviceError::OutOfMemory {
                device: self.name(),
                purpose,
                need_bytes: bytes,
                free_bytes: host::available_bytes(),
                capacity_bytes: host::total_bytes(),
            }),
            Err(e) => Err(self.gpu_error(e)),
        }
    }

    fn book(self: &Arc<Self>, st: &mut State, purpose: Purpose, bytes: u64, mem: Option<Buffer>) -> Allocation {
        let u = &mut st.usage;
        u.by_purpose_bytes[purpose.index()] += bytes;
        u.total_bytes += bytes;
        u.allocations += 1;
        u.high_water_bytes = u.high_water_bytes.max(u.total_bytes);
        let i = purpose.index();
        u.high_water_by_purpose_bytes[i] = u.high_water_by_purpose_bytes[i].max(u.by_purpose_bytes[i]);
        Allocation { device: self.clone(), purpose, bytes, mem }
    }

    fn release(&self, purpose: Purpose, bytes: u64) {
        let mut st = self.lock();
        let u = &mut st.usage;
        u.by_purpose_bytes[purpose.index()] = u.by_purpose_bytes[purpose.index()].saturating_sub(bytes);
        u.total_bytes = u.total_bytes.saturating_sub(bytes);
    }

    /// Counts a copy of `bytes` into this device (`memcpy_htod`, or device to device between stages).
    pub fn count_copy_in(&self, bytes: u64) {
        let mut st = self.lock();
        st.usage.copies_in += 1;
        st.usage.copied_in_bytes += bytes;
    }

    /// Applies a fault now (GPU-like devices: sim, emu, cuda; the host refuses). On `cuda`, pressure is
    /// device memory really taken (and given back when the pressure is lifted).
    pub fn inject(&self, fault: Fault) -> Result<(), DeviceError> {
        let mut st = self.lock();
        self.apply_locked(&mut st, fault)
    }

    fn apply_locked(&self, st: &mut State, fault: Fault) -> Result<(), DeviceError> {
        if fault == Fault::FaultContext {
            return match &self.gpu {
                Some(gpu) if gpu.poison() => Ok(()),
                _ => Err(DeviceError::BadFault {
                    spec: self.kind.to_string(),
                    why: "only an emu device's context can be faulted on purpose".into(),
                }),
            };
        }
        if let Some(capacity_bytes) = self.simulated_capacity() {
            let allocated = st.usage.total_bytes;
            st.sim.apply(fault, capacity_bytes, allocated);
            return Ok(());
        }
        let Some(gpu) = self.gpu.clone() else {
            return Err(DeviceError::BadFault {
                spec: self.kind.to_string(),
                why: "faults can only be injected into GPU-like devices (sim, emu, cuda)".into(),
            });
        };
        let hold_bytes = match fault {
            Fault::PressureBytes(b) => b,
            Fault::LeaveFreeBytes(b) => {
                st.hold = None;
                self.sample_locked(st)?.saturating_sub(b)
            }
            Fault::FailSamples(_) | Fault::FailAllocs(_) | Fault::FaultContext => {
                st.sim.apply(fault, 0, 0);
                return Ok(());
            }
        };
        st.hold = None;
        if hold_bytes > 0 {
            st.hold = Some(Buffer::device(&gpu, hold_bytes).map_err(|e| self.gpu_error(e))?);
        }
        Ok(())
    }

    /// Applies `fault` when the engine reaches `at_tokens` positions in a sequence (see `on_progress`).
    pub fn schedule(&self, at_tokens: usize, fault: Fault) -> Result<(), DeviceError> {
        if self.is_host() {
            return Err(DeviceError::BadFault {
                spec: self.kind.to_string(),
                why: "faults can only be injected into GPU-like devices (sim, emu, cuda)".into(),
            });
        }
        self.lock().sim.scheduled.push((at_tokens, fault));
        self.has_scheduled.store(true, Ordering::Release);
        Ok(())
    }

    /// Called by the forward pass as a sequence reaches `tokens` positions: fires scheduled faults.
    pub fn on_progress(&self, tokens: usize) {
        if !self.has_scheduled.load(Ordering::Acquire) {
            return;
        }
        let mut st = self.lock();
        let due = st.sim.take_due(tokens);
        let fired = due.len();
        for f in due {
            if let Err(e) = self.apply_locked(&mut st, f) {
                tracing::warn!("device {}: scheduled fault not applied: {e}", self.name());
            }
        }
        if fired > 0 {
            tracing::info!("device {}: {fired} scheduled fault(s) applied at {tokens} tokens", self.name());
        }
        if st.sim.scheduled.is_empty() {
            self.has_scheduled.store(false, Ordering::Release);
        }
    }

    /// What is really free on a sim device (capacity minus everything held), whatever the faults make
    /// samples report. For tests checking the invariants from outside.
    pub fn sim_true_free(&self) -> Option<u64> {
        let capacity_bytes = self.simulated_capacity()?;
        let st = self.lock();
        Some(st.sim.true_free(capacity_bytes, st.usage.total_bytes))
    }
}

/// Bytes held on a device; dropping it gives them back to the ledger.
#[derive(Debug)]
pub struct Allocation {
    device: Arc<Device>,
    purpose: Purpose,
    bytes: u64,
    /// The memory itself where the device is a GPU (or pinned host memory for one); books only elsewhere.
    mem: Option<Buffer>,
}

impl Allocation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    pub fn purpose(&self) -> Purpose {
        self.purpose
    }

    /// The GPU memory behind it, if any.
    pub fn mem(&self) -> Option<&Buffer> {
        self.mem.as_ref()
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.mem = None; // memory first, then the books: a sample between the two sees it gone
        self.device.release(self.purpose, self.bytes);
    }
}

/// The devices of one engine, in `--devices` order, and the host (the `cpu` entry when listed, else a
/// device of its own that holds spilled KV and host copies).
#[derive(Clone, Debug)]
pub struct DeviceSet {
    pub devices: Vec<Arc<Device>>,
    pub host: Arc<Device>,
}

impl DeviceSet {
    /// The host alone.
    pub fn cpu() -> DeviceSet {
        let cpu = Device::cpu(0);
        DeviceSet { devices: vec![cpu.clone()], host: cpu }
    }

    /// Devices from a `--devices` list (`cpu,sim:200,cuda:0`), with `reserve_bytes` on each GPU.
    pub fn parse(list: &str, reserve_bytes: u64) -> Result<DeviceSet, DeviceError> {
        let kinds =
            list.split(',').filter(|s| !s.trim().is_empty()).map(DeviceKind::parse).collect::<Result<Vec<_>, _>>()?;
        if kinds.is_empty() {
            return Err(DeviceError::BadSpec { spec: list.to_owned(), why: "no device listed".into() });
        }
        Self::from_kinds(&kinds, reserve_bytes)
    }

    pub fn from_kinds(kinds: &[DeviceKind], reserve_bytes: u64) -> Result<DeviceSet, DeviceError> {
        if kinds.iter().filter(|k| **k == DeviceKind::Cpu).count() > 1 {
            return Err(DeviceError::BadSpec { spec: "cpu".into(), why: "cpu is listed more than once".into() });
        }
        let devices =
            kinds.iter().enumerate().map(|(i, k)| Device::new(i, *k, reserve_bytes)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self::from_devices(devices))
    }

    /// A set of already made devices (tests); the host is the `cpu` among them or a new one.
    pub fn from_devices(devices: Vec<Arc<Device>>) -> DeviceSet {
        let host = devices.iter().find(|d| d.is_host()).cloned().unwrap_or_else(|| Device::cpu(devices.len()));
        DeviceSet { devices, host }
    }

    /// Every device and the host (once), for totals.
    pub fn all(&self) -> Vec<Arc<Device>> {
        let mut all = self.devices.clone();
        if !all.iter().any(|d| Arc::ptr_eq(d, &self.host)) {
            all.push(self.host.clone());
        }
        all
    }

    /// Fires scheduled faults on every device as a sequence reaches `tokens` positions.
    pub fn on_progress(&self, tokens: usize) {
        for d in &self.devices {
            d.on_progress(tokens);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_lists() {
        let set = DeviceSet::parse("sim:200, sim:400", 64 * MIB).unwrap();
        assert_eq!(set.devices.len(), 2);
        assert_eq!(set.devices[1].kind, DeviceKind::Sim { capacity_bytes: 400 * MIB });
        assert_eq!(set.devices[1].reserve_bytes, 64 * MIB);
        assert!(set.host.is_host() && set.host.index == 2);
        let set = DeviceSet::parse("cpu,sim:100", 0).unwrap();
        assert!(Arc::ptr_eq(&set.host, &set.devices[0]));
        for bad in ["gpu", "sim:", "sim:x", "sim:0", "", "cpu,cpu", "cuda:a", "cuda:0@", "cuda:0@0", "emu:", "emu:x"] {
            assert!(DeviceSet::parse(bad, 0).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            DeviceKind::parse("cuda:1@12288").unwrap(),
            DeviceKind::Cuda { ordinal: 1, cap_bytes: Some(12288 * MIB) }
        );
        assert_eq!(DeviceKind::parse("cuda:0").unwrap(), DeviceKind::Cuda { ordinal: 0, cap_bytes: None });
        assert_eq!(DeviceKind::parse("cuda:1@12288").unwrap().to_string(), "cuda:1@12288");
        let emu = DeviceSet::parse("emu:128,emu:64", 8 * MIB).unwrap();
        assert_eq!(emu.devices[0].kind, DeviceKind::Emu { capacity_bytes: 128 * MIB });
        assert!(emu.devices[0].gpu().is_some() && emu.devices[0].kind.is_gpu());
        assert_eq!(emu.devices[1].sample_free().unwrap(), 64 * MIB);
        let e = DeviceSet::parse("cuda:0", 0).unwrap_err().to_string();
        assert!(e.contains("cuda:0 is not available"), "{e}");
    }

    #[test]
    fn ledger_counts_by_purpose_and_returns_bytes_on_drop() {
        let d = Device::sim(0, 10 * MIB, 0);
        let a = d.alloc(Purpose::Weights, 4 * MIB).unwrap();
        let b = d.alloc(Purpose::Kv, 3 * MIB).unwrap();
        let u = d.usage();
        assert_eq!((u.bytes(Purpose::Weights), u.bytes(Purpose::Kv), u.total_bytes), (4 * MIB, 3 * MIB, 7 * MIB));
        assert_eq!(d.sample_free().unwrap(), 3 * MIB);
        let e = d.alloc(Purpose::Kv, 4 * MIB).unwrap_err();
        assert!(matches!(e, DeviceError::OutOfMemory { .. }) && e.is_no_room(), "{e}");
        drop(b);
        let c = d.alloc(Purpose::Scratch, 5 * MIB).unwrap();
        assert_eq!(d.usage().high_water_bytes, 9 * MIB);
        drop((a, c));
        assert_eq!(d.usage().total_bytes, 0);
        assert_eq!(d.usage().high_water_by_purpose_bytes[Purpose::Kv as usize], 3 * MIB);
    }

    #[test]
    fn reserve_is_kept_and_named_in_the_error() {
        let d = Device::sim(1, 100 * MIB, 30 * MIB);
        let _w = d.alloc(Purpose::Weights, 60 * MIB).unwrap();
        let e = d.alloc(Purpose::Kv, 11 * MIB).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, DeviceError::BelowReserve { .. }), "{msg}");
        assert!(msg.contains("1 (sim:100)") && msg.contains("reserve 30.0 MiB") && msg.contains("free 40.0"), "{msg}");
        d.alloc(Purpose::Kv, 10 * MIB).unwrap();
    }

    #[test]
    fn faults_pressure_samples_and_allocations() {
        let d = Device::sim(0, 100 * MIB, 0);
        let _w = d.alloc(Purpose::Weights, 10 * MIB).unwrap();
        d.inject(Fault::PressureBytes(50 * MIB)).unwrap();
        assert_eq!(d.sample_free().unwrap(), 40 * MIB);
        d.inject(Fault::LeaveFreeBytes(5 * MIB)).unwrap();
        assert_eq!(d.sample_free().unwrap(), 5 * MIB);
        assert!(d.alloc(Purpose::Kv, 6 * MIB).is_err());
        d.inject(Fault::PressureBytes(0)).unwrap();
        d.inject(Fault::FailSamples(2)).unwrap();
        assert!(d.sample_free().is_err() && d.sample_free().is_err());
        assert_eq!(d.sample_free().unwrap(), 90 * MIB);
        assert_eq!(d.usage().failed_samples, 2);
        d.inject(Fault::FailAllocs(1)).unwrap();
        assert!(matches!(d.alloc(Purpose::Kv, 1), Err(DeviceError::AllocFailed { .. })));
        d.alloc(Purpose::Kv, 1).unwrap();
        d.schedule(100, Fault::LeaveFreeBytes(0)).unwrap();
        d.on_progress(99);
        assert!(d.sample_free().unwrap() > 0);
        d.on_progress(100);
        assert_eq!(d.sample_free().unwrap(), 0);
        assert!(Device::cpu(0).inject(Fault::FailAllocs(1)).is_err());
    }

    #[test]
    fn failed_sample_falls_back_to_the_last_one() {
        let d = Device::sim(0, 100 * MIB, 20 * MIB);
        d.inject(Fault::PressureBytes(50 * MIB)).unwrap();
        assert_eq!(d.sample_free().unwrap(), 50 * MIB);
        d.inject(Fault::FailSamples(10)).unwrap();
        let _a = d.alloc(Purpose::Kv, 20 * MIB).unwrap(); // estimate 50 - 0 >= 20 + 20
        let e = d.alloc(Purpose::Kv, 20 * MIB).unwrap_err(); // estimate 50 - 20 < 20 + 20
        assert!(matches!(e, DeviceError::BelowReserve { .. }), "{e}");
    }

    #[test]
    fn host_samples_real_memory() {
        let cpu = Device::cpu(0);
        let free = cpu.sample_free().unwrap();
        assert!(free > 0 && free <= cpu.total_bytes());
        assert_eq!(cpu.reserve_bytes, 0);
    }
}
