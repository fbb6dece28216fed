"""The run engine on the fake backend (no GGUF files): every registered method end to end, what
`dpsynth budget` plans equals what the run pays, release-time checkpoints, resume guards, and the
data-holder boundary (a method's step cannot reach a private text)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from fakes import FakeGenerator
from typer.testing import CliRunner

from dpsynth.cli import _typer_app
from dpsynth.errors import DpsynthError
from dpsynth.llm.base import GenerationResult
from dpsynth.methods.registry import method_class, method_names
from dpsynth.runs.config import parse_config
from dpsynth.runs.engine import Run, holds_a_run
from dpsynth.runs.planning import plan_privacy

PRIVATE = [(f"private review number {i} about a {'great' if i % 3 else 'poor'} film", "pos" if i % 3 else "neg")
           for i in range(30)]


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    FakeGenerator.calls = []
    FakeGenerator.fail_after = None


def _config(tmp_path: Path, method: str, **privacy) -> dict:
    csv = tmp_path / "private.csv"
    csv.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in PRIVATE))
    generators = [{"kind": "fake", "model": "a"}] + ([] if method_class(method).one_generator_per_run
                                                      else [{"kind": "fake", "model": "b"}])
    return {
        "method": method,
        "data": {"private": str(csv)},
        "task": {"text_kind": "review", "labels": {"pos": "a positive review", "neg": "a negative review"}},
        "generators": generators,
        method: {"zero-shot": {"n": 12}, "fusegen": {"n": 12, "rounds": 2, "examples": 2}, "dpga": {"n": 12, "generations": 2, "length_cap": 64}}.get(
            method, {"n": 12, "iterations": 3}),
        "privacy": {"epsilon": 2.0, "delta": 1e-3, "label_proportions": "dp", **privacy},
        "evaluate": False,
        "seed": 1,
    }


def _budget_epsilon(config_path: Path) -> float:
    result = CliRunner().invoke(_typer_app, ["budget", "--config", str(config_path)])
    assert result.exit_code == 0, result.output
    found = re.search(r"epsilon spent: ([0-9.]+)", result.output)
    return float(found.group(1)) if found else 0.0


# fine-tune real weights: end to end in tests/test_dpft.py, tests/test_popri.py and (in a real federation)
# tests/test_fedgen.py
NEEDS_A_MODEL_FILE = ("dpft", "fedgen", "popri")


@pytest.mark.parametrize("method,labels", [(m, "dp") for m in method_names() if m not in NEEDS_A_MODEL_FILE]
                         + [("wasp", None)])
def test_every_method_runs_and_pays_what_budget_plans(method: str, labels: str | None, tmp_path: Path) -> None:
    raw = _config(tmp_path, method)
    raw["privacy"]["label_proportions"] = labels
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(_typer_app, ["run", str(tmp_path / "run.yaml"), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "epsilon spent" in result.output
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    planned = _budget_epsilon(tmp_path / "run.yaml")
    assert privacy["epsilon"] == pytest.approx(planned, abs=1e-4)
    assert privacy["epsilon"] <= 2.0 * (1 + 1e-6)  # the planner's own cap, checked here against the config's budget
    names = [e["name"] for e in privacy["events"]]
    assert (names[0] in ("labels.histogram", "dpga.labels")) == (labels == "dp") and len(names) == len(set(names))
    assert "epsilon spent" in CliRunner().invoke(_typer_app, ["budget", "--config", str(tmp_path / "run.yaml")]).output \
        or method in ("zero-shot", "fusegen")
    assert (tmp_path / "run" / "synthetic.jsonl").read_text().count("\n") >= 6
    card = (tmp_path / "run" / "README.md").read_text()  # the un-noised checks are stated where data was read
    assert ("Checked without noise before the run starts" in card) == privacy["private_records_read"]
    if privacy["events"]:  # the guarantee in plain words, from the same ledger (eps=2 here: at most 11% at 5%)
        caught = privacy["membership_test"]["detection_rate_at_most"]
        stated = float(card.split("can be right about at most ")[1].split("%")[0]) / 100
        assert 0.05 < caught <= stated < caught + 0.001 < 0.2, "rounded up, never below the bound"
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    private_time = {"voting", "training", "data_holder"}  # runs/outputs.py: PRIVATE_TIMINGS
    assert not private_time & set(metrics["timings"]), "private-side time (it grows with M) stays out of metrics.json"
    # the dry run's estimate of the requests: what was asked, less the re-asks of dropped or duplicate samples
    planned = plan_privacy(parse_config(raw)).method.planned_requests(2)
    asked = sum(u["requests"] for u in metrics["usage"].values())
    assert planned <= asked <= 1.5 * planned
    dry = CliRunner().invoke(_typer_app, ["run", str(tmp_path / "run.yaml"), "--dry-run"])
    assert dry.exit_code == 0 and f"generator requests: {planned} in all" in dry.output, dry.output


@pytest.mark.parametrize("crash_after,saved", [(2, 1), (15, 2)],
                         ids=["after the label histogram", "after a vote release"])
def test_a_crash_after_a_release_never_draws_it_again(crash_after: int, saved: int, tmp_path: Path) -> None:
    """Secure noise, so drawing again would give other values; the saved release is reused instead."""
    cfg = parse_config(_config(tmp_path, "augpe"))  # 12 requests per iteration; votes cast in iteration 1
    FakeGenerator.fail_after = crash_after
    with pytest.raises(KeyboardInterrupt):
        Run.create(cfg, tmp_path / "run").execute()
    releases = tmp_path / "run" / "checkpoints" / "releases"
    before = {p.name: json.loads(p.read_text())["values"] for p in releases.glob("*.json")}
    assert len(before) == saved, "each release was saved the moment it was drawn"
    FakeGenerator.fail_after = None
    with pytest.raises(DpsynthError, match="already holds a run"):
        Run.create(cfg, tmp_path / "run")
    Run.resume(tmp_path / "run").execute()
    after = {p.name: json.loads(p.read_text())["values"] for p in releases.glob("*.json")}
    assert all(after[name] == values for name, values in before.items()), "no release was drawn twice"
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    names = [e["name"] for e in privacy["events"]]
    assert names == ["labels.histogram", "augpe.votes[iteration=1]", "augpe.votes[iteration=2]"]
    assert privacy["epsilon"] == pytest.approx(2.0, rel=1e-3)
    asked = [(r.seed, r.prompt_text()) for r in FakeGenerator.calls]
    assert len(asked) == len(set(asked)), "no generation was paid twice"
    usage = json.loads((tmp_path / "run" / "metrics.json").read_text())["usage"].values()
    assert sum(u["requests"] - u["cached"] for u in usage) == len(asked), \
        "the requests paid before Ctrl-C count as paid (spend caps), not as cache hits"


def test_a_stopped_steps_time_counts_in_the_resumed_runs_wall_time(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C mid-step keeps the step's usage, generator time included, for the resume; its wall time was lost
    (only checkpoints carried it), so the summary showed more generator time than wall time (a negative share
    outside generator calls). Requests 13-15 (the stopped step's) take 1.5 s each here, the others none."""
    import time

    slow = FakeGenerator.generate

    def generate(self, requests, on_result=None):
        if 12 <= len(FakeGenerator.calls) < 15:
            time.sleep(1.5)
        return slow(self, requests, on_result)

    monkeypatch.setattr(FakeGenerator, "generate", generate)
    cfg = parse_config(_config(tmp_path, "augpe"))  # 12 requests per iteration
    FakeGenerator.fail_after = 15
    with pytest.raises(KeyboardInterrupt):
        Run.create(cfg, tmp_path / "run").execute()
    FakeGenerator.fail_after = None
    stop = json.loads((tmp_path / "run" / "checkpoints" / "usage_at_stop.json").read_text())
    paid_seconds = sum(u["generation_seconds"] for u in stop["usage"].values())
    assert stop["wall_seconds"] >= paid_seconds >= 1.5
    Run.resume(tmp_path / "run").execute()
    timings = json.loads((tmp_path / "run" / "metrics.json").read_text())["timings"]
    assert timings["wall"] >= max(timings["generator_calls"], stop["wall_seconds"])


