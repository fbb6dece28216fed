"""End to end with the real local models (llama.cpp) at tiny sizes.

- the privacy boundary: canaries planted in the private data never reach a
  prompt, a log line or any file of the run; no clean histogram is written;
- Ctrl-C mid-run and `dpsynth run --resume` give the uninterrupted result and
  pay for no generation twice.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

CANARIES = [
    "Zyxqv canary alpha: the purple hippo reviewed the quantum lasagna with great delight",
    "Wobbleton canary beta: a dreadful ferret opera that left every critic utterly bored",
]


def _private_csv(path: Path) -> Path:
    rows = [("An uplifting, warm and funny film with a terrific cast.", "positive"),
            ("A tedious mess that wastes its talented actors.", "negative")] * 8
    rows += [(CANARIES[0], "positive"), (CANARIES[1], "negative")]
    import pandas as pd

    pd.DataFrame(rows, columns=["review", "sentiment"]).to_csv(path, index=False)
    return path


def _config(tmp_path: Path, **wasp) -> dict:
    return {
        "data": {"private": str(_private_csv(tmp_path / "private.csv")), "text_column": "review",
                 "label_column": "sentiment"},
        "task": {"text_kind": "movie review", "description": "Short movie reviews by film critics.",
                 "labels": {"positive": "a positive review that praises the film",
                            "negative": "a negative review that criticises the film"}},
        "generators": [{"model": "smollm2-135m-instruct", "name": "smol"}, {"model": "gemma3-270m", "name": "gemma"}],
        "wasp": {"n": 16, "iterations": 3, "q": 2, "s": 2, "max_tokens": 32, **wasp},
        "privacy": {"epsilon": 4.0, "delta": 1e-3, "noise_seed": 11},
        "evaluate": False,
        "seed": 3,
    }


def _run(args: list[str], cache: Path, cwd: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "DPSYNTH_CACHE": str(cache)}
    return subprocess.Popen([sys.executable, "-m", "dpsynth", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out


def _prompts(cache: Path) -> list[str]:
    db = sqlite3.connect(cache / "requests.sqlite")
    return [row[0] for row in db.execute("SELECT prompt FROM generations")]


def _substrings(text: str, n: int = 20) -> set[str]:
    return {text[i : i + n] for i in range(len(text) - n + 1)}


def test_privacy_boundary_with_canaries(tmp_path: Path) -> None:
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(_config(tmp_path)))
    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    out = _finish(_run(["run", str(cfg_path), "-o", str(run_dir)], cache, tmp_path))
    assert "epsilon spent" in out

    private_texts = list(CANARIES) + ["An uplifting, warm and funny film with a terrific cast.",
                                      "A tedious mess that wastes its talented actors."]
    needles = set().union(*(_substrings(t) for t in private_texts))
    prompts = _prompts(cache)
    assert prompts, "the run sent requests"
    for prompt in prompts:
        assert not any(n in prompt for n in needles), "a private substring reached a generator"
    artifacts = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {"synthetic.jsonl", "privacy.json", "metrics.json", "config.yaml", "run.log"} <= {p.name for p in artifacts}
    for path in artifacts:
        text = path.read_bytes().decode("utf-8", errors="ignore")
        hits = [n for n in needles if n in text]
        assert not hits, f"{path.name} contains private text: {hits[:1]}"

    # No clean statistic: checkpoints hold selections (ids) and weights; the only per-sample vectors are the
    # noisy releases (release-time checkpoints), and those are noised: clean WASP votes with Q=2 are
    # multiples of 1/2, noisy ones almost never are.
    state = json.loads((run_dir / "checkpoints" / "state.json").read_text())
    pool = len(state["state"]["samples"])
    assert set(state) == {"format", "ledger", "state", "label_shares", "usage", "timings", "wall_seconds"}
    releases = sorted((run_dir / "checkpoints" / "releases").glob("*.json"))
    assert [json.loads(p.read_text())["name"] for p in releases] == [e["name"] for e in
                                                                     json.loads((run_dir / "privacy.json").read_text())["events"]]
    for path in releases:
        values = json.loads(path.read_text())["values"]
        assert sum(float(2 * v).is_integer() for v in values) <= 1, f"{path.name} looks un-noised"

    def numeric_lists(obj):
        if isinstance(obj, list) and obj and all(isinstance(v, (int, float)) for v in obj):
            yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from numeric_lists(v)
        elif isinstance(obj, list):
            for v in obj:
                yield from numeric_lists(v)

    for path in artifacts:
        if path.suffix == ".json" and path.parent.name != "releases":
            for values in numeric_lists(json.loads(path.read_text())):
                assert len(values) < min(pool, 2 * 8), f"{path.name} holds a per-sample numeric vector"
    assert "M=" not in (run_dir / "run.log").read_text(), "the exact private record count is not logged"
    privacy = json.loads((run_dir / "privacy.json").read_text())
    assert privacy["epsilon"] <= 4.0 and len(privacy["events"]) == 2
    assert privacy["noise"]["for_release"] is False


def _interruptible_niced() -> None:
    """In the child before exec: niced, so that the test's polling keeps up on a loaded machine; and with
    Ctrl-C's default action, since a suite started in the background (`pytest &`, nohup, CI runners) passes
    SIGINT down as ignored, and Python then never raises KeyboardInterrupt."""
    os.nice(10)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_interrupt_and_resume_match_uninterrupted_run(tmp_path: Path) -> None:
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(_config(tmp_path)))
    cache_a, cache_b = tmp_path / "cache_a", tmp_path / "cache_b"
    _finish(_run(["run", str(cfg_path), "-o", str(tmp_path / "a")], cache_a, tmp_path))

    proc = _run(["run", str(cfg_path), "-o", str(tmp_path / "b")], cache_b, tmp_path, preexec_fn=_interruptible_niced)
    first_ckpt = tmp_path / "b" / "checkpoints" / "iteration_0.json"
    deadline = time.time() + 900  # generous: the run is niced and the machine may be busy
    while not first_ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert first_ckpt.exists(), "iteration 0 finished"
    # Wait until iteration 1 has paid for a generation, freeze the run (SIGSTOP) so that it cannot finish
    # between our look and the Ctrl-C, then press Ctrl-C and let it go on to handle it.
    done_at_ckpt = len(_prompts(cache_b))
    while len(_prompts(cache_b)) < done_at_ckpt + 1 and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGSTOP)
    paid = len(_prompts(cache_b)) - done_at_ckpt
    assert proc.poll() is None, f"the run finished before it could be interrupted ({paid} generations after iteration 0)"
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, f"{paid} generations after iteration 0 when interrupted\n" + err[-2000:]
    assert "dpsynth run --resume" in err
    assert not (tmp_path / "b" / "synthetic.jsonl").exists()

    _finish(_run(["run", "--resume", str(tmp_path / "b")], cache_b, tmp_path))
    a = (tmp_path / "a" / "synthetic.jsonl").read_text()
    b = (tmp_path / "b" / "synthetic.jsonl").read_text()
    assert a == b
    assert len(_prompts(cache_b)) == len(_prompts(cache_a))
    writes = sqlite3.connect(cache_b / "requests.sqlite").execute("SELECT MAX(writes) FROM generations").fetchone()
    assert writes == (1,), "no generation was paid for twice"
    pa = json.loads((tmp_path / "a" / "privacy.json").read_text())
    pb = json.loads((tmp_path / "b" / "privacy.json").read_text())
    assert pa["epsilon"] == pytest.approx(pb["epsilon"]) and len(pb["events"]) == len(pa["events"]) == 2
