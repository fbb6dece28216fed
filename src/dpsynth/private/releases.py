"""Release-time checkpoints: every noisy release is saved, with its event, before anything uses it.

A release that was drawn and used (prompts built from it may already sit in the request
cache or at an API) must never be drawn again with fresh noise: that would spend twice.
So the holder writes `checkpoints/releases/<name>.json` (the ledger event and the noisy
values, atomically) right after drawing and before returning; on resume the ledger is
completed from these files and a repeated request returns the saved noisy values.
Only noisy values are stored: they are DP releases, as safe as the selections made from them.
An un-noised release (epsilon = inf reference runs) is recorded by name only and its values are
kept in memory for the rest of the process; a resumed process recomputes them (the run is not
private anyway; for a non-DP adapter that means training again), so clean values of private
records are never written.

Large releases (a DP-trained adapter: about a million numbers) keep their values in a `.npy` file
beside the JSON, written first, so the JSON (written last, atomically) marks the release as done.
A release that takes long to compute (DP training) keeps its partial state in `work_dir(name)`;
that state is itself DP (it is what the noisy steps so far produced) and is removed once the
release is saved.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
from pydantic import TypeAdapter

from dpsynth.errors import DpsynthError
from dpsynth.fs import atomic_write_bytes, atomic_write_text
from dpsynth.privacy.events import PrivacyEvent
from dpsynth.privacy.ledger import PrivacyLedger

_EVENT = TypeAdapter(PrivacyEvent)
LARGE = 4096  # values beyond this many go to a binary .npy file


def _stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", name)


def _file_name(name: str) -> str:
    return _stem(name) + ".json"


class ReleaseStore:
    """Noisy releases of one run, one file each (in memory only when `root` is None)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._saved: dict[str, tuple[PrivacyEvent | None, np.ndarray | None]] = {}
        self._asked: dict[str, dict] = {}  # per saved release: the public request it answered (holder.asked_about)
        self._clean: dict[str, np.ndarray] = {}  # un-noised values (epsilon = inf runs): this process only
        if root is not None and root.is_dir():
            loaded = []
            for path in root.glob("*.json"):
                try:
                    loaded.append((json.loads(path.read_text()), path))
                except ValueError as err:
                    raise DpsynthError(f"{path}: damaged release checkpoint ({err}); the run cannot resume "
                                       "safely (this release may have been used)") from err
            for data, path in sorted(loaded, key=lambda item: item[0].get("seq", 0)):  # in release order
                try:
                    event = None if data["event"] is None else _EVENT.validate_python(data["event"])
                    values = _load_values(data, path)
                    if event is not None and values is None:  # its resume would draw fresh noise, uncharged
                        raise ValueError("a noisy release without its values")
                    self._saved[data["name"]] = (event, values)
                    if data.get("asked") is not None:
                        self._asked[data["name"]] = data["asked"]
                except (ValueError, KeyError, OSError) as err:  # OSError: its values file is missing or unreadable
                    raise DpsynthError(f"{path}: damaged release checkpoint ({err}); the run cannot resume "
                                       "safely (this release may have been used)") from err

    def __contains__(self, name: str) -> bool:
        return name in self._saved

    def get(self, name: str) -> np.ndarray | None:
        """The saved noisy values (a copy), or None if not saved or un-noised."""
        saved = self._saved.get(name)
        if saved is not None and saved[1] is None and name in self._clean:
            return self._clean[name].copy()
        return None if saved is None or saved[1] is None else saved[1].copy()

    def asked(self, name: str) -> dict | None:
        """What the saved release was asked about (None: not saved, or saved by an older dpsynth)."""
        return self._asked.get(name)

    def events(self) -> dict[str, PrivacyEvent | None]:
        return {name: event for name, (event, _) in self._saved.items()}

    def save(self, name: str, event: PrivacyEvent | None, values: np.ndarray, asked: dict | None = None) -> None:
        """Written to disk first, then known in memory: a write that fails leaves the release unsaved here too."""
        kept = None if event is None else np.asarray(values, dtype=np.float64).copy()
        if self.root is not None:
            payload = {"name": name, "seq": len(self._saved) + 1,
                       "event": None if event is None else _EVENT.dump_python(event, mode="json"),
                       "values": None if kept is None or kept.size > LARGE else kept.tolist(), "asked": asked}
            if kept is not None and kept.size > LARGE:
                buffer = io.BytesIO()
                np.save(buffer, kept)
                atomic_write_bytes(self.root / (_stem(name) + ".npy"), buffer.getvalue())
                payload["values_file"] = _stem(name) + ".npy"
            atomic_write_text(self.root / _file_name(name), json.dumps(payload))
            shutil.rmtree(self.root / (_stem(name) + ".partial"), ignore_errors=True)
        if event is None:
            self.keep_clean(name, values)
        self._saved[name] = (event, kept)
        if asked is not None:
            self._asked[name] = asked

    def keep_clean(self, name: str, values: np.ndarray) -> None:
        """An un-noised release's values, in memory for the rest of the process (never on disk): a resumed
        process that recomputed one answers later requests with the same values, not a second computation."""
        self._clean[name] = np.asarray(values, dtype=np.float64).copy()

    def work_dir(self, name: str, *, noised: bool) -> Path | None:
        """Where a long release keeps its partial (DP) state until it is saved (None: in memory only). An
        un-noised release (epsilon = inf) keeps none: its partial state is clean private values."""
        return None if self.root is None or not noised else self.root / (_stem(name) + ".partial")

    def restore_into(self, ledger: PrivacyLedger) -> list[str]:
        """Add saved releases the ledger does not know yet (a crash after a release, before a checkpoint)."""
        known = {e.name for e in ledger.events} | set(ledger.non_private_releases)
        added = []
        for name, (event, _) in self._saved.items():
            if name in known:
                continue
            if event is None:
                ledger.record_non_private(name)
            else:
                ledger.record(event)
            added.append(name)
        return added


def _load_values(data: dict, path: Path) -> np.ndarray | None:
    if data.get("values_file"):
        return np.load(path.parent / data["values_file"], allow_pickle=False).astype(np.float64)
    return None if data["values"] is None else np.asarray(data["values"], dtype=np.float64)
