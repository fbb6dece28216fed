"""FuseGen's cost against equal-share zero-shot at the same generator calls, each run with an empty request cache.

    .venv/bin/python benchmarks/fusegen_cost.py                               # TREC, seed 1, 8 and 4 examples
    .venv/bin/python benchmarks/fusegen_cost.py --corpus rotten_tomatoes --max-tokens 60 --examples 8 4 2

Why a separate benchmark: in a bench grid FuseGen's first round asks exactly the zero-shot cell's requests, so
after the zero-shot cell they come from the request cache and the grid's wall times understate FuseGen's cost.
Here zero-shot and FuseGen (one run per `--examples`, the in-context examples every PLM sees in the feedback
rounds; 8 as published) run one after another with the bench's settings (SmolLM2-135M and Gemma-3-270M, one
thread each, N=120, 4 feedback rounds), each with its own empty request cache and without the downstream
evaluation. Per run it prints the wall time and its ratio to zero-shot's (issue 35's target: under 1.5x), the
time inside generator calls, the requests paid for, the prompt and completion tokens, and FuseGen's judging
(small task models, self-boosting weights and influence).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from fresh_cache import fresh_request_cache  # noqa: E402


def settings(args: argparse.Namespace, method: str, examples: int | None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "method": method,
        "data": {"corpus": args.corpus, "m": 100},
        "generators": [{"model": "smollm2-135m-instruct", "name": "smollm2-135m", "threads": 1},
                       {"model": "gemma3-270m", "name": "gemma3-270m", "threads": 1}],
        "zero-shot": {"n": args.n, "max_tokens": args.max_tokens},
        "fusegen": {"n": args.n, "rounds": args.rounds, "max_tokens": args.max_tokens},
        "seed": args.seed,
        "evaluate": False,
    }
    if examples is not None:
        raw["fusegen"]["examples"] = examples
    raw.pop("fusegen" if method == "zero-shot" else "zero-shot")  # a section for another method is refused
    return raw


def run_fresh(raw: dict[str, Any], root: Path) -> dict[str, Any]:
    """Run `raw` with a request cache of its own (the models, corpora and test embeddings shared)."""
    from dpsynth.runs.config import parse_config
    from dpsynth.runs.engine import Run

    cache = fresh_request_cache(root / "cache")
    before = os.environ.get("DPSYNTH_CACHE")
    os.environ["DPSYNTH_CACHE"] = str(cache)
    try:
        return Run.create(parse_config(raw), root / "run").execute()["metrics"]
    finally:
        if before is None:
            del os.environ["DPSYNTH_CACHE"]
        else:
            os.environ["DPSYNTH_CACHE"] = before


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default="trec")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--n", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--examples", type=int, nargs="+", default=[8, 4])
    args = parser.parse_args()
    from dpsynth.llm.quiet import set_verbose

    set_verbose(False)  # the table only: no progress bars from the judging STMs' loading

    runs = [("zero-shot", "zero-shot", None)] + [(f"fusegen, {e} examples", "fusegen", e) for e in args.examples]
    print(f"{args.corpus}, seed {args.seed}, N={args.n}; every run with an empty request cache")
    print("| run | wall s | vs zero-shot | generator calls s | requests | prompt tokens | completion tokens "
          "| judging s |")
    print("|---|---|---|---|---|---|---|---|")
    baseline = None
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, method, examples) in enumerate(runs):
            metrics = run_fresh(settings(args, method, examples), Path(tmp) / str(i))
            t, usage = metrics["timings"], metrics["usage"].values()
            wall = t["wall"] - t.get("load_models", 0.0)  # the models load once per run here, once per grid there
            baseline = baseline or wall
            print(f"| {label} | {wall:.1f} | {wall / baseline:.2f}x | {t['generator_calls']:.1f} | "
                  f"{sum(u['requests'] - u['cached'] for u in usage)} | {sum(u['prompt_tokens'] for u in usage)} | "
                  f"{sum(u['completion_tokens'] for u in usage)} | {t.get('judging', 0.0):.1f} |")
    print("wall: without loading the models")


if __name__ == "__main__":
    main()
