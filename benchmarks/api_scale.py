"""WASP at the paper's scale through an OpenAI-compatible server: the cost curve as N grows.

    .venv/bin/python benchmarks/api_scale.py                                  # N 600 2400 9600 38400, K 2 and 6
    .venv/bin/python benchmarks/api_scale.py --n 600 2400 --k 2 --latency 0.2 --concurrency 64
    .venv/bin/python benchmarks/api_scale.py --processes 4 --server-processes 8   # past one client process's ceiling

A real HTTP server on loopback (its own process, part of this benchmark, not a mock inside the client)
speaks the OpenAI chat-completions API: it waits `--latency` seconds per request and answers with real
Rotten Tomatoes reviews (two joined, picked by a hash of the request, so answers are distinct). Each cell
is one WASP run (T=5, M private records, K generators with `--concurrency` requests in flight each, an
empty request cache) in a fresh process, so that its peak resident memory is its own. Per cell it prints:
- generation time against the latency bound of the generators side by side: per iteration, the largest
  generator's ceil(requests / concurrency) x latency, summed (re-asks counted in their iteration); and against
  an ideal client's time (`ideal_bound`: no time of its own, every drop replaced in the next round, the cell's
  own drop rates), which also counts the rounds that the last round's drops need after it;
- the run's own process's CPU while it generates (all its threads, in cores: CPU seconds / wall seconds inside
  `generate_samples`; the request processes and the server excluded): near 1 with `processes:`, the process that
  routes, stores and cleans every answer under one interpreter lock is what sets the pace;
- dpsynth's own time: the wall time less generation, embedding, the data holder's (voting, and loading the
  private records) and model loading, per request, and after
  the table per K its fixed part and its marginal cost per request (the least-squares line over the N's);
- embedding throughput (synthetic texts / embedding time; the holder embeds the private texts inside its
  voting time) against the encoder's peak measured in this process on the same kind of texts (the server's
  answers: two joined reviews), with the embedder's own batch size on the same device; and, before the table, the
  encoder alone on calls of one iteration's size (N / T texts): what a run of that N could reach at most;
- voting time, peak resident memory (and bytes per sample over the smallest N), the requests sent;
and after the largest cell, the request cache's cost per request with its rows (get and put, 1,000 each).
A second table gives the server's view of each cell, from its own request log (`server_view`): how full the
client kept the generators' slots, the run's time before its first request and after its last answer, how long a
freed slot stayed free before the next request came, and the server's own time: where the gap to the latency
bound lies.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing as mp
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from fresh_cache import fresh_request_cache  # noqa: E402

MODEL = re.compile(rb'"model":\s*"([^"]*)"')


def answer_text(texts: list[str], h: int) -> str:
    """The server's answer for a request whose body hashes to `h`: two real reviews joined."""
    return f"{texts[h % len(texts)]} {texts[(h // len(texts)) % len(texts)]}"


