"""dpsynth's own time in generation at the WASP paper's scale, against an ideal endpoint that costs no CPU.

    .venv/bin/python benchmarks/generation_overhead.py                       # K=2 and K=6, 7,680 requests an iteration
    .venv/bin/python benchmarks/generation_overhead.py --k 6 --n 1920 --repeats 3
    .venv/bin/python benchmarks/generation_overhead.py --k 6 --n 480 --one-process  # the default generator's turns

Why: on the 16-core GPU machine WASP's generation stayed 1.12-1.50x its latency bound (docs/scale.md) although
neither the requests' CPU nor the server was the limit. Part of a run's generation time is spent before the first
request goes out and is not overlapped with any answer: building the prompts (WASP's contrastive examples), their
cache keys, the request cache's look-up and claims, about 50-80 us a request, which at 7,680 requests an iteration
(N=38,400, T=5) is half a second an iteration. Since the requests go out in growing blocks, each block sent while
the next is built (`methods/asking.py: _blocks`), only the first round's are.

Here the endpoint is ideal (`IdealEndpoint`: every request answered `--latency` s after it is sent, with a real
Rotten Tomatoes review or, for a seeded `--drop` percent, an empty answer; `--concurrency` in flight over all
calls, as an API generator's limit holds; no HTTP, no CPU a request), so what is left over the latency bound is
dpsynth's own time: `generate_samples` with WASP's prompts (S=4 contrastive examples from a pool of earlier
samples), the real request cache (empty each time), cleaning, de-duplication and the early replacements. Two
modes alternate in one run: the endpoint states its concurrency (requests built and sent in blocks: now) and it
does not (one call with the whole batch, built and looked up before the first request goes out: before). Printed
per K and mode (medians of `--repeats`): generation seconds, their ratio to the latency bound (ceil(the busiest
generator's requests / concurrency) x latency, replacements counted), to an ideal client's time (`api_scale.
ideal_bound`: the drops of the last round need rounds of their own), the time from the call to the first request
sent, and the ratio of now to before.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from api_scale import answer_text, first_asked_dropped, ideal_bound  # noqa: E402

ATTEMPTS = 3  # WASP's default max_attempts


class IdealEndpoint:
    """An API generator's backend with no cost of its own: a request is answered `latency` s after it is sent,
    `concurrency` in flight over all calls (a freed slot goes to the call with fewest in flight that has requests
    waiting, as the request fleet hands them out), each call's answers handed to its callback in the call's own
    thread. `states_concurrency=False`: the endpoint does not say how many it has in flight, so a run sends each
    batch in one call (as before the blocks)."""

    runs_remotely, chat = True, True

    def __init__(self, name: str, texts: list[str], latency: float, concurrency: int, drop: int,
                 states_concurrency: bool, sends_elsewhere: bool = True) -> None:
        self.name, self.model_id = name, f"ideal:{name}"
        # sending costs this process nothing, as with request processes (`processes:`): by default the run takes
        # a request fleet's path, whose build turns last until a block is handed over (methods/asking.py:
        # _BuildTurns); `--one-process`: a one-process generator's (the default), whose turns end with the build
        self.sends_elsewhere = sends_elsewhere
        self._texts, self._latency, self._drop, self._free = texts, latency, drop, concurrency
        if states_concurrency:
            self.max_concurrency = concurrency
        self.first_sent: float | None = None  # perf_counter of the first request sent
        self.last_answered = 0.0  # perf_counter of the last answer handed to a call
        self._changed = threading.Condition()
        self._calls: list[list] = []  # [inbox, requests waiting (index, request), in flight]
        self._due: list[tuple[float, int, list, int, object]] = []  # (answer time, n, call, index, request)
        self._sent = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with self._changed:
            while True:
                while self._free and any(call[1] for call in self._calls):
                    call = min((c for c in self._calls if c[1]), key=lambda c: c[2])
                    i, request = call[1].popleft()
                    now = time.perf_counter()
                    self.first_sent = self.first_sent or now
                    heapq.heappush(self._due, (now + self._latency, self._sent, call, i, request))
                    self._sent, self._free, call[2] = self._sent + 1, self._free - 1, call[2] + 1
                wait = self._due[0][0] - time.perf_counter() if self._due else None
                if wait is None or wait > 0:
                    self._changed.wait(wait)
                    continue
                _, _, call, i, request = heapq.heappop(self._due)
                self._free, call[2] = self._free + 1, call[2] - 1
                call[0].put((i, request))

    def _answer(self, request):
        from dpsynth.llm.base import GenerationResult

        h = int.from_bytes(hashlib.sha256(repr(request).encode()).digest()[:8], "big")
        return GenerationResult("" if h % 100 < self._drop else answer_text(self._texts, h), 10, 20)

    def generate(self, requests: Sequence, on_result=None, stop=None) -> list:
        call = [queue.SimpleQueue(), deque(enumerate(requests)), 0]
        with self._changed:
            self._calls.append(call)
            self._changed.notify()
        results: list = [None] * len(requests)
        for _ in requests:
            i, request = call[0].get()
            results[i] = self._answer(request)
            self.last_answered = max(self.last_answered, time.perf_counter())
            if on_result:
                on_result(i, results[i])
        with self._changed:
            self._calls.remove(call)
        return results


def wasp_requests(pool_size: int, seed: int):
    """WASP's request maker for a later iteration (t=1): contrastive prompts with S=4 examples (2 good, 2 bad)
    drawn from Top-Q selections in a pool of `pool_size` earlier samples (real reviews)."""
    from dpsynth.data.corpora import get_corpus
    from dpsynth.data.records import TaskSpec
    from dpsynth.methods.generation import SyntheticSample
    from dpsynth.methods.wasp import WaspState, build_requests, selected_texts
    from dpsynth.prompts.builder import PromptSettings

    texts = get_corpus("rotten_tomatoes").load().texts
    labels = ("positive", "negative")
    task = TaskSpec(text_kind="movie review", description="Short movie reviews.",
                    labels={label: f"a {label} review" for label in labels})
    samples = [SyntheticSample(i, texts[i % len(texts)], labels[i % 2], "plm0", 0) for i in range(pool_size)]
    state = WaspState(samples=samples, good={label: list(range(k, 8, 2)) for k, label in enumerate(labels)},
                      bad={label: list(range(8 + k, 16, 2)) for k, label in enumerate(labels)})

    def make(plan, attempt: int, chat: bool):  # as Wasp.step makes them: the selected texts looked up once
        return build_requests(plan, t=1, attempt=attempt, seed=seed, task=task, chat=chat, state=state, s=4,
                              contrastive=True, samples_per_prompt=1, settings=PromptSettings(max_tokens=64),
                              texts=examples)

    examples = selected_texts(state)

    return texts, samples, make


def one_iteration(k: int, n: int, blocks: bool, args: argparse.Namespace, texts: list[str], existing: list,
                  make) -> tuple[float, float, float, float, float, int]:
    """(seconds, latency bound, ideal client's seconds, seconds to the first request sent, seconds after the last
    answer, requests sent) of one iteration, with an empty request cache."""
    from dpsynth.llm.cache import CachedGenerator
    from dpsynth.llm.request_store import RequestCache
    from dpsynth.methods.generation import generate_samples, plan_counts

    endpoints = [IdealEndpoint(f"plm{g}", texts, args.latency, args.concurrency, args.drop, blocks,
                               sends_elsewhere=not args.one_process) for g in range(k)]
    with tempfile.TemporaryDirectory() as tmp:
        cache = RequestCache(Path(tmp) / "requests.sqlite")
        generators = {e.name: CachedGenerator(e, cache) for e in endpoints}
        plans = plan_counts(n, {e.name: 1.0 for e in endpoints}, {"positive": 0.5, "negative": 0.5})
        start = time.perf_counter()
        _, stats = generate_samples(1, plans=plans, generators=generators, existing=existing,
                                    make_requests=make, max_attempts=ATTEMPTS)
        seconds = time.perf_counter() - start
    asked = [first_asked_dropped(s) for s in stats.values()]
    bound = max(-(-a // args.concurrency) for _, a, _ in asked) * args.latency
    ideal = ideal_bound([asked], args.concurrency, args.latency, ATTEMPTS)
    first = min(e.first_sent for e in endpoints if e.first_sent is not None) - start
    last = start + seconds - max(e.last_answered for e in endpoints)
    return seconds, bound, ideal, first, last, sum(a for _, a, _ in asked)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, nargs="+", default=[2, 6], help="API generators side by side")
    parser.add_argument("--n", type=int, default=7680, help="requests an iteration (N=38,400 over T=5: 7,680)")
    parser.add_argument("--pool", type=int, default=30720, help="earlier samples the examples come from")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight per generator")
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--drop", type=int, default=1, help="percent of answers left empty (dropped, replaced)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one-process", action="store_true", help="the path of a one-process generator (build "
                        "turns end with the build), not a request fleet's (turns last to the hand-over)")
    args = parser.parse_args()

    texts, existing, make = wasp_requests(args.pool, seed=0)
    print(f"{args.n} requests an iteration, {args.concurrency} in flight per generator, latency {args.latency} s, "
          f"{args.drop}% empty answers, WASP's contrastive prompts over {args.pool} earlier samples; "
          f"medians of {args.repeats}, the modes alternating; "
          + ("a one-process generator's build turns" if args.one_process else "a request fleet's build turns"))
    print("| K | requests sent | mode | generation s | / latency bound | / ideal client | first request sent after s "
          "| after the last answer s | vs before |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in args.k:
        runs: dict[bool, list[tuple[float, float, float, float, float, int]]] = {False: [], True: []}
        for _ in range(args.repeats):
            for blocks in (False, True):  # the same requests and answers in both modes
                runs[blocks].append(one_iteration(k, args.n, blocks, args, texts, existing, make))
        before = statistics.median(r[0] for r in runs[False])
        for blocks, name in ((False, "one call a batch (before)"), (True, "in blocks (now)")):
            seconds, bound, ideal, first, last, sent = (statistics.median(r[i] for r in runs[blocks]) for i in range(6))
            print(f"| {k} | {sent:.0f} | {name} | {seconds:.2f} | {seconds / bound:.3f}x | {seconds / ideal:.3f}x "
                  f"| {first:.3f} | {last:.3f} | {seconds / before:.3f}x |")


if __name__ == "__main__":
    main()
