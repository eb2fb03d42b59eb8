"""The local probes measure this machine for real: small arrays and few runs keep them fast."""

from __future__ import annotations

import pytest

from pdscope.errors import InputError
from pdscope.hardware import (
    BandwidthProbe,
    cpu_model_name,
    detect_local_device,
    local_cpu_spec,
    match_gpu_name,
    nvidia_smi_gpus,
    probe_cpu_bandwidth,
    probe_cpu_matmul_tflops,
)


@pytest.fixture(scope="module")
def probe() -> BandwidthProbe:
    return probe_cpu_bandwidth(array_mb=32, runs=3)


def test_bandwidth_probe_gives_positive_figures(probe: BandwidthProbe) -> None:
    assert probe.copy_gb_s > 0
    assert probe.triad_gb_s > 0
    assert probe.runs == 3
    assert probe.array_mb == pytest.approx(32)
    assert probe.threads >= 1


def test_best_is_the_largest_figure_of_any_run(probe: BandwidthProbe) -> None:
    assert len(probe.run_gb_s) == probe.runs
    assert probe.best_gb_s == max(probe.copy_gb_s, probe.triad_gb_s)
    assert all(probe.best_gb_s >= run for run in probe.run_gb_s)
    assert probe.best_gb_s == pytest.approx(max(probe.run_gb_s))


def test_spread_is_range_over_median(probe: BandwidthProbe) -> None:
    runs = sorted(probe.run_gb_s)
    assert probe.spread == pytest.approx((runs[-1] - runs[0]) / runs[len(runs) // 2])
    assert probe.spread >= 0


def test_a_cpu_moves_less_than_the_fastest_gpu_in_the_table(probe: BandwidthProbe) -> None:
    # A sanity bound, not a benchmark: no CPU memory system reaches an H100's 3350 GB/s.
    assert 0.1 < probe.best_gb_s < 3350


def test_one_thread_can_be_asked_for() -> None:
    single = probe_cpu_bandwidth(array_mb=8, runs=2, threads=1)
    assert single.threads == 1
    assert single.best_gb_s > 0


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


def test_local_cpu_spec_carries_the_measurement(probe: BandwidthProbe) -> None:
    spec = local_cpu_spec(probe, 0.25)
    assert spec.measured is True
    assert spec.id == "local-cpu"
    assert spec.kind == "cpu"
    assert spec.mem_bandwidth_gb_s == probe.best_gb_s
    assert spec.bf16_tflops == 0.25
    assert spec.fp8_tflops is None
    assert spec.name == f"{cpu_model_name()} (measured)"
    assert spec.source.startswith("measured by pdscope devices --probe: numpy copy/triad")
    assert f"best of {probe.runs} runs" in spec.source
    assert spec.memory_gb is None or spec.memory_gb > 0


def test_local_cpu_spec_without_a_matmul_figure(probe: BandwidthProbe) -> None:
    spec = local_cpu_spec(probe, None)
    assert spec.bf16_tflops is None
    assert "matmul" not in spec.source


def test_cpu_model_name_is_never_empty() -> None:
    assert cpu_model_name().strip()


def test_nvidia_smi_lists_names_or_nothing() -> None:
    gpus = nvidia_smi_gpus()
    assert isinstance(gpus, list)
    assert all(name and name == name.strip() for name in gpus)


def test_detect_without_probing_never_measures_the_cpu() -> None:
    spec = detect_local_device(probe_cpu=False)
    gpus = nvidia_smi_gpus()
    if gpus:
        # Whatever the machine, a GPU is named from the table or not at all.
        assert spec == match_gpu_name(gpus[0])
    else:
        assert spec is None or spec.kind == "apple"
