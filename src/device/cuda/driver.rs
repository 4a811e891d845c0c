//! A real GPU through the CUDA driver (cudarc's raw driver API, the library loaded at run time): one
//! primary context and one stream per device, every kernel of the embedded PTX loaded once, synchronous
//! `cuMemAlloc` (so `cuMemGetInfo` sees every allocation at once: the restore gate's samples are current).
//!
//! A sticky error (the context faulted: illegal address, launch failure, ...) poisons the device: every
//! later call fails with it and `faulted()` reports it, so the engine can stop instead of computing on.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

use crate::sync::LockUnpoisoned;

use super::gpu::{Arg, Dims, Gpu, GpuError};
use super::kernels::{self, KERNEL_FILES};

/// Driver errors after which the context is unusable.
fn is_sticky(e: &DriverError) -> bool {
    matches!(e.0 as u32, 214 | 220 | 700 | 702 | 710 | 714 | 715 | 716 | 717 | 718 | 719 | 999)
}

pub struct CudaGpu {
    ordinal: usize,
    name: String,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    modules: Vec<sys::CUmodule>,
    functions: HashMap<&'static str, sys::CUfunction>,
    faulted: Mutex<Option<String>>,
}

impl std::fmt::Debug for CudaGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "CudaGpu({}: {})", self.ordinal, self.name)
    }
}

// SAFETY: driver handles may be used from any thread once the context is made current there, which every
// call does first (`bind`); the stream serializes the work.
unsafe impl Send for CudaGpu {}
unsafe impl Sync for CudaGpu {}

impl CudaGpu {
    /// Opens CUDA device `ordinal`: its primary context, a stream, and the kernels.
    pub fn open(ordinal: usize) -> Result<CudaGpu, GpuError> {
        let fail = |what: &str, msg: String| GpuError::Driver { what: what.to_owned(), msg, sticky: false };
        // SAFETY: only tries to open the library by name.
        if !unsafe { sys::is_culib_present() } {
            return Err(fail("open", "no NVIDIA driver".into()));
        }
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let opened = catch_unwind(AssertUnwindSafe(|| Self::open_inner(ordinal)));
        std::panic::set_hook(hook);
        opened.unwrap_or_else(|_| Err(fail("open", "an incomplete driver library (a CUDA function is missing)".into())))
    }

    fn open_inner(ordinal: usize) -> Result<CudaGpu, GpuError> {
        let e = |what: &'static str| {
            move |err: DriverError| GpuError::Driver { what: what.into(), msg: err.to_string(), sticky: false }
        };
        result::init().map_err(e("cuInit"))?;
        let dev = result::device::get(ordinal as i32).map_err(e("cuDeviceGet"))?;
        let name = result::device::get_name(dev).unwrap_or_else(|_| "unknown".into());
        // SAFETY: `dev` came from device::get; the context is retained for the process's life.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(e("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: a context just retained.
        unsafe { result::ctx::set_current(ctx) }.map_err(e("cuCtxSetCurrent"))?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking).map_err(e("cuStreamCreate"))?;
        let mut functions = HashMap::new();
        let mut modules = Vec::new();
        for file in KERNEL_FILES {
            let image = CString::new(file.ptx).map_err(|_| GpuError::Driver {
                what: "load PTX".into(),
                msg: format!("{}.ptx holds a NUL byte", file.name),
                sticky: false,
            })?;
            // SAFETY: a NUL-terminated PTX image; the module stays loaded for the process's life.
            let module = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }.map_err(|err| {
                GpuError::Driver { what: format!("load {}.ptx", file.name), msg: err.to_string(), sticky: false }
            })?;
            modules.push(module);
            for entry in kernels::entries().filter(|en| en.file == file.name) {
                let cname = CString::new(entry.name).expect("entry names have no NUL");
                // SAFETY: a module just loaded.
                let f = unsafe { result::module::get_function(module, cname) }.map_err(|err| GpuError::Driver {
                    what: format!("find kernel {}", entry.name),
                    msg: err.to_string(),
                    sticky: false,
                })?;
                functions.insert(entry.name, f);
            }
        }
        Ok(CudaGpu { ordinal, name, dev, ctx, stream, modules, functions, faulted: Mutex::new(None) })
    }

    /// The sticky error that poisoned this device, if one did.
    pub fn faulted(&self) -> Option<String> {
        self.faulted.lock_unpoisoned().clone()
    }

    /// Makes the context current on this thread; fails fast on a poisoned device.
    fn bind(&self) -> Result<(), GpuError> {
        if let Some(msg) = self.faulted() {
            return Err(GpuError::Driver { what: "device faulted earlier".into(), msg, sticky: true });
        }
        // SAFETY: the context was retained in `open` and is never released.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|e| self.error("cuCtxSetCurrent", e))
    }

    fn error(&self, what: &str, e: DriverError) -> GpuError {
        if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
            return GpuError::OutOfMemory { bytes: 0 };
        }
        let sticky = is_sticky(&e);
        let msg = e.to_string();
        if sticky {
            let mut f = self.faulted.lock_unpoisoned();
            f.get_or_insert_with(|| format!("{what}: {msg}"));
        }
        GpuError::Driver { what: what.to_owned(), msg, sticky }
    }

    fn sync_stream(&self) -> Result<(), GpuError> {
        // SAFETY: our stream.
        unsafe { result::stream::synchronize(self.stream) }.map_err(|e| self.error("cuStreamSynchronize", e))
    }
}

