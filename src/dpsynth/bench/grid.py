"""`dpsynth bench`: a grid of methods x PLMs x epsilons x seeds on one dataset.

Each cell is an ordinary run directory under `OUT/cells/`, so the grid is
resumable (finished cells are skipped, interrupted ones resumed) and every
generation is shared through the request cache (e.g. WASP variants with the same
seed ask identical zero-shot questions). Aug-PE runs once per PLM, as in the
paper (unless `augpe.fuse`). `private_only` trains the downstream classifier on the private samples
themselves: a non-DP reference line, labelled as such.
"""

from __future__ import annotations

import copy
import csv
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dpsynth.config import RelabelConfig
from dpsynth.errors import DpsynthError, require
from dpsynth.fs import RunDir, atomic_write_text, exclusive_lock, make_dir, refuse_foreign_entries
from dpsynth.llm.registry import check_generator
from dpsynth.methods.registry import method_class, method_names
from dpsynth.runs.build import check_packages
from dpsynth.runs.config import first_error, parse_config, read_yaml_mapping
from dpsynth.runs.planning import plan_privacy

PER_EXAMPLE = ("correct", "predicted", "ft_correct", "ft_predicted")  # kept out of results.csv
PRIVATE_ONLY = "private_only"  # a reference row, not a method: the classifier trained on the private records


class Variant(BaseModel):
    """One entry of a bench's `variants:`: a method and how its runs differ from the base, run at every epsilon and
    seed of the bench."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., description="the variant's name in the tables (entries of one name add cells to one "
                      "variant)")
    method: str = Field(..., description="a registered method (dpsynth budget --help lists them) or private_only")
    overrides: dict[str, Any] = Field(default_factory=dict, description="run-config keys to change")
    epsilons: list[float] | None = Field(None, min_length=1, description="this variant's epsilons (default: the "
                                         "bench's); inf = non-private reference")
    plms: list[str] | None = Field(None, description="generator names to use (a one-PLM method, e.g. "
                                        "Aug-PE without fuse, runs one cell per PLM)")
    seeds: list[int] | None = Field(None, min_length=1, description="this variant's seeds (default: the bench's)")
    compare_with: str | list[str] | None = Field(
        None, description="the variant(s) this one is paired with (default: the bench's baseline), e.g. the "
        "zero-shot runs with the same number of outputs and with the same number of generator calls")
    sample_weights: Literal["auto", "none", "swa"] = Field(
        "auto", description="the classifiers' sample weights: the run's own (FuseGen's) if any, none, or FuseGen's "
        "self-boosting weights computed on this variant's final set (post-processing, no privacy cost)")

    def paired_with(self) -> list[str]:
        return [self.compare_with] if isinstance(self.compare_with, str) else list(self.compare_with or [])


class BenchConfig(BaseModel):
    """A `dpsynth bench` config: a resumable grid of run configs (variants x epsilons x seeds) scored on one real
    test split and compared pairwise (configs/bench_*.yaml are examples)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field("bench", description="the grid's name (its default output directory is bench/NAME)")
    base: dict[str, Any] = Field(..., description="run config shared by every cell (data, generators, ...)")
    variants: list[Variant] = Field(..., min_length=1, description="the methods compared (bench.variants)")
    epsilons: list[float] = Field(default_factory=lambda: [4.0], min_length=1, description="epsilons every DP "
                                  "variant runs at (a variant's own epsilons replace them)")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, description="the run seeds every "
                             "variant runs with; differences are paired by seed")
    eval_distribution: bool = Field(True, description="MAUVE per cell (FID, k-NN precision/recall and diversity "
                                                      "are always computed: a second or two a cell)")
    classifiers: list[Literal["probe", "finetune"]] = Field(
        ["probe"], min_length=1,
        description="downstream classifiers scored per cell: the logistic-regression probe on sentence embeddings "
        "(fast; always computed) and the fine-tuned MiniLM encoder (the papers' small task model; ~1-2 min a cell)")
    baseline: str | None = Field("zero-shot", description="variant every other one is compared with, paired "
                                    "by seed and test example (95% intervals: t over seeds plus the test set's "
                                    "sampling error); null: only the variants' own compare_with pairs")


def load_bench(path: Path) -> BenchConfig:
    raw = read_yaml_mapping(path, "bench config", "name, base, variants, ...")
    try:
        bench = BenchConfig.model_validate(raw)
    except ValidationError as err:  # the field and the reason, in one line
        raise DpsynthError(f"{path}: {first_error(err)}") from err
    names = sorted({v.name for v in bench.variants})  # a name may repeat: its entries add cells to one variant
    if "baseline" in bench.model_fields_set and bench.baseline is not None and bench.baseline not in names:
        raise DpsynthError(f"{path}: baseline '{bench.baseline}' is not a variant (variants: {', '.join(names)})")
    return bench


