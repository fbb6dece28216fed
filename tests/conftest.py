"""Test set-up: the fake generator backend is registered for every test (tests/fakes.py); Ctrl-C for the tests
that press it."""

import signal
from collections.abc import Iterator

import fakes  # noqa: F401  (registers the "fake" backend)
import pytest


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
