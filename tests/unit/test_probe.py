"""The local probes: their arithmetic on a scripted clock, worked by hand, and this machine
measured for real (small arrays and few runs keep that fast)."""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from pdscope.errors import InputError
from pdscope.hardware import (
    BandwidthProbe,
    cpu_model_name,
    detect_local_device,
    local_cpu_spec,
    measure,
    nvidia_smi_gpus,
    probe_cpu_bandwidth,
    probe_cpu_matmul_tflops,
)


class ScriptedClock:
    """A ``time.perf_counter`` under which each timed section (a pair of calls: start, end)
    lasts the next of ``durations`` seconds, whatever the machine does meanwhile."""

    def __init__(self, durations: Iterable[float]) -> None:
        self.durations = list(durations)
        self.now = 1000.0
        self.calls = 0

    def __call__(self) -> float:
        if self.calls % 2:
            self.now += self.durations.pop(0)
        self.calls += 1
        return self.now


@pytest.fixture(scope="module")
def probe() -> BandwidthProbe:
    return probe_cpu_bandwidth(array_mb=32, runs=3)


def test_bandwidth_and_spread_worked_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 MB arrays: 1,000,000 float64, 8,000,000 bytes each. Copy moves 2 x 8e6 bytes, so a copy
    # of d seconds is 0.016 / d GB/s; the two-pass triad moves 5 x 8e6: 0.04 / d GB/s.
    warmups = [0.5, 0.5, 0.5]  # touch, copy, triad: slow, and left out of every figure
    runs = [
        0.004, 0.010,  # run 1: copy 0.016 / 0.004 = 4 GB/s, triad 0.04 / 0.010 = 4 GB/s
        0.002, 0.008,  # run 2: copy 8 GB/s, triad 5 GB/s
        0.008, 0.004,  # run 3: copy 2 GB/s, triad 10 GB/s
    ]  # fmt: skip
    clock = ScriptedClock(warmups + runs)
    monkeypatch.setattr(time, "perf_counter", clock)
    p = probe_cpu_bandwidth(array_mb=8, runs=3, threads=1)
    assert clock.durations == []  # exactly 3 warm-ups and 3 x (copy, triad) were timed
    assert p.copy_gb_s == pytest.approx(8.0)  # best copy: run 2
    assert p.triad_gb_s == pytest.approx(10.0)  # best triad: run 3
    assert p.best_gb_s == pytest.approx(10.0)
    # Each run's better kernel: max(4, 4), max(8, 5), max(2, 10).
    assert p.run_gb_s == pytest.approx((4.0, 8.0, 10.0))
    # (max - min) / median = (10 - 4) / 8.
    assert p.spread == pytest.approx(0.75)
    assert (p.runs, p.array_mb, p.threads) == (3, 8.0, 1)


def test_runs_that_agree_have_no_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every copy 0.004 s (4 GB/s), every triad 0.008 s (0.04 / 0.008 = 5 GB/s): each run 5.
    monkeypatch.setattr(time, "perf_counter", ScriptedClock([0.1] * 3 + [0.004, 0.008] * 4))
    p = probe_cpu_bandwidth(array_mb=8, runs=4, threads=1)
    assert p.run_gb_s == pytest.approx((5.0,) * 4)
    assert p.spread == pytest.approx(0.0)
    assert (p.copy_gb_s, p.triad_gb_s) == (pytest.approx(4.0), pytest.approx(5.0))


def test_matmul_rate_worked_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    # One warm-up product (untimed), then 3 timed: the best is 2 ms. A 256 x 256 product is
    # 2 x 256^3 = 33,554,432 FLOPs: 33,554,432 / 0.002 s = 1.6777216e10 FLOP/s = 0.016777 TFLOPS.
    clock = ScriptedClock([0.004, 0.002, 0.003])
    monkeypatch.setattr(time, "perf_counter", clock)
    assert probe_cpu_matmul_tflops(n=256, runs=3) == pytest.approx(0.016777216)
    assert clock.durations == []


