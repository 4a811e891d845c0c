//! Regenerates kernels/ptx/*.ptx from kernels/*.cu with NVRTC (run by scripts/build-ptx, which fetches
//! NVRTC first). Needs no GPU.

use std::path::Path;

use strata::device::cuda::{kernels::KERNEL_FILES, ptx};

fn main() {
    if let Err(e) = ptx::load_nvrtc(&ptx::nvrtc_dir()) {
        eprintln!("build-ptx: {e}");
        std::process::exit(1);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut failed = false;
    for k in KERNEL_FILES {
        let source = std::fs::read_to_string(root.join("kernels").join(format!("{}.cu", k.name)))
            .unwrap_or_else(|e| panic!("kernels/{}.cu: {e}", k.name));
        match ptx::compile(k.name, &source) {
            Ok(ptx) => {
                let out = root.join("kernels/ptx").join(format!("{}.ptx", k.name));
                std::fs::write(&out, ptx).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
                println!("build-ptx: kernels/ptx/{}.ptx", k.name);
            }
            Err(e) => {
                eprintln!("build-ptx: {e}");
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}
