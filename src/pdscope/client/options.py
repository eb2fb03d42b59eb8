"""How to talk to a server: the options every measurement shares, checked when built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pdscope.client.session import Timeouts
from pdscope.client.target import APIS
from pdscope.errors import InputError


@dataclass(frozen=True)
class ClientOptions:
    """The server-facing settings of every experiment, load test and doctor run: the API
    (``auto``: the server's own), the model (``None``: the first it lists), the key, whether to
    ask for a fixed output length, the prompt seed (``None``: new prompts each run) and the
    timeouts. Every config of pdscope embeds these by inheritance. ``api_key`` is never printed,
    written to JSON, or shown in ``repr``."""

    api: str = "auto"
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    fixed_output: bool = True
    seed: int | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)

    def __post_init__(self) -> None:
        if self.api not in ("auto", *APIS):
            raise InputError(f"unknown API {self.api!r}: use auto, {', '.join(APIS)}")
        if self.model is not None and not self.model.strip():
            raise InputError("the model name is empty: leave it out to use the first served")

    @property
    def client(self) -> ClientOptions:
        """Just the client options of a config that embeds them."""
        return ClientOptions(self.api, self.model, self.api_key, self.fixed_output, self.seed,
                             self.timeouts)

    def client_fields(self) -> dict[str, Any]:
        """The client options of a config that embeds them, as keyword arguments for another
        config (a sub-experiment's)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(ClientOptions)}

    def to_json(self) -> dict[str, Any]:
        """The config as JSON: every field but the key and the timeouts, tuples as lists."""
        out: dict[str, Any] = {"api": self.api, "model": self.model,
                               "fixed_output": self.fixed_output, "seed": self.seed}
        for f in dataclasses.fields(self):
            if f.name in ("api_key", "timeouts") or f.name in out:
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def at_least(value: float, low: float, what: str) -> None:
    """A config check in library words: ``what`` must be a finite number of at least ``low``."""
    if not (isinstance(value, (int, float)) and value == value and abs(value) != float("inf")):
        raise InputError(f"{what} must be a finite number, got {value!r}")
    if value < low:
        raise InputError(f"{what} must be at least {low:g}, got {value:g}")
