"""Pipeline overhead: the share of a WASP run's wall time spent outside generator calls.

    .venv/bin/python benchmarks/pipeline_overhead.py               # the WASP demo config (demo --wasp), fresh cache
    .venv/bin/python benchmarks/pipeline_overhead.py --n 120        # a smaller run
    .venv/bin/python benchmarks/pipeline_overhead.py --run-dir runs/demo   # read a finished run

The run uses an empty request cache (otherwise generation would cost nothing and the share
would mean nothing). Prints each phase as a share of wall time; the goal is < 10% overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from importlib.resources import files
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from fresh_cache import fresh_request_cache  # noqa: E402


def report(metrics: dict) -> None:
    t = metrics["timings"]
    wall, gen = t["wall"], t["generator_calls"]
    print(f"wall {wall:.1f} s; generator calls {gen:.1f} s")
    for key in ("load_models", "embedding", "voting", "evaluation"):
        if key in t:
            print(f"  {key:12s} {t[key] / wall:6.1%} of wall time")
    print(f"overhead outside generator calls: {1 - gen / wall:.1%} (goal < 10%)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--n", type=int)
    args = parser.parse_args()
    if args.run_dir:
        report(json.loads((args.run_dir / "metrics.json").read_text()))
        return
    from dpsynth.runs.config import parse_config
    from dpsynth.runs.engine import Run

    raw = yaml.safe_load(files("dpsynth.configs").joinpath("demo_wasp.yaml").read_text())
    if args.n:
        raw["wasp"]["n"] = args.n
    with tempfile.TemporaryDirectory() as tmp:
        # the one-time assets (corpora, models, test-set embeddings) shared; only generations start empty
        os.environ["DPSYNTH_CACHE"] = str(fresh_request_cache(Path(tmp) / "cache"))
        result = Run.create(parse_config(raw), Path(tmp) / "run").execute()
    report(result["metrics"])


if __name__ == "__main__":
    main()
