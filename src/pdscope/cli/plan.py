"""pdscope plan: calibrate a step-time model on a server, then predict, find the capacity at an
SLO, and try changes — in a simulator of the server's scheduler."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from rich.table import Table

from pdscope.cli.common import (
    command_parser,
    console,
    flag_of,
    flagged,
    float_in,
    in_flags,
    int_in,
    make_config,
    non_negative_float,
    out_folder,
    positive_int,
    print_json,
    share,
    slo_arg,
    write_result,
)
from pdscope.cli.experiment import progress_bar
from pdscope.cli.server_args import add_server_args, check_ceiling_args, client_kwargs
from pdscope.errors import InputError
from pdscope.hardware import find_device
from pdscope.load.conversations import is_conversation_run, read_conversation_run
from pdscope.load.results import read_run
from pdscope.model import load_model
from pdscope.plan.calibrate import (
    Calibration,
    CalibrationConfig,
    load_calibration,
    run_calibration,
)
from pdscope.plan.capacity import CapacityPoint, max_rate, max_users
from pdscope.plan.conversations import Conversations, per_turn, replayed
from pdscope.plan.demand import (
    DrawnLengths,
    LengthMix,
    LogNormalLengths,
    SampledLengths,
    SharedPrefix,
    closed_loop,
    from_trace,
    open_loop,
    replay,
)
from pdscope.plan.disaggregation import DEFAULT_LINK_GB_S, Disaggregation
from pdscope.plan.fromruns import calibrate_from_runs
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.simulate import simulate
from pdscope.plan.stepmodel import TERMS, StepModel
from pdscope.plan.whatif import DEVICES, on_device, standard_changes, what_if
from pdscope.report.fmt import seconds
from pdscope.slo import SLO
from pdscope.workload.datasets import load_dataset, parse_lengths
from pdscope.workload.schedule import parse_rates
from pdscope.workload.traces import FORMATS as TRACE_FORMATS
from pdscope.workload.traces import read_trace

T = TypeVar("T")

EXAMPLES = """
  pdscope plan calibrate http://127.0.0.1:28100 --out cal       fit the lab's vLLM (2-3 min)
  pdscope plan calibrate --from runs/bench-c1 runs/bench-c8 --out cal   fit recorded runs
  pdscope plan predict cal --rate 2 --input-len 512 --output-len 128
  pdscope plan predict cal --users 8 --set max_num_batched_tokens=512 --json
  pdscope plan predict cal --rate 1 --lengths sharegpt --replicas 2 --device h100-sxm
  pdscope plan predict cal --rate 4 --disaggregate 1:3 --kv-link-gb-s 25   prefill apart
  pdscope plan predict cal --replay runs/bench-20261201-101500   prediction beside the run
  pdscope plan predict cal --trace mooncake_trace.jsonl --time-scale 2 --max-duration 600
  pdscope plan predict cal --conversations 8 --turns 5 --think-s 2 --user-len 300 --output-len 64
      multi-turn chats as bench --conversations sends them: TTFT, prompt and cached share by turn
  pdscope plan capacity cal --slo ttft:1000,itl:100 --input-len 512 --output-len 128
  pdscope plan capacity cal --slo ttft:1000,itl:100 --disaggregate 1:1
  pdscope plan whatif cal --slo ttft:1000,itl:100 --input-len 512 --output-len 128
