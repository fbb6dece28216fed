"""Bad input gives one clear line naming the problem and the fix, and a non-zero exit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpsynth.data.loaders import load_labelled
from dpsynth.errors import DpsynthError
from dpsynth.runs.config import parse_config

TASK = {"text_kind": "email", "labels": {"spam": "unwanted advertising", "ham": "a normal message"}}


def _csv(tmp_path: Path, text: str, name: str = "p.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(DpsynthError, match="column 'label' not found; columns are: text, stars"):
        load_labelled(_csv(tmp_path, "text,stars\nhello,5\n"))
    with pytest.raises(DpsynthError, match="file is empty"):
        load_labelled(_csv(tmp_path, ""))
    with pytest.raises(DpsynthError, match="file not found"):
        load_labelled(tmp_path / "nope.csv")
    with pytest.raises(DpsynthError, match="unsupported format"):
        load_labelled(_csv(tmp_path, "x", "p.xlsx"))
    bad = tmp_path / "latin.csv"
    bad.write_bytes("text,label\ncaf\xe9,ham\n".encode("latin-1"))
    with pytest.raises(DpsynthError, match="not valid UTF-8"):
        load_labelled(bad)


def test_loader_formats(tmp_path: Path) -> None:
    import pandas as pd

    frame = pd.DataFrame({"body": ["a b c", "d e f"], "y": ["spam", "ham"]})
    frame.to_json(tmp_path / "d.jsonl", orient="records", lines=True)
    frame.to_parquet(tmp_path / "d.parquet")
    for name in ("d.jsonl", "d.parquet"):
        data = load_labelled(tmp_path / name, "body", "y")
        assert data.texts == ["a b c", "d e f"] and data.labels == ["spam", "ham"]


def test_loader_keeps_every_value_the_user_wrote(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """pandas' default NA strings are texts and labels (issue 33): `NA`, `None`, `null`, `nan` are kept;
    only empty cells are dropped, and the user is told how many and why on the terminal."""
    data = load_labelled(_csv(tmp_path, "text,label\nNA,ham\nNone,spam\nnull,NA\nnan,ham\n,ham\nhello,\n"))
    assert data.texts == ["NA", "None", "null", "nan"] and data.labels == ["ham", "spam", "NA", "ham"]
    err = capsys.readouterr().err
    assert "kept 4 of 6 rows; dropped 1 with an empty 'text' and 1 with an empty 'label'" in err
    import pandas as pd

    pd.DataFrame({"text": ["None", None], "label": ["NA", "ham"]}).to_json(tmp_path / "n.jsonl", orient="records",
                                                                           lines=True)
    data = load_labelled(tmp_path / "n.jsonl")
    assert data.texts == ["None"] and data.labels == ["NA"]
    assert "dropped 1 with an empty 'text'" in capsys.readouterr().err  # a JSON null is missing
    load_labelled(_csv(tmp_path, "text,label\nhello,ham\n"))
    assert capsys.readouterr().err == "", "nothing dropped: nothing said"


def check_data(cfg) -> None:
    """The data holder's checks, as a run makes them before spending anything."""
    from dpsynth.data.public import task_for
    from dpsynth.methods.registry import method_class
    from dpsynth.private.dataset import check_private, load_private

    method = method_class(cfg.method)(cfg)
    check_private(cfg, load_private(cfg), task_for(cfg), min_records=method.min_private_records())


def _config(tmp_path: Path, rows: str, **privacy) -> dict:
    return {
        "data": {"private": str(_csv(tmp_path, rows))},
        "task": TASK,
        "generators": [{"model": "smollm2-135m-instruct"}],
        "wasp": {"n": 10, "iterations": 2, "q": 2},
        "privacy": {"delta": 1e-5, **privacy},
    }


def test_data_checks_against_task(tmp_path: Path) -> None:
    rows = "text,label\n" + "".join(f"buy now {i},spam\n" for i in range(5))
    with pytest.raises(DpsynthError, match=r"label\(s\) \['ham'\] have no private samples"):
        check_data(parse_config(_config(tmp_path, rows)))
    rows2 = rows + "hello there,other\n"
    with pytest.raises(DpsynthError, match=r"labels 'other' are not described in task.labels"):
        check_data(parse_config(_config(tmp_path, rows2)))
    small = "text,label\nbuy,spam\nhi,ham\n"
    cfg = _config(tmp_path, small)
    cfg["wasp"]["q"] = 8
    with pytest.raises(DpsynthError, match="smaller than Q=8"):
        check_data(parse_config(cfg))
    ok = "text,label\n" + "".join(f"m {i},{'spam' if i % 2 else 'ham'}\n" for i in range(6))
    with pytest.raises(DpsynthError, match="not < 1/M"):
        check_data(parse_config(_config(tmp_path, ok, delta=0.5)))


