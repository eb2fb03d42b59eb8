"""Model geometry from config.json, GGUF, Ollama /api/show and a bare parameter count."""

from __future__ import annotations

import json
from pathlib import Path

import json5
import pytest

from pdscope.errors import InputError
from pdscope.model import (
    from_parameter_count,
    geometry_from_hf_config,
    geometry_from_ollama_show,
    load_gguf,
    load_hf_config,
    load_model,
    quant_bits,
)
from tests.conftest import MODEL_CONFIGS, SERVERS

# Published sizes from the model cards (tests/data/fixtures/SOURCES.md), in billions.
PUBLISHED_TOTAL = {
    "meta-llama__Llama-3.1-8B": 8.03,
    "meta-llama__Llama-3.1-70B-Instruct": 70.6,
    "meta-llama__Llama-3.2-1B-Instruct": 1.24,
    "meta-llama__Llama-3.2-3B-Instruct": 3.21,
    "Qwen__Qwen2.5-7B-Instruct": 7.61,
    "Qwen__Qwen3-8B": 8.2,
    "Qwen__Qwen3-32B": 32.8,
    "mistralai__Mistral-7B-v0.1": 7.24,
    "deepseek-ai__DeepSeek-V2-Lite": 15.7,
    "openai__gpt-oss-20b": 21.0,
    "openai__gpt-oss-120b": 117.0,
    # 4.3B with the vision tower of about 0.4B, which is not counted: 3.9B of language model.
    "google__gemma-3-4b-it": 4.3 - 0.4,
}
# These three cards count "active" without the input embedding table (DeepSeek-V2-Lite: 2.4B
# activated; gpt-oss: 3.6B and 5.1B, the model card's table counting the unembedding but not the
# embedding): what pdscope calls parameters read a token. With the embedding they would be 2.66B,
# 4.19B and 5.71B. Qwen's and Mistral's cards count it: tests/unit/test_model_parameters.py.
PUBLISHED_ACTIVE = {
    "deepseek-ai__DeepSeek-V2-Lite": 2.4,
    "openai__gpt-oss-20b": 3.6,
    "openai__gpt-oss-120b": 5.1,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL))
def test_parameter_count_from_config_is_within_2_percent_of_the_model_card(name: str) -> None:
    g = load_hf_config(MODEL_CONFIGS / f"{name}.json")
    published = PUBLISHED_TOTAL[name] * 1e9
    assert g.parameters == pytest.approx(published, rel=0.02)
    assert g.parameters_source == "computed from config"


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE))
def test_parameters_read_a_token_of_moe_models_match_the_model_card(name: str) -> None:
    g = load_hf_config(MODEL_CONFIGS / f"{name}.json")
    assert g.is_moe
    # Model cards round active counts to one decimal: allow half a unit of that rounding.
    assert abs(g.parameters_read_per_token / 1e9 - PUBLISHED_ACTIVE[name]) <= 0.055
    assert g.parameters_read_per_token < g.parameters / 4
    # The card convention adds the input embedding table back (untied in all three).
    assert g.active_parameters - g.parameters_read_per_token == g.vocab_size * g.hidden_size


def test_dense_model_reads_all_but_the_input_embedding_table() -> None:
    g = load_hf_config(MODEL_CONFIGS / "meta-llama__Llama-3.1-8B.json")
    embedding = 128256 * 4096
    assert g.parameters - g.parameters_read_per_token == embedding
    # A dense model's active path is the whole model, as its card counts it.
    assert g.active_parameters == g.parameters
    tied = load_hf_config(MODEL_CONFIGS / "meta-llama__Llama-3.2-1B-Instruct.json")
    assert tied.tie_word_embeddings is True
    assert tied.active_parameters == tied.parameters
    assert tied.parameters_read_per_token == tied.parameters


def test_a_folder_holding_config_json_is_read_like_the_file(tmp_path: Path) -> None:
    src = MODEL_CONFIGS / "Qwen__Qwen3-8B.json"
    (tmp_path / "config.json").write_text(src.read_text())
    assert load_model(tmp_path).parameters == load_hf_config(src).parameters


def test_head_dim_comes_from_the_config_when_it_differs_from_hidden_over_heads() -> None:
    g = load_hf_config(MODEL_CONFIGS / "Qwen__Qwen3-32B.json")
    assert g.hidden_size // g.num_attention_heads == 80  # 5120 / 64
    assert g.head_dim == 128


def test_gemma3_nested_text_config_and_library_defaults_are_stated() -> None:
    g = load_hf_config(MODEL_CONFIGS / "google__gemma-3-4b-it.json")
    assert (g.num_layers, g.hidden_size) == (34, 2560)  # from text_config
    assert (g.num_attention_heads, g.num_kv_heads, g.head_dim) == (8, 4, 256)  # defaults
    assert any("num_key_value_heads = 4 (library default)" in a for a in g.assumptions)
    assert any("vision_config left out" in a for a in g.assumptions)
    # Gemma 3: every sixth layer is global, the rest slide over 1024 tokens.
    kinds = g.layer_kinds()
    assert kinds.count("full_attention") == 5 and kinds[5] == "full_attention"
    assert g.sliding_window == 1024