"""

DEFAULT_INPUT_LEN = "512"
# The conversation flags, by Conversations' fields (the bench's flags of the same names).
CONVERSATION_FLAGS = ("turns", "think_s", "user_len", "request_rate", "template_tokens")

# The --set keys: the scheduler's settings, as their fields are named (dashes allowed).
SET_KEYS = tuple(f.name for f in fields(SchedulerConfig) if f.name != "policy")


def register(sub: argparse._SubParsersAction) -> None:
    p = command_parser(
        sub, "plan",
        "predict latency and capacity from a model of the server's scheduler",
        "Calibrate once on your server (a short designed set of requests, kept below\n"
        "saturation): pdscope fits the time of one engine step to what the step does\n"
        "(prompt tokens, sequences, context read) and reads the scheduler's settings. Then\n"
        "predict any load, find the most users or the highest rate that meet an SLO, and see\n"
        "what a change would do — a token budget, more sequences, prefix caching, replicas,\n"
        "another GPU or 4-bit weights (the last two extrapolated by the roofline).",
        EXAMPLES,
    )
    actions = p.add_subparsers(dest="plan_action", metavar="ACTION", required=True)

    c = actions.add_parser("calibrate", help="fit the step-time model on a server",
                           description="Fits the step-time model on the server at URL, or on"
                           " the requests of bench or doctor run folders (--from), and writes"
                           " DIR/calibration.json. From runs: a request alone gives the prefill"
                           " part, a stretch with one stream decoding the decode part, with"
                           " several the batch part; a run at concurrency 1 and one at a few"
                           " streams give all three.",
                           epilog="examples:\n" + _examples("calibrate"),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_args(c, url="optional")  # --from fits recorded runs instead: no server then
    c.add_argument("--from", dest="from_runs", nargs="+", metavar="RUN",
                   help="fit the requests of these bench (or doctor) run folders instead of"
                   " sending any: runs of one server and model")
    c.add_argument("--runs", type=int_in(1, 20), default=2, metavar="K",
                   help="times each point is measured (default 2)")
    c.add_argument("--out", metavar="DIR", default="calibration",
                   help="folder for calibration.json (default ./calibration; made, and"
                   " checked before the first request)")
    c.add_argument("--json", action="store_true", help="print the calibration as JSON")
    c.set_defaults(handler=run_calibrate)

    r = actions.add_parser("predict", help="simulate one load",
                           description="Simulates the calibrated server under one load and"
                           " prints the latency percentiles, throughput, queue and KV usage.",
                           epilog="examples:\n" + _examples("predict"),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_calibration_args(r)
    load = r.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=float_in(0, 1e6, above=True), metavar="R",
                      help="requests a second (open loop)")
    load.add_argument("--users", type=int_in(1, 1_000_000), metavar="N",
                      help="concurrent users (closed loop)")
    load.add_argument("--replay", metavar="DIR",
                      help="the requests of a bench run folder, at the times they were sent;"
                      " the run's measured figures are set beside the prediction (a bench"
                      " --conversations folder: its conversations, by turn)")
    load.add_argument("--trace", metavar="FILE",
                      help="a trace's requests at its times, with its lengths and shared prefixes"
                      " (Mooncake JSONL, BurstGPT CSV or pdscope JSONL, as bench --trace)")
    load.add_argument("--conversations", type=int, metavar="N",
                      help="N multi-turn conversations, as bench --conversations sends them:"
                      " each turn the whole history and a new message; figures by turn")
    cv = r.add_argument_group("conversations (as bench --conversations; docs/conversations.md)")
    cv.add_argument("--turns", type=int, metavar="K", help="turns a conversation (default 3)")
    cv.add_argument("--think-s", type=float, metavar="S",
                    help="seconds between a turn's answer and the next turn's send (default 0)")
    cv.add_argument("--user-len", type=int, metavar="L",
                    help="tokens of each new user message (default 64); --output-len (a fixed"
                    " number) is each answer's")
    cv.add_argument("--request-rate", metavar="R",
                    help="conversations starting a second (Poisson; default inf: all at once)")
    cv.add_argument("--template-tokens", type=int, metavar="T",
                    help="tokens the chat template adds around each message (default 0)")
    r.add_argument("--trace-format", default="auto", choices=("auto", *TRACE_FORMATS),
                   help="the trace's format (default auto)")
    r.add_argument("--time-scale", type=float_in(0, 1e6, above=True), default=1.0, metavar="X",
                   help="with --trace: multiply its times (0.5: twice as fast; default 1)")
    r.add_argument("--max-duration", type=float_in(0, 1e9, above=True), metavar="S",
                   help="with --trace: the requests due in its first S seconds")
    r.add_argument("--num-requests", type=int_in(1, 10_000_000), default=2000, metavar="K",
                   help="requests to simulate (default 2000)")
    r.add_argument("--burstiness", type=float_in(0, 1000, above=True), default=1.0,
                   help="gamma shape of the gaps between arrivals (1: Poisson; below 1:"
                   " burstier)")
    r.add_argument("--mode", choices=("fast", "exact"), default="fast",
                   help="fast (default) or exact: one engine step at a time, the same answer")
    r.set_defaults(handler=run_predict)

    k = actions.add_parser("capacity", help="the most load that meets an SLO",
                           description="The highest request rate and the most concurrent"
                           " users whose latencies meet the SLO, which objective binds, and"
                           " where the server saturates.",
                           epilog="examples:\n" + _examples("capacity"),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_calibration_args(k)
    _add_slo_args(k)
    k.add_argument("--num-requests", type=int_in(10, 1_000_000), default=2000, metavar="K",
                   help="requests simulated at each load tried (default 2000: what the server"
                   " sustains; a shorter run has a lighter tail and holds more, so to set the"
                   " answer beside a bench run, give its number of requests)")
    k.set_defaults(handler=run_capacity)

    w = actions.add_parser("whatif", help="what each change would do",
                           description="One table: each change to the calibrated server and"
                           " the users it would hold at the SLO, with the TTFT and ITL p99 at"
                           " today's capacity. Other devices and weight widths are"
                           " extrapolated by the roofline and marked so.",
                           epilog="examples:\n" + _examples("whatif"),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_calibration_args(w, device=False, disaggregate=False)
    _add_slo_args(w)
    w.add_argument("--devices", default=",".join(DEVICES), metavar="D,D",
                   help=f"devices to try (default {','.join(DEVICES)}; '' for none)")
    w.add_argument("--num-requests", type=int_in(10, 1_000_000), default=1000, metavar="K",
                   help="requests simulated at each load tried (default 1000)")
    w.set_defaults(handler=run_whatif)


def _examples(action: str) -> str:
    """The examples of one action, each with the indented lines that explain it."""
    out: list[str] = []
    keep = False
    for line in EXAMPLES.strip("\n").splitlines():
        if line.startswith("  pdscope "):
            keep = f"plan {action}" in line
        if keep:
            out.append(line)
    return "\n".join(out)


def _add_calibration_args(p: argparse.ArgumentParser, *, device: bool = True,
                          disaggregate: bool = True) -> None:
    p.add_argument("calibration", metavar="CAL",
                   help="a calibration folder or its calibration.json")
    g = p.add_argument_group("workload")
    g.add_argument("--input-len", metavar="N",
                   help="prompt tokens: N, uniform:MIN:MAX or normal:MEAN:SD (default 512)")
    g.add_argument("--output-len", default="128", metavar="N",
                   help="output tokens, as --input-len (default 128)")
    g.add_argument("--lengths", choices=("sharegpt",),
                   help="sharegpt: long-tailed chat lengths (log-normal, medians 200 in, 250"
                   " out) instead of --input-len/--output-len")
    g.add_argument("--dataset", metavar="PATH",
                   help="sample lengths from a JSONL or ShareGPT file (as bench reads it)")
    g.add_argument("--from-run", metavar="DIR",
                   help="sample lengths from a bench run folder's completed requests")
    g.add_argument("--shared-prefix", type=share, default=0.0, metavar="F",
                   help="share of requests that start with a shared system prompt (0-1)")
    g.add_argument("--prefix-tokens", type=positive_int, default=1024, metavar="T",
                   help="tokens of each shared prefix (default 1024)")
    g.add_argument("--prefix-groups", type=positive_int, default=1, metavar="G",
                   help="distinct shared prefixes (default 1)")
    g.add_argument("--think", type=non_negative_float, default=0.0, metavar="S",
                   help="closed loop: seconds a user waits between an answer and its next"
                   " request (default 0)")
    g.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    s = p.add_argument_group("server changes")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"a scheduler setting: {', '.join(SET_KEYS)}")
    s.add_argument("--replicas", type=int_in(1, 1024), metavar="N",
                   help="identical servers behind a least-outstanding router")
    if device:
        s.add_argument("--device", metavar="D",
                       help="another device (see `pdscope devices`): the model is scaled by"
                       " the roofline's bandwidth and compute ratios (an extrapolation)")
    if disaggregate:
        s.add_argument("--disaggregate", type=split_counts, metavar="P:D",
                       help="prefill/decode disaggregation: P prefill instances and D decode"
                       " instances of the server (P + D devices), each prompt's KV cache sent"
                       " from the one to the other over --kv-link-gb-s")
    rows = "" if disaggregate else " for the disaggregated rows"
    s.add_argument("--kv-link-gb-s", type=float_in(0, 1e6, above=True), metavar="B",
                   help=f"the KV link's bandwidth in GB/s{rows} (default"
                   f" {DEFAULT_LINK_GB_S:g}: one 200 Gb/s port, InfiniBand HDR or 200 GbE)")
    s.add_argument("--kv-bytes-per-token", type=float_in(0, 1e12, above=True), metavar="N",
                   help=f"bytes of KV cache a prompt token sends{rows} (default: the"
                   " calibration's, from the model's geometry)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _add_slo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slo", required=True, metavar="OBJ:MS,...",
                   help="objectives in milliseconds: ttft, itl, tpot, e2e (e.g."
                   " ttft:1000,itl:100)")
    p.add_argument("--percentile", type=float_in(0, 100, above=True), default=99.0,
                   help="the percentile each objective applies to (default 99)")


# --------------------------------------------------------------------------- flags to library


def slo_from(args: argparse.Namespace) -> SLO:
    """``--slo`` (milliseconds) at ``--percentile``, as an :class:`SLO` (seconds)."""
    return make_config(partial(replace, slo_arg("--slo", args.slo)), percentile=args.percentile)


def split_counts(text: str) -> tuple[int, int]:
    """argparse type: ``P:D``, prefill and decode instances, each a whole number from 1."""
    prefill, sep, decode = text.partition(":")
    try:
        counts = (int(prefill), int(decode)) if sep else None
    except ValueError:
        counts = None
    if counts is None or min(counts) < 1 or max(counts) > 1024:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not P:D, prefill and decode instances from 1 to 1,024 (e.g. 1:3)")
    return counts


def parse_settings(pairs: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs as scheduler fields; an unknown key lists the known ones."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SET_KEYS:
            raise InputError(f"--set {pair!r}: unknown setting; known: {', '.join(SET_KEYS)}")
        out[key] = _setting_value(key, value.strip(), pair)
    return out


def _setting_value(key: str, value: str, pair: str) -> Any:
    if key == "prefix_caching":
        if value.lower() in ("on", "true", "1", "yes"):
            return True
        if value.lower() in ("off", "false", "0", "no"):
            return False
        raise InputError(f"--set {pair!r}: prefix_caching is on or off")
    if key == "kv_pool_tokens" and value.lower() in ("none", "unlimited"):
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"--set {pair!r}: {key} is a whole number") from None


def server_under_test(args: argparse.Namespace, cal: Calibration) -> tuple[StepModel,
                                                                        SchedulerConfig]:
    """The calibrated model and scheduler with the flags' changes."""
    changes = parse_settings(args.set)
    if args.replicas is not None:
        changes["replicas"] = args.replicas
    try:
        scheduler = replace(cal.scheduler, **changes)
    except InputError as exc:
        raise InputError(f"--set: {exc}") from None
    model = cal.step_model
    if getattr(args, "device", None):
        model = scaled_to(cal, args.device)
    return model, scheduler


