"""The layout is the architecture: imports run one way, down the layers that
docs/architecture.md lists, and only a server family's own module knows its name.

The layers are read from the document itself, so the document and the code cannot drift apart:
a module added to no layer, an import that goes up a layer, an import between two packages of
one layer that :data:`SAME_LAYER_ALLOWED` does not name, a cycle between two files or two
subpackages, or a comparison with a family's name outside ``servers/`` fails here. The family
names are those of :data:`pdscope.servers.FAMILIES`. The checker is shown to catch each of
those on a small package planted in a temporary folder.
"""

from __future__ import annotations

import ast
import importlib
import re
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdscope.servers import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "pdscope"
DOC = ROOT / "docs" / "architecture.md"

# Where a family's name may be written in a comparison: its own modules, and the lab, which
# names the engines it starts.
NAMES_ALLOWED_IN = ("servers", "lab")

# The imports between two packages of the same layer, (importer, imported), each with its reason.
# Any other is a violation: one layer's packages are peers, and a peer that needs another is
# either in the wrong layer or a sign that what it takes belongs lower down.
SAME_LAYER_ALLOWED: Mapping[tuple[str, str], str] = {
    ("__main__", "cli"): "`python -m pdscope` is the pdscope command: it only calls cli.main",
    ("checks", "errors"): "a config's checks raise the InputError naming the Field at fault",
    ("plan", "experiments"): "calibration reads the server's settings and ceiling inputs as the"
                             " experiments do (experiments/setup.py, find_ceiling_inputs)",
}


@dataclass(frozen=True)
class Violation:
    rule: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.where}: {self.detail}"


# --------------------------------------------------------------------------- reading the doc


def read_layers(doc: Path) -> list[tuple[str, ...]]:
    """The layers, bottom first, from the table under "## Layers" in the document: rows
    ``| N | `a`, `b` | ... |``."""
    text = doc.read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers: dict[int, tuple[str, ...]] = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if m:
            layers[int(m.group(1))] = tuple(re.findall(r"`([\w.]+)`", m.group(2)))
    assert layers, f"no layer table in {doc}"
    return [layers[i] for i in sorted(layers)]


# --------------------------------------------------------------------------- reading the code


