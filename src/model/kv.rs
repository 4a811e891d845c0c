//! The KV cache of one sequence: per layer, the K and V rows of every position, as f16, as f32 (the values
//! exactly as computed, to compare with llama.cpp's `-ctk f32 -ctv f32`) or as int8 blocks of 32 values
//! with an f16 scale (the Q8_0 layout), in pages of `KV_PAGE_TOKENS` positions. The GPU backend's kernels
//! read f16 and int8 only: f32 KV runs on the CPU and sim devices (`Model` refuses it on a GPU stage).
//!
//! Each layer's pages live on that layer's device, allocated through its ledger as the sequence grows, so
//! a short conversation at a long `--max-context` holds only what it uses. With `--kv-resident N`, pages
//! older than the newest N positions move to the host; and when the device refuses a page (its reserve or
//! its capacity), the layer's oldest device page moves to the host to make room, or the new page is put
//! there: the resident window shrinks instead of the request failing. Only a hard failure (the driver
//! failing an allocation, the host out of memory) ends the request.
//!
//! Where a page lives never changes the arithmetic (see `ops::attention`), so results do not depend on
//! `--kv-resident` or memory pressure.
//!
//! On a GPU layer (`cuda`, `emu`) a page is one allocation of GPU memory, K rows then V rows, written and
//! read by the kernels through the layer's page table (the pages' addresses, uploaded when they change). A
//! page moved to the host goes to pinned host memory the GPU reads directly, so attention still covers
//! every page in one pass. Parking gathers each layer's pages with one kernel into pinned staging buffers
//! (`staging`); restoring copies a run of adjacent pages at a time (a restore allocates a slab per layer).

use std::sync::{Arc, Mutex};

use half::f16;

use crate::device::cuda::gpu::{Gpu, GpuError};
use crate::device::{Allocation, Device, DeviceError, Purpose};
use crate::quant::{self, GgmlType};

use super::staging::{Source, Staging};
use crate::sync::LockUnpoisoned;

/// Positions per page: storage grows, and moves to the host, this many positions at a time.
pub const KV_PAGE_TOKENS: usize = 64;

/// Positions a sliding-window layer keeps beyond its window, so that the sequence can always be cut back
/// this far (a rejected speculative draft, the last prompt token read again) without rereading.
pub const SWA_MARGIN_TOKENS: usize = KV_PAGE_TOKENS;

/// The element format of the KV cache (`--kv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(rename = "KvChoice"))]
#[serde(rename_all = "lowercase")]
pub enum KvType {
    #[default]
    F16,
    /// Bit-exact K and V, twice f16's memory (CPU and sim devices only).
    F32,
    Int8,
}

impl KvType {
    /// Bytes of one K (or V) row of `dim` values.
    pub fn row_bytes(self, dim: usize) -> usize {
        match self {
            KvType::F16 => dim * 2,
            KvType::F32 => dim * 4,
            KvType::Int8 => dim / 32 * GgmlType::Q8_0.block_bytes(),
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Int8 => "int8",
        })
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f16" => Ok(KvType::F16),
            "f32" => Ok(KvType::F32),
            "int8" | "q8_0" => Ok(KvType::Int8),
            _ => Err(format!("unknown KV type {s:?} (expected f16, f32 or int8)")),
        }
    }
}

/// K or V rows of one page: `KV_PAGE_TOKENS` rows of `kv_dim` values.
pub enum KvRows {
    F16(Vec<f16>), // (KV_PAGE_TOKENS, kv_dim)
    F32(Vec<f32>), // (KV_PAGE_TOKENS, kv_dim)
    Int8(Vec<u8>), // (KV_PAGE_TOKENS, kv_dim / 32 blocks of 34 bytes)
    /// In the page's GPU (or pinned host) memory: K at offset 0, V at half the page.
    Gpu,
}

impl KvRows {
    /// The rows' bytes (host rows only).
    fn bytes(&self) -> &[u8] {
        match self {
            KvRows::F16(v) => bytemuck::cast_slice(v),
            KvRows::F32(v) => bytemuck::cast_slice(v),
            KvRows::Int8(v) => v,
            KvRows::Gpu => unreachable!("GPU rows are read with a copy"),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            KvRows::F16(v) => bytemuck::cast_slice_mut(v),
            KvRows::F32(v) => bytemuck::cast_slice_mut(v),
            KvRows::Int8(v) => v,
            KvRows::Gpu => unreachable!("GPU rows are written with a copy"),
        }
    }
}

/// The K and V rows of a sequence's first `len` positions, per layer, in host memory (a parked
/// conversation).
pub struct KvSnapshot {
    pub ty: KvType,
    pub kv_dim: usize,
    pub len: usize,
    pub layers: Vec<(KvRows, KvRows)>, // per layer: K (len - first, kv_dim), V (len - first, kv_dim)
    /// Per layer, the first position held: 0, or for a sliding-window layer the first one it had kept.
    pub firsts: Vec<usize>,
    /// The fewest positions this snapshot can be restored at: below it, a sliding-window layer would miss
    /// keys of its window (0 when every layer holds every position).
    pub min_len: usize,
}

impl KvSnapshot {
    /// Host bytes it holds.
    pub fn bytes(&self) -> u64 {
        let rows: usize = self.firsts.iter().map(|&f| self.len - f).sum();
        (rows * self.ty.row_bytes(self.kv_dim) * 2) as u64
    }
}

/// One page of one layer and the ledger entry that pays for it (on the layer's device or the host).
pub struct KvPage {
    pub k: KvRows,
    pub v: KvRows,
    alloc: PageMem,
}

/// What holds a page: its own allocation (K rows, then V rows, on GPUs), or a share of a layer's slab (a
/// restore allocates a layer's pages at once: one allocation, and the K rows of consecutive pages adjacent,
/// so each of K and V crosses to the GPU in one copy). Slab pages stay on the device: moving one would free
/// nothing. So after a restore under `--kv-resident`, a layer holds up to its restored window plus the
/// new one until the sequence is cut below the slab.
enum PageMem {
    Own(Allocation),
    Slab {
        slab: Arc<Allocation>,
        k: u64,
        v: u64,
    },
    /// Freed: every position of the page fell out of its sliding-window layer's window (no memory, no rows).
    Dropped,
}

impl PageMem {
    fn device(&self) -> Option<&Arc<Device>> {
        match self {
            PageMem::Own(a) => Some(a.device()),
            PageMem::Slab { slab, .. } => Some(slab.device()),
            PageMem::Dropped => None,
        }
    }
}

impl KvPage {
    /// A page freed by its sliding window, holding no rows.
    fn dropped(ty: KvType) -> KvPage {
        let rows = || match ty {
            KvType::F16 => KvRows::F16(Vec::new()),
            KvType::F32 => KvRows::F32(Vec::new()),
            KvType::Int8 => KvRows::Int8(Vec::new()),
        };
        KvPage { k: rows(), v: rows(), alloc: PageMem::Dropped }
    }