def split_from(args: argparse.Namespace, cal: Calibration) -> Disaggregation | None:
    """The disaggregated setup the flags ask for (``None``: one server, or replicas)."""
    counts = getattr(args, "disaggregate", None)
    if counts is None:
        for flag, value in (("--kv-link-gb-s", args.kv_link_gb_s),
                            ("--kv-bytes-per-token", args.kv_bytes_per_token)):
            if value is not None:
                raise InputError(f"{flag} applies to a disaggregated setup: add --disaggregate"
                                 " P:D")
        return None
    if args.replicas is not None:
        raise InputError("--replicas and --disaggregate exclude each other: a disaggregated"
                         " setup counts its own instances")
    return make_split(counts, args, cal)


def make_split(counts: tuple[int, int], args: argparse.Namespace, cal: Calibration
               ) -> Disaggregation:
    """P:D instances with the link and KV bytes the flags or the calibration give."""
    kv = kv_bytes_from(args, cal)
    if kv is None:
        raise InputError("--disaggregate: the calibration does not say the KV cache's bytes a"
                         " token (it has no model geometry): give --kv-bytes-per-token")
    link = DEFAULT_LINK_GB_S if args.kv_link_gb_s is None else args.kv_link_gb_s
    return make_config(Disaggregation, prefill_instances=counts[0], decode_instances=counts[1],
                       link_gb_s=link, kv_bytes_per_token=kv)


