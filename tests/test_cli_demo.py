"""`dpsynth demo`: each demo has its own folder, and a folder holding a run of other settings is refused, not
resumed in place of the demo asked for."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dpsynth.cli import _typer_app
from dpsynth.fs import RunDir
from dpsynth.runs.config import dump_config, parse_config


@pytest.fixture
def started(monkeypatch) -> list[tuple[str | None, Path]]:
    """What the demo would run (a new run's method, or None for a resume), and where; nothing runs."""
    calls: list[tuple[str | None, Path]] = []
    monkeypatch.setattr("dpsynth.cli.runs._execute",
                        lambda config, out: calls.append((None if config is None else config.method, out)))
    monkeypatch.setattr("dpsynth.runs.engine.holds_a_run", lambda out: RunDir(out).config.exists())
    return calls


def test_each_demo_has_its_own_folder_and_resumes_only_itself(tmp_path: Path, monkeypatch,
                                                              started: list) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(_typer_app, ["demo"]).exit_code == 0
    assert runner.invoke(_typer_app, ["demo", "--wasp"]).exit_code == 0
    assert [(m, str(out)) for m, out in started] == [("zero-shot", "runs/demo"), ("wasp", "runs/demo-wasp")]


def test_a_folder_holding_a_run_of_other_settings_is_refused(tmp_path: Path, started: list) -> None:
    """Before: `demo --wasp -o DIR` over the SMS demo's folder resumed the SMS run (its saved config), silently."""
    runner = CliRunner()
    assert runner.invoke(_typer_app, ["demo", "-o", str(tmp_path)]).exit_code == 0  # a new run: nothing saved
    raw = yaml.safe_load(files("dpsynth.configs").joinpath("demo.yaml").read_text())
    RunDir(tmp_path).config.write_text(dump_config(parse_config(raw, "demo config")))
    again = runner.invoke(_typer_app, ["demo", "-o", str(tmp_path)])
    assert again.exit_code == 0 and started[-1] == (None, tmp_path)  # the same demo: resumed
    for other in (["--wasp"], ["--n", "60"]):
        refused = runner.invoke(_typer_app, ["demo", "-o", str(tmp_path), *other])
        assert "holds an earlier run of other settings" in str(refused.exception)  # `dpsynth`: one line, exit 2
    assert len(started) == 2
