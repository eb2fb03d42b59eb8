"""Load: open- and closed-loop scheduling, sweeps, statistics and result files."""

from pdscope.load.bench import BenchConfig, BenchResult, Workload, run_bench
from pdscope.load.results import BenchRun, RunMeta, read_requests, read_run
from pdscope.load.runner import Finished, RunRequest, Stage, StageRun, run_stage
from pdscope.load.summary import (
    Distribution,
    Goodput,
    StageSummary,
    read_summaries,
    summarize_stage,
)
from pdscope.slo import SLO, parse_slo
from pdscope.workload.schedule import arrival_offsets

__all__ = [
    "SLO",
    "BenchConfig",
    "BenchResult",
    "BenchRun",
    "Distribution",
    "Finished",
    "Goodput",
    "RunMeta",
    "RunRequest",
    "Stage",
    "StageRun",
    "StageSummary",
    "Workload",
    "arrival_offsets",
    "parse_slo",
    "read_requests",
    "read_run",
    "read_summaries",
    "run_bench",
    "run_stage",
    "summarize_stage",
]
