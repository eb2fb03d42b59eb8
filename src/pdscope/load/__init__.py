"""Load: open- and closed-loop scheduling, sweeps, statistics and result files."""

from pdscope.load.bench import BenchConfig, BenchResult, Workload, run_bench
from pdscope.load.results import BenchRun, read_run
from pdscope.load.runner import Finished, Stage, StageRun, run_stage
from pdscope.load.schedule import arrival_offsets
from pdscope.load.summary import summarize_stage
from pdscope.slo import SLO, parse_slo

__all__ = [
    "SLO",
    "BenchConfig",
    "BenchResult",
    "BenchRun",
    "Finished",
    "Stage",
    "StageRun",
    "Workload",
    "arrival_offsets",
    "parse_slo",
    "read_run",
    "run_bench",
    "run_stage",
    "summarize_stage",
]