def test_gemma4_layer_types_and_global_layer_shape() -> None:
    g = load_hf_config(MODEL_CONFIGS / "google__gemma-4-26B-A4B.json")
    assert g.layer_kinds().count("sliding_attention") == 25
    assert (g.global_kv_heads, g.global_head_dim) == (2, 512)
    assert g.is_moe and (g.num_experts, g.experts_per_token) == (128, 8)
    # "26B A4B": about 26B in all, about 4B read a token.
    assert 24e9 < g.parameters < 27e9
    assert 3.5e9 < g.active_parameters < 4.5e9
    # Tied embeddings: the output head reads the table, so both counts are the same.
    assert g.parameters_read_per_token == g.active_parameters


def test_qwen2_sliding_window_field_is_ignored_unless_enabled() -> None:
    g = load_hf_config(MODEL_CONFIGS / "Qwen__Qwen2.5-7B-Instruct.json")
    assert g.sliding_window is None
    mistral = load_hf_config(MODEL_CONFIGS / "mistralai__Mistral-7B-v0.1.json")
    assert mistral.sliding_window == 4096
    assert set(mistral.layer_kinds()) == {"sliding_attention"}


def test_mla_fields_are_read() -> None:
    g = load_hf_config(MODEL_CONFIGS / "deepseek-ai__DeepSeek-V2-Lite.json")
    assert g.is_mla and (g.kv_lora_rank, g.qk_rope_head_dim) == (512, 64)


def test_mxfp4_experts_make_gpt_oss_weights_about_four_bits() -> None:
    g = load_hf_config(MODEL_CONFIGS / "openai__gpt-oss-20b.json")
    # Experts hold ~19B of the ~21B parameters at 4.25 bits; the rest at 16 bits.
    assert 12e9 < g.total_weight_bytes() < 14.5e9
    assert 0.5 < g.bytes_per_weight < 0.75


# --- bad input ------------------------------------------------------------------------------


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_hf_config(tmp_path / "nope.json")


def test_json_that_is_not_a_config_is_an_input_error(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hello": "world"}))
    with pytest.raises(InputError, match="not a model config"):
        load_hf_config(p)
    p.write_text("{not json")
    with pytest.raises(InputError, match="not JSON"):
        load_hf_config(p)


def test_config_missing_a_required_field_names_it(tmp_path: Path) -> None:
    cfg = json.loads((MODEL_CONFIGS / "meta-llama__Llama-3.1-8B.json").read_text())
    del cfg["num_hidden_layers"]
    with pytest.raises(InputError, match="missing num_hidden_layers"):
        geometry_from_hf_config(cfg, source="x")


def test_zero_or_negative_parameter_count_is_refused() -> None:
    for bad in (0, -8e9):
        with pytest.raises(InputError, match="positive"):
            from_parameter_count(bad)


# --- GGUF --------------------------------------------------------------------------------------


def test_quant_bits_include_block_scales() -> None:
    assert quant_bits("Q4_0") == 4.5
    assert quant_bits("Q4_1") == 5.0
    assert quant_bits("Q8_0") == 8.5
    assert quant_bits("F16") == 16
    assert quant_bits("Q4_K_M") == 4.5  # base type Q4_K: 144 bytes a block of 256


@pytest.mark.model_file
def test_gguf_geometry_of_the_bundled_smollm2(gguf_path: Path) -> None:
    g = load_gguf(gguf_path)
    assert (g.num_layers, g.hidden_size, g.num_attention_heads, g.num_kv_heads) == (30, 576, 9, 3)
    assert g.head_dim == 64
    assert g.weight_dtype == "Q4_1"
    # The real bytes: the tensors' sizes summed equal the file minus its header and metadata.
    size = gguf_path.stat().st_size
    assert 0.95 * size < g.total_weight_bytes() < size
    # 135M parameters; tied embeddings kept at Q8_0 push the mean above Q4_1's 5 bits.
    assert g.parameters == pytest.approx(134.5e6, rel=0.01)
    assert 5.0 < g.bytes_per_weight * 8 < 6.5
    assert g.tie_word_embeddings is True
    # Tied (no output.weight): the head reads the embedding table whole; both counts agree.
    assert g.parameters_read_per_token == g.active_parameters == g.parameters
    assert load_model(gguf_path) == g


# --- Ollama ------------------------------------------------------------------------------------


def test_ollama_show_response_gives_the_geometry() -> None:
    show = json5.loads((SERVERS / "ollama" / "show_response.json5.txt").read_text())
    g = geometry_from_ollama_show(show, model="llama3")
    assert g.parameters == 8030261248
    # Ollama does not say whether the embedding is tied: it is counted as read.
    assert g.active_parameters == g.parameters_read_per_token == 8030261248
    assert (g.num_layers, g.num_kv_heads, g.head_dim) == (32, 8, 128)
    assert g.weight_dtype == "Q4_0"
    assert g.total_weight_bytes() == pytest.approx(8030261248 * 4.5 / 8)
    assert g.max_context == 8192


def test_ollama_show_without_model_info_is_an_input_error() -> None:
    with pytest.raises(InputError, match="model_info"):
        geometry_from_ollama_show({"details": {}})
