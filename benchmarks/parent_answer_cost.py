"""The CPU an API answer costs the run's own process, layer by layer, against the budget at a target rate.

    .venv/bin/python benchmarks/parent_answer_cost.py                   # 3,000 answers, 2 request processes
    .venv/bin/python benchmarks/parent_answer_cost.py --answers 6000 --rounds 3 --target-rate 1920

Why: with `processes:` the requests are sent from worker processes, but every answer still comes back to the run's
process, which routes it, stores it in the request cache, cleans it and looks for duplicates (to ask replacements
early). All of that runs under one interpreter lock for all K generators together, so its CPU per answer caps the
answers a second of the whole run: at the WASP paper's scale (K=6, 64 in flight each, 0.2 s answers) 1,920 a
second, a budget of 521 us an answer, and a process that is busy most of that time also delays each answer's
hand-off (docs/scale.md). The benchmark asks one generator (`--processes` request processes, `--concurrency` in
flight) of the benchmark's real loopback server (`api_scale.serve`, `--latency` s, real reviews as answers) for
`--answers` answers (WASP's zero-shot prompts) through three layers, alternating in rounds: the request fleet alone,
`CachedGenerator` over it (an empty request cache: keys, claims, writes), and `generate_samples` (building the
prompts, cleaning, duplicates, early replacements; its CPU is divided by the answers received, replacements
included).
Printed per layer: this process's CPU per answer (its threads; the workers and the server excluded), what the
layer adds to the one below, the answers a second this CPU alone would allow, and its share of the budget at
`--target-rate`. The fleet's own figure depends on how many answers arrive per wake-up (the machine's load), so
compare the layers' additions between versions, in alternating runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from api_scale import start_servers  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--answers", type=int, default=3000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target-rate", type=float, default=1920.0, help="answers a second the run must take in")
    args = parser.parse_args()

    from dpsynth.data.records import TaskSpec
    from dpsynth.llm.base import GenerationRequest
    from dpsynth.llm.cache import CachedGenerator
    from dpsynth.llm.openai_backend import OpenAICompatGenerator
    from dpsynth.llm.request_store import RequestCache
    from dpsynth.methods.generation import GenerationPlan, generate_samples, zero_shot_requests
    from dpsynth.prompts.builder import PromptSettings

    url, servers = start_servers(args.latency)
    gen = OpenAICompatGenerator("m", base_url=url, max_concurrency=args.concurrency, processes=args.processes)
    task = TaskSpec(text_kind="movie review", labels={"negative": "a negative review", "positive": "a positive review"})
    plan = GenerationPlan("plm", {"negative": args.answers // 2, "positive": args.answers - args.answers // 2})

    def requests(tag: str) -> list[GenerationRequest]:  # the zero-shot prompts generate_samples sends, at every layer
        return [r for _, r in zero_shot_requests(task, PromptSettings(), tag)(plan, 0, True)]

    def fleet(tag: str, _: Path) -> int:
        return len(gen.generate(requests(tag)))

    def cached(tag: str, cache: Path) -> int:
        return len(CachedGenerator(gen, RequestCache(cache)).generate(requests(tag)))

    def samples(tag: str, cache: Path) -> int:
        _, stats = generate_samples(0, plans=[plan], generators={"plm": CachedGenerator(gen, RequestCache(cache))},
                                    existing=[], make_requests=zero_shot_requests(task, PromptSettings(), tag),
                                    max_attempts=3)
        return sum(s["kept"] + sum(s["dropped"].values()) for s in stats.values())  # replacements included

    layers: dict[str, Callable[[str, Path], int]] = {
        "request fleet": fleet, "+ request cache (CachedGenerator)": cached,
        "+ prompts, cleaning, duplicates (generate_samples)": samples}
    cpu: dict[str, list[float]] = {name: [] for name in layers}
    with tempfile.TemporaryDirectory(prefix="parent-answer-cost-") as scratch:
        fleet("warm-up", Path(scratch))
        for r in range(args.rounds):
            for i, (name, run) in enumerate(layers.items()):
                start = time.process_time()
                answers = run(f"round {r} layer {i}", Path(scratch) / f"{r}-{i}.sqlite")
                cpu[name].append((time.process_time() - start) / answers)
    for server in servers:
        server.terminate()
    n = args.answers
    budget = 1 / args.target_rate
    print(f"{n} answers a layer, {args.processes} request process(es), {args.concurrency} in flight, latency "
          f"{args.latency} s; medians of {args.rounds} rounds; budget at {args.target_rate:.0f} answers/s: "
          f"{budget * 1e6:.0f} us an answer")
    print("| layer | this process's CPU us/answer | added by the layer | answers/s it allows | share of the budget |")
    print("|---|---|---|---|---|")
    below = 0.0
    for name, values in cpu.items():
        c = statistics.median(values)
        print(f"| {name} | {c * 1e6:.0f} | {(c - below) * 1e6:.0f} | {1 / c:.0f} | {c / budget:.2f} |")
        below = c


if __name__ == "__main__":
    main()
