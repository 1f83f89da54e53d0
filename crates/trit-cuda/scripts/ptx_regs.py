#!/usr/bin/env python3
"""Registers, spills and local-memory use of CUDA kernels without a GPU, in seconds.

Compiles common.cuh + one kernel file (or several joined by "+", in the program's order, for
a file that uses another's helpers: attention.cu+hybrid_attention.cu) with NVRTC (loaded through ctypes; the
nvidia-cuda-nvrtc wheel's lib folder) and runs `ptxas -v` (the nvidia-cuda-nvcc wheel) on
the PTX. Prints, per kernel whose name contains FILTER, ptxas's register/spill lines and the
count of ld.local/st.local in its PTX (a register array indexed at run time lives there).

  python3 crates/trit-cuda/scripts/ptx_regs.py deltanet.cu deltanet_step [-DDN_TRACE=1 ...]

Environment: NVRTC (path of libnvrtc.so.12), PTXAS (path of ptxas), ARCH (default
compute_90; ptxas gets sm_NN).
"""
import ctypes
import os
import re
import subprocess
import sys
import tempfile

KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "kernels")
NVRTC = os.environ.get("NVRTC", "/tmp/nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.12")
PTXAS = os.environ.get("PTXAS", "/tmp/nvcc/nvidia/cuda_nvcc/bin/ptxas")
ARCH = os.environ.get("ARCH", "compute_90")


def compile_ptx(source, options):
    lib = ctypes.CDLL(NVRTC)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={ARCH}".encode(), b"--std=c++17"] + [o.encode() for o in options]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if status:
        sys.exit(log.value.decode())
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    name, wanted, options = sys.argv[1], sys.argv[2], sys.argv[3:]
    files = ["common.cuh"] + name.split("+")
    source = "\n".join(open(os.path.join(KERNELS, f)).read() for f in files)
    ptx = compile_ptx(source, options)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        open(path, "w").write(ptx)
        arch = "sm_" + ARCH.split("_")[1]
        report = subprocess.run([PTXAS, f"-arch={arch}", "-v", path, "-o", os.path.join(tmp, "k.cubin")],
                                capture_output=True, text=True).stderr
    bodies = dict(re.findall(r"\.entry (\w+)\((.*?)\n}", ptx, re.S))
    kernel = None
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            kernel = m.group(1)
            if wanted in kernel:
                local = len(re.findall(r"\b(ld|st)\.local", bodies.get(kernel, "")))
                print(f"{kernel}: {local} ld/st.local in PTX")
        elif kernel and wanted in kernel and ("spill" in line or "registers" in line):
            print("   ", line.replace("ptxas info    :", "").strip())


if __name__ == "__main__":
    main()
