"""The GPU check behind ``tools/gpu_check.sh``: llama-server on a random-weight Llama-3-8B, measured
by pdscope at 16, 8 and 4 bits and set beside the ceilings, in one Markdown table.

Steps (``tools/gpu_check.sh --help`` for the flags; the shell script's header says how each step
was sized to fit the 8-minute budget on an H200):

1. ``llama-server`` with CUDA for the GPU found, and only its architecture (``nvidia-smi
   --query-gpu=compute_cap``: 9.0 gives ``-DCMAKE_CUDA_ARCHITECTURES=90``), from the llama.cpp tree
   vendored in llama-cpp-python 0.3.36's sdist, with tools/install-lab.sh's configure flags (its
   ``--print-cmake-args`` gives the CPU part, AMX off), into a build folder with a stamp: a second
   run reuses the build. ``--cpu`` uses ``--server PATH`` or the venv's ``llama-server`` and
   builds the CPU variant only where there is none.
2. A GGUF with random weights in the shape of Llama-3-8B (or ``--tiny``'s), F16, Q8_0 and Q4_0,
   streamed to disk one tensor at a time (:func:`write_gguf`), with the bundled SmolLM2
   tokenizer padded to the shape's vocabulary (:func:`padded_tokenizer`).
3. For each precision: llama-server with every layer on the GPU, then ``pdscope probe`` at 200 and
   2,000 prompt tokens, ``pdscope context`` and ``pdscope bench`` at 1, 8 and 32 users, each with
   ``--json``, ``--device`` and ``--model-config`` (the GGUF: the ceilings use its real bytes).
   The pdscope commands run in this process (``pdscope.cli.main``): no interpreter start for each,
   and on a CPU the machine is measured once, so every row stands beside the same ceiling.
4. The table (stdout and ``--out``), and the raw results beside it (``--out`` with ``.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
LLAMA_CPP_VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"
PIP_DOWNLOAD = (
    f"pip download --no-deps --no-binary :all: llama-cpp-python=={LLAMA_CPP_VERSION} -d DIR"
)
BUDGET_S = 480.0  # the 8 minutes on a 16-core machine with an H200, build included
HOST = "127.0.0.1"
SERVED_NAME = "gpu-check"
TAG = "[gpu-check]"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdscope" / "gpu-check"

# The article's reference line: an 8B model at 16 bits on an H100 SXM (pdscope's own roofline of
# it is what the table prints beside it).
ARTICLE_DEVICE = "h100-sxm"
ARTICLE_TOK_S = 209

# The configure flags of tools/install-lab.sh (a static llama-server with no web UI and no HTTPS
# client: nothing is fetched at build time), plus CUDA where there is a GPU.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)


class CheckError(Exception):
    """A step that cannot go on, in words for the person running the check."""


# --------------------------------------------------------------------------------------------
# The model's shape and its tensors


@dataclass(frozen=True)
class Shape:
    name: str
    label: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    context: int

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every tensor of a llama.cpp ``llama`` model of this shape, in numpy's (rows, columns)
        order (GGUF stores the reverse): llama.cpp's LLM_ARCH_LLAMA names, a separate output
        matrix (not tied to the embedding, as in Llama-3-8B)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (self.vocab, h))]
        for i in range(self.layers):
            b = f"blk.{i}."
            out += [
                (b + "attn_norm.weight", (h,)),
                (b + "attn_q.weight", (q, h)),
                (b + "attn_k.weight", (kv, h)),
                (b + "attn_v.weight", (kv, h)),
                (b + "attn_output.weight", (h, q)),
                (b + "ffn_norm.weight", (h,)),
                (b + "ffn_gate.weight", (self.ffn, h)),
                (b + "ffn_up.weight", (self.ffn, h)),
                (b + "ffn_down.weight", (h, self.ffn)),
            ]
        out += [("output_norm.weight", (h,)), ("output.weight", (self.vocab, h))]
        return out

    @property
    def parameters(self) -> int:
        return sum(math.prod(s) for _, s in self.tensors())


# Meta-Llama-3-8B's config.json: 32 layers, hidden 4096, 32 heads of 128, 8 KV heads, FFN 14336,
# vocabulary 128256, rope theta 500000, 8192 tokens of context; 8.03 B parameters.
LLAMA3_8B = Shape("llama-3-8b", "Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0, 8192)
# --tiny, for a CPU: the bundled tokenizer's vocabulary (no padding), and weights large enough
# that a decode step streams them from memory, not from the last-level cache (32 MB on this
# project's AMD EPYC): 111 M parameters read a token, 222 MB at F16, 118 MB at Q8_0, 62 MB at
# Q4_0. Smaller shapes let Q4_0 (and the 25 MB output matrix) sit in the cache, where decode is
# no longer memory-bound and beats a DRAM ceiling.
TINY = Shape("tiny", "tiny (4 layers, hidden 1024)", 4, 1024, 8, 2, 128, 4096, 49152, 500000.0,
             8192)

# name -> (GGMLQuantizationType name, general.file_type: llama.cpp's LLAMA_FTYPE_MOSTLY_*)
PRECISIONS: dict[str, tuple[str, int]] = {
    "F16": ("F16", 1), "Q8_0": ("Q8_0", 7), "Q4_0": ("Q4_0", 2),
}
# Weights drawn from N(0, 0.02), the initialiser's scale: activations stay O(1) through 32
# layers (no inf or NaN in F16); RMS-norm weights are 1.
WEIGHT_SD = 0.02
TILE_BYTES = 32 << 20  # one random block of about this size is drawn for each tensor shape


def tensor_bytes(shape: tuple[int, ...], precision: str) -> int:
    """Bytes of one tensor on disk: 1-D tensors (norms) are F32; matrices in ``precision``."""
    import gguf

    if len(shape) == 1:
        return 4 * shape[0]
    qtype = gguf.GGMLQuantizationType[PRECISIONS[precision][0]]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    if cols % block:
        raise CheckError(f"a row of {cols} is not a whole number of {precision} blocks ({block})")
    return rows * (cols // block) * size


def gguf_size(shape: Shape, precision: str) -> int:
    """The tensor data's bytes (the file is this plus the metadata: a few MB)."""
    return sum(tensor_bytes(s, precision) for _, s in shape.tensors())


class _Tiled:
    """A tensor whose rows repeat one block of ``tile_rows`` rows: what
    ``GGUFWriter.write_tensor_data`` needs (``nbytes``, ``tofile``) without the tensor in memory.
    Quantized blocks never straddle rows, so the repeated quantized block is exactly the
    quantization of the repeated float block."""

    def __init__(self, tile: bytes, repeats: int) -> None:
        self.tile = tile
        self.repeats = repeats
        self.nbytes = len(tile) * repeats

    def tofile(self, fout: IO[bytes]) -> None:
        view = memoryview(self.tile)
        for _ in range(self.repeats):
            fout.write(view)


