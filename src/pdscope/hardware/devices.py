"""Published device specs: the one place pdscope keeps a device's bandwidth and FLOPS.

The figures live in ``devices.csv`` beside this file, one row a device, each with the source it
was taken from; ``docs/devices.md`` shows the same table. The first six rows are the article's
table, in the article's order, with its bandwidth figures.

TFLOPS are *dense*. Vendors often print the 2:4 structured-sparsity figure, twice the dense one;
a prefill ceiling built on it would promise twice what a dense model can reach. Where a vendor
publishes only the sparse figure, the table halves it and says so in ``source``.

Names are matched after normalisation (lower case, letters and digits only), so ``H100 SXM``,
``h100-sxm`` and ``h100_sxm`` are the same query. A query that fits several devices (``a100``)
is an error that lists them, never a silent pick.
"""

from __future__ import annotations

import csv
import difflib
import io
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from pdscope.errors import InputError

KINDS = ("gpu", "cpu", "apple")
ARTICLE_ROWS = 6

# Words that prefix the same device in different tools ("NVIDIA GeForce RTX 4090", "Tesla T4",
# "AMD Instinct MI300X"): a query is matched with and without them.
_VENDOR_WORDS = ("nvidia", "geforce", "tesla", "amd", "instinct", "apple")

# A unique prefix is accepted only from this many characters on, so "b" never means "b200".
_MIN_PREFIX = 3

_COLUMNS = (
    "id",
    "name",
    "aliases",
    "kind",
    "mem_bandwidth_gb_s",
    "bf16_tflops",
    "fp8_tflops",
    "memory_gb",
    "source",
)


@dataclass(frozen=True)
class DeviceSpec:
    """A device's physical ceilings, as published (or measured, when ``measured`` is true).

    ``mem_bandwidth_gb_s`` is in 10^9 bytes/s, as vendors print it. ``bf16_tflops`` and
    ``fp8_tflops`` are dense tensor-core figures (``None`` where unknown or unsupported);
    ``bf16_tflops`` is the FP16 figure on devices without BF16 and, on Apple and CPUs, a plain
    FP32/FP16 rate, as ``source`` says. ``memory_gb`` is device memory in 10^9 bytes (the largest
    configuration for Apple parts).
    """

    id: str
    name: str
    aliases: tuple[str, ...]
    kind: str
    mem_bandwidth_gb_s: float
    bf16_tflops: float | None
    fp8_tflops: float | None
    memory_gb: float | None
    source: str
    measured: bool = False


