"""The `device:` setting: resolved once (auto / cpu / cuda), a clear error for a GPU that is not there, and the
votes' torch path (what runs on a GPU) equal to the numpy path, checked here with torch on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

import dpsynth.device as device_module
from dpsynth.device import resolve_device
from dpsynth.errors import DpsynthError
from dpsynth.voting.rank_votes import rank_votes, wasp_votes
from dpsynth.voting.spec import VoteSpec, compute_votes


def test_settings_resolve(monkeypatch) -> None:
    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(device_module, "cuda_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(DpsynthError, match="device: cuda, but torch sees no CUDA GPU"):
        resolve_device("cuda")
    monkeypatch.setattr(device_module, "cuda_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda") == "cuda"


def test_a_run_asking_for_a_missing_gpu_stops_before_anything(monkeypatch) -> None:
    from dpsynth.runs.build import check_before_start
    from dpsynth.runs.config import parse_config
    from dpsynth.runs.planning import plan_privacy

    monkeypatch.setattr(device_module, "cuda_available", lambda: False)
    config = parse_config({"method": "zero-shot", "data": {"corpus": "trec", "m": 100}, "device": "cuda",
                           "generators": [{"kind": "fake", "model": "a"}], "zero-shot": {"n": 12}})
    with pytest.raises(DpsynthError, match="no CUDA GPU"):
        check_before_start(plan_privacy(config))


def _embeddings(rng: np.random.Generator, n: int, labels: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, 16)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True), rng.integers(0, labels, n)


@pytest.mark.parametrize("block_bytes", [64 * 2**20, 256])  # one block, and many small ones
def test_torch_votes_equal_numpy_votes(block_bytes: int) -> None:
    rng = np.random.default_rng(0)
    private, p_labels = _embeddings(rng, 300, 3)
    synthetic, s_labels = _embeddings(rng, 90, 3)
    for q in (1, 4):
        numpy_votes = wasp_votes(private, p_labels, synthetic, s_labels, q, block_bytes=block_bytes)
        torch_votes = wasp_votes(private, p_labels, synthetic, s_labels, q, block_bytes=block_bytes, device="cpu")
        assert np.allclose(numpy_votes, torch_votes)
    (near,) = rank_votes(private, p_labels, synthetic, s_labels, [1.0, 1.0], device="cpu")
    (near_np,) = rank_votes(private, p_labels, synthetic, s_labels, [1.0, 1.0])
    assert np.allclose(near, near_np) and near.sum() == pytest.approx(2 * 300)
    spec = VoteSpec(kind="rank", weights=(1.0,))
    assert np.allclose(compute_votes(spec, private, p_labels, synthetic, s_labels, device="cpu"),
                       compute_votes(spec, private, p_labels, synthetic, s_labels))
