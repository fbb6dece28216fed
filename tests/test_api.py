"""The Python API and the data ways in and out (issue 36): a `datasets` directory, a DataFrame or a Dataset in;
synthetic.parquet, the dataset card and `dpsynth export` out; one-line errors for bad sources."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import dpsynth
from dpsynth.errors import DpsynthError

ROWS = [(f"private message number {i} about {'a prize' if i % 3 == 0 else 'dinner'}", "spam" if i % 3 == 0 else "ham",
         f"person{i % 9}") for i in range(36)]


def _config(**data) -> dict:
    return {"method": "augpe", "data": data,
            "task": {"text_kind": "SMS message", "labels": {"ham": "an ordinary message", "spam": "spam"}},
            "generators": [{"kind": "fake", "model": "a"}],
            "augpe": {"n": 12, "iterations": 2},
            "privacy": {"epsilon": 2.0, "delta": 1e-3, "noise_seed": 3}, "evaluate": False}


@pytest.fixture
def frame() -> pd.DataFrame:
    return pd.DataFrame(ROWS, columns=["text", "label", "person"])


def test_from_a_datasets_directory_to_parquet_and_a_card_in_three_lines(tmp_path: Path, frame: pd.DataFrame,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's three lines: synthesize from a save_to_disk directory; the run directory then holds
    synthetic.parquet and a README.md card that `datasets` loads, with the privacy statement."""
    import datasets

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    datasets.Dataset.from_pandas(frame).save_to_disk(str(tmp_path / "my_dataset"))
    config = tmp_path / "config.yaml"
    import yaml

    config.write_text(yaml.safe_dump(_config(private="placeholder.csv")))

    result = dpsynth.synthesize(config, private=tmp_path / "my_dataset", out=tmp_path / "run")
    result.to_pandas().to_parquet(tmp_path / "synthetic.parquet")

    assert len(result.samples) == 12 and 0 < result.epsilon <= 2.0 + 1e-6 and result.unit_of_privacy == "record"
    assert pd.read_parquet(tmp_path / "synthetic.parquet").columns.tolist() == ["text", "label", "plm", "iteration"]
    run = tmp_path / "run"
    assert pd.read_parquet(run / "synthetic.parquet").equals(result.to_pandas())
    loaded = datasets.load_dataset(str(run), split="train")
    assert loaded.num_rows == 12 and set(loaded.column_names) == {"text", "label", "plm", "iteration"}
    card = (run / "README.md").read_text()
    assert "-differential privacy with respect to the private data set, for any one record" in card
    assert "epsilon:" in card.split("---")[1] and "augpe.votes" in card
    assert not any(text in card for text, _, _ in ROWS), "no private record in the card"