def _merge(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def cells(bench: BenchConfig) -> list[dict]:
    """Every (variant, plm, epsilon, seed) cell with its full run config."""
    out = []
    methods: dict[str, str] = {}
    for v in bench.variants:
        if methods.setdefault(v.name, v.method) != v.method:
            raise DpsynthError(f"variant {v.name}: its entries name two methods ({methods[v.name]}, {v.method}); "
                               "give each method its own variant name")
        generators = [g for g in bench.base["generators"] if v.plms is None or _plm_name(g) in v.plms]
        if not generators:
            raise DpsynthError(f"variant {v.name}: none of plms {v.plms} is in base.generators")
        if v.method != PRIVATE_ONLY and v.method not in method_names():
            raise DpsynthError(f"variant {v.name}: unknown method '{v.method}'; choose one of "
                               f"{', '.join(method_names())} or {PRIVATE_ONLY}")
        cls = method_class(v.method) if v.method != PRIVATE_ONLY else None
        merged = _merge(bench.base, v.overrides)
        alone = cls is not None and _runs_alone(cls, merged.get(v.method) or {})
        plm_sets = [[g] for g in generators] if alone else [generators]
        final_stage = merged.get("resample") is not None or (merged.get("relabel") is not None and
                                                            RelabelConfig.model_validate(merged["relabel"] or {})
                                                            .reads_private_records)
        private_votes = cls is not None and (cls.uses_private_data or final_stage)
        # DP label proportions are a private release too: such a cell has an epsilon even without votes.
        dp_labels = cls is not None and (merged.get("privacy") or {}).get("label_proportions") == "dp"
        private = private_votes or dp_labels
        epsilons: list[float | None] = list(v.epsilons or bench.epsilons) if private else [None]
        for plms in plm_sets:
            plm_tag = "+".join(_plm_name(g) for g in plms)
            for eps in epsilons:
                for seed in v.seeds or bench.seeds:
                    raw = _merge(bench.base, v.overrides)
                    raw.update(method=v.method if cls is not None else "zero-shot", generators=plms, seed=seed)
                    for other in set(method_names()) - {raw["method"]}:  # the base's sections for other variants
                        raw.pop(other, None)
                    if eps is not None:
                        raw = _merge(raw, {"privacy": {"epsilon": eps}})
                    if not private_votes:
                        # nothing to federate: a method without votes has no federated mode, and its DP
                        # label proportions (if any) are then released centrally
                        raw.pop("federated", None)
                    name = f"{v.name}-{plm_tag if alone else 'all'}-eps{eps}-seed{seed}"
                    out.append({"name": name, "variant": v.name, "method": v.method, "plms": plm_tag,
                                "epsilon": eps, "seed": seed, "config": raw, "sample_weights": v.sample_weights})
    _check_cell_names(out)
    _check_comparators(bench, out)
    return out


def _check_cell_names(grid: list[dict]) -> None:
    """Entries of one variant name add cells to it, but two may not make the same cell: its run directory would
    hold one of them and the other would be refused only after the first had run (and paid)."""
    seen: dict[str, dict] = {}
    for cell in grid:
        first = seen.setdefault(cell["name"], cell)
        if first is not cell:
            raise DpsynthError(f"variant {cell['variant']}: two entries make the cell {cell['name']}; give them "
                               "different names (or plms or seeds)")


def _runs_alone(cls: Any, section: dict) -> bool:
    """Whether the method runs one PLM per cell with these options; options that do not validate are reported with
    their field by the cell's own config check, before any cell runs."""
    try:
        return bool(cls.runs_alone(cls.Options.model_validate(section)))
    except ValidationError:
        return bool(cls.one_generator_per_run)


def _check_comparators(bench: BenchConfig, grid: list[dict]) -> None:
    """Every variant named in compare_with exists and runs at one epsilon (pairs are matched by seed, so a
    comparator at two epsilons would pair with whichever run came last); so does the baseline, if present."""
    epsilons: dict[str, set] = {}
    for cell in grid:
        epsilons.setdefault(cell["variant"], set()).add(cell["epsilon"])
    for v in bench.variants:
        for against in v.paired_with():
            if against.split(":")[0] not in epsilons:  # `variant:set` names a run's own reference set
                raise DpsynthError(f"variant {v.name}: compare_with names '{against}', which is not a variant")
    baseline = {bench.baseline} if bench.baseline is not None else set()
    for against in {b for v in bench.variants for b in v.paired_with()} | baseline:
        if len(epsilons.get(against, ())) > 1:
            raise DpsynthError(f"variant '{against}' is compared with but runs at several epsilons; give each "
                               "epsilon its own variant name to compare with")


def _plm_name(generator: dict) -> str:
    return generator.get("name") or Path(generator["model"]).stem


def needed_variants(bench: BenchConfig, only: Sequence[str]) -> set[str]:
    """The variants `only` names plus every variant they are compared with and the baseline: what a run of
    part of a grid must finish for its paired tables."""
    known = {v.name for v in bench.variants}
    unknown = sorted(set(only) - known)
    if unknown:
        raise DpsynthError(f"--only names {', '.join(unknown)}, not a variant of {bench.name} "
                           f"(variants: {', '.join(sorted(known))})")
    needed = set(only) | ({bench.baseline} & known if bench.baseline is not None else set())
    for v in bench.variants:
        if v.name in only:
            needed |= {against.split(":")[0] for against in v.paired_with()}
    return needed


def run_grid(bench: BenchConfig, out: Path, log: Callable[[str], None] = print,
             progress: Callable[[str, int, int], None] | None = None, run_missing: bool = True,
             only: Sequence[str] | None = None) -> list[dict]:
    """Run (or resume) every cell and collect its row; `run_missing=False` only reports finished cells;
    `only`: run just those variants and what they are compared with (other finished cells are still reported).

    Several bench processes may share `out` (one per core, say; POSIX only: the claims are flocks): each cell is
    claimed by one of them for its run, evaluation and scoring; another process leaves a claimed cell to its
    holder, goes on with the next, and at its end waits for the cells it left and reports them too (or runs one
    itself if its holder stopped first). A report-only pass reports a claimed cell only if it is finished and
    scored."""
    from dpsynth.data.public import load_test

    _refuse_a_folder_of_other_files(out)
    wanted = None if only is None else needed_variants(bench, only)
    rows: dict[int, list[dict]] = {}
    left: list[int] = []  # cells claimed by another bench process
    grid = cells(bench)
    # every cell's config is checked before the first runs: a typo in the last variant must not wait for (and
    # let the grid pay for) the ones before it
    configs = [parse_config(cell["config"], cell["name"]) for cell in grid]
    to_run = [config for cell, config in zip(grid, configs) if run_missing and cell["method"] != PRIVATE_ONLY
              and (wanted is None or cell["variant"] in wanted)
              and not RunDir(out / "cells" / cell["name"]).is_finished()]
    for generator in {g.model_dump_json(): g for config in to_run for g in config.generators}.values():
        check_generator(generator)  # a report, or finished cells, need no model file or key
    for config in to_run:
        check_packages(plan_privacy(config))  # faiss, opacus, flwr...: before the first cell pays for anything
    if to_run and bench.eval_distribution:
        require("mauve", "eval", "the bench's MAUVE per cell (eval_distribution: false leaves it out)")
    if run_missing:
        make_dir(out / "cells")  # the folder's mark as a bench's (private_only rows alone make no cell)
    for i, cell in enumerate(grid):
        run_missing_here = run_missing and (wanted is None or cell["variant"] in wanted)
        config = configs[i]
        test = load_test(config)
        if test is None:
            raise DpsynthError("bench needs a real test set: use data.corpus or data.test")
        if cell["method"] == PRIVATE_ONLY:
            if run_missing_here:
                rows[i] = [_private_only(cell, config, test)]
            continue
        if not run_missing_here and not RunDir(out / "cells" / cell["name"]).is_finished():
            continue  # nothing to report, and no claim file to leave behind
        claim = exclusive_lock(_claim_path(out, cell), wait=False)
        if claim is None:
            if run_missing_here:
                log(f"{cell['name']} is being run by another bench process: its row is collected when it is done")
                left.append(i)
            else:
                rows[i] = _scored_rows(cell, config, out)
            continue
        with claim:
            rows[i] = _cell_rows(bench, cell, config, test, out, run_missing_here, log, progress)
    for i in left:
        cell, config = grid[i], configs[i]
        log(f"waiting for {cell['name']} (run by another bench process)")
        claim = exclusive_lock(_claim_path(out, cell), wait=True)
        assert claim is not None, "a lock waited for is always granted"
        with claim:
            rows[i] = _cell_rows(bench, cell, config, load_test(config), out, True, log, progress)
    ordered = [row for i in sorted(rows) for row in rows[i]]
    if ordered:  # none: the caller says so, and writes nothing
        _write_csv(out / "results.csv", ordered)
    return ordered


def _refuse_a_folder_of_other_files(out: Path) -> None:
    """A bench writes its cells and tables into `out`; a folder holding files but no `cells/` (which every bench
    makes before its first table) is the user's (a typo'd -o), whose results.csv or report would be overwritten."""
    if out.is_file():
        raise DpsynthError(f"{out} is a file: give a folder for the bench's cells and tables")
    refuse_foreign_entries(out, (out / "cells",), "bench")


def _claim_path(out: Path, cell: dict) -> Path:
    return out / "cells" / f".{cell['name']}.claim"


def _scored_rows(cell: dict, config, out: Path) -> list[dict]:
    """A cell's rows as they stand, if it is finished and scored (none otherwise)."""
    cell_dir = RunDir(out / "cells" / cell["name"])
    if not cell_dir.is_finished() or not _evaluated_as(cell_dir, cell["sample_weights"]):
        return []
    _refuse_drift(config, cell_dir)
    row = _row(cell, cell_dir)
    return [*_reference_rows(cell, cell_dir, row), row]


def _cell_rows(bench: BenchConfig, cell: dict, config, test, out: Path, run_missing_here: bool,
               log: Callable[[str], None], progress: Callable[[str, int, int], None] | None) -> list[dict]:
    """One cell's rows (its reference sets, then its final set), after running, evaluating and scoring what is
    missing. With `run_missing_here` false an unfinished cell has no rows, and a finished one is still evaluated
    if it has not been (but not fine-tuned)."""
    from dpsynth.evaluate.run_eval import add_finetuned, evaluate_run
    from dpsynth.runs.engine import Run, holds_a_run

    cell_dir = RunDir(out / "cells" / cell["name"])
    if not cell_dir.is_finished() and not run_missing_here:
        return []
    held = not cell_dir.is_finished() and holds_a_run(cell_dir.root)  # a cell killed in its first step too
    if held or cell_dir.is_finished():
        _refuse_drift(config, cell_dir)
    if not cell_dir.is_finished():
        log(f"running {cell['name']}")
        runner = (Run.resume(cell_dir.root, progress=progress) if held
                  else Run.create(config, cell_dir.root, progress=progress))
        runner.execute()
    if not _evaluated_as(cell_dir, cell["sample_weights"]):
        if bench.eval_distribution:  # a report-only pass evaluates finished cells too (run_grid checked the rest)
            require("mauve", "eval", "the bench's MAUVE per cell (eval_distribution: false leaves it out)")
        evaluate_run(cell_dir.root, test, with_mauve=bench.eval_distribution, weights=cell["sample_weights"])
    if "finetune" in bench.classifiers and run_missing_here and not _has_finetuned(cell_dir):
        log(f"fine-tuning the classifier of {cell['name']}")
        add_finetuned(cell_dir.root, test)
    return _scored_rows(cell, config, out)


def _evaluated_as(cell_dir: RunDir, weights: str) -> bool:
    """The cell has an eval.json scored with the variant's sample weights (a changed setting re-scores it)."""
    from dpsynth.evaluate.run_eval import evaluated_weights

    used = evaluated_weights(cell_dir.root)
    return used is not None and (used in ("run", "none") if weights == "auto" else used == weights)


def config_drift(saved: Any, wanted: Any, path: str = "") -> str | None:
    """The first setting at which a cell's saved config differs from what the bench asks for now, or None. Keys
    only one side has are skipped (a setting added or dropped by another dpsynth version), as are lists of
    different lengths' extra items."""
    if isinstance(saved, dict) and isinstance(wanted, dict):
        for key in [k for k in wanted if k in saved]:
            found = config_drift(saved[key], wanted[key], f"{path}{key}.")
            if found:
                return found
        return None
    if isinstance(saved, list) and isinstance(wanted, list) and len(saved) == len(wanted):
        for i, (a, b) in enumerate(zip(saved, wanted)):
            found = config_drift(a, b, f"{path}{i}.")
            if found:
                return found
        return None
    return None if saved == wanted else f"{path.rstrip('.')}: {saved!r} in the cell, {wanted!r} asked"


def _refuse_drift(config, cell_dir: RunDir) -> None:
    """A cell run under other settings must not be reported (or resumed) as this variant: the bench's cells
    are found by name only, so an edited config would otherwise pair results it did not ask for. Other
    methods' sections are not compared (a run reads only its own)."""
    saved = yaml.safe_load(cell_dir.config.read_text()) if cell_dir.config.exists() else None
    if not isinstance(saved, dict):
        return
    wanted = config.model_dump(mode="json")
    others = set(method_names()) - {config.method}
    drift = config_drift({k: v for k, v in saved.items() if k not in others},
                         {k: v for k, v in wanted.items() if k not in others})
    if drift:
        raise DpsynthError(f"{cell_dir.root}: this cell was run with other settings ({drift}); move it away to run "
                           "it again, or bench into another directory")


def _private_only(cell: dict, config, test) -> dict:
    from dpsynth.private.reference import private_only_scores

    scores = private_only_scores(config, test, seed=cell["seed"])
    return {**_keys(cell), "accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"],
            # the exact number of private records is never written, not even beside this NOT-DP reference
            "samples": None, "epsilon_spent": None, "note": "private samples, NOT DP (reference)",
            "correct": scores["correct"], "predicted": scores.get("predicted")}


