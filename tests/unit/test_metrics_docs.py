"""docs/metrics.md names every metric of every family map, so the two cannot drift apart."""

from __future__ import annotations

from pathlib import Path

from pdscope.metrics import FULL_POOL_KV_USAGE, METRIC_MAPS, ROLES

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_the_metric_table_has_every_name_of_every_family() -> None:
    text = DOC.read_text()
    for family in METRIC_MAPS:
        for role in ROLES:
            for name in family.names(role):
                assert f"`{name}`" in text, (family.name, role, name)
        assert family.display in text


def test_the_table_has_a_row_for_every_role() -> None:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    roles = [row.split("`")[1] for row in rows]
    assert roles[: len(ROLES)] == list(ROLES)


def test_the_documented_threshold_is_the_rule_s() -> None:
    assert f"KV-cache usage ≥ {FULL_POOL_KV_USAGE} (`FULL_POOL_KV_USAGE`)" in DOC.read_text()
