"""Aug-PE's pieces and its accounting; equal-share allocation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import sigma_for

from dpsynth.data.records import TaskSpec
from dpsynth.errors import DpsynthError
from dpsynth.methods.augpe import apply_threshold, select_parents, vote_weights
from dpsynth.methods.generation import SyntheticSample
from dpsynth.prompts.builder import build_variation_request
from dpsynth.runs.config import parse_config

TASK = TaskSpec("movie review", {"pos": "a positive review", "neg": "a negative review"}, description="Reviews.")


def test_vote_weights_have_unit_norm() -> None:
    assert vote_weights("top1", 5) == [1.0]
    assert math.isclose(np.linalg.norm(vote_weights("knn", 4)), 1.0)


def test_augpe_sigma_equals_gaussian_dp_table() -> None:
    # PRIVACY.md: eps 4, delta 1e-5: sigma 2.162 for 4 releases, 3.419 for 10
    assert sigma_for("augpe", 5, 4.0) == pytest.approx(2.162, rel=5e-3)
    assert sigma_for("augpe", 11, 4.0) == pytest.approx(3.419, rel=5e-3)


def _population() -> list[SyntheticSample]:
    return [SyntheticSample(i, f"text {i}", "pos" if i < 4 else "neg", "p", 0) for i in range(8)]


def test_rank_selection_takes_the_top_third_and_cycles() -> None:
    noisy = np.array([0.1, 5.0, -2.0, 3.0, 1.0, 0.0, 0.0, 9.0])
    parents = select_parents(noisy, _population(), {"pos": 3, "neg": 1}, "rank", np.random.default_rng(0))
    assert [p.id for p in parents["pos"]] == [1, 3, 1]  # ceil(4 / 3) = 2 parents kept
    assert [p.id for p in parents["neg"]] == [7]


def test_rank_selection_follows_the_votes_when_the_population_is_as_large_as_the_count() -> None:
    """A real run asks for as many parents as the population holds: keeping the whole population, cycled, made
    every sample a parent once whatever the votes (the releases paid for nothing)."""
    population = [SyntheticSample(i, f"text {i}", "pos", "p", 0) for i in range(150)]
    noisy = np.zeros(150)
    noisy[[3, 40, 77, 101, 149]] = 20.0
    parents = select_parents(noisy, population, {"pos": 150}, "rank", np.random.default_rng(0), fold=3)
    chosen = [p.id for p in parents["pos"]]
    assert len(set(chosen)) == 50 and {3, 40, 77, 101, 149} <= set(chosen)
    assert all(chosen.count(i) == 3 for i in (3, 40, 77, 101, 149))


def test_rank_selection_without_a_vote_above_zero_keeps_a_random_third() -> None:
    population = [SyntheticSample(i, f"text {i}", "pos", "p", 0) for i in range(150)]
    parents = select_parents(np.zeros(150), population, {"pos": 150}, "rank", np.random.default_rng(0), fold=3)
    chosen = {p.id for p in parents["pos"]}
    assert len(chosen) == 50 and chosen != set(range(50))  # not the first third by index


def test_the_threshold_is_subtracted_not_a_cut() -> None:
    assert apply_threshold(np.array([2.1, 5.0, 10.0, 1.0, -3.0]), 2.0).tolist() == pytest.approx(
        [0.1, 3.0, 8.0, 0.0, 0.0])


def test_sampling_selection_follows_noisy_votes_and_never_picks_zero() -> None:
    noisy = np.array([0.0, 10.0, -3.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    parents = select_parents(noisy, _population(), {"pos": 50, "neg": 40}, "sample", np.random.default_rng(0))
    assert {p.id for p in parents["pos"]} == {1}
    assert len({p.id for p in parents["neg"]}) == 4
    uniform = select_parents(np.full(8, -1.0), _population(), {"pos": 40}, "sample", np.random.default_rng(1))
    assert len({p.id for p in uniform["pos"]}) == 4  # all-negative votes: uniform, not a crash


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("kind", ["paraphrase", "fill_blank"])
def test_variation_requests(chat: bool, kind: str) -> None:
    parent = "a warm and funny film with a great cast and a sharp script"
    req = build_variation_request(TASK, "pos", parent, chat=chat, kind=kind, rng_seed=3, fill_ratio=0.5)
    text = req.prompt_text()
    if kind == "paraphrase":
        assert parent in text
    else:
        assert "_" in text and parent not in text
    assert ("about 13 words" in text) == (kind == "paraphrase" or chat)


def test_augpe_takes_one_plm() -> None:
    from dpsynth.errors import DpsynthError

    base = {"data": {"corpus": "trec", "m": 10}, "method": "augpe",
            "generators": [{"model": "a.gguf", "name": "a"}, {"model": "b.gguf", "name": "b"}]}
    with pytest.raises(DpsynthError, match="exactly one PLM"):
        parse_config(base)


def test_output_all_keeps_every_population_at_the_same_cost_and_privacy(tmp_path, monkeypatch) -> None:
    """`augpe.output: all` writes the N*T samples its N*T calls made (ids unique, each population once, even
    across a crash and resume), with the same releases as the paper's last-population output."""
    import json

    from fakes import FakeGenerator

    from dpsynth.runs.config import parse_config
    from dpsynth.runs.engine import Run

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    csv = tmp_path / "private.csv"
    csv.write_text("text,label\n" + "".join(f"private review {i} of a {'great' if i % 2 else 'poor'} film,"
                                            f"{'pos' if i % 2 else 'neg'}\n" for i in range(20)))

    def run(output: str, out: str, crash_after: int | None = None, selection: str = "sample"
            ) -> tuple[list[dict], dict]:
        FakeGenerator.calls, FakeGenerator.fail_after = [], crash_after
        cfg = parse_config({"method": "augpe", "data": {"private": str(csv)},
                            "task": {"text_kind": "review", "labels": {"pos": "positive", "neg": "negative"}},
                            "generators": [{"kind": "fake", "model": "a"}],
                            "augpe": {"n": 8, "iterations": 3, "output": output, "selection": selection},
                            "privacy": {"epsilon": 2.0, "delta": 1e-3}, "evaluate": False, "seed": 3})
        if crash_after is not None:
            with pytest.raises(KeyboardInterrupt):
                Run.create(cfg, tmp_path / out).execute()
            FakeGenerator.fail_after = None
            Run.resume(tmp_path / out).execute()
        else:
            Run.create(cfg, tmp_path / out).execute()
        rows = [json.loads(line) for line in (tmp_path / out / "synthetic.jsonl").read_text().splitlines()]
        return rows, json.loads((tmp_path / out / "privacy.json").read_text())

    last, last_privacy = run("last", "last")
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache-all"))  # every call paid again: the crash lands mid-run
    every, every_privacy = run("all", "all", crash_after=12)
    assert len(last) == 8 and {r["iteration"] for r in last} == {2}
    assert len(every) == 24 and sorted({r["iteration"] for r in every}) == [0, 1, 2]
    assert len({(r["label"], r["text"].lower()) for r in every}) == 24
    assert [e["name"] for e in every_privacy["events"]] == [e["name"] for e in last_privacy["events"]]
    assert every_privacy["epsilon"] == pytest.approx(last_privacy["epsilon"])

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache-selected"))
    selected, selected_privacy = run("selected", "selected", crash_after=10, selection="rank")
    assert len(FakeGenerator.calls) == 16  # populations 0 and 1 across the crash; population 2 is not asked
    metrics = json.loads((tmp_path / "selected" / "metrics.json").read_text())
    last_vote = metrics["iterations"][-1]
    assert [it.get("selected") for it in metrics["iterations"]] == [None, None, 4]
    assert len(selected) == 4 == last_vote["parents_distinct"]  # the top third (ceil 4/3) of each label's 4
    assert {r["iteration"] for r in selected} == {1}  # parents from population 1, judged by the last vote
    assert len({(r["label"], r["text"]) for r in selected}) == len(selected)
    assert [e["name"] for e in selected_privacy["events"]] == [e["name"] for e in last_privacy["events"]]
    assert selected_privacy["epsilon"] == pytest.approx(last_privacy["epsilon"])

    config = tmp_path / "selected" / "config.yaml"  # resumed under another output: refused, not population 0
    config.write_text(config.read_text().replace("output: selected", "output: last"))
    with pytest.raises(DpsynthError, match="augpe.output changed since the run started"):
        Run.resume(tmp_path / "selected").execute()


