"""`dpsynth budget` prints the numbers the issue and PRIVACY.md give."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _budget(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "dpsynth", "budget", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_wasp_sigma_for_target() -> None:
    out = _budget("wasp", "--epsilon", "4", "--delta", "1e-5", "--iterations", "5", "--q", "8")
    assert "4 noisy releases" in out
    assert "sigma per noisy release: 3.531" in out
    assert "paper's sigma: 9.690" in out and "true epsilon at the paper's sigma: 1.287" in out


def test_wasp_epsilon_of_paper_sigma() -> None:
    out = _budget("wasp", "--sigma", "9.69", "--delta", "1e-5", "--iterations", "5", "--q", "8")
    assert "epsilon spent: 1.287" in out


def test_augpe() -> None:
    out = _budget("augpe", "--epsilon", "1", "--delta", "1e-5", "--iterations", "11")
    assert "10 noisy releases" in out and "sigma per noisy release: 11.797" in out


@pytest.mark.parametrize("parties,expected", [("5", "3.16"), ("10", "4.71")])
def test_federated_single_party_view(parties: str, expected: str) -> None:
    out = _budget("wasp", "--sigma", "9.69", "--iterations", "5", "--parties", parties)
    assert f"gets epsilon {expected}" in out


def test_user_level() -> None:
    out = _budget("wasp", "--epsilon", "4", "--iterations", "5", "--max-records-per-user", "8")
    assert "13.06385" in out and "user with <= 8 records" in out