def _tile_rows(rows: int, row_bytes: int) -> int:
    """The largest divisor of ``rows`` whose block of rows stays within :data:`TILE_BYTES`."""
    limit = max(1, TILE_BYTES // max(row_bytes, 1))
    best = 1
    for d in range(1, math.isqrt(rows) + 1):
        if rows % d == 0:
            for c in (d, rows // d):
                if best < c <= limit:
                    best = c
    return best


def random_tensors(shape: Shape, precision: str, seed: int = 0) -> Iterator[tuple[str, Any]]:
    """(name, data) for every tensor, data an ``np.ndarray`` (norms) or a :class:`_Tiled`.
    One random block is drawn (and quantized) per distinct matrix shape and reused: a decode
    step's time does not depend on the weights' values, and drawing 8 B normals would take
    minutes."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[PRECISIONS[precision][0]]
    tiles: dict[tuple[int, int], bytes] = {}
    for name, dims in shape.tensors():
        if len(dims) == 1:
            yield name, np.ones(dims, dtype=np.float32)
            continue
        rows, cols = dims
        t = _tile_rows(rows, 4 * cols)
        key = (t, cols)
        if key not in tiles:
            block = rng.standard_normal((t, cols), dtype=np.float32) * np.float32(WEIGHT_SD)
            data = gguf.quants.quantize(block, qtype)
            tiles[key] = np.ascontiguousarray(data).tobytes()
        yield name, _Tiled(tiles[key], rows // t)


@functools.lru_cache(maxsize=4)
def padded_tokenizer(source: Path, vocab: int) -> list[tuple[str, Any, Any, Any]]:
    """The ``tokenizer.*`` keys of ``source`` (the bundled SmolLM2 GGUF: gpt2 BPE, 49,152
    tokens), as (key, value, GGUFValueType, array element type), with the token list padded to
    ``vocab`` so the embedding and output matrices have the real shape.

    The padding tokens are NORMAL tokens named ``<pad_N>``. In the vendored llama.cpp
    (src/llama-vocab.cpp of llama-cpp-python 0.3.36), every ``tokenizer.ggml.token_type`` value
    loads (``load``: the switch over LLAMA_TOKEN_TYPE_UNKNOWN, UNUSED, NORMAL, CONTROL,
    USER_DEFINED, BYTE, UNDEFINED, anything else UNDEFINED), and token texts must be unique
    (``GGML_ASSERT(id_to_token.size() == token_to_id.size())``). But an UNUSED token has no text
    in a gpt2 vocabulary (``token_to_piece``, LLAMA_VOCAB_TYPE_BPE: only CONTROL/UNKNOWN/
    USER_DEFINED, NORMAL and BYTE are copied; the rest ``break`` to 0 bytes), and a CONTROL token
    has none either unless the server runs with ``--special`` (``token_to_piece`` returns 0 for
    CONTROL|UNKNOWN when ``!special``; tools/server/server-context.cpp ``accept_special_token``).
    Random weights pick a padding token 62% of the time at 128,256 tokens, and pdscope counts a
    streamed chunk with empty text as no token (pdscope/client/record.py): TTFT and ITL would be
    wrong. CONTROL and USER_DEFINED tokens also join ``cache_special_tokens``, which every
    tokenization scans. A NORMAL ``<pad_N>`` prints its text, and text never tokenizes to it: no
    merge in the list builds it, and the ``smollm`` pre-tokenizer does not set ``ignore_merges``
    (the whole-word lookup of ``llm_tokenizer_bpe_session``)."""
    import gguf

    out: list[tuple[str, Any, Any, Any]] = []
    n_tokens = 0
    for key, value, vtype, sub in read_gguf_kv(source):
        if not key.startswith("tokenizer."):
            continue
        if key == "tokenizer.ggml.tokens":
            n_tokens = len(value)
        out.append((key, value, gguf.GGUFValueType(vtype),
                    None if sub is None else gguf.GGUFValueType(sub)))
    if n_tokens == 0:
        raise CheckError(f"{source} has no tokenizer.ggml.tokens")
    if vocab < n_tokens:
        raise CheckError(f"vocabulary {vocab} is smaller than the tokenizer's {n_tokens} tokens")
    pad = vocab - n_tokens
    fixed: list[tuple[str, Any, Any, Any]] = []
    for key, value, vtype, sub in out:
        if key == "tokenizer.ggml.tokens":
            value = [*value, *(f"<pad_{i}>" for i in range(n_tokens, vocab))]
        elif key == "tokenizer.ggml.token_type":
            value = [*value, *([int(gguf.TokenType.NORMAL)] * pad)]
        elif key == "tokenizer.ggml.scores":
            value = [*value, *([0.0] * pad)]
        fixed.append((key, value, vtype, sub))
    return fixed


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_gguf_kv(path: Path) -> list[tuple[str, Any, int, int | None]]:
    """The metadata of a GGUF file (v2 or v3) as (key, value, value type, array element type),
    read straight from its header: gguf.GGUFReader takes about 6 s over the 98,000 strings of a
    tokenizer, this a fraction of a second."""
    import struct

    with path.open("rb") as f:
        head = f.read(24)
        magic, version, _n_tensors, n_kv = struct.unpack("<IIQQ", head)
        if magic != 0x46554747 or version < 2:
            raise CheckError(f"{path} is not a GGUF v2/v3 file")
        # The metadata is small next to the tensors: 8 MB holds a 128k-token vocabulary.
        buf = f.read(64 << 20)
    pos = 0

    def scalar(fmt: str) -> Any:
        nonlocal pos
        (v,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v

    def string() -> str:
        nonlocal pos
        n = scalar("<Q")
        text = bytes(buf[pos:pos + n]).decode("utf-8", "surrogateescape")
        pos += n
        return text

    def value(vtype: int) -> Any:
        nonlocal pos
        if vtype == _STRING:
            return string()
        if vtype in _SCALARS:
            return scalar(_SCALARS[vtype])
        raise CheckError(f"{path}: unknown GGUF value type {vtype}")

    out: list[tuple[str, Any, int, int | None]] = []
    for _ in range(n_kv):
        key = string()
        vtype = scalar("<I")
        if vtype == _ARRAY:
            sub = scalar("<I")
            n = scalar("<Q")
            if sub in _SCALARS and sub != 7:
                size = struct.calcsize(_SCALARS[sub])
                items = list(struct.unpack_from(f"<{n}{_SCALARS[sub][1]}", buf, pos))
                pos += n * size
            else:
                items = [value(sub) for _ in range(n)]
            out.append((key, items, vtype, sub))
        else:
            out.append((key, value(vtype), vtype, None))
    return out


def bundled_gguf() -> Path:
    """The bundled SmolLM2 GGUF, whose tokenizer the random model borrows."""
    from pdscope.errors import PdscopeError
    from pdscope.lab.model import bundled_gguf as find

    try:
        return Path(find())
    except PdscopeError as exc:
        raise CheckError(f"no tokenizer to borrow: {exc}") from None


def write_tokenizer(source: Path, path: Path) -> int:
    """A GGUF of ``source``'s ``tokenizer.*`` keys alone, no tensors (about 2 MB for SmolLM2's):
    what ``--tokenizer`` takes on a machine where the 98 MB bundled model cannot travel."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tokenizer of " + source.name)
    for key, value, vtype, sub in read_gguf_kv(source):
        if key.startswith("tokenizer."):
            w.add_key_value(key, value, gguf.GGUFValueType(vtype),
                            sub_type=None if sub is None else gguf.GGUFValueType(sub))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path.stat().st_size


