//! The seam between the CUDA backend's host code and a GPU: memory, copies and kernel launches by name, as
//! one trait with two implementations: [`driver::CudaGpu`](super::driver::CudaGpu) on a real GPU through the
//! CUDA driver, and [`emu::EmuGpu`](super::emu::EmuGpu) that runs the same kernels, compiled as C++, on the
//! CPU. Everything above this trait (the forward pass on a GPU, KV pages, parking and restoring) is the same
//! code on both, so the emulator tests it on machines without a GPU.
//!
//! Addresses are plain `u64` device addresses (pinned host memory mapped for the device included). Every
//! launch is checked against the parameter kinds of its entry point (`kernels::entries`) before it goes out.

use std::fmt;

use super::kernels;

/// One kernel argument, passed by value (`cuLaunchKernel`'s kernelParams).
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
}

impl Arg {
    fn kind(&self) -> char {
        match self {
            Arg::Ptr(_) => 'p',
            Arg::I32(_) => 'i',
            Arg::I64(_) => 'l',
            Arg::F32(_) => 'f',
        }
    }

    /// A pointer to the value, as kernelParams wants it.
    pub(crate) fn as_param(&mut self) -> *mut std::ffi::c_void {
        match self {
            Arg::Ptr(v) => v as *mut u64 as *mut _,
            Arg::I32(v) => v as *mut i32 as *mut _,
            Arg::I64(v) => v as *mut i64 as *mut _,
            Arg::F32(v) => v as *mut f32 as *mut _,
        }
    }
}

/// Grid and block sizes of a launch (x, y, z).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

impl Dims {
    /// `blocks` blocks of `threads` threads in x.
    pub fn linear(blocks: u32, threads: u32) -> Dims {
        Dims { grid: [blocks.max(1), 1, 1], block: [threads, 1, 1] }
    }

    /// One thread per element of `n`, `threads` per block.
    pub fn over(n: usize, threads: u32) -> Dims {
        Dims::linear(n.div_ceil(threads as usize) as u32, threads)
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    /// The device has no memory for this allocation (a recoverable refusal).
    #[error("out of device memory allocating {bytes} bytes")]
    OutOfMemory { bytes: u64 },
    /// A launch whose arguments do not match the kernel's parameters (a bug in the caller; nothing ran).
    #[error("kernel {kernel}: {why}")]
    BadLaunch { kernel: String, why: String },
    /// The driver failed a call. `sticky` errors (a faulted context: illegal address, launch failure, ...)
    /// leave the device unusable until the process restarts.
    #[error("{what}: {msg}")]
    Driver { what: String, msg: String, sticky: bool },
}

impl GpuError {
    pub fn is_sticky(&self) -> bool {
        matches!(self, GpuError::Driver { sticky: true, .. })
    }
}

/// A GPU: one context and one stream of work, in order. Calls that read results into host memory wait
/// for the work before them.
pub trait Gpu: Send + Sync + fmt::Debug {
    /// What it is, for messages ("NVIDIA H200", "emulated").
    fn describe(&self) -> String;
    /// (free, total) bytes as the device reports them now.
    fn mem_info(&self) -> Result<(u64, u64), GpuError>;
    /// `bytes` of device memory (not zeroed).
    fn alloc(&self, bytes: u64) -> Result<u64, GpuError>;
    /// Frees what `alloc` returned.
    ///
    /// # Safety
    /// `ptr` came from this GPU's `alloc`, is freed once, and nothing uses it afterwards (no queued
    /// kernel or copy, no other handle).
    unsafe fn free(&self, ptr: u64);
    /// `bytes` of pinned host memory mapped into the device's address space: kernels read it through the
    /// returned address, the host through the same address as a pointer.
    fn alloc_host(&self, bytes: u64) -> Result<u64, GpuError>;
    /// # Safety
    /// As [`Gpu::free`], for what `alloc_host` returned.
    unsafe fn free_host(&self, ptr: u64);
    /// Copies host bytes to device address `dst`; returns when `src` may be reused.
    ///
    /// # Safety
    /// `[dst, dst + src.len())` lies inside one live allocation of this GPU (`alloc` or `alloc_host`):
    /// the copy writes there, and for pinned host memory that is this process's memory.
    unsafe fn htod(&self, dst: u64, src: &[u8]) -> Result<(), GpuError>;
    /// Copies device bytes at `src` into `dst` once the work before it is done.
    ///
    /// # Safety
    /// `[src, src + dst.len())` lies inside one live allocation of this GPU.
    unsafe fn dtoh(&self, dst: &mut [u8], src: u64) -> Result<(), GpuError>;
    /// Copies `bytes` between device addresses (on this device, or from pinned host memory).
    ///
    /// # Safety
    /// `[dst, dst + bytes)` and `[src, src + bytes)` each lie inside one live allocation of this GPU.
    unsafe fn dtod(&self, dst: u64, src: u64, bytes: u64) -> Result<(), GpuError>;
    /// Launches a kernel; `args` were checked against its parameters by [`launch`].
    ///
    /// # Safety
    /// As [`launch`], and the argument kinds match the kernel's parameters.
    unsafe fn launch_unchecked(&self, kernel: &'static str, dims: Dims, args: &mut [Arg]) -> Result<(), GpuError>;
    /// Waits for all work queued so far.
    fn synchronize(&self) -> Result<(), GpuError>;
    /// Faults the context on purpose (tests of the sticky-error path); false where that is not possible.
    fn poison(&self) -> bool {
        false
    }
}

/// Launches `kernel` with `args` after checking them against its parameter kinds.
///
/// # Safety
/// Every `Arg::Ptr` is an address inside a live allocation of this GPU, large enough for what the kernel
/// reads and writes there at these dimensions (the kernel's own contract, in kernels/), and stays live
/// until the work is done (a later synchronizing call).
pub unsafe fn launch(gpu: &dyn Gpu, kernel: &'static str, dims: Dims, args: &[Arg]) -> Result<(), GpuError> {
    let bad = |why: String| GpuError::BadLaunch { kernel: kernel.to_owned(), why };
    let entry = kernels::entry(kernel).ok_or_else(|| bad("no such kernel".into()))?;
    let kinds: String = args.iter().map(Arg::kind).collect();
    if kinds != entry.params {
        return Err(bad(format!("arguments {kinds:?} do not match its parameters {:?}", entry.params)));
    }
    if dims.grid.contains(&0) || dims.block.contains(&0) || dims.block.iter().product::<u32>() > 1024 {
        return Err(bad(format!("bad launch dimensions {dims:?}")));
    }
    let mut args = args.to_vec();
    // SAFETY: the kinds were checked above; the addresses are the caller's promise.
    unsafe { gpu.launch_unchecked(kernel, dims, &mut args) }
}

/// Memory on a GPU (or pinned host memory mapped for it), freed on drop.
#[derive(Debug)]
pub struct Buffer {
    gpu: std::sync::Arc<dyn Gpu>,
    ptr: u64,
    bytes: u64,
    pinned_host: bool,
}

impl Buffer {
    /// `bytes` of device memory.
    pub fn device(gpu: &std::sync::Arc<dyn Gpu>, bytes: u64) -> Result<Buffer, GpuError> {
        let ptr = gpu.alloc(bytes)?;
        Ok(Buffer { gpu: gpu.clone(), ptr, bytes, pinned_host: false })
    }