def test_output_selected_is_the_last_votes_distinct_parents_in_rank_order() -> None:
    """Under rank the output is the top 1/fold of each label by noisy votes, once each; under sample each drawn
    parent once."""
    from dpsynth.methods.augpe import distinct_in_order

    pop = [SyntheticSample(id=i, text=f"t{i}", label="ab"[i % 2], plm="g", iteration=1) for i in range(12)]
    noisy = np.array([0.0, 5, 9, 1, 3, 0, 7, 2, 1, 8, 4, 6])
    parents = select_parents(noisy, pop, {"a": 6, "b": 6}, "rank", np.random.default_rng(0), fold=3)
    assert [p.id for p in distinct_in_order(parents)] == [2, 6, 9, 11]
    drawn = select_parents(noisy, pop, {"a": 6, "b": 6}, "sample", np.random.default_rng(0))
    out = distinct_in_order(drawn)
    assert len(out) == len({p.id for p in out}) == len({p.id for ps in drawn.values() for p in ps})
    assert 0 not in {p.id for p in out}  # no votes, never drawn


def test_a_label_left_with_no_sample_is_one_clear_error_before_the_votes(tmp_path, monkeypatch) -> None:
    """A generator whose every answer is empty left a label with no population: the next iteration crashed with
    ZeroDivisionError; now one line naming the label, before its vote release is charged."""
    from fakes import FakeGenerator

    from dpsynth.errors import DpsynthError
    from dpsynth.llm.base import GenerationResult
    from dpsynth.runs.engine import Run

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))

    def empty_answers(self, requests, on_result=None):
        out = [GenerationResult("", 1, 1) for _ in requests]
        for i, result in enumerate(out):
            if on_result:
                on_result(i, result)
        return out

    monkeypatch.setattr(FakeGenerator, "generate", empty_answers)
    csv = tmp_path / "private.csv"
    csv.write_text("text,label\n" + "".join(f"review {i},{'pos' if i % 2 else 'neg'}\n" for i in range(20)))
    cfg = parse_config({"method": "augpe", "data": {"private": str(csv)},
                        "task": {"text_kind": "review", "labels": {"pos": "positive", "neg": "negative"}},
                        "generators": [{"kind": "fake", "model": "a"}], "augpe": {"n": 8, "iterations": 3},
                        "privacy": {"epsilon": 2.0, "delta": 1e-3, "label_proportions": None},
                        "evaluate": False, "seed": 3})
    with pytest.raises(DpsynthError, match="augpe: iteration 0 kept no sample of label"):
        Run.create(cfg, tmp_path / "run").execute()
    releases = tmp_path / "run" / "checkpoints" / "releases"
    assert not releases.is_dir() or not list(releases.glob("*.json")), "no vote release was charged"


