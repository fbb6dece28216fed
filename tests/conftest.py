"""Test set-up: the suite runs in parallel processes (pytest-xdist, `-n auto` in pyproject.toml), as many as the
cores allow up to four; the fake generator backend is registered for every test (tests/fakes.py); Ctrl-C for the
tests that press it."""

import os
import signal
from collections.abc import Iterator

import pytest


def _available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return max(1, os.cpu_count() or 1)


# Each worker's torch gets its share of the cores (set before anything imports torch), so two workers on two cores
# do not run four threads; a value the user set stays. llama.cpp picks its own threads from the cores it may use.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault(
        "OMP_NUM_THREADS", str(max(1, _available_cores() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import fakes  # noqa: E402,F401  (registers the "fake" backend)


# The files that take minutes, longest first (their tests' summed times, `--durations=0`, 2026-12-02): they start
# first, so that no worker begins one near the end while the others sit idle (pyproject.toml's
# `--no-loadscope-reorder` keeps this order; the other files follow, as collected).
LONGEST_FIRST = ("test_bad_input.py", "test_e2e_wasp.py", "test_fedgen.py", "test_openai_backend.py",
                 "test_crash_safety.py", "test_bench_e2e.py", "test_federated.py", "test_cli_budget.py",
                 "test_e2e_federated.py", "test_architecture.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order stays


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: one worker a core, at most four: a worker holds up to two local models, torch and a llama.cpp
    server (about 2 GB), and the suite's longest file (about 3 minutes) bounds its time from four workers on.
    PYTEST_XDIST_AUTO_NUM_WORKERS, where set, decides (None: xdist's own rule)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return min(_available_cores(), 4)


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Python's own SIGINT handler for the test. Python raises KeyboardInterrupt on SIGINT only where SIGINT was not
    ignored when it started, and a shell starts the jobs it sends to the background (`pytest &`, nohup, CI runners)
    with it ignored: a test that presses Ctrl-C must not depend on how pytest was started."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
