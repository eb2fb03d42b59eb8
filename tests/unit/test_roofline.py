"""The article's arithmetic: ceilings, KV bytes, batching, prefill, pool, what-if."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdscope import roofline
from pdscope.errors import InputError
from pdscope.hardware import article_devices, find_device
from pdscope.model import from_parameter_count, load_hf_config
from tests.conftest import MODEL_CONFIGS

EIGHT_B_FP16 = from_parameter_count(8e9, "fp16")


def config(name: str):  # type: ignore[no-untyped-def]
    return load_hf_config(MODEL_CONFIGS / f"{name}.json")


# --- decode ceiling -----------------------------------------------------------------------------


def test_the_article_table_8b_at_16_bits_on_six_devices() -> None:
    got = [
        roofline.article_round(roofline.decode_ceiling(EIGHT_B_FP16, d).tok_s)
        for d in article_devices()
    ]
    assert got == [6, 38, 54, 63, 127, 209]


def test_an_8b_model_at_16_bits_on_an_h100_sxm_has_a_209_tok_s_ceiling() -> None:
    c = roofline.decode_ceiling(EIGHT_B_FP16, find_device("h100-sxm"))
    assert c.tok_s == pytest.approx(3350 / 16)


def test_article_rounding_is_half_up() -> None:
    assert roofline.article_round(37.5) == 38  # A10G: 600 / 16
    assert roofline.article_round(5.625) == 6
    assert roofline.article_round(127.4375) == 127


def test_8_bits_roughly_doubles_the_ceiling() -> None:
    h100 = find_device("h100-sxm")
    w = {x.bits: x for x in roofline.quantization_whatif(EIGHT_B_FP16, h100)}
    assert w[16].speedup == pytest.approx(1.0)
    assert w[8].speedup == pytest.approx(2.0)
    assert w[4].speedup == pytest.approx(4.0)
    assert w[8].decode_ceiling_tok_s == pytest.approx(3350 / 8)


def test_decode_ceiling_falls_as_the_context_fills() -> None:
    m = config("meta-llama__Llama-3.1-8B")
    h100 = find_device("h100-sxm")
    short = roofline.decode_ceiling(m, h100, context=0)
    long = roofline.decode_ceiling(m, h100, context=8000)
    assert long.kv_bytes_read == 131072 * 8000
    assert long.tok_s == pytest.approx(3350e9 / (m.read_weight_bytes() + 131072 * 8000))
    assert long.tok_s < short.tok_s
    # "barely": 8,000 tokens of KV is about 1 GB against 15 GB of weights.
    assert 0.9 < long.tok_s / short.tok_s < 0.95
    assert long.kv_share == pytest.approx(1.048576e9 / (m.read_weight_bytes() + 1.048576e9))


# --- KV bytes, worked out by hand for every config in the fixtures ------------------------------

# 2 x layers x KV heads x head_dim x 2 bytes (fp16), unless noted.
KV_PER_TOKEN = {
    "meta-llama__Llama-3.1-8B": 2 * 32 * 8 * 128 * 2,  # the article's 131,072
    "meta-llama__Llama-3.1-70B-Instruct": 2 * 80 * 8 * 128 * 2,
    "meta-llama__Llama-3.2-1B-Instruct": 2 * 16 * 8 * 64 * 2,
    "meta-llama__Llama-3.2-3B-Instruct": 2 * 28 * 8 * 128 * 2,
    "Qwen__Qwen2.5-7B-Instruct": 2 * 28 * 4 * 128 * 2,  # GQA: 4 KV heads for 28 query heads
    "Qwen__Qwen3-8B": 2 * 36 * 8 * 128 * 2,
    "Qwen__Qwen3-32B": 2 * 64 * 8 * 128 * 2,  # head_dim 128, not 5120 / 64 = 80
    "mistralai__Mistral-7B-v0.1": 2 * 32 * 8 * 128 * 2,
    "deepseek-ai__DeepSeek-V2-Lite": 27 * (512 + 64) * 2,  # MLA: one latent, no factor 2
    "google__gemma-3-4b-it": 2 * 34 * 4 * 256 * 2,
    # 25 sliding layers of 8 KV heads x 256, 5 global layers of 2 KV heads x 512.
    "google__gemma-4-26B-A4B": 25 * (2 * 8 * 256 * 2) + 5 * (2 * 2 * 512 * 2),
    "openai__gpt-oss-20b": 2 * 24 * 8 * 64 * 2,
    "openai__gpt-oss-120b": 2 * 36 * 8 * 64 * 2,
}


@pytest.mark.parametrize("name", sorted(KV_PER_TOKEN))
def test_kv_bytes_per_token(name: str) -> None:
    assert roofline.kv_bytes_per_token(config(name)) == KV_PER_TOKEN[name]


def test_every_fixture_config_has_a_hand_worked_kv_figure() -> None:
    assert {p.stem for p in MODEL_CONFIGS.glob("*.json")} == set(KV_PER_TOKEN)


def test_the_article_8b_conversation_of_8000_tokens_holds_about_1_gb() -> None:
    m = config("meta-llama__Llama-3.1-8B")
    assert roofline.kv_bytes_per_request(m, 8000) == 131072 * 8000
    assert roofline.kv_bytes_per_request(m, 8000) == pytest.approx(1e9, rel=0.05)


def test_fp8_kv_halves_the_bytes() -> None:
    m = config("meta-llama__Llama-3.1-8B")
    assert roofline.kv_bytes_per_token(m, "fp8") == 65536


def test_sliding_window_layers_hold_at_most_the_window() -> None:
    mistral = config("mistralai__Mistral-7B-v0.1")  # every layer slides over 4096
    assert roofline.kv_bytes_per_request(mistral, 2000) == 131072 * 2000
    assert roofline.kv_bytes_per_request(mistral, 32000) == 131072 * 4096

    gemma = config("google__gemma-3-4b-it")  # 29 layers slide over 1024, 5 are global
    per_layer = 2 * 4 * 256 * 2
    assert roofline.kv_bytes_per_request(gemma, 8000) == per_layer * (29 * 1024 + 5 * 8000)

    oss = config("openai__gpt-oss-20b")  # alternating: 12 sliding over 128, 12 full
    assert roofline.kv_bytes_per_request(oss, 8000) == 2048 * (12 * 128 + 12 * 8000)


def test_kv_needs_the_model_shape() -> None:
    with pytest.raises(InputError, match="cannot be worked out"):
        roofline.kv_bytes_per_token(EIGHT_B_FP16)


# --- batching -----------------------------------------------------------------------------------


def test_a_batch_shares_one_read_of_the_weights() -> None:
    h100 = find_device("h100-sxm")
    one = roofline.batched_decode(EIGHT_B_FP16, h100, 1)
    eight = roofline.batched_decode(EIGHT_B_FP16, h100, 8)
    assert one.tok_s == pytest.approx(roofline.decode_ceiling(EIGHT_B_FP16, h100).tok_s)
    # Memory-bound: eight sequences cost the same step, so eight times the tokens.
    assert eight.bound == "memory"
    assert eight.tok_s == pytest.approx(8 * one.tok_s)
    assert eight.per_sequence_tok_s == pytest.approx(one.per_sequence_tok_s)


def test_the_batch_turns_compute_bound_at_the_devices_flops_per_byte() -> None:
    h100 = find_device("h100-sxm")
    b = roofline.compute_bound_batch(EIGHT_B_FP16, h100)
    # 16 GB read vs 2 x 8e9 FLOPs a token: compute-bound once B > FLOP/s / (bytes/s).
    flops_per_byte = h100.bf16_tflops * 1e12 / (h100.mem_bandwidth_gb_s * 1e9)  # type: ignore[operator]
    assert b == int(flops_per_byte) + 1
    assert roofline.batched_decode(EIGHT_B_FP16, h100, b).bound == "compute"
    assert roofline.batched_decode(EIGHT_B_FP16, h100, b - 1).bound == "memory"


def test_kv_reads_grow_with_the_batch_and_the_context() -> None:
    m = config("meta-llama__Llama-3.1-8B")
    h100 = find_device("h100-sxm")
    short = roofline.batched_decode(m, h100, 32, context=0)
    long = roofline.batched_decode(m, h100, 32, context=8000)
    assert long.memory_s == pytest.approx(short.memory_s + 32 * 131072 * 8000 / 3350e9)


def test_a_moe_batch_reads_more_experts_than_one_sequence() -> None:
    oss = config("openai__gpt-oss-20b")
    h100 = find_device("h100-sxm")
    one = roofline.batched_decode(oss, h100, 1)
    big = roofline.batched_decode(oss, h100, 64)
    assert one.memory_s == pytest.approx(oss.read_weight_bytes() / 3350e9)
    # With 64 sequences routed to 4 of 32 experts each, nearly every expert is read.
    assert big.memory_s > 2.5 * one.memory_s
    assert big.memory_s <= oss.total_weight_bytes() / 3350e9 + 1e-12


# --- prefill ------------------------------------------------------------------------------------


def test_prefill_flops_are_two_per_parameter_plus_quadratic_attention() -> None:
    m = config("meta-llama__Llama-3.1-8B")
    linear, attention = roofline.prefill_flops(m, 2000)
    # 2 FLOPs a weight read: every weight but the input embedding table (128,256 x 4,096), which
    # a token looks up rather than multiplies; and the output head (also 128,256 x 4,096, not
    # tied in Llama 3.1 8B) for the last prompt token only, the one whose logits are sampled.
    head = 128256 * 4096
    assert linear == 2 * (m.parameters - 2 * head) * 2000 + 2 * head
    assert linear == 2 * (m.parameters_read_per_token - head) * 2000 + 2 * head
    assert attention == 4 * 32 * 128 * (2000 * 2001 / 2) * 32


def test_a_prefill_computes_the_output_head_for_its_last_token_only() -> None:
    # Llama 3.2 1B ties its 128,256 x 2,048 head to the input table: 21% of its weights (as
    # the lab's SmolLM2-135M: 49,152 x 576), so a prefill that counted the head for every
    # token would claim over a quarter more FLOPs than it does.
    m = config("meta-llama__Llama-3.2-1B-Instruct")
    head = 128256 * 2048
    assert roofline.lm_head_parameters(m) == head
    one, _ = roofline.prefill_flops(m, 1)
    assert one == 2 * m.parameters_read_per_token  # one token: the whole model, head and all
    thousand, _ = roofline.prefill_flops(m, 1000)
    assert thousand == 2 * (m.parameters_read_per_token - head) * 1000 + 2 * head
    assert thousand < 0.8 * 2 * m.parameters_read_per_token * 1000


def test_doubling_the_prompt_at_least_doubles_the_ttft() -> None:
    m = config("meta-llama__Llama-3.1-8B")
    h100 = find_device("h100-sxm")
    for n in (2000, 4000, 16000):
        one = roofline.prefill_ceiling(m, h100, n).ttft_s
        two = roofline.prefill_ceiling(m, h100, 2 * n).ttft_s
        assert one is not None and two is not None
        assert two >= 2 * one


def test_a_short_prompt_is_memory_bound_and_a_long_one_compute_bound() -> None:
    m = config("meta-llama__Llama-3.1-8B")
    h100 = find_device("h100-sxm")
    assert roofline.prefill_ceiling(m, h100, 8).bound == "memory"
    assert roofline.prefill_ceiling(m, h100, 2000).bound == "compute"


def test_a_faster_card_shortens_prefill_by_its_flops() -> None:
    l40s, h100 = find_device("l40s"), find_device("h100-sxm")
    a = roofline.prefill_ceiling(EIGHT_B_FP16, l40s, 4000).ttft_s
    b = roofline.prefill_ceiling(EIGHT_B_FP16, h100, 4000).ttft_s
    assert a is not None and b is not None
    assert a / b == pytest.approx(h100.bf16_tflops / l40s.bf16_tflops)  # type: ignore[operator]


def test_a_device_without_flops_has_no_prefill_ceiling() -> None:
    cpu = article_devices()[0]
    assert roofline.prefill_ceiling(EIGHT_B_FP16, cpu, 1000).ttft_s is None


def test_attention_starts_to_matter_at_a_few_thousand_tokens_for_8b() -> None:
    m = config("meta-llama__Llama-3.1-8B")
    n = roofline.attention_share_tokens(m, 0.1)
    assert n is not None
    linear, attention = roofline.prefill_flops(m, n)
    assert attention >= 0.1 * (linear + attention)
    linear, attention = roofline.prefill_flops(m, n - 1)
    assert attention < 0.1 * (linear + attention)


# --- KV pool ------------------------------------------------------------------------------------


def test_kv_pool_on_an_a100_80gb() -> None:
    m = config("meta-llama__Llama-3.1-8B")
    a100 = find_device("a100-80gb-sxm")
    pool = roofline.kv_pool(m, a100, 8000, mem_util=0.92, reserve_gb=1.0)
    expected = 80e9 * 0.92 - m.total_weight_bytes() - 1e9
    assert pool.pool_bytes == pytest.approx(expected)
    assert pool.max_tokens == int(expected // 131072)
    assert pool.max_concurrent_sequences == int(expected // (131072 * 8000))


def test_a_model_that_does_not_fit_has_no_pool() -> None:
    m = config("meta-llama__Llama-3.1-70B-Instruct")
    pool = roofline.kv_pool(m, find_device("l40s"), 4096)
    assert pool.pool_bytes < 0
    assert pool.max_concurrent_sequences == 0


# --- weights split between GPU memory and system RAM (offload) ---------------------------------

EIGHT_B_Q4 = from_parameter_count(8e9, "int4")


def test_an_8b_q4_model_63_percent_on_an_rtx_4090_the_rest_in_ddr5_decodes_at_53_tok_s() -> None:
    # By hand: 8e9 weights x 0.5 bytes = 4.0 GB read a token.
    #   on the GPU: 0.63 x 4.0 GB = 2.52 GB / 1,008 GB/s (RTX 4090)               =  2.500 ms
    #   in RAM:     0.37 x 4.0 GB = 1.48 GB /    90 GB/s (dual channel DDR5-5600) = 16.444 ms
    #   a token: 18.944 ms -> 52.8 tok/s, against 4.0 GB / 1,008 GB/s = 3.968 ms -> 252 tok/s
    #   with every weight on the GPU: 37% of the weights in RAM make decode 4.8x slower.
    c = roofline.split_decode_ceiling(
        EIGHT_B_Q4, find_device("rtx-4090"), find_device("cpu-ddr5-5600-2ch"), 0.63
    )
    assert c.gpu_s == pytest.approx(2.52e9 / 1008e9)
    assert c.cpu_s == pytest.approx(1.48e9 / 90e9)
    assert c.tok_s == pytest.approx(1 / (2.52e9 / 1008e9 + 1.48e9 / 90e9))
    assert round(c.tok_s, 1) == 52.8
    assert roofline.article_round(c.all_on_gpu_tok_s) == 252
    assert c.slowdown == pytest.approx(252 / 52.79, rel=1e-3)
    assert c.off_gpu == pytest.approx(0.37)


def test_the_issue_s_example_37_percent_in_ram_takes_an_8b_fp16_model_from_63_to_13_tok_s() -> None:
    # 16 GB: 0.63 x 16 GB / 1,008 GB/s = 10.0 ms; 0.37 x 16 GB / 90 GB/s = 65.8 ms -> 13.2 tok/s.
    c = roofline.split_decode_ceiling(
        EIGHT_B_FP16, find_device("rtx-4090"), find_device("cpu-ddr5-5600-2ch"), 0.63
    )
    assert roofline.article_round(c.all_on_gpu_tok_s) == 63
    assert c.tok_s == pytest.approx(1 / (10.08e9 / 1008e9 + 5.92e9 / 90e9))
    assert roofline.article_round(c.tok_s) == 13


def test_all_on_the_gpu_the_split_ceiling_is_the_gpu_s_and_none_on_it_the_cpu_s() -> None:
    gpu, cpu = find_device("rtx-4090"), find_device("cpu-ddr5-5600-2ch")
    assert roofline.split_decode_ceiling(EIGHT_B_Q4, gpu, cpu, 1.0).tok_s == pytest.approx(
        roofline.decode_ceiling(EIGHT_B_Q4, gpu).tok_s)
    assert roofline.split_decode_ceiling(EIGHT_B_Q4, gpu, cpu, 0.0).tok_s == pytest.approx(
        roofline.decode_ceiling(EIGHT_B_Q4, cpu).tok_s)


def test_the_kv_cache_read_is_split_like_the_weights() -> None:
    model = config("meta-llama__Llama-3.1-8B")
    gpu, cpu = find_device("rtx-4090"), find_device("cpu-ddr5-5600-2ch")
    c = roofline.split_decode_ceiling(model, gpu, cpu, 0.5, context=8000)
    read = model.read_weight_bytes() + roofline.kv_bytes_per_request(model, 8000)
    assert c.gpu_bytes == pytest.approx(read / 2)
    assert c.cpu_bytes == pytest.approx(read / 2)


def test_split_prefill_adds_each_device_s_share_of_the_flops_at_its_own_peak() -> None:
    gpu = find_device("rtx-4090")
    cpu = replace(find_device("cpu-ddr5-5600-2ch"), bf16_tflops=1.0)
    p = roofline.split_prefill_ceiling(EIGHT_B_Q4, gpu, cpu, 0.63, prompt_tokens=1000)
    linear, attention = roofline.prefill_flops(EIGHT_B_Q4, 1000)  # no shape: linear only
    flops = linear + attention
    assert flops == pytest.approx(2 * 8e9 * 1000)
    assert p.gpu_s == pytest.approx(0.63 * flops / 165.2e12)
    assert p.cpu_s == pytest.approx(0.37 * flops / 1e12)
    assert p.tok_s == pytest.approx(1000 / (p.gpu_s + p.cpu_s))  # type: ignore[operator]
    assert p.all_on_gpu_tok_s == pytest.approx(roofline.prefill_ceiling(EIGHT_B_Q4, gpu).tok_s)


def test_split_prefill_has_no_figure_for_a_cpu_without_flops() -> None:
    p = roofline.split_prefill_ceiling(
        EIGHT_B_Q4, find_device("rtx-4090"), find_device("cpu-ddr5-5600-2ch"), 0.63)
    assert p.tok_s is None and p.cpu_s is None


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_share_outside_0_to_1_is_refused_naming_the_field(share: float) -> None:
    with pytest.raises(InputError, match="on_gpu must be between 0 and 1"):
        roofline.split_decode_ceiling(
            EIGHT_B_Q4, find_device("rtx-4090"), find_device("cpu-ddr5-5600-2ch"), share)


# --- parallel slots x context per slot ----------------------------------------------------------


def test_four_slots_of_8000_tokens_hold_four_times_one_request_s_kv() -> None:
    model = config("meta-llama__Llama-3.1-8B")
    one = roofline.kv_bytes_per_request(model, 8000)
    assert one == 131_072 * 8000
    assert roofline.kv_bytes_for_slots(model, 4, 8000) == pytest.approx(4 * one)


def test_more_slots_push_the_weights_of_an_8b_fp16_model_off_a_24_gb_gpu() -> None:
    model = config("meta-llama__Llama-3.1-8B")
    gpu = find_device("rtx-4090")  # 24 GB
    one = roofline.slots_fit(model, gpu, 1, 8192, mem_util=1.0, reserve_gb=1.0)
    assert not one.weights_spill  # 16.1 GB of weights + 1.07 GB of KV in 23 GB
    many = roofline.slots_fit(model, gpu, 8, 8192, mem_util=1.0, reserve_gb=1.0)
    # 8 x 8,192 x 131,072 bytes = 8.59 GB of KV; 23 - 8.59 = 14.4 GB left for 16.1 GB of weights.
    assert many.kv_bytes == pytest.approx(8 * 8192 * 131_072)
    assert many.weights_spill
    assert many.on_gpu == pytest.approx((23e9 - 8 * 8192 * 131_072) / model.total_weight_bytes())


def test_zero_slots_is_refused_naming_the_field() -> None:
    with pytest.raises(InputError, match="slots must be at least 1"):
        roofline.kv_bytes_for_slots(config("meta-llama__Llama-3.1-8B"), 0, 4096)