def _modules(package_dir: Path, name: str) -> dict[str, Path]:
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [name, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` alone: not ``not TYPE_CHECKING``, whose
    body runs, nor ``TYPE_CHECKING and x``."""
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Lines inside the body of ``if TYPE_CHECKING:`` blocks: imports for annotations only.
    The ``else:`` of such a block runs, and so does the body of ``if not TYPE_CHECKING:``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def import_graph(package_dir: Path, name: str) -> dict[str, set[str]]:
    """Module → the modules of the package it imports at run time. ``from pkg import x``
    points at the submodule ``pkg.x`` when there is one, else at ``pkg`` itself (its
    ``__init__``), so a module that takes names from its own package's ``__init__`` — which
    imports that module back — shows as the cycle it is."""
    modules = _modules(package_dir, name)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_lines(tree)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target == name or target.startswith(name + "."):
                    for alias in node.names:
                        sub = f"{target}.{alias.name}"
                        targets.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names
                               if a.name == name or a.name.startswith(name + "."))
        graph[module] = {t for t in targets if t in modules and t != module}
    return graph


def unit_of(module: str, name: str) -> str:
    """The layer unit of a module: its subpackage or top-level module (``pdscope.client.detect``
    → ``client``; the package's own ``__init__`` → ``pdscope``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else name


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for elt in node.elts for s in _strings(elt)]
    return []


def family_name_uses(path: Path, family_names: set[str]) -> list[tuple[int, str]]:
    """Where a module decides by a family's name: a comparison of something that reads as a
    server's kind or family with a family's name, or a dict keyed by two or more of them."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = [s for op in operands for s in _strings(op) if s in family_names]
            subject = " ".join(ast.unparse(op) for op in operands if not _strings(op))
            if named and re.search(r"kind|family|server", subject):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            if sum(k in family_names for k in keys) >= 2:
                found.append((node.lineno, "a dict keyed by family names"))
    return found


def check(package_dir: Path, name: str, layers: list[tuple[str, ...]],
          family_names: set[str], allowed: tuple[str, ...] = NAMES_ALLOWED_IN,
          same_layer: Mapping[tuple[str, str], str] = SAME_LAYER_ALLOWED,
          ) -> list[Violation]:
    """Every violation of the layering in ``package_dir`` (the package ``name``).
    ``same_layer`` names the (importer, imported) pairs of one layer's packages that may
    import each other."""
    graph = import_graph(package_dir, name)
    level = {unit: i for i, units in enumerate(layers) for unit in units}
    out: list[Violation] = []
    for module in sorted(graph):
        unit = unit_of(module, name)
        if unit not in level:
            out.append(Violation("unlisted", module, f"{unit!r} is in no layer"))
            continue
        for target in sorted(graph[module]):
            other = unit_of(target, name)
            if other in level and level[other] > level[unit]:
                out.append(Violation("upward import", module,
                                     f"imports {target} (layer {level[other]} > {level[unit]})"))
            elif (other != unit and level.get(other) == level[unit]
                  and (unit, other) not in same_layer):
                out.append(Violation("same-layer import", module,
                                     f"imports {target} (both layer {level[unit]}); list the"
                                     f" pair in SAME_LAYER_ALLOWED with the reason, or move it"))
    for component in cycles(graph):
        out.append(Violation("file cycle", component[0], " ↔ ".join(component)))
    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        units.setdefault(unit_of(module, name), set()).update(
            unit_of(t, name) for t in targets if unit_of(t, name) != unit_of(module, name))
    for component in cycles(units):
        out.append(Violation("package cycle", component[0], " ↔ ".join(component)))
    for module, path in _modules(package_dir, name).items():
        if unit_of(module, name) in allowed:
            continue
        for line, text in family_name_uses(path, family_names):
            out.append(Violation("family name", f"{module}:{line}", text))
    return out


# ------------------------------------------------------------------------------- the tests

FAMILY_NAMES = {f.name for f in FAMILIES}


def test_pdscope_s_imports_run_down_the_documented_layers() -> None:
    violations = check(PACKAGE, "pdscope", read_layers(DOC), FAMILY_NAMES)
    assert not violations, "\n".join(map(str, violations))


def test_each_same_layer_allowance_is_between_peers_and_still_used() -> None:
    graph = import_graph(PACKAGE, "pdscope")
    used = {(unit_of(m, "pdscope"), unit_of(t, "pdscope")) for m, ts in graph.items() for t in ts}
    level = {unit: i for i, units in enumerate(read_layers(DOC)) for unit in units}
    for (importer, imported), reason in SAME_LAYER_ALLOWED.items():
        assert level[importer] == level[imported], f"{importer}, {imported}: not one layer"
        assert (importer, imported) in used, f"{importer} no longer imports {imported}: drop it"
        assert reason


def test_every_layer_in_the_document_exists() -> None:
    units = {unit_of(m, "pdscope") for m in _modules(PACKAGE, "pdscope")}
    listed = {u for layer in read_layers(DOC) for u in layer}
    assert listed <= units, f"the document lists what the package lacks: {listed - units}"


# The modules of servers/ that every family shares; a family is defined in none of them.
SHARED_SERVERS_MODULES = ("pdscope.servers", "pdscope.servers.family", "pdscope.servers.advice",
                          "pdscope.servers.metric_map")


def test_each_family_is_defined_in_a_module_of_its_own() -> None:
    modules = [importlib.import_module(m) for m in _modules(PACKAGE / "servers", "pdscope.servers")
               if m not in SHARED_SERVERS_MODULES]
    for f in FAMILIES:
        homes = [m.__name__ for m in modules if any(v is f for v in vars(m).values())]
        # A family's home holds it under a name of its own (``openai.KNOWN``, a tuple of
        # other modules' families, does not count).
        assert len(homes) == 1, f"{f.name} is defined in {homes or 'no module of servers/'}"


# Two real family names, for the planted package to compare with.
FIRST, SECOND = (f.name for f in FAMILIES[:2])


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A package of three layers (``base`` < ``mid``, ``side`` < ``top``) that breaks every
    rule."""
    pkg = tmp_path / "toy"
    files = {
        "__init__.py": "",
        "base.py": "",
        "mid/__init__.py": "from toy.mid.a import A\n",
        "mid/a.py": "from toy.mid import B\nfrom toy import top\nA = 1\n",  # cycle, upward
        "mid/b.py": "B = 2\n",
        "side.py": "from toy.mid.b import B\n",  # a peer of the same layer
        "top.py": (
            "from toy import base, mid\n"
            "def f(info):\n"
            f"    if info.kind == {FIRST!r}:\n"  # a family's name compared
            "        return 1\n"
            f"    return {{{FIRST!r}: 1, {SECOND!r}: 2}}\n"  # a table keyed by family names
        ),
        "stray.py": "",  # in no layer
        "typed.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from toy import top\n"  # annotations only: allowed
        ),
        "untyped.py": (
            "from typing import TYPE_CHECKING\n"
            "if not TYPE_CHECKING:\n"
            "    from toy import top\n"  # runs: upward
        ),
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(textwrap.dedent(text))
    return pkg


TOY_LAYERS = [("toy", "base", "typed", "untyped"), ("mid", "side"), ("top",)]


def test_the_checker_catches_an_upward_import(planted: Path) -> None:
    found = check(planted, "toy", TOY_LAYERS, FAMILY_NAMES)
    assert [v.where for v in found if v.rule == "upward import"] == ["toy.mid.a", "toy.untyped"]


def test_the_checker_catches_an_import_between_peers_of_one_layer_not_allowed(
        planted: Path) -> None:
    found = check(planted, "toy", TOY_LAYERS, FAMILY_NAMES)
    assert [v.where for v in found if v.rule == "same-layer import"] == ["toy.side"]
    allowed = {("side", "mid"): "side reads mid's B"}
    found = check(planted, "toy", TOY_LAYERS, FAMILY_NAMES, same_layer=allowed)
    assert not [v for v in found if v.rule == "same-layer import"]


def test_the_checker_catches_a_cycle_through_a_package_s_own_init(planted: Path) -> None:
    found = check(planted, "toy", TOY_LAYERS, FAMILY_NAMES)
    cycle = [v.detail for v in found if v.rule == "file cycle"]
    assert cycle == ["toy.mid ↔ toy.mid.a ↔ toy.top"]
    assert [v.detail for v in found if v.rule == "package cycle"] == ["mid ↔ top"]


def test_the_checker_catches_a_family_name_outside_servers(planted: Path) -> None:
    found = check(planted, "toy", TOY_LAYERS, FAMILY_NAMES)
    names = [v.where for v in found if v.rule == "family name"]
    assert names == ["toy.top:3", "toy.top:5"]


def test_the_checker_catches_a_module_in_no_layer_and_ignores_only_type_checking_bodies(
        planted: Path) -> None:
    found = check(planted, "toy", TOY_LAYERS, FAMILY_NAMES)
    assert [v.where for v in found if v.rule == "unlisted"] == ["toy.stray"]
    assert not [v for v in found if v.where == "toy.typed"]
    assert [v.detail for v in found if v.where == "toy.untyped"] == [
        "imports toy.top (layer 2 > 0)"]


def test_a_clean_package_passes(planted: Path) -> None:
    for rel in ("top.py", "stray.py", "untyped.py"):
        (planted / rel).unlink()
    (planted / "mid/a.py").write_text("from toy.mid.b import B\nA = B\n")
    allowed = {("side", "mid"): "side reads mid's B"}
    assert check(planted, "toy", TOY_LAYERS[:2], FAMILY_NAMES, same_layer=allowed) == []
