"""Each generation window of an `api_scale.py` run, from the loopback server's request log: where its time went.

    .venv/bin/python benchmarks/server_timeline.py OUT/server-log           # a device call's folder
    .venv/bin/python benchmarks/server_timeline.py /tmp/log --k 6 --n 600   # one cell

Why: `api_scale.py` prints a cell's totals (slots busy, time before the first request, after the last answer);
a small cell's gap to the latency bound is a fixed cost of every iteration, and which part of an iteration holds
it (the run before its first request, the requests of a round reaching the server one after another, the run
after its last answer) is what a fix has to shorten. The log is the server's (`api_scale.serve`: each request's
model, arrival and answer time on CLOCK_MONOTONIC, which the run's generation windows in cells.jsonl share), so
the figures are the server's view, not the client's. Reads server-*.txt or requests.txt.gz (device_scale.sh packs
the log into one file). Printed per window, in ms from its start: the first request's arrival, the last
arrival of the first round (each generator's first `--concurrency` requests, the slowest generator), the last
answer, and the window's end, and the window against its latency bound (the busiest generator's rounds of
`--latency` s); then per cell the medians over its windows.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path


def read_log(folder: Path) -> list[tuple[str, float, float]]:
    """(model, arrival, answer) of every request the server logged."""
    lines: list[str] = []
    for path in sorted(folder.glob("server-*.txt")):
        lines += path.read_text().splitlines()
    packed = folder / "requests.txt.gz"
    if packed.exists():
        lines += gzip.decompress(packed.read_bytes()).decode().splitlines()
    rows = [line.split() for line in lines]
    return [(r[0], float(r[1]), float(r[2])) for r in rows if len(r) == 3]


def window_timeline(requests: list[tuple[str, float, float]], start: float, end: float,
                    concurrency: int, latency: float) -> dict[str, float] | None:
    """ms from the window's start: first arrival, the first round's last arrival, the last answer, the end; and the
    window against its latency bound (the busiest generator's ceil(requests / concurrency) rounds)."""
    inside = [(m, a, d) for m, a, d in requests if start <= a <= end]
    if not inside:
        return None
    by_model: dict[str, list[float]] = {}
    for model, arrival, _ in inside:
        by_model.setdefault(model, []).append(arrival)
    first_round = max(sorted(arrivals)[:concurrency][-1] for arrivals in by_model.values())
    bound = max(-(-len(arrivals) // concurrency) for arrivals in by_model.values()) * latency
    return {"first": (min(a for _, a, _ in inside) - start) * 1e3, "round": (first_round - start) * 1e3,
            "answer": (max(d for _, _, d in inside) - start) * 1e3, "end": (end - start) * 1e3,
            "ratio": (end - start) / bound}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path,
                        help="the server-log folder (server-*.txt or requests.txt.gz, and cells.jsonl)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight per generator in the run")
    parser.add_argument("--latency", type=float, default=0.2, help="the server's latency in the run (s)")
    parser.add_argument("--k", type=int, help="only the cells with this K")
    parser.add_argument("--n", type=int, help="only the cells with this N")
    args = parser.parse_args()
    requests = read_log(args.folder)
    keys = ("first", "round", "answer", "end", "ratio")
    for line in (args.folder / "cells.jsonl").read_text().splitlines():
        cell = json.loads(line)
        if (args.k and cell["k"] != args.k) or (args.n and cell["n"] != args.n):
            continue
        print(f"K={cell['k']} N={cell['n']}: ms from each generation window's start")
        print("| window | first request | first round's last request | last answer | end | / latency bound |")
        print("|---|---|---|---|---|---|")
        rows = []
        for number, (start, end) in enumerate(cell["generation_windows"]):
            row = window_timeline(requests, start, end, args.concurrency, args.latency)
            if row is not None:
                rows.append(row)
                print(f"| {number} | " + " | ".join(f"{row[k]:.1f}" for k in keys[:-1]) + f" | {row['ratio']:.3f}x |")
        if rows:
            medians = {k: statistics.median(r[k] for r in rows) for k in keys}
            print("| median | " + " | ".join(f"{medians[k]:.1f}" for k in keys[:-1]) + f" | {medians['ratio']:.3f}x |")
        print()


if __name__ == "__main__":
    main()
