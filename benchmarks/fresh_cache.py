"""A dpsynth cache directory with an empty request cache, for benchmarks that must pay for every generation.

Why: with the machine's request cache a benchmark's generations would come back for free and its timings would mean
nothing; a wholly new cache would fetch the models and corpora again. This links every one-time asset of the
current cache (models, corpora, test-set embeddings) into a new directory and leaves out only the request cache.
Point DPSYNTH_CACHE at the result.
"""

from __future__ import annotations

import os
from pathlib import Path

REQUEST_CACHE = "requests.sqlite"  # with its -wal and -shm files


def fresh_request_cache(root: Path) -> Path:
    """Create `root` as a cache directory sharing the current one's assets, with no request cache; returns it."""
    from dpsynth.fs import cache_dir

    shared = cache_dir()
    root.mkdir(parents=True)
    if shared.exists():
        for entry in shared.iterdir():
            if not entry.name.startswith(REQUEST_CACHE):
                os.symlink(entry, root / entry.name)
    return root
