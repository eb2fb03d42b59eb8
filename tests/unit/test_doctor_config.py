"""A library caller's DoctorConfig reaches every experiment the doctor runs.

The doctor opens one connection with its client options and composes every experiment's config
from them: a non-default timeout is on every request the probe, sweep, prefix, interference,
load levels and calibration send, and the seed is every experiment's. The experiments reuse
the doctor's connection without re-targeting it, and each draws prompts of its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import pdscope.client.connection as connection
import pdscope.load.runner as runner
from pdscope.client import Timeouts
from pdscope.doctor.run import DoctorConfig, run_doctor
from pdscope.selftest import ReferenceConfig, run_in_subprocess

TIMEOUTS = Timeouts(connect=7.0, first_token=41.0, between_tokens=13.0, total=97.0)
SEED = 4242


def test_every_client_option_of_a_doctor_config_reaches_every_experiment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, Timeouts, str]] = []

    def recording(module: Any, where: str) -> None:
        original = module.stream_request

        async def stream_request(*args: Any, **kwargs: Any) -> Any:
            prompt = kwargs.get("prompt") or (args[2] if len(args) > 2 else None)
            messages = kwargs.get("messages")
            text = prompt if prompt is not None else " ".join(m["content"] for m in messages)
            sent.append((where, kwargs["timeouts"], text))
            return await original(*args, **kwargs)

        monkeypatch.setattr(module, "stream_request", stream_request)

    recording(connection, "experiment")
    recording(runner, "load")
    builders: list[int] = []
    original_prompts = connection.Connection.prompts

    def prompts(self: connection.Connection, seed: int) -> Any:
        builders.append(seed)
        return original_prompts(self, seed)

    monkeypatch.setattr(connection.Connection, "prompts", prompts)

    config = DoctorConfig(quick=True, out=tmp_path / "doctor", timeouts=TIMEOUTS, seed=SEED)
    reference = ReferenceConfig(ttft_base_s=0.01, ttft_per_token_s=0.00002, itl_s=0.002)
    with run_in_subprocess(reference) as url:
        run = asyncio.run(run_doctor(url, config))

    assert {"probe", "sweep", "prefix", "interference", "capacity", "plan"} <= set(run.results)
    assert {where for where, _, _ in sent} == {"experiment", "load"}
    assert all(timeouts == TIMEOUTS for _, timeouts, _ in sent)
    for name in ("sweep", "prefix", "interference"):
        assert run.results[name]["config"]["seed"] == SEED
    assert run.probe is not None and run.probe.config.seed == SEED
    # Every experiment on the one connection draws from a seed of its own, after the doctor's
    # (the load levels from theirs, one a stage), so none sends another's prompt.
    experiment_seeds = builders[:5]
    assert experiment_seeds == sorted(set(experiment_seeds))
    assert min(builders) > SEED
    texts = [text for where, _, text in sent if where == "experiment"]
    assert len(set(texts)) > len(texts) // 2


def test_the_interference_leaves_a_slot_free_for_the_long_prompt() -> None:
    from pdscope.doctor.run import INTERFERENCE_STREAMS, interference_streams
    from pdscope.servers import ServerSettings

    # llama-server's four slots: three streams decode, the fourth slot takes the prompt at
    # once (with four streams it was deferred until the streams ended: no stall to measure).
    assert interference_streams("slots", ServerSettings(max_sequences=4)) == 3
    assert interference_streams("slots", ServerSettings(max_sequences=2)) == 1
    assert interference_streams("slots", ServerSettings()) == INTERFERENCE_STREAMS
    # A budget scheduler admits the prompt beside its running sequences.
    assert interference_streams("budget", ServerSettings(max_sequences=4)) == INTERFERENCE_STREAMS


def test_quick_sizes_the_load_s_prompts_to_a_slow_prefill() -> None:
    from pdscope.doctor.run import LOAD_INPUT_TOKENS, QUICK_LOAD_PREFILL_S, load_input_tokens

    # llama-server on two CPU cores prefills ~207 tokens a second: 12 prompts of 1,000 would
    # take 58 s; 300 fit the 20 s.
    assert load_input_tokens(True, 207.0, 12) == 300
    assert QUICK_LOAD_PREFILL_S >= 12 * 300 / 207.0
    # A server fast enough keeps the full length; so does a full run, or an unknown rate.
    assert load_input_tokens(True, 3000.0, 12) == LOAD_INPUT_TOKENS
    assert load_input_tokens(False, 207.0, 12) == LOAD_INPUT_TOKENS
    assert load_input_tokens(True, None, 12) == LOAD_INPUT_TOKENS
    # Never below the floor, however slow.
    assert load_input_tokens(True, 5.0, 12) == 250