def _keys(cell: dict) -> dict:
    return {k: cell[k] for k in ("name", "variant", "method", "plms", "epsilon", "seed")}


def _row(cell: dict, cell_dir: RunDir) -> dict:
    metrics = json.loads(cell_dir.metrics.read_text())
    privacy = json.loads(cell_dir.privacy.read_text())
    ev = json.loads(cell_dir.evaluation.read_text())
    final = ev["final"]
    return {
        **_keys(cell),
        "accuracy": final["probe"]["accuracy"],
        "macro_f1": final["probe"]["macro_f1"],
        "samples": final["samples"],
        "epsilon_spent": privacy["epsilon"],
        "fid": final["fid"],
        "mauve": final.get("mauve"),
        "precision": final["precision"],
        "recall": final["recall"],
        "wall_seconds": metrics["timings"]["wall"],
        **_federated_columns(metrics.get("federated")),
        "note": "",
        "correct": final["probe"].get("correct"),  # per test example (not written to results.csv)
        "predicted": final["probe"].get("predicted"),  # per test example (not written to results.csv)
        **_finetuned_columns(final.get("finetuned_encoder")),
    }


def _has_finetuned(cell_dir: RunDir) -> bool:
    return "finetuned_encoder" in json.loads(cell_dir.evaluation.read_text())["final"]


