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
`--answers` answers through three layers, alternating in rounds: the request fleet alone, `CachedGenerator` over it
(an empty request cache: keys, claims, writes), and `generate_samples` (cleaning, duplicates, early replacements).
Printed per layer: this process's CPU per answer (its threads; the workers and the server excluded), what the
layer adds to the one below, the answers a second this CPU alone would allow, and its share of the budget at
`--target-rate`. The fleet's own figure depends on how many answers arrive per wake-up (the machine's load), so
compare the layers' additions between versions, in alternating runs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from api_scale import free_port, serve  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--answers", type=int, default=3000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target-rate", type=float, default=1920.0, help="answers a second the run must take in")
    args = parser.parse_args()

    from dpsynth.data.corpora import get_corpus
    from dpsynth.data.records import TaskSpec
    from dpsynth.llm.base import GenerationRequest
    from dpsynth.llm.cache import CachedGenerator, RequestCache
    from dpsynth.llm.openai_backend import OpenAICompatGenerator
    from dpsynth.methods.generation import GenerationPlan, generate_samples, zero_shot_requests
    from dpsynth.prompts.builder import PromptSettings

    ready: mp.Queue = mp.Queue()
    port = free_port()
    server = mp.Process(target=serve, args=(port, ready, args.latency, get_corpus("rotten_tomatoes").load().texts),
                        daemon=True)
    server.start()
    ready.get(timeout=60)
    gen = OpenAICompatGenerator("m", base_url=f"http://127.0.0.1:{port}/v1", max_concurrency=args.concurrency,
                                processes=args.processes)
    task = TaskSpec(text_kind="movie review", labels={"negative": "a negative review", "positive": "a positive review"})
    n = args.answers
    scratch = Path(tempfile.mkdtemp(prefix="parent-answer-cost-"))

    def requests(tag: str) -> list[GenerationRequest]:
        return [GenerationRequest(messages=(("user", f"Write a movie review ({tag} {i})."),), seed=i) for i in range(n)]

    def fleet(tag: str) -> None:
        gen.generate(requests(tag))

    def cached(tag: str) -> None:
        CachedGenerator(gen, RequestCache(scratch / f"{tag}.sqlite")).generate(requests(tag))

    def samples(tag: str) -> None:
        plans = [GenerationPlan("plm", {"negative": n // 2, "positive": n - n // 2})]
        plm = CachedGenerator(gen, RequestCache(scratch / f"{tag}.sqlite"))
        generate_samples(0, plans=plans, generators={"plm": plm}, existing=[],
                         make_requests=zero_shot_requests(task, PromptSettings(), tag), max_attempts=3)

    layers: dict[str, Callable[[str], None]] = {"request fleet": fleet, "+ request cache (CachedGenerator)": cached,
                                                "+ cleaning, duplicates (generate_samples)": samples}
    fleet("warm-up")
    cpu: dict[str, list[float]] = {name: [] for name in layers}
    for r in range(args.rounds):
        for name, run in layers.items():
            start = time.process_time()
            run(f"{r}-{len(cpu[name])}-{name[:6]}")
            cpu[name].append((time.process_time() - start) / n)
    server.terminate()
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
