"""Can a Hugging Face model load here? Checked before a run makes its directory or spends anything.

A model id that is neither a local folder nor in the Hugging Face cache made a run fail only at model load, after
its directory was made and the Hub's retries had taken about 50 s (a transformers generator, offline) or 82 s (an
embedder). One quick question to the Hub (10 s at most) says whether the model exists or the Hub is out of reach.
"""

from __future__ import annotations

from pathlib import Path

from dpsynth.errors import DpsynthError


def check_hub_model(model: str, what: str, hint: str) -> None:
    """One line when `model` (a folder or Hub id, named `what` in messages) cannot load: a file given for a
    folder, not in the local cache and no such model on the Hub, or not cached and the Hub out of reach. `hint`:
    what to do instead."""
    if Path(model).expanduser().is_dir():
        return
    if Path(model).expanduser().exists():
        raise DpsynthError(f"{what} '{model}' is a file, not a model folder or a Hub id; {hint}")
    try:
        from huggingface_hub import model_info, snapshot_download
        from huggingface_hub.errors import RepositoryNotFoundError
    except ImportError as err:
        raise DpsynthError(f"{what} '{model}' needs huggingface_hub: pip install 'dpsynth[local]'") from err
    try:
        snapshot_download(model, local_files_only=True)
        return
    except Exception:  # noqa: BLE001 - anything here means "not in the local cache": ask the Hub next
        pass
    try:
        model_info(model, timeout=10)
    except RepositoryNotFoundError:
        raise DpsynthError(f"{what} '{model}' is not a local folder and the Hugging Face Hub has no such model; "
                           f"check the name, or {hint}") from None
    except Exception as err:  # noqa: BLE001 - no network, a proxy, an HTTP error: the Hub cannot be reached
        reason = (str(err).splitlines() or [type(err).__name__])[0][:120]
        raise DpsynthError(f"{what} '{model}' is neither a local folder nor in the Hugging Face cache, and the Hub "
                           f"cannot be reached ({reason}); {hint}") from None
