"""Every config under configs/ (and the packaged demo) still validates: docs/results.md cites them as commands."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import pytest
import yaml

from dpsynth.bench.grid import cells, load_bench
from dpsynth.runs.config import load_config, parse_config

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


def test_the_configs_folder_is_found() -> None:
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_config_validates(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    if "variants" in raw:  # a bench grid: the grid and every cell's run config
        for cell in cells(load_bench(path)):
            parse_config(cell["config"], f"{path.name}:{cell['name']}")
    else:
        load_config(path)


@pytest.mark.parametrize("name", ["demo.yaml", "demo_wasp.yaml"])
def test_packaged_demo_configs_validate(name: str) -> None:
    parse_config(yaml.safe_load(files("dpsynth.configs").joinpath(name).read_text()), name)


DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("page", ["choosing.md"])
def test_bench_configs_in_the_docs_validate(page: str, tmp_path: Path) -> None:
    """A bench config a doc tells users to copy is a bench grid whose every cell is a valid run config."""
    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / page).read_text(), re.S)
    benches = [b for b in blocks if "variants:" in b]
    assert benches, f"docs/{page} shows no bench config"
    for i, block in enumerate(benches):
        path = tmp_path / f"{i}.yaml"
        path.write_text(block)
        for cell in cells(load_bench(path)):
            parse_config(cell["config"], f"docs/{page}:{cell['name']}")
