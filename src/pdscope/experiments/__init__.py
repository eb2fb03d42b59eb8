"""The article's experiments, each a library function with a command of its own.

Each ``run_*`` is a coroutine that takes the server's URL and a frozen config and returns a
frozen result whose ``to_json()`` carries its numbers, its checks and its charts' x/y data::

    import asyncio
    from pdscope.experiments import SweepConfig, run_sweep

    result = asyncio.run(run_sweep("http://127.0.0.1:8000", SweepConfig(runs=3)))
    print(result.fit.b, result.doubling_at_least_doubles_prefill)

``find_ceiling_inputs`` finds the model geometry and device a result is set beside (pass the
:class:`CeilingInputs` as ``ceiling=``, or ``dataclasses.replace`` it in afterwards).
"""

from pdscope.charts import Chart, Series, Span
from pdscope.client import ClientOptions
from pdscope.experiments.common import CeilingInputs, LinearFit, find_ceiling_inputs, polyfit
from pdscope.experiments.context import (
    ContextBin,
    ContextConfig,
    ContextResult,
    context_bins,
    run_context,
)
from pdscope.experiments.interference import (
    InterferenceComparison,
    InterferenceConfig,
    InterferenceResult,
    compare_interference,
    run_interference,
)
from pdscope.experiments.prefix import PrefixConfig, PrefixResult, detection_threshold, run_prefix
from pdscope.experiments.probe import ProbeConfig, ProbeResult, ceiling_verdict, run_probe
from pdscope.experiments.sweep import (
    DoublingCheck,
    SweepConfig,
    SweepResult,
    TtftFit,
    doubling_checks,
    fit_ttft,
    run_sweep,
)

__all__ = [
    "CeilingInputs",
    "Chart",
    "ClientOptions",
    "ContextBin",
    "ContextConfig",
    "ContextResult",
    "DoublingCheck",
    "InterferenceComparison",
    "InterferenceConfig",
    "InterferenceResult",
    "LinearFit",
    "PrefixConfig",
    "PrefixResult",
    "ProbeConfig",
    "ProbeResult",
    "Series",
    "Span",
    "SweepConfig",
    "SweepResult",
    "TtftFit",
    "ceiling_verdict",
    "compare_interference",
    "context_bins",
    "detection_threshold",
    "doubling_checks",
    "find_ceiling_inputs",
    "fit_ttft",
    "polyfit",
    "run_context",
    "run_interference",
    "run_prefix",
    "run_probe",
    "run_sweep",
]
