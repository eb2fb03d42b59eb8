"""The planner: how many users a server holds at an SLO, and what a change would do.

A step-time model fitted to the user's own server (:mod:`~pdscope.plan.calibrate`) drives a
simulator of its scheduler (:mod:`~pdscope.plan.simulate`) under a demand
(:mod:`~pdscope.plan.demand`): one server, replicas, or prefill and decode instances
(:mod:`~pdscope.plan.disaggregation`). :mod:`~pdscope.plan.capacity` searches the load that
still meets the SLO, and :mod:`~pdscope.plan.whatif` sets one change at a time beside the
server as it is::

    from pdscope.plan import SLO, FixedLengths, load_calibration, max_rate, open_loop, simulate

    cal = load_calibration("cal/")
    result = simulate(open_loop(2000, 1.5, FixedLengths(512, 128)), cal.step_model,
                      cal.scheduler)
    print(result.summary()["ttft_p99_s"])
    print(max_rate(cal.step_model, cal.scheduler, FixedLengths(512, 128),
                   SLO(ttft_s=1.0, itl_s=0.1)).rate_rps)
    # prefill and decode apart, the KV cache over a 25 GB/s link:
    split = Disaggregation(1, 3, link_gb_s=25,
                           kv_bytes_per_token=cal.server.hardware.kv_bytes_per_token)
    simulate(open_loop(2000, 1.5, FixedLengths(512, 128)), cal.step_model, cal.scheduler,
             disaggregation=split)
    # a calibration from bench run folders instead of a live server:
    cal = calibrate_from_runs(["runs/bench-c1", "runs/bench-c8"])
"""

from typing import TYPE_CHECKING, Any

from pdscope.plan.capacity import CapacityPoint, SloUnreachable, max_rate, max_users
from pdscope.plan.conversations import Conversations, TurnFigures, per_turn
from pdscope.plan.demand import (
    Demand,
    DrawnLengths,
    FixedLengths,
    LogNormalLengths,
    SampledLengths,
    SharedPrefix,
    closed_loop,
    open_loop,
    replay,
)
from pdscope.plan.disaggregation import Disaggregation
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.simulate import SimResult, simulate
from pdscope.plan.stepmodel import (
    HardwareFigures,
    StepModel,
    StepObservation,
    fit_step_model,
    roofline_prior,
)
from pdscope.slo import SLO

if TYPE_CHECKING:
    from pdscope.plan.calibrate import (
        CalibratedServer,
        Calibration,
        CalibrationConfig,
        load_calibration,
        run_calibration,
    )
    from pdscope.plan.fromruns import calibrate_from_runs

# Calibration talks to servers (the client, aiohttp) and reads run folders (load): imported
# when first asked for, so that the pure planner (simulate, capacity, what-if) loads neither.
_LAZY = {
    "CalibratedServer": "pdscope.plan.calibrate",
    "Calibration": "pdscope.plan.calibrate",
    "CalibrationConfig": "pdscope.plan.calibrate",
    "load_calibration": "pdscope.plan.calibrate",
    "run_calibration": "pdscope.plan.calibrate",
    "calibrate_from_runs": "pdscope.plan.fromruns",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "SLO",
    "CalibratedServer",
    "Calibration",
    "CalibrationConfig",
    "CapacityPoint",
    "Conversations",
    "Demand",
    "Disaggregation",
    "DrawnLengths",
    "FixedLengths",
    "HardwareFigures",
    "LogNormalLengths",
    "SampledLengths",
    "SchedulerConfig",
    "SharedPrefix",
    "SimResult",
    "SloUnreachable",
    "StepModel",
    "StepObservation",
    "TurnFigures",
    "calibrate_from_runs",
    "closed_loop",
    "fit_step_model",
    "load_calibration",
    "max_rate",
    "max_users",
    "open_loop",
    "per_turn",
    "replay",
    "roofline_prior",
    "run_calibration",
    "simulate",
]
