"""tools/install-lab.sh builds llama.cpp for the CPU's own flags, never with AMX."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "install-lab.sh"

# The flags lines of real /proc/cpuinfo files, shortened: a virtualized Sapphire Rapids (AMX,
# where ggml's AMX path faults) and an AMD Zen 3 (AVX2, no AVX-512).
SAPPHIRE_RAPIDS = ("flags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512bw avx512_vnni"
                   " avx512_bf16 avx512vbmi avx_vnni amx_bf16 amx_tile amx_int8\n")
ZEN3 = "flags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2 sha_ni\n"


def cmake_args(tmp_path: Path, cpuinfo: str) -> set[str]:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    out = subprocess.run([str(SCRIPT), "--print-cmake-args", str(path)], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return set(out.split())


@pytest.mark.parametrize("cpuinfo", [SAPPHIRE_RAPIDS, ZEN3])
def test_never_native_never_amx(tmp_path: Path, cpuinfo: str) -> None:
    args = cmake_args(tmp_path, cpuinfo)
    assert {"-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
            "-DGGML_AMX_BF16=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON"} <= args


def test_avx512_follows_the_cpu(tmp_path: Path) -> None:
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX_VNNI=ON"} <= cmake_args(
        tmp_path, SAPPHIRE_RAPIDS)
    assert {"-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX_VNNI=OFF"} <= cmake_args(
        tmp_path, ZEN3)