def test_a_stop_file_older_than_the_checkpoint_does_not_roll_its_usage_back(tmp_path: Path) -> None:
    """A kill between writing a checkpoint and removing usage_at_stop.json leaves the older file beside the newer
    checkpoint: its usage is counted in that checkpoint already and must not replace it (it did, undercounting what
    the spend caps see). A checkpoint missing a section is a one-line error."""
    cfg = parse_config(_config(tmp_path, "augpe"))
    FakeGenerator.fail_after = 15  # in iteration 1, after iteration 0's checkpoint
    with pytest.raises(KeyboardInterrupt):
        Run.create(cfg, tmp_path / "run").execute()
    FakeGenerator.fail_after = None
    stop = tmp_path / "run" / "checkpoints" / "usage_at_stop.json"
    old = stop.read_text()
    Run.resume(tmp_path / "run").execute()
    before = json.loads((tmp_path / "run" / "metrics.json").read_text())["usage"]
    stop.write_text(old)
    Run.resume(tmp_path / "run").execute()
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["usage"] == before
    state = tmp_path / "run" / "checkpoints" / "state.json"
    state.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items() if k != "ledger"}))
    with pytest.raises(DpsynthError, match="state.json: damaged checkpoint"):
        Run.resume(tmp_path / "run").execute()