def test_a_wrong_label_column_does_not_print_the_private_texts(tmp_path: Path) -> None:
    """A label column holding texts used to list every distinct value in the error: the whole private set."""
    long = "a very long private message about my account number and my card"
    rows = "text,label,body\n" + "".join(f"m {i},spam,{long} {i}\n" for i in range(8))
    cfg = _config(tmp_path, rows)
    cfg["data"]["label_column"] = "body"
    with pytest.raises(DpsynthError) as err:
        check_data(parse_config(cfg))
    message = str(err.value)
    assert "check data.label_column" in message and ", and more" in message
    assert long not in message and message.count("a very long private message...") == 3 and "\n" not in message
    cfg["data"]["label_column"] = "text"
    with pytest.raises(DpsynthError, match="must name different columns"):
        parse_config(cfg)


def test_a_task_with_one_label_refuses_label_correction_and_evaluation(tmp_path: Path) -> None:
    """With one label, relabel spent its whole budget and moved nothing, and evaluation scored 1.0."""
    from dpsynth.runs.build import check_before_start
    from dpsynth.runs.planning import plan_privacy

    cfg = _config(tmp_path, "text,label\n" + "".join(f"buy now {i},spam\n" for i in range(6)))
    cfg["task"] = {**TASK, "labels": {"spam": TASK["labels"]["spam"]}}
    with pytest.raises(DpsynthError, match=r"^run.yaml: relabel: moves samples between labels, and task.labels has "):
        parse_config({**cfg, "method": "zero-shot", "relabel": {}}, "run.yaml")  # no "(top level)" in the way
    cfg["data"]["test"] = str(_csv(tmp_path, "text,label\nbuy,spam\n", name="test.csv"))
    with pytest.raises(DpsynthError, match="the task has one: every score would be 1.0"):
        check_before_start(plan_privacy(parse_config(cfg)))


def test_config_errors(tmp_path: Path) -> None:
    base = _config(tmp_path, "text,label\na,spam\n")
    with pytest.raises(DpsynthError, match="privacy.epsilon must be > 0"):
        parse_config({**base, "privacy": {"epsilon": 0}})
    with pytest.raises(DpsynthError, match="generators"):
        parse_config({**base, "generators": []})
    with pytest.raises(DpsynthError, match="wasp.q"):
        parse_config({**base, "wasp": {"q": "many"}})
    with pytest.raises(DpsynthError, match="give data.private"):
        parse_config({**base, "data": {}})
    # a test file beside a corpus was ignored (the corpus' split evaluated the run): refused
    with pytest.raises(DpsynthError, match="data.test is not used with data.corpus"):
        parse_config({**base, "data": {"corpus": "trec", "m": 60, "test": "mine.csv"}})


def test_a_bench_config_given_as_a_run_config_says_so(tmp_path: Path) -> None:
    from dpsynth.runs.config import load_config

    bench = tmp_path / "grid.yaml"
    bench.write_text("name: g\nbase: {data: {corpus: trec, m: 60}}\nvariants: [{name: a, method: zero-shot}]\n")
    with pytest.raises(DpsynthError, match="is a bench config \\(base, variants\\): run or plan its cells with"):
        load_config(bench)


def test_a_data_file_given_as_the_config_says_so(tmp_path: Path) -> None:
    data = _csv(tmp_path, "text,label\nhello: there,spam\n", "notes.csv")
    _one_line_error(_cli("run", str(data), "--dry-run", cwd=tmp_path), "a data file, not a run config")


def test_every_method_is_named_in_budgets_help(tmp_path: Path) -> None:
    from dpsynth.methods.registry import method_names

    out = _cli("budget", "--help", cwd=tmp_path).stdout
    assert all(name in out for name in method_names()), out


def test_a_section_for_another_method_is_refused_not_ignored(tmp_path: Path) -> None:
    """`method: wasp` beside an `augpe:` section planned wasp's default 6,000 requests without a word; a saved run
    config (older runs saved a bench base's every section) drops it instead."""
    base = {**_config(tmp_path, "text,label\na,spam\n"), "method": "wasp", "augpe": {"n": 12, "iterations": 2}}
    with pytest.raises(DpsynthError, match="augpe: a section for another method .*rename it to wasp: or remove it"):
        parse_config(base)
    config = parse_config(base, other_methods="drop")
    assert set(config.sections) == {"wasp"}
    proc = _cli("run", str(_write_config(tmp_path, base)), "--dry-run", cwd=tmp_path)
    _one_line_error(proc, "a section for another method")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpsynth", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def _write_config(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_missing_column(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "text,stars\nhello,5\n")
    _one_line_error(_cli("run", str(_write_config(tmp_path, cfg)), "-o", str(tmp_path / "r"), cwd=tmp_path),
                    "column 'label' not found")


def test_cli_eps_not_positive(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "text,label\na,spam\n", epsilon=-1)
    _one_line_error(_cli("run", str(_write_config(tmp_path, cfg)), cwd=tmp_path), "epsilon must be > 0")
    _one_line_error(_cli("budget", "wasp", "--epsilon", "0", cwd=tmp_path), "--epsilon must be > 0")


def test_cli_model_file_missing(tmp_path: Path) -> None:
    rows = "text,label\n" + "".join(f"m {i},{'spam' if i % 2 else 'ham'}\n" for i in range(20))
    cfg = _config(tmp_path, rows)
    cfg["generators"] = [{"model": str(tmp_path / "missing.gguf")}]
    _one_line_error(_cli("run", str(_write_config(tmp_path, cfg)), "-o", str(tmp_path / "r"), cwd=tmp_path),
                    "missing.gguf")


