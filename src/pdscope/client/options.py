"""How to talk to a server: the options every measurement shares, checked when built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pdscope.client.fields import RequestFields
from pdscope.client.session import Timeouts
from pdscope.client.target import APIS
from pdscope.errors import InputError


@dataclass(frozen=True)
class ClientOptions:
    """The server-facing settings of every experiment, load test and doctor run: the API
    (``auto``: the server's own), the model (``None``: the first it lists), the key, whether to
    ask for a fixed output length, the prompt seed (``None``: new prompts each run), the
    timeouts, and the fields the user adds to every request (:class:`RequestFields`: sampling,
    extra body fields, headers). Every config of pdscope embeds these by inheritance.
    ``api_key`` and the headers' values are never printed, written to JSON, or shown in
    ``repr``."""

    api: str = "auto"
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    fixed_output: bool = True
    seed: int | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    request_fields: RequestFields = field(default_factory=RequestFields)

    def __post_init__(self) -> None:
        if self.api not in ("auto", *APIS):
            raise InputError(f"unknown API {self.api!r}: use auto, {', '.join(APIS)}")
        if self.model is not None and not self.model.strip():
            raise InputError("the model name is empty: leave it out to use the first served")
        if self.api_key and self.request_fields.has_header("Authorization"):
            raise InputError("an Authorization header and an API key both set the"
                             " Authorization: give one of them")
        if self.api != "auto":
            self.request_fields.check_api(self.api)

    @property
    def client(self) -> ClientOptions:
        """Just the client options of a config that embeds them."""
        return ClientOptions(self.api, self.model, self.api_key, self.fixed_output, self.seed,
                             self.timeouts, self.request_fields)

    def client_fields(self) -> dict[str, Any]:
        """The client options of a config that embeds them, as keyword arguments for another
        config (a sub-experiment's)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(ClientOptions)}

    def to_json(self) -> dict[str, Any]:
        """The config as JSON: every field but the key and the timeouts, tuples as lists; the
        request fields (header values redacted) where any were given."""
        out: dict[str, Any] = {"api": self.api, "model": self.model,
                               "fixed_output": self.fixed_output, "seed": self.seed}
        if not self.request_fields.empty:
            out["request_fields"] = self.request_fields.to_json()
        for f in dataclasses.fields(self):
            if f.name in ("api_key", "timeouts", "request_fields") or f.name in out:
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

