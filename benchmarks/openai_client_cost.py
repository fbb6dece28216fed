"""The client's CPU a request: dpsynth's OpenAI-compatible generator, through each of its transports, against the
OpenAI SDK's typed `create`.

    .venv/bin/python benchmarks/openai_client_cost.py                       # 64 in flight, 1,280 requests
    .venv/bin/python benchmarks/openai_client_cost.py --concurrency 8 --requests 320 --rounds 3

One process asks as many requests a second as its CPU allows under one interpreter lock, so the client's CPU a
request sets the ceiling of an API generator and how long a round of requests takes to go out (docs/scale.md;
`processes:` raises it by using more processes). Three clients ask the same requests of the benchmark's real
loopback server (`api_scale.serve`: a fixed latency, real reviews as answers) from a pool of `--concurrency`
threads, alternating in rounds:
- the SDK's typed call, `client.chat.completions.with_raw_response.create(...)`, as the generator first asked
  (its TypedDict transforms of the parameters cost about a third of its time);
- the generator with `transport: sdk`: the same body through the SDK's generic `post` (the baseline: what every
  endpoint went through before the lean client, and what https endpoints and proxies still go through);
- the generator as it asks a plain-http endpoint (`transport: auto`): the lean client on `http.client`
  (llm/plain_http.py).
Printed: client CPU per request (this process, the server excluded), wall time against the latency bound
(requests / concurrency x latency), and the ratio of each client's CPU to the baseline's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from api_scale import start_servers  # noqa: E402


def timed(ask: Callable[[int], object], requests: int, concurrency: int) -> tuple[float, float]:
    """(client CPU seconds, wall seconds) to ask `requests` requests with `concurrency` threads."""
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(ask, range(concurrency)))  # connections opened and threads started before timing
        cpu, wall = time.process_time(), time.perf_counter()
        list(pool.map(ask, range(requests)))
        return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1280)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from dpsynth.llm.base import GenerationRequest
    from dpsynth.llm.openai_backend import OpenAICompatGenerator, parse_answer
    from dpsynth.llm.spend import worst_case

    url, servers = start_servers(args.latency)
    sdk = OpenAICompatGenerator("m", base_url=url, max_concurrency=args.concurrency, transport="sdk")
    plain = OpenAICompatGenerator("m", base_url=url, max_concurrency=args.concurrency)
    messages = (("system", "You write short movie reviews."), ("user", "Write a positive movie review. " * 8))

    def request(i: int) -> GenerationRequest:
        return GenerationRequest(messages=messages, max_tokens=64, temperature=1.0, top_p=0.95, seed=i)

    def typed_create(i: int) -> object:  # the SDK's typed call, as the generator first made it
        r = request(i)
        raw = sdk._client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": role, "content": text} for role, text in r.messages or ()],  # type: ignore[misc]
            max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p, seed=r.seed)
        return parse_answer(raw.http_response.content, chat=True, unreported=worst_case(r))

    baseline = "SDK generic post (transport: sdk; baseline)"
    clients: dict[str, Callable[[int], object]] = {
        "SDK typed create (first)": typed_create,
        baseline: lambda i: sdk._attempt(request(i)),
        "lean http.client (transport: auto, now)": lambda i: plain._attempt(request(i)),
    }
    bound = args.requests / args.concurrency * args.latency
    cpu: dict[str, list[float]] = {name: [] for name in clients}
    walls: dict[str, list[float]] = {name: [] for name in clients}
    for _ in range(args.rounds):
        for name, ask in clients.items():
            c, w = timed(ask, args.requests, args.concurrency)
            cpu[name].append(c / args.requests)
            walls[name].append(w)
    for server in servers:
        server.terminate()
    print(f"{args.requests} requests, {args.concurrency} in flight, server latency {args.latency} s "
          f"(latency bound {bound:.2f} s); medians of {args.rounds} rounds, alternating")
    print("| client | CPU ms/request | wall s | / latency bound | CPU vs baseline |")
    print("|---|---|---|---|---|")
    base = statistics.median(cpu[baseline])
    for name in cpu:
        c, w = statistics.median(cpu[name]), statistics.median(walls[name])
        print(f"| {name} | {c * 1e3:.2f} | {w:.2f} | {w / bound:.2f}x | {c / base:.2f}x |")


if __name__ == "__main__":
    main()
