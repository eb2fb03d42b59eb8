"""Library errors speak the library's words; only the CLI knows its flags.

A config checks itself and names its fields (``prompt_tokens must be at least 1``); the CLI
calls each field the error names by the flag a person typed (``--prompt-tokens``), through one
table, reading no message back. The pure planner checks its inputs without loading the
network stack or the load workers.
"""

from __future__ import annotations

import ast
import json
import pickle
import re
from pathlib import Path

import pytest

from pdscope.cli.common import FLAGS, flag_of, flagged, in_flags, make_config
from pdscope.errors import Field, InputError, Note, RunError
from pdscope.experiments import InterferenceConfig, ProbeConfig

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "pdscope"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")

# Another program's flags, named where a library error tells how to set that program up.
OTHER_PROGRAMS = {
    "the engine flag --port": "a lab engine's own flag, among the engine flags given",
    "SGLang needs --enable-metrics": "SGLang's flag (python -m sglang.launch_server --help)",
    "llama.cpp --metrics": "llama-server's flag (tools/server/README.md)",
    "pip install --no-deps": "pip's flag",
}


def flags_in_raises(path: Path) -> list[tuple[int, str]]:
    """(line, flag) for every ``--flag`` in the text of a ``raise`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        for sub in ast.walk(node.exc):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                text = sub.value
                for phrase in OTHER_PROGRAMS:
                    text = text.replace(phrase, "")
                found += [(node.lineno, flag) for flag in FLAG.findall(text)]
    return found


def test_no_library_error_names_a_flag() -> None:
    offenders = [f"{path.relative_to(PACKAGE)}:{line}: {flag}"
                 for path in sorted(PACKAGE.rglob("*.py"))
                 if path.relative_to(PACKAGE).parts[0] != "cli"
                 for line, flag in flags_in_raises(path)]
    assert not offenders, "library errors name CLI flags:\n" + "\n".join(offenders)


# Where pdscope's own flags may be written: the CLI, and the modules that speak for another
# program (a server family names its engine's flags; the lab starts engines with theirs).
FLAG_SPEAKERS = ("cli", "servers", "lab")


def pdscope_flags() -> set[str]:
    """Every option string of pdscope's commands, as its parser defines them."""
    import argparse

    from pdscope.cli import build_parser

    out: set[str] = set()
    todo = [build_parser()]
    while todo:
        parser = todo.pop()
        for action in parser._actions:
            out |= {o for o in action.option_strings if o.startswith("--")}
            if isinstance(action, argparse._SubParsersAction):
                todo += list(action.choices.values())
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of ``tree``: words for the code's readers (which flag a
    field backs), never printed."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def pdscope_flags_in_strings(path: Path, flags: set[str]) -> list[tuple[int, str]]:
    """(line, flag) for every one of ``flags`` in a string literal of ``path`` (an f-string's
    text included; docstrings and another program's flags, :data:`OTHER_PROGRAMS`, aside)."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        if id(node) in docs:
            continue
        text = node.value
        for phrase in OTHER_PROGRAMS:
            text = text.replace(phrase, "")
        found += [(node.lineno, f) for f in FLAG.findall(text) if f in flags]
    return found


def test_no_library_string_names_a_pdscope_flag() -> None:
    """A note, hint, verdict or message outside the CLI names a field (``errors.Field`` in an
    ``errors.Note``), never the flag: the CLI calls the field by its flag when it prints."""
    flags = pdscope_flags()
    assert {"--device", "--model-config", "--api-key", "--quick", "--out"} <= flags
    offenders = [f"{path.relative_to(PACKAGE)}:{line}: {flag}"
                 for path in sorted(PACKAGE.rglob("*.py"))
                 if path.relative_to(PACKAGE).parts[0] not in FLAG_SPEAKERS
                 for line, flag in pdscope_flags_in_strings(path, flags)]
    assert not offenders, "library strings name pdscope's flags:\n" + "\n".join(offenders)


def test_the_string_scan_catches_a_flag_in_a_note_and_spares_other_programs(
        tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('"""The module: --device is documented here."""\n'
                       'NOTES = ["no ceiling (give --device)"]\n'
                       'def f(n):\n    """--runs in a docstring."""\n'
                       '    return f"{n} tokens: raise --prefix-tokens, vLLM:'
                       ' --enable-prefix-caching"\n'
                       'HINT = "llama.cpp --metrics"\n')
    flags = {"--device", "--runs", "--prefix-tokens", "--metrics"}
    assert pdscope_flags_in_strings(planted, flags) == [(2, "--device"), (5, "--prefix-tokens")]


def test_a_note_names_its_fields_in_library_words_and_the_cli_by_flags() -> None:
    inner = Note("give ", Field("model_config"))
    note = Note("no ceiling: ", inner, "; or ", Field("duration_s"))
    assert note == "no ceiling: give model_config; or duration_s"
    assert note.fields == ("model_config", "duration_s")
    assert in_flags(note) == "no ceiling: give --model-config; or --duration"
    assert in_flags("plain text") == "plain text"
    assert pickle.loads(pickle.dumps(note)).fields == note.fields
    # An error that wraps another keeps the fields of both, and of a note among its parts.
    error = RunError("calibration: ", InputError(Field("runs"), " must be at least 1"), " (",
                     note, ")")
    assert in_flags(error) == ("calibration: --runs must be at least 1 (no ceiling: give"
                               " --model-config; or --duration)")
    # JSON output calls the fields by their flags too, wherever a note sits in the data.
    assert flagged({"notes": [note], "n": 1, "rows": ({"why": inner},)}) == {
        "notes": ["no ceiling: give --model-config; or --duration"], "n": 1,
        "rows": [{"why": "give --model-config"}]}


def test_the_auth_hint_names_the_key_field() -> None:
    from pdscope.client.faults import HINTS, raise_for_record
    from pdscope.client.record import RequestRecord

    assert HINTS["auth"] == "give the server's key with api_key or OPENAI_API_KEY"
    record = RequestRecord(request_id="r0", api="openai", model="m", t_send_ns=0,
                           t_first_token_ns=None, t_last_token_ns=None,
                           error="HTTP 401: unauthorized", error_kind="auth")
    with pytest.raises(RunError) as info:
        raise_for_record(record)
    assert str(info.value) == ("HTTP 401: unauthorized (give the server's key with api_key or"
                               " OPENAI_API_KEY)")
    assert in_flags(info.value) == ("HTTP 401: unauthorized (give the server's key with"
                                    " --api-key or OPENAI_API_KEY)")


def test_the_scan_catches_a_flag_in_a_raise(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('def f(n):\n    if n < 1:\n        raise ValueError(f"--runs must be'
                       ' at least 1, got {n}")\n    raise ValueError("the engine flag --port 9")\n')
    assert flags_in_raises(planted) == [(3, "--runs")]


def test_a_config_error_names_its_fields_in_library_words() -> None:
    with pytest.raises(InputError, match=r"^max_tokens must be at least 2, got 1$") as info:
        ProbeConfig(max_tokens=1)
    assert info.value.fields == ("max_tokens",)
    with pytest.raises(InputError, match=r"stream_tokens must leave .* at least twice"
                                         r" settle_tokens"):
        InterferenceConfig(stream_tokens=20, settle_tokens=16)


def test_the_cli_names_every_field_of_an_error_by_its_flag() -> None:
    with pytest.raises(InputError, match=r"^--max-tokens must be at least 2, got 1$"):
        make_config(ProbeConfig, max_tokens=1)
    with pytest.raises(InputError, match=r"^--stream-tokens must .* at least twice"
                                         r" --settle-tokens"):
        make_config(InterferenceConfig, stream_tokens=20, settle_tokens=16)
    assert flag_of("duration_s") == "--duration" == FLAGS["duration_s"]
    assert flag_of("slo", {"slo": "--goodput"}) == "--goodput"
    # Words that happen to be a field's name are not rewritten: only the fields marked.
    error = InputError("the model name is empty; ", Field("model"), " is required")
    assert error.naming(flag_of) == "the model name is empty; --model is required"


def test_an_error_with_fields_survives_a_process_boundary() -> None:
    error = pickle.loads(pickle.dumps(InputError(Field("runs"), " must be at least 1")))
    assert str(error) == "runs must be at least 1"


# The planner's pure modules: the step-time model, the scheduler and its engines, the demand,
# the simulator and the capacity search.
PURE_PLANNER = ("scheduler", "engine", "simulate", "demand", "stepmodel", "capacity", "kvpool",
                "ledger", "disaggregation")
NETWORK_OR_LOAD = ("pdscope.client", "pdscope.load", "pdscope.metrics", "pdscope.experiments")


def _module_level_imports(path: Path) -> set[str]:
    """The pdscope modules ``path`` imports when it is imported (not inside a function)."""
    out: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, (ast.If, ast.Try)):
            nodes += node.body + node.orelse
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                "pdscope"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("pdscope")}
    return out


def _path(module: str) -> Path | None:
    base = PACKAGE.parent / Path(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def test_the_pure_planner_loads_no_network_stack_nor_load_workers() -> None:
    seen: set[str] = set()
    todo = [f"pdscope.plan.{m}" for m in PURE_PLANNER]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _path(module)
        # The package's __init__ imports calibration only when asked for (its __getattr__).
        if path is not None:
            todo += sorted(_module_level_imports(path))
    loaded = sorted(m for m in seen if m.startswith(NETWORK_OR_LOAD))
    assert not loaded, f"the pure planner imports {loaded}"


def test_importing_the_pure_planner_loads_neither_aiohttp_nor_the_load_package() -> None:
    import subprocess
    import sys

    modules = ", ".join(f"pdscope.plan.{m}" for m in PURE_PLANNER)
    code = (f"import sys, {modules}; "
            "print(sorted(m for m in sys.modules if m == 'aiohttp'"
            " or m.startswith(('pdscope.load', 'pdscope.client'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
    # ...and calibration is there when asked for.
    from pdscope.plan import load_calibration

    assert callable(load_calibration)


def test_the_doctors_folder_speaks_library_words_unless_given_the_flags(tmp_path: Path) -> None:
    from pdscope.doctor.evidence import Evidence, ServerEvidence
    from pdscope.doctor.report import write_run
    from pdscope.doctor.rules import Finding
    from pdscope.doctor.run import DoctorRun

    advice = (Note("give ", Field("slo")),)
    run = DoctorRun(Evidence(ServerEvidence("vllm")),
                    [Finding("x", "fired", "info", "t", "r", advice=advice)],
                    [], skipped={"context": Note("left out of ", Field("quick"))})
    for naming, words in ((None, ("give slo", "left out of quick")),
                          (flag_of, ("give --slo", "left out of --quick"))):
        folder = tmp_path / ("flags" if naming else "library")
        paths = write_run(run, folder, naming) if naming else write_run(run, folder)
        findings = json.loads(paths["findings"].read_text())
        evidence = json.loads(paths["evidence"].read_text())
        assert (findings[0]["advice"][0], evidence["skipped"]["context"]) == words
        assert all(w in paths["report"].read_text() for w in words)
