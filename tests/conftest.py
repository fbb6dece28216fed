"""Test set-up: the fake generator backend is registered for every test (tests/fakes.py)."""

import fakes  # noqa: F401  (registers the "fake" backend)
