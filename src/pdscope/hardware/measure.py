"""What this machine is: an NVIDIA GPU named by nvidia-smi, an Apple chip, or a measured CPU.

A CPU has no datasheet figure pdscope could trust (the same chip ships with one memory channel
or twelve), so its ceiling is measured: a STREAM-like numpy probe for memory bandwidth, and for
FLOPS matmuls as a server computes them (numpy fp32, torch fp32 and bf16 where torch is
installed and the CPU has a native bfloat16 dot product, on every usable CPU, of the shapes of a
prefill step), the fastest taken: a ceiling from a slower kernel than the server's is one its
prefill beats. A measurement is never a
single number: every probe takes a warm-up run, then the best of several, and reports the
spread so a caller can warn when the machine was busy.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from pdscope.errors import InputError
from pdscope.hardware.devices import DeviceSpec, match_gpu_name

_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class BandwidthProbe:
    """CPU memory bandwidth, measured. GB/s are 10^9 bytes/s, as in the device table.

    ``copy_gb_s`` and ``triad_gb_s`` are each the best of ``runs``; ``best_gb_s`` is the larger
    of the two and is what a CPU's decode ceiling should use. ``run_gb_s`` holds each run's
    best of copy and triad; ``spread`` is (max - min) / median of those, and above about 0.1
    means the machine was busy or throttling and the figure deserves a warning.
    """

    copy_gb_s: float
    triad_gb_s: float
    best_gb_s: float
    runs: int
    array_mb: float
    spread: float
    run_gb_s: tuple[float, ...] = ()
    threads: int = 1


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def probe_cpu_bandwidth(
    array_mb: float = 256, runs: int = 7, threads: int | None = None
) -> BandwidthProbe:
    """Measure memory bandwidth with numpy copy and triad over arrays of ``array_mb`` MB each.

    Three float64 arrays of ``array_mb`` MB (10^6 bytes) are allocated and touched first, each
    slice by the thread that will use it, so page faults are not timed. 256 MB each is far
    beyond the last-level cache of common CPUs; on a part with a larger cache (EPYC with 3D
    V-Cache) pass a larger ``array_mb``, or the figure is the cache's bandwidth. Each thread
    works on its own slice (numpy releases the GIL in these loops), because one core cannot
    saturate a memory system and llama.cpp or vLLM-CPU decode on all of them.

    Bytes are counted as the program moves them, not as STREAM would:

    - copy, ``np.copyto(b, a)``: read ``a``, write ``b``: 2 x array bytes.
    - triad, ``a = b + s*c`` in two numpy passes, ``np.multiply(c, s, out=a)`` then
      ``np.add(a, b, out=a)``: read ``c``, write ``a``, read ``a``, read ``b``, write ``a``:
      5 x array bytes (STREAM's fused triad moves 3; counting 3 here would understate it).

    Write-allocate traffic (a store reading its cache line first) is not counted, as in STREAM,
    so both figures are a little below what the memory bus carried. One warm-up run of each is
    discarded. About 1 s on two cores with the defaults.
    """
    if array_mb <= 0:
        raise InputError(f"array size must be positive, got {array_mb} MB")
    if runs < 1:
        raise InputError(f"runs must be at least 1, got {runs}")
    n = max(1, int(array_mb * 1e6) // 8)
    nbytes = n * 8
    workers = max(1, min(threads if threads is not None else _usable_cpus(), n))

    a = np.empty(n)
    b = np.empty(n)
    c = np.empty(n)
    scalar = 3.0
    bounds = [(n * i // workers, n * (i + 1) // workers) for i in range(workers)]
    slices = [(a[lo:hi], b[lo:hi], c[lo:hi]) for lo, hi in bounds]

    def touch(i: int) -> None:
        # First touch faults the pages in, on the thread that will use them (NUMA-local).
        for array in slices[i]:
            array.fill(1.0)

    def copy(i: int) -> None:
        sa, sb, _ = slices[i]
        np.copyto(sb, sa)

    def triad(i: int) -> None:
        sa, sb, sc = slices[i]
        np.multiply(sc, scalar, out=sa)
        np.add(sa, sb, out=sa)

    copies: list[float] = []
    triads: list[float] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:

        def timed(kernel: Callable[[int], None]) -> float:
            start = time.perf_counter()
            list(pool.map(kernel, range(workers)))
            return time.perf_counter() - start

        timed(touch)
        timed(copy)
        timed(triad)
        for _ in range(runs):
            copies.append(2 * nbytes / timed(copy) / 1e9)
            triads.append(5 * nbytes / timed(triad) / 1e9)

    per_run = tuple(max(x, y) for x, y in zip(copies, triads, strict=True))
    median = statistics.median(per_run)
    return BandwidthProbe(
        copy_gb_s=max(copies),
        triad_gb_s=max(triads),
        best_gb_s=max(max(copies), max(triads)),
        runs=runs,
        array_mb=nbytes / 1e6,
        spread=(max(per_run) - min(per_run)) / median if median > 0 else 0.0,
        run_gb_s=per_run,
        threads=workers,
    )


Shape = tuple[int, int, int]
"""``(m, k, n)``: an ``m x k`` matrix times a ``k x n`` one, ``2 m k n`` FLOPs."""

# Prompt tokens in one probed prefill step: the probe's default prompt, and a step well inside
# vLLM's default budget (2,048 tokens a step), so the shape is one a server really multiplies.
PREFILL_STEP_TOKENS = 512
# With no model known: a square product, and the step of a 2,048-wide model (Llama 3.2 1B).
DEFAULT_SHAPES: tuple[Shape, ...] = ((1024, 1024, 1024), (PREFILL_STEP_TOKENS, 2048, 2048))
# A probe stops once its timed runs took this long (at least two are taken): a few probes of
# three dtypes stay within a second or two even on a slow CPU.
_MATMUL_BUDGET_S = 0.2


def prefill_shapes(hidden: int | None, intermediate: int | None = None) -> tuple[Shape, ...]:
    """The products of a prefill step of ``PREFILL_STEP_TOKENS`` tokens of a model ``hidden``
    wide: tokens x hidden times hidden x hidden (attention's projections) and hidden x
    intermediate (the MLP), plus the square default. Without ``hidden``, the defaults."""
    if not hidden:
        return DEFAULT_SHAPES
    shapes: list[Shape] = [DEFAULT_SHAPES[0], (PREFILL_STEP_TOKENS, hidden, hidden)]
    if intermediate and intermediate != hidden:
        shapes.append((PREFILL_STEP_TOKENS, hidden, intermediate))
    return tuple(shapes)


@dataclass(frozen=True)
class MatmulProbe:
    """One matmul rate, measured: which library and dtype, the shape, the threads, and the
    best of ``runs`` in TFLOPS (10^12 FLOP/s, counting ``2 m k n`` FLOPs a product)."""

    library: str  # "numpy" or "torch"
    dtype: str  # "fp32" or "bf16"
    shape: Shape
    threads: int
    runs: int
    tflops: float

    @property
    def how(self) -> str:
        m, k, n = self.shape
        return (f"a {self.dtype} {self.library} matmul of {m:,}x{k:,} by {k:,}x{n:,} on"
                f" {self.threads} threads")


def _best_time(product: Callable[[], object], runs: int, budget_s: float) -> tuple[float, int]:
    """(best seconds, runs taken) of ``product`` after one warm-up: at most ``runs``, and no
    more once ``budget_s`` is spent (but at least two when ``runs`` allows)."""
    product()
    best, spent, taken = float("inf"), 0.0, 0
    while taken < runs:
        start = time.perf_counter()
        product()
        took = time.perf_counter() - start
        best, spent, taken = min(best, took), spent + took, taken + 1
        if taken >= 2 and spent >= budget_s:
            break
    return best, taken


def _check_shape(shape: Shape, runs: int) -> None:
    if min(shape) < 1 or runs < 1:
        raise InputError(f"matmul sizes and runs must be at least 1, got {shape}, runs={runs}")


def probe_numpy_matmul(shape: Shape, runs: int = 5,
                       budget_s: float = _MATMUL_BUDGET_S) -> MatmulProbe:
    """fp32 numpy matmul of ``shape``, on the threads numpy's BLAS uses (all the CPUs it sees,
    unless ``OMP_NUM_THREADS`` or ``OPENBLAS_NUM_THREADS`` says otherwise)."""
    _check_shape(shape, runs)
    m, k, n = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k), dtype=np.float32)
    y = rng.standard_normal((k, n), dtype=np.float32)
    out = np.empty((m, n), dtype=np.float32)
    best, taken = _best_time(lambda: np.matmul(x, y, out=out), runs, budget_s)
    return MatmulProbe("numpy", "fp32", shape, _usable_cpus(), taken,
                       2.0 * m * k * n / max(best, 1e-9) / 1e12)


# CPU flags (x86 /proc/cpuinfo "flags", Arm "Features") of a native bfloat16 dot product:
# AVX512-BF16, AMX-BF16, Arm's BF16.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU (or the ``/proc/cpuinfo`` text given) has a native bfloat16 dot
    product; ``None`` where that cannot be read (not Linux).

    Without one, PyTorch's bfloat16 matrix products fall back to a scalar path: a
    2048x576x1536 product took 1.6 s on this project's 2-core machines with oneDNN held to AVX2,
    against 20 ms in float32 and 5.6 ms in bfloat16 with AVX512-BF16."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return bool(flags & set(BF16_FLAGS))


def torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def probe_torch_matmul(shape: Shape, dtype: str = "bf16", runs: int = 5,
                       budget_s: float = _MATMUL_BUDGET_S) -> MatmulProbe | None:
    """A torch matmul of ``shape`` in ``dtype`` (``fp32`` or ``bf16``) on every usable CPU, as
    a CPU engine computes (vLLM for CPU multiplies through torch and oneDNN, in bf16 with the
    lab's ``--dtype bfloat16``; CPUs with AVX-512 BF16 or AMX do that several times faster than
    fp32). ``None`` when torch is not installed (it is only in the lab extra). torch's thread
    count is put back afterwards."""
    _check_shape(shape, runs)
    if not torch_available():
        return None
    import torch

    kinds = {"fp32": torch.float32, "bf16": torch.bfloat16}
    if dtype not in kinds:
        raise InputError(f"a torch matmul probe is fp32 or bf16, got {dtype!r}")
    m, k, n = shape
    threads, before = _usable_cpus(), torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(m, k, generator=gen).to(kinds[dtype])
        y = torch.randn(k, n, generator=gen).to(kinds[dtype])
        with torch.inference_mode():
            best, taken = _best_time(lambda: torch.matmul(x, y), runs, budget_s)
    finally:
        torch.set_num_threads(before)
    return MatmulProbe("torch", dtype, shape, threads, taken,
                       2.0 * m * k * n / max(best, 1e-9) / 1e12)


def probe_cpu_matmuls(shapes: Sequence[Shape] = DEFAULT_SHAPES) -> tuple[MatmulProbe, ...]:
    """Every matmul probe of ``shapes``: numpy fp32, and torch fp32 where torch is installed,
    and bf16 too unless the CPU has no native bfloat16 dot product (:func:`native_bf16`). A
    server's prefill is a run of such products, so the fastest of them is the figure a CPU's
    prefill ceiling should use (a ceiling from a slower kernel than the server's is one the
    server beats). Without the dot product bf16 is the slowest of the three, never the figure,
    and its products took minutes (an AMD EPYC with AVX2 only, 2026-12-06)."""
    dtypes = ("fp32",) if native_bf16() is False else ("fp32", "bf16")
    probes: list[MatmulProbe] = []
    for shape in shapes:
        probes.append(probe_numpy_matmul(shape))
        for dtype in dtypes:
            t = probe_torch_matmul(shape, dtype)
            if t is not None:
                probes.append(t)
    return tuple(probes)


def best_matmul(probes: Sequence[MatmulProbe]) -> MatmulProbe:
    if not probes:
        raise InputError("no matmul probe to choose from")
    return max(probes, key=lambda p: p.tflops)


def probe_cpu_matmul_tflops(n: int = 1024, runs: int = 5) -> float:
    """Best fp32 numpy matmul rate of an ``n x n`` product over ``runs``, in TFLOPS, counting
    2 n^3 FLOPs a product (one warm-up first)."""
    if n < 1 or runs < 1:
        raise InputError(f"matmul size and runs must be at least 1, got n={n}, runs={runs}")
    return probe_numpy_matmul((n, n, n), runs, budget_s=float("inf")).tflops


def probe_cpu_matmul_bf16_tflops(n: int = 1024, runs: int = 5) -> float | None:
    """Best bf16 torch matmul rate of an ``n x n`` product, in TFLOPS, or ``None`` without
    torch."""
    probe = probe_torch_matmul((n, n, n), "bf16", runs)
    return probe.tflops if probe is not None else None


def best_cpu_matmul_tflops(shapes: Sequence[Shape] = DEFAULT_SHAPES) -> tuple[float, str]:
    """The fastest of :func:`probe_cpu_matmuls` and how it was measured: the figure a CPU
    prefill ceiling should use."""
    best = best_matmul(probe_cpu_matmuls(shapes))
    return best.tflops, best.how


def best_cpu_matmul_tflops_of(fp32: float, bf16: float | None) -> tuple[float, str]:
    if bf16 is not None and bf16 > fp32:
        return bf16, "a bf16 torch matmul"
    return fp32, "an fp32 numpy matmul"


def _run(argv: list[str]) -> str | None:
    """stdout of a short command, or None if it is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def nvidia_smi_gpus() -> list[str]:
    """GPU names as ``nvidia-smi --query-gpu=name`` prints them, one per GPU; [] without one."""
    out = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    if out is None:
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def cpu_model_name() -> str:
    """The CPU's marketing name: /proc/cpuinfo, sysctl on macOS, else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        brand = _run(["sysctl", "-n", "machdep.cpu.brand_string"])
        if brand and brand.strip():
            return brand.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (AttributeError, ValueError, OSError):
        return None


def local_cpu_spec(
    probe: BandwidthProbe, matmul_tflops: float | None, matmul_how: str = "an fp32 numpy matmul"
) -> DeviceSpec:
    """A device spec for this CPU from measurements: bandwidth from ``probe``, FLOPS from a
    matmul probe (stored as ``bf16_tflops``, the field the prefill ceiling reads)."""
    source = (
        "measured by pdscope's bandwidth probe: numpy copy/triad, "
        f"best of {probe.runs} runs on {probe.threads} threads, {probe.array_mb:.0f} MB arrays"
    )
    if matmul_tflops is not None:
        source += f"; TFLOPS from {matmul_how}"
    return DeviceSpec(
        id="local-cpu",
        name=f"{cpu_model_name()} (measured)",
        aliases=(),
        kind="cpu",
        mem_bandwidth_gb_s=probe.best_gb_s,
        bf16_tflops=matmul_tflops,
        fp8_tflops=None,
        memory_gb=_memory_gb(),
        source=source,
        measured=True,
    )


def _apple_chip() -> DeviceSpec | None:
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return None
    spec = match_gpu_name(cpu_model_name())
    return spec if spec is not None and spec.kind == "apple" else None


def detect_local_device(
    probe_cpu: bool = True, matmul_shapes: Sequence[Shape] = DEFAULT_SHAPES
) -> DeviceSpec | None:
    """The device an LLM server on this machine most likely runs on.

    An NVIDIA GPU found by nvidia-smi comes first (the first GPU when there are several). A GPU
    whose name is not in the table gives ``None``, not the CPU's figure: the server runs on that
    GPU, and the caller should ask for ``--device``. Then an Apple chip by its brand string
    (the table holds each chip's largest configuration). Else, when ``probe_cpu``, the CPU as
    measured now (about 2 s; the FLOPS from matmuls of ``matmul_shapes``, the shapes of the
    served model's prefill step where the caller knows it: :func:`prefill_shapes`); else
    ``None``.
    """
    gpus = nvidia_smi_gpus()
    if gpus:
        return match_gpu_name(gpus[0])
    apple = _apple_chip()
    if apple is not None:
        return apple
    if not probe_cpu:
        return None
    return measure_local_cpu(matmul_shapes)


def measure_local_cpu(matmul_shapes: Sequence[Shape] = DEFAULT_SHAPES) -> DeviceSpec:
    """This machine's CPU as measured now (about 2 s), even beside a GPU: the memory that
    weights a server spilled off the GPU are read from."""
    return local_cpu_spec(probe_cpu_bandwidth(), *best_cpu_matmul_tflops(matmul_shapes))
