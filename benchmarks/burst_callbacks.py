"""A round of answers arriving at once: do the answers' callbacks hold back the next round?

    .venv/bin/python benchmarks/burst_callbacks.py                        # 64 in flight, 1 ms a callback
    .venv/bin/python benchmarks/burst_callbacks.py --k 6 --concurrency 16 --latency 1.0 --callback-us 3000

Why: the loopback server answers a whole round of requests at about the same moment, and every answer's
callback (caching, cleaning, looking for duplicates) runs in the run's one process, about 170-200 us an answer
(`benchmarks/parent_answer_cost.py`). At the WASP paper's scale (K=6, 64 in flight each) a round is 384 answers,
about 70 ms of callbacks against 200 ms of latency: if the last answer's slot waited for the callbacks before it
in every round, generation could not come within 1.1x of the latency bound. Here `--k` API generators side by side
(a thread each, as a run's), each with `--processes` request processes and `--concurrency` requests in flight, ask
the benchmark's real loopback server (`api_scale.serve`, `--latency` s) for concurrency x `--rounds` answers each,
with an `on_result` that keeps the CPU busy `--callback-us` microseconds an answer (64 answers x 1 ms by default:
a round's callbacks like K=6's 384 at about 170 us). Printed: the wall time (best of `--repeats`) against the
latency bound (rounds x latency) and against every round's callbacks in series (rounds x (latency + answers a
round x callback)). Measured (docs/scale.md): the callbacks are paid about once, not every round (the slots they
delay come back later and spread the next round), with one generator or six; sending each slot on before the
waiting answers' callbacks made no difference and was not kept.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from api_scale import start_servers  # noqa: E402 - the same loopback server


def busy(seconds: float) -> None:
    """Keep this thread on the CPU (holding the interpreter lock, as the callbacks' Python code does)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=1, help="API generators side by side (a thread each)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight per generator")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--callback-us", type=float, default=1000.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from dpsynth.llm.base import GenerationRequest
    from dpsynth.llm.openai_backend import OpenAICompatGenerator

    url, servers = start_servers(args.latency)
    gens = [OpenAICompatGenerator(f"m{g}", base_url=url, processes=args.processes, max_concurrency=args.concurrency)
            for g in range(args.k)]
    total = args.concurrency * args.rounds

    def ask(g: int, tag: str) -> int:
        requests = [GenerationRequest(messages=(("user", f"{tag} {g} review {i}"),), max_tokens=64)
                    for i in range(total)]
        return len(gens[g].generate(requests, on_result=lambda i, r: busy(args.callback_us / 1e6)))

    with ThreadPoolExecutor(max_workers=args.k) as side_by_side:
        list(side_by_side.map(ask, range(args.k), ["warm-up"] * args.k))
        best = float("inf")
        for repeat in range(args.repeats):
            start = time.perf_counter()
            answered = list(side_by_side.map(ask, range(args.k), [str(repeat)] * args.k))
            best = min(best, time.perf_counter() - start)
            assert answered == [total] * args.k
    bound = args.rounds * args.latency
    round_ms = args.k * args.concurrency * args.callback_us / 1e3
    in_series = args.rounds * (args.latency + round_ms / 1e3)
    print(f"K={args.k} generators x {total} answers, {args.concurrency} in flight each from {args.processes} request "
          f"processes, latency {args.latency} s, callbacks {args.callback_us:.0f} us an answer ({round_ms:.0f} ms a "
          f"round), best of {args.repeats}")
    print("| generation s | / latency bound | / callbacks in series |")
    print("|---|---|---|")
    print(f"| {best:.2f} | {best / bound:.2f}x | {best / in_series:.2f}x |")
    for server in servers:
        server.terminate()


if __name__ == "__main__":
    main()
