"""The Grafana dashboard: valid JSON whose every query names a metric of the family's map."""

from __future__ import annotations

import json
import re

import pytest

from pdscope.cli import main
from pdscope.metrics import LLAMACPP, METRIC_MAPS, ROLES, SGLANG, VLLM, MetricMap, grafana_dashboard

# What a PromQL expression may name besides metrics: its functions, aggregations and labels.
PROMQL = {"histogram_quantile", "sum", "by", "le", "rate", "increase", "max", "avg"}


def exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def map_names(family: MetricMap) -> set[str]:
    return {name for role in ROLES for name in family.names(role)}


def series_name(name: str, family: MetricMap) -> str:
    """The map's name a series belongs to: a histogram's ``_bucket`` series is its own."""
    for role, kind in ROLES.items():
        for candidate in family.names(role):
            if name == candidate or (kind == "histogram" and name == candidate + "_bucket"):
                return candidate
    return name


@pytest.mark.parametrize("family", METRIC_MAPS, ids=[f.name for f in METRIC_MAPS])
def test_every_query_names_a_metric_of_the_family_map(family: MetricMap) -> None:
    dashboard = json.loads(json.dumps(grafana_dashboard(family), allow_nan=False))
    names = map_names(family)
    for expr in exprs(dashboard):
        words = re.findall(r"[A-Za-z_][A-Za-z0-9_:]*", re.sub(r"\[\d+[smh]\]", "", expr))
        used = [word for word in words if word not in PROMQL]
        assert used, expr
        for name in used:
            assert series_name(name, family) in names, (name, expr)


def test_the_vllm_dashboard_has_a_panel_for_each_of_the_five_names() -> None:
    dashboard = grafana_dashboard(VLLM)
    assert dashboard["schemaVersion"] == 39
    assert dashboard["templating"]["list"][0]["name"] == "DS_PROMETHEUS"
    assert dashboard["templating"]["list"][0]["query"] == "prometheus"
    panels = {p["title"]: p for p in dashboard["panels"]}
    ttft = [t["expr"] for t in panels["Time to first token (TTFT)"]["targets"]]
    assert ttft == [
        "histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))",
        "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))",
    ]
    itl = [t["expr"] for t in panels["Inter-token latency (ITL)"]["targets"]]
    assert itl[0] == (
        "histogram_quantile(0.5, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket[1m])))"
    )
    assert panels["Requests running"]["targets"][0]["expr"] == "sum(vllm:num_requests_running)"
    assert panels["Requests waiting"]["targets"][0]["expr"] == "sum(vllm:num_requests_waiting)"
    kv = panels["KV-cache usage"]
    assert kv["targets"][0]["expr"] == "max(vllm:kv_cache_usage_perc)"
    assert kv["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert kv["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.9
    assert panels["Prefix-cache hit rate"]["targets"][0]["expr"] == (
        "sum(rate(vllm:prefix_cache_hits_total[1m])) / "
        "sum(rate(vllm:prefix_cache_queries_total[1m]))"
    )
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"
    # Panels are numbered and do not overlap on Grafana's 24-column grid.
    assert [p["id"] for p in dashboard["panels"]] == list(range(1, len(panels) + 1))
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        xs, ys = range(g["x"], g["x"] + g["w"]), range(g["y"], g["y"] + g["h"])
        area = {(x, y) for x in xs for y in ys}
        assert not cells & area
        cells |= area


def test_the_five_roles_each_have_a_panel_in_every_family_that_exports_them() -> None:
    for family in (VLLM, SGLANG):
        joined = "\n".join(exprs(grafana_dashboard(family)))
        for role in ("ttft", "itl", "running", "waiting", "kv_usage"):
            assert family.names(role)[0] in joined, (family.name, role)


def test_a_role_not_exported_is_a_text_panel_with_the_reason() -> None:
    panels = {p["title"]: p for p in grafana_dashboard(LLAMACPP)["panels"]}
    ttft = panels["Time to first token (TTFT)"]
    assert ttft["type"] == "text" and "targets" not in ttft
    assert "no latency histograms" in ttft["options"]["content"]
    assert panels["Requests waiting"]["targets"][0]["expr"] == "sum(llamacpp:requests_deferred)"


def test_the_cli_prints_the_dashboard(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--grafana-dashboard", "--family", "sglang"]) == 0
    dashboard = json.loads(capsys.readouterr().out)
    assert dashboard["uid"] == "pdscope-sglang"
    assert "sum(sglang:num_queue_reqs)" in exprs(dashboard)
    assert main(["watch", "--grafana-dashboard"]) == 0
    assert json.loads(capsys.readouterr().out)["uid"] == "pdscope-vllm"
