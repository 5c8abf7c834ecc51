"""How the benchmarks build llama.cpp (llama-cpp-python and llama-server): for this CPU.

-DGGML_NATIVE=ON, except on CPUs with AMX: ggml's AMX matrix path crashes with
SIGSEGV in ggml_backend_amx_mul_mat on this project's Xeon VM (llama-server
b1-0c1e570 from llama-cpp-python 0.3.36, Gemma 3 270M Q4_K_M, 2026-12-04), so
there every instruction set the CPU reports is named except AMX.
"""

from __future__ import annotations

from pathlib import Path

# ggml's option for each /proc/cpuinfo flag it can use (x86-64).
_GGML_FLAGS = {
    "sse4_2": "GGML_SSE42", "avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2", "avx_vnni": "GGML_AVX_VNNI", "avx512f": "GGML_AVX512", "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI", "avx512_bf16": "GGML_AVX512_BF16",
}


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def ggml_cmake_args() -> list[str]:
    flags = cpu_flags()
    if "amx_tile" not in flags:
        return ["-DGGML_NATIVE=ON"]
    return ["-DGGML_NATIVE=OFF"] + [f"-D{opt}={'ON' if f in flags else 'OFF'}" for f, opt in _GGML_FLAGS.items()] + [
        "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
