"""The dataset card of a finished run (`README.md` in the run directory): the privacy statement travels with
the data.

A Hugging Face dataset card is a README whose YAML header `datasets` reads: `configs` points the loader at
`synthetic.parquet`, so `datasets.load_dataset(run_dir)` loads the synthetic set, and the Hub shows the
card. The header also carries the privacy facts as data (`dpsynth:`); the body says them in plain words.
Everything in it comes from privacy.json and the config, which are public by construction (no record, no
count of records).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import yaml

from dpsynth import __version__
from dpsynth.config import RunConfig
from dpsynth.data.records import TaskSpec
from dpsynth.privacy.report import percent_at_most

PARQUET = "synthetic.parquet"


def dataset_card(config: RunConfig, task: TaskSpec, privacy: dict[str, Any], labels: list[str],
                 weighted: bool = False) -> str:
    """README.md of a run: YAML header (loader config, tags, privacy facts) and the plain-words statement.

    `weighted`: the rows carry training weights (FuseGen's, `resample: {weights: true}`'s or both), so the card
    names the column, says where it comes from and to train with it."""
    facts = privacy_facts(config, privacy)
    header = {
        "pretty_name": f"Synthetic {task.text_kind} data (dpsynth, {config.method})",
        "task_categories": ["text-classification"],
        "tags": ["synthetic", "differential-privacy", "dpsynth"],
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": PARQUET}]}],
        "dpsynth": facts,
    }
    counts = Counter(labels)
    lines = [
        "---",
        yaml.safe_dump(header, sort_keys=False, allow_unicode=True).rstrip(),
        "---",
        "",
        f"# Synthetic {task.text_kind} data: dpsynth, method `{config.method}`",
        "",
        "## Privacy statement",
        "",
        privacy_statement(facts),
        "",
        "## Contents",
        "",
        f"{len(labels)} synthetic texts in `{PARQUET}` (and `synthetic.jsonl`), with the columns `text`, `label`, "
        "`plm` (the model that wrote it) and `iteration`" + (_weight_column(config) if weighted else "") + ". Labels:",
        "",
        *[f"- `{name}` ({task.labels[name]}): {counts.get(name, 0)} texts" for name in task.label_names],
        "",
        "Models: " + ", ".join(f"`{g.display_name}` ({g.kind}: {g.model})" for g in config.generators) + ".",
        "",
        f"Written by dpsynth {__version__}. `privacy.json` beside this card lists every release with its noise, "
        "so that the epsilon can be recomputed.",
        "",
    ]
    return "\n".join(lines)


def _weight_column(config: RunConfig) -> str:
    """What the `weight` column is, by where the weights came from: train with it as the sample weight."""
    histogram = config.resample is not None and config.resample.weights
    sources = (["FuseGen's self-boosting weights (from the synthetic set alone)"] if config.method == "fusegen"
               else []) + (["the DP cluster histogram (each bin's share of the noisy histogram over its share of "
                            "the set, within each label; `resample: {weights: true}`): the only way that release "
                            "reaches the set"] if histogram else [])
    origin = (", from " + ", then scaled by ".join(sources)) if sources else ""
    return f", and `weight`: each sample's training weight{origin}; train with it as the sample weight"


def privacy_facts(config: RunConfig, privacy: dict[str, Any]) -> dict[str, Any]:
    """The privacy facts of a run, as plain data (from privacy.json)."""
    events = privacy.get("events", [])
    assumptions = privacy.get("assumptions", {})
    return {
        "method": config.method,
        "models": [g.model for g in config.generators],
        "differentially_private": bool(privacy.get("differentially_private")),
        "epsilon": privacy.get("epsilon"),
        "delta": privacy.get("delta"),
        "unit_of_privacy": assumptions.get("unit", "record"),
        "adjacency": assumptions.get("adjacency"),
        "accountant": privacy.get("accountant", {}).get("primary"),
        "releases": [f"{e['name']} ({e['kind']})" for e in events],
        "reads_private_data": bool(events) or not privacy.get("differentially_private"),
        "noise": privacy.get("noise", {}).get("mode"),
        "dp_sgd_noise": privacy.get("noise", {}).get("dp_sgd"),
        "checked_on_private_data": assumptions.get("checked_on_private_data"),
        "membership_test": privacy.get("membership_test"),
    }


def privacy_statement(facts: dict[str, Any]) -> str:
    """The privacy facts in plain words."""
    if not facts["differentially_private"]:
        return ("**This data set is NOT differentially private**: it was made by a reference run that released "
                "votes on the private data without noise. Do not share it as private data.")
    if not facts["releases"]:
        return ("No private record was used: the texts were written by the models from the public task "
                "description alone (epsilon 0). They carry no information about any private data set.")
    unit = facts["unit_of_privacy"]
    who = ("any one record" if unit == "record" else
           f"any one {unit.split(' ')[0]} (all of their records: {unit})")
    change = "replacing" if facts["adjacency"] == "replace" else "adding or removing"
    text = (f"The texts were generated with (epsilon = {facts['epsilon']:.4g}, delta = {facts['delta']:.3g})"
            f"-differential privacy with respect to the private data set, for {who}: {change} "
            f"{'it' if unit == 'record' else 'them'} changes the probability of any output by at most a factor "
            f"e^epsilon, except with probability delta. The private data was read only through "
            f"{len(facts['releases'])} noisy release(s) ({', '.join(facts['releases'])}), accounted with "
            f"{facts['accountant']}; everything else, these texts included, is post-processing of those "
            f"releases. Noise: {facts['noise']}.")
    if facts["dp_sgd_noise"]:
        text += f" DP-SGD's noise: {facts['dp_sgd_noise']}."
    checked = facts["checked_on_private_data"]
    if checked and checked != "none" and not checked.startswith("not recorded"):
        text += f" {checked[0].upper()}{checked[1:]}."
    seeded = bool(facts["noise"]) and "NOT FOR RELEASE" in facts["noise"]
    if seeded:
        text += " **The noise was seeded for an experiment: the guarantee does not hold for this data.**"
    test = facts.get("membership_test")
    if not test or seeded:  # no guarantee to put in plain words
        return text
    one = "a given record" if unit == "record" else f"a given {unit.split(' ')[0]}"
    plain = (f"**In plain words:** anyone who tries to tell from everything this run released whether {one} was in "
             f"the private data, and accepts being wrong about {test['false_alarm_rate']:.0%} of those who were not, "
             f"can be right about at most {percent_at_most(test['detection_rate_at_most'])} of those who were (by "
             f"guessing: {test['false_alarm_rate']:.0%}; docs/privacy.md has the table for other epsilons).")
    return plain + "\n\n" + text
