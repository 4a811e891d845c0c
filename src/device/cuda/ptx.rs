//! Compiling `kernels/*.cu` to PTX with NVRTC, loaded at run time: from the directory in `STRATA_NVRTC_DIR`,
//! else `.cache/nvrtc/lib` of the repository (`scripts/fetch-nvrtc`). Used by `scripts/build-ptx` and by
//! the test that the committed PTX is current; the engine itself only loads embedded PTX.

use std::path::{Path, PathBuf};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::kernels::ARCH;

/// Where NVRTC's libraries are looked for.
pub fn nvrtc_dir() -> PathBuf {
    std::env::var_os("STRATA_NVRTC_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/nvrtc/lib"))
}

/// Loads NVRTC from `dir` so that cudarc's lookup by name finds it (a library already loaded is found by
/// its soname whatever the search path).
pub fn load_nvrtc(dir: &Path) -> Result<(), String> {
    #[cfg(unix)]
    for lib in ["libnvrtc-builtins.so.12.0", "libnvrtc.so.12"] {
        let path = dir.join(lib);
        let c = std::ffi::CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: dlopen of a library file; RTLD_GLOBAL so that later lookups by soname resolve to it.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            return Err(format!("cannot load {} (run scripts/fetch-nvrtc)", path.display()));
        }
    }
    #[cfg(not(unix))]
    let _ = dir;
    // SAFETY: only tries to open the library by name.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(format!("NVRTC is not loadable from {}", dir.display()))
    }
}

/// PTX for `source` (named `name` in messages), for compute_70, with the options the engine's kernels use.
pub fn compile(name: &str, source: &str) -> Result<String, String> {
    let opts = CompileOptions {
        arch: Some(ARCH),
        name: Some(format!("{name}.cu")),
        use_fast_math: Some(false),
        // No fused multiply-adds: the CPU and the emulator round `x * d + m` twice, so must the GPU.
        fmad: Some(false),
        // The sources `#include "common.cuh"`.
        include_paths: vec![concat!(env!("CARGO_MANIFEST_DIR"), "/kernels").to_owned()],
        ..Default::default()
    };
    compile_ptx_with_opts(source, opts).map(|p| p.to_src()).map_err(|e| format!("{name}.cu: {e}"))
}