    /// Whether the page holds memory (it was not dropped by a sliding window).
    pub fn held(&self) -> bool {
        !matches!(self.alloc, PageMem::Dropped)
    }

    pub fn on_host(&self) -> bool {
        self.alloc.device().is_some_and(|d| d.is_host())
    }

    /// A device page that moving to the host would free: not on the host, and not part of a restored
    /// layer's slab (its memory goes only with the whole slab, when the sequence is cut below it).
    fn movable(&self) -> bool {
        self.held() && !self.on_host() && matches!(self.alloc, PageMem::Own(_))
    }

    /// The (K, V) addresses a GPU layer's page table lists for it: 0 for a page its sliding window freed
    /// (the kernels never read before a query's window).
    fn table_addrs(&self) -> (u64, u64) {
        if self.held() {
            self.gpu_addrs().expect("pages of a GPU layer have memory")
        } else {
            (0, 0)
        }
    }

    /// Addresses of its K and V rows, for a page in GPU (or pinned host) memory.
    fn gpu_addrs(&self) -> Option<(u64, u64)> {
        match &self.alloc {
            PageMem::Own(a) => {
                let mem = a.mem()?;
                Some((mem.ptr(), mem.ptr() + mem.bytes() / 2))
            }
            PageMem::Slab { k, v, .. } => Some((*k, *v)),
            PageMem::Dropped => None,
        }
    }
}

/// Runs of consecutive pages whose rows are adjacent in memory, as (first page, pages, address of the
/// first), for the K (`v` false) or V rows of GPU pages: one copy each.
fn adjacent_runs(pages: &[KvPage], v: bool, half_bytes: u64) -> Vec<(usize, usize, u64)> {
    let mut runs: Vec<(usize, usize, u64)> = Vec::new();
    for (i, p) in pages.iter().enumerate() {
        let (ka, va) = p.gpu_addrs().expect("pages of a GPU layer have memory");
        let a = if v { va } else { ka };
        match runs.last_mut() {
            Some((_, n, start)) if *start + *n as u64 * half_bytes == a => *n += 1,
            _ => runs.push((i, 1, a)),
        }
    }
    runs
}

/// The (address, bytes) of each run of adjacent pages among those holding rows `from_page *
/// KV_PAGE_TOKENS .. len` of `row` bytes (the pages a sliding window freed come before `from_page`), on the
/// K or the V side: the pieces of a transfer, in row order.
fn runs_of(pages: &[KvPage], from_page: usize, v: bool, len: usize, row: usize) -> impl Iterator<Item = (u64, usize)> {
    let used = len.div_ceil(KV_PAGE_TOKENS).min(pages.len());
    let from_page = from_page.min(used);
    adjacent_runs(&pages[from_page..used], v, (KV_PAGE_TOKENS * row) as u64).into_iter().map(
        move |(first, count, addr)| {
            let (first, end) = (from_page + first, from_page + first + count);
            let (from, to) = (first * KV_PAGE_TOKENS * row, (end * KV_PAGE_TOKENS).min(len) * row);
            (addr, to - from)
        },
    )
}

/// A GPU layer's page table on its device: `capacity` K-page addresses, then as many V-page addresses.
struct PageTable {
    alloc: Allocation,
    capacity: usize,
    /// The (K, V) addresses of the pages as last uploaded.
    uploaded: Vec<(u64, u64)>,
}

/// One layer's pages, oldest first; page `i` holds positions `i * KV_PAGE_TOKENS ..`.
pub struct LayerKv {
    pub device: Arc<Device>,
    pub pages: Vec<KvPage>,
    table: Option<PageTable>,
    /// A sliding-window layer's window (keys `pos + 1 - window ..= pos`): its old pages are freed, on the
    /// CPU as on a GPU (whose page table then lists 0 for them; its kernels start at the window).
    window: Option<usize>,
    /// Leading pages freed because they fell out of the window (`PageMem::Dropped`).
    dropped: usize,
}

impl LayerKv {
    /// The first position it holds when the sequence holds `len`: 0, or past the pages its sliding window
    /// freed. Snapshots and transfers start their rows there.
    fn first_kept(&self, len: usize) -> usize {
        (self.dropped * KV_PAGE_TOKENS).min(len)
    }

    /// The device addresses of the K and V page tables when they list the pages as they are now.
    fn current_tables(&self) -> Option<(u64, u64)> {
        let t = self.table.as_ref()?;
        let now = self.pages.iter().map(KvPage::table_addrs);
        let ptr = t.alloc.mem()?.ptr();
        now.eq(t.uploaded.iter().copied()).then_some((ptr, ptr + (t.capacity * 8) as u64))
    }
}

pub struct KvCache {
    pub ty: KvType,
    /// Values per row: `n_head_kv * head_dim`.
    pub kv_dim: usize,
    /// Most positions this cache may hold.
    pub max_tokens: usize,
    /// `--kv-resident`: positions per layer kept on the device (None: all).
    pub resident_tokens: Option<usize>,
    /// Positions filled.
    len: usize,
    host: Arc<Device>,
    pub layers: Vec<LayerKv>,
    /// Pages moved from a device to the host so far.
    spilled_pages: u64,
    /// Pinned buffers for parking and restoring, per GPU, made at the first and kept (pinning is slow).
    staging: Mutex<Vec<Staging>>,
    /// A position the sequence must stay able to be cut back to (the end of the last prompt, where the
    /// next turn's common prefix usually ends): sliding-window layers keep its window too.
    protect: Option<usize>,
}

impl KvCache {
    /// An empty cache with layer `l` on `layer_devices[l]`, holding at most `max_tokens` positions.
    /// `kv_dim` must be a multiple of 32 for int8.
    pub fn new(
        ty: KvType,
        kv_dim: usize,
        max_tokens: usize,
        layer_devices: Vec<Arc<Device>>,
        host: Arc<Device>,
        resident_tokens: Option<usize>,
    ) -> KvCache {
        KvCache {
            ty,
            kv_dim,
            max_tokens,
            resident_tokens,
            len: 0,
            host,
            layers: layer_devices
                .into_iter()
                .map(|device| LayerKv { device, pages: Vec::new(), table: None, window: None, dropped: 0 })
                .collect(),
            spilled_pages: 0,
            staging: Mutex::new(Vec::new()),
            protect: None,
        }
    }

    /// Gives the sliding-window layers their windows (`windows[l]`: None for a global layer): their pages
    /// that every later query's window has passed are freed as the sequence grows, on every device.
    pub fn set_windows(&mut self, windows: &[Option<usize>]) {
        for (l, &w) in self.layers.iter_mut().zip(windows) {
            l.window = w;
        }
    }

