"""Replacements of dropped answers asked while the first batch is in flight, against asking them after it.

    .venv/bin/python benchmarks/early_replacements.py                      # K=2, 600 samples an iteration, c=64
    .venv/bin/python benchmarks/early_replacements.py --k 1 --n 320 --drop 2 --concurrency 32

A real loopback HTTP server speaking the OpenAI chat API answers every request after `--latency` seconds with two
real Rotten Tomatoes reviews, except a seeded `--drop` percent of requests, which get an empty answer (what
cleaning drops, as it drops a small model's echoes and empty answers). `generate_samples` (the loop every method
uses) then runs `--iterations` iterations of zero-shot requests, K API generators side by side, an empty request
cache each time, twice: with its replacements asked early (the default) and, as the baseline, after the first
batch (how it asked before). In the same run the OpenAI SDK alone sends as many requests per generator (re-asks
included) from a thread pool of the same size: the client's floor on this machine. Per mode it prints the wall time of
generation, and its ratio to the latency bound (per iteration, ceil(requests of the busiest generator / concurrency)
x latency, re-asks counted in their iteration), to an ideal client's time (`api_scale.ideal_bound`: no time of its
own, each drop replaced in the next round, so only the rounds that the last round's drops need are added to the
bound) and to the client's floor, and the requests the generators sent
(checked against what the attempts asked: no replacement is asked twice or in vain). Both modes send the same
requests and keep the same samples (tests/test_generation_concurrency.py); only when replacements go out differs.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from api_scale import first_asked_dropped, ideal_bound, start_servers  # noqa: E402 - the same loopback server, with empty answers

ATTEMPTS = 4  # asks per sample at most


def run_mode(early: bool, args: argparse.Namespace, url: str) -> tuple[int, float, float, float]:
    """(requests, seconds, latency bound, ideal client's seconds) of `--iterations` iterations of generate_samples
    in one mode."""
    from dpsynth.config import GeneratorConfig
    from dpsynth.data.corpora import get_corpus
    from dpsynth.llm.cache import CachedGenerator
    from dpsynth.llm.registry import build_generator
    from dpsynth.llm.request_store import RequestCache
    from dpsynth.methods import asking
    from dpsynth.methods.generation import generate_samples, plan_counts, zero_shot_requests
    from dpsynth.prompts.builder import PromptSettings

    task = get_corpus("rotten_tomatoes").task
    shares = {c: 1 / len(task.label_names) for c in task.label_names}
    cache = RequestCache(Path(tempfile.mkdtemp(prefix="early-replacements-")) / "requests.sqlite")
    gens = {f"plm{i}": CachedGenerator(build_generator(GeneratorConfig(
        kind="openai", model=f"m{i}", name=f"plm{i}", base_url=url, max_concurrency=args.concurrency,
        processes=args.processes)), cache)
        for i in range(args.k)}
    apply = asking.Replacements.apply
    if not early:  # the baseline: every attempt after the previous one, as before
        asking.Replacements.apply = staticmethod(lambda *a: False)  # type: ignore[method-assign]
    try:
        requests, seconds, bound, drops = 0, 0.0, 0.0, []
        for t in range(args.iterations):
            start = time.perf_counter()
            _, stats = generate_samples(t, plans=plan_counts(args.n, dict.fromkeys(gens, 1.0), shares), generators=gens,
                                        existing=[], max_attempts=ATTEMPTS,
                                        make_requests=zero_shot_requests(task, PromptSettings(), "bench", t))
            seconds += time.perf_counter() - start
            asked = [s["kept"] + sum(s["dropped"].values()) for s in stats.values()]
            requests += sum(asked)
            bound += max(math.ceil(a / args.concurrency) for a in asked) * args.latency
            drops.append([first_asked_dropped(s) for s in stats.values()])
        sent = sum(g.usage.requests - g.usage.cached for g in gens.values())  # what the server was sent
        assert sent == requests, f"{sent} requests sent, {requests} asked by the attempts"
        return sent, seconds, bound, ideal_bound(drops, args.concurrency, args.latency, ATTEMPTS)
    finally:
        asking.Replacements.apply = apply  # type: ignore[method-assign]


def client_floor(args: argparse.Namespace, url: str, per_generator: int) -> float:
    """Seconds the OpenAI SDK alone takes for `per_generator` requests from each of K clients side by side,
    each from a pool of `--concurrency` threads: what any client built on it could reach here."""
    import openai

    clients = [openai.OpenAI(api_key="x", base_url=url, max_retries=0) for _ in range(args.k)]

    def one(client: openai.OpenAI, i: int) -> bytes:
        return client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": f"Write a movie review, please ({i})."}],
            max_tokens=64, seed=i).http_response.content

    def batch(client: openai.OpenAI) -> None:
        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(lambda i: one(client, i), range(per_generator)))

    start = time.perf_counter()
    with ThreadPoolExecutor(args.k) as side_by_side:
        list(side_by_side.map(batch, clients))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=2, help="API generators, side by side")
    parser.add_argument("--n", type=int, default=600, help="samples an iteration (all generators)")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--drop", type=int, default=1, help="percent of answers the server leaves empty")
    parser.add_argument("--processes", type=int, default=1, help="request processes per generator (`processes:`)")
    args = parser.parse_args()

    url, servers = start_servers(args.latency, drop=args.drop)
    print(f"K={args.k}, {args.n} samples an iteration, {args.iterations} iterations, {args.concurrency} requests in "
          f"flight per generator, latency {args.latency} s, {args.drop}% empty answers, {args.processes} request "
          "process(es) per generator")
    rows = [("after the first batch (baseline)", *run_mode(False, args, url)),
            ("while it is in flight", *run_mode(True, args, url))]
    per_generator = math.ceil(rows[1][1] / args.iterations / args.k)
    floor = args.iterations * client_floor(args, url, per_generator)
    print(f"OpenAI SDK alone, {per_generator} requests per generator per iteration (the runs' own, re-asks included), "
          f"{args.iterations} times: {floor:.2f} s")
    print("| replacements asked | requests | generation s | / latency bound | / ideal client | / client floor "
          "| vs baseline |")
    print("|---|---|---|---|---|---|---|")
    for name, requests, seconds, bound, ideal in rows:
        print(f"| {name} | {requests} | {seconds:.2f} | {seconds / bound:.2f}x | {seconds / ideal:.2f}x "
              f"| {seconds / floor:.2f}x | {seconds / rows[0][2]:.2f}x |")
    for server in servers:
        server.terminate()


if __name__ == "__main__":
    main()