def test_bandwidth_probe_of_this_machine(probe: BandwidthProbe) -> None:
    assert probe.runs == 3 and len(probe.run_gb_s) == 3
    assert probe.array_mb == pytest.approx(32)
    # One thread a usable CPU (4 million float64 are far more than there are CPUs).
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert probe.threads == cpus
    # The best figure is one of the runs', and the best of copy and triad.
    assert probe.best_gb_s in probe.run_gb_s
    assert probe.best_gb_s == max(probe.copy_gb_s, probe.triad_gb_s)


def test_a_cpu_moves_less_than_the_fastest_gpu_in_the_table(probe: BandwidthProbe) -> None:
    # A sanity bound, not a benchmark: no CPU memory system reaches an H100's 3350 GB/s, and
    # any machine that runs this test moves more than 0.1 GB/s.
    for figure in (probe.copy_gb_s, probe.triad_gb_s, *probe.run_gb_s):
        assert 0.1 < figure < 3350


def test_one_thread_can_be_asked_for() -> None:
    single = probe_cpu_bandwidth(array_mb=8, runs=2, threads=1)
    assert single.threads == 1
    assert 0.1 < single.best_gb_s < 3350


def test_bad_probe_arguments_are_input_errors() -> None:
    with pytest.raises(InputError):
        probe_cpu_bandwidth(array_mb=0)
    with pytest.raises(InputError):
        probe_cpu_bandwidth(array_mb=8, runs=0)
    with pytest.raises(InputError):
        probe_cpu_matmul_tflops(n=0)


def test_matmul_probe_gives_a_plausible_cpu_rate() -> None:
    tflops = probe_cpu_matmul_tflops(n=256, runs=3)
    assert 0.0001 < tflops < 100


ZEN3 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n"
ZEN4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
NEOVERSE_V1 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_a_native_bfloat16_dot_product_is_read_from_the_cpu_flags() -> None:
    assert measure.native_bf16(ZEN4) is True
    assert measure.native_bf16(NEOVERSE_V1) is True
    assert measure.native_bf16(ZEN3) is False
    assert measure.native_bf16("") is False


@pytest.mark.parametrize(("native", "dtypes"), [
    (False, {"fp32"}), (True, {"fp32", "bf16"}), (None, {"fp32", "bf16"}),
])
def test_bf16_products_are_measured_only_where_the_cpu_may_do_them_fast(
    monkeypatch: pytest.MonkeyPatch, native: bool | None, dtypes: set[str]
) -> None:
    # Without the dot product, bf16 falls back to a scalar path that is never the fastest and
    # took minutes a measurement (an AMD EPYC with AVX2 only): it is left out. Unknown (not
    # Linux): measured, as before. The torch probe is stood in for by its dtype.
    monkeypatch.setattr(measure, "native_bf16", lambda cpuinfo=None: native)
    asked: list[str] = []

    def torch_probe(shape: tuple[int, int, int], dtype: str = "bf16") -> measure.MatmulProbe:
        asked.append(dtype)
        return measure.MatmulProbe("torch", dtype, shape, 1, 1, 0.001)

    monkeypatch.setattr(measure, "probe_torch_matmul", torch_probe)
    probes = measure.probe_cpu_matmuls(((64, 64, 64),))
    assert set(asked) == dtypes
    assert {p.dtype for p in probes} == dtypes  # numpy's is fp32


MEASURED = BandwidthProbe(copy_gb_s=8.0, triad_gb_s=10.0, best_gb_s=10.0, runs=3, array_mb=8.0,
                          spread=0.75, run_gb_s=(4.0, 8.0, 10.0), threads=2)


def fake_sysconf(page_size: int, pages: int) -> Callable[[str], int]:
    def sysconf(name: str) -> int:
        return {"SC_PAGE_SIZE": page_size, "SC_PHYS_PAGES": pages}[name]

    return sysconf