def test_ctrl_c_during_the_summary_says_the_run_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C after the run finished (while its summary prints) exits 130 with one line naming the finished run,
    not silently as if the run had been cut."""
    import dpsynth.cli.runs as cli_runs

    def interrupted(run_dir: Path, result: dict) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_runs, "_print_summary", interrupted)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(_config(tmp_path, "zero-shot")))
    result = CliRunner().invoke(_typer_app, ["run", str(tmp_path / "run.yaml"), "-o", str(tmp_path / "run")])
    assert result.exit_code == 130, result.output
    assert f"the run had finished: its outputs are in {tmp_path / 'run'}" in " ".join(result.output.split())
    assert (tmp_path / "run" / "synthetic.jsonl").exists()


def test_a_saved_config_from_an_older_dpsynth_still_resumes(tmp_path: Path) -> None:
    """Older benches saved every method section of their base in each cell's config.yaml, and older runs wrote
    usage_at_stop.json as the usage alone: both still resume (the extra section is dropped, not refused)."""
    raw = _config(tmp_path, "augpe", label_proportions=None)
    FakeGenerator.fail_after = 15  # in iteration 1, after iteration 0's checkpoint
    with pytest.raises(KeyboardInterrupt):
        Run.create(parse_config(raw), tmp_path / "run").execute()
    FakeGenerator.fail_after = None
    config = tmp_path / "run" / "config.yaml"
    config.write_text(config.read_text() + "wasp: {n: 12, iterations: 3}\n")
    stop = tmp_path / "run" / "checkpoints" / "usage_at_stop.json"
    stop.write_text(json.dumps(json.loads(stop.read_text())["usage"]))  # the format before wall_seconds
    paid = len(FakeGenerator.calls)
    Run.resume(tmp_path / "run").execute()
    usage = json.loads((tmp_path / "run" / "metrics.json").read_text())["usage"].values()
    assert sum(u["requests"] - u["cached"] for u in usage) == len(FakeGenerator.calls) > paid


def test_a_run_stopped_before_it_paid_for_anything_may_start_again_in_its_folder(tmp_path: Path) -> None:
    """A first request refused (a wrong key, a server that is down, Ctrl-C) paid nothing and released nothing:
    no usage file is left, so the corrected run starts in the same folder (docs/bad-input.md row 66)."""
    raw = _config(tmp_path, "wasp", label_proportions=None)
    FakeGenerator.fail_after = len(FakeGenerator.calls)
    try:
        with pytest.raises(KeyboardInterrupt):
            Run.create(parse_config(raw), tmp_path / "run").execute()
    finally:
        FakeGenerator.fail_after = None
    assert not (tmp_path / "run" / "checkpoints" / "usage_at_stop.json").exists()
    Run.create(parse_config(raw), tmp_path / "run").execute()


@pytest.mark.parametrize("method,paid_before_kill", [("wasp", 3), ("augpe", 15)],
                         ids=["in the first step, before any checkpoint", "in a later step"])
def test_a_killed_run_counts_what_it_paid_from_the_request_cache(method: str, paid_before_kill: int,
                                                                  tmp_path: Path) -> None:
    """A SIGKILL between checkpoints leaves no usage file: the answers the killed step paid for are only in the
    request cache, stored under the run's id, and the resume counts them as paid (spend caps) rather than as free
    cache hits. Killed in its first step, the folder holds no checkpoint, so it must be resumed, not started
    afresh with its spend forgotten."""
    raw = _config(tmp_path, method, label_proportions=None)
    FakeGenerator.fail_after = paid_before_kill
    with pytest.raises(KeyboardInterrupt):
        Run.create(parse_config(raw), tmp_path / "run").execute()
    FakeGenerator.fail_after = None
    (tmp_path / "run" / "checkpoints" / "usage_at_stop.json").unlink()  # what a SIGKILL leaves: it was never written
    assert holds_a_run(tmp_path / "run")  # the bench, the audit, the demo and a Flower server app resume it too
    if paid_before_kill == 3:
        assert not (tmp_path / "run" / "checkpoints" / "state.json").exists()
        with pytest.raises(DpsynthError, match="already holds a run"):
            Run.create(parse_config(raw), tmp_path / "run")
    Run.resume(tmp_path / "run").execute()
    asked = [(r.seed, r.prompt_text()) for r in FakeGenerator.calls]
    assert len(asked) == len(set(asked)), "no generation was paid twice"
    usage = json.loads((tmp_path / "run" / "metrics.json").read_text())["usage"].values()
    assert sum(u["requests"] - u["cached"] for u in usage) == len(asked)
    assert sum(u["completion_tokens"] for u in usage) == 9 * len(asked)  # the fake answers with 9 tokens


def test_a_damaged_plan_is_resumed_not_deleted_by_a_fresh_start(tmp_path: Path) -> None:
    """A plan that cannot be read may name a run that paid: starting afresh would delete it; the resume says the
    checkpoint is damaged instead."""
    raw = _config(tmp_path, "wasp", label_proportions=None)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "plan.json").write_text("{not json")
    assert holds_a_run(tmp_path / "run")
    for _ in range(2):  # the second finds the directory unlocked (flock): the refused create released its lock
        with pytest.raises(DpsynthError, match="already holds a run"):
            Run.create(parse_config(raw), tmp_path / "run")


def test_a_plan_saved_without_a_run_id_gains_one_on_resume(tmp_path: Path) -> None:
    """A run begun by a dpsynth that did not name its runs gets an id when resumed, so that what it pays for from
    then on is counted after a kill too."""
    raw = _config(tmp_path, "augpe", label_proportions=None)
    FakeGenerator.fail_after = 15
    with pytest.raises(KeyboardInterrupt):
        Run.create(parse_config(raw), tmp_path / "run").execute()
    FakeGenerator.fail_after = None
    plan = tmp_path / "run" / "checkpoints" / "plan.json"
    saved = json.loads(plan.read_text())
    plan.write_text(json.dumps({k: v for k, v in saved.items() if k != "run_id"}))
    Run.resume(tmp_path / "run").execute()
    again = json.loads(plan.read_text())
    assert isinstance(again["run_id"], str) and again["run_id"] != saved["run_id"]
    assert {k: v for k, v in again.items() if k != "run_id"} == {k: v for k, v in saved.items() if k != "run_id"}


def test_resume_refuses_a_changed_unit_of_privacy_even_where_no_sensitivity_shows_it(tmp_path: Path) -> None:
    """A run begun per person (k = 1: every sensitivity the same as per record) must not go on per record, nor the
    other way round: the ledger's stated unit would be wrong for the releases already made."""
    raw = _config(tmp_path, "wasp")
    csv = tmp_path / "people.csv"
    csv.write_text("text,label,person\n" + "".join(f"{t},{y},p{i}\n" for i, (t, y) in enumerate(PRIVATE)))
    raw["data"] = {"private": str(csv), "person_column": "person"}
    Run.create(parse_config(raw), tmp_path / "run").execute()
    path = tmp_path / "run" / "config.yaml"
    edited = yaml.safe_load(path.read_text())
    edited["data"]["person_column"] = None
    path.write_text(yaml.safe_dump(edited, sort_keys=False))
    with pytest.raises(DpsynthError, match="the unit of privacy"):
        Run.resume(tmp_path / "run").execute()


