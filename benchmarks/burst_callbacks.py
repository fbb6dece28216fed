"""A round of answers arriving at once: do the answers' callbacks hold back the next round?

    .venv/bin/python benchmarks/burst_callbacks.py                        # 64 in flight, 1 ms a callback
    .venv/bin/python benchmarks/burst_callbacks.py --callback-us 0 --rounds 20

Why: the loopback server answers a whole round of requests at about the same moment, and every answer's
callback (caching, cleaning, looking for duplicates) runs in the run's one process, about 170-200 us an answer
(`benchmarks/parent_answer_cost.py`). At the WASP paper's scale (K=6, 64 in flight each) a round is 384 answers,
about 70 ms of callbacks against 200 ms of latency: if the last answer's slot waited for the callbacks before it
in every round, generation could not come within 1.1x of the latency bound. Here one API generator with
`--processes` request processes and `--concurrency` requests in flight asks the benchmark's real loopback server
(`api_scale.serve`, `--latency` s) for concurrency x `--rounds` answers, with an `on_result` that keeps the CPU
busy `--callback-us` microseconds an answer (64 answers x 1 ms by default: a round's callbacks like K=6's 384 at
about 170 us). Printed: the wall time (best of `--repeats`) against the latency bound (rounds x latency) and
against every round's callbacks in series (rounds x (latency + concurrency x callback)). Measured (docs/scale.md):
the callbacks are paid about once, not every round (the slots they delay come back later and spread the next
round), so they are not what keeps generation from the bound; sending each slot on before the waiting answers'
callbacks made no difference and was not kept.
"""

from __future__ import annotations

import argparse
import sys
import time
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
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--callback-us", type=float, default=1000.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from dpsynth.llm.base import GenerationRequest
    from dpsynth.llm.openai_backend import OpenAICompatGenerator

    url, servers = start_servers(args.latency)
    gen = OpenAICompatGenerator("m", base_url=url, processes=args.processes, max_concurrency=args.concurrency)
    gen.generate([GenerationRequest(messages=(("user", f"warm-up {i}"),)) for i in range(args.concurrency)])
    total = args.concurrency * args.rounds
    best = float("inf")
    for repeat in range(args.repeats):
        requests = [GenerationRequest(messages=(("user", f"{repeat} review {i}"),), max_tokens=64)
                    for i in range(total)]
        start = time.perf_counter()
        answers = gen.generate(requests, on_result=lambda i, r: busy(args.callback_us / 1e6))
        best = min(best, time.perf_counter() - start)
        assert len(answers) == total
    bound = args.rounds * args.latency
    in_series = args.rounds * (args.latency + args.concurrency * args.callback_us / 1e6)
    round_ms = args.concurrency * args.callback_us / 1e3
    print(f"{total} answers, {args.concurrency} in flight from {args.processes} request processes, latency "
          f"{args.latency} s, callbacks {args.callback_us:.0f} us an answer ({round_ms:.0f} ms a round), "
          f"best of {args.repeats}")
    print("| generation s | / latency bound | / callbacks in series |")
    print("|---|---|---|")
    print(f"| {best:.2f} | {best / bound:.2f}x | {best / in_series:.2f}x |")
    for server in servers:
        server.terminate()


if __name__ == "__main__":
    main()
