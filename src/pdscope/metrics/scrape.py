"""Read a server's ``/metrics``: one scrape becomes one :class:`Snapshot`.

Parsing is ``prometheus_client``'s own text parser; this module only keeps what it gives in a
form that is easy to ask questions of. Two things about that parser matter to every reader:

* It names a counter family without ``_total`` and its samples with it: vLLM's
  ``vllm:prompt_tokens_total`` is the family ``vllm:prompt_tokens`` with the sample
  ``vllm:prompt_tokens_total``. A counter written without the suffix (TGI's
  ``tgi_request_count``) comes back *with* it. :meth:`Snapshot.counter` therefore takes either
  spelling and looks for both.
* In the plain text format a ``_created`` line is a family of its own, not part of its
  counter. Readers here never look at ``_created`` samples.

Samples are summed across label sets (engines, finish reasons) unless a ``where`` filter keeps
some of them; histograms are summed bucket by bucket.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pdscope.errors import InputError, RunError
from pdscope.servers import OLLAMA_NO_METRICS

Labels = frozenset[tuple[str, str]]
Names = str | Sequence[str]


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram: cumulative bucket counts by upper bound.

    ``buckets`` is sorted by upper bound (``le``) and its last bound is ``+Inf``, whose count
    equals ``count``. ``sum`` is ``None`` when the text had no ``_sum`` sample. ``reset`` is set
    on a difference whose later histogram was smaller than the earlier one.
    """

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float | None = None
    reset: bool = False

    def __post_init__(self) -> None:
        if not self.buckets or not math.isinf(self.buckets[-1][0]):
            raise ValueError("a histogram needs a +Inf bucket")
        bounds = [le for le, _ in self.buckets]
        if bounds != sorted(bounds):
            raise ValueError("histogram buckets must be sorted by upper bound")

    @property
    def mean(self) -> float | None:
        """Mean observation (``sum / count``); ``None`` when empty or without a sum."""
        if self.sum is None or self.count <= 0:
            return None
        return self.sum / self.count

    @property
    def finite_bounds(self) -> tuple[float, ...]:
        """Upper bounds of the finite buckets: the resolution a quantile can have."""
        return tuple(le for le, _ in self.buckets if not math.isinf(le))



def _candidates(names: Names) -> tuple[str, ...]:
    return (names,) if isinstance(names, str) else tuple(names)


def _matches(labels: Labels, where: Mapping[str, str] | None) -> bool:
    if not where:
        return True
    have = dict(labels)
    return all(have.get(key) == value for key, value in where.items())


def _replica_rank(value: str) -> tuple[int, float, str]:
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def _drop_replicas(
    rows: list[tuple[Labels, float]], replicas: Sequence[str]
) -> list[tuple[Labels, float]]:
    """Keep one row per series when ``replicas`` labels only tell copies apart (the lowest)."""
    if not replicas:
        return rows
    chosen: dict[Labels, tuple[tuple[tuple[int, float, str], ...], float]] = {}
    for labels, value in rows:
        rest = frozenset((k, v) for k, v in labels if k not in replicas)
        have = dict(labels)
        rank = tuple(_replica_rank(have.get(k, "")) for k in replicas)
        if rest not in chosen or rank < chosen[rest][0]:
            chosen[rest] = (rank, value)
    return [(rest, value) for rest, (_, value) in chosen.items()]


