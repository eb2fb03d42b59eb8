"""The lab's dtype follows the CPU: bfloat16 only where the CPU computes it natively."""

from __future__ import annotations

import pytest

from pdscope.errors import InputError
from pdscope.lab import lab_dtype

ZEN5 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
ZEN3 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n"
CASCADE_LAKE = "flags\t\t: fpu avx2 avx512f avx512bw avx512_vnni\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx512f amx_bf16 amx_tile amx_int8\n"
NEOVERSE_V1 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
NEOVERSE_N1 = "processor\t: 0\nFeatures\t: fp asimd crc32 atomics\n"


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PDSCOPE_LAB_DTYPE", raising=False)


@pytest.mark.parametrize(("cpuinfo", "dtype"), [
    (ZEN5, "bfloat16"), (SAPPHIRE_RAPIDS, "bfloat16"), (NEOVERSE_V1, "bfloat16"),
    (ZEN3, "float32"), (CASCADE_LAKE, "float32"), (NEOVERSE_N1, "float32"),
])
def test_bfloat16_only_with_a_native_bfloat16_dot_product(cpuinfo: str, dtype: str) -> None:
    assert lab_dtype(cpuinfo) == dtype


def test_the_environment_overrides_the_cpu_and_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PDSCOPE_LAB_DTYPE", "float32")
    assert lab_dtype(ZEN5) == "float32"
    monkeypatch.setenv("PDSCOPE_LAB_DTYPE", "fp8")
    with pytest.raises(InputError, match="bfloat16 or float32"):
        lab_dtype(ZEN5)
