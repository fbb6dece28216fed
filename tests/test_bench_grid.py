"""Bench grid expansion and reports: per-variant epsilons and PLMs, eps=inf, federated bases."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpsynth.bench.grid import BenchConfig, cells
from dpsynth.bench.report import html_report, markdown_table
from dpsynth.errors import DpsynthError
from dpsynth.runs.config import parse_config

BASE = {
    "data": {"corpus": "trec", "m": 60},
    "generators": [{"model": "smollm2-135m-instruct", "name": "smol"}, {"model": "gemma3-270m", "name": "gemma"}],
    "privacy": {"delta": 1e-5},
}


def test_variant_epsilons_and_plms_expand_to_the_right_cells() -> None:
    bench = BenchConfig.model_validate({
        "base": BASE, "epsilons": [4.0], "seeds": [0, 1],
        "variants": [{"name": "wasp", "method": "wasp", "epsilons": [1.0, "inf"]},
                     {"name": "augpe", "method": "augpe"},
                     {"name": "augpe", "method": "augpe", "plms": ["gemma"], "epsilons": [8.0], "seeds": [5]},
                     {"name": "zero-shot", "method": "zero-shot"}]})
    names = [c["name"] for c in cells(bench)]
    assert names[:4] == ["wasp-all-eps1.0-seed0", "wasp-all-eps1.0-seed1", "wasp-all-epsinf-seed0",
                         "wasp-all-epsinf-seed1"]
    assert "augpe-smol-eps4.0-seed0" in names and "augpe-gemma-eps8.0-seed5" in names
    assert "augpe-gemma-eps8.0-seed0" not in names
    assert "augpe-smol-eps8.0-seed0" not in names and "zero-shot-all-epsNone-seed0" in names
    inf_cell = next(c for c in cells(bench) if c["name"] == "wasp-all-epsinf-seed0")
    assert math.isinf(parse_config(inf_cell["config"]).privacy.epsilon)
    bad = bench.model_copy(update={"variants": [bench.variants[0].model_copy(update={"plms": ["nope"]})]})
    with pytest.raises(DpsynthError, match="none of plms"):
        cells(bad)


def test_a_comparator_must_exist_and_run_at_one_epsilon() -> None:
    def grid(*variants: dict) -> BenchConfig:
        return BenchConfig.model_validate({"base": BASE, "seeds": [0], "variants": list(variants)})

    cells(grid({"name": "wasp", "method": "wasp"}, {"name": "q1", "method": "wasp", "compare_with": "wasp"}))
    with pytest.raises(DpsynthError, match="not a variant"):
        cells(grid({"name": "q1", "method": "wasp", "compare_with": "nope"}))
    with pytest.raises(DpsynthError, match="several epsilons"):
        cells(grid({"name": "wasp", "method": "wasp", "epsilons": [4.0, "inf"]},
                   {"name": "q1", "method": "wasp", "compare_with": "wasp"}))


def test_entries_of_one_name_may_not_make_one_cell_twice_or_mix_methods() -> None:
    def grid(*variants: dict) -> BenchConfig:
        return BenchConfig.model_validate({"base": BASE, "seeds": [0], "baseline": None, "variants": list(variants)})

    # two entries of one name, settings apart, made one cell name twice: the second was refused only after the
    # first had run (and paid)
    with pytest.raises(DpsynthError, match="two entries make the cell w-all-eps4.0-seed0"):
        cells(grid({"name": "w", "method": "wasp", "overrides": {"wasp": {"q": 1}}},
                   {"name": "w", "method": "wasp", "overrides": {"wasp": {"q": 4}}}))
    with pytest.raises(DpsynthError, match=r"its entries name two methods \(wasp, augpe\)"):
        cells(grid({"name": "x", "method": "wasp"}, {"name": "x", "method": "augpe"}))
    cells(grid({"name": "w", "method": "wasp"}, {"name": "w", "method": "wasp", "seeds": [1]}))  # adds cells


@pytest.mark.parametrize("field", ["seeds", "epsilons"])
def test_an_empty_seed_or_epsilon_list_is_refused(field: str) -> None:
    """Before: `seeds: []` blamed compare_with, `epsilons: []` dropped the private variants silently and ran the
    rest."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=field):
        BenchConfig.model_validate({"base": BASE, field: [], "variants": [{"name": "z", "method": "zero-shot"}]})
    with pytest.raises(ValidationError, match=field):
        BenchConfig.model_validate({"base": BASE, "variants": [{"name": "z", "method": "wasp", field: []}]})