def kv_bytes_from(args: argparse.Namespace, cal: Calibration) -> float | None:
    if args.kv_bytes_per_token is not None:
        return float(args.kv_bytes_per_token)
    value = cal.server.hardware.kv_bytes_per_token
    return float(value) if value else None


def scaled_to(cal: Calibration, device: str) -> StepModel:
    try:
        return on_device(cal.step_model, cal.server.hardware, device)
    except InputError as exc:
        raise InputError(f"--device {device}: {exc}") from None


def lengths_from(args: argparse.Namespace) -> LengthMix:
    given = [name for name, on in (("--lengths", args.lengths), ("--dataset", args.dataset),
                                   ("--from-run", args.from_run)) if on]
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)} exclude each other: give one source of"
                         " lengths")
    if args.lengths == "sharegpt":
        return LogNormalLengths()
    if args.dataset:
        path = Path(args.dataset)
        if not path.is_file():
            raise InputError(f"--dataset {args.dataset}: no such file")
        return SampledLengths.from_items(load_dataset(path), f"the dataset {path}")
    if args.from_run:
        return SampledLengths.from_run(args.from_run)
    return DrawnLengths(parse_lengths(args.input_len or DEFAULT_INPUT_LEN),
                        parse_lengths(args.output_len))


def shared_prefix_from(args: argparse.Namespace) -> SharedPrefix | None:
    if not args.shared_prefix:
        return None
    return make_config(SharedPrefix, fraction=args.shared_prefix, groups=args.prefix_groups,
                       prefix_tokens=args.prefix_tokens)