def test_cli_unreachable_api(tmp_path: Path) -> None:
    rows = "text,label\n" + "".join(f"m {i},{'spam' if i % 2 else 'ham'}\n" for i in range(20))
    cfg = _config(tmp_path, rows)
    cfg["generators"] = [{"kind": "openai", "model": "x", "base_url": "http://127.0.0.1:9/v1",
                          "max_retries": 1}]
    cfg["evaluate"] = False
    proc = _cli("run", str(_write_config(tmp_path, cfg)), "-o", str(tmp_path / "r"), cwd=tmp_path)
    _one_line_error(proc, "unreachable after retries")
    # said while it retries, once, not only after every retry is spent (a silent server took minutes to report)
    said = [line for line in proc.stderr.splitlines() if line.startswith("warning: x: no answer from")]
    assert len(said) == 1 and "(max_retries: 1)" in said[0], proc.stderr


def test_config_rejects_nan(tmp_path: Path) -> None:
    base = _config(tmp_path, "text,label\na,spam\n")
    with pytest.raises(DpsynthError, match=r"privacy.epsilon: must be a number > 0 \(got NaN\)"):
        parse_config({**base, "privacy": {"epsilon": float("nan")}})
    with pytest.raises(DpsynthError, match=r"privacy.delta: must be a number in \(0, 1\) \(got NaN\)"):
        parse_config({**base, "privacy": {"delta": float("nan")}})
    assert parse_config({**base, "privacy": {"epsilon": float("inf")}}).privacy.epsilon == float("inf")


def test_cli_eps_nan(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "text,label\na,spam\n")
    text = yaml.safe_dump(cfg).replace("privacy:\n", "privacy:\n  epsilon: .nan\n")
    (tmp_path / "run.yaml").write_text(text)
    _one_line_error(_cli("run", str(tmp_path / "run.yaml"), cwd=tmp_path), "privacy.epsilon: must be a number > 0")


def test_model_file_not_gguf(tmp_path: Path) -> None:
    from dpsynth.llm.llama_cpp_backend import LlamaCppGenerator

    fake = tmp_path / "x.gguf"
    fake.write_text("this is a text file, not a model\n")
    with pytest.raises(DpsynthError, match=r"x.gguf is not a GGUF model .*give a .gguf file"):
        LlamaCppGenerator(fake)
    damaged = tmp_path / "cut.gguf"
    damaged.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 16)  # the magic, then nothing usable
    with pytest.raises(DpsynthError, match=r"llama.cpp could not load the model file .*cut.gguf.*download it again"):
        LlamaCppGenerator(damaged)


def test_cli_model_file_not_gguf(tmp_path: Path) -> None:
    rows = "text,label\n" + "".join(f"m {i},{'spam' if i % 2 else 'ham'}\n" for i in range(20))
    cfg = _config(tmp_path, rows)
    (tmp_path / "x.gguf").write_text("not a model\n")
    cfg["generators"] = [{"model": str(tmp_path / "x.gguf")}]
    _one_line_error(_cli("run", str(_write_config(tmp_path, cfg)), "-o", str(tmp_path / "r"), cwd=tmp_path),
                    "is not a GGUF model")


def _truncated_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("embedder: all-MiniLM-L6-v2\nseed: 0\n")
    good = '{"text": "buy now", "label": "spam", "iteration": 0}\n'
    (run / "synthetic.jsonl").write_text(good * 2 + '{"text": "hello th')  # cut short mid-line
    return run


def test_eval_truncated_synthetic(tmp_path: Path, monkeypatch) -> None:
    import dpsynth.evaluate.run_eval as run_eval
    from dpsynth.data.records import LabelledTexts

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the synthetic data was checked")

    monkeypatch.setattr(run_eval, "SentenceTransformerEmbedder", no_model)
    run = _truncated_run(tmp_path)
    with pytest.raises(DpsynthError, match=r"synthetic.jsonl, line 3: not valid JSON"):
        run_eval.evaluate_run(run, LabelledTexts(["hi"], ["ham"]))
    (run / "synthetic.jsonl").write_text('{"text": "ok", "label": "spam"}\n[1, 2]\n')
    with pytest.raises(DpsynthError, match=r"line 2: not a synthetic sample"):
        run_eval.load_run(run)
    (run / "synthetic.jsonl").write_bytes('{"text": "caf\u00e9", "label": "ham"}\n{"text": "caf'.encode()
                                          + "\u00e9".encode()[:1])
    with pytest.raises(DpsynthError, match=r"line 2: not valid UTF-8"):
        run_eval.load_run(run)


def test_cli_eval_truncated_synthetic(tmp_path: Path) -> None:
    run = _truncated_run(tmp_path)
    test = _csv(tmp_path, "text,label\nhello,ham\nbuy,spam\n", "test.csv")
    proc = _cli("eval", str(run), "--test", str(test), cwd=tmp_path)
    _one_line_error(proc, f"{run / 'synthetic.jsonl'}, line 3: not valid JSON")


