"""Interleaved A/B: the same workload on two servers, alternated round by round.

A machine drifts (another job starts, a CPU warms, a cache fills): runs of A first and of B
afterwards put that drift on one side only. Here round 1 runs A then B, round 2 B then A, and
so on (ABBA), so that a steady drift falls on both sides equally; both servers get the same
prompts in a round and new prompts in the next (a prefix cache never sees a round's prompts
twice; a server set against itself gets other prompts on side B, or its cache would serve
them). Each round is an ordinary run folder (``a/round-01``, ``b/round-01``, ...), and the
comparison reads the two folders of rounds (:func:`pdscope.compare.compare`).

The workload is a load level (``pdscope bench``: a rate or a concurrency), a probe (one
request at a time, ``pdscope probe``) or the doctor's interference experiment (``pdscope
interference``: a long prompt injected into decoding streams; the decode stall it causes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdscope.checks import at_least
from pdscope.client.options import ClientOptions
from pdscope.errors import Field, InputError, RunError
from pdscope.experiments.interference import (
    InterferenceConfig,
    InterferenceResult,
    run_interference,
)
from pdscope.experiments.probe import ProbeConfig, ProbeResult, run_probe
from pdscope.load import BenchConfig, Stage, Workload, run_bench
from pdscope.workload.datasets import Lengths

WORKLOADS = ("load", "probe", "interference")
OUTPUT_LEN = 64  # a load's or a probe's output tokens, when not given


@dataclass(frozen=True, kw_only=True)
class AbConfig(ClientOptions):
    """``rounds`` of the ``workload`` on each side. A load: ``num_prompts`` requests of
    ``input_len``/``output_len`` tokens at ``request_rate`` (open loop) or ``concurrency``
    (closed loop). A probe: ``runs`` requests one at a time. Interference: a prompt of
    ``input_len`` tokens injected into ``concurrency`` decoding streams of ``output_len``
    tokens each. ``output_len`` left out: :data:`OUTPUT_LEN`, or for interference the
    experiment's own stream length. ``seed``: the prompts of round ``i`` come from
    ``seed * 100 + i`` (the same on both sides)."""

    rounds: int = 4
    workload: str = "load"
    input_len: int = 512
    output_len: int | None = None
    request_rate: float | None = None
    concurrency: int | None = 4
    num_prompts: int = 32
    runs: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.rounds, 2, "rounds")
        if self.workload not in WORKLOADS:
            raise InputError(f"unknown workload {self.workload!r}: use {' or '.join(WORKLOADS)}")
        at_least(self.input_len, 1, "input_len")
        if self.workload == "interference":
            # The streams must outlast the injection: the experiment's own minimum.
            at_least(self.answer_len, 2 * InterferenceConfig.settle_tokens, "output_len")
        else:
            at_least(self.answer_len, 2, "output_len")
        at_least(self.num_prompts, 2, "num_prompts")
        at_least(self.runs, 2, "runs")
        if self.workload == "load" and (self.request_rate is None) == (self.concurrency is None):
            raise InputError("a load workload takes either ", Field("request_rate"), " or ",
                             Field("concurrency"))
        if self.workload == "interference" and (self.request_rate is not None
                                                or self.concurrency is None):
            raise InputError("an interference workload takes concurrency (its decoding"
                             " streams), not a request rate")
        if self.request_rate is not None and not self.request_rate > 0:
            raise InputError(Field("request_rate"), f" must be above 0, got {self.request_rate:g}")
        if self.concurrency is not None:
            at_least(self.concurrency, 1, "concurrency")

    @property
    def answer_len(self) -> int:
        """The output tokens a request asks for (each decoding stream's, for interference)."""
        if self.output_len is not None:
            return self.output_len
        return InterferenceConfig.stream_tokens if self.workload == "interference" else OUTPUT_LEN

    def round_seed(self, i: int) -> int:
        return (self.seed or 1) * 100 + i


def order(rounds: int) -> list[tuple[int, str]]:
    """(round, side) in the order they run: A B, B A, A B, ..."""
    out = []
    for i in range(1, rounds + 1):
        out += [(i, "a"), (i, "b")] if i % 2 else [(i, "b"), (i, "a")]
    return out


async def _one(url: str, config: AbConfig, i: int, folder: Path, seed: int) -> None:
    client = config.client_fields() | {"seed": seed}
    if config.workload in ("probe", "interference"):
        measured: ProbeResult | InterferenceResult
        if config.workload == "probe":
            measured = await run_probe(url, ProbeConfig(
                **client, prompt_tokens=config.input_len, max_tokens=config.answer_len,
                runs=config.runs))
        else:
            measured = await run_interference(url, InterferenceConfig(
                **client, streams=config.concurrency or 4, inject_tokens=config.input_len,
                stream_tokens=config.answer_len))
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.with_suffix(".json").write_text(json.dumps(measured.to_json(), indent=2))
        return
    stage = Stage(request_rate=config.request_rate, concurrency=config.concurrency,
                  num_prompts=config.num_prompts, seed=seed)
    workload = Workload(input_len=Lengths("fixed", config.input_len),
                        output_len=Lengths("fixed", config.answer_len))
    bench = BenchConfig(**client, record_metrics=False)
    result = await run_bench(url, bench, [stage], workload, folder)
    failure = result.failure()
    if failure:
        raise RunError(f"round {i} on {url}: {failure}")


async def run_ab(url_a: str, url_b: str, config: AbConfig, folder: str | Path, *,
                 progress: Callable[[str, int, int], None] | None = None) -> tuple[Path, Path]:
    """Run the rounds, ABBA, into ``folder/a`` and ``folder/b``; returns those two folders.
    ``progress(label, done, total)`` after each run."""
    root = Path(folder)
    steps = order(config.rounds)
    for done, (i, side) in enumerate(steps, start=1):
        url = url_a if side == "a" else url_b
        seed = config.round_seed(i)
        if url_a == url_b and side == "b":
            seed += 50  # one server on both sides: its prefix cache must not serve B A's prompts
        await _one(url, config, i, root / side / f"round-{i:02d}", seed)
        if progress is not None:
            progress(f"round {i}, {side.upper()}", done, len(steps))
    return root / "a", root / "b"
