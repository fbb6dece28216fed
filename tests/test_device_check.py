"""benchmarks/device_check.py (the GPU check of every `device:` path) run with the CPU against itself at tiny
sizes: it keeps the script that is run on a lent GPU working, and the device arguments of DP-SGD, DPO, sampling,
votes and the embedder exercised, where CI has no GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dpsynth.embed.sentence import DEFAULT_EMBEDDER


def test_every_device_path_agrees_with_itself_on_the_cpu() -> None:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "device_check.py"
    spec = importlib.util.spec_from_file_location("device_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.run_checks("cpu", DEFAULT_EMBEDDER, small=True)
    assert set(results) == {"embedder", "votes", "sampling", "dp_sgd", "dp_sgd_resume", "dpo"}
    assert all(r["ok"] for r in results.values()), results
    assert results["dp_sgd"]["update_norm"] > 0 and results["sampling"]["chars"] > 0
