//! Every kernel source compiles with NVRTC for Hopper (compute_90) and Ampere (compute_80) and
//! defines every kernel the decode step launches (and each kernel it defines is listed). Needs
//! only NVRTC (no GPU): skipped, with the reason printed, where the library is missing (CI);
//! run it with NVRTC on LD_LIBRARY_PATH.
//! With TRIT_PTX_DIR set, the PTX is also written there (`kernels-compute_90.ptx`, ...) so
//! `ptxas -v` can show registers, spills and shared memory per kernel without a GPU.

use trit_cuda::device::{compile, compile_with, nvrtc_present, KERNELS};

#[test]
fn kernels_compile_for_each_architecture() {
    if !nvrtc_present() {
        eprintln!("skipped: no NVRTC library (libnvrtc.so) on this machine");
        return;
    }
    for arch in ["compute_90", "compute_80"] {
        let ptx = compile(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        if let Some(dir) = std::env::var_os("TRIT_PTX_DIR") {
            let file = std::path::Path::new(&dir).join(format!("kernels-{arch}.ptx"));
            std::fs::write(&file, &ptx).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        }
        for k in KERNELS.iter() {
            assert!(
                ptx.contains(&format!(".entry {k}(")),
                "{arch}: kernel {k} missing from the PTX"
            );
        }
        // And the other way: a kernel the sources define but KERNELS does not name cannot be
        // launched (`Gpu::launch` finds only listed kernels) — found only on a GPU otherwise.
        for entry in ptx.split(".entry ").skip(1) {
            let name = entry.split('(').next().unwrap_or("").trim();
            assert!(
                KERNELS.contains(&name),
                "{arch}: kernel {name} is defined but not listed in device::KERNELS"
            );
        }
        // No local-memory spills of register arrays in the hot kernels.
        assert!(!ptx.contains(".local"), "{arch}: PTX uses local memory");
    }
}

/// The measurement builds compile too (both switches at once): the trace
/// (`TRIT_CUDA_DEFINES=-DTRIT_TRACE`, `trit_cuda::trace`) with the globals the host sets and
/// reads, and the decode attention's per-warp q/k norm (`-DATT_WARP_NORM=1`); no spills.
#[test]
fn measurement_builds_compile() {
    if !nvrtc_present() {
        eprintln!("skipped: no NVRTC library (libnvrtc.so) on this machine");
        return;
    }
    let defines = ["-DTRIT_TRACE".to_string(), "-DATT_WARP_NORM=1".to_string()];
    let ptx =
        compile_with("compute_90", &defines).unwrap_or_else(|e| panic!("measurement build: {e}"));
    for global in ["trit_trace_buf", "trit_trace_cap", "trit_trace_n"] {
        assert!(
            ptx.lines()
                .any(|l| l.contains(".global .") && l.contains(global)),
            "traced build: global {global} missing"
        );
    }
    assert!(ptx.contains("%globaltimer"), "traced build: no timestamps");
    assert!(
        !ptx.contains(".local"),
        "measurement build: PTX uses local memory"
    );
}