def serve(port: int, ready: mp.Queue, latency: float, texts: list[str], drop: int = 0,
          log_dir: str | None = None) -> None:
    """One process of the loopback server: every POST waits `latency` s and returns a real text (an empty one for
    a seeded `drop` percent of requests: what cleaning drops). Several such processes share `port` (SO_REUSEPORT;
    the kernel spreads connections over them), so that the server, like a vLLM endpoint in front of many
    replicas, is not the limit the client is measured against. With `log_dir`, each request's model and its
    arrival and answer times (CLOCK_MONOTONIC, which every process on the machine shares) go to a file of this
    process's there: what `server_view` reads to tell how full the client kept the server."""
    log = open(Path(log_dir) / f"server-{os.getpid()}.txt", "a", buffering=1) if log_dir else None  # noqa: SIM115
    log_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            arrived = time.monotonic()
            body = self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(latency)
            h = int.from_bytes(hashlib.sha256(body).digest()[:8], "big")
            text = "" if h % 100 < drop else answer_text(texts, h)
            answer = json.dumps({
                "id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": len(body) // 4, "completion_tokens": len(text) // 4,
                          "total_tokens": (len(body) + len(text)) // 4},
            }).encode()
            answered = time.monotonic()  # before the answer is written: the client may send its next at once
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
            if log is not None:
                model = MODEL.search(body)
                line = f"{model.group(1).decode() if model else '?'} {arrived:.6f} {answered:.6f}\n"
                with log_lock:
                    log.write(line)

        def log_message(self, *args) -> None:
            pass

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 1024
    ThreadingHTTPServer.allow_reuse_port = True
    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ready.put(srv.server_port)
    srv.serve_forever()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_servers(latency: float, processes: int = 1, drop: int = 0,
                  log_dir: Path | None = None) -> tuple[str, list[mp.Process]]:
    """The loopback server (`serve`, real Rotten Tomatoes reviews as answers) in `processes` daemon processes on
    one port, ready: its base URL and the processes (every benchmark that asks an API starts it this way)."""
    from dpsynth.data.corpora import get_corpus

    texts = get_corpus("rotten_tomatoes").load().texts
    ready: mp.Queue = mp.Queue()
    port = free_port()
    servers = [mp.Process(target=serve, args=(port, ready, latency, texts, drop, str(log_dir) if log_dir else None),
                          daemon=True)
               for _ in range(processes)]
    for server in servers:
        server.start()
    for _ in servers:
        ready.get(timeout=60)
    return f"http://127.0.0.1:{port}/v1", servers


WASP_ATTEMPTS = 3  # the cells' asks per sample at most (WASP's default max_attempts)


def run_cell(n: int, k: int, url: str, concurrency: int, m: int, iterations: int, *, embedder: str, device: str,
             noise_seed: int | None, processes: int, transport: str = "auto") -> dict:
    """One WASP run in this process (called in a child): its metrics and peak memory."""
    from dpsynth.runs.config import parse_config
    from dpsynth.runs.engine import Run

    raw = {
        "method": "wasp",
        "data": {"corpus": "rotten_tomatoes", "m": m},
        "generators": [{"kind": "openai", "model": f"m{i}", "name": f"plm{i}", "base_url": url,
                        "max_concurrency": concurrency, "processes": processes, "transport": transport}
                       for i in range(k)],
        "wasp": {"n": n, "iterations": iterations, "q": 8, "s": 4, "max_tokens": 64,
                 "max_attempts": WASP_ATTEMPTS},
        "privacy": {"epsilon": 4.0, "delta": 1e-5},
        "evaluate": False,
        "device": device,
        "embedder": embedder,
    }
    if noise_seed is not None:
        raw["privacy"]["noise_seed"] = noise_seed
    import dpsynth.methods.wasp as wasp

    spent = {"cpu": 0.0, "wall": 0.0}  # this process's CPU (all its threads) and wall time inside generate_samples
    windows: list[tuple[float, float]] = []  # each call's start and end on CLOCK_MONOTONIC (the server's log clock)
    generate = wasp.generate_samples

    def timed_generate(*args, **kwargs):  # a pass-through, timed
        cpu, wall, start = time.process_time(), time.perf_counter(), time.monotonic()
        try:
            return generate(*args, **kwargs)
        finally:
            spent["cpu"] += time.process_time() - cpu
            spent["wall"] += time.perf_counter() - wall
            windows.append((start, time.monotonic()))

    wasp.generate_samples = timed_generate  # only in this cell's process
    with tempfile.TemporaryDirectory() as tmp:
        result = Run.create(parse_config(raw), Path(tmp) / "run").execute()
    metrics = result["metrics"]
    return {"metrics": metrics, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "generation_cpu_s": spent["cpu"], "generation_wall_s": spent["wall"], "generation_windows": windows}


def latency_bound(metrics: dict, concurrency: int, latency: float) -> float:
    total = 0.0
    for record in metrics["iterations"]:
        asked = [s.get("kept", 0) + sum((s.get("dropped") or {}).values()) for s in record["generated"].values()]
        total += max(math.ceil(a / concurrency) for a in asked) * latency if asked else 0.0
    return total