# ------------------------------------------------------------------------------- commands


def run_calibrate(args: argparse.Namespace) -> int:
    if args.from_runs:
        return run_calibrate_from(args)
    if args.url is None:
        raise InputError("give the server's URL, or --from RUN folders to fit recorded runs")
    config = make_config(CalibrationConfig, runs=args.runs, **client_kwargs(args))
    check_ceiling_args(args)
    with out_folder(args.out) as folder:
        total = 1 + config.runs * (len(config.prefill_tokens) + len(config.decode_contexts)
                                   + len(config.batch_streams))
        with progress_bar("calibrating", total) as progress:
            cal = asyncio.run(run_calibration(args.url, config, device=args.device,
                                              model_config=args.model_config,
                                              progress=progress))
        return _write_calibration(cal, folder, as_json=args.json)


# A calibration from runs takes the model's geometry as ``model`` (calibrate_from_runs), which
# this command reads from --model-config (its --model is the server's model name).
CALIBRATION_FLAGS = {"model": "--model-config"}


def _write_calibration(cal: Calibration, folder: Path, *, as_json: bool) -> int:
    """calibration.json in ``folder`` (the rescue folder if that fails), then the summary."""
    text = json.dumps(flagged(cal.to_json(), CALIBRATION_FLAGS), indent=2, allow_nan=False)
    path = write_result(folder / "calibration.json", text, "the calibration")
    if as_json:
        print_json(cal.to_json(), CALIBRATION_FLAGS)
    else:
        show_calibration(cal, path)
    return 0


def run_calibrate_from(args: argparse.Namespace) -> int:
    """``calibrate --from RUN ...``: the fit of recorded runs, written whole or not at all."""
    if args.url is not None:
        raise InputError(f"give the server's URL or --from RUN folders, not both ({args.url})")
    model = device = None
    if args.device:
        if args.device.strip().lower() == "local":
            raise InputError("--device local: with --from, name the device the runs were"
                             " made on (see `pdscope devices`)")
        device = find_device(args.device)
    if args.model_config:
        check_ceiling_args(args)
        model = load_model(args.model_config)
    cal = calibrate_from_runs(args.from_runs, model=model, device=device,
                              model_source=args.model_config)
    with out_folder(args.out) as folder:
        return _write_calibration(cal, folder, as_json=args.json)


def show_calibration(cal: Calibration, path: Path) -> None:
    server = cal.server
    where = (f"fitted from {len(server.runs)} run folder(s)" if server.runs
             else f"calibrated in {cal.duration_s or 0:.0f} s")
    console.print(f"[bold]{server.family} {server.version or ''}[/] at"
                  f" {server.url}, model [bold]{server.model}[/], {where}")
    table = Table(title="Time of one engine step", title_justify="left")
    table.add_column("term")
    table.add_column("coefficient", justify="right")
    table.add_column("± (1 s.e.)", justify="right")
    table.add_column("from")
    m = cal.step_model
    errors = m.standard_errors or (None,) * len(TERMS)
    for name, value, err in zip(TERMS, m.coefficients, errors, strict=True):
        table.add_row(_term_words(name), _coefficient(name, value),
                      "—" if err is None else _coefficient(name, err),
                      "prior (roofline)" if name in m.fixed else "fit")
    console.print(table)
    fit = ", ".join(f"{part} {err:.1%}" for part, err in cal.errors_by_part().items())
    r2 = "—" if m.r_squared is None else f"{m.r_squared:.4f}"
    console.print(f"fit: {m.observations} observations, R² {r2}; median error by part: {fit}")
    if m.jitter_s:
        lo, mid, hi = (float(np.percentile(m.jitter_s, q)) * 1000 for q in (1, 50, 99))
        console.print(f"step jitter (a decode gap less the model's step): p1 {lo:+.1f} ms,"
                      f" p50 {mid:+.1f} ms, p99 {hi:+.1f} ms; added to every predicted gap")
    s = cal.scheduler
    console.print(f"scheduler: {s.policy}, {s.step_tokens:,} tokens a step, {s.sequences}"
                  f" sequences, KV pool"
                  f" {'unlimited' if s.kv_pool_tokens is None else f'{s.kv_pool_tokens:,}'}"
                  f" tokens, prefix caching {'on' if s.prefix_caching else 'off'}")
    for a in cal.assumptions:
        console.print(f"[yellow]assumed:[/] {in_flags(a, CALIBRATION_FLAGS)}")
    for n in cal.notes:
        console.print(f"[dim]note: {in_flags(n, CALIBRATION_FLAGS)}[/dim]")
    console.print(f"calibration: {path}")