def test_a_dataframe_with_persons_is_held_in_memory_and_must_be_given_again(tmp_path: Path, frame: pd.DataFrame,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    raw = _config(person_column="person")
    raw["privacy"]["max_records_per_user"] = 2
    result = dpsynth.synthesize(raw, private=frame, out=tmp_path / "run")
    assert result.unit_of_privacy == "person (<= 2 records)"
    assert "any one person (all of their records: person (<= 2 records))" in (tmp_path / "run/README.md").read_text()
    written = "".join(p.read_text(errors="ignore") for p in (tmp_path / "run").rglob("*") if p.is_file())
    assert not any(text in written for text, _, _ in ROWS), "records given in Python are never written"
    assert "in_memory: true" in (tmp_path / "run/config.yaml").read_text()

    import datasets

    again = dpsynth.synthesize(raw, private=datasets.Dataset.from_pandas(frame), out=tmp_path / "run2")
    assert again.epsilon == pytest.approx(result.epsilon)


@pytest.mark.parametrize("private,message", [
    ("missing-dir", "missing-dir: file not found"),
    ("empty-dir", "not one written by datasets' save_to_disk"),
    (42, "a int; give a pandas DataFrame, a datasets.Dataset or a DatasetDict"),
    ("dict-dir", "no split 'train'; splits are: test"),
])
def test_bad_sources_are_one_line_errors_before_the_run_directory(private, message: str, tmp_path: Path,
                                                                  frame: pd.DataFrame) -> None:
    import datasets

    (tmp_path / "empty-dir").mkdir()
    datasets.DatasetDict({"test": datasets.Dataset.from_pandas(frame)}).save_to_disk(str(tmp_path / "dict-dir"))
    source = tmp_path / private if isinstance(private, str) else private
    with pytest.raises(DpsynthError, match=message):
        dpsynth.synthesize(_config(), private=source, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_resuming_an_in_memory_run_without_its_records_is_a_one_line_error(tmp_path: Path,
                                                                         frame: pd.DataFrame) -> None:
    from dpsynth.runs.engine import Run

    config = dpsynth.api.as_config(_config(), frame)
    Run.create(config, tmp_path / "run", private=frame).close()
    with pytest.raises(DpsynthError, match="were given in Python; give them again"):
        Run.resume(tmp_path / "run").execute()


def test_a_hub_id_offline_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(DpsynthError, match=r"Hub dataset someone/sms \(split train\) could not be loaded"):
        dpsynth.synthesize(_config(hub="someone/sms"), out=tmp_path / "run")


def test_export_writes_parquet_csv_and_a_datasets_directory(tmp_path: Path, frame: pd.DataFrame,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    result = dpsynth.synthesize(_config(), private=frame, out=tmp_path / "run")
    for fmt in ("parquet", "csv", "hf"):
        done = subprocess.run([sys.executable, "-m", "dpsynth", "export", str(tmp_path / "run"), "--format", fmt],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert pd.read_parquet(tmp_path / "run-synthetic.parquet").equals(result.to_pandas())
    assert len(pd.read_csv(tmp_path / "run-synthetic.csv")) == len(result.samples)
    hf = datasets.load_from_disk(str(tmp_path / "run-hf"))
    assert hf.num_rows == len(result.samples) and (tmp_path / "run-hf" / "README.md").exists()
    done = subprocess.run([sys.executable, "-m", "dpsynth", "export", str(tmp_path / "nowhere")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("error: ")


def test_a_weighted_run_loads_and_exports_with_its_weights(tmp_path: Path, frame: pd.DataFrame,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`resample: {weights: true}` writes a `weight` per sample: `synthesize` (through `load_run`) raised at its
    last line, after the paid work, and `dpsynth export` failed (review helper-57); now the weights travel."""
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    config = {**_config(), "method": "zero-shot", "zero-shot": {"n": 12}, "resample": {"clusters": 2, "weights": True}}
    del config["augpe"]
    result = dpsynth.synthesize(config, private=frame, out=tmp_path / "run")
    weights = [s.weight for s in result.samples]
    assert len(weights) == 12 and all(w is not None and w >= 0 for w in weights)
    assert result.to_pandas()["weight"].tolist() == weights
    assert pd.read_parquet(tmp_path / "run" / "synthetic.parquet").equals(result.to_pandas())
    done = subprocess.run([sys.executable, "-m", "dpsynth", "export", str(tmp_path / "run"), "--format", "csv"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert pd.read_csv(tmp_path / "run-synthetic.csv")["weight"].tolist() == pytest.approx(weights)
    assert "the DP cluster histogram" in (tmp_path / "run" / "README.md").read_text()


def test_the_public_names() -> None:
    assert {"synthesize", "load_run", "SynthesisResult", "DpsynthError"} <= set(dpsynth.__all__)
    assert dpsynth.DpsynthError is DpsynthError
    with pytest.raises(AttributeError):
        dpsynth.nothing_here  # noqa: B018
    assert json.loads(json.dumps(dpsynth.__version__))


def test_resume_takes_no_path_and_a_file_run_takes_no_records(tmp_path: Path, frame: pd.DataFrame,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DpsynthError, match="continues with the run's own data source"):
        dpsynth.synthesize(_config(), private="p.csv", out=tmp_path / "run", resume=True)
    frame.to_csv(tmp_path / "p.csv", index=False)
    from dpsynth.runs.engine import Run

    Run.create(dpsynth.api.as_config(_config(), tmp_path / "p.csv"), tmp_path / "run").close()
    with pytest.raises(DpsynthError, match="records were given in Python, but this run reads its data"):
        Run.resume(tmp_path / "run", private=frame).execute()
    with pytest.raises(DpsynthError, match="not a finished dpsynth run"):
        dpsynth.load_run(tmp_path / "run")