    /// `bytes` of pinned host memory the GPU reads and writes directly.
    pub fn pinned_host(gpu: &std::sync::Arc<dyn Gpu>, bytes: u64) -> Result<Buffer, GpuError> {
        let ptr = gpu.alloc_host(bytes)?;
        Ok(Buffer { gpu: gpu.clone(), ptr, bytes, pinned_host: true })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn is_pinned_host(&self) -> bool {
        self.pinned_host
    }

    pub fn gpu(&self) -> &std::sync::Arc<dyn Gpu> {
        &self.gpu
    }

    fn check(&self, at: u64, len: usize) -> Result<(), GpuError> {
        if at.checked_add(len as u64).is_none_or(|end| end > self.bytes) {
            return Err(GpuError::BadLaunch {
                kernel: "copy".into(),
                why: format!("{len} bytes at {at} overrun a buffer of {}", self.bytes),
            });
        }
        Ok(())
    }

    /// Writes `src` at byte offset `at`.
    pub fn write_at(&self, at: u64, src: &[u8]) -> Result<(), GpuError> {
        self.check(at, src.len())?;
        // SAFETY: the range was checked to lie inside this buffer, which is live while `self` is.
        unsafe { self.gpu.htod(self.ptr + at, src) }
    }

    /// Reads `dst.len()` bytes from byte offset `at`.
    pub fn read_at(&self, at: u64, dst: &mut [u8]) -> Result<(), GpuError> {
        self.check(at, dst.len())?;
        // SAFETY: as in `write_at`.
        unsafe { self.gpu.dtoh(dst, self.ptr + at) }
    }

    pub fn write_f32(&self, src: &[f32]) -> Result<(), GpuError> {
        self.write_at(0, bytemuck::cast_slice(src))
    }

    pub fn read_f32(&self, n: usize) -> Result<Vec<f32>, GpuError> {
        let mut out = vec![0f32; n];
        self.read_at(0, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the buffer owns its allocation (made by this GPU, never handed out to be freed) and
        // frees it once, here.
        unsafe {
            if self.pinned_host {
                self.gpu.free_host(self.ptr);
            } else {
                self.gpu.free(self.ptr);
            }
        }
    }
}