def test_local_cpu_spec_carries_the_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    # 4,000,000 pages of 4,096 bytes: 16,384,000,000 bytes = 16.384 GB.
    monkeypatch.setattr(os, "sysconf", fake_sysconf(4096, 4_000_000))
    spec = local_cpu_spec(MEASURED, 0.25)
    assert (spec.id, spec.kind, spec.measured) == ("local-cpu", "cpu", True)
    assert spec.mem_bandwidth_gb_s == 10.0
    assert (spec.bf16_tflops, spec.fp8_tflops) == (0.25, None)
    assert spec.memory_gb == pytest.approx(16.384)
    assert spec.name.endswith(" (measured)")
    assert spec.name == cpu_model_name() + " (measured)"
    assert spec.source == (
        "measured by pdscope's bandwidth probe: numpy copy/triad, best of 3 runs on 2 threads,"
        " 8 MB arrays; TFLOPS from an fp32 numpy matmul"
    )


def test_local_cpu_spec_without_a_matmul_figure_or_a_memory_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_sysconf(name: str) -> int:
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(os, "sysconf", no_sysconf)
    spec = local_cpu_spec(MEASURED, None)
    assert spec.bf16_tflops is None and spec.memory_gb is None
    assert spec.source == (
        "measured by pdscope's bandwidth probe: numpy copy/triad, best of 3 runs on 2 threads,"
        " 8 MB arrays"
    )


def test_cpu_model_name_is_the_model_name_line_of_proc_cpuinfo() -> None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo on this system")
    names = re.findall(r"^model name\s*:\s*(\S.*?)\s*$", cpuinfo.read_text(), re.MULTILINE)
    if not names:
        pytest.skip("this /proc/cpuinfo has no 'model name' line (an ARM kernel)")
    assert cpu_model_name() == names[0]


# What `nvidia-smi --query-gpu=name --format=csv,noheader` prints on a machine with two H100
# SXM: one name a line. Written by hand in that documented format (`nvidia-smi
# --help-query-gpu`), with the name the H100 SXM reports (the device table's alias); not
# captured from a machine. The fake refuses any other arguments, as a changed query would
# print something else.
TWO_H100 = "NVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3\n"


def fake_nvidia_smi(
    monkeypatch: pytest.MonkeyPatch, folder: Path, stdout: str | None, status: int = 0
) -> None:
    """Put an ``nvidia-smi`` that prints ``stdout`` and exits ``status`` alone on the PATH;
    ``stdout=None``: no nvidia-smi at all."""
    if stdout is not None:
        script = folder / "nvidia-smi"
        script.write_text(
            "#!/bin/sh\n"
            '[ "$*" = "--query-gpu=name --format=csv,noheader" ] || exit 64\n'
            f"printf '%s' {shlex.quote(stdout)}\n"
            f"exit {status}\n"
        )
        script.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))


@pytest.mark.skipif(sys.platform == "win32", reason="a shell-script nvidia-smi")
def test_nvidia_smi_lists_one_name_a_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_nvidia_smi(monkeypatch, tmp_path, TWO_H100)
    assert nvidia_smi_gpus() == ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]


@pytest.mark.skipif(sys.platform == "win32", reason="a shell-script nvidia-smi")
def test_no_gpu_names_without_nvidia_smi_or_when_it_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_nvidia_smi(monkeypatch, tmp_path, None)
    assert nvidia_smi_gpus() == []
    # nvidia-smi without a driver prints its complaint and exits 9: no GPU, not a GPU named
    # "NVIDIA-SMI has failed ...".
    fake_nvidia_smi(monkeypatch, tmp_path, "NVIDIA-SMI has failed because it couldn't"
                    " communicate with the NVIDIA driver.\n", status=9)
    assert nvidia_smi_gpus() == []


@pytest.mark.skipif(sys.platform != "linux", reason="Apple chips are detected on macOS")
def test_detect_without_probing_names_the_gpu_or_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_nvidia_smi(monkeypatch, tmp_path, TWO_H100)
    spec = detect_local_device(probe_cpu=False)
    assert spec is not None and spec.id == "h100-sxm" and not spec.measured
    # A GPU the table does not know is not guessed, and the CPU is not measured instead.
    fake_nvidia_smi(monkeypatch, tmp_path, "NVIDIA H800\n")
    assert detect_local_device(probe_cpu=False) is None
    # No GPU on Linux, and no probing asked for: nothing.
    (tmp_path / "nvidia-smi").unlink()
    assert detect_local_device(probe_cpu=False) is None