def _term_words(name: str) -> str:
    return {"base_s": "a step (fixed)", "per_prompt_token_s": "a prompt token",
            "per_sequence_s": "a sequence", "per_context_token_s": "a context token read",
            "per_attention_pair_s": "an attention pair"}[name]


def _coefficient(name: str, value: float) -> str:
    if name in ("base_s", "per_sequence_s"):
        return f"{value * 1e3:.3f} ms"
    if name == "per_attention_pair_s":
        return f"{value * 1e9:.4f} ns"
    return f"{value * 1e6:.3f} µs"


def run_predict(args: argparse.Namespace) -> int:
    cal = load_calibration(args.calibration)
    model, scheduler = server_under_test(args, cal)
    split = split_from(args, cal)
    chats = conversations_from(args)
    lengths = lengths_from(args)
    prefix = shared_prefix_from(args)
    if args.trace is None and (args.time_scale != 1.0 or args.max_duration is not None
                               or args.trace_format != "auto"):
        raise InputError("--time-scale, --max-duration and --trace-format need --trace FILE")
    chat_run = None
    if args.replay and is_conversation_run(args.replay):
        chat_run = read_conversation_run(args.replay)
        demand = replayed(chat_run)
    elif args.replay:
        demand = replay(args.replay)
    elif args.trace:
        trace = read_trace(args.trace, args.trace_format)
        try:
            demand = from_trace(trace.replayed(args.time_scale, args.max_duration))
        except InputError as exc:
            raise InputError(exc.naming(lambda f: {"max_duration_s": "--max-duration"}.get(
                f, "--" + f.replace("_", "-")))) from None
    elif chats is not None:
        demand = chats.demand()
    elif args.rate is not None:
        demand = open_loop(args.num_requests, args.rate, lengths, burstiness=args.burstiness,
                           seed=args.seed, shared_prefix=prefix)
    else:
        demand = closed_loop(args.num_requests, args.users, lengths, think_s=args.think,
                             seed=args.seed, shared_prefix=prefix)
    result = simulate(demand, model, scheduler, mode=args.mode, disaggregation=split)
    summary = result.summary()
    data = {"load": demand.label, "mode": args.mode, **summary,
            "scheduler": scheduler.to_json(), "extrapolation": model.extrapolation,
            "disaggregation": None if split is None else split.to_json(),
            "calibration": str(args.calibration)}
    if chat_run is not None:
        data["measured_per_turn"] = [asdict(t) for t in chat_run.per_turn]
    elif args.replay:
        data["measured"] = measured_figures(args.replay)
    if chats is not None:
        data["conversations"] = asdict(chats)
    turns = per_turn(result)
    if turns:
        data["per_turn"] = [asdict(t) for t in turns]
    if args.json:
        print_json(data)
        return 0
    show_prediction(data)
    if turns:
        show_turns(data["per_turn"], data.get("measured_per_turn"))
    return 0


def conversations_from(args: argparse.Namespace) -> Conversations | None:
    """``--conversations N`` and its flags as :class:`Conversations` (``None``: not asked)."""
    given = [flag_of(f) for f in CONVERSATION_FLAGS if getattr(args, f) is not None]
    if args.conversations is None:
        if given:
            raise InputError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to"
                             " --conversations N: add it")
        return None
    others = [flag for flag, on in (
        ("--input-len", args.input_len), ("--lengths", args.lengths),
        ("--dataset", args.dataset), ("--from-run", args.from_run),
        ("--shared-prefix", args.shared_prefix), ("--think", args.think)) if on]
    if others:
        verb = "does not" if len(others) == 1 else "do not"
        raise InputError(f"{', '.join(others)} {verb} apply to --conversations: a turn's prompt"
                         " is the history and --user-len tokens, its answer --output-len tokens,"
                         " and --think-s passes between turns")
    output = _parsed("--output-len", parse_lengths, args.output_len)
    if output.kind != "fixed":
        raise InputError("--conversations takes a fixed --output-len (a number of tokens)")
    rate = math.inf
    if args.request_rate is not None:
        rates = _parsed("--request-rate", parse_rates, args.request_rate)
        if len(rates) > 1:
            raise InputError("--conversations takes one --request-rate")
        rate = rates[0]
    chosen = {f: getattr(args, f) for f in CONVERSATION_FLAGS
              if f != "request_rate" and getattr(args, f) is not None}
    return make_config(Conversations, conversations=args.conversations,
                       output_len=int(output.a), request_rate=rate, seed=args.seed, **chosen)


