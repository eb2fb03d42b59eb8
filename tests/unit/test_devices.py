"""The device table: the article's six rows, dense figures, and names a person would type."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from pdscope.errors import InputError
from pdscope.hardware import all_devices, article_devices, find_device, match_gpu_name, normalise
from pdscope.hardware.devices import KINDS, _keys

DOCS = Path(__file__).resolve().parents[2] / "docs" / "devices.md"


def test_the_article_table_comes_first_in_order_with_its_bandwidths() -> None:
    rows = [(d.name, d.mem_bandwidth_gb_s) for d in article_devices()]
    assert rows == [
        ("CPU, dual channel DDR5-5600", 90),
        ("NVIDIA A10G", 600),
        ("NVIDIA L40S", 864),
        ("NVIDIA RTX 4090", 1008),
        ("NVIDIA A100 80GB SXM", 2039),
        ("NVIDIA H100 SXM", 3350),
    ]
    assert all_devices()[:6] == article_devices()
    assert article_devices()[0].kind == "cpu"


def test_an_8b_model_at_16_bits_gives_the_article_decode_ceilings() -> None:
    # The article divides each bandwidth by 16 GB and rounds to whole tokens/s.
    ceilings = [round(d.mem_bandwidth_gb_s / 16) for d in article_devices()]
    assert ceilings == [6, 38, 54, 63, 127, 209]


def test_every_row_is_complete_and_ids_are_unique() -> None:
    devices = all_devices()
    assert len(devices) >= 30
    ids = [d.id for d in devices]
    assert len(ids) == len(set(ids))
    for d in devices:
        assert d.source.strip(), d.id
        assert d.mem_bandwidth_gb_s > 0, d.id
        assert d.kind in KINDS, d.id
        assert d.id == d.id.lower() and " " not in d.id, d.id
        assert not d.measured, d.id
        for value in (d.bf16_tflops, d.fp8_tflops, d.memory_gb):
            assert value is None or value > 0, d.id


def test_no_name_belongs_to_two_devices() -> None:
    for a, b in itertools.combinations(all_devices(), 2):
        shared = _keys(a) & _keys(b)
        assert not shared, f"{a.id} and {b.id} share {shared}"


def test_fp8_is_about_twice_bf16_so_no_sparse_figure_slipped_in() -> None:
    both = [d for d in all_devices() if d.bf16_tflops and d.fp8_tflops]
    assert len(both) >= 15
    for d in both:
        assert d.fp8_tflops is not None and d.bf16_tflops is not None
        assert 1.8 <= d.fp8_tflops / d.bf16_tflops <= 2.2, d.id


def test_dense_figures_of_well_known_cards() -> None:
    assert find_device("h100-sxm").bf16_tflops == 989
    assert find_device("h100-sxm").fp8_tflops == 1979
    assert find_device("a100-80gb-sxm").bf16_tflops == 312
    assert find_device("a100-80gb-sxm").fp8_tflops is None
    assert find_device("l40s").bf16_tflops == pytest.approx(362.05)
    assert find_device("rtx-4090").bf16_tflops == pytest.approx(165.2)
    assert find_device("mi300x").bf16_tflops == pytest.approx(1307.4)
    assert find_device("b200").bf16_tflops == 2250


def test_bandwidths_beyond_the_article() -> None:
    expected = {
        "h100-pcie": 2000,
        "h200": 4800,
        "b200": 8000,
        "a100-40gb-sxm": 1555,
        "a100-40gb-pcie": 1555,
        "a100-80gb-pcie": 1935,
        "l4": 300,
        "a10": 600,
        "t4": 320,
        "rtx-3090": 936,
        "rtx-5090": 1792,
        "rtx-a6000": 768,
        "mi300x": 5300,
        "mi325x": 6000,
        "m2-max": 400,
        "m2-ultra": 800,
        "m3-max": 400,
        "m3-ultra": 819,
        "m4-max": 546,
    }
    assert {k: find_device(k).mem_bandwidth_gb_s for k in expected} == expected


@pytest.mark.parametrize(
    ("query", "device_id"),
    [
        ("H200", "h200"),
        ("mi300x", "mi300x"),
        ("AMD Instinct MI325X", "mi325x"),
        ("M3 Ultra", "m3-ultra"),
        ("Apple M4 Max", "m4-max"),
        ("m2 max", "m2-max"),
        ("M2_Ultra", "m2-ultra"),
        ("a100 40gb pcie", "a100-40gb-pcie"),
        ("A100 40GB SXM", "a100-40gb-sxm"),
        ("a100-80gb-pcie", "a100-80gb-pcie"),
        ("A100 80GB SXM", "a100-80gb-sxm"),
        ("H100 SXM", "h100-sxm"),
        ("h100_sxm", "h100-sxm"),
        ("H100 PCIe", "h100-pcie"),
        ("B200", "b200"),
        ("L4", "l4"),
        ("L40S", "l40s"),
        ("A10", "a10"),
        ("a10g", "a10g"),
        ("T4", "t4"),
        ("RTX 3090", "rtx-3090"),
        ("rtx 5090", "rtx-5090"),
        ("4090", "rtx-4090"),
        ("RTX A6000", "rtx-a6000"),
        ("rtx 3060", "rtx-3060-12gb"),
        ("GH200", "gh200"),
        ("H20", "h20"),
        ("CPU, dual channel DDR5-5600", "cpu-ddr5-5600-2ch"),
    ],
)
def test_natural_names_find_their_device(query: str, device_id: str) -> None:
    assert find_device(query).id == device_id


def test_normalisation_ignores_case_spaces_and_punctuation() -> None:
    assert normalise("H100 SXM") == normalise("h100-sxm") == normalise("h100_sxm") == "h100sxm"


def test_a_typo_suggests_the_nearest_devices() -> None:
    with pytest.raises(InputError) as err:
        find_device("h10")
    message = str(err.value)
    assert "h100-sxm" in message
    assert "pdscope devices" in message
    assert "\n" not in message


def test_a_misspelt_name_gets_a_did_you_mean() -> None:
    with pytest.raises(InputError) as err:
        find_device("h1OO sxm")
    assert "did you mean h100-sxm" in str(err.value)


def test_a100_alone_is_ambiguous_and_lists_every_a100() -> None:
    with pytest.raises(InputError) as err:
        find_device("a100")
    message = str(err.value)
    for variant in ("a100-80gb-sxm", "a100-40gb-sxm", "a100-40gb-pcie", "a100-80gb-pcie"):
        assert variant in message
    assert "\n" not in message


def test_h100_alone_is_ambiguous_too() -> None:
    with pytest.raises(InputError) as err:
        find_device("H100")
    assert "h100-sxm" in str(err.value) and "h100-pcie" in str(err.value)


def test_nonsense_is_an_input_error_with_exit_status_2() -> None:
    with pytest.raises(InputError) as err:
        find_device("toaster")
    assert err.value.exit_code == 2
    assert "pdscope devices" in str(err.value)
    with pytest.raises(InputError):
        find_device("  ")


@pytest.mark.parametrize(
    ("smi_name", "device_id"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"),
        ("NVIDIA A100-PCIE-40GB", "a100-40gb-pcie"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 5090", "rtx-5090"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA GeForce RTX 4080", "rtx-4080"),
        ("NVIDIA GeForce RTX 3060", "rtx-3060-12gb"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L4", "l4"),
        ("Tesla T4", "t4"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("NVIDIA A40", "a40"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
        ("  NVIDIA H200  ", "h200"),
    ],
)
def test_nvidia_smi_names_match_their_device(smi_name: str, device_id: str) -> None:
    spec = match_gpu_name(smi_name)
    assert spec is not None
    assert spec.id == device_id


@pytest.mark.parametrize(
    "smi_name",
    ["NVIDIA GeForce RTX 4080 SUPER", "NVIDIA H800", "NVIDIA GeForce GTX 1080", "NVIDIA A100", ""],
)
def test_an_unknown_nvidia_smi_name_is_not_guessed(smi_name: str) -> None:
    assert match_gpu_name(smi_name) is None


def test_the_docs_table_lists_every_device() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for d in all_devices():
        assert f"`{d.id}`" in text, d.id