def test_the_fingerprint_holds_what_a_resume_must_not_change_silently(tmp_path: Path) -> None:
    """A resume after an edit that moved records between fedgen's strong and weak parties (fedgen.strong, or a
    simulation's seed, partition or alpha) would let a record answer for both groups the ledger composes in
    parallel; local_steps changes the training event's steps; a share edit would leave noise calibrated for the
    old share under a report of the new. Each is refused; public settings (a temperature) are not."""
    from dpsynth.runs.engine import _changed_fields

    def changed(base: dict, **edits) -> str:
        edited = json.loads(json.dumps(base))
        for path, value in edits.items():
            *where, key = path.split("__")
            node = edited
            for part in where:
                node = node[part]
            node[key] = value
        return _changed_fields(plan_privacy(parse_config(base)).fingerprint(),
                               plan_privacy(parse_config(edited)).fingerprint())

    fedgen = {"method": "fedgen", "data": {"corpus": "rotten_tomatoes", "m": 100},
              "generators": [{"model": "smollm2-135m-instruct"}],
              "fedgen": {"rounds": 3, "local_steps": 5, "sampling_rate": 0.2, "k": 3, "strong": [0, 1, 2],
                         "temperature": 0.8},
              "privacy": {"epsilon": 4.0, "delta": 1e-5},
              "federated": {"parties": 10, "partition": "dirichlet", "max_records_per_party": 40}, "seed": 0}
    assert "which parties answer" in changed(fedgen, fedgen__strong=[2, 3, 4])
    assert "which records a simulated party holds" in changed(fedgen, seed=1)
    assert "which records a simulated party holds" in changed(fedgen, federated__alpha=0.5)
    assert "which records a simulated party holds" in changed(fedgen, federated__partition="iid")
    assert "privacy event" in changed(fedgen, fedgen__local_steps=6)
    assert changed(fedgen, fedgen__temperature=0.9) == ""
    wasp = {**fedgen, "method": "wasp", "generators": [{"model": "smollm2-135m-instruct"}, {"model": "gemma3-270m"}],
            "wasp": {"n": 12, "iterations": 3}}
    del wasp["fedgen"]
    assert changed(wasp, seed=1) == "", "without party groups every release asks every party: the split is free"
    central = _config(tmp_path, "wasp")
    central["relabel"] = {"share": 0.2}
    assert "a share of epsilon" in changed(central, relabel__share=0.4)
    assert changed(central, seed=2) == "", "a central run's seed moves no record between releases"