@dataclass(frozen=True)
class Snapshot:
    """One scrape of ``/metrics``.

    ``t`` is ``time.monotonic()`` and ``wall`` is ``time.time()`` at the scrape (the middle of
    the request for :func:`scrape`). ``samples`` maps (sample name, label items) to the value,
    as ``prometheus_client`` names samples; ``types`` maps family names to their declared type.
    """

    t: float
    wall: float
    samples: Mapping[tuple[str, Labels], float]
    types: Mapping[str, str] = field(default_factory=dict)
    _by_name: dict[str, list[tuple[Labels, float]]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        for (name, labels), value in self.samples.items():
            self._by_name.setdefault(name, []).append((labels, value))

    @property
    def names(self) -> frozenset[str]:
        """Every family and sample name in the scrape (for :func:`detect_metric_map`)."""
        return frozenset(self._by_name) | frozenset(self.types)

    def _rows(
        self, sample: str, where: Mapping[str, str] | None, replicas: Sequence[str]
    ) -> list[tuple[Labels, float]]:
        rows = [
            (labels, value)
            for labels, value in self._by_name.get(sample, [])
            if _matches(labels, where) and not math.isnan(value)
        ]
        return _drop_replicas(rows, replicas)

    def found(self, names: Names, kind: str = "gauge") -> str | None:
        """Which of the candidate ``names`` is present as a ``kind`` metric, if any."""
        for name in _candidates(names):
            if kind == "counter":
                base = name.removesuffix("_total")
                samples: tuple[str, ...] = (base + "_total", base)
            elif kind == "histogram":
                samples = (name + "_bucket", name + "_count")
            else:
                samples = (name,)
            if any(sample in self._by_name for sample in samples):
                return name
        return None

    @overload
    def gauge(
        self,
        names: Names,
        by_engine: Literal[False] = False,
        *,
        engine_label: str = "engine",
        where: Mapping[str, str] | None = None,
        replicas: Sequence[str] = (),
    ) -> float | None: ...

    @overload
    def gauge(
        self,
        names: Names,
        by_engine: Literal[True],
        *,
        engine_label: str = "engine",
        where: Mapping[str, str] | None = None,
        replicas: Sequence[str] = (),
    ) -> dict[str, float]: ...

    def gauge(
        self,
        names: Names,
        by_engine: bool = False,
        *,
        engine_label: str = "engine",
        where: Mapping[str, str] | None = None,
        replicas: Sequence[str] = (),
    ) -> float | dict[str, float] | None:
        """A gauge, summed over its label sets; the first candidate name present wins.

        ``None`` when no candidate has a sample that matches ``where``. With ``by_engine`` the
        sums are split by the ``engine_label`` value (``""`` for samples without it), and an
        absent gauge is an empty dict.
        """
        for name in _candidates(names):
            rows = self._rows(name, where, replicas)
            if not rows:
                continue
            if not by_engine:
                return sum(value for _, value in rows)
            split: dict[str, float] = {}
            for labels, value in rows:
                key = dict(labels).get(engine_label, "")
                split[key] = split.get(key, 0.0) + value
            return split
        return {} if by_engine else None

    def counter(
        self,
        names: Names,
        *,
        where: Mapping[str, str] | None = None,
        replicas: Sequence[str] = (),
    ) -> float | None:
        """A counter's total, summed over its label sets; ``None`` when absent.

        A name may be given with or without ``_total``; both spellings are looked up.
        """
        for name in _candidates(names):
            base = name.removesuffix("_total")
            for sample in (base + "_total", base):
                rows = self._rows(sample, where, replicas)
                if rows:
                    return sum(value for _, value in rows)
        return None

    def histogram(
        self,
        names: Names,
        *,
        where: Mapping[str, str] | None = None,
        replicas: Sequence[str] = (),
    ) -> Histogram | None:
        """A histogram summed bucket by bucket over its label sets; ``None`` when absent.

        A text without the ``+Inf`` bucket (a shortened documentation example) gets one equal
        to ``_count``, which is what the exposition format requires it to be.
        """
        for name in _candidates(names):
            bucket_rows = self._rows(name + "_bucket", where, replicas)
            count_rows = self._rows(name + "_count", where, replicas)
            if not bucket_rows and not count_rows:
                continue
            by_le: dict[float, float] = {}
            for labels, value in bucket_rows:
                le = float(dict(labels).get("le", "+Inf"))
                by_le[le] = by_le.get(le, 0.0) + value
            sum_rows = self._rows(name + "_sum", where, replicas)
            if count_rows:
                count = sum(value for _, value in count_rows)
            elif math.inf in by_le:
                count = by_le[math.inf]
            else:
                count = max(by_le.values())
            by_le.setdefault(math.inf, count)
            return Histogram(
                buckets=tuple(sorted(by_le.items())),
                count=count,
                sum=sum(value for _, value in sum_rows) if sum_rows else None,
            )
        return None

    def info(self, names: Names) -> dict[str, str] | None:
        """Labels of an info-style gauge (vLLM's ``cache_config_info``); ``None`` when absent."""
        for name in _candidates(names):
            rows = self._by_name.get(name)
            if rows:
                return dict(rows[0][0])
        return None

    def to_json(self, *, keep_created: bool = False) -> dict[str, Any]:
        """A compact JSON-ready form that :meth:`from_json` turns back into the snapshot.

        Samples are grouped by name, each a ``[labels, value]`` pair; values that JSON cannot
        hold are written ``"NaN"``, ``"+Inf"``, ``"-Inf"``. ``_created`` samples (the time a
        series was created, which no reader here uses, and a third of vLLM's text) are left
        out unless ``keep_created``.
        """
        samples: dict[str, list[list[Any]]] = {}
        for (name, labels), value in self.samples.items():
            if not keep_created and name.endswith("_created"):
                continue
            samples.setdefault(name, []).append([dict(sorted(labels)), _json_number(value)])
        types = {
            name: kind
            for name, kind in self.types.items()
            if keep_created or not name.endswith("_created")
        }
        return {"t": self.t, "wall": self.wall, "types": types, "samples": samples}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Snapshot:
        """The snapshot :meth:`to_json` wrote. Raises ``ValueError`` on another shape."""
        try:
            samples: dict[tuple[str, Labels], float] = {}
            for name, rows in data["samples"].items():
                for labels, value in rows:
                    key = (str(name), frozenset((str(k), str(v)) for k, v in labels.items()))
                    samples[key] = float(value)
            types = {str(k): str(v) for k, v in data.get("types", {}).items()}
            return cls(t=float(data["t"]), wall=float(data["wall"]), samples=samples, types=types)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a snapshot written by Snapshot.to_json: {exc!r}") from exc

    def engines(self, engine_label: str = "engine") -> frozenset[str]:
        """Every value the ``engine_label`` label takes in this scrape."""
        return frozenset(
            value
            for rows in self._by_name.values()
            for labels, _ in rows
            for key, value in labels
            if key == engine_label
        )


def _json_number(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return value


def _first_line(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _check_bucket_bound(name: str, labels: Mapping[str, str]) -> None:
    """A bucket's ``le`` must be a number, not NaN: :meth:`Snapshot.histogram` sorts by it."""
    le = labels.get("le")
    if le is None or not name.endswith("_bucket"):
        return
    try:
        bound = float(le)
    except ValueError:
        bound = math.nan
    if math.isnan(bound):
        raise ValueError(f"{name} has a bucket bound le={le!r} that is not a number")


def parse_metrics(
    text: str,
    *,
    source: str = "/metrics",
    t: float | None = None,
    wall: float | None = None,
) -> Snapshot:
    """Parse Prometheus exposition text into a :class:`Snapshot`.

    ``t`` and ``wall`` default to now. ``source`` names where the text came from in the error
    raised when the text is not Prometheus text (an HTML error page, JSON, a shell transcript):
    ``InputError("<source> did not return Prometheus text: <what the parser said>")``.
    """
    now_t = time.monotonic() if t is None else t
    now_wall = time.time() if wall is None else wall
    if not text.strip():
        raise InputError(f"{source} did not return Prometheus text: the body is empty")
    samples: dict[tuple[str, Labels], float] = {}
    types: dict[str, str] = {}
    try:
        for family in text_string_to_metric_families(text):
            types[family.name] = family.type
            for sample in family.samples:
                _check_bucket_bound(sample.name, sample.labels)
                samples[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    # OverflowError: a value written as an integer past float range.
    except (ValueError, TypeError, IndexError, KeyError, OverflowError) as exc:
        raise InputError(f"{source} did not return Prometheus text: {_first_line(exc)}") from exc
    if not samples:
        raise InputError(f"{source} did not return Prometheus text: it holds no samples")
    return Snapshot(t=now_t, wall=now_wall, samples=samples, types=types)


def metrics_url(url: str) -> str:
    """The ``/metrics`` URL of a server given by its base URL (``/v1`` or ``/metrics`` allowed)."""
    return base_url(url) + "/metrics"


def base_url(url: str) -> str:
    """The server's base URL: ``url`` without a trailing ``/``, ``/metrics`` or ``/v1``."""
    base = url.strip().rstrip("/")
    return base.removesuffix("/metrics").rstrip("/").removesuffix("/v1").rstrip("/")


async def ollama_version(
    url: str, session: aiohttp.ClientSession, timeout: float = 3
) -> str | None:
    """The version an Ollama server gives at ``/api/version``; ``None`` when it is not one."""
    try:
        async with session.get(
            base_url(url) + "/api/version", timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            if response.status != 200:
                return None
            data = await response.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("version"), str):
        return data["version"]
    return None


async def scrape(
    url: str,
    session: aiohttp.ClientSession | None = None,
    timeout: float = 5,
) -> Snapshot:
    """Fetch and parse ``{url}/metrics`` once.

    Raises ``RunError`` naming the URL when the server cannot be reached, does not answer in
    ``timeout`` seconds, has no ``/metrics`` (404: Ollama never has one, SGLang needs
    ``--enable-metrics``, llama.cpp ``--metrics``), answers another error status, or answers
    something that is not Prometheus text. On a 404 it asks ``/api/version`` whether the server
    is Ollama, and if so says so and points to ``pdscope probe``.
    """
    target = metrics_url(url)
    own = session is None
    client = session or aiohttp.ClientSession()
    try:
        t0, wall0 = time.monotonic(), time.time()
        async with client.get(target, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            body = await response.text(errors="replace")
            status = response.status
        t1, wall1 = time.monotonic(), time.time()
        ollama = await ollama_version(url, client) if status == 404 else None
    except aiohttp.InvalidURL as exc:
        raise InputError(f"not a URL: {url!r}") from exc
    except aiohttp.ClientConnectorError as exc:
        raise RunError(f"cannot reach {target}: {_first_line(exc.os_error)}") from exc
    except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise RunError(f"{target} did not answer within {timeout:g} s") from exc
    except aiohttp.ClientError as exc:
        raise RunError(f"scraping {target} failed: {_first_line(exc)}") from exc
    finally:
        if own:
            await client.close()
    if ollama is not None:
        raise RunError(
            f"{base_url(url)} is an Ollama server (version {ollama}). {OLLAMA_NO_METRICS}"
        )
    if status == 404:
        raise RunError(
            f"{target} has no /metrics endpoint (404): vLLM serves one by default, SGLang needs "
            "--enable-metrics, llama.cpp --metrics; Ollama has none (use `pdscope probe`)"
        )
    if status != 200:
        raise RunError(f"{target} answered HTTP {status}: {body.strip()[:160]}")
    try:
        return parse_metrics(body, source=target, t=(t0 + t1) / 2, wall=(wall0 + wall1) / 2)
    except InputError as exc:
        raise RunError(str(exc)) from exc
