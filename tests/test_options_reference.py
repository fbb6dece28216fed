"""The run config reference (`dpsynth options`, docs/config.md) is read from the config models: these tests keep
the doc in step with them, every option described, and the listed defaults the ones the parser fills in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dpsynth.cli import _typer_app
from dpsynth.errors import DpsynthError
from dpsynth.methods.registry import method_names
from dpsynth.runs.config import parse_config
from dpsynth.cli.options import INTRO, TITLE, all_sections
from dpsynth.runs.options_reference import TOP_LEVEL, _yaml, markdown, reference, section

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def test_docs_config_md_is_the_generated_reference():
    assert DOC.read_text() == markdown(all_sections(), TITLE, INTRO) + "\n", (
        "docs/config.md is stale: dpsynth options --markdown > docs/config.md")


def test_every_section_and_option_is_described():
    sections = all_sections()
    assert {s.name for s in sections} >= {TOP_LEVEL, "data", "task", "generators", "privacy", "federated",
                                          "resample", "relabel", *method_names(), "bench", "bench.variants"}
    for s in sections:
        assert s.summary, f"section {s.name} has no docstring"
        for o in s.options:
            assert o.description, f"{s.name}.{o.key} has no description (Field(..., description=...))"


@pytest.mark.parametrize("method", method_names())
def test_listed_defaults_are_what_the_parser_fills_in(method):
    raw = {"method": method, "data": {"corpus": "sms_spam", "m": 10}, "generators": [{"model": "gemma3-270m"}]}
    if method == "fedgen":
        raw["federated"] = {"parties": 4}  # a federated method: at least two weak parties under the default 0.3
    if method == "fusegen":
        raw["generators"].append({"model": "smollm2-135m-instruct"})  # it fuses several PLMs
    config = parse_config(raw)
    for o in section(method).options:
        assert _yaml(getattr(config.options(), o.key)) == o.default, (method, o.key)
    given = {"data": raw["data"], "generators": raw["generators"][0], "privacy": {}}
    for name, model in (("privacy", config.privacy), ("data", config.data), ("generators", config.generators[0])):
        for o in section(name).options:
            if o.default != "required" and o.key not in given[name]:
                assert _yaml(getattr(model, o.key)) == o.default, (name, o.key)


def test_a_negative_temperature_is_refused_for_every_method():
    """DPGA's own temperature default dropped the shared ge=0 bound (the reference showed it as a plain float)."""
    for method in method_names():
        assert section(method).options and {o.key: o.kind for o in section(method).options}["temperature"] == (
            "float >= 0"), method
    raw = {"method": "dpga", "data": {"corpus": "sms_spam", "m": 10}, "generators": [{"model": "gemma3-270m"}],
           "dpga": {"temperature": -1}}
    with pytest.raises(DpsynthError, match="dpga.temperature: Input should be greater than or equal to 0"):
        parse_config(raw)


def test_defaults_are_written_as_yaml_reads_them():
    delta = {o.key: o.default for o in section("privacy").options}["delta"]
    assert delta == "1.0e-05" and yaml.safe_load(delta) == 1e-5  # PyYAML reads 1e-05 as text


def test_kinds_show_choices_and_bounds():
    augpe = {o.key: o for o in section("augpe").options}
    assert augpe["output"].kind == "last | all | selected"
    assert augpe["n"].kind == "int > 0"
    assert augpe["fill_ratio"].kind == "float > 0, < 1"
    assert section("privacy").options[0].key == "epsilon"
    assert {o.key: o.kind for o in section(TOP_LEVEL).options}["device"] == "auto | cpu | cuda"
    # a method's own options come before the sampling options every method shares
    assert [o.key for o in section("wasp").options][:2] == ["n", "iterations"]


def test_unknown_section_is_one_line():
    with pytest.raises(DpsynthError, match="no config section 'augpee'; sections: run, data"):
        section("augpee")
    done = subprocess.run([sys.executable, "-m", "dpsynth", "options", "augpee"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: no config section 'augpee'") and len(done.stderr.splitlines()) == 1


def test_cli_lists_sections_and_options():
    listing = CliRunner().invoke(_typer_app, ["options"])
    assert listing.exit_code == 0 and "relabel" in listing.output and "zero-shot" in listing.output
    one = CliRunner().invoke(_typer_app, ["options", "augpe"])
    assert one.exit_code == 0
    assert "  output: last | all | selected = last" in one.output
    bench = CliRunner().invoke(_typer_app, ["options", "bench"])
    assert bench.exit_code == 0 and "  variants: list: see bench.variants = required" in bench.output
    assert "  classifiers: list of probe | finetune" in bench.output


@pytest.mark.parametrize(("section_raw", "expected"), [
    ({"augpe": {"n": 10, "outptu": "selected"}},
     "augpe.outptu: unknown option (did you mean output? `dpsynth options augpe` lists them)"),
    ({"data": {"corpus": "sms_spam", "m": 10, "person": "x"}},
     "data.person: unknown option (did you mean person_column? `dpsynth options data` lists them)"),
    ({"generators": [{"model": "gemma3-270m", "thread": 1}]},
     "generators.0.thread: unknown option (did you mean threads? `dpsynth options generators` lists them)"),
    ({"privacy": {"zzz": 1}}, "privacy.zzz: unknown option (`dpsynth options privacy` lists them)"),
    ({"augpe": {"epsilon": 4}},
     "augpe.epsilon: unknown option here (epsilon is an option of privacy:; `dpsynth options augpe` lists this one's)"),
    ({"generators": [{"model": "gemma3-270m", "max_tokens": 9}]}, "generators.0.max_tokens: unknown option here "
     "(max_tokens is an option of a method's section; `dpsynth options generators` lists this one's)"),
    ({"privcy": {}}, "privcy: unknown section (did you mean privacy? method sections are: augpe, dpft, dpga, fedgen, "
     "fusegen, popri, wasp, zero-shot; `dpsynth options` lists every section)"),
])
def test_a_misspelt_option_names_the_nearest_and_where_to_look(section_raw, expected):
    raw = {"method": "augpe", "data": {"corpus": "sms_spam", "m": 10}, "generators": [{"model": "gemma3-270m"}]}
    raw.update(section_raw)
    with pytest.raises(DpsynthError) as err:
        parse_config(raw, "my.yaml")
    assert str(err.value) == f"my.yaml: {expected}"