def test_settings_that_cannot_work_fail_before_anything_is_spent(tmp_path: Path, monkeypatch, caplog) -> None:
    from dpsynth.runs.engine import Run

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    rows = "text,label\n" + "".join(f"m {i},{'spam' if i % 2 else 'ham'}\n" for i in range(20)) + "m 1,spam\n"
    raw = _config(tmp_path, rows)
    raw["generators"] = [{"kind": "fake", "model": "a"}]
    raw["wasp"] = {"n": 3, "iterations": 2, "q": 2}
    with pytest.raises(DpsynthError, match="wasp.n=3 leaves an iteration without a sample"):
        Run.create(parse_config(raw), tmp_path / "run").execute()
    assert not (tmp_path / "run" / "checkpoints").exists(), "nothing was planned or released"
    raw["wasp"]["n"] = 8
    raw["evaluate"] = False
    Run.create(parse_config(raw), tmp_path / "run2").execute()
    said = caplog.text.replace(str(tmp_path), "DIR")  # pytest's folder may itself hold "21" (pytest-221)
    assert "duplicate rows" in said and "21" not in said, "the message names no private record count"


def test_utf8_error_names_the_byte_in_the_whole_file(tmp_path: Path) -> None:
    from dpsynth.data.loaders import load_labelled

    path = tmp_path / "bad.csv"
    good = "text,label\n" + "".join(f"a fine message number {i},ham\n" for i in range(60))
    path.write_bytes(good.encode() + b"caf\xff,ham\n")
    with pytest.raises(DpsynthError, match=f"at byte {len(good.encode()) + 3}"):
        load_labelled(path)


def test_secagg_clipping_reserve_is_charged_as_one_plus_e_to_the_epsilon() -> None:
    import math

    from dpsynth.config import FederatedConfig
    from dpsynth.federated.clipping import CLIP_DELTA_SHARE, accounting_delta, clip_delta

    fed = FederatedConfig(parties=10)
    for eps in (1.0, 4.0, 8.0):
        acc, clip = accounting_delta(fed, 1e-5), clip_delta(fed, 1e-5, eps)
        assert clip == pytest.approx(CLIP_DELTA_SHARE * 1e-5 / (1 + math.exp(eps)))
        assert acc + (1 + math.exp(eps)) * clip == pytest.approx(1e-5)  # the run is exactly (eps, delta)
    assert clip_delta(FederatedConfig(parties=10, aggregation="plain"), 1e-5, 4.0) == 0.0
    assert clip_delta(fed, 1e-5, math.inf) == 0.0


