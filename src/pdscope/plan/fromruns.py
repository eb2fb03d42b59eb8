"""Calibration from recorded runs: the step-time model fitted to what ``pdscope bench`` (or the
doctor's load levels) already measured, without sending a request.

What a run folder holds (:func:`pdscope.load.results.read_run`): every request's send time, the
arrival of each token-bearing chunk and the tokens in it, the prompt's token count
(``requests.jsonl``); the server and model (``run.json``); and, where the server has
``/metrics``, its scrapes (``metrics.jsonl``), whose ``cache_config_info`` labels (vLLM) give the
KV pool, its block size and prefix caching.

What of it is a step observation, on each run's own timeline (one clock, the client's):

- **prefill**: a request that had the server to itself from its send to its first token (no
  other request in flight): its TTFT is its prompt's steps, as in the designed calibration.
- **decode** and **batch**: a *window* of time in which no request was waiting for its first
  token and the same N requests were all decoding (first token in, last token not yet). Every
  step in it holds those N sequences and no prompt; one stream's gaps inside the window are
  its steps (one observation a window, from the stream with the most tokens in it, so that a
  window counts once whatever its N), each reading every stream's prompt and the tokens it had
  by then. N = 1 is the decode part, N ≥ 2 the batch part.

A window in which a prompt was read, or a request waited in a queue, is left out: what its
steps held is not known from outside (which chunks, how many waited), and a queue is what a fit
must not learn. So a run at saturation gives little; a stage at concurrency 1 and one at a few
streams give all three parts. The first request of each run is left out too (it pays for what
the server loads on first use), as are warm-up requests (they still count as in flight).

What a run does not hold: the token budget and the sequence cap (no server reports them in what
a run records): they are the same stated assumptions as a calibration on a server that does not
tell them. A prefix-cache hit would make a TTFT cheaper than its prompt: a request that reports
cached tokens, or any request of a run with shared prefixes, is no prefill observation. vLLM's
``iteration_tokens_total`` histogram counts the tokens of each engine step but not the step's
time, and scrapes come a second apart: it cannot time a step, and is not used.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pdscope.errors import Field, InputError, Note, RunError
from pdscope.hardware import DeviceSpec
from pdscope.load.results import BenchRun, read_run
from pdscope.metrics.recorder import read_recording
from pdscope.model.geometry import ModelGeometry
from pdscope.plan.calibrate import (
    CalibratedServer,
    Calibration,
    Point,
    prefill_observation,
    scheduler_from_settings,
)
from pdscope.plan.stepmodel import (
    HardwareFigures,
    StepObservation,
    fit_step_model,
    roofline_prior,
)
from pdscope.servers import ServerFamily, ServerSettings, family

NS = 1e9


@dataclass(frozen=True)
class _Stream:
    """One request on its run's timeline (ns): ``send``; ``first`` and ``last`` token (``None``
    without one); ``end`` of its time in flight; its token times and the tokens received by
    each (cumulative); ``usable``: a source of observations (completed, not a warm-up, not the
    run's first); ``cached``: it reported prefix-cache hits."""

    send: int
    first: int | None
    last: int | None
    end: int
    prompt: int | None
    times: np.ndarray
    counts: np.ndarray
    usable: bool
    cached: bool

    @property
    def busy_until(self) -> int:
        """When the server was done with it: its last token, else the end of its stream."""
        return self.last if self.last is not None else self.end


def run_folder(path: str | Path) -> BenchRun:
    """A bench run folder, or the load run inside a doctor's folder (``capacity/``);
    :class:`InputError` for anything else."""
    p = Path(path)
    if not (p / "run.json").is_file() and (p / "findings.json").is_file():
        if not (p / "capacity" / "run.json").is_file():
            raise InputError(f"{p} is a doctor folder without a load run (capacity/): it has"
                             " nothing to fit")
        p = p / "capacity"
    return read_run(p)


def calibrate_from_runs(paths: Sequence[str | Path], *, model: ModelGeometry | None = None,
                        device: DeviceSpec | None = None, model_source: str | None = None
                        ) -> Calibration:
    """Fit the step-time model to the requests of bench or doctor run folders of one server.

    ``model`` and ``device`` (optional; a run folder names neither reliably) give the roofline
    prior for a term the runs cannot see, and what a what-if needs to move the model to other
    hardware or to disaggregate. Raises :class:`InputError` for a folder that is not a run or
    runs of different servers or models, and :class:`RunError` (one line, naming the part)
    when the runs cannot support a part of the fit."""
    if not paths:
        raise InputError("calibrating from runs needs at least one run folder")
    runs = [run_folder(p) for p in paths]
    kinds = sorted({str(r.meta.server) for r in runs})
    models = sorted({str(r.meta.model) for r in runs})
    if len(kinds) > 1 or len(models) > 1:
        raise InputError(f"the runs are of different servers or models ({', '.join(kinds)};"
                         f" {', '.join(models)}): calibrate one server at a time")
    first = runs[0]
    fam = family(first.meta.server)
    notes: list[str] = []
    settings = _recorded_settings(runs, fam, notes)
    scheduler, assumptions = scheduler_from_settings(settings, fam.scheduling)
    budget = scheduler.step_tokens
    points: list[Point] = []
    shared = 0
    for run in runs:
        streams = _streams(run)
        if (run.meta.prefix_groups or 0) > 0:
            shared += 1
        else:
            points += _prefill_points(streams, budget, run.path.name)
        points += _window_points(streams, run.path.name)
    if shared:
        notes.append(f"{shared} run(s) with shared prefixes give no prefill observation (a"
                     " cached prefix makes a TTFT cheaper than its prompt)")
    _check_parts(points, fam, scheduler.policy == "slots" and scheduler.slots < 2)
    notes += _coverage(points)
    prior = roofline_prior(model, device) if model is not None and device is not None else None
    if prior is None:
        notes.append(Note("no roofline prior (give ", Field("model"), " and ", Field("device"),
                          "): a term the runs could not see is 0"))
    fitted_model = fit_step_model([p.observation for p in points], prior=prior)
    fitted = tuple(Point(p.part, p.label, p.observation, fitted_model.predict(p.observation))
                   for p in points)
    server = CalibratedServer(
        url=first.meta.url, family=fam.name, version=first.meta.server_version,
        model=first.meta.model, api=first.meta.api, settings=settings,
        device=device.name if device else None, model_source=model_source,
        hardware=HardwareFigures.of(model, device), runs=tuple(str(r.path) for r in runs))
    return Calibration(fitted_model, scheduler, server, fitted, tuple(assumptions),
                       tuple(notes), duration_s=None)


# ----------------------------------------------------------------------------- the runs


def _recorded_settings(runs: Sequence[BenchRun], fam: ServerFamily,
                       notes: list[str]) -> ServerSettings:
    """The server's settings from the labels of its ``cache_config_info`` gauge in the last
    scrape of a run that recorded ``/metrics``; nothing where no run did."""
    names = fam.metric_map.names("cache_config_info") if fam.metric_map else ()
    labels = None
    for run in runs:
        path = run.path / "metrics.jsonl"
        if not names or not path.is_file():
            continue
        try:
            snapshots = read_recording(path).snapshots
        except InputError as exc:
            notes.append(f"{path} was not read ({exc}): the settings it would give are assumed")
            continue
        for snapshot in reversed(snapshots):
            labels = snapshot.info(names) or labels
            if labels:
                break
    return fam.read_settings({}, labels, ())


def _streams(run: BenchRun) -> list[_Stream]:
    """The run's requests that reached the server, in the order they were sent."""
    records = [(row.record, row.warmup) for row in run.requests
               if row.record.t_send_ns is not None]
    records.sort(key=lambda rw: int(rw[0].t_send_ns or 0))
    out = []
    for n, (r, warmup) in enumerate(records):
        times = np.asarray(r.token_times_ns, dtype=np.int64)
        chunk = np.asarray(r.chunk_tokens if len(r.chunk_tokens) == len(times)
                           else (1,) * len(times), dtype=np.int64)
        send = int(r.t_send_ns or 0)
        last = r.t_last_token_ns
        end = max(x for x in (send, r.t_first_token_ns, last, r.t_end_ns) if x is not None)
        out.append(_Stream(
            send=send, first=r.t_first_token_ns, last=last, end=end,
            prompt=r.prompt_tokens, times=times, counts=np.cumsum(np.maximum(chunk, 1)),
            usable=r.ok and not warmup and n > 0 and r.prompt_tokens is not None
            and len(times) > 0,
            cached=bool(r.cached_tokens)))
    return out


def _prefill_points(streams: Sequence[_Stream], budget: int, run: str) -> list[Point]:
    """Each usable request alone at the server from its send to its first token."""
    out = []
    busy_before = -math.inf  # the latest a request sent earlier kept the server busy
    for i, s in enumerate(streams):
        nxt = streams[i + 1].send if i + 1 < len(streams) else math.inf
        alone = s.first is not None and busy_before <= s.send and nxt >= s.first
        if alone and s.usable and not s.cached and s.first is not None and s.prompt:
            ttft = (s.first - s.send) / NS
            if ttft > 0:
                out.append(Point("prefill", f"{s.prompt} prompt tokens ({run})",
                                 prefill_observation(s.prompt, budget, ttft)))
        busy_before = max(busy_before, s.busy_until)
    return out


def _windows(streams: Sequence[_Stream]) -> Iterator[tuple[int, int, tuple[int, ...]]]:
    """``(start, end, decoding streams)`` of every stretch of time in which no request waited
    for its first token and the same streams decoded."""
    # time -> (change in streams reading their prompt, stream that starts or stops decoding)
    starts: dict[int, list[tuple[int, int | None]]] = {}
    stops: dict[int, list[int]] = {}
    for i, s in enumerate(streams):
        starts.setdefault(s.send, []).append((1, None))
        if s.first is None:
            starts.setdefault(s.end, []).append((-1, None))
            continue
        starts.setdefault(s.first, []).append((-1, i))
        stops.setdefault(s.busy_until, []).append(i)
    reading = 0
    decoding: set[int] = set()
    times = sorted(set(starts) | set(stops))
    for k, t in enumerate(times):
        for change, who in starts.get(t, ()):
            reading += change
            if who is not None:
                decoding.add(who)
        decoding.difference_update(stops.get(t, ()))
        if reading == 0 and decoding and k + 1 < len(times):
            yield t, times[k + 1], tuple(sorted(decoding))


def _window_points(streams: Sequence[_Stream], run: str) -> list[Point]:
    out = []
    for start, end, members in _windows(streams):
        group = [streams[i] for i in members]
        if any(s.prompt is None for s in group):
            continue
        observation = _window_observation(group, start, end)
        if observation is not None:
            n = len(group)
            part, label = ("decode", f"alone ({run})") if n == 1 else \
                ("batch", f"{n} streams ({run})")
            out.append(Point(part, label, observation))
    return out


def _window_observation(group: Sequence[_Stream], start: int, end: int
                        ) -> StepObservation | None:
    """The steps of one window, from the usable stream with the most tokens in it."""
    best: tuple[int, int, _Stream] | None = None
    for s in group:
        if not s.usable:
            continue
        f = int(np.searchsorted(s.times, start, side="left"))
        last = int(np.searchsorted(s.times, end, side="right")) - 1
        if last > f and (best is None or last - f > best[1] - best[0]):
            best = (f, last, s)
    if best is None:
        return None
    f, last, s = best
    steps = int(s.counts[last] - s.counts[f])
    if steps < 2:
        return None
    # Each gap's steps read every stream's prompt and the tokens it had before the gap's
    # middle (a batched step's tokens reach the streams at about the same time).
    middles = (s.times[f:last] + s.times[f + 1:last + 1]) / 2
    per_gap = s.counts[f + 1:last + 1] - s.counts[f:last]
    context = 0.0
    for other in group:
        idx = np.searchsorted(other.times, middles, side="left")
        had = np.where(idx > 0, other.counts[np.maximum(idx - 1, 0)], 0)
        context += float(np.sum(per_gap * (int(other.prompt or 0) + had)))
    return StepObservation(steps=steps, prompt_tokens=0, sequences=len(group) * steps,
                           context_tokens=context, attention_pairs=0,
                           duration_s=(int(s.times[last]) - int(s.times[f])) / NS)


# ----------------------------------------------------------------------------- what is missing


def _check_parts(points: Sequence[Point], fam: ServerFamily, one_at_a_time: bool) -> None:
    parts = {p.part for p in points}
    lead = "calibration from runs:"
    if "prefill" not in parts:
        raise RunError(f"{lead} no request had the server to itself from its send to its first"
                       " token, so a prompt's cost cannot be fitted (the prefill part): add a"
                       " run at concurrency 1 or a low request rate, without shared prefixes")
    if "decode" not in parts:
        raise RunError(f"{lead} no request decoded alone for two tokens or more, so a step's"
                       " fixed cost cannot be fitted (the decode part): add a run at"
                       " concurrency 1")
    if "batch" not in parts and not (fam.serial or one_at_a_time):
        raise RunError(f"{lead} no two requests decoded together without a prompt read beside"
                       " them, so a sequence's cost cannot be told from a step's (the batch"
                       " part): add a run at concurrency 2 to 16, below saturation")


def _coverage(points: Sequence[Point]) -> list[str]:
    """What the observations cannot separate, in words (the fit names the terms too)."""
    notes = []
    prompts = {p.observation.prompt_tokens for p in points if p.part == "prefill"}
    if len(prompts) == 1:
        notes.append(f"prompts of one length only ({int(next(iter(prompts)))} tokens): a prompt"
                     " token's fitted cost holds its attention at that length")
    streams = {round(p.observation.sequences / p.observation.steps) for p in points}
    counts = ", ".join(str(n) for n in sorted(streams))
    notes.append(f"from {len(points)} observations: prefill"
                 f" {sum(p.part == 'prefill' for p in points)}, decode windows"
                 f" {sum(p.part == 'decode' for p in points)}, batch windows"
                 f" {sum(p.part == 'batch' for p in points)} (streams decoding together:"
                 f" {counts})")
    return notes