def test_output_selected_plans_one_population_fewer() -> None:
    """The dry run's request count: `output: selected` does not generate population T-1."""
    from dpsynth.methods.registry import method_class

    base = {"data": {"corpus": "trec", "m": 10}, "method": "augpe", "generators": [{"model": "a.gguf"}]}
    for output, requests in (("last", 60), ("all", 60), ("selected", 40)):
        cfg = parse_config({**base, "augpe": {"n": 20, "iterations": 3, "output": output}})
        assert method_class("augpe")(cfg).planned_requests(6) == requests


@pytest.mark.parametrize("began,resumed", [("selected", "last"), ("last", "selected")])
def test_a_resume_under_another_output_is_refused_before_it_asks_or_releases(began: str, resumed: str, tmp_path,
                                                                               monkeypatch) -> None:
    """`selected` never generates the last population and `last` never keeps the last vote's parents: resumed
    under the other output, the run generated it (12 requests unplanned) or released the last vote, then was
    refused at its output; now refused at the step's start, before either."""
    from fakes import FakeGenerator

    from dpsynth.runs.engine import Run

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    csv = tmp_path / "private.csv"
    csv.write_text("text,label\n" + "".join(f"review {i} of a film,{'pos' if i % 2 else 'neg'}\n" for i in range(20)))
    cfg = parse_config({"method": "augpe", "data": {"private": str(csv)},
                        "task": {"text_kind": "review", "labels": {"pos": "positive", "neg": "negative"}},
                        "generators": [{"kind": "fake", "model": "a"}],
                        "augpe": {"n": 8, "iterations": 3, "output": began},
                        "privacy": {"epsilon": 2.0, "delta": 1e-3}, "evaluate": False, "seed": 3})
    FakeGenerator.calls, FakeGenerator.fail_after = [], 12  # stopped in iteration 1, after iteration 0's checkpoint
    with pytest.raises(KeyboardInterrupt):
        Run.create(cfg, tmp_path / "run").execute()
    FakeGenerator.fail_after = None
    config = tmp_path / "run" / "config.yaml"
    config.write_text(config.read_text().replace(f"output: {began}", f"output: {resumed}"))
    asked = len(FakeGenerator.calls)
    releases = sorted(p.name for p in (tmp_path / "run" / "checkpoints" / "releases").glob("*.json"))
    with pytest.raises(DpsynthError, match="augpe.output changed since the run started"):
        Run.resume(tmp_path / "run").execute()
    assert len(FakeGenerator.calls) == asked, "nothing asked"
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints" / "releases").glob("*.json")) == releases