impl Gpu for CudaGpu {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn mem_info(&self) -> Result<(u64, u64), GpuError> {
        self.bind()?;
        let (free, total) = result::mem_get_info().map_err(|e| self.error("cuMemGetInfo", e))?;
        Ok((free as u64, total as u64))
    }

    fn alloc(&self, bytes: u64) -> Result<u64, GpuError> {
        self.bind()?;
        // SAFETY: plain allocation in the bound context.
        match unsafe { result::malloc_sync(bytes.max(1) as usize) } {
            Ok(p) => Ok(p),
            Err(e) => match self.error("cuMemAlloc", e) {
                GpuError::OutOfMemory { .. } => Err(GpuError::OutOfMemory { bytes }),
                other => Err(other),
            },
        }
    }

    unsafe fn free(&self, ptr: u64) {
        // Work queued on the stream may still use it: wait for that first (frees are rare).
        if self.bind().is_ok() && self.sync_stream().is_ok() {
            // SAFETY: `ptr` came from `alloc` and is freed once (the owner's drop), after the stream's work.
            if let Err(e) = unsafe { result::free_sync(ptr) } {
                tracing::warn!("cuda:{}: cuMemFree failed: {}", self.ordinal, self.error("cuMemFree", e));
            }
        }
    }

    fn alloc_host(&self, bytes: u64) -> Result<u64, GpuError> {
        self.bind()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: pinned allocation; the device address of it is asked for below.
        let host = unsafe { result::malloc_host(bytes.max(1) as usize, flags) }.map_err(|e| {
            match self.error("cuMemHostAlloc", e) {
                GpuError::OutOfMemory { .. } => GpuError::OutOfMemory { bytes },
                other => other,
            }
        })?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` is mapped pinned memory from cuMemHostAlloc.
        if let Err(e) = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0) }.result() {
            // SAFETY: allocated just above, not handed out.
            unsafe { result::free_host(host) }.ok();
            return Err(self.error("cuMemHostGetDevicePointer", e));
        }
        if dptr != host as u64 {
            // Without unified addressing the two differ; this backend needs them equal.
            // SAFETY: allocated just above.
            unsafe { result::free_host(host) }.ok();
            return Err(GpuError::Driver {
                what: "cuMemHostAlloc".into(),
                msg: "no unified addressing".into(),
                sticky: false,
            });
        }
        Ok(dptr)
    }

    unsafe fn free_host(&self, ptr: u64) {
        if self.bind().is_ok() && self.sync_stream().is_ok() {
            // SAFETY: `ptr` came from `alloc_host` (host and device addresses are equal) and is freed once.
            if let Err(e) = unsafe { result::free_host(ptr as *mut c_void) } {
                tracing::warn!("cuda:{}: cuMemFreeHost failed: {}", self.ordinal, self.error("cuMemFreeHost", e));
            }
        }
    }

    unsafe fn htod(&self, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the caller's contract (`Gpu::htod`): `dst` holds at least src.len() bytes of one live
        // allocation; the stream is synchronized before `src` may be reused.
        unsafe { result::memcpy_htod_async(dst, src, self.stream) }.map_err(|e| self.error("cuMemcpyHtoDAsync", e))?;
        self.sync_stream()
    }

    unsafe fn dtoh(&self, dst: &mut [u8], src: u64) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: as in `htod`, in the other direction.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream) }.map_err(|e| self.error("cuMemcpyDtoHAsync", e))?;
        self.sync_stream()
    }

    unsafe fn dtod(&self, dst: u64, src: u64, bytes: u64) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: both ranges hold `bytes` bytes; unified addressing lets the driver find where each
        // lives (this device, another one, pinned host memory).
        unsafe { sys::cuMemcpyAsync(dst, src, bytes as usize, self.stream) }
            .result()
            .map_err(|e| self.error("cuMemcpyAsync", e))
    }

    unsafe fn launch_unchecked(&self, kernel: &'static str, dims: Dims, args: &mut [Arg]) -> Result<(), GpuError> {
        self.bind()?;
        let f = *self
            .functions
            .get(kernel)
            .ok_or_else(|| GpuError::BadLaunch { kernel: kernel.into(), why: "not loaded".into() })?;
        let mut params: Vec<*mut c_void> = args.iter_mut().map(Arg::as_param).collect();
        let (g, b) = (dims.grid, dims.block);
        // SAFETY: the arguments match the kernel's parameters (checked by gpu::launch) and point at live
        // values for the duration of the call (the driver copies them); addresses are this device's.
        unsafe { result::launch_kernel(f, (g[0], g[1], g[2]), (b[0], b[1], b[2]), 0, self.stream, &mut params) }
            .map_err(|e| self.error(&format!("launch {kernel}"), e))
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        self.bind()?;
        self.sync_stream()
    }
}

impl Drop for CudaGpu {
    fn drop(&mut self) {
        // SAFETY: this object's own handles, released once. Buffers hold an Arc to their GPU, so none of
        // its memory outlives it.
        unsafe {
            if result::ctx::set_current(self.ctx).is_ok() {
                result::stream::synchronize(self.stream).ok();
                result::stream::destroy(self.stream).ok();
                for m in &self.modules {
                    result::module::unload(*m).ok();
                }
            }
            result::primary_ctx::release(self.dev).ok();
        }
    }
}
