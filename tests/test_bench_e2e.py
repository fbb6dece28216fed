"""A tiny real bench grid: WASP, Aug-PE (each PLM), equal-share zero-shot and private-only on TREC with the local models."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow


def test_tiny_bench_grid(tmp_path: Path) -> None:
    spec = {
        "name": "tiny",
        "base": {
            "data": {"corpus": "trec", "m": 40},
            "generators": [{"model": "smollm2-135m-instruct", "name": "smol"}, {"model": "gemma3-270m", "name": "gemma"}],
            "wasp": {"n": 12, "iterations": 2, "q": 2, "s": 2, "max_tokens": 24},
            "augpe": {"n": 6, "iterations": 2, "max_tokens": 24},
            "zero-shot": {"n": 12, "max_tokens": 24},
            "privacy": {"delta": 1e-5, "noise_seed": 0},
        },
        "variants": [
            {"name": "wasp", "method": "wasp"},
            {"name": "augpe", "method": "augpe"},
            {"name": "zero-shot", "method": "zero-shot"},
            {"name": "private_only", "method": "private_only"},
        ],
        "epsilons": [4.0],
        "seeds": [0],
        "eval_distribution": False,
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "DPSYNTH_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "dpsynth", "bench", str(path), "-o", str(tmp_path / "out")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "out" / "results.csv")))
    assert sorted(r["variant"] for r in rows) == ["augpe", "augpe", "augpe:zero_shot", "augpe:zero_shot", "private_only",
                                                  "wasp", "wasp:zero_shot", "zero-shot"]  # + runs' own references
    by = {(r["variant"], r["plms"]): r for r in rows}
    assert float(by[("wasp", "smol+gemma")]["epsilon_spent"]) <= 4.0
    assert float(by[("zero-shot", "smol+gemma")]["epsilon_spent"]) == 0.0
    assert by[("private_only", "smol+gemma")]["note"].startswith("private samples, NOT DP")
    for r in rows:
        assert 0.0 <= float(r["accuracy"]) <= 1.0
    assert "eps=4" in (tmp_path / "out" / "results.md").read_text()
    assert "<img" in (tmp_path / "out" / "report.html").read_text()
    # resumable: a second call re-runs nothing and reuses every cell
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and "running" not in again.stdout
