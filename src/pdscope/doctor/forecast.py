"""The doctor's forecast: the planner, calibrated on this server during the run, on the doctor's
own load levels — how many users the server holds at the SLO, and with which change more.

The calibration (:func:`pdscope.plan.run_calibration`, one run of each point) takes about a
minute on the lab; the simulations a second. The load levels the doctor measured are drawn on
the predicted curve, so a reader sees at once whether the model agrees with this server.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pdscope.charts import Chart, Series
from pdscope.doctor.evidence import LoadEvidence, PlanEvidence
from pdscope.errors import InputError
from pdscope.plan import Calibration, FixedLengths, SloUnreachable, closed_loop, simulate
from pdscope.plan.capacity import max_users, request_alone_s
from pdscope.plan.whatif import Change, scheduler_changes, what_if
from pdscope.slo import SLO

# Requests simulated at each load: enough for a p99 (a few hundred), few enough for a second.
REQUESTS = 400
# Users on the predicted curve, beside the measured levels and the predicted capacity.
CURVE_USERS = (1, 2, 4, 8, 16, 32)


def forecast(cal: Calibration, slo: SLO, input_tokens: int, output_tokens: int,
             levels: Sequence[int] = ()) -> PlanEvidence:
    """The planner's answer for ``input_tokens``-in, ``output_tokens``-out users at ``slo``
    (its TTFT and ITL objectives)."""
    slo_ttft_s, slo_itl_s = slo.ttft_s, slo.itl_s
    if slo_ttft_s is None or slo_itl_s is None:
        raise InputError("a forecast needs an slo with both ttft_s and itl_s")
    lengths = FixedLengths(input_tokens, output_tokens)
    model, scheduler = cal.step_model, cal.scheduler
    users: int | None = None
    binding = floor = None
    try:
        point = max_users(model, scheduler, lengths, slo, num_requests=REQUESTS)
        users, binding = point.users, point.binding
    except SloUnreachable as exc:
        floor = str(exc)
    best, best_users = _best_change(cal, lengths, slo, users)
    stagger = request_alone_s(model, scheduler, lengths)
    wanted = sorted({*CURVE_USERS, *levels, *((users, users + 1) if users else ())})
    curve = []
    for n in wanted:
        demand = closed_loop(REQUESTS, n, lengths, stagger_s=stagger)
        result = simulate(demand, model, scheduler)
        curve.append((n, _seconds(result.percentile("ttft", 99)),
                      _seconds(result.percentile("itl", 99))))
    errors = cal.errors_by_part()
    return PlanEvidence(
        slo_ttft_s=slo_ttft_s, slo_itl_s=slo_itl_s, input_tokens=input_tokens,
        output_tokens=output_tokens, predicted_users=users, binding=binding, floor=floor,
        best_change=best, best_change_users=best_users, curve=tuple(curve),
        fit_r_squared=model.r_squared, fit_error=max(errors.values()) if errors else None,
        assumptions=cal.assumptions)


def _seconds(x: float) -> float | None:
    """A simulated percentile, ``None`` where no request gave one (``nan``)."""
    return None if math.isnan(x) else x


def _best_change(cal: Calibration, lengths: FixedLengths, slo: SLO, users: int | None
                 ) -> tuple[str | None, int | None]:
    """The scheduler change that holds the most users, when it holds more than today."""
    base = Change("as calibrated", cal.step_model, cal.scheduler)
    changes = [base] + [Change(label, cal.step_model, s)
                        for label, s in scheduler_changes(cal.scheduler)
                        if s.replicas == cal.scheduler.replicas]  # one server, as measured
    rows = what_if(changes, lengths, slo, num_requests=REQUESTS)
    better = [r for r in rows[1:] if r.users is not None and r.users > (users or 0)]
    if not better:
        return None, None
    top = max(better, key=lambda r: r.users or 0)
    return top.change.label, top.users


def forecast_chart(plan: PlanEvidence, load: LoadEvidence | None) -> Chart:
    """The predicted p99s against users, the measured load levels on them, the SLO as lines."""
    xs = tuple(float(n) for n, _, _ in plan.curve)
    series = [
        Series("predicted TTFT p99", xs, tuple(_ms(t) for _, t, _ in plan.curve)),
        Series("predicted ITL p99", xs, tuple(_ms(i) for _, _, i in plan.curve)),
        Series("TTFT objective", xs, tuple(plan.slo_ttft_s * 1000 for _ in xs)),
        Series("ITL objective", xs, tuple(plan.slo_itl_s * 1000 for _ in xs)),
    ]
    if load is not None and load.levels:
        measured = [lv for lv in load.levels if lv.concurrency]
        lx = tuple(float(lv.concurrency) for lv in measured)
        series += [Series("measured TTFT p99", lx, tuple(_ms(lv.ttft_p99_s) for lv in measured),
                          kind="points"),
                   Series("measured ITL p99", lx, tuple(_ms(lv.itl_p99_s) for lv in measured),
                          kind="points")]
    return Chart("plan-capacity", "The planner's p99s by users; points: measured",
                 "concurrent users", "p99 (ms)", tuple(series))


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000
