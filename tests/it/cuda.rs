//! CUDA without a GPU: the binary finds no driver here, and with a stub driver library that reports "no
//! device" (what a machine with the NVIDIA driver but no GPU sees) it lists no CUDA device and says why; a
//! driver library missing functions is reported, not a crash. The stubs are built with the system C compiler.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

const STUB_NO_DEVICE: &str = r#"
typedef int CUresult;
CUresult cuInit(unsigned int flags) { (void)flags; return 100; }
CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }
CUresult cuGetErrorString(CUresult e, const char **s) {
    *s = e == 100 ? "no CUDA-capable device is detected" : "unknown error"; return 0;
}
CUresult cuGetErrorName(CUresult e, const char **s) {
    *s = e == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN"; return 0;
}
"#;

/// Lacks cuInit and the error functions: a broken or foreign libcuda.
const STUB_INCOMPLETE: &str = "int cuSomethingElse(void) { return 0; }\n";

fn stub_driver(dir: &Path, source: &str) {
    let c = dir.join("stub.c");
    std::fs::write(&c, source).expect("write stub source");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let lib = dir.join("libcuda.so.1");
    let out =
        Command::new(&cc).args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(&c).output().unwrap_or_else(|e| {
            panic!("a C compiler ({cc}) is needed for this test (scripts/setup installs one): {e}")
        });
    assert!(out.status.success(), "stub build failed: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::copy(&lib, dir.join("libcuda.so")).expect("copy");
}

fn strata(args: &[&str], lib_dir: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.args(args).env("STRATA_MODEL", common::model_path());
    if let Some(d) = lib_dir {
        cmd.env("LD_LIBRARY_PATH", d);
    }
    cmd.output().expect("the strata binary runs")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
#[cfg(target_os = "linux")]
fn a_driver_without_a_gpu_means_no_cuda_device_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    stub_driver(dir.path(), STUB_NO_DEVICE);
    let (out, err) = text(&strata(&["devices"], Some(dir.path())));
    assert!(out.lines().any(|l| l.starts_with("0  cpu")), "{out}{err}");
    assert!(out.contains("CUDA devices: none (the NVIDIA driver is present but reports"), "{out}{err}");
    assert!(out.contains("CUDA_ERROR_NO_DEVICE"), "{out}");
    assert!(!err.contains("panicked"), "{err}");

    let o = strata(&["run", "-p", "hi", "-n", "1", "--devices", "cuda:0"], Some(dir.path()));
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("device cuda:0 is not available") && err.contains("CUDA_ERROR_NO_DEVICE"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
#[cfg(target_os = "linux")]
fn an_incomplete_driver_library_is_reported_not_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    stub_driver(dir.path(), STUB_INCOMPLETE);
    let o = strata(&["devices"], Some(dir.path()));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("CUDA devices: none (the NVIDIA driver is present but reports an incomplete driver library"),
        "{out}{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn no_driver_here_means_no_cuda_device() {
    // This machine (and CI) has no NVIDIA driver; a GPU machine lists its devices instead.
    let (out, err) = text(&strata(&["devices"], None));
    assert!(
        out.contains("CUDA devices: none (no NVIDIA driver") || out.lines().any(|l| l.starts_with("cuda:")),
        "{out}{err}"
    );
}