def test_a_saved_vote_release_never_answers_for_other_candidates(tmp_path: Path, monkeypatch) -> None:
    """Killed after iteration 0's vote release was saved, before its checkpoint: a resume that regenerates other
    candidates (here a lost request cache and a server that answers otherwise, as an API at temperature > 0 does;
    an edited seed is refused before, by the config check) is refused instead of selecting and weighting its
    texts with votes cast on others; the resume with the cache goes on with the saved votes."""
    raw = _config(tmp_path, "wasp")
    save = Run._save_checkpoint

    def killed(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Run, "_save_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        Run.create(parse_config(raw), tmp_path / "run").execute()
    monkeypatch.setattr(Run, "_save_checkpoint", save)
    saved = json.loads((tmp_path / "run" / "checkpoints" / "releases" / "wasp.votes_iteration=0_.json").read_text())
    assert saved["asked"]["candidates"] == 4 and len(saved["asked"]["projection"]) == 4  # n / T
    answer = FakeGenerator.generate

    def otherwise(self, requests, on_result=None):
        out = [GenerationResult(r.text + " Again.", r.prompt_tokens, r.completion_tokens)
               for r in answer(self, requests)]
        for i, r in enumerate(out):
            if on_result:
                on_result(i, r)
        return out

    cache = os.environ.get("DPSYNTH_CACHE")
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "another-cache"))
    monkeypatch.setattr(FakeGenerator, "generate", otherwise)
    with pytest.raises(DpsynthError, match="wasp.votes\\[iteration=0\\] was drawn for other candidates"):
        Run.resume(tmp_path / "run").execute()
    monkeypatch.setattr(FakeGenerator, "generate", answer)
    if cache is None:
        monkeypatch.delenv("DPSYNTH_CACHE")
    else:
        monkeypatch.setenv("DPSYNTH_CACHE", cache)
    out = Run.resume(tmp_path / "run").execute()
    after = json.loads((tmp_path / "run" / "checkpoints" / "releases" / "wasp.votes_iteration=0_.json").read_text())
    assert after["values"] == saved["values"] and len(out["privacy"]["events"]) == 3


def test_the_request_check_tolerates_re_embedding_and_refuses_other_texts() -> None:
    from dpsynth.private.holder import asked_about, check_same_request
    from dpsynth.voting.spec import VoteSpec

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(50, 384))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    labels = np.arange(50) % 2
    spec = VoteSpec(kind="wasp", q=2)
    before = json.loads(json.dumps(asked_about(spec, emb, labels)))  # as saved and read back
    check_same_request("r", before, asked_about(spec, emb + rng.normal(scale=1e-6, size=emb.shape), labels))
    check_same_request("r", None, asked_about(spec, emb, labels))  # a release saved by an older dpsynth
    # a request saved before VoteSpec had clip_per_unit (it lacks the key) is the same vote
    old = {**before, "spec": {k: v for k, v in before["spec"].items() if k != "clip_per_unit"}}
    check_same_request("r", old, asked_about(spec, emb, labels))
    sums = VoteSpec(kind="embedding_sums")
    old_sums = {**asked_about(sums, emb[:2], labels[:2]), "spec": {"kind": "embedding_sums", "q": 8,
                                                                    "weights": [1.0], "sampling_rate": 1.0}}
    check_same_request("r", old_sums, asked_about(VoteSpec(kind="embedding_sums", clip_per_unit=True), emb[:2],
                                                  labels[:2]))
    none = asked_about(spec, np.zeros((0, 384)), np.zeros(0, dtype=np.int64))  # an iteration that kept nothing
    assert none["candidates"] == 0 and none["projection"] == []
    other = emb.copy()
    other[7] = rng.normal(size=384) / np.sqrt(384)
    for now in (asked_about(spec, other, labels), asked_about(spec, emb, labels[::-1]),
                asked_about(spec, emb[:49], labels[:49]), asked_about(VoteSpec(kind="wasp", q=3), emb, labels)):
        with pytest.raises(DpsynthError, match="drawn for other candidates"):
            check_same_request("r", before, now)


