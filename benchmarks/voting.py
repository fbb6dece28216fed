"""Voting speed and peak memory: dpsynth's blocked Top-Q voting vs a naive full-distance-matrix version.

    .venv/bin/python benchmarks/voting.py                      # M=10,000 x N=100,000 x 384 (about 2-4 min)
    .venv/bin/python benchmarks/voting.py --m 2000 --n 20000   # quick
    .venv/bin/python benchmarks/voting.py --m 100000 --n 1000000 --no-naive   # the issue's large scale
      (the naive full matrix would need ~100 GB there: dpsynth alone, against the machine's limit,
      with its peak resident memory)

Both run in this process on the same random embeddings (unit-normalised, 2 labels) and must
give the same histograms (up to float32 near-ties); the output is the ratio of wall time and of peak traced memory
(numpy allocations are visible to tracemalloc), and the time against the machine's limit: the
distance arithmetic (2 x d per same-label pair) at the float32 matmul peak measured in the same run.
Absolute times on shared machines are noise.
"""

from __future__ import annotations

import argparse
import gc
import resource
import time
import tracemalloc

import numpy as np
from machine_limits import matmul_peak

from dpsynth.voting.rank_votes import decaying_weights, wasp_votes


def naive_wasp_votes(private, p_labels, synthetic, s_labels, q):
    """The straightforward way: the full distance matrix per label, then top-Q from it."""
    w = np.asarray(decaying_weights(q))
    near = np.zeros(len(synthetic))
    far = np.zeros(len(synthetic))
    for label in np.unique(p_labels):
        cand = np.flatnonzero(s_labels == label)
        p, s = private[p_labels == label], synthetic[cand]
        dist = np.sqrt(np.maximum((p * p).sum(1)[:, None] + (s * s).sum(1)[None, :] - 2 * p @ s.T, 0))
        for hist, sign in ((near, 1), (far, -1)):
            part = np.argpartition(sign * dist, q - 1, axis=1)[:, :q]
            order = np.argsort(np.take_along_axis(sign * dist, part, axis=1), axis=1, kind="stable")
            top = np.take_along_axis(part, order, axis=1)
            np.add.at(hist, cand[top], np.broadcast_to(w, top.shape))
            del part, order, top
        del dist
    return np.concatenate([near, far])


def measure(fn, *args):
    gc.collect()
    tracemalloc.start()
    start = time.perf_counter()
    out = fn(*args)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", type=int, default=10_000)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--q", type=int, default=8)
    parser.add_argument("--no-naive", action="store_true", help="skip the full-matrix baseline (too big at scale)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    def unit(rows: int) -> np.ndarray:
        x = rng.normal(size=(rows, args.dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    private, synthetic = unit(args.m), unit(args.n)
    pl, sl = rng.integers(0, 2, args.m), rng.integers(0, 2, args.n)
    ours, t_ours, mem_ours = measure(wasp_votes, private, pl, synthetic, sl, args.q)
    if args.no_naive:
        inputs = (private.nbytes + synthetic.nbytes) / 2**20
        print(f"voting M={args.m} x N={args.n} x d={args.dim}, Q={args.q}: dpsynth (blocked) {t_ours:.1f} s, "
              f"peak traced {mem_ours / 2**20:.1f} MiB beyond the {inputs:.0f} MiB of embeddings, peak resident "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB (whole process)")
        _limit(args, pl, sl, t_ours)
        return
    naive, t_naive, mem_naive = measure(naive_wasp_votes, private, pl, synthetic, sl, args.q)
    # Near-ties between float32 distances (computed two ways) may swap ranks: allow a tiny share.
    moved = np.abs(ours - naive).sum() / (2 * naive.sum())
    same = np.isclose(ours.sum(), naive.sum()) and moved < 1e-3
    print(f"voting M={args.m} x N={args.n} x d={args.dim}, Q={args.q}; vote mass moved by float near-ties: "
          f"{moved:.2e} (agree: {same})")
    print(f"  naive full matrix: {t_naive:8.2f} s, peak {mem_naive / 2**20:9.1f} MiB")
    print(f"  dpsynth (blocked): {t_ours:8.2f} s, peak {mem_ours / 2**20:9.1f} MiB")
    print(f"  speed-up {t_naive / t_ours:.2f}x, memory ratio {mem_naive / mem_ours:.1f}x less")
    _limit(args, pl, sl, t_ours)
    if not same:
        raise SystemExit("histograms differ")


def _limit(args: argparse.Namespace, pl: np.ndarray, sl: np.ndarray, seconds: float) -> None:
    """The arithmetic every exact method must do: one distance per (private, same-label synthetic) pair."""
    flops = 2 * args.dim * sum(int((pl == c).sum()) * int((sl == c).sum()) for c in np.unique(pl))
    peak = matmul_peak(2048)
    print(f"  limit: {flops / 1e9:.0f} GFLOP of distances at the measured float32 matmul peak {peak / 1e9:.0f} GFLOP/s "
          f"= {flops / peak:.2f} s; dpsynth takes {seconds / (flops / peak):.2f}x that (the rest is top-Q selection)")


if __name__ == "__main__":
    main()
