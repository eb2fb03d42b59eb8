"""A new kind of result is compared with no change to compare/: a toy experiment, planted
here, says what its figures are, and ``pdscope compare`` sets two of its results side by side.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pdscope import cli
from pdscope.compare import compare, parse_limits, read_one
from pdscope.figures import (
    KINDS,
    Figures,
    Metric,
    ResultKind,
    experiment_figures,
    number,
    register,
)

WARMTH = Metric("warmth_s", "warm-up time", True, "s")
GLOW = Metric("glow_p50_s", "glow p50", True, "s", "glow", 50)
TOY_METRICS = (GLOW, WARMTH)


@dataclass(frozen=True)
class ToyResult:
    """A toy experiment's result: a warm-up time and one glow a request."""

    model: str
    warmth_s: float
    glows_s: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"experiment": "toy", "model": self.model, "warmth_s": self.warmth_s,
                "glows_s": list(self.glows_s)}

    def figures(self) -> Figures:
        return toy_figures(self.to_json())


def toy_figures(d: Mapping[str, Any]) -> Figures:
    base = experiment_figures(d, TOY_METRICS, warmth_s=number(d.get("warmth_s")))
    return Figures(base.kind, base.metrics, base.identity,
                   {"glow": np.asarray(d.get("glows_s") or [], dtype=float)}, base.scalars)


@pytest.fixture
def toy() -> Iterator[None]:
    register(ResultKind("toy", TOY_METRICS, from_json=toy_figures))
    yield
    del KINDS["toy"]


def _write(path: Path, result: ToyResult) -> Path:
    path.write_text(json.dumps(result.to_json()))
    return path


def test_a_planted_experiment_is_compared_through_its_figures(toy: None, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    fast = ToyResult("m", 1.0, tuple(0.010 + rng.random(200) * 0.001))
    slow = ToyResult("m", 2.0, tuple(0.020 + rng.random(200) * 0.001))
    a, b = _write(tmp_path / "a.json", fast), _write(tmp_path / "b.json", slow)
    run = read_one(a)
    assert run.kind == "toy" and run.identity["model"] == "m"
    assert run.scalars == {"warmth_s": 1.0} and len(run.series["glow"]) == 200

    c = compare(a, b)
    assert [r.metric for r in c.rows] == ["glow_p50_s", "warmth_s"]  # its order, its names
    glow, warmth = c.rows
    assert glow.unit == "s" and glow.test == "mann-whitney" and glow.verdict == "worse"
    assert glow.delta_pct == pytest.approx(100 * (0.0205 / 0.0105 - 1), rel=0.05)
    assert warmth.a == 1.0 and warmth.b == 2.0 and warmth.delta_pct == pytest.approx(100)
    assert c.kind_a == c.kind_b == "toy"
    # Its figures can be gated on, by the names it gave them.
    assert parse_limits("warmth:+10%")[0].metric == "warmth_s"


def test_a_planted_experiment_in_the_cli(toy: None, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(2)
    a = _write(tmp_path / "a.json", ToyResult("m", 1.0, tuple(0.010 + rng.random(100) * 1e-3)))
    b = _write(tmp_path / "b.json", ToyResult("m", 1.5, tuple(0.011 + rng.random(100) * 1e-3)))
    code = cli.main(["compare", str(a), str(b), "--json"])
    out, _ = capsys.readouterr()
    assert code == 0
    rows = {r["metric"]: r for r in json.loads(out)["rows"]}
    assert set(rows) == {"glow_p50_s", "warmth_s"}
    assert rows["warmth_s"]["b"] == 1.5 and rows["glow_p50_s"]["lower_is_better"]


def test_a_live_result_gives_the_figures_of_its_file(toy: None, tmp_path: Path) -> None:
    result = ToyResult("m", 1.0, (0.1, 0.2))
    run = read_one(_write(tmp_path / "a.json", result))
    live = result.figures()
    assert dict(live.scalars) == dict(run.scalars) and live.kind == run.kind
    assert np.array_equal(live.series["glow"], run.series["glow"])


def test_the_registered_kinds_cover_every_result_pdscope_writes() -> None:
    import pdscope.compare  # noqa: F401  (registers them all)

    assert {"bench", "doctor", "probe", "sweep", "context", "prefix", "interference",
            "prediction"} <= set(KINDS)