def test_resume_refuses_a_changed_privacy_setting_and_old_checkpoints(tmp_path: Path) -> None:
    cfg = parse_config(_config(tmp_path, "wasp"))
    Run.create(cfg, tmp_path / "run").execute()
    path = tmp_path / "run" / "config.yaml"
    edited = yaml.safe_load(path.read_text())
    edited["privacy"]["epsilon"] = 8.0
    path.write_text(yaml.safe_dump(edited, sort_keys=False))
    with pytest.raises(DpsynthError, match="privacy.epsilon changed since the run started"):
        Run.resume(tmp_path / "run").execute()
    edited["privacy"]["epsilon"] = 2.0
    edited["wasp"]["iterations"] = 5
    path.write_text(yaml.safe_dump(edited, sort_keys=False))
    with pytest.raises(DpsynthError, match="schedule of releases"):
        Run.resume(tmp_path / "run").execute()
    edited["wasp"]["iterations"] = 3
    path.write_text(yaml.safe_dump(edited, sort_keys=False))
    state = tmp_path / "run" / "checkpoints" / "state.json"
    state.write_text("{trunc")
    with pytest.raises(DpsynthError, match="damaged checkpoint"):
        Run.resume(tmp_path / "run").execute()
    (tmp_path / "run" / "checkpoints" / "plan.json").unlink()  # a run directory of the earlier format
    state.write_text(json.dumps({"sigma": 3.0, "state": {}}))
    with pytest.raises(DpsynthError, match="older dpsynth"):
        Run.resume(tmp_path / "run").execute()


def test_resume_refuses_other_generators_data_or_options_and_accepts_caps(tmp_path: Path) -> None:
    """Editing config.yaml is how a cap is raised; any other edit of what the samples come from (a generator, the
    seed, the data, a method option) would mix two settings in one output, and is refused by name."""
    cfg = parse_config(_config(tmp_path, "wasp"))
    Run.create(cfg, tmp_path / "run").execute()
    path = tmp_path / "run" / "config.yaml"
    original = path.read_text()
    for edit, named in [(lambda c: c["generators"][0].update(model="other"), "generators[0].model"),
                        (lambda c: c.update(seed=5), "seed"),
                        (lambda c: c["wasp"].update(temperature=0.5), "wasp.temperature"),
                        (lambda c: c["data"].update(label_column="y"), "data.label_column"),
                        (lambda c: c.update(generators=c["generators"][:1]), "generators"),
                        (lambda c: c["task"].update(labels=dict(reversed(c["task"]["labels"].items()))),
                         "task.labels (their order counts too)")]:
        edited = yaml.safe_load(original)
        edit(edited)
        path.write_text(yaml.safe_dump(edited, sort_keys=False))
        with pytest.raises(DpsynthError, match=rf": {re.escape(named)} changed since the run started; the samples"):
            Run.resume(tmp_path / "run").execute()
    edited = yaml.safe_load(original)
    edited["generators"][0].update(max_requests=1000, max_retries=9, timeout=5.0, max_concurrency=2, n_ctx=4096)
    edited.update(device="cpu")
    path.write_text(yaml.safe_dump(edited, sort_keys=False))
    Run.resume(tmp_path / "run").execute()  # operational settings only: resumes


def test_a_run_over_its_budget_at_release_writes_no_output(tmp_path: Path, monkeypatch) -> None:
    """The budget (and the accountants' cross-check) is checked before the synthetic set is written, not after."""
    from dpsynth.runs import outputs

    real = outputs.privacy_report
    monkeypatch.setattr(outputs, "privacy_report", lambda *a, **k: {**real(*a, **k), "within_budget": False})
    with pytest.raises(DpsynthError, match="exceeds the budget at release .*nothing was written"):
        Run.create(parse_config(_config(tmp_path, "wasp")), tmp_path / "run").execute()
    assert not [p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(("synthetic", "privacy"))]


def _strings(obj: object, seen: set[int], depth: int = 0):
    """Every string reachable from `obj` through attributes (public, private and name-mangled; not dunder
    ones), containers, bound methods and dpsynth objects."""
    if id(obj) in seen or depth > 8:
        return
    seen.add(id(obj))
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k, seen, depth + 1)
            yield from _strings(v, seen, depth + 1)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from _strings(v, seen, depth + 1)
    elif isinstance(obj, np.ndarray):
        if obj.dtype == object:
            yield from _strings(obj.tolist(), seen, depth + 1)
    elif hasattr(obj, "__self__") and callable(obj):  # a bound method: what it is bound to
        yield from _strings(obj.__self__, seen, depth + 1)
    elif (type(obj).__module__.startswith(("dpsynth", "fakes")) or dataclasses.is_dataclass(obj)) \
            and not isinstance(obj, type):
        for name in dir(obj):
            if name.startswith(("__", "model_")) or name.endswith("__"):
                continue
            try:
                value = getattr(obj, name)
            except Exception:  # properties that need state
                continue
            yield from _strings(value, seen, depth + 1)


