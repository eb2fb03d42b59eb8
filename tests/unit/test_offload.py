"""Weights spilled to system RAM, as each server says it: Ollama's /api/ps (a fixture of its
documented shape with size_vram below size), llama.cpp's -ngl, vLLM's --cpu-offload-gb; and the
doctor's reduction of it to the split ceiling."""

from __future__ import annotations

import json

import pytest

from pdscope import roofline
from pdscope.doctor.evidence import Evidence, ServerEvidence
from pdscope.doctor.rules import weights_offloaded
from pdscope.doctor.run import ASSUMED_CPU, offload_cpu, offload_evidence
from pdscope.experiments.common import CeilingInputs
from pdscope.hardware import find_device
from pdscope.model import load_hf_config
from pdscope.servers import ServerSettings, family
from tests.conftest import FIXTURES, MODEL_CONFIGS

OLLAMA_PS = FIXTURES / "servers" / "ollama"
LLAMA_8B = load_hf_config(MODEL_CONFIGS / "meta-llama__Llama-3.1-8B.json")
RTX_4090 = find_device("rtx-4090")
DDR5 = find_device(ASSUMED_CPU)


def ollama_settings(name: str) -> ServerSettings:
    ps = json.loads((OLLAMA_PS / name).read_text())
    return family("ollama").read_settings({"/api/ps": ps}, None, ())


def test_ollama_s_documented_answer_has_every_weight_on_the_gpu() -> None:
    weights = ollama_settings("ps_response.json").weights
    assert weights is not None and weights.on_gpu() == 1.0


def test_ollama_s_partly_offloaded_model_is_63_percent_on_the_gpu() -> None:
    settings = ollama_settings("ps_response_offloaded.json")
    assert settings.weights is not None
    assert settings.weights.on_gpu() == pytest.approx(0.63)
    assert settings.context_tokens == 8192
    assert settings.to_json()["weights"]["gpu_bytes"] == 11161546260


def test_an_ollama_answer_without_size_vram_says_nothing() -> None:
    settings = family("ollama").read_settings({"/api/ps": {"models": [{"size": 5}]}}, None, ())
    assert settings.weights is None


def test_the_doctor_reduces_ollama_s_offload_to_the_split_ceiling_and_fires() -> None:
    settings = ollama_settings("ps_response_offloaded.json")
    ceiling = CeilingInputs(device=RTX_4090, model=LLAMA_8B)
    cpu = offload_cpu(settings, ceiling, local=False)
    assert cpu is not None and cpu.id == ASSUMED_CPU  # a remote server: the assumed CPU
    o = offload_evidence(settings, ceiling, cpu)
    assert o is not None
    expected = roofline.split_decode_ceiling(LLAMA_8B, RTX_4090, DDR5, o.on_gpu)
    assert o.decode_ceiling_tok_s == pytest.approx(expected.tok_s)
    assert o.all_on_gpu_tok_s == pytest.approx(roofline.decode_ceiling(LLAMA_8B, RTX_4090).tok_s)
    f = weights_offloaded(Evidence(server=ServerEvidence(kind="ollama"), offload=o))
    assert f.fired
    split, whole = expected.tok_s, expected.all_on_gpu_tok_s
    assert f.reason.startswith(f"37% of the weights run from system RAM: the ceiling is"
                               f" {split:,.0f} tok/s, not {whole:,.0f}")


def test_on_a_cpu_the_doctor_measures_nothing_and_the_finding_is_clear() -> None:
    settings = family("ollama").read_settings(
        {"/api/ps": {"models": [{"size": 100, "size_vram": 0}]}}, None, ())
    ceiling = CeilingInputs(device=DDR5, model=LLAMA_8B)
    assert offload_cpu(settings, ceiling, local=True) is None
    o = offload_evidence(settings, ceiling, None)
    assert o is not None and o.on_gpu == 0.0 and o.gpu_device is None
    assert weights_offloaded(Evidence(server=ServerEvidence(kind="ollama"),
                                      offload=o)).status == "clear"


def test_a_llama_server_on_a_cpu_without_gpu_flags_is_clear_too() -> None:
    # The lab: no -ngl among the flags, so the placement is unknown, but the device is a CPU.
    settings = family("llama.cpp").read_settings({}, None, ())
    assert settings.weights is None
    o = offload_evidence(settings, CeilingInputs(device=DDR5, model=LLAMA_8B), None)
    assert o is not None and o.device_kind == "cpu"
    f = weights_offloaded(Evidence(server=ServerEvidence(kind="llama.cpp"), offload=o))
    assert f.status == "clear" and "cpu" in f.reason
    # Where the device is not known, nothing is said.
    assert offload_evidence(settings, CeilingInputs(model=LLAMA_8B), None) is None


@pytest.mark.parametrize(("flags", "share"), [
    (("-ngl", "20"), 20 / 33),  # 32 layers + the output layer, as llama.cpp counts
    (("--n-gpu-layers", "33"), 1.0),
    (("--gpu-layers=999",), 1.0),
    (("-ngl", "all"), 1.0),
    (("-ngl", "0"), 0.0),
])
def test_llama_server_s_share_on_the_gpu_is_its_gpu_layers_of_the_model_s_plus_one(
    flags: tuple[str, ...], share: float
) -> None:
    settings = family("llama.cpp").read_settings({}, None, flags)
    assert settings.weights is not None
    assert settings.weights.on_gpu(LLAMA_8B.num_layers) == pytest.approx(share)


@pytest.mark.parametrize("flags", [(), ("-ngl", "auto"), ("-ngl", "-1"), ("-np", "4")])
def test_llama_server_without_a_layer_count_does_not_say(flags: tuple[str, ...]) -> None:
    assert family("llama.cpp").read_settings({}, None, flags).weights is None


def test_llama_server_s_props_say_nothing_of_the_layers() -> None:
    props = json.loads((FIXTURES.parent / "captured" / "llama-server-0c1e570-props.json")
                       .read_text())
    assert family("llama.cpp").read_settings({"/props": props}, None, ()).weights is None


def test_llama_cpp_python_keeps_every_layer_on_the_cpu_by_default() -> None:
    lcpp = family("llama-cpp-python")
    weights = lcpp.read_settings({}, None, ("--model", "m.gguf")).weights
    assert weights is not None and weights.on_gpu(32) == 0.0
    every = lcpp.read_settings({}, None, ("--n_gpu_layers", "-1")).weights
    assert every is not None and every.on_gpu(32) == 1.0
    assert lcpp.read_settings({}, None, ()).weights is None  # its command line unknown


def test_vllm_s_cpu_offload_gb_is_a_share_of_the_weights() -> None:
    weights = family("vllm").read_settings({}, None, ("--cpu-offload-gb", "4")).weights
    assert weights is not None
    total = LLAMA_8B.total_weight_bytes()
    assert weights.on_gpu(weight_bytes=total) == pytest.approx(1 - 4 * 2**30 / total)
    assert family("vllm").read_settings({}, None, ()).weights is None