    /// Keeps the sequence able to be cut back to `pos` (None: only by `SWA_MARGIN_TOKENS`).
    pub fn set_protect(&mut self, pos: Option<usize>) {
        self.protect = pos;
    }

    /// The fewest positions the sequence can be cut back to (`truncate`) and still attend correctly: 0
    /// unless a sliding-window layer freed pages.
    pub fn min_len(&self) -> usize {
        let layer_min = |l: &LayerKv| match l.window {
            Some(w) if l.dropped > 0 => l.dropped * KV_PAGE_TOKENS + w - 1,
            _ => 0,
        };
        self.layers.iter().map(layer_min).max().unwrap_or(0)
    }

    /// Frees the pages of sliding-window layers that no query from the kept positions on reads: those
    /// before the window of the anchor, the protected position or the length less the margin, whichever
    /// is smaller.
    fn drop_stale(&mut self) {
        let anchor = self.len.saturating_sub(SWA_MARGIN_TOKENS).min(self.protect.unwrap_or(usize::MAX));
        let ty = self.ty;
        for l in &mut self.layers {
            let Some(w) = l.window else { continue };
            let to = ((anchor + 1).saturating_sub(w) / KV_PAGE_TOKENS).min(l.pages.len());
            for page in l.pages.iter_mut().take(to).skip(l.dropped) {
                *page = KvPage::dropped(ty);
            }
            l.dropped = l.dropped.max(to);
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position after the first `n` (the pages stay, for the next tokens). Below
    /// `min_len()` a sliding-window layer lacks keys: the cache is then emptied (the caller rereads).
    pub fn truncate(&mut self, n: usize) {
        if n < self.min_len() {
            self.clear();
        }
        self.len = self.len.min(n);
    }

    /// Frees the pages past the filled positions.
    pub fn release_unused(&mut self) {
        let keep = self.len.div_ceil(KV_PAGE_TOKENS);
        for l in &mut self.layers {
            l.pages.truncate(keep);
            l.dropped = l.dropped.min(keep);
            if l.pages.iter().all(|p| !p.held()) {
                l.pages.clear();
                l.dropped = 0;
            }
        }
    }

    /// Forgets everything and frees every page.
    pub fn clear(&mut self) {
        self.len = 0;
        self.release_unused();
    }

    /// Bytes of one page of one layer (K and V).
    pub fn page_bytes(&self) -> u64 {
        (KV_PAGE_TOKENS * self.ty.row_bytes(self.kv_dim) * 2) as u64
    }

    /// Bytes of storage held now, wherever it lives.
    pub fn allocated_bytes(&self) -> usize {
        self.layers.iter().map(|l| l.pages.iter().filter(|p| p.held()).count()).sum::<usize>()
            * self.page_bytes() as usize
    }

    /// Bytes held on the host because they were moved or put there (layers whose device is not the host).
    pub fn spilled_bytes(&self) -> u64 {
        let pages = self.layers.iter().filter(|l| !l.device.is_host()).flat_map(|l| &l.pages).filter(|p| p.on_host());
        pages.count() as u64 * self.page_bytes()
    }

    /// Pages moved from a device to the host so far.
    pub fn spilled_pages(&self) -> u64 {
        self.spilled_pages
    }

    /// The first page that stays on the device when the sequence holds `n` positions.
    fn first_resident_page(&self, n: usize) -> usize {
        match self.resident_tokens {
            None => 0,
            Some(r) => n.saturating_sub(r) / KV_PAGE_TOKENS,
        }
    }

    /// Makes room for positions up to `n` (exclusive), page by page, on each layer's device where it has
    /// room. On a hard failure the pages past the filled positions are freed and the error returned.
    pub fn reserve(&mut self, n: usize) -> Result<(), DeviceError> {
        let result = self.try_reserve(n, false);
        if result.is_err() {
            self.release_unused();
        }
        result
    }

    /// With `strict`, a device without room is an error instead of a reason to move KV to the host (a
    /// restore must not silently land somewhere else than the gate admitted).
    fn try_reserve(&mut self, n: usize, strict: bool) -> Result<(), DeviceError> {
        let need_pages = n.div_ceil(KV_PAGE_TOKENS);
        let first_resident = self.first_resident_page(n);
        let spilled_before = self.spilled_pages;
        let mut shrunk: Option<DeviceError> = None; // the last refusal that moved KV to the host
        for layer in 0..self.layers.len() {
            self.reserve_layer(layer, need_pages, first_resident, strict, &mut shrunk)?;
        }
        if let Some(e) = shrunk {
            tracing::info!(
                "KV at {n} positions: resident window shrank, {} page(s) of {} moved to the host ({e})",
                self.spilled_pages - spilled_before,
                crate::device::mib(self.page_bytes())
            );
        }
        Ok(())
    }

    /// Brings `layer` to `need_pages` pages: its pages out of the resident window move to the host, then
    /// a restore onto a GPU takes a slab, anything else grows page by page. `shrunk` keeps the last refusal
    /// that moved KV to the host.
    fn reserve_layer(
        &mut self,
        layer: usize,
        need_pages: usize,
        first_resident: usize,
        strict: bool,
        shrunk: &mut Option<DeviceError>,
    ) -> Result<(), DeviceError> {
        let on_host = self.layers[layer].device.is_host();
        if !on_host {
            self.spill_stale(layer, first_resident)?;
        }
        let gpu = self.layers[layer].device.gpu().cloned();
        let have = self.layers[layer].pages.len();
        if let (true, Some(g)) = (strict && !on_host && need_pages > have.max(first_resident), &gpu) {
            return self.reserve_slab(layer, g, need_pages, first_resident);
        }
        while self.layers[layer].pages.len() < need_pages {
            self.push_page(layer, gpu.as_ref(), first_resident, strict, shrunk)?;
        }
        Ok(())
    }

    /// Moves the device pages of `layer` that fell out of the resident window (before page
    /// `first_resident`) to the host.
    fn spill_stale(&mut self, layer: usize, first_resident: usize) -> Result<(), DeviceError> {
        let stale = self.layers[layer].pages.iter().take(first_resident).filter(|p| p.movable()).count();
        for _ in 0..stale {
            self.spill_oldest(layer)?;
        }
        Ok(())
    }

    /// A restore onto GPU layer `layer`: the pages before the resident window go to pinned host memory one
    /// by one, and the resident ones, up to `need_pages`, come from one slab on the device.
    fn reserve_slab(
        &mut self,
        layer: usize,
        g: &Arc<dyn Gpu>,
        need_pages: usize,
        first_resident: usize,
    ) -> Result<(), DeviceError> {
        let (page_bytes, host) = (self.page_bytes(), self.host.clone());
        let (have, dropped) = (self.layers[layer].pages.len(), self.layers[layer].dropped);
        for idx in have..first_resident.max(dropped).min(need_pages) {
            // Before a restored sliding-window layer's first kept position: no memory.
            if idx < dropped {
                self.layers[layer].pages.push(KvPage::dropped(self.ty));
                continue;
            }
            let alloc = PageMem::Own(host.alloc_pinned(g, Purpose::Kv, page_bytes)?);
            self.layers[layer].pages.push(KvPage { k: KvRows::Gpu, v: KvRows::Gpu, alloc });
        }
        let from = self.layers[layer].pages.len();
        let count = need_pages - from;
        if count == 0 {
            return Ok(());
        }
        let slab = Arc::new(self.layers[layer].device.alloc(Purpose::Kv, count as u64 * page_bytes)?);
        let base = slab.mem().expect("GPU allocations have memory").ptr();
        let half = page_bytes / 2;
        for i in 0..count as u64 {
            let (k, v) = (base + i * half, base + count as u64 * half + i * half);
            let alloc = PageMem::Slab { slab: slab.clone(), k, v };
            self.layers[layer].pages.push(KvPage { k: KvRows::Gpu, v: KvRows::Gpu, alloc });
        }
        Ok(())
    }

    /// Appends one page to `layer` (`gpu`: the layer's GPU, if any): on the host when the layer lives there
    /// or the page falls before the resident window, else on the layer's device where it has room.
    fn push_page(
        &mut self,
        layer: usize,
        gpu: Option<&Arc<dyn Gpu>>,
        first_resident: usize,
        strict: bool,
        shrunk: &mut Option<DeviceError>,
    ) -> Result<(), DeviceError> {
        let on_host = self.layers[layer].device.is_host();
        let idx = self.layers[layer].pages.len();
        if idx < self.layers[layer].dropped {
            // Before a restored sliding-window layer's first kept position.
            self.layers[layer].pages.push(KvPage::dropped(self.ty));
            return Ok(());
        }
        let alloc = if on_host || idx < first_resident {
            self.alloc_host_page(gpu)?
        } else {
            self.alloc_resident_page(layer, gpu, strict, shrunk)?
        };
        let (k, v) =
            if gpu.is_some() { (KvRows::Gpu, KvRows::Gpu) } else { (self.page_rows(strict)?, self.page_rows(strict)?) };
        self.layers[layer].pages.push(KvPage { k, v, alloc: PageMem::Own(alloc) });
        Ok(())
    }

    /// A page on the device of `layer`. Unless `strict`, a device without room shrinks the window: the
    /// oldest resident page makes room, or, with none left, the new page goes to the host (`shrunk` keeps
    /// the refusal).
    fn alloc_resident_page(
        &mut self,
        layer: usize,
        gpu: Option<&Arc<dyn Gpu>>,
        strict: bool,
        shrunk: &mut Option<DeviceError>,
    ) -> Result<Allocation, DeviceError> {
        loop {
            let device = self.layers[layer].device.clone();
            match device.alloc(Purpose::Kv, self.page_bytes()) {
                Ok(a) => return Ok(a),
                Err(e) if e.is_no_room() && !strict => {
                    let moved = self.spill_oldest(layer)?;
                    *shrunk = Some(e);
                    if !moved {
                        return self.alloc_host_page(gpu);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A page on the host: pinned memory the layer's GPU reads directly, or plain host memory.
    fn alloc_host_page(&self, gpu: Option<&Arc<dyn Gpu>>) -> Result<Allocation, DeviceError> {
        match gpu {
            Some(g) => self.host.alloc_pinned(g, Purpose::Kv, self.page_bytes()),
            None => self.host.alloc(Purpose::Kv, self.page_bytes()),
        }
    }

    /// The K (or V) rows of one page of a layer computed on the CPU, in host memory. A restore (`strict`)
    /// fills its pages itself: they start empty (no zeroing of bytes about to be overwritten). Page memory
    /// is taken fallibly: when the OS refuses it (an address-space limit, overcommit off), the request
    /// fails with the host's figures instead of the process aborting.
    fn page_rows(&self, strict: bool) -> Result<KvRows, DeviceError> {
        let (ty, kv_dim, host) = (self.ty, self.kv_dim, &self.host);
        let (n_values, n_i8) = (KV_PAGE_TOKENS * kv_dim, KV_PAGE_TOKENS * ty.row_bytes(kv_dim));
        let filled = !strict;
        Ok(match ty {
            KvType::F16 => KvRows::F16(host_vec(host, n_values, filled.then_some(f16::ZERO))?),
            KvType::F32 => KvRows::F32(host_vec(host, n_values, filled.then_some(0f32))?),
            KvType::Int8 => KvRows::Int8(host_vec(host, n_i8, filled.then_some(0u8))?),
        })
    }

    /// Moves the oldest device-resident page of `layer` to the host; false when none is left.
    fn spill_oldest(&mut self, layer: usize) -> Result<bool, DeviceError> {
        let device = self.layers[layer].device.clone();
        let gpu = device.gpu().cloned();
        let bytes = self.page_bytes();
        let Some(page) = self.layers[layer].pages.iter_mut().find(|p| p.movable()) else {
            return Ok(false);
        };
        let on_host = match &gpu {
            // A GPU page is copied to pinned host memory the GPU keeps reading.
            Some(g) => {
                let to = self.host.alloc_pinned(g, Purpose::Kv, bytes)?;
                let dst = to.mem().expect("pinned memory").ptr();
                let (k, v) = page.gpu_addrs().expect("a GPU page has memory");
                // SAFETY: `to` was just allocated with `bytes`; the page's K and V halves hold `bytes / 2`
                // each and the page is live (it is freed only after the synchronize below).
                unsafe {
                    g.dtod(dst, k, bytes / 2).map_err(|e| gpu_error(&device, e))?;
                    g.dtod(dst + bytes / 2, v, bytes / 2).map_err(|e| gpu_error(&device, e))?;
                }
                g.synchronize().map_err(|e| gpu_error(&device, e))?; // before the device page is freed
                to
            }
            // The data of a sim device is host memory already, so only the books change.
            None => self.host.alloc(Purpose::Kv, bytes)?,
        };
        // Dropping the old allocation frees the device bytes.
        self.host.count_copy_in(bytes);
        page.alloc = PageMem::Own(on_host);
        self.spilled_pages += 1;
        Ok(true)
    }

    /// Bytes each device needs to hold `n` positions (pages in the resident window on the layers' own
    /// devices; the host's pages are not listed).
    /// (A sliding-window layer needs only the pages of its window and margin.)
    pub fn device_need_bytes(&self, n: usize) -> Vec<(Arc<Device>, u64)> {
        self.device_need_bytes_from(n, &[])
    }

    /// [`device_need_bytes`](Self::device_need_bytes) for a restore of a snapshot whose layer `l` holds
    /// positions from `firsts[l]` on (a layer absent from `firsts`: the pages its window keeps).
    pub fn device_need_bytes_from(&self, n: usize, firsts: &[usize]) -> Vec<(Arc<Device>, u64)> {
        let total = n.div_ceil(KV_PAGE_TOKENS);
        let first_resident = self.first_resident_page(n).min(total);
        let mut l = 0;
        self.pages_per_device(|layer| {
            let kept = layer.window.map_or(0, |w| (n.saturating_sub(SWA_MARGIN_TOKENS) + 1).saturating_sub(w));
            let first_kept = firsts.get(l).copied().unwrap_or(kept).min(n);
            l += 1;
            total - first_resident.max((first_kept / KV_PAGE_TOKENS).min(total))
        })
    }

    /// Bytes of pages this cache holds on each of its layers' devices (not the host).
    pub fn device_held_bytes(&self) -> Vec<(Arc<Device>, u64)> {
        self.pages_per_device(|l| l.pages.iter().filter(|p| p.held() && !p.on_host()).count())
    }

    /// `pages(layer)` pages of each layer on a device other than the host, summed per device, in bytes
    /// (`pages` is called once per layer, in order).
    fn pages_per_device(&self, mut pages: impl FnMut(&LayerKv) -> usize) -> Vec<(Arc<Device>, u64)> {
        let mut out: Vec<(Arc<Device>, u64)> = Vec::new();
        for l in &self.layers {
            let n = pages(l);
            if l.device.is_host() {
                continue;
            }
            let bytes = n as u64 * self.page_bytes();
            match out.iter_mut().find(|(d, _)| Arc::ptr_eq(d, &l.device)) {
                Some((_, b)) => *b += bytes,
                None => out.push((l.device.clone(), bytes)),
            }
        }
        out
    }

    /// Host bytes a snapshot of the filled positions takes (`KvSnapshot::bytes` of `snapshot()`).
    pub fn snapshot_bytes(&self) -> u64 {
        let rows: usize = self.layers.iter().map(|l| self.len - l.first_kept(self.len)).sum();
        (rows * self.ty.row_bytes(self.kv_dim) * 2) as u64
    }

    /// A host copy of the first `len()` positions, copied page by page (no second full copy on the way).
    /// Fails only when a GPU fails the copy.
    pub fn snapshot(&self) -> Result<KvSnapshot, DeviceError> {
        self.snapshot_into(None)
    }

    /// [`snapshot`](Self::snapshot) into the buffers of `reuse` (a snapshot the cache just evicted) where
    /// they fit: memory already touched is written at memcpy speed, fresh memory pays a page fault per 4 KiB.
    pub fn snapshot_into(&self, reuse: Option<KvSnapshot>) -> Result<KvSnapshot, DeviceError> {
        let (n, dim, row) = (self.len, self.kv_dim, self.ty.row_bytes(self.kv_dim));
        let fits = |s: &KvSnapshot| s.ty == self.ty && s.kv_dim == dim && s.layers.len() == self.layers.len();
        let mut spare: Vec<(KvRows, KvRows)> = reuse.filter(fits).map(|s| s.layers).unwrap_or_default();
        spare.reverse();
        let copy = |layer: &LayerKv, v_half: bool, buf: Option<KvRows>| -> Result<KvRows, DeviceError> {
            let first = layer.first_kept(n);
            let n = n - first;
            let mut out = match (self.ty, buf) {
                (KvType::F16, Some(KvRows::F16(mut v))) => {
                    v.clear();
                    KvRows::F16(v)
                }
                (KvType::F32, Some(KvRows::F32(mut v))) => {
                    v.clear();
                    KvRows::F32(v)
                }
                (KvType::Int8, Some(KvRows::Int8(mut v))) => {
                    v.clear();
                    KvRows::Int8(v)
                }
                (KvType::F16, _) => KvRows::F16(host_vec(&self.host, n * dim, None)?),
                (KvType::F32, _) => KvRows::F32(host_vec(&self.host, n * dim, None)?),
                (KvType::Int8, _) => KvRows::Int8(host_vec(&self.host, n * row, None)?),
            };
            if layer.device.gpu().is_some() {
                // Sized here, filled from the device below (`download`), all GPU layers together.
                match &mut out {
                    KvRows::F16(o) => o.resize(n * dim, f16::ZERO),
                    KvRows::F32(o) => o.resize(n * dim, 0.0),
                    KvRows::Int8(o) => o.resize(n * row, 0),
                    KvRows::Gpu => unreachable!("snapshots live in host memory"),
                }
                return Ok(out);
            }
            let held = layer.pages.iter().enumerate().skip(layer.dropped);
            for (i, page) in held.take((n + first).div_ceil(KV_PAGE_TOKENS).saturating_sub(layer.dropped)) {
                let rows = (n + first - i * KV_PAGE_TOKENS).min(KV_PAGE_TOKENS);
                let src = if v_half { &page.v } else { &page.k };
                match (&mut out, src) {
                    (KvRows::F16(o), KvRows::F16(p)) => o.extend_from_slice(&p[..rows * dim]),
                    (KvRows::F32(o), KvRows::F32(p)) => o.extend_from_slice(&p[..rows * dim]),
                    (KvRows::Int8(o), KvRows::Int8(p)) => o.extend_from_slice(&p[..rows * row]),
                    _ => unreachable!("a cache holds one KV type"),
                }
            }
            // A larger reused buffer gives its tail back: the cache counts what a snapshot holds.
            match &mut out {
                KvRows::F16(o) => o.shrink_to_fit(),
                KvRows::F32(o) => o.shrink_to_fit(),
                KvRows::Int8(o) => o.shrink_to_fit(),
                KvRows::Gpu => {}
            }
            Ok(out)
        };
        let mut layers: Vec<(KvRows, KvRows)> = self
            .layers
            .iter()
            .map(|l| {
                let (bk, bv) = spare.pop().map_or((None, None), |(k, v)| (Some(k), Some(v)));
                Ok((copy(l, false, bk)?, copy(l, true, bv)?))
            })
            .collect::<Result<_, DeviceError>>()?;
        self.download(&mut layers)?;
        let firsts = self.layers.iter().map(|l| l.first_kept(n)).collect();
        Ok(KvSnapshot { ty: self.ty, kv_dim: dim, len: n, layers, firsts, min_len: self.min_len() })
    }

    /// The first `len()` rows of every GPU layer's pages into `out` (sized already), per GPU in one staged
    /// transfer: a piece per layer side gathered through its page table on the device where that table is
    /// current (the forward pass keeps it so), else a piece per run of adjacent pages.
    fn download(&self, out: &mut [(KvRows, KvRows)]) -> Result<(), DeviceError> {
        let row = self.ty.row_bytes(self.kv_dim);
        for device in self.gpu_devices() {
            let mut pieces: Vec<(Source, &mut [u8])> = Vec::new();
            let mut gathered: Vec<(usize, bool)> = Vec::new(); // (layer, V side) of each Source::Pages piece
            for (l, (layer, (k, v))) in self.layers.iter().zip(out.iter_mut()).enumerate() {
                if !Arc::ptr_eq(&layer.device, &device) {
                    continue;
                }
                let tables = layer.current_tables();
                let first = layer.first_kept(self.len);
                for (v_half, rows) in [(false, k), (true, v)] {
                    let mut rest = &mut rows.bytes_mut()[..(self.len - first) * row];
                    if let Some((kt, vt)) = tables {
                        let table = if v_half { vt } else { kt };
                        pieces.push((Source::Pages { table, row0: first, row_bytes: row }, rest));
                        gathered.push((l, v_half));
                        continue;
                    }
                    for (addr, len) in runs_of(&layer.pages, layer.dropped, v_half, self.len, row) {
                        let (piece, tail) = std::mem::take(&mut rest).split_at_mut(len);
                        pieces.push((Source::At(addr), piece));
                        rest = tail;
                    }
                }
            }
            let bytes: usize = pieces.iter().map(|p| p.1.len()).sum();
            self.staged(&device, bytes, |staging, gpu| match staging {
                Some(s) => s.download(&mut pieces),
                // No room for staging: a copy per run of adjacent pages (gathering needs a pinned target).
                None => pieces.iter_mut().try_for_each(|(source, dst)| match source {
                    // SAFETY: the address starts a run of adjacent live pages holding the piece's bytes.
                    Source::At(addr) => unsafe { gpu.dtoh(dst, *addr) },
                    Source::Pages { .. } => {
                        let (l, v_half) = gathered.remove(0);
                        let layer = &self.layers[l];
                        let mut at = 0;
                        for (addr, len) in runs_of(&layer.pages, layer.dropped, v_half, self.len, row) {
                            // SAFETY: as above.
                            unsafe { gpu.dtoh(&mut dst[at..at + len], addr)? };
                            at += len;
                        }
                        Ok(())
                    }
                }),
            })?;
        }
        Ok(())
    }

    /// The devices of the GPU layers, each once.
    fn gpu_devices(&self) -> Vec<Arc<Device>> {
        let mut out: Vec<Arc<Device>> = Vec::new();
        for l in self.layers.iter().filter(|l| l.device.gpu().is_some()) {
            if !out.iter().any(|d| Arc::ptr_eq(d, &l.device)) {
                out.push(l.device.clone());
            }
        }
        out
    }

    /// Runs `copy` of `bytes` with pinned staging for `device`'s GPU, or without (one synchronous copy per
    /// piece) when the host has no room for the staging buffers.
    fn staged(
        &self,
        device: &Arc<Device>,
        bytes: usize,
        copy: impl FnOnce(Option<&Staging>, &Arc<dyn Gpu>) -> Result<(), GpuError>,
    ) -> Result<(), DeviceError> {
        let gpu = device.gpu().expect("a GPU layer's device");
        let row = self.ty.row_bytes(self.kv_dim);
        let mut kept = self.staging.lock_unpoisoned();
        let at = match kept.iter().position(|s| s.suits(gpu, bytes, row)) {
            Some(i) => Some(i),
            None => {
                kept.retain(|s| !s.suits(gpu, 0, 1)); // a smaller one for this GPU goes
                Staging::new(&self.host, gpu, bytes, row).ok().map(|s| {
                    kept.push(s);
                    kept.len() - 1
                })
            }
        };
        copy(at.map(|i| &kept[i]), gpu).map_err(|e| gpu_error(device, e))
    }

    /// Replaces the contents with the first `n` positions of `snap`: every page is allocated first, on the
    /// layers' devices (no move to the host: a device without room is an error), then filled page by page.
    /// On error the cache is left empty with nothing allocated.
    pub fn restore(&mut self, snap: &KvSnapshot, n: usize) -> Result<(), DeviceError> {
        debug_assert!(snap.ty == self.ty && snap.kv_dim == self.kv_dim && snap.layers.len() == self.layers.len());
        let n = n.min(snap.len).min(self.max_tokens);
        self.clear();
        if n < snap.min_len {
            // A sliding-window layer of the snapshot lacks keys a query at `n` reads (the cache's lookup
            // never asks this): nothing restored, the caller rereads.
            return Err(DeviceError::Unavailable {
                device: self.host.name(),
                why: format!("the snapshot restores at {} positions or more, not {n}", snap.min_len),
            });
        }
        for (layer, &first) in self.layers.iter_mut().zip(&snap.firsts) {
            layer.dropped = first / KV_PAGE_TOKENS;
        }
        if let Err(e) = self.try_reserve(n, true) {
            self.clear();
            return Err(e);
        }
        let (dim, row) = (self.kv_dim, self.ty.row_bytes(self.kv_dim));
        for ((layer, (sk, sv)), &first) in self.layers.iter_mut().zip(&snap.layers).zip(&snap.firsts) {
            if layer.device.gpu().is_some() {
                continue; // copied below (`upload`), all GPU layers together
            }
            for (i, page) in layer.pages.iter_mut().enumerate().skip(layer.dropped) {
                let rows = n.saturating_sub(i * KV_PAGE_TOKENS).min(KV_PAGE_TOKENS);
                // The snapshot's rows start at its first kept position.
                let at = i * KV_PAGE_TOKENS - first;
                for (dst, src) in [(&mut page.k, sk), (&mut page.v, sv)] {
                    match (dst, src) {
                        (KvRows::F16(d), KvRows::F16(s)) => {
                            d.extend_from_slice(&s[at * dim..(at + rows) * dim]);
                            d.resize(KV_PAGE_TOKENS * dim, f16::ZERO);
                        }
                        (KvRows::F32(d), KvRows::F32(s)) => {
                            d.extend_from_slice(&s[at * dim..(at + rows) * dim]);
                            d.resize(KV_PAGE_TOKENS * dim, 0.0);
                        }
                        (KvRows::Int8(d), KvRows::Int8(s)) => {
                            d.extend_from_slice(&s[at * row..(at + rows) * row]);
                            d.resize(KV_PAGE_TOKENS * row, 0);
                        }
                        _ => unreachable!("a cache holds one KV type"),
                    }
                }
                if let Some(d) = page.alloc.device() {
                    d.count_copy_in((rows * row * 2) as u64);
                }
            }
        }
        self.len = n;
        if let Err(e) = self.upload(snap) {
            self.clear();
            return Err(e);
        }
        Ok(())
    }

    /// The first `len()` rows of `snap` into the GPU layers' pages (allocated already): a copy per run of
    /// adjacent pages (a whole layer's K, then its V, for the slab a restore allocates).
    fn upload(&self, snap: &KvSnapshot) -> Result<(), DeviceError> {
        let row = self.ty.row_bytes(self.kv_dim);
        for device in self.gpu_devices() {
            let mut pieces: Vec<(u64, &[u8])> = Vec::new();
            for (layer, (k, v)) in self.layers.iter().zip(&snap.layers) {
                if !Arc::ptr_eq(&layer.device, &device) {
                    continue;
                }
                let first = layer.first_kept(self.len);
                for (v_half, rows) in [(false, k), (true, v)] {
                    let mut rest = &rows.bytes()[..(self.len - first) * row];
                    for (addr, len) in runs_of(&layer.pages, layer.dropped, v_half, self.len, row) {
                        let (piece, tail) = rest.split_at(len);
                        pieces.push((addr, piece));
                        rest = tail;
                    }
                }
            }
            // Straight from the snapshot's pageable memory: a restore's pages are a slab (a copy per layer
            // side), and the driver's own staging measured faster there than ours (H200: 5.2-6.8 GB/s
            // against 2.0-4.9, BENCHMARKS.md).
            let gpu = device.gpu().expect("a GPU layer's device");
            for (addr, src) in &pieces {
                // SAFETY: each piece's address starts a run of adjacent live pages with room for its bytes.
                unsafe { gpu.htod(*addr, src) }.map_err(|e| gpu_error(&device, e))?;
            }
            device.count_copy_in(pieces.iter().map(|p| p.1.len() as u64).sum());
        }
        Ok(())
    }

    /// Marks positions up to `n` (exclusive) as filled; they must have been written.
    /// Sliding-window layers then free the pages their windows have passed.
    pub fn set_len(&mut self, n: usize) {
        debug_assert!(self.layers.iter().all(|l| l.pages.len() * KV_PAGE_TOKENS >= n));
        self.len = n;
        self.drop_stale();
    }

    /// The device addresses of GPU layer `layer`'s K and V page tables, uploaded when its pages changed
    /// since the last call. The table is allocated on the layer's device at the first call, for
    /// `max_tokens` positions, and kept.
    pub fn gpu_tables(&mut self, layer: usize) -> Result<(u64, u64), DeviceError> {
        let capacity = self.max_tokens.div_ceil(KV_PAGE_TOKENS).max(1);
        let l = &mut self.layers[layer];
        let device = l.device.clone();
        if l.table.is_none() {
            // On the device; when it has no room (its reserve, pressure), in pinned host memory the GPU
            // reads as well: a full card must not stop a sequence for want of a few hundred bytes.
            let bytes = (2 * capacity * 8) as u64;
            let alloc = match device.alloc(Purpose::Kv, bytes) {
                Err(e) if e.is_no_room() => {
                    let gpu = device.gpu().expect("page tables belong to GPU layers");
                    self.host.alloc_pinned(gpu, Purpose::Kv, bytes)?
                }
                other => other?,
            };
            l.table = Some(PageTable { alloc, capacity, uploaded: Vec::new() });
        }
        let t = l.table.as_mut().expect("just made");
        let mem = t.alloc.mem().expect("a GPU allocation has memory");
        let current = l.pages.iter().map(KvPage::table_addrs);
        if !current.clone().eq(t.uploaded.iter().copied()) {
            let now: Vec<(u64, u64)> = current.collect();
            let (ks, vs): (Vec<u64>, Vec<u64>) = now.iter().copied().unzip();
            for (at, list) in [(0, &ks), ((t.capacity * 8) as u64, &vs)] {
                mem.write_at(at, bytemuck::cast_slice(list)).map_err(|e| gpu_error(&device, e))?;
            }
            t.uploaded = now;
        }
        Ok((mem.ptr(), mem.ptr() + (t.capacity * 8) as u64))
    }

    /// Writes the K and V rows of position `pos` in layer `layer`.
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let dim = self.kv_dim;
        let row = self.ty.row_bytes(dim);
        let page = &mut self.layers[layer].pages[pos / KV_PAGE_TOKENS];
        let r = pos % KV_PAGE_TOKENS;
        for (rows, src) in [(&mut page.k, k), (&mut page.v, v)] {
            match rows {
                KvRows::F16(buf) => {
                    for (d, s) in buf[r * dim..(r + 1) * dim].iter_mut().zip(src) {
                        *d = f16::from_f32(*s);
                    }
                }
                KvRows::F32(buf) => buf[r * dim..(r + 1) * dim].copy_from_slice(&src[..dim]),
                KvRows::Int8(buf) => quant::quantize_q8_0_row(src, &mut buf[r * row..(r + 1) * row]),
                KvRows::Gpu => unreachable!("GPU layers store K and V with a kernel"),
            }
        }
    }
}

/// A GPU failure as the device's error.
fn gpu_error(device: &Device, e: crate::device::cuda::gpu::GpuError) -> DeviceError {
    DeviceError::Gpu { device: device.name(), msg: e.to_string(), sticky: e.is_sticky() }
}

/// A host buffer of `len` elements, empty with that capacity or filled with `fill`, taken fallibly: a refusal
/// by the OS becomes the host's [`DeviceError::HostRefused`] instead of an abort.
fn host_vec<T: Clone>(host: &Arc<Device>, len: usize, fill: Option<T>) -> Result<Vec<T>, DeviceError> {
    let mut v = Vec::new();
    if v.try_reserve_exact(len).is_err() {
        return Err(DeviceError::HostRefused {
            device: host.name(),
            purpose: Purpose::Kv,
            need_bytes: (len * std::mem::size_of::<T>()) as u64,
            held_bytes: host.usage().bytes(Purpose::Kv),
        });
    }
    if let Some(x) = fill {
        v.resize(len, x);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(resident: Option<usize>, device: Arc<Device>) -> (KvCache, Arc<Device>) {
        let host = Device::cpu(1);
        (KvCache::new(KvType::F16, 64, 4096, vec![device.clone(), device], host.clone(), resident), host)
    }

    fn resident_pages(kv: &KvCache) -> Vec<usize> {
        kv.layers.iter().map(|l| l.pages.iter().filter(|p| !p.on_host()).count()).collect()
    }

    #[test]
    fn old_pages_leave_the_device_past_the_resident_window() {
        let dev = Device::sim(0, 64 << 20, 0);
        let (mut kv, host) = cache(Some(100), dev.clone());
        kv.reserve(1000).unwrap();
        kv.set_len(1000);
        // 16 pages cover 1000 positions; the newest 100 positions span pages 14 and 15.
        assert_eq!(kv.layers[0].pages.len(), 16);
        assert_eq!(resident_pages(&kv), [2, 2]);
        assert_eq!(dev.usage().bytes(Purpose::Kv), 4 * kv.page_bytes());
        assert_eq!(host.usage().bytes(Purpose::Kv), 28 * kv.page_bytes());
        assert_eq!(kv.spilled_bytes(), 28 * kv.page_bytes());
        kv.clear();
        assert_eq!((dev.usage().total_bytes, host.usage().total_bytes), (0, 0));
    }

    #[test]
    fn a_full_device_moves_its_oldest_pages_and_a_hard_failure_frees_the_new_ones() {
        let page = (KV_PAGE_TOKENS * 64 * 2 * 2) as u64;
        let dev = Device::sim(0, 3 * page, 0);
        let (mut kv, host) = cache(None, dev.clone());
        kv.reserve(64 * 5).unwrap(); // 10 pages wanted, room for 3
        kv.set_len(64 * 5);
        assert_eq!(dev.usage().bytes(Purpose::Kv), 3 * page);
        assert_eq!(resident_pages(&kv).iter().sum::<usize>(), 3);
        // Layer 0 keeps its newest pages; layer 1, finding no room and nothing of its own to move, went to
        // the host.
        assert!(
            kv.layers[0].pages[..2].iter().all(|p| p.on_host()) && kv.layers[0].pages[2..].iter().all(|p| !p.on_host())
        );
        assert!(kv.layers[1].pages.iter().all(|p| p.on_host()));
        assert_eq!(host.usage().bytes(Purpose::Kv), 7 * page);

        dev.inject(crate::device::Fault::FailAllocs(1)).unwrap();
        let e = kv.reserve(64 * 7).unwrap_err();
        assert!(matches!(e, DeviceError::AllocFailed { .. }));
        assert_eq!(kv.allocated_bytes() as u64, 10 * page, "pages past the filled positions were freed");
        assert_eq!(kv.len(), 64 * 5);
    }

    #[test]
    fn kv_types_parse_print_and_size() {
        for (name, ty, row) in [("f16", KvType::F16, 128), ("f32", KvType::F32, 256), ("int8", KvType::Int8, 68)] {
            assert_eq!(name.parse::<KvType>(), Ok(ty));
            assert_eq!(ty.to_string(), name);
            assert_eq!(ty.row_bytes(64), row);
        }
        assert_eq!("q8_0".parse::<KvType>(), Ok(KvType::Int8));
        let e = "f64".parse::<KvType>().unwrap_err();
        assert!(e.contains("f16, f32 or int8"), "{e}");
    }

    /// Row `pos` of layer `layer`'s K (`v` false) or V rows, as the bits of its values (f32 KV).
    fn f32_row(kv: &KvCache, layer: usize, pos: usize, v: bool) -> Vec<u32> {
        let page = &kv.layers[layer].pages[pos / KV_PAGE_TOKENS];
        let KvRows::F32(rows) = (if v { &page.v } else { &page.k }) else { panic!("f32 KV holds f32 rows") };
        let r = pos % KV_PAGE_TOKENS;
        rows[r * kv.kv_dim..(r + 1) * kv.kv_dim].iter().map(|x| x.to_bits()).collect()
    }

    /// The K and V values of position `pos`: bit patterns f16 would not keep (subnormals, large and tiny
    /// magnitudes, a NaN's payload, negative zero).
    fn awkward_values(pos: usize, dim: usize) -> (Vec<f32>, Vec<f32>) {
        let k =
            (0..dim).map(|i| f32::from_bits(0x3f80_0001u32.wrapping_mul(pos as u32 * 977 + i as u32 + 1))).collect();
        let v = (0..dim)
            .map(|i| match i % 4 {
                0 => f32::from_bits(1 + pos as u32), // subnormal
                1 => -0.0,
                2 => f32::from_bits(0x7fc0_1234), // a NaN with a payload
                _ => 1e30 / (pos + i + 1) as f32,
            })
            .collect();
        (k, v)
    }

    #[test]
    fn f32_kv_keeps_the_bits_written_through_a_snapshot_and_a_restore() {
        let dim = 64;
        let dev = Device::sim(0, 64 << 20, 0);
        let host = Device::cpu(1);
        // Layer 0 on a sim device keeping the newest 100 positions (older pages on the host), layer 1 on
        // the host.
        let layers = vec![dev.clone(), host.clone()];
        let mut kv = KvCache::new(KvType::F32, dim, 4096, layers.clone(), host.clone(), Some(100));
        let n = 300;
        kv.reserve(n).unwrap();
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        let mut want = Vec::new();
        for pos in 0..n {
            let (k, v) = awkward_values(pos, dim);
            for layer in 0..2 {
                kv.write(layer, pos, &k, &v);
            }
            want.push((bits(&k), bits(&v)));
        }
        kv.set_len(n);
        assert!(kv.layers[0].pages.iter().any(|p| p.on_host()) && kv.layers[0].pages.iter().any(|p| !p.on_host()));
        assert_eq!(kv.page_bytes(), (KV_PAGE_TOKENS * dim * 4 * 2) as u64);
        for (pos, (k, v)) in want.iter().enumerate() {
            for layer in 0..2 {
                assert_eq!(&f32_row(&kv, layer, pos, false), k, "K of position {pos}, layer {layer}");
                assert_eq!(&f32_row(&kv, layer, pos, true), v, "V of position {pos}, layer {layer}");
            }
        }

        let snap = kv.snapshot().unwrap();
        assert_eq!(snap.bytes(), kv.snapshot_bytes());
        assert_eq!(snap.bytes(), (n * dim * 4 * 2 * 2) as u64);
        // Into the buffers of an earlier snapshot: the same bits, and the buffers sized to what they hold.
        let again = kv.snapshot_into(Some(kv.snapshot().unwrap())).unwrap();
        let bytes = |s: &KvSnapshot| -> Vec<Vec<u8>> {
            s.layers.iter().flat_map(|(k, v)| [k.bytes().to_vec(), v.bytes().to_vec()]).collect()
        };
        assert_eq!(bytes(&again), bytes(&snap));

        let mut back = KvCache::new(KvType::F32, dim, 4096, layers, host, Some(100));
        back.restore(&snap, n).unwrap();
        assert_eq!(back.len(), n);
        for (pos, (k, v)) in want.iter().enumerate() {
            for layer in 0..2 {
                assert_eq!(&f32_row(&back, layer, pos, false), k, "restored K of position {pos}, layer {layer}");
                assert_eq!(&f32_row(&back, layer, pos, true), v, "restored V of position {pos}, layer {layer}");
            }
        }
        assert_eq!(bytes(&back.snapshot().unwrap()), bytes(&snap));
        // A shorter restore keeps the first positions only.
        back.restore(&snap, 70).unwrap();
        assert_eq!(bytes(&back.snapshot().unwrap())[0], snap.layers[0].0.bytes()[..70 * dim * 4].to_vec());
    }
}