def test_a_methods_step_cannot_reach_a_private_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth.data.records import LabelledTexts
    from dpsynth.private.dataset import PrivateData

    texts = {t for t, _ in PRIVATE}
    # the walk finds a private text wherever an attribute exposes it, even a name-mangled one (so the
    # check can fail): the central holder itself holds them
    from dpsynth.private.holder import CentralHolder

    exposed = {"data": PrivateData(LabelledTexts([PRIVATE[0][0]], ["pos"]))}
    assert texts & set(_strings(exposed, set()))
    holder = CentralHolder(LabelledTexts([PRIVATE[1][0]], ["pos"]), ["pos", "neg"], None, ledger=None, noise=None,
                           schedule=None, knobs={}, store=None)
    assert texts & set(_strings({"holder": holder}, set()))

    wasp = method_class("wasp")
    original = wasp.step
    reached: list[set[str]] = []

    def step(self, ctx, state, t):
        reached.append(texts & set(_strings(ctx, set())) | texts & set(_strings(self, set())))
        return original(self, ctx, state, t)

    monkeypatch.setattr(wasp, "step", step)
    Run.create(parse_config(_config(tmp_path, "wasp")), tmp_path / "run").execute()
    assert len(reached) == 3 and not any(reached)


def test_signal_to_noise_is_from_noisy_values_and_advises_when_votes_are_noise() -> None:
    from dpsynth.cli.runs import signal_lines
    from dpsynth.private.holder import signal_to_noise

    rng = np.random.default_rng(0)
    noise_only = signal_to_noise(rng.normal(0, 2.0, size=5000), 2.0)
    assert noise_only["above_3_noise"] < 0.01
    strong = signal_to_noise(np.r_[np.full(100, 40.0), rng.normal(0, 2.0, size=100)], 2.0)
    assert strong["above_3_noise"] >= 0.5 and strong["max_over_noise"] == pytest.approx(20.0)
    lines = signal_lines([{"releases": {"wasp.votes[iteration=0]": noise_only}}])
    assert any("most entries are noise" in line for line in lines)
    assert not any("most entries are noise" in line for line in signal_lines([{"releases": {"r": strong}}]))


