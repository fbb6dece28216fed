#!/usr/bin/env bash
# A real Flower deployment on this machine: one SuperLink, one SuperNode process per party
# file, and `flwr run` of dpsynth's Flower app (deploy/flower). The same commands, with real
# host names and TLS instead of --insecure, run the parties on separate machines.
#
#   scripts/federated_loopback.sh RUN.yaml OUT_DIR party0.csv party1.csv party2.csv ...
#   STRONG_PARTIES="0 1" scripts/federated_loopback.sh ...   (method fedgen: parties 0 and 1 train)
#   PARTY_EPSILON=8 scripts/federated_loopback.sh ...         (each party refuses answers past epsilon 8 over
#                                                              every run on its file; its ledger: FILE.privacy-ledger.json)
#   PARTY_TRUSTED=2 scripts/federated_loopback.sh ...         (each party counts at most 2 noise shares in a sum,
#                                                              whatever the server's min_parties says)
#
# RUN.yaml must use `federated: {partition: nodes, parties: <number of files>}` and give task.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 RUN.yaml OUT_DIR party0.csv party1.csv [...]" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUN_YAML=$(realpath "$1"); OUT=$(realpath -m "$2"); shift 2
V="$ROOT/.venv/bin"
export PATH="$V:$PATH" FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_HOME=${FLWR_HOME:-$(mktemp -d)}
LOGS="$OUT.logs"; mkdir -p "$LOGS"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "loopback"

[superlink.loopback]
address = "127.0.0.1:8000"
insecure = true
TOML
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null || true; }
trap cleanup EXIT
flower-superlink --insecure --disable-runtime-dependency-installation --host 127.0.0.1 --port 8000 \
  > "$LOGS/superlink.log" 2>&1 &
PIDS+=($!)
sleep 8
i=0
for party in "$@"; do
  extra=""  # fedgen: STRONG_PARTIES="0 1" makes those parties training parties
  for s in ${STRONG_PARTIES:-}; do if [ "$s" = "$i" ]; then extra=' role="strong"'; fi; done
  [ -z "${PARTY_EPSILON:-}" ] || extra="$extra epsilon=$PARTY_EPSILON"
  [ -z "${PARTY_TRUSTED:-}" ] || extra="$extra trusted-parties=$PARTY_TRUSTED"
  flower-supernode --insecure --superlink 127.0.0.1:8000 --host 127.0.0.1 --port $((9094 + i)) \
    --node-config "data-path=\"$(realpath "$party")\" party-id=$i$extra" > "$LOGS/supernode$i.log" 2>&1 &
  PIDS+=($!)
  i=$((i + 1))
done
sleep 8
cd "$ROOT"
flwr run deploy/flower loopback --stream --run-config "config=\"$RUN_YAML\" out=\"$OUT\"" > "$LOGS/run.log" 2>&1
# `flwr run` exits 0 even when the ServerApp raised: judge by the outputs.
if [ -f "$OUT/privacy.json" ] && [ -f "$OUT/synthetic.jsonl" ]; then
  echo "done: $OUT (logs in $LOGS)"
else
  echo "the federated run failed; see $LOGS/run.log" >&2
  tail -20 "$LOGS/run.log" >&2
  exit 1
fi