def ideal_rounds(first: int, drop: float, concurrency: int, attempts: int, rng: np.random.Generator) -> int:
    """Rounds of latency an ideal client needs for one generator's `first` requests when each answer is dropped
    with probability `drop` and replaced (up to `attempts` asks in all): no time of its own, every drop known the
    moment its answer arrives and replaced in the very next round, ahead of the first batch's requests. The last
    round's drops still need one more round (and theirs another), which the latency bound does not count."""
    main, waiting, rounds = first, [0] * attempts, 0  # waiting[a]: replacements to ask at attempt a
    while main or any(waiting):
        free, sent = concurrency, []
        for attempt in range(attempts - 1, 0, -1):
            take = min(free, waiting[attempt])
            waiting[attempt], free = waiting[attempt] - take, free - take
            sent.append((attempt, take))
        take = min(free, main)
        main -= take
        sent.append((0, take))
        rounds += 1
        for attempt, count in sent:
            if attempt + 1 < attempts:
                waiting[attempt + 1] += int(rng.binomial(count, drop))
    return rounds


def first_asked_dropped(stats: dict) -> tuple[int, int, int]:
    """One generator's (samples requested, answers received, answers dropped) in one iteration's stats."""
    dropped = sum((stats.get("dropped") or {}).values())
    return stats.get("requested", stats.get("kept", 0)), stats.get("kept", 0) + dropped, dropped


def ideal_bound(iterations: list[list[tuple[int, int, int]]], concurrency: int, latency: float, attempts: int,
                draws: int = 200) -> float:
    """Seconds an ideal client would need (`ideal_rounds`; the mean over `draws` seeded draws of the drops), the
    generators side by side: per iteration the slowest one's rounds, summed. `iterations`: per iteration, per
    generator, (samples requested: its first batch, answers received, answers dropped: its drop rate is their
    share)."""
    rng = np.random.default_rng(0)
    total = 0
    for _ in range(draws):
        for generators in iterations:
            total += max(ideal_rounds(first, dropped / max(asked, 1), concurrency, attempts, rng)
                         for first, asked, dropped in generators)
    return total / draws * latency


