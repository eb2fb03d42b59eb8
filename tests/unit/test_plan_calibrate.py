"""The calibration's arithmetic: how a TTFT, a stream's decode and streams decoding together
become step observations, and the calibration file. Expected values are worked out by hand
in the comments."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pdscope.client.record import RequestRecord
from pdscope.errors import InputError
from pdscope.plan.calibrate import (
    CalibratedServer,
    Calibration,
    CalibrationConfig,
    Point,
    _plan,
    attention_pairs,
    batch_observations,
    chunks,
    decode_observation,
    decode_residuals,
    load_calibration,
    prefill_observation,
    scheduler_from_settings,
)
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.stepmodel import StepModel, StepObservation
from pdscope.servers import ServerSettings

MS = 1_000_000  # ns


def record(prompt: int, times_ms: list[float], tokens: list[int] | None = None) -> RequestRecord:
    ns = tuple(int(t * MS) for t in times_ms)
    chunk_tokens = tuple(tokens) if tokens else (1,) * len(ns)
    return RequestRecord(
        request_id="r", api="openai", model="m", t_send_ns=0, t_first_token_ns=ns[0],
        t_last_token_ns=ns[-1], t_end_ns=ns[-1], token_times_ns=ns, chunk_tokens=chunk_tokens,
        prompt_tokens=prompt, output_tokens=sum(chunk_tokens), token_count_source="usage",
    )


def test_a_prompt_is_cut_into_budget_sized_chunks() -> None:
    assert chunks(1000, 256) == [(256, 0), (256, 256), (256, 512), (232, 768)]
    assert chunks(100, 256) == [(100, 0)]
    # 3 tokens after 2 in the cache: each sees the 2, then 1, 2, 3 of its own: 6 + 6 = 12.
    assert attention_pairs(3, 2) == 12


def test_a_ttft_is_the_sum_of_the_prompt_s_steps() -> None:
    o = prefill_observation(600, 256, ttft_s=0.5)
    # Chunks 256@0, 256@256, 88@512: pairs 256·257/2 = 32,896; 256·256 + 32,896 = 98,432;
    # 88·512 + 88·89/2 = 45,056 + 3,916 = 48,972. In all 180,300 = 600·601/2.
    assert (o.steps, o.prompt_tokens, o.sequences, o.context_tokens) == (3, 600, 3, 0)
    assert o.attention_pairs == 180_300 == 600 * 601 / 2
    assert o.duration_s == 0.5


def test_one_stream_s_decode_is_its_gaps_at_growing_context() -> None:
    # Five tokens 10 ms apart after a 100-token prompt: 4 steps at contexts 101..104.
    o = decode_observation(record(100, [50, 60, 70, 80, 90]))
    assert o is not None
    assert (o.steps, o.sequences, o.prompt_tokens) == (4, 4, 0)
    assert o.context_tokens == 101 + 102 + 103 + 104
    assert o.duration_s == pytest.approx(0.040)
    assert decode_observation(record(100, [50])) is None  # one token: no gap


def test_a_decode_s_jitter_is_its_gaps_less_the_model_s_steps() -> None:
    # 10 ms a step and 1 µs a context token: after a 1,000-token prompt a step is 11 ms.
    # Gaps 11, 11, 19, 11 ms: on time, on time, 8 ms late, on time. A gap of two tokens in one
    # chunk is not one step: left out.
    model = StepModel(0.010, 0.0, 0.0, 1e-6, 0.0)
    late = decode_residuals([record(1000, [0, 11, 22, 41, 52])], model)
    np.testing.assert_allclose(late * 1000, [0, 0, 8, 0], atol=0.01)
    chunked = decode_residuals([record(1000, [0, 11, 33], [1, 1, 2])], model)
    np.testing.assert_allclose(chunked * 1000, [0], atol=0.01)
    assert decode_residuals([record(1000, [0, 11])], model).size == 0  # one gap: too short


def test_streams_decoding_together_count_every_stream_s_context() -> None:
    # Two streams, prompts 100 and 200. Stream A's tokens at 0..50 ms every 10 ms; B starts
    # at 20 ms and ends at 60. Both decode in [20, 50]: A's tokens at 20, 30, 40, 50 are 3
    # steps of 2 sequences. At A's token times 30, 40, 50, A holds 4, 5, 6 tokens and B 2, 3,
    # 4: contexts (100+4)+(200+2), (100+5)+(200+3), (100+6)+(200+4) = 306 + 308 + 310 = 924.
    a = record(100, [0, 10, 20, 30, 40, 50])
    b = record(200, [20, 30, 40, 50, 60])
    obs = batch_observations([a, b])
    assert len(obs) == 2
    first = obs[0]
    assert (first.steps, first.sequences, first.prompt_tokens) == (3, 6, 0)
    assert first.context_tokens == pytest.approx(924)
    assert first.duration_s == pytest.approx(0.030)
    # B's tokens at 20..50: B holds 2, 3, 4 and A 4, 5, 6 at 30, 40, 50: the same 924.
    assert obs[1].context_tokens == pytest.approx(924)


def test_a_slots_server_gets_no_batch_larger_than_its_slots() -> None:
    # Eight or sixteen streams on four slots never all decode at once (four wait for a slot):
    # such a batch measures nothing, so the plan sends four instead, once.
    config = CalibrationConfig(runs=1, batch_streams=(2, 4, 8, 16))
    streams = [s for part, _, _, _, s in _plan(config, serial=False, max_streams=4)
               if part == "batch"]
    assert streams == [2, 4]
    budget = [s for part, _, _, _, s in _plan(config, serial=False) if part == "batch"]
    assert budget == [2, 4, 8, 16]
    assert not [p for p in _plan(config, serial=True) if p[0] == "batch"]


def test_unreported_settings_become_stated_assumptions() -> None:
    config, assumed = scheduler_from_settings(ServerSettings(), "budget")
    assert config.policy == "budget" and config.max_num_batched_tokens == 2048
    assert config.max_num_seqs == 256 and config.block_size == 16
    assert len(assumed) == 5 and any("token budget" in a for a in assumed)
    told = ServerSettings(prefill_budget_tokens=512, max_sequences=8, kv_pool_tokens=4096,
                          block_size=32, prefix_caching=False)
    config, assumed = scheduler_from_settings(told, "budget")
    assert assumed == []
    assert (config.max_num_batched_tokens, config.max_num_seqs, config.kv_pool_tokens,
            config.block_size, config.prefix_caching) == (512, 8, 4096, 32, False)
    slots, _ = scheduler_from_settings(ServerSettings(max_sequences=1), "slots")
    assert slots.policy == "slots" and slots.slots == 1


def test_the_config_checks_itself() -> None:
    with pytest.raises(InputError, match="at least two prompt lengths"):
        CalibrationConfig(prefill_tokens=(128,))
    with pytest.raises(InputError, match="batch stream counts must be at least 2"):
        CalibrationConfig(batch_streams=(1,))
    with pytest.raises(InputError, match="runs must be at least 1"):
        CalibrationConfig(runs=0)


def calibration() -> Calibration:
    model = StepModel(base_s=0.01, per_prompt_token_s=1e-4, per_sequence_s=1e-3,
                      per_context_token_s=1e-6, per_attention_pair_s=1e-9)
    o = StepObservation(steps=2, prompt_tokens=300, sequences=2, context_tokens=0,
                        attention_pairs=45_150, duration_s=0.1)
    return Calibration(model, SchedulerConfig(policy="budget"),
                       CalibratedServer(url="http://h:1"), (Point("prefill", "300", o, 0.09),),
                       ("an assumption",))


def test_a_calibration_reads_back_as_written(tmp_path: Path) -> None:
    cal = calibration()
    path = cal.save(tmp_path / "cal")
    back = load_calibration(tmp_path / "cal")
    assert back.to_json() == cal.to_json()
    assert load_calibration(path).step_model == cal.step_model
    # |0.09 / 0.1 - 1| = 10%.
    assert back.errors_by_part() == {"prefill": pytest.approx(0.1)}


# A calibration's ``server`` as pdscope has always written it (live: no ``runs``; from runs:
# ``runs`` last), the hardware figures beside the rest.
WRITTEN_SERVER = {
    "url": "http://127.0.0.1:8000", "family": "llama.cpp", "version": "b4000", "model": "m",
    "api": "openai",
    "settings": {"prefill_budget_tokens": 2048, "budget_label": "n_batch", "max_sequences": 4,
                 "kv_pool_tokens": 16384, "block_size": None, "prefix_caching": True,
                 "context_tokens": 4096, "kv_unified": False, "ubatch_tokens": 512,
                 "weights": {"size_bytes": None, "gpu_bytes": None, "gpu_layers": 99,
                             "extra_layers": 1, "all_layers": False, "cpu_bytes": None,
                             "source": "the server's -ngl"},
                 "sources": ["/props"]},
    "device": "Intel Xeon", "model_source": "/models/m.gguf", "device_bandwidth_gb_s": 50.0,
    "device_bf16_tflops": None, "bytes_per_weight": 2.0, "kv_bytes_per_token": 23040,
}


@pytest.mark.parametrize("runs", [None, ["runs/bench-c1", "runs/bench-c8"]])
def test_a_calibrations_server_reads_back_byte_for_byte(tmp_path: Path, runs: list | None) -> None:
    written = calibration().to_json()
    written["server"] = dict(WRITTEN_SERVER, **({"runs": runs} if runs else {}))
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(written, indent=2, allow_nan=False))
    cal = load_calibration(path)
    assert cal.server.settings.weights is not None and cal.server.settings.weights.gpu_layers == 99
    assert cal.server.hardware.kv_bytes_per_token == 23040 and cal.server.runs == tuple(runs or ())
    again = json.loads(cal.save(tmp_path / "again").read_text())
    assert json.dumps(again["server"], indent=2) == json.dumps(written["server"], indent=2)


def test_what_is_not_a_calibration_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read the calibration"):
        load_calibration(tmp_path / "none")
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="is not a pdscope calibration"):
        load_calibration(tmp_path / "x.json")
    data = calibration().to_json()
    data["version"] = 99
    (tmp_path / "v.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="calibrate again"):
        load_calibration(tmp_path / "v.json")
    del data["step_model"]
    data["version"] = 1
    (tmp_path / "d.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="is damaged"):
        load_calibration(tmp_path / "d.json")