def _parsed(flag: str, parse: Callable[[str], T], text: str) -> T:
    """``parse(text)``, its complaint naming the flag."""
    try:
        return parse(text)
    except InputError as exc:
        message = exc.naming(lambda _: flag)
        raise InputError(message if flag in message else f"{flag}: {message}") from None


def show_turns(turns: list[dict[str, Any]],
               measured: list[dict[str, Any]] | None = None) -> None:
    """The per-turn table, in the columns of ``bench --conversations``'s (and the p99); a
    replayed run's measured figures beside."""
    table = Table(title="per turn", title_justify="left")
    columns = ["turn", "n", "TTFT p50", "TTFT p90", "TTFT p99", "prompt tok", "cached"]
    if measured is not None:
        columns += ["measured TTFT p50", "measured p90", "measured cached"]
    for col in columns:
        table.add_column(col, justify="right")
    by_turn = {m["turn"]: m for m in measured or ()}
    for t in turns:
        prompt = t["prompt_tokens_p50"]
        cells = [str(t["turn"]), str(t["n"]), _s(t["ttft_p50_s"]), _s(t["ttft_p90_s"]),
                 _s(t["ttft_p99_s"]), "—" if prompt is None else f"{prompt:,.0f}",
                 _share(t["cached_share"])]
        if measured is not None:
            m = by_turn.get(t["turn"], {})
            cells += [_s(m.get("ttft_p50_s")), _s(m.get("ttft_p90_s")),
                      _share(m.get("cached_share"))]
        table.add_row(*cells)
    console.print(table)


