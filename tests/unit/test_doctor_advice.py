"""The "what to change" table: every action has a sentence on every server, in its own words."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdscope.servers import ACTIONS, Advice, advice_families, advice_for
from pdscope.servers import family as family_of_kind

DOC = Path(__file__).resolve().parents[2] / "docs" / "advice.md"
FAMILIES = advice_families()
KNOWN = [f for f in FAMILIES if f != "openai"]
HARDWARE_OR_PROMPT = ("shorten_prompt", "more_bandwidth", "faster_compute")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("action", ACTIONS)
def test_every_action_has_a_sentence_and_a_source_on_every_server(action: str, family: str) -> None:
    a = advice_for(action, family)
    assert isinstance(a, Advice)
    assert (a.action, a.family) == (action, family)
    assert a.how.strip() and a.source.strip()
    assert a.how.endswith("."), a.how
    assert a.setting is None or a.setting.strip() == a.setting != ""


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("action", ACTIONS)
def test_the_sentence_names_the_setting_it_gives(action: str, family: str) -> None:
    a = advice_for(action, family)
    if a.setting is not None:
        assert a.setting in a.how, (action, family)


def test_the_exact_names_of_the_main_knobs() -> None:
    expected = {
        ("smaller_prefill_chunks", "vllm"): "--max-num-batched-tokens",
        ("larger_prefill_chunks", "vllm"): "--max-num-batched-tokens",
        ("enable_prefix_cache", "vllm"): "--enable-prefix-caching",
        ("more_kv_memory", "vllm"): "--gpu-memory-utilization",
        ("fp8_kv_cache", "vllm"): "--kv-cache-dtype",
        ("smaller_prefill_chunks", "sglang"): "--chunked-prefill-size",
        ("more_kv_memory", "sglang"): "--mem-fraction-static",
        ("fp8_kv_cache", "ollama"): "OLLAMA_KV_CACHE_TYPE",
        ("more_concurrent_sequences", "ollama"): "OLLAMA_NUM_PARALLEL",
        ("keep_model_loaded", "ollama"): "OLLAMA_KEEP_ALIVE",
        ("more_concurrent_sequences", "llama.cpp"): "--parallel",
        ("more_kv_memory", "llama.cpp"): "--ctx-size",
    }
    for (action, family), name in expected.items():
        assert advice_for(action, family).setting == name, (action, family)


def test_an_8_bit_kv_cache_on_ollama_needs_flash_attention_too() -> None:
    how = advice_for("fp8_kv_cache", "ollama").how
    assert "OLLAMA_KV_CACHE_TYPE=q8_0" in how and "OLLAMA_FLASH_ATTENTION=1" in how


def test_a_quantized_v_cache_on_llama_cpp_asks_for_flash_attention() -> None:
    how = advice_for("fp8_kv_cache", "llama.cpp").how
    assert "-ctk q8_0 -ctv q8_0" in how and "-fa on" in how


def test_sglang_s_prefix_cache_is_on_unless_turned_off() -> None:
    how = advice_for("enable_prefix_cache", "sglang").how
    assert "on by default" in how and "--disable-radix-cache" in how


def test_llama_cpp_python_s_own_flag_names_are_in_the_llama_cpp_sentences() -> None:
    assert "--n_batch" in advice_for("smaller_prefill_chunks", "llama.cpp").how
    assert "--n_ubatch" in advice_for("smaller_prefill_chunks", "llama.cpp").how
    assert "--n_ctx" in advice_for("more_kv_memory", "llama.cpp").how
    assert "one request at a time" in advice_for("more_concurrent_sequences", "llama.cpp").how


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("action", HARDWARE_OR_PROMPT)
def test_hardware_and_the_prompt_have_no_server_setting(action: str, family: str) -> None:
    a = advice_for(action, family)
    assert a.setting is None
    assert a.how == advice_for(action, "vllm").how


@pytest.mark.parametrize("family", ["llama.cpp", "ollama", "tgi"])
def test_a_server_without_disaggregation_says_so(family: str) -> None:
    a = advice_for("disaggregate", family)
    assert a.setting is None
    assert "no prefill/decode disaggregation" in a.how


@pytest.mark.parametrize("action", ACTIONS)
def test_an_unknown_server_gets_no_invented_flag(action: str) -> None:
    assert advice_for(action, "openai").setting is None


def test_an_unknown_server_is_told_what_the_known_ones_call_it() -> None:
    how = advice_for("smaller_prefill_chunks", "openai").how
    for family in KNOWN:
        setting = advice_for("smaller_prefill_chunks", family).setting
        assert setting is not None and f"`{setting}`" in how


def test_a_name_that_could_not_be_checked_says_so_in_its_source() -> None:
    unverified = [advice_for(a, f) for a in ACTIONS for f in FAMILIES
                  if "not verified" in advice_for(a, f).source]  # fmt: skip
    assert advice_for("fp8_kv_cache", "llama.cpp") in unverified


def test_detected_kinds_map_to_families() -> None:
    assert family_of_kind("vllm").advice_name == "vllm"
    assert family_of_kind("sglang").advice_name == "sglang"
    assert family_of_kind("llama.cpp").advice_name == "llama.cpp"
    assert family_of_kind("llama-cpp-python").advice_name == "llama.cpp"
    assert family_of_kind("ollama").advice_name == "ollama"
    assert family_of_kind("tgi").advice_name == "tgi"
    assert family_of_kind("openai").advice_name == "openai"
    assert family_of_kind("pdscope-reference").advice_name == "openai"
    assert family_of_kind("something-new").advice_name == "openai"
    assert family_of_kind("vLLM").advice_name == "vllm"


def test_an_unknown_action_or_family_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown action"):
        advice_for("buy_more_gpus", "vllm")
    with pytest.raises(ValueError, match="unknown server family"):
        advice_for("enable_prefix_cache", "llama-cpp-python")


def test_the_doc_table_names_every_setting_in_its_action_s_row() -> None:
    table = DOC.read_text().split("## The table", 1)[1].split("\n#", 1)[0]
    rows = {line.split("`")[1]: line for line in table.splitlines() if line.startswith("| `")}
    for action in ACTIONS:
        cells = [c.strip() for c in rows[action].strip("|").split(" | ")]
        assert len(cells) == 1 + len(KNOWN), action
        for family, cell in zip(KNOWN, cells[1:], strict=True):
            setting = advice_for(action, family).setting
            if setting is None:
                assert cell.startswith("—"), (action, family, cell)
            else:
                assert f"`{setting}`" in cell, (action, family, setting)
