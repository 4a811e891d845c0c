//! The CUDA kernels: each `kernels/*.cu` source with the PTX built from it, both embedded in the binary, and
//! every entry point with its parameter kinds. `scripts/build-ptx` regenerates the PTX (NVRTC 12.0,
//! compute_70, no GPU needed); tests recompile every source, check that the committed PTX is current, and
//! that the PTX and the CPU emulator (kernels/emu) take the parameters listed here.

/// The GPU architecture the PTX targets: compute_70 runs from a V100 up.
pub const ARCH: &str = "compute_70";

/// One kernel source file.
pub struct KernelFile {
    /// File stem: `kernels/{name}.cu`, `kernels/ptx/{name}.ptx`.
    pub name: &'static str,
    pub source: &'static str,
    pub ptx: &'static str,
}

macro_rules! kernel_file {
    ($name:literal) => {
        KernelFile {
            name: $name,
            source: include_str!(concat!("../../../kernels/", $name, ".cu")),
            ptx: include_str!(concat!("../../../kernels/ptx/", $name, ".ptx")),
        }
    };
}

pub const KERNEL_FILES: &[KernelFile] = &[
    kernel_file!("attn"),
    kernel_file!("elementwise"),
    kernel_file!("moe"),
    kernel_file!("norm"),
    kernel_file!("quant"),
];

/// The header every source includes (NVRTC finds it through the include path).
pub const COMMON_HEADER: &str = include_str!("../../../kernels/common.cuh");

/// An `extern "C"` entry point: its file and its parameters, one letter each: `p` a device address, `i` an
/// i32, `l` an i64, `f` an f32.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub name: &'static str,
    pub file: &'static str,
    pub params: &'static str,
}

macro_rules! quant_entries {
    ($($t:ident),*) => {
        [$([
            Entry { name: concat!("matvec_", stringify!($t)), file: "quant", params: "pppiili" },
            Entry { name: concat!("matvec_many_", stringify!($t)), file: "quant", params: "pppiilii" },
            Entry { name: concat!("gemm_", stringify!($t)), file: "quant", params: "pppiilii" },
            Entry { name: concat!("rows_", stringify!($t)), file: "quant", params: "pppil" },
        ]),*]
    };
}

const QUANT: [[Entry; 4]; 13] =
    quant_entries!(f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K, iq4_nl, mxfp4);

const OTHERS: [Entry; 17] = [
    Entry { name: "rms_norm_f32", file: "norm", params: "pppif" },
    Entry { name: "rms_norm_add_f32", file: "norm", params: "pppif" },
    Entry { name: "add_bias_f32", file: "elementwise", params: "ppii" },
    Entry { name: "swiglu_f32", file: "elementwise", params: "ppi" },
    Entry { name: "swiglu_oai_f32", file: "elementwise", params: "ppi" },
    Entry { name: "geglu_f32", file: "elementwise", params: "ppi" },
    Entry { name: "scale_f32", file: "elementwise", params: "pfi" },
    Entry { name: "softcap_f32", file: "elementwise", params: "pfi" },
    Entry { name: "gather_rows_f32", file: "elementwise", params: "pppi" },
    Entry { name: "rope_f32", file: "elementwise", params: "pppiiiiiifffiiff" },
    Entry { name: "moe_scatter_f32", file: "moe", params: "ppppi" },
    Entry { name: "moe_sum_f32", file: "moe", params: "ppiii" },
    Entry { name: "kv_store_f16", file: "attn", params: "ppppiii" },
    Entry { name: "kv_store_q8_0", file: "attn", params: "ppppiii" },
    Entry { name: "kv_gather", file: "attn", params: "ppiii" },
    Entry { name: "attention_f16", file: "attn", params: "ppppiiiififp" },
    Entry { name: "attention_q8_0", file: "attn", params: "ppppiiiififp" },
];

/// Every entry point of every file.
pub fn entries() -> impl Iterator<Item = Entry> {
    OTHERS.into_iter().chain(QUANT.into_iter().flatten())
}

/// The entry point named `name`.
pub fn entry(name: &str) -> Option<Entry> {
    entries().find(|e| e.name == name)
}

/// Whether the GPU has kernels for weights of type `ty` (products and row lookups: `matvec_T`,
/// `matvec_many_T`, `gemm_T`, `rows_T`). A model with other weights on a GPU stage is refused at load,
/// naming the type.
pub fn has_weight_kernels(ty: crate::quant::GgmlType) -> bool {
    ["matvec", "matvec_many", "gemm", "rows"].iter().all(|p| entry(&format!("{p}_{}", ty.name())).is_some())
}
