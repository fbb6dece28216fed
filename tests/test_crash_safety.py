"""Crash safety: a run killed with SIGKILL at any moment and resumed gives the uninterrupted result.

Each trial runs the real CLI (`dpsynth run CONFIG -o DIR`) in a subprocess on the fake backend
(tests/fakes.py) with a seeded noise source, kills it with SIGKILL (no cleanup, no `finally`) at a
random moment after its run directory appeared, resumes it with `dpsynth run --resume DIR`, and
compares with an uninterrupted run: the same synthetic.jsonl, the same noisy values in every saved
release, the same privacy events (each once) and an epsilon within budget.

The subprocess swaps the sentence-transformers model for a hash embedder (the embedding cache, the
votes and everything else are the real code) so that a trial costs seconds rather than the model's
load time; the fake generator and seeded noise make a run fully deterministic, so any difference
between the runs is a crash-safety bug. A federated run (a real Flower simulation with SecAgg+, whose Ray
workers lose their driver at the kill) agrees with its reference to SecAgg+'s quantisation step; its
releases saved before the kill must come back unchanged.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parent
EPSILON = 2.0

DRIVER = f"""
import hashlib, sys
sys.path.insert(0, {str(TESTS)!r})
import numpy as np
import fakes  # registers the "fake" generator backend
import dpsynth.embed.sentence as sentence

class HashEmbedder:
    def __init__(self, model, batch_size=None, device="cpu"):
        self.name = model

    def encode(self, texts):
        out = np.zeros((len(texts), 16), dtype=np.float32)
        for i, text in enumerate(texts):
            v = np.frombuffer(hashlib.sha256(text.encode()).digest()[:16], dtype=np.uint8).astype(np.float32) - 127.5
            out[i] = v / np.linalg.norm(v)
        return out

