"""The wheel works alone: built from this tree, installed in a fresh virtual environment with
nothing but its own dependencies, and run from outside the source tree.

A module or data file the wheel leaves out, a dependency missing from ``pyproject.toml`` or an
entry point that points nowhere all pass every other test, which imports pdscope from ``src/``.
This one builds the wheel with pip (the build backend, hatchling, is fetched into pip's build
isolation), installs it with its dependencies from PyPI, and runs the commands a new user runs
first. It needs the network, or a pip cache that holds those packages: without them it fails
with pip's own words, never skips, so a release is never checked by nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import pdscope

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "pdscope"

# Building takes seconds; installing the dependencies half a minute from pip's cache, more from
# PyPI (scipy and numpy are the big ones).
BUILD_TIMEOUT_S = 180
INSTALL_TIMEOUT_S = 300

pytestmark = [pytest.mark.packaging,
              pytest.mark.timeout(BUILD_TIMEOUT_S + INSTALL_TIMEOUT_S + 120)]


def run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``args`` run as a user would run them: from ``cwd``, with no PYTHONPATH and no active
    virtual environment that could lend pdscope's sources or another install's packages."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PDSCOPE_CACHE"] = str(cwd / "pdscope-cache")  # the self-test saves its result there
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def pip(python: Path | str, args: list[str], cwd: Path, timeout: float, what: str) -> None:
    r = run([str(python), "-m", "pip", *args], cwd, timeout)
    if r.returncode != 0:
        pytest.fail(
            f"pip could not {what} (exit status {r.returncode}). This test needs PyPI, or a pip"
            f" cache holding hatchling and pdscope's dependencies; pip said:\n"
            f"{(r.stdout + r.stderr)[-3000:]}", pytrace=False)


def package_files() -> set[str]:
    """Every file of the package in the source tree, as the wheel names it: the modules and the
    data they read (``hardware/devices.csv``, through importlib.resources)."""
    return {
        "pdscope/" + p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The wheel, and a fresh virtual environment (outside the source tree) it is installed
    in: ``(wheel, venv's bin folder, a working folder)``."""
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    pip(sys.executable, ["wheel", "--no-deps", "--wheel-dir", str(dist), str(ROOT)], tmp,
        BUILD_TIMEOUT_S, "build the wheel")
    [wheel] = dist.glob("pdscope-*.whl")
    venv = tmp / "venv"
    r = run([sys.executable, "-m", "venv", str(venv)], tmp, 120)
    assert r.returncode == 0, r.stderr
    bin_dir = venv / "bin"
    pip(bin_dir / "python", ["install", str(wheel)], tmp, INSTALL_TIMEOUT_S,
        "install the wheel with its dependencies")
    work = tmp / "work"
    work.mkdir()
    return wheel, bin_dir, work


def test_the_wheel_holds_every_module_and_data_file_the_license_and_the_command(
        installed: tuple[Path, Path, Path]) -> None:
    wheel, _, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"pdscope-{pdscope.__version__}.dist-info"
        entry_points = z.read(f"{info}/entry_points.txt").decode()
        meta = z.read(f"{info}/METADATA").decode()
    assert "pdscope/hardware/devices.csv" in names
    missing = package_files() - names
    assert not missing, f"the wheel lacks {sorted(missing)}"
    assert f"{info}/licenses/LICENSE" in names
    assert "License-Expression: MIT" in meta.splitlines()
    assert "pdscope = pdscope.cli:main" in entry_points


def test_the_installed_package_is_the_wheel_s_not_the_source_tree_s(
        installed: tuple[Path, Path, Path]) -> None:
    _, bin_dir, work = installed
    r = run([str(bin_dir / "python"), "-c", "import pdscope; print(pdscope.__file__)"], work, 60)
    assert r.returncode == 0, r.stderr
    where = Path(r.stdout.strip())
    assert where.is_relative_to(bin_dir.parent) and not where.is_relative_to(ROOT), where


def test_help_and_version_run_from_the_installed_command(
        installed: tuple[Path, Path, Path]) -> None:
    _, bin_dir, work = installed
    r = run([str(bin_dir / "pdscope"), "--help"], work, 60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: pdscope")
    r = run([str(bin_dir / "pdscope"), "--version"], work, 60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"pdscope {pdscope.__version__}\n"


def test_the_installed_ceiling_reads_the_device_table_an_8b_model_on_an_h100_is_209_tok_s(
        installed: tuple[Path, Path, Path]) -> None:
    _, bin_dir, work = installed
    r = run([str(bin_dir / "pdscope"), "ceiling", "--params", "8e9", "--json"], work, 60)
    assert r.returncode == 0, r.stderr
    rows = {row["device"]: row for row in json.loads(r.stdout)}
    assert rows["NVIDIA H100 SXM"]["decode_ceiling_tok_s"] == 209


def test_the_installed_selftest_runs_its_reference_server(
        installed: tuple[Path, Path, Path]) -> None:
    # selftest has no --quick: one level of one stream, ten tokens, is its shortest run.
    _, bin_dir, work = installed
    r = run([str(bin_dir / "pdscope"), "selftest", "--levels", "1", "--output-tokens", "10",
             "--json"], work, 120)
    assert r.returncode == 0, r.stderr
    [level] = json.loads(r.stdout)["levels"]
    assert level["requests"] > 0 and level["failed"] == 0