def server_view(log_dir: Path, windows: list[tuple[float, float]], concurrency: int, latency: float) -> dict:
    """How full the client kept the server while it generated, from the server's own log (`serve`): the requests
    that arrived inside the run's generation windows (`windows`, CLOCK_MONOTONIC), and
    - `busy`: the share of the generators' slots (generators x `concurrency`) that held a request at the server,
      over the windows' whole length; `lowest`: the same for the generator that kept its slots least full;
    - `first_s` / `after_s`: summed over the windows, from a window's start to its first request's arrival, and
      from its last answer to the window's end (the run's own time before and after its requests);
    - `turnaround_ms` (median and mean): how long a freed slot stayed free. A generator holds `concurrency`
      slots, so its (c+i)-th request of a window can only arrive once its i-th answer (in time order) has gone:
      arrival[c+i] - answer[i] is the round trip through the client (answer received, cached, cleaned, the next
      request built and sent), and, in the mean, the waits when no request was ready (replacements that wait for
      a drop to be known);
    - `served_ms`: a request's time at the server beyond `latency` (the server's own cost, in the mean)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for path in log_dir.glob("server-*.txt"):
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) == 3:  # a line being written as the log is read is left out
                spans.setdefault(fields[0], []).append((float(fields[1]), float(fields[2])))
    # this cell's generators only: the log holds every cell's requests
    spans = {m: v for m, v in spans.items() if any(start <= a <= end for a, _ in v for start, end in windows)}
    total = served = first = after = 0.0
    count = 0
    per_model = dict.fromkeys(spans, 0.0)
    gaps: list[np.ndarray] = []
    for start, end in windows:
        total += end - start
        inside = {m: np.array([(a, min(d, end)) for a, d in v if start <= a <= end]).reshape(-1, 2)
                  for m, v in spans.items()}
        inside = {m: v for m, v in inside.items() if len(v)}
        if not inside:
            continue
        both = np.concatenate(list(inside.values()))
        arrivals, answers = both[:, 0], both[:, 1]
        count += len(arrivals)
        first += arrivals.min() - start
        after += end - answers.max()
        for m, v in inside.items():
            per_model[m] += float((v[:, 1] - v[:, 0]).sum())
            a, d = np.sort(v[:, 0]), np.sort(v[:, 1])
            gaps.append(a[concurrency:] - d[: max(len(a) - concurrency, 0)])
        served += float((answers - arrivals).sum())
    if not count:
        return {"requests": 0}
    slots = len(spans) * concurrency
    gap = np.concatenate(gaps) if gaps else np.zeros(0)
    return {"requests": count, "busy": served / (slots * total),
            "lowest": min(per_model.values()) / (concurrency * total),
            "first_s": first, "after_s": after,
            # none where no generator had more requests in a window than slots (nothing waited for a slot)
            "turnaround_ms": (float(np.median(gap)) * 1e3, float(gap.mean()) * 1e3) if len(gap) else None,
            "served_ms": (served / count - latency) * 1e3}


def encoder_peak(texts: list[str], embedder_name: str, device: str,
                 call_sizes: list[int]) -> tuple[float, dict[int, float]]:
    """texts/s of the run's encoder on texts like the server's answers, with its own batch size on the run's
    device, in this process (after a warm-up): the most the run's embedding could reach; and its texts/s on calls
    of each of `call_sizes` texts (the new samples of one iteration: N / T), each size asked as often as makes
    about a second at the peak (at least once): whether a small run's embedding is held back by its calls'
    size, which no run of that size can change, or by something of its own."""
    from dpsynth.device import resolve_device
    from dpsynth.embed.sentence import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(embedder_name, device=resolve_device(device))
    embedder.encode(texts[:64])
    start = time.perf_counter()
    embedder.encode(texts)
    peak = len(texts) / (time.perf_counter() - start)
    by_size: dict[int, float] = {}
    for size in sorted(set(call_sizes)):
        calls = [[texts[(k * size + i) % len(texts)] for i in range(size)] for k in range(math.ceil(peak / size))]
        start = time.perf_counter()
        for call in calls:
            embedder.encode(call)
        by_size[size] = sum(map(len, calls)) / (time.perf_counter() - start)
    return peak, by_size


def cache_cost(path: Path) -> tuple[int, float, float]:
    """(rows, microseconds per get, per put) of the request cache at `path`."""
    import sqlite3

    from dpsynth.llm.base import GenerationResult
    from dpsynth.llm.request_store import RequestCache

    rows = sqlite3.connect(path).execute("SELECT COUNT(*) FROM generations").fetchone()[0]
    cache = RequestCache(path)
    keys = [hashlib.sha256(f"bench-{i}".encode()).hexdigest() for i in range(1000)]
    start = time.perf_counter()
    for key in keys:
        cache.put_many([(key, "bench", "prompt", GenerationResult("a text", 1, 1))])
    put = (time.perf_counter() - start) / len(keys) * 1e6
    start = time.perf_counter()
    for chunk in range(0, len(keys), 100):
        cache.get_many(keys[chunk : chunk + 100])
    get = (time.perf_counter() - start) / len(keys) * 1e6
    return rows, get, put


def switch_site(root: Path, seconds: float) -> Path:
    """A folder whose sitecustomize sets the interpreter's switch interval in every Python process started with it
    on PYTHONPATH (a cell's process and the request processes it spawns)."""
    site = root / "switch-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(f"import sys\nsys.setswitchinterval({seconds!r})\n")
    return site


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, nargs="+", default=[600, 2400, 9600, 38400])
    parser.add_argument("--k", type=int, nargs="+", default=[2, 6])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--m", type=int, default=1000, help="private records")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--embedder", default="all-MiniLM-L6-v2", help="the runs' embedder (a model name or directory)")
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"], help="the runs' device: setting")
    parser.add_argument("--noise-seed", type=int, help="seeded numpy noise (NOT FOR RELEASE) instead of OpenDP's exact "
                        "samplers: voting then leaves out the exact sampler's cost")
    parser.add_argument("--processes", type=int, default=1, help="request processes per generator (processes:)")
    parser.add_argument("--transport", default="auto", choices=["auto", "sdk"], help="the generators' transport: "
                        "auto (the lean client, for this plain-http server) or sdk (the OpenAI SDK's generic post)")
    parser.add_argument("--server-processes", type=int, default=1, help="loopback server processes on one port")
    parser.add_argument("--switch-interval", type=float, help="the interpreter's switch interval (s; Python's "
                        "default is 0.005) in each cell's process and its request processes: how long a thread "
                        "that waits for the interpreter lock may wait for one that holds it busy")
    parser.add_argument("--server-log", type=Path, help="a folder to keep the server's request log and the cells' "
                        "generation windows in (for a later look); a temporary one otherwise")
    parser.add_argument("--cell", help=argparse.SUPPRESS)  # internal: run one cell, print its JSON
    args = parser.parse_args()
    if args.cell:
        n, k, url = args.cell.split(",")
        print("CELL " + json.dumps(run_cell(int(n), int(k), url, args.concurrency, args.m, args.iterations,
                                            embedder=args.embedder, device=args.device, noise_seed=args.noise_seed,
                                            processes=args.processes, transport=args.transport)))
        return

    from dpsynth.data.corpora import get_corpus

    texts = get_corpus("rotten_tomatoes").load().texts
    server_log = args.server_log or Path(tempfile.mkdtemp(prefix="api-scale-log-"))
    server_log.mkdir(parents=True, exist_ok=True)
    url, servers = start_servers(args.latency, args.server_processes, log_dir=server_log)
    from dpsynth.device import resolve_device

    # enough texts for the peak to be the encoder's, not its start-up: a GPU needs many more than a CPU
    sample = 20_000 if resolve_device(args.device) == "cuda" else 2_000
    like_answers = [answer_text(texts, int.from_bytes(hashlib.sha256(str(i).encode()).digest()[:8], "big"))
                    for i in range(sample)]
    call_sizes = [n // args.iterations for n in args.n if n // args.iterations <= sample]
    peak, by_size = encoder_peak(like_answers, args.embedder, args.device, call_sizes)
    print(f"server {url} ({args.server_processes} processes): latency {args.latency} s, {args.concurrency} requests "
          f"in flight per generator from {args.processes} process(es) each, transport {args.transport}; "
          f"encoder peak {peak:.0f} texts/s ({args.embedder} on {args.device}, texts like the answers, this machine)"
          + ("; seeded numpy noise" if args.noise_seed is not None else "; OpenDP's exact noise")
          + (f"; switch interval {args.switch_interval} s" if args.switch_interval is not None else ""))
    if by_size:
        print("the encoder alone on calls of one iteration's new samples (N / T texts): " + "; ".join(
            f"{size} texts {rate:.0f} texts/s ({rate / peak:.2f} of the peak)" for size, rate in by_size.items()))
    print("| K | N | requests | generation s | / latency bound | / ideal client | run's CPU in generation, cores "
          "| own ms/request | embedding texts/s | / peak | voting s | wall s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    cache_root = Path(tempfile.mkdtemp(prefix="api-scale-"))
    rss: dict[int, dict[int, int]] = {}
    own_s: dict[int, dict[int, tuple[int, float]]] = {}  # K -> N -> (requests, own seconds)
    last_cache = None
    views: list[str] = []  # the server's view of each cell: a second table
    for k in args.k:
        for n in args.n:
            cache = fresh_request_cache(cache_root / f"k{k}-n{n}")  # one-time assets shared; generations start empty
            env = {**os.environ, "DPSYNTH_CACHE": str(cache), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "")}
            if args.switch_interval is not None:  # request processes are spawned: a sitecustomize reaches them too
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(switch_site(cache_root, args.switch_interval)),
                                                                  env.get("PYTHONPATH")]))
            cell_args = ["--concurrency", str(args.concurrency), "--processes", str(args.processes),
                         "--transport", args.transport,
                         "--m", str(args.m), "--iterations", str(args.iterations), "--embedder", args.embedder,
                         "--device", args.device]
            if args.noise_seed is not None:
                cell_args += ["--noise-seed", str(args.noise_seed)]
            done = subprocess.run([sys.executable, __file__, "--cell", f"{n},{k},{url}", *cell_args],
                                  capture_output=True, text=True, env={k_: v for k_, v in env.items() if v})
            line = next((x for x in done.stdout.splitlines() if x.startswith("CELL ")), None)
            if done.returncode != 0 or line is None:
                print(f"| {k} | {n} | failed: {done.stderr.strip().splitlines()[-1:]} |")
                continue
            cell = json.loads(line[5:])
            m, t = cell["metrics"], cell["metrics"]["timings"]
            requests = sum(u["requests"] for u in m["usage"].values())
            bound = latency_bound(m, args.concurrency, args.latency)
            ideal = ideal_bound([[first_asked_dropped(g) for g in record["generated"].values()]
                                 for record in m["iterations"]], args.concurrency, args.latency, WASP_ATTEMPTS)
            samples = sum(m["samples_per_plm"].values())
            embed_s = t.get("embedding", 0.0)
            holder = t.get("voting", 0.0) + t.get("data_holder", 0.0)  # the data holder's time, private side
            own = t["wall"] - t.get("generation", 0.0) - embed_s - holder - t.get("load_models", 0.0)
            throughput = samples / embed_s if embed_s else float("nan")  # the holder's private texts are in voting
            rss.setdefault(k, {})[n] = cell["peak_rss_bytes"]
            own_s.setdefault(k, {})[n] = (requests, own)
            generation, voting = t.get("generation", 0.0), t.get("voting", 0.0)
            busy = cell["generation_cpu_s"] / cell["generation_wall_s"] if cell["generation_wall_s"] else float("nan")
            print(f"| {k} | {n} | {requests} | {generation:.1f} | {generation / bound:.2f}x "
                  f"| {generation / ideal:.2f}x | {busy:.2f} "
                  f"| {own / requests * 1e3:.2f} | {throughput:.0f} | {throughput / peak:.2f} | {voting:.1f} "
                  f"| {t['wall']:.1f} | {cell['peak_rss_bytes'] / 2**20:.0f} |")
            last_cache = cache / "requests.sqlite"
            windows = cell["generation_windows"]
            with open(server_log / "cells.jsonl", "a") as f:
                f.write(json.dumps({"k": k, "n": n, "generation_windows": windows}) + "\n")
            v = server_view(server_log, windows, args.concurrency, args.latency)
            with open(server_log / "views.jsonl", "a") as f:  # kept as it comes, should the run be cut short
                f.write(json.dumps({"k": k, "n": n, **v}) + "\n")
            if v["requests"]:
                turnaround = "{:.1f} / {:.1f}".format(*v["turnaround_ms"]) if v["turnaround_ms"] else "-"
                views.append(f"| {k} | {n} | {v['requests']} | {v['busy']:.3f} | {v['lowest']:.3f} "
                             f"| {v['first_s']:.2f} | {turnaround} "
                             f"| {v['after_s']:.2f} | {v['served_ms']:.1f} |")
    if views:
        print("\nThe server's view (its request log; generation windows only): the share of the generators' slots "
              "that held a request there; the run's time before its first request and after its last answer, "
              "summed over iterations; how long a freed slot stayed free before its next request arrived (median / "
              "mean: the round trip through the client); the server's own time a request beyond the latency")
        print("| K | N | requests at the server | slots busy | generator least busy | before first request s "
              "| slot free ms, median / mean | after last answer s | server's own ms/request |")
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(views))
    for k, by_n_own in own_s.items():
        if len(by_n_own) > 1:
            reqs, secs = (np.array(v, dtype=float) for v in zip(*by_n_own.values()))
            slope, fixed = np.polyfit(reqs, secs, 1)
            print(f"K={k}: own time = {fixed:.2f} s fixed + {slope * 1e3:.3f} ms per request (least squares over "
                  f"N={', '.join(map(str, by_n_own))})")
    for k, by_n in rss.items():
        if len(by_n) > 1:
            small, large = min(by_n), max(by_n)
            print(f"K={k}: peak memory grows {(by_n[large] - by_n[small]) / (large - small):.0f} bytes per sample "
                  f"from N={small} to N={large}")
    if last_cache is not None and last_cache.exists():
        rows, get, put = cache_cost(last_cache)
        print(f"request cache with {rows} rows: {get:.0f} us per get (in batches of 100), {put:.0f} us per put")
    for server in servers:
        server.terminate()


if __name__ == "__main__":
    main()
