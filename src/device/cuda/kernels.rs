//! The CUDA kernels: each `kernels/*.cu` source with the PTX built from it, both embedded in the binary, and
//! the entry points each must define. `scripts/build-ptx` regenerates the PTX (NVRTC 12.0, compute_70, no
//! GPU needed); a test recompiles every source and checks that the committed PTX is current.

/// The GPU architecture the PTX targets: compute_70 runs from a V100 up.
pub const ARCH: &str = "compute_70";

/// One kernel source file.
pub struct KernelFile {
    /// File stem: `kernels/{name}.cu`, `kernels/ptx/{name}.ptx`.
    pub name: &'static str,
    pub source: &'static str,
    pub ptx: &'static str,
    /// `extern "C"` entry points the PTX must contain.
    pub entries: &'static [&'static str],
}

macro_rules! kernel_file {
    ($name:literal, [$($entry:literal),* $(,)?]) => {
        KernelFile {
            name: $name,
            source: include_str!(concat!("../../../kernels/", $name, ".cu")),
            ptx: include_str!(concat!("../../../kernels/ptx/", $name, ".ptx")),
            entries: &[$($entry),*],
        }
    };
}

pub const KERNEL_FILES: &[KernelFile] = &[
    kernel_file!("norm", ["rms_norm_f32"]),
    kernel_file!("elementwise", ["add_f32", "swiglu_f32", "rope_f32"]),
    kernel_file!("matvec", ["matvec_f16_f32", "matvec_q8_0_f32", "matvec_q4_1_f32"]),
];