def write_gguf(path: Path, shape: Shape, precision: str, tokenizer: Path, seed: int = 0) -> int:
    """Writes the model, streamed: the header and tensor table first, then each tensor's bytes
    (repeated random blocks) straight to the file; memory holds one block per tensor shape.
    Returns the file's size."""
    import gguf
    import numpy as np

    qname, file_type = PRECISIONS[precision]
    qtype = gguf.GGMLQuantizationType[qname]
    tmp = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"random {shape.label} {precision} (pdscope gpu-check)")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(shape.vocab)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value, vtype, sub in padded_tokenizer(tokenizer, shape.vocab):
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, dims in shape.tensors():
        nbytes = tensor_bytes(dims, precision)
        if len(dims) == 1:
            w.add_tensor_info(name, dims, np.dtype(np.float32), nbytes)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor_info(name, dims, np.dtype(np.float16), nbytes)
        else:
            byte_shape = gguf.quant_shape_to_byte_shape(dims, qtype)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for _, data in random_tensors(shape, precision, seed):
            w.write_tensor_data(data)
        w.close()
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
    return path.stat().st_size


# --------------------------------------------------------------------------------------------
# The machine: its GPU, where to write, where llama-server is


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_cap: str
    memory_mib: int | None

    @property
    def cuda_arch(self) -> str:
        return cuda_arch(self.compute_cap)


def cuda_arch(compute_cap: str) -> str:
    """``nvidia-smi``'s compute capability as CMAKE_CUDA_ARCHITECTURES takes it: 9.0 -> 90."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", compute_cap)
    if not m:
        raise CheckError(f"nvidia-smi gave compute capability {compute_cap!r}, not N.N")
    return f"{int(m.group(1))}{int(m.group(2))}"


def find_gpu() -> Gpu:
    query = "--query-gpu=name,compute_cap,memory.total"
    try:
        done = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise CheckError(
            f"no NVIDIA GPU: nvidia-smi cannot run ({exc}); --cpu checks a CPU") from None
    if done.returncode != 0 or not done.stdout.strip():
        raise CheckError(f"no NVIDIA GPU: nvidia-smi {query} said {done.stderr.strip()!r}")
    first = [p.strip() for p in done.stdout.strip().splitlines()[0].split(",")]
    memory = int(float(first[2])) if len(first) > 2 and re.fullmatch(r"[\d.]+", first[2]) else None
    return Gpu(first[0], first[1] if len(first) > 1 else "", memory)


def device_id(gpu_name: str) -> str:
    """pdscope's id of the GPU nvidia-smi named (``NVIDIA H200`` -> ``h200``), exact names only:
    a wrong ceiling is worse than asking for ``--device``."""
    from pdscope.hardware import match_gpu_name

    spec = match_gpu_name(gpu_name)
    if spec is None:
        raise CheckError(f"pdscope's device table has no {gpu_name!r}: pass --device ID"
                         " (`pdscope devices` lists them)")
    return spec.id


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _available_ram() -> int:
    """MemAvailable in bytes (tmpfs pages are RAM: its size is a limit, not a reservation)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def pick_work_dir(wanted: Path | None, need_bytes: int) -> Path:
    """``--work``, else /dev/shm (RAM: the fastest place to write 16 GB and to load from) when it
    has room for the largest model and 20% to spare, and the RAM half as much again, else the
    cache folder on disk."""
    if wanted is not None:
        wanted.mkdir(parents=True, exist_ok=True)
        return wanted
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        try:
            free = shutil.disk_usage(shm).free
        except OSError:
            free = 0
        if free > need_bytes * 1.2 and _available_ram() > need_bytes * 1.5:
            folder = shm / "pdscope-gpu-check"
            folder.mkdir(exist_ok=True)
            return folder
    folder = CACHE / "models"
    folder.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(folder).free < need_bytes * 1.1:
        raise CheckError(f"{folder} has less than {need_bytes / 1e9:.1f} GB free: pass --work DIR")
    return folder


def llama_source(given: Path | None, extract_to: Path) -> Path:
    """The llama.cpp tree to build: ``--source`` (a llama.cpp tree, an unpacked sdist, the sdist
    or a folder holding it), else the sdist in the working tree (its root, shared/, tools/) or
    an earlier unpacking. There is no network on a GPU machine: fetch the sdist beforehand."""
    candidates: list[Path] = []
    if given is not None:
        candidates = [given, given / "vendor" / "llama.cpp", given / SDIST]
        if not given.exists():
            raise CheckError(f"--source {given}: no such file or folder")
    else:
        candidates = [REPO / SDIST, REPO / "shared" / SDIST, REPO / "tools" / SDIST,
                      extract_to / f"llama_cpp_python-{LLAMA_CPP_VERSION}" / "vendor" / "llama.cpp"]
    for c in candidates:
        if c.is_dir() and (c / "CMakeLists.txt").is_file() and (c / "tools" / "server").is_dir():
            return c
        if c.is_file() and c.name.endswith(".tar.gz"):
            member = f"llama_cpp_python-{LLAMA_CPP_VERSION}/vendor/llama.cpp"
            extract_to.mkdir(parents=True, exist_ok=True)
            subprocess.run(["tar", "-xzf", str(c), "-C", str(extract_to), member], check=True)
            return extract_to / member
    where = f"--source {given}" if given else f"{REPO} (its root, shared/ or tools/)"
    raise CheckError(
        f"no llama.cpp source in {where}: on a machine with network, run `{PIP_DOWNLOAD}` and "
        f"copy {SDIST} beside the repository, or pass --source DIR")