def normalise(name: str) -> str:
    """Lower case, letters and digits only: ``"H100 SXM"`` and ``"h100-sxm"`` give ``"h100sxm"``."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _without_vendor(key: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for word in _VENDOR_WORDS:
            if key.startswith(word) and len(key) > len(word):
                key = key[len(word) :]
                stripped = True
    return key


def _keys(spec: DeviceSpec) -> set[str]:
    """Every normalised string that names ``spec``: id, name, aliases, with and without vendor."""
    keys: set[str] = set()
    for text in (spec.id, spec.name, *spec.aliases):
        key = normalise(text)
        if key:
            keys.add(key)
            keys.add(_without_vendor(key))
    return keys


def _optional_float(text: str, column: str, line: int) -> float | None:
    text = text.strip()
    if not text:
        return None
    return _float(text, column, line)


def _float(text: str, column: str, line: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"devices.csv line {line}: {column} is not a number: {text!r}") from None


def _parse(text: str) -> tuple[DeviceSpec, ...]:
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != _COLUMNS:
        raise ValueError(f"devices.csv: columns must be {','.join(_COLUMNS)}")
    specs = []
    for row in reader:
        line = reader.line_num
        kind = row["kind"].strip()
        if kind not in KINDS:
            raise ValueError(f"devices.csv line {line}: kind {kind!r} is not one of {KINDS}")
        aliases = tuple(a.strip() for a in row["aliases"].split(";") if a.strip())
        specs.append(
            DeviceSpec(
                id=row["id"].strip(),
                name=row["name"].strip(),
                aliases=aliases,
                kind=kind,
                mem_bandwidth_gb_s=_float(row["mem_bandwidth_gb_s"], "mem_bandwidth_gb_s", line),
                bf16_tflops=_optional_float(row["bf16_tflops"], "bf16_tflops", line),
                fp8_tflops=_optional_float(row["fp8_tflops"], "fp8_tflops", line),
                memory_gb=_optional_float(row["memory_gb"], "memory_gb", line),
                source=row["source"].strip(),
            )
        )
    return tuple(specs)


@lru_cache(maxsize=1)
def all_devices() -> tuple[DeviceSpec, ...]:
    """Every device in the table, in table order (the article's six first)."""
    text = resources.files("pdscope.hardware").joinpath("devices.csv").read_text(encoding="utf-8")
    return _parse(text)


def article_devices() -> tuple[DeviceSpec, ...]:
    """The six devices of the article's table, in the article's order."""
    return all_devices()[:ARTICLE_ROWS]


@lru_cache(maxsize=1)
def _index() -> dict[str, DeviceSpec]:
    """Normalised key -> device. Two devices sharing a key is a bug in the data file."""
    index: dict[str, DeviceSpec] = {}
    for spec in all_devices():
        for key in _keys(spec):
            other = index.get(key)
            if other is not None and other.id != spec.id:
                raise ValueError(f"devices.csv: {key!r} names both {other.id} and {spec.id}")
            index[key] = spec
    return index


def _exact(name: str) -> DeviceSpec | None:
    key = normalise(name)
    if not key:
        return None
    index = _index()
    return index.get(key) or index.get(_without_vendor(key))


def _list_ids(specs: list[DeviceSpec], limit: int = 8) -> str:
    ids = [s.id for s in specs[:limit]]
    if len(specs) > limit:
        ids.append(f"and {len(specs) - limit} more")
    return ", ".join(ids)


def find_device(query: str) -> DeviceSpec:
    """The device a person means by ``query``: an id, a name, or an alias.

    An exact match (after normalisation) wins. Otherwise a query of three or more characters
    that starts the names of exactly one device picks it; one that starts several raises
    :class:`InputError` listing them. A query that matches nothing raises with the closest names.
    """
    spec = _exact(query)
    if spec is not None:
        return spec
    key = _without_vendor(normalise(query))
    if not key:
        raise InputError(f"empty device name {query!r}: `pdscope devices` lists the known devices")

    starts = [s for s in all_devices() if any(k.startswith(key) for k in _keys(s))]
    if len(starts) == 1 and len(key) >= _MIN_PREFIX:
        return starts[0]
    if len(starts) > 1:
        raise InputError(
            f"device {query!r} could be {_list_ids(starts)}: name one of them "
            "(`pdscope devices` lists all)"
        )

    index = _index()
    close = difflib.get_close_matches(key, list(index), n=12, cutoff=0.6)
    suggestions: list[DeviceSpec] = list(starts)
    for match in close:
        if index[match] not in suggestions:
            suggestions.append(index[match])
    if suggestions:
        raise InputError(
            f"unknown device {query!r}: did you mean {_list_ids(suggestions, limit=4)}? "
            "(`pdscope devices` lists all)"
        )
    raise InputError(f"unknown device {query!r}: `pdscope devices` lists the known devices")


def match_gpu_name(nvidia_smi_name: str) -> DeviceSpec | None:
    """The device ``nvidia-smi --query-gpu=name`` printed, or ``None`` when the name is unknown.

    Only an exact (normalised) name or alias counts: "NVIDIA GeForce RTX 4080 SUPER" must not
    become an RTX 4080, and a wrong ceiling is worse than asking the user for ``--device``.
    """
    return _exact(nvidia_smi_name.strip())
