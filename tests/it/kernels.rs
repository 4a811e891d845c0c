//! The CUDA kernels compile on a machine without a GPU: every `kernels/*.cu` through NVRTC 12.0 for
//! compute_70, each defining its entry points, and the PTX embedded in the binary is what the sources compile
//! to today (run scripts/build-ptx after editing a kernel). NVRTC comes from scripts/fetch-nvrtc, which
//! scripts/test runs; without it this test fails, it does not skip.

use strata::device::cuda::{kernels, kernels::KERNEL_FILES, ptx};

#[test]
fn every_kernel_compiles_and_the_committed_ptx_is_current() {
    let dir = ptx::nvrtc_dir();
    ptx::load_nvrtc(&dir).unwrap_or_else(|e| panic!("NVRTC is needed to check the kernels: {e}"));
    let kernel_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let mut on_disk: Vec<String> = std::fs::read_dir(&kernel_dir)
        .expect("kernels/")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".cu").map(str::to_owned))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = KERNEL_FILES.iter().map(|k| k.name.to_owned()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "every kernels/*.cu is listed in src/device/cuda/kernels.rs");
    for k in KERNEL_FILES {
        let fresh = ptx::compile(k.name, k.source).unwrap_or_else(|e| panic!("{e}"));
        assert!(fresh.contains(".target sm_70") && fresh.contains(".version 8.0"), "{}: {}", k.name, &fresh[..200]);
        for entry in kernels::entries().filter(|e| e.file == k.name) {
            let name = entry.name;
            assert!(fresh.contains(&format!(".entry {name}(")), "{}.cu lacks the entry point {name}", k.name);
        }
        assert!(fresh == k.ptx, "kernels/ptx/{}.ptx is stale: run scripts/build-ptx", k.name);
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_reported_with_its_name() {
    ptx::load_nvrtc(&ptx::nvrtc_dir()).unwrap_or_else(|e| panic!("NVRTC is needed: {e}"));
    let err = ptx::compile("broken", "extern \"C\" __global__ void k(float *x) { x[0] = y; }").unwrap_err();
    assert!(err.starts_with("broken.cu:"), "{err}");
}
