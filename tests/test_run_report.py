"""`dpsynth report RUN_DIR`: the page holds what the issue asks for, and its plots render in a real browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fakes import FakeGenerator
from typer.testing import CliRunner

from dpsynth.cli import _typer_app
from dpsynth.errors import DpsynthError
from dpsynth.runs.config import parse_config
from dpsynth.runs.engine import Run


@pytest.fixture
def finished_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    FakeGenerator.calls = []
    csv = tmp_path / "private.csv"
    csv.write_text("text,label\n" + "".join(f"private review {i} of a {'great' if i % 3 else 'poor'} film,"
                                            f"{'pos' if i % 3 else 'neg'}\n" for i in range(30)))
    config = parse_config({
        "data": {"private": str(csv)},
        "task": {"text_kind": "review", "labels": {"pos": "a positive review", "neg": "a negative review"}},
        "generators": [{"kind": "fake", "model": "a"}, {"kind": "fake", "model": "b"}],
        "wasp": {"n": 12, "iterations": 3}, "privacy": {"epsilon": 2.0, "delta": 1e-3}, "evaluate": False,
    })
    Run.create(config, tmp_path / "run").execute()
    return tmp_path / "run"


def test_report_holds_privacy_samples_diagnostics_and_examples(finished_run: Path) -> None:
    result = CliRunner().invoke(_typer_app, ["report", str(finished_run)])
    assert result.exit_code == 0, result.output
    page = (finished_run / "report.html").read_text()
    privacy = json.loads((finished_run / "privacy.json").read_text())
    for event in privacy["events"]:
        assert event["name"] in page
    assert "Samples and PLM weights per iteration" in page and "share above 3 noise" in page
    first = json.loads((finished_run / "synthetic.jsonl").read_text().splitlines()[0])
    assert first["label"] in page
    assert len(re.findall(r"data:image/png;base64,", page)) == 2  # privacy and samples (no eval.json here)
    private = (finished_run.parent / "private.csv").read_text().splitlines()[1:]
    assert not any(row.split(",")[0] in page for row in private), "a private record on the page"


def test_report_refuses_an_unfinished_run(tmp_path: Path) -> None:
    from dpsynth.bench.run_report import run_report

    with pytest.raises(DpsynthError, match="no metrics.json"):
        run_report(tmp_path)


def test_plots_render_in_a_real_headless_browser(finished_run: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium); .ci/run installs it")
    CliRunner().invoke(_typer_app, ["report", str(finished_run)])
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                          "--dump-dom", (finished_run / "report.html").resolve().as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    assert 'data-plots-rendered="2/2"' in dom, dom[-500:]
