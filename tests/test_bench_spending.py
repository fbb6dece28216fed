"""A bench on the user's own records states what its cells spend on them together (each cell is its own run)."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from dpsynth.bench.grid import BenchConfig
from dpsynth.bench.spending import spending_note

GENERATORS = [{"model": "gemma3-270m", "name": "g"}, {"model": "smollm2-135m-instruct", "name": "s"}]
TASK = {"text_kind": "message", "labels": {"a": "one kind", "b": "another kind"}}


def _bench(data: dict, variants: list[dict], **extra) -> BenchConfig:
    base = {"data": data, "task": TASK, "generators": GENERATORS, "zero-shot": {"n": 8}, "augpe": {"n": 8}}
    return BenchConfig.model_validate({"base": base, "variants": variants, "seeds": [0, 1, 2], **extra})


VARIANTS = [
    {"name": "zero-shot", "method": "zero-shot"},  # no private data: spends nothing
    {"name": "relabel-public", "method": "zero-shot", "overrides": {"relabel": {"scoring": "public"}}},
    {"name": "relabel", "method": "zero-shot", "overrides": {"relabel": {}}},  # 3 seeds x 2 epsilons
    {"name": "augpe", "method": "augpe", "plms": ["g", "s"]},  # one cell per PLM: 2 x 3 seeds x 2 epsilons
    {"name": "ref", "method": "private_only"},
]


def test_own_records_sum_every_dp_cell_and_count_the_non_private_ones():
    bench = _bench({"private": "records.csv"}, VARIANTS, epsilons=[1.0, 4.0, float("inf")])
    note = spending_note(bench)
    # relabel 3 seeds x (1 + 4) + augpe 2 PLMs x 3 seeds x (1 + 4) = 15 + 30; 18 DP cells at delta 1e-5 each;
    # the inf cells (relabel 3, augpe 6) and private_only's 3 read the records without DP
    assert note is not None and note.startswith("this bench runs on your own records: its 18 DP cells spend up to "
                                                "epsilon 45, delta 1.8e-04 on them together")
    assert "12 cells read them without DP" in note


def test_a_public_corpus_spends_nothing_private():
    assert spending_note(_bench({"corpus": "sms_spam", "m": 100}, VARIANTS)) is None


def test_zero_shot_only_on_own_records_says_nothing():
    assert spending_note(_bench({"private": "records.csv"}, VARIANTS[:2])) is None


def test_the_cli_prints_it_before_the_grid(tmp_path: Path, monkeypatch):
    """The note reaches the user before any cell runs (results.md repeats it under the tables)."""
    import dpsynth.bench.grid as grid
    from dpsynth.cli import _typer_app

    config = tmp_path / "b.yaml"
    bench = {"base": {"data": {"private": "records.csv"}, "task": TASK, "generators": GENERATORS[:1],
                      "zero-shot": {"n": 8}}, "variants": VARIANTS[:3], "seeds": [0]}
    config.write_text(yaml.safe_dump(bench))
    monkeypatch.setattr(grid, "run_grid", lambda *a, **k: [])  # stop right after the note: no cell runs
    result = CliRunner().invoke(_typer_app, ["bench", str(config), "-o", str(tmp_path / "out")])
    assert "note: this bench runs on your own records: its 1 DP cell spends up to epsilon 4" in result.output


def test_a_variant_on_own_records_over_a_corpus_base_is_counted():
    variants = [{"name": "zero-shot", "method": "zero-shot"},
                {"name": "mine", "method": "zero-shot", "overrides": {"data": {"corpus": None, "m": None,
                                                                               "private": "records.csv"},
                                                                      "relabel": {}}}]
    note = spending_note(_bench({"corpus": "sms_spam", "m": 100}, variants))
    assert note is not None and "its 3 DP cells spend up to epsilon 12" in note


def test_a_bad_field_leaves_the_report_to_the_grids_own_check():
    assert spending_note(_bench({"private": "records.csv", "privat": "x"}, VARIANTS)) is None