@pytest.mark.parametrize("case", ["output below a file", "output name too long", "cache is a file"])
def test_file_system_conditions_are_one_line_errors(case: str, tmp_path: Path) -> None:
    """Issue 33: file-system conditions give one line naming the path and the fix, exit 2, no traceback."""
    import os

    rows = "text,label\n" + "".join(f"m {i},{'spam' if i % 2 else 'ham'}\n" for i in range(20))
    cfg = _config(tmp_path, rows)
    (tmp_path / "a-file").write_text("x")
    out, env, needle = tmp_path / "r", dict(os.environ), ""
    if case == "output below a file":
        out, needle = tmp_path / "a-file" / "run", "part of this path is a file"
    elif case == "output name too long":
        out, needle = tmp_path / ("x" * 300), "too long"
    else:
        env["DPSYNTH_CACHE"] = str(tmp_path / "a-file")
        needle = "a-file"
    proc = subprocess.run([sys.executable, "-m", "dpsynth", "run", str(_write_config(tmp_path, cfg)), "-o", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    _one_line_error(proc, needle)
    assert not (tmp_path / "r").exists(), "nothing is left behind"


def test_file_system_messages_name_the_path_and_the_fix() -> None:
    """The conditions root cannot reproduce here (a read-only mount, no permission) map to one line too; an
    OSError that is not the user's to fix (e.g. a broken pipe) stays a traceback, as a bug should."""
    import errno

    from dpsynth.cli import file_system_message

    ro = file_system_message(OSError(errno.EROFS, "Read-only file system", "/mnt/ro/run"))
    assert ro is not None and ro.startswith("/mnt/ro/run: Read-only file system;") and "-o" in ro
    denied = file_system_message(PermissionError(errno.EACCES, "Permission denied", "/home/u/.cache/dpsynth"))
    assert denied is not None and "DPSYNTH_CACHE" in denied
    assert "free some space" in (file_system_message(OSError(errno.ENOSPC, "No space left on device")) or "")
    assert file_system_message(OSError(errno.EPIPE, "Broken pipe")) is None
    assert "cannot be made here" in (file_system_message(FileNotFoundError(errno.ENOENT, "No such file", "/proc/x"))
                                     or "")


def test_eval_labels_that_do_not_match_the_run(capsys: pytest.CaptureFixture) -> None:
    """Issue 33: an eval test set with other labels printed accuracy 0.0000; now it is refused, and a partial
    match is warned about."""
    from dpsynth.cli.evaluate import check_labels_match

    with pytest.raises(DpsynthError, match="share none with the run's"):
        check_labels_match({"positive", "negative"}, {"spam", "ham"}, "test.csv")
    check_labels_match({"positive", "negative"}, {"positive", "negative", "neutral"}, "test.csv")
    assert "['neutral'] have no synthetic sample" in capsys.readouterr().err


def test_option_ranges_are_checked_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = _config(tmp_path, "text,label\na,spam\n")
    other = {k: v for k, v in base.items() if k != "wasp"}  # the base's wasp section is refused beside another method
    for section, bad, needle in (("wasp", {"temperature": -0.5}, "temperature"), ("wasp", {"top_p": 1.5}, "top_p"),
                                 ("dpga", {"keywords_kept": 30}, "keywords_kept=30 exceeds")):
        with pytest.raises(DpsynthError, match=needle):
            parse_config({**other, "method": section, section: bad})
    from dpsynth.data.public import task_for
    from dpsynth.methods.registry import method_class

    cfg = parse_config({**other, "method": "zero-shot", "zero-shot": {"n": 1}})
    with pytest.raises(DpsynthError, match="zero-shot.n=1 is smaller than the number of labels"):
        method_class("zero-shot")(cfg).check_task(task_for(cfg))
    cfg = parse_config({**base, "wasp": {"n": 12, "iterations": 2, "q": 8, "s": 2}})
    method_class("wasp")(cfg).check_task(task_for(cfg))
    assert "wasp.q=8 exceeds the samples each label gets per iteration (about 3" in capsys.readouterr().err
    cfg = parse_config({**other, "method": "augpe", "augpe": {"threshold": 50}})
    assert method_class("augpe")(cfg).min_private_records()[0] == 51


@pytest.mark.parametrize("bad", ["label", "size"])
def test_a_simulated_federations_party_files_are_checked_before_the_run_directory(tmp_path: Path, bad: str) -> None:
    """A party file with a label the task does not describe, or a party past max_records_per_party, failed only
    inside the simulation, after config.yaml was written (review helper-56); now before anything is made."""
    files = []
    for i in range(2):
        rows = "text,label\n" + "".join(f"m{i} {j},{'spam' if j % 2 else 'ham'}\n" for j in range(12))
        if bad == "label" and i == 1:
            rows += "m1 odd,promo\n"
        files.append(str(_csv(tmp_path, rows, name=f"party{i}.csv")))
    cfg = {**_config(tmp_path, "text,label\nx,spam\n"),
           "federated": {"parties": 2, "partition": "files", "party_files": files, "max_records_per_party": 12}}
    del cfg["data"]["private"]
    if bad == "size":
        cfg["federated"]["max_records_per_party"] = 11
    proc = _cli("run", str(_write_config(tmp_path, cfg)), "-o", str(tmp_path / "r"), cwd=tmp_path)
    _one_line_error(proc, "labels 'promo' are not described" if bad == "label" else
                    "a party holds more than federated.max_records_per_party=11 records")
    assert not (tmp_path / "r").exists()


def test_an_embedder_that_cannot_load_fails_before_the_run_directory(tmp_path: Path) -> None:
    """Issue 33: `embedder: nope/not-a-model` failed after 82 s with a hub traceback and a half-made run
    directory; now one line (offline: the Hub cannot be reached; online: no such model), nothing made."""
    rows = "text,label\n" + "".join(f"m {i},{'spam' if i % 2 else 'ham'}\n" for i in range(20))
    cfg = {**_config(tmp_path, rows), "embedder": "nope/not-a-model"}
    proc = _cli("run", str(_write_config(tmp_path, cfg)), "-o", str(tmp_path / "r"), cwd=tmp_path)
    _one_line_error(proc, "embedder 'nope/not-a-model'")
    assert not (tmp_path / "r").exists()


def test_a_transformers_model_that_cannot_load_fails_before_the_run_directory(tmp_path: Path) -> None:
    """It passed --dry-run, then the run made its directory and spent about 50 s on the Hub's retries before
    failing at model load; now one line in --dry-run and before the run directory (offline or no such model)."""
    rows = "text,label\n" + "".join(f"m {i},{'spam' if i % 2 else 'ham'}\n" for i in range(20))
    cfg = {**_config(tmp_path, rows), "generators": [{"kind": "transformers", "model": "nope/not-a-model"}]}
    path = _write_config(tmp_path, cfg)
    _one_line_error(_cli("run", str(path), "--dry-run", cwd=tmp_path), "transformers model 'nope/not-a-model'")
    _one_line_error(_cli("run", str(path), "-o", str(tmp_path / "r"), cwd=tmp_path), "transformers model")
    assert not (tmp_path / "r").exists()


def test_a_context_too_small_for_the_prompts_fails_before_any_release(tmp_path: Path) -> None:
    """Issue 33: `n_ctx: 32` crashed with a broadcast error after iteration 0's release was charged; now the
    config is refused when parsed."""
    base = _config(tmp_path, "text,label\na,spam\n")
    with pytest.raises(DpsynthError, match=r"generators\[0\].n_ctx=32 is below the about \d+ tokens"):
        parse_config({**base, "generators": [{"model": "smollm2-135m-instruct", "n_ctx": 32}]})
    parse_config({**base, "generators": [{"model": "smollm2-135m-instruct", "n_ctx": 1024}]})


def test_version_is_exposed(tmp_path: Path) -> None:
    """Issue 36: `dpsynth.__version__` and `dpsynth --version` agree with the installed package."""
    from importlib.metadata import version

    import dpsynth

    assert dpsynth.__version__ == version("dpsynth")
    proc = _cli("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == f"dpsynth {dpsynth.__version__}"


@pytest.mark.parametrize("change,needle", [
    ({"task": {"text_kind": "email", "labels": {}}}, "task.labels: Dictionary should have at least 1 item"),
    ({"seed": -1}, "seed: Input should be greater than or equal to 0"),
    ({"embedder": ""}, "embedder: String should have at least 1 character"),
    ({"task": {"text_kind": "email", "labels": {1: "spam"}}}, "task.labels.1.[key]: Input should be a valid string"),
    ({"method": "popri", "popri": {"j": 1}}, "popri.j: Input should be greater than or equal to 2"),
    ({"method": "popri", "federated": {"parties": 2}}, "popri has no federated mode"),
    ({"method": "popri", "popri": {"scoring": "vote"}}, "popri.scoring: Input should be 'votes', 'centroid' or"),
    # a negative or NaN price made every cost check pass, so max_cost never stopped the spending
    ({"generators": [{"kind": "openai", "model": "m", "base_url": "http://h/v1", "max_cost": 1.0,
                      "price_per_prompt_token": -1e-6}]},
     "price_per_prompt_token: Input should be greater than or equal to 0"),
    ({"generators": [{"kind": "openai", "model": "m", "base_url": "http://h/v1", "max_cost": 1.0,
                      "price_per_completion_token": float("nan")}]},
     "price_per_completion_token: Input should be a finite number"),
    ({"generators": [{"kind": "openai", "model": "m", "base_url": "127.0.0.1:8000/v1"}]},
     "base_url '127.0.0.1:8000/v1' needs its scheme: http://127.0.0.1:8000/v1"),
    # pydantic's own words named classes: "... or instance of RelabelConfig", "... for <class 'pathlib.Path'>"
    ({"relabel": 5}, "relabel: should be a mapping of its options (key: value lines under it)"),
    ({"data": {"private": 5}}, "data.private: should be a file or folder path (got 5)"),
    ({"method": "zero-shot", "zero-shot": 5}, "c.yaml: zero-shot: should be a mapping of its options"),
])
def test_more_config_errors_are_one_line(change: dict, needle: str, tmp_path: Path) -> None:
    """Issue 33's own further cases (docs/bad-input.md rows 23i-23o): each one line, before anything runs."""
    raw = {**_config(tmp_path, "text,label\na,spam\n"), **change}
    if raw.get("method", "wasp") != "wasp":
        raw.pop("wasp")  # a section for another method is refused on its own (its test above)
    with pytest.raises(DpsynthError, match=re.escape(needle)):
        parse_config(raw, "c.yaml")


PERSON_ROWS = "text,label,patient\n" + "".join(f"msg {i},{'spam' if i % 2 else 'ham'},p{i % 3}\n" for i in range(8))


def _set(path: str, value: object):
    """A change to a config dict: `value` at the dotted `path` (None removes the key)."""
    def change(raw: dict) -> None:
        *parents, last = path.split(".")
        node = raw
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return change


@pytest.mark.parametrize("changes,needle", [
    ([_set("data.person_column", "who")], "person column 'who' not found; columns are: text, label, patient"),
    ([_set("data.person_column", None)], "privacy.max_records_per_user=2 needs data.person_column"),
    ([_set("privacy.max_records_per_user", 0)], "privacy.max_records_per_user: Input should be greater than 0"),
    ([_set("data.private", None), _set("data.corpus", "trec"), _set("data.m", 50)], "a public corpus has none"),
    ([_set("data.person_column", "")], "data.person_column: String should have at least 1 character"),
    ([_set("data.test", "none.csv")], "none.csv: file not found"),
    ([_set("generators.0.max_cost", 0)], "max_cost: Input should be greater than 0"),
    ([_set("generators.0.max_cost", 1.0)], "max_cost needs the generator's prices"),
    ([_set("generators.0.requests_per_minute", -5)], "requests_per_minute: Input should be greater than 0"),
    ([_set("data.private", "nodata")], "nodata: a directory, but not one written by datasets' save_to_disk"),
    ([_set("data.private", None), _set("data.hub", "someone/x")], "Hub dataset someone/x (split train) could not"),
    ([_set("data.private", None), _set("data.in_memory", True)], "were given in Python; give them again"),
    # found before the run directory (they once were found after it, which then blocked the corrected config)
    ([_set("generators.0.model", "nope.gguf")], "model 'nope.gguf' is neither a known local model"),
    ([_set("generators.0.kind", "openai"), _set("generators.0.model", "gpt-x"),
      _set("generators.0.api_key_env", "DPSYNTH_TEST_UNSET_KEY")], "DPSYNTH_TEST_UNSET_KEY is not set"),
    ([_set("data.person_column", None), _set("privacy.max_records_per_user", None), _set("data.private", None),
      _set("data.corpus", "imdb"), _set("data.m", 50)], "unknown corpus 'imdb'"),
    ([_set("data.test", "foreign.csv")], "data.test: labels ['neg', 'pos'] are not among the task's labels"),
])
def test_issue_36_inputs_are_one_line_errors_before_the_run_directory(changes: list, needle: str,
                                                                       tmp_path: Path) -> None:
    """Issue 33's further cases for the person column, data sources and spend caps (docs/bad-input.md rows
    31b-31n, 62a-62c), through the real CLI: exit 2, one line, no traceback, no run directory."""
    (tmp_path / "nodata").mkdir()
    (tmp_path / "foreign.csv").write_text("text,label\ngreat film,pos\nbad film,neg\n")
    raw = _config(tmp_path, PERSON_ROWS)
    raw["data"]["person_column"] = "patient"
    raw["privacy"]["max_records_per_user"] = 2
    for change in changes:
        change(raw)
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-m", "dpsynth", "run", str(_write_config(tmp_path, raw)), "-o",
                           str(tmp_path / "run")], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, **offline})
    _one_line_error(proc, needle)
    assert not (tmp_path / "run").exists(), "nothing left behind"