sentence.SentenceTransformerEmbedder = HashEmbedder
import dpsynth.cli
sys.argv = ["dpsynth", *sys.argv[1:]]
dpsynth.cli.app()
"""

PRIVATE = [(f"private review number {i} about a {'great' if i % 3 else 'poor'} film", "pos" if i % 3 else "neg")
           for i in range(30)]


def _config(root: Path, variant: str) -> Path:
    """`wasp`, `augpe` (both with the DP label histogram), or `federated-wasp`: three parties on a real Flower
    simulation with SecAgg+, whose noise shares are seeded like the central noise."""
    method = variant.removeprefix("federated-")
    csv = root / "private.csv"
    csv.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in PRIVATE))
    generators = [{"kind": "fake", "model": "a"}] + ([{"kind": "fake", "model": "b"}] if method == "wasp" else [])
    raw = {
        "method": method,
        "data": {"private": str(csv)},
        "task": {"text_kind": "review", "labels": {"pos": "a positive review", "neg": "a negative review"}},
        "generators": generators,
        method: {"n": 12, "iterations": 3},
        "privacy": {"epsilon": EPSILON, "delta": 1e-3, "label_proportions": "dp", "noise_seed": 7},
        "evaluate": False,
        "seed": 1,
    }
    if variant.startswith("federated-"):
        raw["federated"] = {"parties": 3, "partition": "iid", "max_records_per_party": 30}
        del raw["privacy"]["label_proportions"]  # a federation's label mix is public (docs/federated.md)
    path = root / f"{variant}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _start(args: list[str], cache: Path) -> subprocess.Popen:
    env = {**os.environ, "DPSYNTH_CACHE": str(cache)}
    return subprocess.Popen([sys.executable, "-c", DRIVER, *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, what: str) -> None:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{err[-3000:]}"


@dataclass
class Outcome:
    synthetic: str
    events: list[dict]
    epsilon: float
    releases: dict[str, list | None]


def _releases(run_dir: Path) -> dict[str, list | None]:
    return {p.name: json.loads(p.read_text())["values"]
            for p in sorted((run_dir / "checkpoints" / "releases").glob("*.json"))}


def _outcome(run_dir: Path) -> Outcome:
    privacy = json.loads((run_dir / "privacy.json").read_text())
    return Outcome((run_dir / "synthetic.jsonl").read_text(), privacy["events"], privacy["epsilon"],
                   _releases(run_dir))


# Files a run writes once, in order: the moments a kill can fall between.
# (.lock is taken before anything else is written: a kill right after it leaves a directory with nothing
# started, which `dpsynth run CONFIG -o DIR` starts again; not a moment to resume from.)
_REWRITTEN = {"state.json", "run.log", "embeddings.sqlite", "embeddings.sqlite-journal", ".lock"}


@dataclass
class Reference:
    config: Path
    outcome: Outcome
    milestones: list[tuple[str, float]]  # (file relative to the run dir, seconds until the next one appeared)


_references: dict[str, Reference] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("crash")


def _milestones(run_dir: Path) -> list[tuple[str, float]]:
    written = sorted((p.stat().st_mtime, str(p.relative_to(run_dir))) for p in run_dir.rglob("*")
                     if p.is_file() and p.name not in _REWRITTEN)
    return [(name, (written[i + 1][0] - t) if i + 1 < len(written) else 0.2)
            for i, (t, name) in enumerate(written)]


def _reference(workdir: Path, method: str) -> Reference:
    """The uninterrupted run of `method` (once per module, shared by the default and the slow test)."""
    if method not in _references:
        root = workdir / method
        root.mkdir()
        config = _config(root, method)
        run_dir = root / "uninterrupted"
        _finish(_start(["run", str(config), "-o", str(run_dir)], root / "cache-uninterrupted"), "the uninterrupted run")
        _references[method] = Reference(config, _outcome(run_dir), _milestones(run_dir))
    return _references[method]


def _kill_and_resume(workdir: Path, method: str, trial: int, milestone: str, delay: float) -> bool:
    """Start a run, SIGKILL it `delay` seconds after `milestone` appears in its directory, resume, compare.
    Returns whether the kill landed (False: the run had ended before its moment)."""
    ref = _reference(workdir, method)
    root = workdir / method
    run_dir, cache = root / f"trial-{trial}", root / f"cache-{trial}"
    proc = _start(["run", str(ref.config), "-o", str(run_dir)], cache)
    deadline = time.monotonic() + 300
    while proc.poll() is None and not (run_dir / milestone).exists():
        assert time.monotonic() < deadline, f"{milestone} did not appear"
        time.sleep(0.005)
    until = time.monotonic() + delay
    while proc.poll() is None and time.monotonic() < until:
        time.sleep(0.005)
    where = f"{method}, trial {trial}: SIGKILL {delay:.3f}s after {milestone} appeared"
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    killed = proc.returncode == -signal.SIGKILL  # not if it exited between the poll and the signal
    if not killed:
        where += " (the run had already ended)"
    left = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
    print(f"{where}: files left {left}")  # shown with pytest -s / -rP
    saved = _releases(run_dir)
    _finish(_start(["run", "--resume", str(run_dir)], cache), f"resume ({where}; files left: {left})")

    got, want = _outcome(run_dir), ref.outcome
    names = [e["name"] for e in got.events]
    assert len(names) == len(set(names)), f"{where}: a release was accounted twice: {names}"
    assert len(got.events) == len(want.events), f"{where}: events {names} vs {[e['name'] for e in want.events]}"
    assert got.epsilon == pytest.approx(want.epsilon, rel=1e-6), f"{where}: epsilon {got.epsilon} vs {want.epsilon}"
    assert {name: got.releases[name] for name in saved} == saved, f"{where}: a saved release was drawn again"
    if method.startswith("federated-"):
        # SecAgg+ quantises each party's share with unseeded stochastic rounding (flwr's own randomness), so two
        # federated runs agree on every noisy sum only to the quantisation step, not bit for bit.
        assert got.releases.keys() == want.releases.keys()
        for name, values in got.releases.items():
            assert values == pytest.approx(want.releases[name], abs=1e-3), f"{where}: {name} differs"
        assert len(got.synthetic.splitlines()) == len(want.synthetic.splitlines())
        return killed
    assert got.releases == want.releases, f"{where}: noisy releases differ from the uninterrupted run's"
    assert got.synthetic == want.synthetic, f"{where}: synthetic.jsonl differs from the uninterrupted run's"
    return killed


def _kill_points(ref: Reference, trials: int, rng: random.Random) -> list[tuple[str, float]]:
    """Stratified random kill moments: the reference run's milestones cut into `trials` slices, a random
    milestone in each, and a random delay before the next milestone would appear."""
    points = []
    for i in range(trials):
        name, gap = ref.milestones[int((i + rng.random()) * len(ref.milestones) / trials)]
        points.append((name, rng.random() * min(gap, 2.0)))
    return points


@pytest.mark.parametrize("method", ["wasp", "augpe", "federated-wasp"])
def test_sigkill_and_resume_gives_the_uninterrupted_run(method: str, workdir: Path) -> None:
    """Two kills: just after a random noisy release was saved (before the iteration's checkpoint), and at a
    random moment of the run."""
    rng = random.Random(16)
    ref = _reference(workdir, method)
    releases = [(name, gap) for name, gap in ref.milestones if "/releases/" in name]
    name, gap = rng.choice(releases)
    points = [(name, rng.random() * min(gap, 0.05)), *_kill_points(ref, 1, rng)]
    killed = [_kill_and_resume(workdir, method, trial, milestone, delay) for trial, (milestone, delay) in
              enumerate(points)]
    assert killed[0], f"the run ended before its kill just after {name} was saved: nothing was tested there"


@pytest.mark.exhaustive
@pytest.mark.parametrize("method", ["wasp", "augpe", "federated-wasp"])
def test_sigkill_at_many_moments_and_resume_gives_the_uninterrupted_run(method: str, workdir: Path) -> None:
    rng = random.Random(int(os.environ.get("DPSYNTH_CRASH_SEED", "2025")))
    for trial, (milestone, delay) in enumerate(_kill_points(_reference(workdir, method), 10, rng)):
        _kill_and_resume(workdir, method, 100 + trial, milestone, delay)