def test_a_folder_of_the_users_own_files_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    from dpsynth.bench.grid import run_grid

    bench = BenchConfig.model_validate({"base": BASE, "seeds": [0], "variants": [{"name": "zero-shot",
                                                                                  "method": "zero-shot"}]})
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.csv").write_text("id,score\n1,0.9\n")  # the user's own, the name a bench would write
    (mine / "README.md").write_text("mine")
    for run_missing in (True, False):
        with pytest.raises(DpsynthError, match=r"holds files that are not a dpsynth bench's \(README.md, "
                                               r"results.csv\), which the bench would overwrite"):
            run_grid(bench, mine, run_missing=run_missing)
    assert sorted(p.name for p in mine.iterdir()) == ["README.md", "results.csv"]
    assert (mine / "results.csv").read_text() == "id,score\n1,0.9\n"
    with pytest.raises(DpsynthError, match="is a file"):
        run_grid(bench, mine / "README.md", run_missing=False)
    # hidden files alone do not make a folder the user's; a bench's own folder (its cells/) is reported into, and
    # with no finished cell nothing is written
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / ".gitkeep").write_text("")
    assert run_grid(bench, hidden, run_missing=False) == []
    (hidden / "cells").mkdir()
    (hidden / "notes.txt").write_text("mine")
    assert run_grid(bench, hidden, run_missing=False) == []
    assert sorted(p.name for p in hidden.iterdir()) == [".gitkeep", "cells", "notes.txt"]


def test_only_runs_the_named_variants_and_what_they_are_compared_with(tmp_path: Path, monkeypatch) -> None:
    from dpsynth.bench.grid import needed_variants, run_grid
    from dpsynth.runs import engine

    bench = BenchConfig.model_validate({"base": BASE, "seeds": [0], "baseline": "zero-shot", "variants": [
        {"name": "wasp", "method": "wasp"}, {"name": "augpe", "method": "augpe", "plms": ["gemma"]},
        {"name": "q1", "method": "wasp", "compare_with": ["wasp", "augpe:zero_shot"]},
        {"name": "zero-shot", "method": "zero-shot"}]})
    assert needed_variants(bench, ["q1"]) == {"q1", "wasp", "augpe", "zero-shot"}
    assert needed_variants(bench, ["zero-shot"]) == {"zero-shot"}
    with pytest.raises(DpsynthError, match="not a variant of"):
        needed_variants(bench, ["nope"])

    monkeypatch.setattr(engine, "Run", _Refuse)
    with pytest.raises(RuntimeError, match="ran zero-shot-"):  # wasp, augpe and q1 come first and are skipped
        run_grid(bench, tmp_path, log=lambda line: None, only=["zero-shot"])
    with pytest.raises(RuntimeError, match="ran wasp-"):
        run_grid(bench, tmp_path, log=lambda line: None, only=["q1"])


class _Refuse:  # stands in for a real run: a cell that is started names itself
    @staticmethod
    def create(config, root, progress=None):
        raise RuntimeError(f"ran {Path(root).name}")


