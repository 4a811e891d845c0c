//! Builds the CPU emulator of the CUDA kernels (kernels/emu/): the kernel sources compiled as C++ with a
//! fiber scheduler, behind the `emu:MIB` device that tests the CUDA backend on machines without a GPU; and
//! tells cargo to rebuild when the embedded web UI changes.

fn main() {
    // ui/dist is embedded by the server (src/server/ui.rs): a rebuilt UI rebuilds the binary.
    for path in ["kernels", "kernels/emu", "ui/dist"] {
        println!("cargo:rerun-if-changed={path}");
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("kernels/emu/emu.cpp")
        .opt_level(2)
        .flag_if_supported("-fno-strict-aliasing")
        .flag_if_supported("-ffp-contract=off")
        .warnings(false)
        .flag_if_supported("-pthread")
        .compile("strata_emu");
}