def _finetuned_columns(scores: dict | None) -> dict:
    """The fine-tuned encoder's scores as `ft_`-prefixed columns (per-example lists kept out of results.csv)."""
    if not scores:
        return {}
    return {"ft_accuracy": scores["accuracy"], "ft_macro_f1": scores["macro_f1"], "ft_correct": scores["correct"],
            "ft_predicted": scores["predicted"]}


def _reference_rows(cell: dict, cell_dir: RunDir, row: dict) -> list[dict]:
    """The method's own reference sets, evaluated inside the run on the same test split (e.g. fedgen's stage 3
    before refinement), as rows named `variant:set`: paired with the final set by seed and test example."""
    metrics = json.loads(cell_dir.metrics.read_text())
    evaluation = metrics.get("evaluation") or {}
    final = metrics.get("method", cell["method"])  # the name the run used (a renamed method keeps its old one)
    out = []
    for name, scores in evaluation.items():
        if name == final or not isinstance(scores, dict) or "correct" not in scores:
            continue
        out.append({**_keys(cell), "name": f"{cell['name']}:{name}", "variant": f"{cell['variant']}:{name}",
                    "accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"], "samples": scores.get("train_size"),
                    "epsilon_spent": row["epsilon_spent"], "wall_seconds": None,
                    "note": f"reference set '{name}' of the run", "correct": scores["correct"],
                    "predicted": scores.get("predicted")})
    return out


def _federated_columns(fed: dict | None) -> dict:
    """Communication per party over the run (federated cells only). Not the time spent aggregating: it holds the
    parties' work on their records, which metrics.json leaves out (runs/outputs.py)."""
    if not fed:
        return {}
    return {"download_bytes_per_party": fed["download_bytes_per_party"],
            "upload_bytes_per_party": fed["upload_bytes_per_party"]}


def _write_csv(path: Path, rows: list[dict]) -> None:
    make_dir(path.parent)
    rows = [{k: v for k, v in r.items() if k not in PER_EXAMPLE} for r in rows]
    fields = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, text.getvalue())  # bench processes sharing the directory may write it at once
