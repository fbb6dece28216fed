"""A lazily loaded embedder's load is model loading, not embedding or voting time: the scale benchmark and the
run report divide embedding time by texts, which a one-off load (seconds; a GPU's start) would distort."""

from __future__ import annotations

import numpy as np

from dpsynth.embed.sentence import LazyEmbedder
from dpsynth.methods import base
from dpsynth.methods.base import StepContext
from dpsynth.methods.generation import SyntheticSample


def test_the_lazy_embedder_reports_its_one_load() -> None:
    loads: list[float] = []
    embedder = LazyEmbedder(on_load=loads.append)
    assert loads == []  # nothing loads before the first use
    first = embedder.encode(["a first text"])
    embedder.encode(["a second text"])
    assert len(loads) == 1 and loads[0] > 0 and first.shape == (1, 384)


def test_every_timed_step_leaves_out_a_load_that_began_during_it(monkeypatch) -> None:
    timings: dict[str, float] = {"load_models": 1.0}
    loads: list[tuple[float, float]] = []
    clock = [100.0]
    monkeypatch.setattr(base.time, "perf_counter", lambda: clock[0])

    def embed(texts: list[str]) -> np.ndarray:
        if not loads:  # the first use loads the model, reported as the engine's on_load does
            loads.append((clock[0], 2.0))
            timings["load_models"] += 2.0
            clock[0] += 2.0
        clock[0] += 0.5  # the embedding itself
        return np.zeros((len(texts), 4))

    ctx = StepContext(config=None, task=None, label_shares={}, generators={}, holder=None,  # type: ignore[arg-type]
                      embed=embed, timings=timings, loads=loads)
    t0 = clock[0]
    ctx.embed_synthetic([SyntheticSample(0, "a text", "a", "plm", 0)])  # loads, inside an evaluation window
    ctx.embed_synthetic([SyntheticSample(1, "another", "a", "plm", 0)])
    clock[0] += 1.0
    ctx.add_time("evaluation", t0)
    assert timings["embedding"] == 1.0 and timings["load_models"] == 3.0
    assert timings["evaluation"] == 2.0  # 0.5 + 0.5 + 1.0: the load is in neither


def test_one_encoder_is_loaded_per_model_and_device_for_the_process() -> None:
    """A run's embedder, its evaluation and a bench's next cell share the loaded encoder (it was loaded two to
    four times a cell); its embeddings are the ones a fresh load gives."""
    from dpsynth.embed.sentence import SentenceTransformerEmbedder, _loaded_encoder

    first, second = SentenceTransformerEmbedder(), SentenceTransformerEmbedder()
    assert first._model is second._model
    texts = ["a text to embed", "another, longer text to embed twice"]
    shared = first.encode(texts)
    _loaded_encoder.cache_clear()
    fresh = SentenceTransformerEmbedder()
    assert fresh._model is not first._model
    np.testing.assert_array_equal(fresh.encode(texts), shared)
