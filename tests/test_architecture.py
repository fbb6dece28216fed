"""Dependencies point one way (the import contract in pyproject.toml): a cycle or upward import fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contract_holds() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    done = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_ruff_is_clean_on_src() -> None:
    """The linter configured in pyproject.toml ([tool.ruff]) passes on the package (issue 34), its set-up scripts
    and the benchmarks users run."""
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or "ruff"
    done = subprocess.run([exe, "check", "src", "scripts", "benchmarks"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_mypy_is_clean_on_src() -> None:
    """The type checker configured in pyproject.toml ([tool.mypy], with pydantic's plugin) passes on the package
    (issue 34)."""
    exe = shutil.which("mypy", path=str(Path(sys.executable).parent)) or "mypy"
    done = subprocess.run([exe, "src/dpsynth"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