def test_resuming_a_config_file_says_it_is_a_file_and_how_to_start_it(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text("method: wasp\n")
    _one_line_error(_cli("run", "--resume", "run.yaml", cwd=tmp_path),
                    "run.yaml is a file, not a run directory (to start a new run from this config: `dpsynth run "
                    "run.yaml`)")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("method: wasp\n")  # a new run from it would pay again
    _one_line_error(_cli("run", "--resume", "run/config.yaml", cwd=tmp_path),
                    "(to resume the run holding it: `dpsynth run --resume run`)")
    (tmp_path / "p.csv").write_text("text,label\n")
    proc = _cli("run", "--resume", "p.csv", cwd=tmp_path)
    _one_line_error(proc, "p.csv is a file, not a run directory")
    assert "dpsynth run" not in proc.stderr


def test_dry_run_of_a_resume_is_refused(tmp_path: Path) -> None:
    _one_line_error(_cli("run", "--resume", "x", "--dry-run", cwd=tmp_path), "--dry-run plans a new run")


def test_a_config_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_bytes("method: w\xe4sp\n".encode("latin-1"))
    _one_line_error(_cli("run", "run.yaml", "--dry-run", cwd=tmp_path), "run.yaml: not UTF-8 text (byte 9)")
    _one_line_error(_cli("budget", "--config", "run.yaml", cwd=tmp_path), "not UTF-8 text")


def test_budget_refuses_a_nan_sigma_and_no_parties(tmp_path: Path) -> None:
    """A NaN sigma was printed as zero privacy loss."""
    _one_line_error(_cli("budget", "wasp", "--sigma", "nan", cwd=tmp_path), "--sigma must be > 0 (got nan)")
    _one_line_error(_cli("budget", "wasp", "--epsilon", "4", "--parties", "0", cwd=tmp_path),
                    "--parties must be at least 1 (got 0)")


def test_writing_onto_a_folder_names_the_folder() -> None:
    import tempfile

    from dpsynth.fs import atomic_write_text

    with tempfile.TemporaryDirectory() as folder, pytest.raises(DpsynthError, match="is a folder; give the path"):
        atomic_write_text(Path(folder), "x")


def test_a_key_written_twice_is_refused_not_silently_replaced(tmp_path: Path) -> None:
    """YAML keeps the last of two equal keys: a second `privacy:` section replaced the first without a word."""
    (tmp_path / "run.yaml").write_text("privacy:\n  epsilon: 4\nprivacy:\n  epsilon: 8\n")
    _one_line_error(_cli("run", "run.yaml", "--dry-run", cwd=tmp_path),
                    "run.yaml: not valid YAML ('privacy' is written twice in one mapping (line 3))")


@pytest.mark.parametrize("args, needle", [
    (("run", "--nope"), "No such option '--nope'. (see `python -m dpsynth run --help`)"),
    (("frobnicate",), "No such command 'frobnicate'. (see `python -m dpsynth --help`)"),
    (("budget", "wasp", "--epsilon", "abc"), "'abc' is not a valid float"),
    (("budget", "wasp", "--epsilon"), "Option '--epsilon' requires an argument"),
])
def test_click_usage_errors_are_one_line(args: tuple, needle: str, tmp_path: Path) -> None:
    """Click's own usage errors were a usage line, a hint and a five-line framed box; now one `error:` line that
    says where the help is, exit 2 (docs/bad-input.md row 40)."""
    proc = _cli(*args, cwd=tmp_path)
    _one_line_error(proc, needle)
    assert proc.stderr.strip().count("\n") == 0 and "╭" not in proc.stderr


def test_help_and_version_still_exit_zero(tmp_path: Path) -> None:
    for args in (("--help",), ("run", "--help"), ("--version",)):
        proc = _cli(*args, cwd=tmp_path)
        assert proc.returncode == 0 and proc.stdout and not proc.stderr, (args, proc.stderr)
    assert _cli(cwd=tmp_path).returncode == 2, "no arguments shows the help, exit 2 as click does"


def test_eval_reads_the_runs_own_test_set_and_columns(tmp_path: Path, monkeypatch) -> None:
    """README's `dpsynth eval runs/tickets --test tickets_test.csv` failed on a run whose columns are not
    text/label (`body`, `queue`): eval now takes the run's data.text_column and data.label_column, and its
    data.test when --test is left out; a run without a test set asks for --test in one line."""
    import dpsynth.evaluate.run_eval as run_eval
    from typer.testing import CliRunner

    from dpsynth.cli import _typer_app

    run = tmp_path / "run"
    run.mkdir()
    test = _csv(tmp_path, "body,queue\nmy card is lost,cards\nmortgage rate,loans\n", "t.csv")
    (run / "config.yaml").write_text(yaml.safe_dump({"embedder": "all-MiniLM-L6-v2", "seed": 0, "data": {
        "test": str(test), "text_column": "body", "label_column": "queue"}}))
    (run / "synthetic.jsonl").write_text('{"text": "lost card", "label": "cards", "iteration": 0}\n'
                                         '{"text": "loan", "label": "loans", "iteration": 0}\n')
    seen = []
    monkeypatch.setattr(run_eval, "evaluate_run", lambda run_dir, test_set, **kw: seen.append(test_set) or {})
    monkeypatch.setattr(run_eval, "summary_rows", lambda result: [])
    for args in ([], ["--test", str(test)]):
        result = CliRunner().invoke(_typer_app, ["eval", str(run), *args])
        assert result.exit_code == 0, result.output
    assert [(s.texts, s.labels) for s in seen] == [(["my card is lost", "mortgage rate"], ["cards", "loans"])] * 2
    (run / "config.yaml").write_text("embedder: all-MiniLM-L6-v2\nseed: 0\ndata: {corpus: null}\n")
    result = CliRunner().invoke(_typer_app, ["eval", str(run)])
    assert isinstance(result.exception, DpsynthError) and "give one with --test FILE" in str(result.exception)


def test_a_users_own_test_file_is_said_to_be_outside_the_guarantee(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """Evaluation reads data.test without noise: a run given its own test file says on the terminal that the
    scores are outside the DP guarantee (docs/privacy.md); a corpus' public test split says nothing."""
    import fakes  # noqa: F401  (registers the fake backend)
    from test_engine import _config as engine_config

    from dpsynth.data.public import say_test_scores_are_unnoised
    from dpsynth.runs.build import check_before_start
    from dpsynth.runs.planning import plan_privacy

    raw = engine_config(tmp_path, "augpe")
    (tmp_path / "test.csv").write_text("text,label\ngood film,pos\nbad film,neg\n")
    raw["data"]["test"], raw["evaluate"] = str(tmp_path / "test.csv"), True
    check_before_start(plan_privacy(parse_config(raw)))
    assert "test.csv: the test set is read without noise, so its scores" in capsys.readouterr().err
    say_test_scores_are_unnoised("corpus:trec")
    assert capsys.readouterr().err == ""


def test_a_missing_optional_package_is_one_line_naming_its_extra_before_the_run(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting whose optional package is missing stops before the run starts (not with a traceback after its
    generations were paid for), naming the extra that installs it; the names each method declares are real
    modules (all installed here)."""
    import importlib.util

    import fakes  # noqa: F401  (registers the fake backend)
    from test_engine import _config as engine_config

    from dpsynth.errors import require
    from dpsynth.methods.registry import method_class, method_names
    from dpsynth.runs.build import check_before_start
    from dpsynth.runs.planning import plan_privacy

    with pytest.raises(DpsynthError, match=r"^method dpft needs the package 'no_such_module': pip install "
                                           r"'dpsynth\[finetune\]'$"):
        require("no_such_module", "finetune", "method dpft")
    for name in method_names():
        for module, _ in method_class(name).needs_packages:
            assert importlib.util.find_spec(module) is not None, (name, module)
    raw = engine_config(tmp_path, "augpe")
    raw["resample"] = {"clusters": 2}
    real_find_spec = importlib.util.find_spec

    def without(missing: str):
        return lambda name, *a: None if name == missing else real_find_spec(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", without("faiss"))
    with pytest.raises(DpsynthError, match=r"resample: \(its k-means\) needs the package 'faiss': pip install "
                                           r"'dpsynth\[local\]'"):
        check_before_start(plan_privacy(parse_config(raw)))
    # without opacus: DP fine-tuning is refused, and so is a simulated fedgen federation (its parties train
    # here), not a deployed fedgen server (its parties train on their own machines)
    from dpsynth.runs.build import check_packages
    from dpsynth.runs.planning import plan_for_method

    monkeypatch.setattr(importlib.util, "find_spec", without("opacus"))
    with pytest.raises(DpsynthError, match=r"method dpft needs the package 'opacus'"):
        check_packages(plan_for_method("dpft", epsilon=4))
    simulated = plan_for_method("fedgen", epsilon=4, parties=10)
    with pytest.raises(DpsynthError, match=r"method fedgen \(its simulated parties' DP-Adam\) needs the package"):
        check_packages(simulated)
    assert simulated.config.federated is not None
    deployed = simulated.config.model_copy(
        update={"federated": simulated.config.federated.model_copy(update={"partition": "nodes"})})
    # the server samples only; each training party checks its own opacus before its ledger is charged
    check_packages(type(simulated)(deployed, simulated.method, simulated.schedule))