def test_one_process_at_a_time_runs_a_run_directory(tmp_path: Path) -> None:
    """Two processes on one directory would each draw the next release: the second one is refused, in this
    process and in another, until the first has finished (or died: the OS drops the lock)."""
    cfg = parse_config(_config(tmp_path, "augpe"))
    first = Run.create(cfg, tmp_path / "run")
    with pytest.raises(DpsynthError, match="is in use by dpsynth process"):
        Run.resume(tmp_path / "run")
    driver = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import fakes, dpsynth.cli; "
              f"sys.argv = ['dpsynth', 'run', '--resume', {str(tmp_path / 'run')!r}]; dpsynth.cli.app()")
    other = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120)
    assert other.returncode == 2, other.stderr
    assert "is in use by dpsynth process" in other.stderr and "Traceback" not in other.stderr
    first.execute()  # releases the directory when it returns
    assert Run.resume(tmp_path / "run").execute()["privacy"]["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert len({e["name"] for e in json.loads((tmp_path / "run" / "privacy.json").read_text())["events"]}) == 3


@pytest.mark.parametrize("crash_after", [12, 30])
def test_fusegen_interrupted_mid_run_resumes_to_the_uninterrupted_samples(crash_after: int, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """FuseGen's feedback rounds depend on the examples chosen after each round: a resumed run must show the next
    round the same examples, so that its samples (and weights) are those of the run that was never stopped."""
    raw = _config(tmp_path, "fusegen")
    raw["fusegen"] = {"n": 36, "rounds": 3, "examples": 2}
    raw["privacy"]["noise_seed"] = 7  # the DP label shares the same in both runs
    cfg = parse_config(raw)
    Run.create(cfg, tmp_path / "whole").execute()
    whole = (tmp_path / "whole" / "synthetic.jsonl").read_text()
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache2"))  # the interrupted run pays its own requests
    FakeGenerator.calls, FakeGenerator.fail_after = [], crash_after
    with pytest.raises(KeyboardInterrupt):
        Run.create(cfg, tmp_path / "run").execute()
    FakeGenerator.fail_after = None
    Run.resume(tmp_path / "run").execute()
    assert (tmp_path / "run" / "synthetic.jsonl").read_text() == whole


def test_every_request_through_the_holders_door_is_timed_as_private_time() -> None:
    """Each of a step's requests to the data holder is timed where it enters (`HolderRequests`), as training (DP
    training) or voting (every other release), so that none is left in the time a run shares (DPGA's keyword
    votes and length bounds, asked directly, once were)."""
    from dpsynth.private.holder import HolderRequests

    class Holder:
        def __getattr__(self, name: str):
            return lambda *args, **kwargs: name

    timed: list[tuple[str, str]] = []
    door = HolderRequests(Holder(), on_time=lambda key, since: timed.append((key, name)))  # type: ignore[arg-type]
    for name in HolderRequests.__slots__:
        assert getattr(door, name)() == name
    assert timed == [("training" if name == "train_adapter" else "voting", name) for name in HolderRequests.__slots__]


def test_a_run_that_failed_before_spending_anything_can_be_started_again_in_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A generator that cannot be built (here an API key with a line break, which no header can carry) is found
    once the run's directory and plan exist; nothing was spent, so the corrected config starts in the same
    directory (it used to be refused as 'already holds a run', and a resume read the broken config again)."""
    raw = _config(tmp_path, "augpe")
    monkeypatch.setenv("DPSYNTH_TEST_BROKEN_KEY", "a\nb")
    broken = {**raw, "generators": [{"kind": "openai", "model": "x", "base_url": "http://127.0.0.1:9/v1",
                                     "api_key_env": "DPSYNTH_TEST_BROKEN_KEY"}]}
    with pytest.raises(DpsynthError, match="holds a line break"):
        Run.create(parse_config(broken), tmp_path / "run").execute()
    assert (tmp_path / "run" / "checkpoints" / "plan.json").exists()
    Run.create(parse_config(raw), tmp_path / "run").execute()
    assert (tmp_path / "run" / "metrics.json").exists()
    with pytest.raises(DpsynthError, match="already holds a run"):  # one that spent something is kept
        Run.create(parse_config(raw), tmp_path / "run")


def test_a_run_is_refused_in_a_folder_holding_files_no_run_made(tmp_path: Path) -> None:
    """`-o .` in a project folder used to overwrite the user's own README.md and config.yaml."""
    raw = _config(tmp_path, "augpe")
    project = tmp_path / "project"
    project.mkdir()
    for name in ("README.md", "config.yaml", "tickets.csv"):
        (project / name).write_text(f"the user's {name}")
    with pytest.raises(DpsynthError, match=r"holds files that are not a dpsynth run's \(README.md, config.yaml, "
                                           r"tickets.csv\), which the run would overwrite"):
        Run.create(parse_config(raw), project)
    assert sorted(p.name for p in project.iterdir()) == ["README.md", "config.yaml", "tickets.csv"]
    assert (project / "README.md").read_text() == "the user's README.md"
    (project / "checkpoints").mkdir()  # a name ML projects use too: not the mark of a run
    with pytest.raises(DpsynthError, match="holds files that are not a dpsynth run's"):
        Run.create(parse_config(raw), project)
    (tmp_path / "empty").mkdir()
    Run.create(parse_config(raw), tmp_path / "empty").close()  # an empty folder is taken
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / ".DS_Store").write_text("")  # and one holding hidden files only
    Run.create(parse_config(raw), tmp_path / "hidden").close()


def test_the_holders_time_is_counted_and_kept_out_of_the_shared_metrics(tmp_path: Path) -> None:
    """The engine wires the holder's door to the run's timings: its requests (votes, label counts) and its own
    loading are in the caller's metrics, and metrics.json's wall is the run's less exactly that time."""
    result = Run.create(parse_config(_config(tmp_path, "augpe")), tmp_path / "run").execute()
    timings = result["metrics"]["timings"]
    assert timings["voting"] > 0 and timings["data_holder"] > 0
    shared = json.loads((tmp_path / "run" / "metrics.json").read_text())["timings"]
    assert shared["wall"] == pytest.approx(timings["wall"] - timings["voting"] - timings["data_holder"])
    assert not {"voting", "training", "data_holder"} & set(shared)


def test_the_evaluations_time_leaves_out_the_embedding_it_asks_for(tmp_path: Path) -> None:
    """The synthetic sets' embedding inside the in-run evaluation is timed as embedding, once, not also as
    evaluation."""
    import time

    import numpy as np

    from dpsynth.data.records import LabelledTexts
    from dpsynth.methods.base import StepContext
    from dpsynth.methods.generation import SyntheticSample
    from dpsynth.runs.outputs import evaluate_sets

    def slow_embed(texts: list[str]) -> np.ndarray:
        time.sleep(1.0)
        return np.random.default_rng(len(texts)).normal(size=(len(texts), 4)).astype(np.float32)

    class Embedder:
        name = "test-embedder"

        def encode(self, texts):
            return np.random.default_rng(0).normal(size=(len(texts), 4)).astype(np.float32)

    ctx = StepContext(config=None, task=None, label_shares={}, generators={}, holder=None,  # type: ignore[arg-type]
                      embed=slow_embed)
    samples = [SyntheticSample(i, f"text {i}", "pos" if i % 2 else "neg", "a", 0) for i in range(8)]
    test = LabelledTexts([f"test {i}" for i in range(6)], ["pos", "neg"] * 3)
    evaluate_sets(ctx, Embedder(), test, {"final": samples}, seed=0)
    # counted in both, evaluation would hold all of embedding's second and more
    assert ctx.timings["embedding"] >= 1.0 > ctx.timings["evaluation"]
