"""Every rule of the doctor on hand-made evidence: fired, clear, and not enough evidence."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdscope.doctor.evidence import (
    CapacitySearchEvidence,
    ContextEvidence,
    Evidence,
    HardwareEvidence,
    InterferenceEvidence,
    LoadEvidence,
    LoadLevel,
    OffloadEvidence,
    PhaseEvidence,
    PlanEvidence,
    PrefixEvidence,
    QueueEvidence,
    ServerEvidence,
    SweepEvidence,
)
from pdscope.doctor.rules import (
    RULES,
    capacity,
    cold_start,
    decode_far_below_ceiling,
    decode_near_ceiling,
    diagnose,
    disaggregation,
    gpu_upgrade,
    long_context_decode,
    long_prompt,
    preemption,
    prefill_interference,
    prefix_cache_off,
    queueing_capacity,
    queueing_scheduler,
    tail_latency_batching,
    weights_offloaded,
)

VLLM = ServerEvidence(kind="vllm", version="0.32.0", model="m")
# An 8B model at 16 bits on an H100 SXM: 16 GB a token, 3,350 GB/s, ceiling 209 tok/s.
H100 = HardwareEvidence(device="NVIDIA H100 SXM", measured=False, mem_bandwidth_gb_s=3350,
                        peak_tflops=989.4, weight_bytes_read=16e9, weight_bytes=16e9,
                        kv_bytes_per_token=131072, parameters=8e9, active_parameters=8e9,
                        bytes_per_weight=2.0, device_id="h100-sxm")
CEILING = 3350 / 16


def phases(decode: float, **kw: object) -> PhaseEvidence:
    base = dict(prompt_tokens=2000, output_tokens=128, ttft_s=0.5, prefill_tok_s=4000.0,
                decode_tok_s=decode, itl_p50_s=1 / decode, itl_p99_s=1.2 / decode,
                cold_ttft_s=0.6, decode_ceiling_tok_s=CEILING, prefill_ceiling_tok_s=60000.0,
                kv_share_of_step=0.02, context=2064, runs=5)
    base.update(kw)
    return PhaseEvidence(**base)  # type: ignore[arg-type]


def ev(**kw: object) -> Evidence:
    return Evidence(server=VLLM, **kw)  # type: ignore[arg-type]


# --- decode against its ceiling -----------------------------------------------------------------


def test_decode_near_the_ceiling_fires_with_the_predicted_gain_of_quantizing() -> None:
    f = decode_near_ceiling(ev(hardware=H100, phases=phases(190.0)))
    assert f.fired and f.severity == "high"
    assert f.evidence["fraction"] == pytest.approx(190 / CEILING)
    # 16 GB -> 8 GB a token doubles the ceiling; 4 bits quadruples it.
    assert f.evidence["ceiling_at_8_bits_tok_s"] == pytest.approx(2 * CEILING, rel=0.01)
    assert f.evidence["ceiling_at_4_bits_tok_s"] == pytest.approx(4 * CEILING, rel=0.01)
    assert any("--quantization" in a for a in f.advice)
    assert decode_far_below_ceiling(ev(hardware=H100, phases=phases(190.0))).status == "clear"


def test_decode_far_below_the_ceiling_points_at_the_stack() -> None:
    f = decode_far_below_ceiling(ev(hardware=H100, phases=phases(40.0)))
    assert f.fired and "stack" in f.title
    assert f.evidence["fraction"] == pytest.approx(40 / CEILING)
    assert decode_near_ceiling(ev(hardware=H100, phases=phases(40.0))).status == "clear"


def test_decode_rules_need_a_ceiling() -> None:
    no_ceiling = phases(100.0, decode_ceiling_tok_s=None)
    for rule in (decode_near_ceiling, decode_far_below_ceiling):
        assert rule(ev(phases=no_ceiling)).status == "insufficient"
        assert rule(ev()).status == "insufficient"


# --- prefix cache -------------------------------------------------------------------------------

SWEEP = SweepEvidence(prompt_tokens=(200, 500, 1000, 2000), ttft_s=(0.17, 0.35, 0.65, 1.25),
                      decode_tok_s=(60, 59, 58, 57), a_s=0.05, b_s_per_token=0.0006,
                      c_s_per_token2=None, r2=0.999, decode_rate_change=0.05)


def test_prefix_cache_off_fires_with_the_saving_it_misses() -> None:
    off = PrefixEvidence(prefix_tokens=1500, suffix_tokens=100, cold_ttft_s=1.0, warm_ttft_s=0.98,
                         unique_ttft_s=1.01, detected=False)
    f = prefix_cache_off(ev(prefix=off, sweep=SWEEP))
    assert f.fired
    # The suffix alone would take a + b x 100 = 0.11 s: the cache would save 1.01 - 0.11 s.
    assert f.evidence["missing_saving_s"] == pytest.approx(1.01 - 0.11)
    assert any("--enable-prefix-caching" in a for a in f.advice)
    # Without a sweep, the prefix's share of the prompt estimates it.
    f2 = prefix_cache_off(ev(prefix=off))
    assert f2.evidence["missing_saving_s"] == pytest.approx(1.01 * 1500 / 1600)


def test_prefix_cache_on_is_clear_and_missing_experiment_is_insufficient() -> None:
    on = PrefixEvidence(prefix_tokens=1500, suffix_tokens=100, cold_ttft_s=1.0, warm_ttft_s=0.15,
                        unique_ttft_s=1.0, detected=True, cached_tokens=1488)
    assert prefix_cache_off(ev(prefix=on)).status == "clear"
    assert prefix_cache_off(ev()).status == "insufficient"


# --- long prompt --------------------------------------------------------------------------------


def test_long_prompt_fires_when_prefill_dominates_the_ttft() -> None:
    f = long_prompt(ev(sweep=SWEEP, phases=phases(60.0, prompt_tokens=2000)))
    assert f.fired
    assert f.evidence["prefill_share_of_ttft"] == pytest.approx(1.2 / 1.25)
    short = long_prompt(ev(sweep=replace(SWEEP, a_s=2.0), phases=phases(60.0, prompt_tokens=200)))
    assert short.status == "clear"  # 0.12 s of prefill against a fixed 2 s
    assert long_prompt(ev(sweep=SWEEP)).status == "insufficient"


# --- queueing -----------------------------------------------------------------------------------


def queue(waiting: float, kv: float | None, kind: str | None, pre: float = 0.0) -> QueueEvidence:
    return QueueEvidence(max_waiting=waiting, kv_usage_at_max_waiting=kv,
                         waiting_for_capacity=waiting, preemptions=pre, queueing=kind, windows=10)


def test_queueing_capacity_fires_on_a_full_pool_only() -> None:
    full = ev(queue=queue(12, 0.97, "capacity"))
    f = queueing_capacity(full)
    assert f.fired and f.severity == "high" and f.evidence["kv_usage"] == 0.97
    assert queueing_scheduler(full).status == "clear"


def test_queueing_scheduler_fires_with_memory_to_spare() -> None:
    roomy = ev(queue=queue(30, 0.05, "scheduler"))
    f = queueing_scheduler(roomy)
    assert f.fired and "--max-num-seqs" in " ".join(f.advice)
    assert queueing_capacity(roomy).status == "clear"


def test_no_waiting_is_clear_and_unknown_kv_usage_is_insufficient() -> None:
    idle = ev(queue=queue(0, 0.1, "none"))
    assert queueing_capacity(idle).status == queueing_scheduler(idle).status == "clear"
    llamacpp = ev(queue=queue(3, None, None))
    assert queueing_capacity(llamacpp).status == "insufficient"
    assert queueing_scheduler(ev()).status == "insufficient"


def test_llama_cpp_s_requests_wait_for_a_slot_and_the_advice_keeps_each_slot_s_context() -> None:
    llamacpp = ServerEvidence(kind="llama.cpp", model="m")
    slots = replace(queue(4, None, "scheduler"), running_at_max_waiting=4, slots=4,
                    slot_context_tokens=4096, kv_unified=False)
    f = queueing_scheduler(Evidence(server=llamacpp, queue=slots))
    assert f.fired and "4 of 4 slots busy" in f.reason
    assert f.evidence["slots"] == 4 and f.evidence["running"] == 4
    first = f.advice[0]
    # Twice the slots, and the split context grown with them so that a slot keeps 4,096.
    assert "--parallel from 4 to 8" in first and "--ctx-size from 16,384 to 32,768" in first
    assert "--kv-unified" in " ".join(f.advice)
    unified = queueing_scheduler(Evidence(server=llamacpp, queue=replace(slots, kv_unified=True)))
    assert "--ctx-size stays the pool" in unified.advice[0]
    # Not a full pool: each slot holds its own context.
    assert queueing_capacity(Evidence(server=llamacpp, queue=slots)).status == "clear"


def test_preemption() -> None:
    f = preemption(ev(queue=queue(5, 0.99, "capacity", pre=4)))
    assert f.fired and f.evidence["preemptions"] == 4
    assert any("fewer" in a and "--max-num-seqs" in a for a in f.advice)
    assert preemption(ev(queue=queue(0, 0.2, "none"))).status == "clear"
    assert preemption(ev()).status == "insufficient"


# --- prefill interference -----------------------------------------------------------------------


def inj(gap: float, budget: int | None = None, label: str = "") -> InterferenceEvidence:
    return InterferenceEvidence(streams=4, inject_tokens=1800, p99_before_s=0.03,
                                p99_during_s=gap / 2, max_gap_during_s=gap,
                                budget_tokens=budget, label=label)


def test_prefill_interference_fires_on_a_long_stall() -> None:
    f = prefill_interference(ev(interference=(inj(3.6),)))
    assert f.fired and f.evidence["max_gap_s"] == 3.6
    assert "--max-num-batched-tokens" in " ".join(f.advice)
    assert prefill_interference(ev(interference=(inj(0.05),))).status == "clear"
    assert prefill_interference(ev()).status == "insufficient"


def test_prefill_interference_says_which_budget_did_better_with_numbers() -> None:
    runs = (inj(3.6, 4096, "--max-num-batched-tokens 4096"),
            inj(0.7, 256, "--max-num-batched-tokens 256"))
    f = prefill_interference(ev(interference=runs))
    assert "--max-num-batched-tokens 256" in f.reason
    assert "0.70 s" in f.reason and "3.60 s" in f.reason
    assert "smaller prefill budget did better" in f.reason


# --- context, load, cold start ------------------------------------------------------------------


def test_long_context_decode() -> None:
    f = long_context_decode(ev(phases=phases(150.0, kv_share_of_step=0.45, context=60000),
                               context=ContextEvidence((1000, 60000), (200, 150), 2e-7, 1.9e-7)))
    assert f.fired and f.evidence["kv_share_of_step"] == 0.45
    assert f.evidence["measured_slope_s_per_token"] == 2e-7
    assert long_context_decode(ev(phases=phases(150.0))).status == "clear"
    assert long_context_decode(ev(phases=phases(150.0, kv_share_of_step=None))).status == (
        "insufficient")


def test_tail_latency_under_batching() -> None:
    levels = (LoadLevel(1, 20, 0, 1.0, 60, 0.2, 0.3, 0.016, 0.02),
              LoadLevel(16, 80, 0, 4.0, 400, 1.0, 3.0, 0.04, 0.5))
    f = tail_latency_batching(ev(load=LoadEvidence(levels)))
    assert f.fired and f.evidence["concurrency"] == 16
    assert f.evidence["ratio"] == pytest.approx(0.5 / 0.04)
    calm = LoadEvidence((levels[0],))
    assert tail_latency_batching(ev(load=calm)).status == "clear"
    assert tail_latency_batching(ev()).status == "insufficient"


def test_cold_start() -> None:
    f = cold_start(ev(phases=phases(60.0, cold_ttft_s=6.3, ttft_s=0.3)))
    assert f.fired and f.evidence["cold_ttft_s"] == 6.3
    assert cold_start(ev(phases=phases(60.0, cold_ttft_s=0.4, ttft_s=0.3))).status == "clear"
    assert cold_start(ev(phases=phases(60.0, cold_ttft_s=None))).status == "insufficient"


# --- hardware -----------------------------------------------------------------------------------


def test_bigger_gpu_wont_help_when_decode_is_bandwidth_bound() -> None:
    f = gpu_upgrade(ev(hardware=H100, phases=phases(195.0, prefill_tok_s=4000.0)))
    assert f.id == "bigger-gpu-wont-help" and f.fired
    # The table's GPUs with at least 1.5 x 3,350 = 5,025 GB/s: MI300X, MI325X and B200 (three,
    # so all of them), each with this model's ceiling: a step reads 3,350 GB/s / 209.4 tok/s
    # = 16 GB, so 5,300 / 16 = 331.25, 6,000 / 16 = 375 and 8,000 / 16 = 500 tok/s.
    predictions = [
        "AMD Instinct MI300X (5,300 GB/s): decode ceiling 331 tok/s",
        "AMD Instinct MI325X (6,000 GB/s): decode ceiling 375 tok/s",
        "NVIDIA B200 (8,000 GB/s): decode ceiling 500 tok/s",
    ]
    assert f.evidence["predictions"] == predictions
    assert list(f.advice[1:]) == predictions


def test_faster_gpu_will_help_when_prefill_is_compute_bound_and_dominates() -> None:
    l40s = replace(H100, device="NVIDIA L40S", mem_bandwidth_gb_s=864, peak_tflops=362.05)
    p = phases(30.0, decode_ceiling_tok_s=54.0, prefill_tok_s=20000.0,
               prefill_ceiling_tok_s=22000.0, ttft_s=0.1, prompt_tokens=2000)
    f = gpu_upgrade(ev(hardware=l40s, phases=p, sweep=SWEEP))
    assert f.id == "faster-gpu-will-help" and f.fired
    # Nine GPUs of the table have at least 1.5 x 362.05 = 543 dense TFLOPS; in order of TFLOPS
    # the smallest (H100 PCIe, 756.5), the middle one (the 5th: H100 PCIe, H100 NVL, H200 NVL,
    # H100 SXM, H200 SXM) and the largest (B200, 2,250). The prefill part of the TTFT is
    # 1.2 / 1.25 = 0.96 of 0.1 s, scaled by 362.05 / TFLOPS: 0.096 x 362.05 = 34.757 ms-TFLOPS,
    # / 756.5 = 45.9 ms, / 989 = 35.1 ms, / 2,250 = 15.4 ms.
    assert f.evidence["predictions"] == [
        "NVIDIA H100 PCIe (756 dense TFLOPS): the prefill part of the TTFT about 45.9 ms",
        "NVIDIA H200 SXM (989 dense TFLOPS): the prefill part of the TTFT about 35.1 ms",
        "NVIDIA B200 (2,250 dense TFLOPS): the prefill part of the TTFT about 15.4 ms",
    ]


def test_disaggregation_on_one_device_says_it_does_not_pay() -> None:
    f = disaggregation(ev(interference=(inj(0.7, 256, "--max-num-batched-tokens 256"),)))
    assert f.fired and f.severity == "info"
    assert "Chunked prefill" in f.reason and "0.70 s" in f.reason
    many = Evidence(server=replace(VLLM, devices=8), interference=(inj(3.0),))
    assert disaggregation(many).severity == "low"
    assert disaggregation(ev()).status == "insufficient"


# --- the whole doctor ---------------------------------------------------------------------------


def test_diagnose_runs_every_rule_and_ranks_fired_findings_first() -> None:
    full = ev(hardware=H100, phases=phases(190.0, cold_ttft_s=5.0, ttft_s=0.5), sweep=SWEEP,
              queue=queue(12, 0.97, "capacity", pre=2), interference=(inj(3.6),))
    findings = diagnose(full)
    assert len(findings) == len(RULES)
    statuses = [f.status for f in findings]
    assert statuses == sorted(statuses, key={"fired": 0, "clear": 1, "insufficient": 2}.get)
    fired = [f for f in findings if f.fired]
    assert fired[0].severity == "high"
    assert {"decode-near-ceiling", "queueing-capacity", "preemption", "cold-start"} <= {
        f.id for f in fired}
    # A fired finding says what to change; a clear or an insufficient one has nothing to say.
    assert [len(f.to_json()["advice"]) > 0 for f in findings] == [f.fired for f in findings]


def test_with_no_evidence_every_rule_says_what_it_lacks() -> None:
    findings = diagnose(ev())
    assert len(findings) == len(RULES) == 17  # the seventeen rules of pdscope.doctor.rules
    assert all(f.status == "insufficient" for f in findings)
    assert all(f.reason.startswith("not enough evidence") for f in findings)


def test_advice_follows_the_server_family() -> None:
    ollama = Evidence(server=ServerEvidence(kind="ollama"), queue=queue(5, 0.95, "capacity"))
    f = queueing_capacity(ollama)
    assert any("OLLAMA_KV_CACHE_TYPE" in a for a in f.advice)
    assert not any("--gpu-memory-utilization" in a for a in f.advice)


def plan(users: int | None, best: str | None = None, best_users: int | None = None
         ) -> PlanEvidence:
    return PlanEvidence(slo_ttft_s=2.0, slo_itl_s=0.2, input_tokens=1000, output_tokens=32,
                        predicted_users=users, binding="itl", best_change=best,
                        best_change_users=best_users, fit_error=0.06,
                        floor=None if users else "with one user alone, the TTFT p99 is 3.1 s,"
                        " over the 2 s objective: no load meets the SLO")


def test_capacity_sets_the_prediction_beside_the_measured_levels_and_the_best_change() -> None:
    levels = (LoadLevel(1, 20, 0, 1.0, 60, 0.2, 0.3, 0.016, 0.02, meets_slo=True),
              LoadLevel(4, 20, 0, 2.0, 150, 0.5, 1.0, 0.03, 0.1, meets_slo=True),
              LoadLevel(16, 40, 0, 3.0, 200, 2.0, 5.0, 0.05, 0.9, meets_slo=False))
    f = capacity(ev(load=LoadEvidence(levels, 2.0, 0.2), plan=plan(6, "token budget 512", 12)))
    assert f.fired and f.severity == "medium"  # twice the users with one flag: worth trying
    assert "predicts 6 concurrent users" in f.reason
    assert "measured 4 concurrent users meeting it" in f.reason
    assert "with token budget 512 it would hold 12 concurrent users" in f.reason
    assert f.advice[0].startswith("Try token budget 512")
    assert f.evidence["measured_users"] == 4 and f.evidence["levels"] == [1, 4, 16]
    # A change that adds a user is said, but it is no reason to act.
    small = capacity(ev(plan=plan(6, "max sequences 512", 7)))
    assert small.fired and small.severity == "info"


def test_capacity_says_the_thorough_search_beside_the_prediction() -> None:
    searched = CapacitySearchEvidence(users=5, first_failing=6, held=True, predicted_users=6,
                                      levels=3, stages=5, elapsed_s=75.0, stopped="bracket")
    f = capacity(ev(plan=plan(6), capacity_search=searched))
    assert "predicts 6 concurrent users" in f.reason
    assert "measured by a search from the prediction: 5 concurrent users meet it" in f.reason
    assert "6 concurrent users missed it, the bracket held" in f.reason
    assert f.evidence["searched_users"] == 5 and f.evidence["searched_held"] is True
    shaky = capacity(ev(plan=plan(6), capacity_search=replace(searched, held=False)))
    assert "did not hold" in shaky.reason
    none = capacity(ev(plan=plan(None), capacity_search=replace(searched, users=None)))
    assert "none met the SLO" in none.reason
    assert "searched" not in capacity(ev(plan=plan(6))).reason


def test_capacity_when_one_user_misses_the_slo_says_the_floor() -> None:
    f = capacity(ev(plan=plan(None)))
    assert f.fired and f.severity == "high"
    assert "TTFT p99 is 3.1 s" in f.reason
    assert capacity(ev()).status == "insufficient"


# --- weights spilled to system RAM --------------------------------------------------------------

# The example: an 8B model at 16 bits, 63% on an RTX 4090 (1,008 GB/s, 63 tok/s all on
# it), the rest in dual channel DDR5 (90 GB/s): 1 / (10.08 GB / 1,008 + 5.92 GB / 90) = 13.2.
SPILLED = OffloadEvidence(on_gpu=0.63, source="Ollama /api/ps: size_vram of size",
                          gpu_device="NVIDIA RTX 4090", device_kind="gpu",
                          cpu_device="CPU, dual channel DDR5-5600", cpu_mem_bandwidth_gb_s=90,
                          decode_ceiling_tok_s=13.2, all_on_gpu_tok_s=63.0)
OLLAMA = ServerEvidence(kind="ollama", model="llama3.1:8b-instruct-fp16")


def test_weights_in_system_ram_fire_with_the_split_ceiling_and_ollama_s_knobs() -> None:
    f = weights_offloaded(Evidence(server=OLLAMA, offload=SPILLED))
    assert f.status == "fired" and f.severity == "high"
    assert f.reason.startswith("37% of the weights run from system RAM: the ceiling is 13"
                               " tok/s, not 63")
    assert "assumed" in f.reason  # a CPU from the device table, not measured
    assert "num_gpu" in f.advice[0] and "OLLAMA_NUM_PARALLEL" in f.advice[0]
    assert f.evidence["off_gpu"] == pytest.approx(0.37)


def test_on_llama_cpp_the_advice_is_every_layer_on_the_gpu_and_the_slots_kv() -> None:
    server = ServerEvidence(kind="llama.cpp", model="m")
    spilled = replace(SPILLED, source="the server's flags: -ngl 20", slots=4,
                      slot_context_tokens=8192, slots_kv_bytes=4 * 8192 * 131072)
    f = weights_offloaded(Evidence(server=server, offload=spilled))
    assert f.fired
    assert "-ngl 999" in f.advice[0]
    assert "4 parallel slots of 8,192 tokens hold 4.3 GB of KV cache" in f.advice[1]


def test_without_the_device_the_finding_still_fires_without_a_ceiling() -> None:
    bare = OffloadEvidence(on_gpu=0.5, source="the server's flags: -ngl 16")
    f = weights_offloaded(Evidence(server=ServerEvidence(kind="llama.cpp"), offload=bare))
    assert f.fired and "50% of the weights run from system RAM" in f.reason
    assert "tok/s" not in f.reason


def test_every_weight_on_the_gpu_is_clear() -> None:
    f = weights_offloaded(Evidence(server=OLLAMA, offload=replace(SPILLED, on_gpu=1.0)))
    assert f.status == "clear" and "100% of the weights are in GPU memory" in f.reason


def test_a_server_on_a_cpu_has_nothing_to_offload() -> None:
    cpu = OffloadEvidence(on_gpu=0.0, source="Ollama /api/ps: size_vram of size",
                          device_kind="cpu")
    assert weights_offloaded(Evidence(server=OLLAMA, offload=cpu)).status == "clear"


def test_a_server_that_does_not_say_where_its_weights_are_is_insufficient() -> None:
    f = weights_offloaded(ev())
    assert f.status == "insufficient" and "/api/ps" in f.reason