def _share(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def measured_figures(path: str) -> dict[str, float | None]:
    """The figures a bench run measured, under the prediction's keys (seconds)."""
    summaries = read_run(path).summaries
    if len(summaries) != 1:
        return {}
    s = summaries[0]
    return {f"{key}_{q}_s": value
            for key, d in (("ttft", s.ttft), ("itl", s.itl), ("tpot", s.tpot), ("e2e", s.e2e))
            for q, value in (("p50", d.median_s), ("p99", d.p99_s))}


def show_prediction(d: dict[str, Any]) -> None:
    console.print(f"[bold]predicted[/]: {d['load']}, {d['simulated_requests']:,} requests"
                  f" simulated in {d['sim_wall_s']:.2f} s ({d['mode']} mode)")
    table = Table(title_justify="left")
    table.add_column("")
    measured = d.get("measured") or {}
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")
    if measured:
        table.add_column("measured p50", justify="right")
        table.add_column("measured p99", justify="right")
    for label, key in (("TTFT", "ttft"), ("ITL", "itl"), ("TPOT", "tpot"),
                       ("end to end", "e2e")):
        cells = [_s(d.get(f"{key}_p50_s")), _s(d.get(f"{key}_p99_s"))]
        if measured:
            cells += [_s(measured.get(f"{key}_p50_s")), _s(measured.get(f"{key}_p99_s"))]
        table.add_row(label, *cells)
    console.print(table)
    console.print(f"throughput: {d['request_throughput']:.3g} requests/s,"
                  f" {d['output_throughput']:,.1f} output tok/s; completed {d['completed']:,}")
    kv = d.get("peak_kv_usage")
    console.print(f"queue: up to {d['max_waiting']} waiting, {d['mean_running']:.1f} running on"
                  f" average; KV pool peak {'—' if kv is None else f'{kv:.0%}'}; preemptions"
                  f" {d['preemptions']}")
    split = d.get("disaggregation")
    if split:
        console.print(f"disaggregated: {split['prefill_instances']} prefill and"
                      f" {split['decode_instances']} decode instances ({split['devices']}"
                      f" devices), KV cache over {split['link_gb_s']:g} GB/s: first token to"
                      f" decode instance p50 {_s(d.get('kv_transfer_p50_s'))}, p99"
                      f" {_s(d.get('kv_transfer_p99_s'))}")
    if d.get("extrapolation"):
        console.print(f"[yellow]extrapolation:[/] {d['extrapolation']}")


def _s(x: float | None) -> str:
    return "—" if x is None else seconds(x)


def run_capacity(args: argparse.Namespace) -> int:
    slo = slo_from(args)
    cal = load_calibration(args.calibration)
    model, scheduler = server_under_test(args, cal)
    split = split_from(args, cal)
    lengths = lengths_from(args)
    prefix = shared_prefix_from(args)
    rate = max_rate(model, scheduler, lengths, slo, num_requests=args.num_requests,
                    seed=args.seed, shared_prefix=prefix, disaggregation=split)
    users = max_users(model, scheduler, lengths, slo, think_s=args.think,
                      num_requests=args.num_requests, seed=args.seed, shared_prefix=prefix,
                      disaggregation=split)
    data = capacity_json(rate, users, slo)
    data["extrapolation"] = model.extrapolation
    data["disaggregation"] = None if split is None else split.to_json()
    if args.json:
        print_json(data)
        return 0
    console.print(f"at the SLO ({_slo_words(slo)}):")
    console.print(f"  highest rate: [bold]{rate.rate_rps:.3g} requests/s[/] (open loop;"
                  f" {rate.binding or 'nothing'} binds above it)")
    console.print(f"  most users:   [bold]{users.users}[/] (closed loop, think"
                  f" {args.think:g} s; {users.binding or 'nothing'} binds above it)")
    if rate.saturation_rps is not None:
        console.print(f"  the server saturates near {rate.saturation_rps:.3g} requests/s")
    if split is not None:
        console.print(f"  disaggregated {split.label}: {split.devices} devices, KV cache over"
                      f" {split.link_gb_s:g} GB/s")
    if model.extrapolation:
        console.print(f"[yellow]extrapolation:[/] {model.extrapolation}")
    return 0


def capacity_json(rate: CapacityPoint, users: CapacityPoint, slo: SLO) -> dict[str, Any]:
    return {
        "slo": slo.to_json(),
        "max_rate_rps": rate.rate_rps, "max_users": users.users,
        "binding": rate.binding, "binding_users": users.binding,
        "saturation_rps": rate.saturation_rps,
        "at_max_rate": rate.summary, "at_max_users": users.summary,
    }


def _slo_words(slo: SLO) -> str:
    return ", ".join(f"{slo.describe(m)} ≤ {seconds(v)}" for m, v in slo.limits().items())


def run_whatif(args: argparse.Namespace) -> int:
    slo = slo_from(args)
    cal = load_calibration(args.calibration)
    model, scheduler = server_under_test(args, cal)
    devices = [d for d in args.devices.split(",") if d.strip()]
    for d in devices:
        find_device(d)  # an unknown device is bad input, before any simulation
    lengths = lengths_from(args)
    link = DEFAULT_LINK_GB_S if args.kv_link_gb_s is None else args.kv_link_gb_s
    changes, notes = standard_changes(model, scheduler, cal.server.hardware, devices,
                                      link_gb_s=link,
                                      kv_bytes_per_token=kv_bytes_from(args, cal))
    rows = what_if(changes, lengths, slo, think_s=args.think, num_requests=args.num_requests,
                   seed=args.seed, shared_prefix=shared_prefix_from(args))
    if args.json:
        print_json({"slo": {f"{m}_s": v for m, v in slo.limits().items()},
                    "rows": [r.to_json() for r in rows], "notes": notes})
        return 0
    base_users = rows[0].users
    table = Table(title=f"What each change would do at the SLO ({_slo_words(slo)})",
                  title_justify="left")
    table.add_column("change")
    table.add_column("users at the SLO", justify="right")
    table.add_column(f"TTFT p99 at {base_users or 1} users", justify="right")
    table.add_column(f"ITL p99 at {base_users or 1} users", justify="right")
    for row in rows:
        users = "none" if row.users is None else str(row.users)
        label = row.change.label + (" [yellow]*[/]" if row.change.extrapolation else "")
        table.add_row(label, users, _s(row.ttft_p99_s), _s(row.itl_p99_s))
    console.print(table)
    if any(r.change.extrapolation for r in rows):
        console.print("[yellow]*[/] extrapolated by the roofline's ratios from the calibrated"
                      " device: a bound, not a measurement-backed prediction")
    for n in notes:
        console.print(f"[dim]note: {in_flags(n)}[/dim]")
    return 0