def test_fused_augpe_shares_one_population_among_several_plms(tmp_path, monkeypatch) -> None:
    """`augpe.fuse: true`: every PLM writes an equal share of each population and varies its own run of the
    parents (the two PLMs asked the same variations before the offset), votes and releases as with one PLM; a bench
    runs it as one cell with all PLMs. Without `fuse` two PLMs are still refused."""
    import json

    from fakes import FakeGenerator

    from dpsynth.bench.grid import BenchConfig, cells
    from dpsynth.runs.engine import Run

    two = [{"kind": "fake", "model": "a"}, {"kind": "fake", "model": "b"}]
    task = {"text_kind": "review", "labels": {"pos": "positive", "neg": "negative"}}
    csv = tmp_path / "private.csv"
    csv.write_text("text,label\n" + "".join(f"private review {i} of a {'great' if i % 2 else 'poor'} film,"
                                            f"{'pos' if i % 2 else 'neg'}\n" for i in range(20)))
    raw = {"method": "augpe", "data": {"private": str(csv)}, "task": task, "generators": two,
           "augpe": {"n": 8, "iterations": 3, "output": "selected", "selection": "rank", "fuse": True},
           "privacy": {"epsilon": 2.0, "delta": 1e-3}, "evaluate": False, "seed": 3}
    with pytest.raises(DpsynthError, match="exactly one PLM"):
        parse_config({**raw, "augpe": {**raw["augpe"], "fuse": False}})

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    FakeGenerator.calls, FakeGenerator.fail_after = [], None
    Run.create(parse_config(raw), tmp_path / "fused").execute()
    assert len(FakeGenerator.calls) == 16  # populations 0 and 1, 8 requests each, 4 per PLM
    variations = [r.prompt_text() for r in FakeGenerator.calls[8:]]
    assert len(set(variations)) == 8, "each PLM varies its own run of the parents"
    rows = [json.loads(line) for line in (tmp_path / "fused" / "synthetic.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {r["iteration"] for r in rows} == {1}  # the top third (ceil 4/3) of each label's 4
    metrics = json.loads((tmp_path / "fused" / "metrics.json").read_text())
    assert [{plm: g["requested"] for plm, g in it["generated"].items()} for it in metrics["iterations"][:2]] == [
        {"a": 4, "b": 4}] * 2
    privacy = json.loads((tmp_path / "fused" / "privacy.json").read_text())
    assert [e["name"] for e in privacy["events"]] == ["augpe.votes[iteration=1]", "augpe.votes[iteration=2]"]
    assert privacy["epsilon"] <= 2.0 + 1e-9

    base = {"data": {"corpus": "sms_spam", "m": 100}, "generators": [{"model": "gemma3-270m", "name": "g"},
                                                                     {"model": "smollm2-135m-instruct", "name": "s"}],
            "augpe": {"n": 8}}
    bench = BenchConfig.model_validate({"base": base, "seeds": [0], "baseline": None, "variants": [
        {"name": "alone", "method": "augpe"}, {"name": "fused", "method": "augpe",
                                               "overrides": {"augpe": {"fuse": True}}}]})
    assert sorted(c["name"] for c in cells(bench)) == ["alone-g-eps4.0-seed0", "alone-s-eps4.0-seed0",
                                                       "fused-all-eps4.0-seed0"]


def test_shared_population_plans_split_labels_first_and_match_one_plm() -> None:
    """Split over PLMs first, N=6 over 4 labels and 2 PLMs gave one label no request; one PLM's plan is unchanged."""
    from dpsynth.methods.augpe import shared_population_plans
    from dpsynth.methods.generation import plan_counts

    shares = {c: 0.25 for c in "abcd"}
    plans = shared_population_plans(6, ["x", "y"], shares)
    totals = {c: sum(p.per_label[c] for p in plans) for c in shares}
    assert totals == plan_counts(6, {"x": 1.0}, shares)[0].per_label and min(totals.values()) == 1
    assert sum(plans[0].per_label.values()) + sum(plans[1].per_label.values()) == 6
    skewed = {"rare": 0.05, "common": 0.95}
    assert shared_population_plans(20, ["x"], skewed) == plan_counts(20, {"x": 1.0}, skewed)
    assert {c: sum(p.per_label[c] for p in shared_population_plans(20, ["x", "y"], skewed)) for c in skewed} == {
        "rare": 1, "common": 19}


@pytest.mark.parametrize("n,plms,labels", [(6, 2, 4), (10, 3, 4), (7, 3, 2), (60, 2, 2), (5, 5, 1), (9, 1, 3)])
def test_fused_requests_are_dealt_once_each_and_evenly(n: int, plms: int, labels: int) -> None:
    """Every request place of a label is dealt to exactly one PLM, each PLM's total is within one of an equal share,
    and a label's leftover starts at another PLM for each label (with runs, the first PLM took every leftover)."""
    from dpsynth.methods.augpe import dealt_position, shared_population_plans

    names, shares = [f"p{k}" for k in range(plms)], {f"l{i}": 1.0 / labels for i in range(labels)}
    plans = shared_population_plans(n, names, shares)
    totals = [sum(p.per_label.values()) for p in plans]
    assert sum(totals) == n and max(totals) - min(totals) <= 1
    for i, label in enumerate(shares):
        count = sum(p.per_label[label] for p in plans)
        places = sorted(dealt_position(k, i, j, plms) for k, p in enumerate(plans) for j in range(p.per_label[label]))
        assert places == list(range(count))


def test_fused_population_is_ordered_as_dealt_so_zero_vote_ties_do_not_favour_the_first_plm() -> None:
    """With the population PLM by PLM, rank's stable sort filled the slots left by zero votes from the first
    PLM's samples; dealt, they alternate between PLMs (and a PLM's re-asked answer takes its next place)."""
    from dpsynth.methods.augpe import in_dealt_order, select_parents

    population = [SyntheticSample(i, f"{plm} {label} {j}", label, plm, 0)
                  for i, (plm, label, j) in enumerate((plm, label, j) for plm in "ab" for label in ("x", "y")
                                                      for j in range(3))]
    dealt = in_dealt_order(population, ["a", "b"], ["x", "y"])
    assert [x.text for x in dealt] == ["a x 0", "b x 0", "a x 1", "b x 1", "a x 2", "b x 2",
                                       "b y 0", "a y 0", "b y 1", "a y 1", "b y 2", "a y 2"]
    noisy = np.zeros(len(dealt))
    noisy[2] = 5.0  # one vote above zero among x's six: the other kept parent comes from the ties
    parents = select_parents(noisy, dealt, {"x": 2}, "rank", np.random.default_rng(0), fold=3)
    assert [p.text for p in parents["x"]] == ["a x 1", "a x 0"]
    parents = select_parents(np.zeros(len(dealt)) + np.eye(len(dealt))[0] * 5, dealt, {"x": 2}, "rank",
                             np.random.default_rng(0), fold=3)
    assert [p.plm for p in parents["x"]] == ["a", "b"]


def test_fused_plms_each_write_both_variation_kinds_with_as_many_plms_as_rank_fold(tmp_path, monkeypatch) -> None:
    """Under rank with `variation: mixed`, a parent's children alternate kinds; with the children in runs, three
    PLMs and rank_fold 3 gave each PLM one kind only (the first and third paraphrased, the second filled blanks)."""
    from fakes import FakeGenerator

    from dpsynth.runs.engine import Run

    asked: list[tuple[str, str]] = []
    generate = FakeGenerator.generate

    def recording(self, requests, on_result=None):
        asked.extend((self.name, r.prompt_text()) for r in requests)
        return generate(self, requests, on_result)

    monkeypatch.setattr(FakeGenerator, "generate", recording)
    csv = tmp_path / "private.csv"
    csv.write_text("text,label\n" + "".join(f"private review {i} of a {'great' if i % 2 else 'poor'} film,"
                                            f"{'pos' if i % 2 else 'neg'}\n" for i in range(20)))
    raw = {"method": "augpe", "data": {"private": str(csv)},
           "task": {"text_kind": "review", "labels": {"pos": "positive", "neg": "negative"}},
           "generators": [{"kind": "fake", "model": m} for m in "abc"],
           "augpe": {"n": 18, "iterations": 2, "selection": "rank", "rank_fold": 3, "fuse": True},
           "privacy": {"epsilon": 2.0, "delta": 1e-3}, "evaluate": False, "seed": 1}
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    FakeGenerator.calls, FakeGenerator.fail_after = [], None
    Run.create(parse_config(raw), tmp_path / "run").execute()
    variations = asked[18:]
    assert len(variations) == 18
    for plm in "abc":
        kinds = {"fill" if "blanks" in text else "paraphrase" for name, text in variations if name == plm}
        assert kinds == {"fill", "paraphrase"}, plm


def test_fused_augpe_refuses_fewer_samples_than_generators() -> None:
    """With N below the PLMs sharing the population one would write nothing: refused before anything is spent."""
    from dpsynth.data.public import task_for
    from dpsynth.methods.registry import method_class

    raw = {"method": "augpe", "data": {"corpus": "sms_spam", "m": 100},
           "generators": [{"kind": "fake", "model": m} for m in "abc"], "augpe": {"n": 2, "fuse": True}}
    cfg = parse_config(raw)
    with pytest.raises(DpsynthError, match="augpe.n=2 is smaller than the 3 generators"):
        method_class("augpe")(cfg).check_task(task_for(cfg))
    cfg = parse_config({**raw, "augpe": {"n": 3, "fuse": True}})
    method_class("augpe")(cfg).check_task(task_for(cfg))