def test_a_cell_another_bench_process_holds_is_left_to_it(tmp_path: Path, monkeypatch) -> None:
    """Several bench processes may share one output directory: a cell another one has claimed is not run again
    (that would spend its budget twice and race on its files); the next cell is."""
    from dpsynth.bench.grid import _claim_path, run_grid
    from dpsynth.fs import exclusive_lock
    from dpsynth.runs import engine

    bench = BenchConfig.model_validate({"base": BASE, "seeds": [0, 1], "variants": [
        {"name": "zero-shot", "method": "zero-shot"}]})
    first, second = cells(bench)
    held = exclusive_lock(_claim_path(tmp_path, first), wait=False)  # another open file: another holder
    assert held is not None and exclusive_lock(_claim_path(tmp_path, first), wait=False) is None
    monkeypatch.setattr(engine, "Run", _Refuse)
    logged: list[str] = []
    try:
        with pytest.raises(RuntimeError, match=f"ran {second['name']}"):
            run_grid(bench, tmp_path, log=logged.append)
    finally:
        held.close()
    assert logged == [f"{first['name']} is being run by another bench process: its row is collected when it is "
                      "done", f"running {second['name']}"]


def test_a_bench_process_waits_for_the_cells_it_left_and_runs_one_whose_holder_stopped(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """At its end a bench process waits for the cells it left to another, so that its report has them; a cell
    whose holder stopped before finishing it is then run here."""
    import threading

    from dpsynth.bench.grid import _claim_path, run_grid
    from dpsynth.fs import exclusive_lock
    from dpsynth.runs import engine

    bench = BenchConfig.model_validate({"base": BASE, "seeds": [0], "variants": [
        {"name": "zero-shot", "method": "zero-shot"}]})
    (cell,) = cells(bench)
    held = exclusive_lock(_claim_path(tmp_path, cell), wait=False)
    assert held is not None

    class RunAfterTheHolder:
        @staticmethod
        def create(config, root, progress=None):
            assert held.closed, "run while another process held the cell"
            raise RuntimeError(f"ran {Path(root).name}")

    monkeypatch.setattr(engine, "Run", RunAfterTheHolder)
    logged: list[str] = []

    def log(line: str) -> None:
        logged.append(line)
        if line.startswith("waiting for"):  # the other process stops without finishing the cell, while this waits
            threading.Timer(0.5, held.close).start()

    with pytest.raises(RuntimeError, match=f"ran {cell['name']}"):
        run_grid(bench, tmp_path, log=log)
    assert logged[1:] == [f"waiting for {cell['name']} (run by another bench process)", f"running {cell['name']}"]


def test_a_bench_process_reports_a_cell_another_one_finished_without_running_it(tmp_path: Path,
                                                                                monkeypatch) -> None:
    """The usual end of two processes sharing a grid: the cell left to the other is finished by it meanwhile, and
    this process reports it (scoring it if it must) without running it."""
    import threading

    from dpsynth.bench.grid import _claim_path, run_grid
    from dpsynth.fs import exclusive_lock
    from dpsynth.runs import engine

    bench = BenchConfig.model_validate({"base": BASE, "seeds": [0], "eval_distribution": False,
                                        "variants": [{"name": "zero-shot", "method": "zero-shot"}]})
    (cell,) = cells(bench)
    held = exclusive_lock(_claim_path(tmp_path, cell), wait=False)
    assert held is not None

    def other_process_finishes() -> None:
        _write_finished_trec_cell(tmp_path, cell)
        held.close()

    threading.Timer(0.5, other_process_finishes).start()
    monkeypatch.setattr(engine, "Run", _Refuse)
    (row,) = run_grid(bench, tmp_path, log=lambda line: None)
    assert row["name"] == cell["name"] and row["accuracy"] > 0.3  # six-way TREC: well above the 23% majority


def test_config_drift_names_the_first_changed_setting_and_skips_keys_one_side_lacks() -> None:
    from dpsynth.bench.grid import config_drift

    saved = {"fusegen": {"n": 600, "max_tokens": 64}, "generators": [{"model": "a", "threads": 1}], "old": 1}
    assert config_drift(saved, {"fusegen": {"n": 600, "max_tokens": 64}, "generators": [{"model": "a"}],
                                "new": 2}) is None
    assert config_drift(saved, {"fusegen": {"n": 120, "max_tokens": 64}}) == "fusegen.n: 600 in the cell, 120 asked"
    assert config_drift(saved, {"generators": [{"model": "b", "threads": 1}]}) == \
        "generators.0.model: 'a' in the cell, 'b' asked"


def test_a_finished_cell_run_with_other_settings_is_refused_not_reported(tmp_path: Path) -> None:
    """The bench finds cells by name: a cell written under other settings (here FuseGen's default n=600 where
    the config now asks n=120, the bug behind an unequal-calls comparison) must stop the bench, not be paired."""
    import yaml

    from dpsynth.bench.grid import run_grid

    bench = BenchConfig.model_validate({"base": {**BASE, "fusegen": {"n": 120}}, "seeds": [0],
                                        "variants": [{"name": "fusegen", "method": "fusegen"}]})
    cell = cells(bench)[0]
    root = tmp_path / "cells" / cell["name"]
    root.mkdir(parents=True)
    stale = parse_config({**cell["config"], "fusegen": {"n": 600}}).model_dump(mode="json")
    (root / "config.yaml").write_text(yaml.safe_dump(stale))
    (root / "metrics.json").write_text("{}")
    with pytest.raises(DpsynthError, match=r"other settings \(fusegen.n: 600 in the cell, 120 asked\)"):
        run_grid(bench, tmp_path, log=lambda line: None, run_missing=False)


def test_federated_base_is_dropped_for_methods_without_private_votes() -> None:
    bench = BenchConfig.model_validate({
        "base": {**BASE, "federated": {"parties": 3}}, "seeds": [0],
        "variants": [{"name": "wasp", "method": "wasp"}, {"name": "zero-shot", "method": "zero-shot"},
                     {"name": "private_only", "method": "private_only"}]})
    by_method = {c["method"]: c["config"] for c in cells(bench)}
    assert parse_config(by_method["wasp"]).federated is not None
    assert "federated" not in by_method["zero-shot"] and "federated" not in by_method["private_only"]
    parse_config(by_method["zero-shot"])  # valid: zero-shot has no federated mode


def test_a_zero_shot_cell_with_dp_label_proportions_has_an_epsilon() -> None:
    """Zero-shot with `label_proportions: dp` spends budget on its label histogram: the bench must not list it
    (name, epsilon column) as a run without privacy cost."""
    bench = BenchConfig.model_validate({
        "base": {**BASE, "federated": {"parties": 3}}, "seeds": [0], "epsilons": [4.0],
        "variants": [{"name": "zs", "method": "zero-shot"},
                     {"name": "zs-dp", "method": "zero-shot", "overrides": {"privacy": {"label_proportions": "dp"}}}]})
    by_name = {c["variant"]: c for c in cells(bench)}
    assert by_name["zs"]["epsilon"] is None and by_name["zs"]["name"] == "zs-all-epsNone-seed0"
    assert by_name["zs-dp"]["epsilon"] == 4.0 and by_name["zs-dp"]["name"] == "zs-dp-all-eps4.0-seed0"
    config = parse_config(by_name["zs-dp"]["config"])
    assert config.privacy.label_proportions == "dp" and config.federated is None


def test_reports_handle_infinite_epsilon(tmp_path: Path) -> None:
    rows = [{"name": f"wasp-{e}-{s}", "variant": "wasp", "method": "wasp", "plms": "all", "epsilon": e, "seed": s,
             "accuracy": 0.6 + 0.01 * s, "fid": 0.5} for e in (1.0, 4.0, math.inf) for s in (0, 1)]
    rows += [{"name": "zero-shot", "variant": "zero-shot", "method": "zero-shot", "plms": "all", "epsilon": None, "seed": 0,
              "accuracy": 0.62, "fid": 0.4}]
    table = markdown_table(rows)
    assert "eps=inf" in table.splitlines()[0] and "60.50 ± 0.71" in table
    page = html_report(rows, tmp_path, "t")
    assert "accuracy vs epsilon" in page
    # no cell folder here: no per-iteration chart, and no empty one in its place
    assert "vs iteration" not in page and "samples per PLM" not in page


def test_paired_intervals_cover_a_known_difference_and_are_empty_for_identical_methods() -> None:
    import numpy as np

    from dpsynth.bench.stats import paired_difference, paired_markdown

    rng = np.random.default_rng(0)
    truth = [rng.random(1500) for _ in range(5)]
    a = {s: list((t < 0.70).astype(int)) for s, t in enumerate(truth)}  # 70% vs 62% on the same examples
    b = {s: list((t < 0.62).astype(int)) for s, t in enumerate(truth)}
    d = paired_difference(a, b)
    assert d["seeds"] == 5 and d["low"] <= 0.08 <= d["high"] and d["low"] > 0
    same = paired_difference(a, a)
    assert same["difference"] == same["low"] == same["high"] == 0.0
    rows = [{"variant": v, "plms": "x", "epsilon": e, "seed": s, "correct": c[s]}
            for v, e, c in (("zero-shot", None, b), ("wasp", 4.0, a)) for s in range(5)]
    text = paired_markdown(rows, "zero-shot")
    assert "| wasp | x | 4 | zero-shot | 5 | +7.97 * |" in text
    rows += [{"variant": "half", "plms": "x", "epsilon": 4.0, "seed": s, "correct": a[s]} for s in range(5)]
    rows += [{"variant": "zero-shot-half", "plms": "x", "epsilon": None, "seed": s, "correct": a[s]} for s in range(5)]
    text = paired_markdown(rows, "zero-shot", {"half": ["zero-shot-half"]})
    assert "| half | x | 4 | zero-shot-half | 5 | +0.00 |" in text, "a variant is paired with its own comparator"
    text = paired_markdown(rows, "zero-shot", {"half": ["zero-shot-half", "zero-shot"]})
    assert "| half | x | 4 | zero-shot-half | 5 | +0.00 |" in text and "| half | x | 4 | zero-shot | 5 | +7.97 * |" in text
    # one seed: the interval excludes 0 but misses the seed spread: marked †, never *
    one = paired_markdown([r for r in rows if r["seed"] == 0], "zero-shot")
    assert "| wasp | x | 4 | zero-shot | 1 | +7.67 † | [+6.35, +8.98] |" in one and " * |" not in one


def test_paired_intervals_hold_their_95_percent_with_few_seeds() -> None:
    """Seed-to-seed spread dominant, 3 seeds: the interval must cover the true difference about 95% of the time
    (the percentile bootstrap it replaced covered 77%: too narrow to carry a conclusion), and it is the t interval
    over per-seed differences widened by the shared test set's sampling error."""
    import numpy as np
    from scipy import stats

    from dpsynth.bench.stats import paired_difference

    rng = np.random.default_rng(7)
    covered, replicates, examples = 0, 300, 300
    for _ in range(replicates):
        p = 0.3 + 0.5 * rng.random(examples)
        effect = 0.03 + rng.normal(0.0, 0.04, 3)  # each seed's true difference; their mean is 0.03
        u = rng.random((3, examples))
        a = {s: list((u[s] < p + effect[s]).astype(int)) for s in range(3)}
        b = {s: list((u[s] < p).astype(int)) for s in range(3)}
        d = paired_difference(a, b, draws=200, seed=int(rng.integers(1 << 30)))
        covered += d["low"] <= 0.03 <= d["high"]
    assert covered / replicates >= 0.91, covered / replicates
    per_seed = np.array([0.05, 0.01, 0.03])
    a = {s: [1] * int(round(100 * (0.5 + x))) + [0] * (100 - int(round(100 * (0.5 + x)))) for s, x in enumerate(per_seed)}
    b = {s: [1] * 50 + [0] * 50 for s in range(3)}
    d = paired_difference(a, b, draws=2000)
    seed_part = per_seed.var(ddof=1) / 3
    assert d["difference"] == pytest.approx(0.03)
    half = d["high"] - d["difference"]
    assert half > stats.t.ppf(0.975, 2) * seed_part ** 0.5, "at least the t interval over the seeds"


def test_a_comparator_with_cells_for_several_plms_is_paired_by_plm_never_by_row_order() -> None:
    from dpsynth.bench.stats import paired_table

    good, bad = [1] * 8 + [0] * 2, [1] * 2 + [0] * 8
    rows = [{"variant": "zs", "plms": "a", "epsilon": None, "seed": 0, "correct": good},
            {"variant": "zs", "plms": "b", "epsilon": None, "seed": 0, "correct": bad},
            {"variant": "dp", "plms": "a", "epsilon": 4.0, "seed": 0, "correct": good},
            {"variant": "fused", "plms": "a+b", "epsilon": 4.0, "seed": 0, "correct": good}]
    table = {(t["variant"], t["plms"]): t for t in paired_table(rows, "zs")}
    assert table[("dp", "a")]["difference"] == 0.0, "paired with the same PLM's cell, not the last row's"
    assert ("fused", "a+b") not in table, "no PLM of the comparator is this one: not paired at all"
    one = paired_table(rows[:1] + rows[3:], "zs")
    assert one[0]["difference"] == 0.0 and one[0]["plms"] == "a+b", "a comparator with one PLM pairs with any"


def test_a_variant_may_be_paired_with_several_comparators() -> None:
    from dpsynth.bench.grid import Variant

    assert Variant(name="a", method="augpe", compare_with="z").paired_with() == ["z"]
    assert Variant(name="a", method="augpe", compare_with=["z", "f"]).paired_with() == ["z", "f"]
    assert Variant(name="a", method="augpe").paired_with() == []


def test_paired_macro_f1_matches_sklearn_and_is_zero_for_identical_predictions() -> None:
    import numpy as np
    from sklearn.metrics import f1_score

    from dpsynth.bench.stats import paired_f1_difference

    rng = np.random.default_rng(1)
    truth = list(rng.choice(["ham", "ham", "ham", "spam", "other"], size=400))
    flip = lambda p: [t if rng.random() < p else str(rng.choice(["ham", "spam", "other"])) for t in truth]  # noqa: E731
    a = {s: flip(0.9) for s in range(4)}
    b = {s: flip(0.6) for s in range(4)}
    d = paired_f1_difference(a, b, truth, draws=300)
    want = np.mean([f1_score(truth, a[s], average="macro", labels=sorted(set(truth)))
                    - f1_score(truth, b[s], average="macro", labels=sorted(set(truth))) for s in range(4)])
    assert d["difference"] == pytest.approx(want, abs=1e-12)
    assert d["low"] <= want <= d["high"] and d["low"] > 0
    same = paired_f1_difference(a, a, truth, draws=50)
    assert same["difference"] == same["low"] == same["high"] == 0.0


def test_majority_line_gives_accuracy_and_macro_f1() -> None:
    from dpsynth.cli.bench import majority_line

    line = majority_line(["ham"] * 9 + ["spam"])
    assert "accuracy 90.00%" in line and "macro-F1 47.37%" in line  # F1(ham) = 18/19, F1(spam) = 0


def test_a_runs_reference_sets_become_rows_paired_with_its_final_set(tmp_path: Path) -> None:
    """fedgen evaluates stage 3 inside the run: the bench turns it into a row `variant:set` of the same seed,
    which a variant's compare_with can name (refinement vs its uniform control, paired by test example)."""
    import json

    from dpsynth.bench.grid import _reference_rows
    from dpsynth.bench.stats import paired_table
    from dpsynth.fs import RunDir

    cell = {"name": "fedgen-s-eps4-seed0", "variant": "fedgen", "method": "fedgen", "plms": "s", "epsilon": 4.0,
            "seed": 0}
    final = {"accuracy": 0.75, "macro_f1": 0.7, "train_size": 4, "test_size": 4, "correct": [1, 1, 1, 0],
             "predicted": ["a", "b", "a", "a"]}
    uniform = {**final, "accuracy": 0.5, "correct": [1, 0, 1, 0], "predicted": ["a", "a", "a", "a"]}
    run = RunDir(tmp_path)
    run.metrics.write_text(json.dumps({"evaluation": {"classifier": "probe", "fedgen": final,
                                                      "stage3_uniform": uniform}}))
    row = {**cell, "epsilon_spent": 4.0, "correct": final["correct"], "accuracy": 0.75}
    (ref,) = _reference_rows(cell, run, row)
    assert ref["variant"] == "fedgen:stage3_uniform" and ref["seed"] == 0 and ref["accuracy"] == 0.5
    (diff,) = paired_table([row, ref], "zs", {"fedgen": ["fedgen:stage3_uniform"]})
    assert diff["versus"] == "fedgen:stage3_uniform" and diff["difference"] == pytest.approx(0.25)


def _write_finished_trec_cell(out: Path, cell: dict) -> None:
    """A finished zero-shot cell on TREC written by hand: 72 questions, six per label, from question words."""
    import json

    import yaml

    run = out / "cells" / cell["name"]
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(yaml.safe_dump({**cell["config"], "embedder": "all-MiniLM-L6-v2"}))
    questions = {"human": ["Who wrote {}?", "Who invented {}?"], "location": ["Where is {}?", "What city has {}?"],
                 "number": ["How many {} are there?", "When was {} built?"],
                 "description": ["What is {}?", "Why does {} happen?"], "entity": ["What animal is {}?",
                                                                                  "What color is {}?"],
                 "abbreviation": ["What does {} stand for?", "What is the abbreviation {}?"]}
    things = ["the bridge", "NASA", "the telephone", "Paris", "the moon", "rain"]
    rows = [{"text": q.format(t), "label": label} for label, qs in questions.items() for q in qs for t in things]
    (run / "synthetic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "privacy.json").write_text(json.dumps({"epsilon": 0.0}))
    (run / "metrics.json").write_text(json.dumps({"timings": {"wall": 1.0}}))  # last: a run finishes with it


def test_the_fine_tuned_encoder_scores_finished_cells_and_gets_its_own_tables(tmp_path: Path) -> None:
    """`classifiers: [probe, finetune]` adds the real fine-tuned MiniLM's per-example scores to a finished cell's
    eval.json (once: a second pass reuses them) and the report gets fine-tuned tables next to the probe's."""
    import yaml

    from dpsynth.bench.grid import run_grid
    from dpsynth.cli.bench import CLASSIFIER_HEADINGS
    from dpsynth.cli.bench import bench as bench_command
    from dpsynth.bench.report import markdown_table

    bench = BenchConfig.model_validate({"base": BASE, "seeds": [0], "eval_distribution": False,
                                        "classifiers": ["probe", "finetune"],
                                        "variants": [{"name": "zero-shot", "method": "zero-shot"}]})
    (cell,) = cells(bench)
    _write_finished_trec_cell(tmp_path, cell)

    logged: list[str] = []
    (row,) = run_grid(bench, tmp_path, log=logged.append)
    assert any("fine-tuning the classifier" in line for line in logged)
    assert 0.0 <= row["ft_accuracy"] <= 1.0 and len(row["ft_correct"]) == len(row["correct"]) == 1076
    assert row["ft_accuracy"] == pytest.approx(sum(row["ft_correct"]) / 1076)
    assert row["ft_accuracy"] > 0.3, "six-way TREC from question words: well above the 23% majority class"
    logged.clear()
    (again,) = run_grid(bench, tmp_path, log=logged.append)
    assert not logged and again["ft_correct"] == row["ft_correct"], "scored once, then reused"
    assert "ft_correct" not in (tmp_path / "results.csv").read_text()
    spec_path = tmp_path / "bench.yaml"
    spec_path.write_text(yaml.safe_dump(bench.model_dump()))
    bench_command(spec_path, tmp_path, run=False, only=None)
    report = (tmp_path / "results.md").read_text()
    assert CLASSIFIER_HEADINGS["probe"] in report and CLASSIFIER_HEADINGS["finetune"] in report
    assert f"{100 * row['ft_accuracy']:.2f} ± 0.00" in report
    assert "fine-tuned encoder's accuracy (%)" in markdown_table([row], "ft_accuracy") and markdown_table([{**row, "ft_accuracy": None}],
                                                                           "ft_accuracy") == ""


def test_fine_tuned_encoder_trains_small_sets_for_at_least_min_steps() -> None:
    from dpsynth.evaluate.finetune_classifier import FinetuneSettings

    s = FinetuneSettings(epochs=10, min_steps=80, batch_size=16)
    assert s.epochs_for(40) == 40  # 2 batches an epoch
    assert s.epochs_for(120) == 12  # 7 batches an epoch
    assert s.epochs_for(1600) == 10 and s.epochs_for(5) == 80


def test_a_bench_config_is_checked_whole_before_its_first_cell(tmp_path: Path, monkeypatch) -> None:
    """A typo in a later variant, or a baseline that is not a variant, fails before any cell runs (a typo once
    waited until the cells before it had run and paid); a validation error names its field."""
    import yaml

    from dpsynth.bench.grid import load_bench, run_grid
    from dpsynth.runs import engine

    def write(raw: dict) -> Path:
        path = tmp_path / "b.yaml"
        path.write_text(yaml.safe_dump(raw))
        return path

    variants = [{"name": "zero-shot", "method": "zero-shot"},
                {"name": "wasp", "method": "wasp", "overrides": {"wasp": {"iteratons": 3}}}]
    bench = load_bench(write({"base": BASE, "seeds": [0], "variants": variants}))
    monkeypatch.setattr(engine, "Run", _Refuse)
    with pytest.raises(DpsynthError, match=r"wasp.iteratons: unknown option \(did you mean iterations\?"):
        run_grid(bench, tmp_path / "out", log=lambda line: None)
    assert not (tmp_path / "out" / "cells").exists()
    with pytest.raises(DpsynthError, match="baseline 'nope' is not a variant"):
        load_bench(write({"base": BASE, "baseline": "nope", "variants": variants[:1]}))
    with pytest.raises(DpsynthError, match=r"b.yaml: variants.0.overides: Extra inputs are not permitted"):
        load_bench(write({"base": BASE, "variants": [{"name": "w", "method": "wasp", "overides": {}}]}))


def test_a_bench_checks_every_cells_packages_before_the_first_cell_runs(tmp_path: Path, monkeypatch) -> None:
    """A later variant's missing package (faiss for resample:) and MAUVE's (eval_distribution) stop the bench
    before its first cell runs, naming the extra: the earlier cells would otherwise pay for their generations."""
    import importlib.util

    from dpsynth.bench.grid import run_grid
    from dpsynth.runs import engine

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(engine, "Run", _Refuse)  # a cell that started would raise RuntimeError
    for missing, variants, eval_distribution in (
            ("faiss", [{"name": "zero-shot", "method": "zero-shot"},
                       {"name": "weighted", "method": "zero-shot", "overrides": {"resample": {"clusters": 2}}}],
             False),
            ("mauve", [{"name": "zero-shot", "method": "zero-shot"}], True)):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, gone=missing: None if name == gone else real_find_spec(name, *a))
        bench = BenchConfig.model_validate({"base": BASE, "seeds": [0], "baseline": None, "variants": variants,
                                            "eval_distribution": eval_distribution})
        with pytest.raises(DpsynthError, match=f"needs the package '{missing}'"):
            run_grid(bench, tmp_path / missing, log=lambda line: None)
