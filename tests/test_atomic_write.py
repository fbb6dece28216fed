"""Atomic writes are durable: the file's data and then its folder's entry are synced (a release renamed into place
and lost in a power loss would be drawn again with fresh noise on resume)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dpsynth import fs


def test_an_atomic_write_syncs_the_file_then_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    target = tmp_path / "releases" / "votes.json"
    fs.make_dir(target.parent)
    monkeypatch.setattr(fs.os, "fsync", recording_fsync)
    fs.atomic_write_text(target, "{}")
    assert target.read_text() == "{}"
    if os.name == "posix":
        assert synced == ["file", "folder"]
    assert not [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_folder_that_cannot_be_synced_is_not_an_error_only_where_the_system_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(fd: int) -> None:
        raise OSError(22 if stat.S_ISDIR(os.fstat(fd).st_mode) else 5, "refused")

    monkeypatch.setattr(fs.os, "fsync", lambda fd: refuse(fd) if stat.S_ISDIR(os.fstat(fd).st_mode) else None)
    fs.atomic_write_text(tmp_path / "a.json", "1")  # EINVAL on the folder: the file system cannot do it
    monkeypatch.setattr(fs.os, "fsync", refuse)
    with pytest.raises(OSError):
        fs.atomic_write_text(tmp_path / "b.json", "2")  # EIO on the file: an error


def test_every_folder_a_write_makes_is_owner_only_and_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Path.mkdir(parents=True, mode=0o700) makes the missing parents 0755: the releases folder of a run was
    listable by every user."""
    fs.atomic_write_text(tmp_path / "run" / "checkpoints" / "releases" / "x.partial" / "mark", "1")
    for folder in ("run", "run/checkpoints", "run/checkpoints/releases", "run/checkpoints/releases/x.partial"):
        assert stat.S_IMODE((tmp_path / folder).stat().st_mode) == 0o700, folder
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(fs.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    fs.make_dir(tmp_path / "new" / "deeper")
    if os.path.exists("/proc/self/fd"):  # each new folder's entry is synced in the folder above it
        assert synced == [str(tmp_path), str(tmp_path / "new")]
    (tmp_path / "a-file").write_text("")
    with pytest.raises(FileExistsError):
        fs.make_dir(tmp_path / "a-file")
    with pytest.raises(NotADirectoryError):
        fs.make_dir(tmp_path / "a-file" / "below")
