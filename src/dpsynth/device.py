"""Where torch work runs: one `device:` setting (auto | cpu | cuda) for the embedder, the data holder's votes and
DP-SGD, transformers sampling and POPri's DPO (benchmarks/device_check.py compares each with its CPU run).

`auto` takes a CUDA GPU when torch sees one and the CPU otherwise; `cuda` without a visible GPU is a one-line
error before anything runs. torch is imported only when a GPU could be asked for, so `cpu` never loads it.
"""

from __future__ import annotations

from typing import Literal

from dpsynth.errors import DpsynthError

DeviceSetting = Literal["auto", "cpu", "cuda"]


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def resolve_device(setting: str = "auto") -> str:
    """'cpu' or 'cuda' for a setting."""
    if setting == "cpu":
        return "cpu"
    if setting not in ("auto", "cuda"):
        raise DpsynthError(f"device: '{setting}' is not one of auto, cpu, cuda")
    if cuda_available():
        return "cuda"
    if setting == "cuda":
        raise DpsynthError("device: cuda, but torch sees no CUDA GPU (torch.cuda.is_available() is False); install "
                           "a CUDA build of torch on a GPU machine, or set device: auto or cpu")
    return "cpu"