def cpu_cmake_args() -> list[str]:
    """tools/install-lab.sh's CPU flags for this CPU (AMX off on x86; its --print-cmake-args)."""
    done = subprocess.run(["bash", str(REPO / "tools" / "install-lab.sh"), "--print-cmake-args"],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def _cuda_major(nvcc: str) -> str | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.", out)
    return m.group(1) if m else None


def _site_dirs() -> list[Path]:
    """Where pip puts NVIDIA's wheels: this interpreter's path, the system ``python3``'s (on a
    CUDA image, the one that holds PyTorch and its nvidia-* wheels), the usual venvs."""
    dirs = [Path(p) for p in sys.path if p]
    try:
        out = subprocess.run(["python3", "-c", "import sys; print('\\n'.join(sys.path))"],
                             capture_output=True, text=True, timeout=60, check=False).stdout
        dirs += [Path(p) for p in out.splitlines() if p]
    except (OSError, subprocess.SubprocessError):
        pass
    for pattern in ("/opt/*/.venv/lib/python3*/site-packages", "/opt/*/lib/python3*/site-packages",
                    "/usr/local/lib/python3*/dist-packages", "/usr/lib/python3/dist-packages"):
        dirs += [Path(p) for p in sorted(Path("/").glob(pattern.lstrip("/")))]
    seen: list[Path] = []
    for d in dirs:
        if d.is_dir() and d not in seen:
            seen.append(d)
    return seen


def find_cublas(nvcc: str, given: Path | None) -> tuple[Path, Path] | None:
    """cuBLAS's (include, lib) folders where the CUDA toolkit lacks them, else ``None``.

    ggml-cuda links cuBLAS (ggml/src/ggml-cuda/CMakeLists.txt: CUDA::cublas). A toolkit made of
    NVIDIA's pip wheels (nvidia-cuda-nvcc and friends, as on this project's machines) has no
    cuBLAS unless the nvidia-cublas wheel sits in the same folder; PyTorch's venv usually has
    that wheel (nvidia/cu13/include/cublas_v2.h, nvidia/cu13/lib/libcublas.so.13)."""
    def usable(folder: Path) -> tuple[Path, Path] | None:
        inc, lib = folder / "include", folder / "lib"
        if (inc / "cublas_v2.h").is_file():
            for libdir in (lib, folder / "lib64"):
                if any(libdir.glob("libcublas.so*")) and any(libdir.glob("libcublasLt.so*")):
                    return inc, libdir
        return None

    if given is not None:
        found = usable(given)
        if found is None:
            raise CheckError(f"--cublas {given}: no include/cublas_v2.h with lib/libcublas.so*")
        return found
    roots = [Path(nvcc).resolve().parents[1]]
    roots += [Path(r) for r in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) if r]
    roots += [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"))]
    for root in roots:
        for inc in (root / "include", *root.glob("targets/*/include")):
            if (inc / "cublas_v2.h").is_file():
                return None  # the toolkit's own: FindCUDAToolkit finds it
    major = _cuda_major(nvcc)
    names = ([f"cu{major}"] if major else []) + ["cublas", "cu13", "cu12"]
    for site in _site_dirs():
        for name in names:
            found = usable(site / "nvidia" / name)
            if found is not None:
                return found
    return None


def find_libcuda() -> Path | None:
    """The driver's libcuda.so, which ggml-cuda links for its VMM memory pool: where ldconfig
    knows it, or in the usual driver folders (a container's /usr/local/nvidia/lib64 is not on
    CMake's search path)."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    hits = [Path(m) for m in re.findall(r"libcuda\.so(?:\.1)? \(.*x86-64.*\) => (\S+)", out)]
    for folder in ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu",
                   "/usr/lib64", "/usr/lib/wsl/lib"):
        hits += sorted(Path(folder).glob("libcuda.so*"))
    return next((h for h in hits if h.is_file()), None)


def build_server(source: Path, build_dir: Path, gpu: Gpu | None, jobs: int,
                 say: Callable[[str], None], cublas: Path | None = None) -> Path:
    """Builds the ``llama-server`` target (CUDA for ``gpu``'s architecture alone, or the CPU
    variant) unless the stamp says this build already is there."""
    args = [*CMAKE_FLAGS, *cpu_cmake_args()]
    if gpu is not None:
        nvcc = find_nvcc()
        if nvcc is None:
            raise CheckError("no nvcc (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): the CUDA"
                             " toolkit is needed to build llama-server for the GPU")
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={gpu.cuda_arch}",
                 f"-DCMAKE_CUDA_COMPILER={nvcc}"]
        found = find_cublas(nvcc, cublas)
        if found is not None:
            inc, lib = found
            say(f"cuBLAS from {inc.parent} (the CUDA toolkit has none)")
            args += [f"-DCUDA_cublas_LIBRARY={min(lib.glob('libcublas.so*'))}",
                     f"-DCUDA_cublasLt_LIBRARY={min(lib.glob('libcublasLt.so*'))}",
                     f"-DCMAKE_CUDA_FLAGS=-isystem {inc}"]
        libcuda = find_libcuda()
        if libcuda is not None:
            args.append(f"-DCUDA_cuda_driver_LIBRARY={libcuda}")
        else:
            # ggml-cuda links the driver only for its VMM pool; without it, the legacy pool
            # (ggml/src/ggml-cuda/CMakeLists.txt, GGML_CUDA_NO_VMM).
            say("no libcuda.so found to link: building with -DGGML_CUDA_NO_VMM=ON")
            args.append("-DGGML_CUDA_NO_VMM=ON")
    binary = build_dir / "bin" / "llama-server"
    stamp = build_dir / "gpu-check.stamp"
    want = f"{LLAMA_CPP_VERSION} {' '.join(args)}"
    if binary.is_file() and stamp.is_file() and stamp.read_text().strip() == want:
        say(f"reusing {binary} (stamp matches)")
        return binary
    build_dir.mkdir(parents=True, exist_ok=True)
    log = build_dir / "gpu-check-build.log"
    t0 = time.monotonic()
    with log.open("w") as out:
        cfg = subprocess.run(["cmake", "-S", str(source), "-B", str(build_dir), *args],
                             stdout=out, stderr=subprocess.STDOUT, check=False)
        if cfg.returncode != 0:
            hint = ""
            if "CUDA::cublas" in log.read_text(errors="replace"):
                hint = (" (this CUDA toolkit has no cuBLAS: llama.cpp's CUDA backend links it;"
                        " install the toolkit's cublas headers and libraries)")
            raise CheckError(f"cmake configure failed{hint}: {_tail(log)}")
        t1 = time.monotonic()
        say(f"configured in {t1 - t0:.0f} s: {' '.join(args)}")
        built = subprocess.run(["cmake", "--build", str(build_dir), "--target", "llama-server",
                                "-j", str(jobs)], stdout=out, stderr=subprocess.STDOUT,
                               check=False)
        if built.returncode != 0:
            raise CheckError(f"cmake --build failed: {_tail(log)}")
    say(f"built llama-server in {time.monotonic() - t1:.0f} s with -j {jobs}"
        f" ({time.monotonic() - t0:.0f} s with configure; log {log})")
    stamp.write_text(want + "\n")
    return binary


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {path})"
    return "\n".join(text[-lines:])


# --------------------------------------------------------------------------------------------
# llama-server and pdscope


class Server:
    """One llama-server, in a process group of its own, stopped on exit."""

    def __init__(self, binary: Path, model: Path, *, gpu: bool, slots: int, slot_ctx: int,
                 log: Path, threads: int | None = None) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log = log
        self.argv = [str(binary), "--model", str(model), "--alias", SERVED_NAME,
                     "--host", HOST, "--port", str(self.port), "--metrics",
                     "--parallel", str(slots), "--ctx-size", str(slots * slot_ctx)]
        if gpu:
            self.argv += ["--n-gpu-layers", "999"]
        if threads:
            self.argv += ["--threads", str(threads)]
        env = dict(os.environ)
        # As the lab does: ggml's OpenMP threads spinning between steps starve the client on a
        # small machine (src/pdscope/lab/engines.py).
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if gpu:
            # One GPU, the one nvidia-smi lists first and the ceilings are for: with several,
            # -ngl 999 would split the layers between them.
            env.setdefault("CUDA_VISIBLE_DEVICES", "0")
        self._out = log.open("w")
        self.proc = subprocess.Popen(self.argv, stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CheckError(
                    f"llama-server exited ({self.proc.returncode}):\n{_tail(self.log)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise CheckError(f"llama-server not ready after {timeout_s:.0f} s:\n{_tail(self.log)}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        self._out.close()


_MEASURED: dict[Any, Any] = {}
_MODELS: dict[tuple[str, int, int], Any] = {}


def measure_once(*, this_machine: bool) -> None:
    """What every pdscope command would redo, done once a run (the commands run in this
    process):

    * reading the model file: ``load_model`` on a GGUF goes through gguf.GGUFReader, 4-6 s for
      a 49,152-token vocabulary on a busy 2-core machine, twice a probe (the flag check, then the
      ceiling); the geometry is a function of the file, so it is kept by path, size and mtime;
    * with ``this_machine`` (``--cpu``, ``--device local``): measuring the CPU (memory
      bandwidth, a matmul), a second or more each time and a little different every time:
      measured once (:func:`best_cpu`), every row of the table stands beside the same ceiling.
      The CPU even where nvidia-smi finds a GPU, which pdscope's ``local`` would take: with
      ``--cpu`` the server runs on the CPU."""
    import pdscope.cli.model_args as model_args
    import pdscope.experiments.setup as setup
    import pdscope.hardware as hardware
    import pdscope.model as model

    real_load = model.load_model

    def load_once(path: Any, *a: Any, **kw: Any) -> Any:
        p = Path(path)
        if a or kw or not p.is_file():
            return real_load(path, *a, **kw)
        st = p.stat()
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
        if key not in _MODELS:
            _MODELS[key] = real_load(path)
        return _MODELS[key]

    for mod in (model, model_args, setup):
        mod.load_model = load_once  # type: ignore[attr-defined]
    if not this_machine:
        return

    def detect_once(probe_cpu: bool = True, matmul_shapes: Any = None) -> Any:
        # the signature of pdscope.hardware.detect_local_device; the shapes are the served
        # model's prefill matmuls, the same on every call of one run
        key = tuple(matmul_shapes) if matmul_shapes is not None else None
        if key not in _MEASURED:
            _MEASURED[key] = best_cpu(matmul_shapes)
        return _MEASURED[key]

    hardware.detect_local_device = detect_once
    setup.detect_local_device = detect_once


CPU_MEASUREMENTS = 3


def best_cpu(matmul_shapes: Any = None) -> Any:
    """This CPU measured :data:`CPU_MEASUREMENTS` times (about 1 s each) as pdscope measures it
    (``pdscope devices --probe``), its best bandwidth and best matmul kept: a neighbour busy
    during one measurement makes it read low (14 GB/s once here, 33-44 on a quiet machine), and a
    ceiling below what the memory can do puts a measured decode above it."""
    from pdscope.hardware import local_cpu_spec, probe_cpu_bandwidth
    from pdscope.hardware.measure import DEFAULT_SHAPES, best_cpu_matmul_tflops

    shapes = DEFAULT_SHAPES if matmul_shapes is None else matmul_shapes
    specs = [local_cpu_spec(probe_cpu_bandwidth(), *best_cpu_matmul_tflops(shapes))
             for _ in range(CPU_MEASUREMENTS)]
    best = max(specs, key=lambda s: s.mem_bandwidth_gb_s)
    flops = [s.bf16_tflops for s in specs if s.bf16_tflops is not None]
    return dataclasses.replace(
        best, bf16_tflops=max(flops) if flops else None,
        source=f"{best.source}; the best of {len(specs)} such measurements (tools/gpu_check.py)")


def pdscope(argv: Sequence[str], log: IO[str]) -> Any:
    """``pdscope ARGV`` in this process; its JSON. Its stderr (progress, warnings) goes to the
    log; a failure raises with the end of it."""
    from pdscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code) if isinstance(exc.code, int) else 1
    log.write(f"$ pdscope {shlex.join(argv)}\n{err.getvalue()}\n")
    log.flush()
    if code != 0:
        raise CheckError(f"pdscope {shlex.join(argv)} exited {code}:\n{err.getvalue()[-2000:]}")
    try:
        return json.loads(out.getvalue())
    except json.JSONDecodeError:
        raise CheckError(f"pdscope {argv[0]} printed no JSON:\n{out.getvalue()[-500:]}") from None


# --------------------------------------------------------------------------------------------
# The plan: what runs, how long, how it is reported


@dataclass(frozen=True)
class Plan:
    """The runs, sized for the budget (tools/gpu_check.sh's header says how)."""

    probe_short: int = 200
    probe_long: int = 2000
    probe_runs: int = 3
    probe_max_tokens: int = 128
    context_max_tokens: int = 256
    bench_users: tuple[int, ...] = (1, 8, 32)
    bench_duration_s: float = 5.0
    # Prompts a stage, at most: the 1-user stage ends at the duration, the 32-user one after two
    # rounds. (A closed-loop stage given only a duration makes 1,000 prompts ahead, each sized
    # by the server's tokenizer: 20 s of a tiny model's run on a CPU.)
    bench_prompts: int = 64
    bench_input: int = 512
    bench_output: int = 128
    slots: int = 32
    threads: int | None = None  # llama-server's --threads (None: its default, every core)

    @property
    def slot_ctx(self) -> int:
        """A slot's context: the long prompt and the most output asked, rounded up to 256."""
        need = max(self.probe_long + max(self.probe_max_tokens, self.context_max_tokens),
                   self.bench_input + self.bench_output) + 64
        return -(-need // 256) * 256


GPU_PLAN = Plan()
# On a CPU: one llama-server thread. ggml's threads meet at every op, so a step waits for the
# slowest; beside a busy neighbour on 2 cores, 2 threads decoded the tiny F16 model at 8 to 177
# tok/s from one request to the next, 1 thread at 49 to 96 (Q8_0 63 to 169), about 20 GB/s:
# one core already keeps the memory busy.
# The long prompt at 1,000 tokens: at 2,000 its three probes took 76 of the check's 186 s on a
# Xeon here (tests/lab/test_gpu_check.py runs it in every `make test`).
TINY_PLAN = Plan(probe_long=1000, probe_runs=3, probe_max_tokens=64, context_max_tokens=64,
                 bench_duration_s=2.0, bench_prompts=32, bench_input=64, bench_output=16,
                 threads=1)


class Progress:
    """``[gpu-check] 3/20 probe 2000 tokens, F16 ... 1.9 s (t=41 s)``: a step's line ends with
    its time; a note printed during the step breaks it, and the time comes on a line of its own
    (``[gpu-check] 1/20 build llama-server: 212.0 s (t=213 s)``)."""

    def __init__(self, total: int, stream: IO[str] | None = None) -> None:
        self.t0 = time.monotonic()
        self.total = total
        self.n = 0
        self.stream = stream or sys.stdout
        self._line_open = False  # the last line is a step's, waiting for its time

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _write(self, text: str) -> None:
        if self._line_open:
            self.stream.write("\n")
            self._line_open = False
        self.stream.write(text)
        self.stream.flush()

    def say(self, msg: str) -> None:
        self._write(f"{TAG}   {msg}\n")

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        self.n += 1
        label = f"{TAG} {self.n}/{self.total} {what}"
        start = time.monotonic()
        self._write(label + " ...")
        self._line_open = True
        try:
            yield
        except BaseException:
            self._end(label, f"failed after {time.monotonic() - start:.1f} s")
            raise
        self._end(label, f"{time.monotonic() - start:.1f} s (t={self.elapsed():.0f} s)")

    def _end(self, label: str, text: str) -> None:
        if self._line_open:  # nothing came between: the time ends the step's line
            self._line_open = False
            self._write(f" {text}\n")
        else:
            self._write(f"{label}: {text}\n")

    def skip(self, what: str, why: str, steps: int = 1) -> None:
        """``steps`` steps not run, on one line."""
        if steps < 1:
            return
        first, self.n = self.n + 1, self.n + steps
        numbers = f"{first}" if steps == 1 else f"{first}-{self.n}"
        self._write(f"{TAG} {numbers}/{self.total} {what}: {why}\n")


STEPS_PER_PRECISION = 6


def run_precision(precision: str, *, shape: Shape, plan: Plan, binary: Path, work: Path,
                  device: str, gpu: bool, progress: Progress, log: IO[str], keep: bool,
                  tokenizer: Path) -> dict[str, Any]:
    """One precision: the GGUF, a server on it, the four pdscope runs, the ceilings."""
    result: dict[str, Any] = {"precision": precision}
    model = work / f"{shape.name}-{precision}.gguf"
    stamp = model.with_suffix(".json")
    want = {"shape": shape.name, "precision": precision, "parameters": shape.parameters,
            "generator": 1}
    server: Server | None = None
    first_step = progress.n
    try:
        with progress.step(f"write GGUF {precision} ({gguf_size(shape, precision) / 1e9:.2f} GB,"
                           f" {shape.label}) to {work}"):
            old = _read_json(stamp)
            if old == want and model.is_file():
                result["reused_gguf"] = True
            else:
                stamp.unlink(missing_ok=True)
                write_gguf(model, shape, precision, tokenizer)
                stamp.write_text(json.dumps(want))
            result["file_bytes"] = model.stat().st_size
        with progress.step(f"start llama-server, {precision}"):
            server = Server(binary, model, gpu=gpu, slots=plan.slots, slot_ctx=plan.slot_ctx,
                            log=work / f"llama-server-{precision}.log", threads=plan.threads)
            result["server_argv"] = server.argv
            server.wait_ready(600 if gpu else 120)
        common = ["--json", "--device", device, "--model-config", str(model), "--seed", "1"]
        url = server.url
        for n in (plan.probe_short, plan.probe_long):
            with progress.step(f"probe {n} tokens, {precision}"):
                result[f"probe_{n}"] = pdscope(
                    ["probe", url, *common, "--prompt-tokens", str(n), "--runs",
                     str(plan.probe_runs), "--max-tokens", str(plan.probe_max_tokens)], log)
        with progress.step(f"context {plan.probe_short},{plan.probe_long} tokens, {precision}"):
            result["context"] = pdscope(
                ["context", url, *common, "--prompt-tokens",
                 f"{plan.probe_short},{plan.probe_long}", "--max-tokens",
                 str(plan.context_max_tokens), "--bin-tokens", "32"], log)
        users = ",".join(map(str, plan.bench_users))
        with progress.step(f"bench {users.replace(',', '/')} users, {precision}"):
            stages = pdscope(
                ["bench", url, "--json", "--seed", "1", "--concurrency", users,
                 "--duration", f"{plan.bench_duration_s:g}", "--num-prompts",
                 str(plan.bench_prompts), "--input-len", str(plan.bench_input),
                 "--output-len", str(plan.bench_output), "--out", str(work / f"bench-{precision}")],
                log)
            stages = stages if isinstance(stages, list) else [stages]
            result["bench"] = {str(s["stage"]["concurrency"]): _bench_stage(s) for s in stages}
            # The batched roofline at the most users, at the bench's mean context.
            top = max(plan.bench_users)
            ceiling = pdscope(["ceiling", "--model", str(model), "--device", device, "--json",
                               "--batch", str(top), "--context",
                               str(plan.bench_input + plan.bench_output // 2)], log)
            result["bench_ceiling"] = {str(top): ceiling[0].get("batch_throughput_tok_s")}
    except (CheckError, OSError) as exc:
        result["error"] = str(exc)
        progress.say(f"{precision}: {exc}")
        progress.skip(precision, "not run after the failure above",
                      STEPS_PER_PRECISION - (progress.n - first_step))
    finally:
        if server is not None:
            server.stop()
        if not keep:
            model.unlink(missing_ok=True)
            stamp.unlink(missing_ok=True)
    return result


def _bench_stage(s: dict[str, Any]) -> dict[str, Any]:
    keys = ("output_throughput", "completed", "failed", "median_ttft_ms", "median_tpot_ms")
    return {k: s.get(k) for k in keys}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def references(device: str, prompt_tokens: int, log: IO[str]) -> dict[str, Any]:
    """The article's line (8B at 16 bits on an H100 SXM) and the same roofline on the device."""
    out: dict[str, Any] = {}
    for key, dev in (("article", ARTICLE_DEVICE), ("device", device)):
        row = pdscope(["ceiling", "--params", "8e9", "--dtype", "fp16", "--device", dev,
                       "--prompt-tokens", str(prompt_tokens), "--json"], log)[0]
        out[key] = {"device": row.get("device"), "device_id": row.get("device_id"),
                    "decode_ceiling_tok_s": row.get("decode_ceiling_tok_s_exact"),
                    "prefill_ceiling_tok_s": row.get("prefill_ceiling_tok_s"),
                    "mem_bandwidth_gb_s": row.get("mem_bandwidth_gb_s")}
    return out


# --------------------------------------------------------------------------------------------
# The table

def columns(plan: Plan) -> list[str]:
    short, long = plan.probe_short, plan.probe_long
    users = "/".join(map(str, plan.bench_users))
    return [
        "precision", "GB read a token",
        f"decode tok/s @{short}", f"decode ceiling @{short}", f"decode/ceiling @{short}",
        f"decode tok/s @{long}", f"decode/ceiling @{long}",
        f"prefill tok/s @{short}", f"prefill tok/s @{long}", f"prefill ceiling @{long}",
        f"prefill/ceiling @{long}",
        f"context {short}→{long}: decode slowdown (predicted)",
        f"bench out tok/s, {users} users", f"ceiling @{max(plan.bench_users)} users",
        "decode vs F16 (ceiling)",
    ]


def _num(x: Any, digits: int = 0) -> str:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        return "—"
    return f"{x:,.{digits}f}"


def _pct(x: Any) -> str:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        return "—"
    return f"{100 * x:.0f}%"


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def table(results: Sequence[dict[str, Any]], refs: dict[str, Any], plan: Plan) -> str:
    """One Markdown table: a row per precision, then the article's line and the same roofline
    (8B at 16 bits) on the device measured."""
    cols = columns(plan)
    short, long = f"probe_{plan.probe_short}", f"probe_{plan.probe_long}"
    base = next((r for r in results if r["precision"] == "F16" and not r.get("error")
                 and not r.get("skipped")), None)
    rows: list[list[str]] = []
    for r in results:
        if r.get("skipped") or r.get("error"):
            why = r.get("skipped") or "failed: " + str(r["error"]).splitlines()[0]
            rows.append([r["precision"], *(["—"] * (len(cols) - 2)), why.replace("|", "/")])
            continue
        p, q, c = r.get(short, {}), r.get(long, {}), r.get("context", {})
        users = "/".join(_num(_get(r, "bench", str(u), "output_throughput"))
                         for u in plan.bench_users)
        ratio = "1.00×"
        if base is not None and r is not base:
            m = _ratio(p.get("decode_tok_s"), _get(base, short, "decode_tok_s"))
            ceil = _ratio(p.get("decode_ceiling_tok_s"), _get(base, short, "decode_ceiling_tok_s"))
            ratio = f"{_num(m, 2)}× ({_num(ceil, 2)}×)"
        elif base is None:
            ratio = "—"
        rows.append([
            r["precision"],
            _num(_gb(p.get("weight_bytes_read_per_token")), 2),
            _num(p.get("decode_tok_s"), 1),
            _num(p.get("decode_ceiling_tok_s"), 1),
            _pct(p.get("decode_fraction_of_ceiling")),
            _num(q.get("decode_tok_s"), 1),
            _pct(q.get("decode_fraction_of_ceiling")),
            _num(p.get("prefill_tok_s")),
            _num(q.get("prefill_tok_s")),
            _num(q.get("prefill_ceiling_tok_s")),
            _pct(q.get("prefill_fraction_of_ceiling")),
            f"{_pct(c.get('slowdown'))} ({_pct(c.get('slowdown_predicted'))})",
            users,
            _num(_get(r, "bench_ceiling", str(max(plan.bench_users)))),
            ratio,
        ])
    for key, label in (("article", "article: 8B at 16 bits"),
                       ("device", "roofline: 8B at 16 bits")):
        ref = refs.get(key)
        if not ref:
            continue
        decode = _num(ref.get("decode_ceiling_tok_s"), 1)
        if key == "article":
            decode += f" ({ARTICLE_TOK_S} in the article's table)"
        row = [f"{label}, {ref['device']}", "16.00", "—", decode, *(["—"] * (len(cols) - 4))]
        row[cols.index(f"prefill ceiling @{plan.probe_long}")] = _num(
            ref.get("prefill_ceiling_tok_s"))
        rows.append(row)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def _gb(x: Any) -> float | None:
    return x / 1e9 if isinstance(x, (int, float)) else None


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
        return float(a) / float(b)
    return None


def parse_table(markdown: str) -> dict[str, dict[str, str]]:
    """Rows of :func:`table`'s output by their first cell, each a {column: cell} dict."""
    rows: dict[str, dict[str, str]] = {}
    header: list[str] | None = None
    for line in markdown.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        rows[cells[0]] = dict(zip(header, cells, strict=False))
    return rows


def first_number(cell: str) -> float | None:
    m = re.search(r"-?[\d,]*\.?\d+", cell)
    return float(m.group(0).replace(",", "")) if m else None


def server_version(binary: Path) -> str:
    """``llama-server --version``'s version line (``version: 0.5.0-dev (build 1, commit
    0c1e570)`` for the llama.cpp of llama-cpp-python 0.3.36)."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return "version unknown"
    lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines()
             if ln.startswith(("version:", "built with"))]
    return ", ".join(lines) or "version unknown"


def describe(shape: Shape, plan: Plan, refs: dict[str, Any], where: str, binary: Path,
             elapsed_s: float) -> str:
    """The line above the table: what ran, on what, how long."""
    measured = _get(refs, "device", "device")
    if where == "this CPU" and measured:
        where = f"this CPU, {measured}"
    threads = f", --threads {plan.threads}" if plan.threads else ""
    return (
        f"{shape.label} with random weights ({shape.parameters / 1e9:.2f} B parameters) on"
        f" {where}; {binary} ({server_version(binary)}),"
        f" {plan.slots} slots{threads}. probe: {plan.probe_runs} runs of"
        f" {plan.probe_max_tokens} tokens at {plan.probe_short} and {plan.probe_long} prompt"
        f" tokens; context: {plan.context_max_tokens} tokens out; bench: closed loop,"
        f" {plan.bench_prompts} requests or {plan.bench_duration_s:g} s a stage,"
        f" {plan.bench_input} tokens in, {plan.bench_output} out. {elapsed_s:.0f} s in all.")


# --------------------------------------------------------------------------------------------
# main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="tools/gpu_check.sh",
        description="llama-server on a random-weight Llama-3-8B at F16, Q8_0 and Q4_0 on this"
                    " machine's NVIDIA GPU, measured by pdscope against the ceilings, in one"
                    " Markdown table.")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (no -ngl; device local)")
    ap.add_argument("--tiny", action="store_true",
                    help="a tiny shape (4 layers, hidden 1024, 49,152 tokens) and short runs")
    ap.add_argument("--server", type=Path, help="a llama-server to use instead of building one")
    ap.add_argument("--build", action="store_true",
                    help="with --cpu: build llama-server even where one is found")
    ap.add_argument("--source", type=Path,
                    help=f"llama.cpp source: {SDIST}, a folder holding it, or an unpacked tree")
    ap.add_argument("--cublas", type=Path,
                    help="a folder with include/cublas_v2.h and lib/libcublas.so*, where the CUDA"
                         " toolkit has none (default: searched, e.g. PyTorch's nvidia/cu13)")
    ap.add_argument("--build-dir", type=Path, help=f"build folder (default {CACHE}/build-VARIANT)")
    ap.add_argument("--work", type=Path,
                    help="where the GGUFs, logs and bench runs go (default /dev/shm when it has"
                         f" room, else {CACHE}/models)")
    ap.add_argument("--out", type=Path, default=Path("gpu-check.md"),
                    help="the table's file (default gpu-check.md); the raw results go beside it"
                         " with .json")
    ap.add_argument("--precisions", default="F16,Q8_0,Q4_0",
                    help="comma-separated, from F16, Q8_0, Q4_0 (default all three)")
    ap.add_argument("--device", help="pdscope's device id (default: the GPU nvidia-smi names;"
                                     " local with --cpu)")
    ap.add_argument("--budget", type=float, default=BUDGET_S,
                    help="seconds: a precision after the second is skipped when it would end past"
                         f" this (default {BUDGET_S:.0f})")
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                    help="build jobs (default: the cores)")
    ap.add_argument("--threads", type=int,
                    help="llama-server's --threads (default: its own, every core; 1 with --cpu"
                         " --tiny)")
    ap.add_argument("--tokenizer", type=Path,
                    help="a GGUF whose tokenizer the random model borrows (default: the bundled"
                         " SmolLM2-135M's; --write-tokenizer makes a small one to carry)")
    ap.add_argument("--write-tokenizer", type=Path, metavar="PATH",
                    help="write the bundled model's tokenizer alone (about 2 MB) to PATH and exit")
    ap.add_argument("--keep", action="store_true", help="keep the GGUFs (a rerun reuses them)")
    args = ap.parse_args(argv)
    names = list(dict.fromkeys(p.strip().upper() for p in args.precisions.split(",") if p.strip()))
    bad = [p for p in names if p not in PRECISIONS]
    if bad or not names:
        ap.error(f"--precisions: {', '.join(bad) or 'none given'}; choose from "
                 f"{', '.join(PRECISIONS)}")
    args.precisions = names
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.write_tokenizer is not None:
        try:
            size = write_tokenizer(args.tokenizer or bundled_gguf(), args.write_tokenizer)
        except CheckError as exc:
            print(f"{TAG} error: {exc}", file=sys.stderr)
            return 1
        print(f"{TAG} wrote {args.write_tokenizer} ({size / 1e6:.1f} MB)")
        return 0
    shape = TINY if args.tiny else LLAMA3_8B
    plan = TINY_PLAN if args.tiny else GPU_PLAN
    if args.threads is not None:
        plan = dataclasses.replace(plan, threads=args.threads)
    total = 1 + STEPS_PER_PRECISION * len(args.precisions) + 1
    progress = Progress(total)
    try:
        return _run(args, shape, plan, progress)
    except CheckError as exc:
        progress.say(f"error: {exc}")
        return 1


def _run(args: argparse.Namespace, shape: Shape, plan: Plan, progress: Progress) -> int:
    gpu = None if args.cpu else find_gpu()
    device = args.device or ("local" if gpu is None else device_id(gpu.name))
    largest = max(gguf_size(shape, p) for p in args.precisions)
    work = pick_work_dir(args.work, largest)
    variant = "cpu" if gpu is None else f"cuda{gpu.cuda_arch}"
    where = "this CPU" if gpu is None else f"{gpu.name} (sm_{gpu.cuda_arch}, {device})"
    progress.say(f"{shape.label}, {shape.parameters / 1e9:.2f} B parameters, on {where};"
                 f" models in {work}; budget {args.budget:.0f} s")
    # Before the build: a missing tokenizer fails in a second, not after minutes.
    tokenizer = args.tokenizer or bundled_gguf()
    if not tokenizer.is_file():
        raise CheckError(f"--tokenizer {tokenizer}: no such file")
    measure_once(this_machine=gpu is None)

    binary: Path | None = args.server
    if binary is None and gpu is None and not args.build:
        venv_server = Path(sys.prefix) / "bin" / "llama-server"
        binary = venv_server if venv_server.is_file() else None
    if binary is not None:
        if not binary.is_file():
            raise CheckError(f"--server {binary}: no such file")
        progress.skip("build llama-server", f"not needed, using {binary}")
    else:
        build_dir = args.build_dir or CACHE / f"build-{variant}"
        with progress.step(f"build llama-server ({variant}, -j {args.jobs})"):
            source = llama_source(args.source, CACHE / "src")
            binary = build_server(source, build_dir, gpu, args.jobs, progress.say, args.cublas)

    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = work / "pdscope.log"
    results: list[dict[str, Any]] = []
    durations: list[float] = []
    with log_path.open("w") as log:
        for i, precision in enumerate(args.precisions):
            if i >= 2 and durations:
                need = durations[-1] * gguf_size(shape, precision) / gguf_size(
                    shape, args.precisions[i - 1])
                need = max(need, 0.6 * durations[-1])
                if progress.elapsed() + need > args.budget:
                    why = (f"skipped: {progress.elapsed():.0f} s + ~{need:.0f} s would pass the"
                           f" {args.budget:.0f} s budget")
                    progress.skip(precision, why, STEPS_PER_PRECISION)
                    results.append({"precision": precision, "skipped": why})
                    continue
            t0 = time.monotonic()
            results.append(run_precision(
                precision, shape=shape, plan=plan, binary=binary, work=work, device=device,
                gpu=gpu is not None, progress=progress, log=log, keep=args.keep,
                tokenizer=tokenizer))
            durations.append(time.monotonic() - t0)
        with progress.step("ceilings and table"):
            refs = references(device, plan.probe_long, log)
            text = table(results, refs, plan)
    head = describe(shape, plan, refs, where, binary, progress.elapsed())
    document = head + "\n\n" + text + "\n"
    out.write_text(document)
    out.with_suffix(".json").write_text(json.dumps(
        {"shape": shape.__dict__, "plan": plan.__dict__, "device": device, "where": where,
         "elapsed_s": progress.elapsed(), "results": results, "references": refs}, indent=1,
        default=str))
    print()
    print(document)
    progress.say(f"wrote {out} and {out.with_suffix('.json')} in {progress.elapsed():.0f} s")
    failed = [r["precision"] for r in results if r.get("error")]
    if failed:
        progress.say(f"failed: {', '.join(failed)} (see {work}/llama-server-*.log, {log_path})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
