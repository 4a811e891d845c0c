//! The CPU emulator of a GPU (`emu:MIB` devices): device memory is host memory, and kernels run through
//! kernels/emu (the same CUDA sources compiled as C++, one fiber per CUDA thread). Slow, exact to the CUDA
//! execution model the kernels rely on (blocks, barriers, warp shuffles), and available everywhere, so the
//! CUDA backend's host code and kernels are tested on machines without a GPU.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::sync::LockUnpoisoned;

use super::gpu::{Arg, Dims, Gpu, GpuError};

extern "C" {
    fn strata_emu_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        args: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn strata_emu_signature(name: *const c_char, out: *mut c_char, out_len: usize) -> c_int;
    fn strata_emu_kernel_count() -> usize;
    fn strata_emu_kernel_name(i: usize) -> *const c_char;
}

/// Alignment of emulated allocations (cudaMalloc gives at least 256).
const ALIGN: usize = 256;

/// An emulated GPU with `capacity_bytes` of memory.
#[derive(Debug)]
pub struct EmuGpu {
    capacity_bytes: u64,
    /// Live allocations: address -> bytes.
    live: Mutex<HashMap<u64, usize>>,
    /// Live "pinned host" allocations (host memory that does not count against the card).
    host: Mutex<HashMap<u64, usize>>,
    /// Set by `poison`: the context faulted, every later call fails with a sticky error.
    poisoned: AtomicBool,
}

impl EmuGpu {
    pub fn new(capacity_bytes: u64) -> EmuGpu {
        EmuGpu {
            capacity_bytes,
            live: Mutex::new(HashMap::new()),
            host: Mutex::new(HashMap::new()),
            poisoned: AtomicBool::new(false),
        }
    }

    /// The sticky error of a poisoned context.
    fn check(&self) -> Result<(), GpuError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(GpuError::Driver {
                what: "emulated GPU".into(),
                msg: "the context faulted (injected): an illegal memory access".into(),
                sticky: true,
            });
        }
        Ok(())
    }

    fn held_bytes(&self) -> u64 {
        self.live.lock_unpoisoned().values().map(|&b| b as u64).sum()
    }

    fn take(&self, bytes: u64) -> Result<u64, GpuError> {
        if self.held_bytes().saturating_add(bytes) > self.capacity_bytes {
            return Err(GpuError::OutOfMemory { bytes });
        }
        let size = (bytes as usize).max(1);
        let layout = std::alloc::Layout::from_size_align(size, ALIGN).map_err(|_| GpuError::OutOfMemory { bytes })?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(GpuError::OutOfMemory { bytes });
        }
        self.live.lock_unpoisoned().insert(p as u64, size);
        Ok(p as u64)
    }

    fn give(&self, ptr: u64) {
        if let Some(size) = self.live.lock_unpoisoned().remove(&ptr) {
            let layout = std::alloc::Layout::from_size_align(size, ALIGN).expect("checked at allocation");
            // SAFETY: allocated by `take` with this layout, and removed from `live` so freed once.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
    }
}

impl Drop for EmuGpu {
    fn drop(&mut self) {
        let ptrs: Vec<u64> = self.live.lock_unpoisoned().keys().copied().collect();
        for p in ptrs {
            self.give(p);
        }
        let ptrs: Vec<u64> = self.host.lock_unpoisoned().keys().copied().collect();
        for p in ptrs {
            // SAFETY: the emulator is gone with this drop: nothing can use its host memory after it.
            unsafe { self.free_host(p) };
        }
    }
}

impl Gpu for EmuGpu {
    fn describe(&self) -> String {
        "CUDA emulated on the CPU".into()
    }

    fn mem_info(&self) -> Result<(u64, u64), GpuError> {
        self.check()?;
        Ok((self.capacity_bytes.saturating_sub(self.held_bytes()), self.capacity_bytes))
    }

    fn alloc(&self, bytes: u64) -> Result<u64, GpuError> {
        self.check()?;
        self.take(bytes)
    }

    unsafe fn free(&self, ptr: u64) {
        self.give(ptr);
    }

    fn alloc_host(&self, bytes: u64) -> Result<u64, GpuError> {
        self.check()?;
        // Host memory is host memory; it does not count against the emulated card.
        let size = (bytes as usize).max(1);
        let layout = std::alloc::Layout::from_size_align(size, ALIGN).map_err(|_| GpuError::OutOfMemory { bytes })?;
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(GpuError::OutOfMemory { bytes });
        }
        self.host.lock_unpoisoned().insert(p as u64, size);
        Ok(p as u64)
    }

    unsafe fn free_host(&self, ptr: u64) {
        if let Some(size) = self.host.lock_unpoisoned().remove(&ptr) {
            let layout = std::alloc::Layout::from_size_align(size, ALIGN).expect("checked at allocation");
            // SAFETY: allocated by `alloc_host` with this layout, freed once.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
    }

    unsafe fn htod(&self, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        self.check()?;
        // SAFETY: the caller's contract (`Gpu::htod`): `dst` lies in an allocation of this emulator (or
        // alloc_host) holding at least `src.len()` bytes from there.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn dtoh(&self, dst: &mut [u8], src: u64) -> Result<(), GpuError> {
        self.check()?;
        // SAFETY: as in `htod`.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn dtod(&self, dst: u64, src: u64, bytes: u64) -> Result<(), GpuError> {
        self.check()?;
        // SAFETY: as in `htod`; `copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes as usize) };
        Ok(())
    }

    unsafe fn launch_unchecked(&self, kernel: &'static str, dims: Dims, args: &mut [Arg]) -> Result<(), GpuError> {
        self.check()?;
        let name = CString::new(kernel)
            .map_err(|_| GpuError::BadLaunch { kernel: kernel.to_owned(), why: "a NUL in the name".into() })?;
        let mut params: Vec<*mut c_void> = args.iter_mut().map(Arg::as_param).collect();
        let mut err = [0 as c_char; 256];
        // SAFETY: the arguments were checked against the kernel's parameter kinds (gpu::launch), every
        // param points at a live value of that kind, and the addresses are this emulator's.
        let rc = unsafe {
            strata_emu_launch(
                name.as_ptr(),
                dims.grid.as_ptr(),
                dims.block.as_ptr(),
                params.as_mut_ptr(),
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if rc != 0 {
            // SAFETY: the emulator NUL-terminates its message within the buffer.
            let msg = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
            return Err(GpuError::Driver { what: format!("launch {kernel}"), msg, sticky: true });
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        self.check()
    }

    fn poison(&self) -> bool {
        self.poisoned.store(true, Ordering::Release);
        true
    }
}

/// The kernels the emulator has and their parameter kinds (one letter each, as `kernels::Entry::params`).
pub fn signatures() -> Vec<(String, String)> {
    // SAFETY: plain queries of static tables; names are NUL-terminated statics.
    unsafe {
        (0..strata_emu_kernel_count())
            .filter_map(|i| {
                let name = CStr::from_ptr(strata_emu_kernel_name(i)).to_string_lossy().into_owned();
                let cname = CString::new(name.clone()).ok()?;
                let mut out = [0 as c_char; 64];
                (strata_emu_signature(cname.as_ptr(), out.as_mut_ptr(), out.len()) == 0)
                    .then(|| (name, CStr::from_ptr(out.as_ptr()).to_string_lossy().into_owned()))
            })
            .collect()
    }
}
