"""Cost of SecAgg+ against plain summation, on the same Flower federation and the same votes.

    .venv/bin/python benchmarks/secure_aggregation.py                        # L=10, N=120 candidates
    .venv/bin/python benchmarks/secure_aggregation.py --parties 3 --rounds 2 # quick

Each mode starts one Flower simulation of L parties (30 private records each, 384-d
embeddings) and runs `--rounds` WASP vote rounds (votes of length 2N) and then as many
Pre-Text rounds (length N). Reported per party and round: bytes downloaded (candidates'
embeddings plus protocol messages) and uploaded, and wall seconds of the round after the
first (the first pays for starting the parties' processes); then the SecAgg+ / plain
ratios. Absolute times on shared machines are noise; the ratios are the result.
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from dpsynth.federated.flower_secagg import FederationSettings, VoteRound, run_federation
from dpsynth.federated.party import PartyShard
from dpsynth.voting.spec import VoteSpec


def measure(secure: bool, parties: int, candidates: int, rounds: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    shards = [PartyShard(i, rng.normal(size=(30, 384)).astype(np.float32), rng.integers(0, 2, 30))
              for i in range(parties)]
    cand = rng.normal(size=(candidates, 384)).astype(np.float32)
    labels = rng.integers(0, 2, candidates)
    settings = FederationSettings(parties=parties, min_parties=parties if secure else 1, secure=secure,
                                  max_records=30, timeout=300)

    def program(aggregator):
        out = {}
        for name, spec in (("wasp", VoteSpec(kind="wasp", q=8)), ("pretext", VoteSpec(kind="rank"))):
            results = [aggregator.aggregate(VoteRound(f"{name}.votes.{r}", spec, cand, labels, 1.0, clip=80.0))
                       for r in range(rounds)]
            steady = results[1:] if name == "wasp" and rounds > 1 else results
            out[name] = {
                "down": float(np.mean([np.mean(list(r.bytes_down.values())) for r in results])),
                "up": float(np.mean([np.mean(list(r.bytes_up.values())) for r in results])),
                "seconds": float(np.mean([r.seconds for r in steady])),
            }
        return out

    return run_federation(shards, settings, program)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parties", type=int, default=10)
    ap.add_argument("--candidates", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    secure = measure(True, args.parties, args.candidates, args.rounds)
    plain = measure(False, args.parties, args.candidates, args.rounds)
    print(f"L={args.parties} parties, N={args.candidates} candidates (384-d), {args.rounds} rounds per method")
    print(f"{'':>8} {'mode':>8} {'down B/party':>13} {'up B/party':>11} {'s/round':>8}")
    for name in ("wasp", "pretext"):
        for mode, res in (("secagg+", secure), ("plain", plain)):
            r = res[name]
            print(f"{name:>8} {mode:>8} {r['down']:>13.0f} {r['up']:>11.0f} {r['seconds']:>8.2f}")
        s, p = secure[name], plain[name]
        print(f"{name:>8} {'ratio':>8} {s['down'] / p['down']:>13.2f} {s['up'] / p['up']:>11.2f} "
              f"{s['seconds'] / p['seconds']:>8.2f}")
    w, t = secure["wasp"], secure["pretext"]
    print(f"WASP / Pre-Text under SecAgg+: download {w['down'] / t['down']:.2f}x, upload {w['up'] / t['up']:.2f}x")


if __name__ == "__main__":
    main()
