"""Files and folders: atomic writes, the user cache, and the run directory's paths.

A run's artifacts are written through `atomic_write_text` (temporary file, fsync, rename, fsync of the folder), so a
crash never leaves half a file that a resume or a reader would trust; files written by other
libraries (SQLite caches, a downloaded corpus, a GGUF export) are written whole to a temporary
name or made again when found incomplete. `RunDir` names the paths inside a run directory; the few
file names still spelled where they are used are listed in docs/architecture.md (fs.py).
"""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dpsynth.errors import DpsynthError


def cache_dir() -> Path:
    """Where fetched assets and the request cache live: $DPSYNTH_CACHE (when set and not empty) or
    ~/.cache/dpsynth. An empty value is unset: it must not put the cache in the working directory."""
    value = os.environ.get("DPSYNTH_CACHE", "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "dpsynth"


# The file-mode policy: everything dpsynth writes that is derived from a run (its directory, synthetic text,
# releases, logs) and every cache holding synthetic text is readable by its owner only: files 0600 (as
# `tempfile.mkstemp` creates the atomic writes), folders 0700. SQLite gives its -wal and -shm files the
# database file's mode, so creating the database file 0600 covers them.
FILE_MODE, DIR_MODE = 0o600, 0o700


def make_dir(path: Path) -> None:
    """Create a folder (and missing parents) readable by the owner only; an existing folder is left as it is.
    Each missing level is made here: `Path.mkdir(parents=True, mode=...)` gives the parents it makes the default
    mode (0755 under the usual umask), which left e.g. checkpoints/releases/ listable by every user."""
    path = Path(path)
    missing = []
    level = path
    while not level.exists() and level != level.parent:
        missing.append(level)
        level = level.parent
    for folder in reversed(missing):
        folder.mkdir(mode=DIR_MODE, exist_ok=True)  # another process may make it meanwhile
        sync_directory(folder.parent)  # the new folder's entry, durable like the files written into it
    if not path.is_dir():
        path.mkdir(mode=DIR_MODE, exist_ok=True)  # a file in the way: the same error as before


def foreign_entries(folder: Path, marks: tuple[Path, ...]) -> list[str]:
    """The visible entries of an existing folder that a dpsynth command is about to write into, when none of its
    `marks` (what that command makes there first) exists: the user's own files, which it would overwrite (a run or a
    bench started with `-o` on a project folder). Hidden entries (.DS_Store, .gitkeep, .git) do not count."""
    if not folder.is_dir() or any(mark.exists() for mark in marks):
        return []
    return sorted(name for name in os.listdir(folder) if not name.startswith("."))


def refuse_foreign_entries(folder: Path, marks: tuple[Path, ...], whose: str) -> None:
    """One-line error naming up to three of `foreign_entries`, before anything is written into `folder`."""
    foreign = foreign_entries(folder, marks)
    if foreign:
        raise DpsynthError(f"{folder} holds files that are not a dpsynth {whose}'s ({', '.join(foreign[:3])}"
                           f"{', ...' if len(foreign) > 3 else ''}), which the {whose} would overwrite; give a new or "
                           f"empty directory for the {whose}'s outputs")


def ensure_writable_dir(path: Path) -> Path:
    """Create `path` if needed and check that files can be made in it; raises the OSError the user must fix
    (a file in the way, a read-only mount, no permission), so a run can check its cache before it makes
    its own directory and leaves nothing behind."""
    import errno

    path = Path(path)
    make_dir(path)
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    return path


def create_owner_only(path: Path) -> Path:
    """Make sure `path` exists as a file readable by the owner only (for files opened by other libraries:
    SQLite databases, log files). An existing file is not opened at all: closing any descriptor of a SQLite
    database drops the POSIX locks this process's connections hold on it (a shared cache opened twice in
    one process, as a bench does per cell, then fails with "disk I/O error")."""
    path = Path(path)
    if path.exists():
        return path
    make_dir(path.parent)
    try:  # O_EXCL: a file another process creates meanwhile is not opened either
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))
    except FileExistsError:
        pass
    return path

def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    if path.is_dir():  # the rename would fail naming the temporary file, not the user's path
        raise DpsynthError(f"{path} is a folder; give the path of a file to write")
    make_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sync_directory(path.parent)


def sync_directory(folder: Path) -> None:
    """Make the renames and new names in `folder` durable. Why: fsync of a file does not persist its directory entry,
    so after an OS crash or power loss a file just renamed into place can be missing; for a noisy release that is
    already out (in prompts sent to an API) the resume would then draw it again with fresh noise. POSIX only: on
    Windows a directory cannot be opened this way (its renames are journalled by NTFS); a file system that cannot
    sync a directory (EINVAL, ENOTSUP, ...) or open one for reading offers nothing more to ask for: the write itself
    has happened."""
    if os.name == "posix":
        _fsync(folder, os.O_RDONLY)


_CANNOT_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.ENOSYS, errno.EBADF, errno.EACCES, errno.EPERM}


def sync_file(path: Path) -> None:
    """Make what was written to an existing file durable (a file another library writes: SQLite's write-ahead log),
    and its name in its folder. Opened for writing, as Windows' fsync needs; a missing file has nothing to sync, and
    a file system that cannot sync offers nothing more to ask for."""
    if _fsync(path, os.O_RDWR):
        sync_directory(path.parent)


def _fsync(path: Path, flags: int) -> bool:
    """fsync `path` opened with `flags`; False if it is missing or may not be opened (nothing to sync), and a file
    system's refusal to sync (EINVAL, ENOTSUP, ...) is not an error: the write itself has happened."""
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, PermissionError):
        return False
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _CANNOT_SYNC:
            raise
    finally:
        os.close(fd)
    return True


@dataclass(frozen=True)
class RunDir:
    """The layout of a run directory (see docs/architecture.md)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def state(self) -> Path:
        """The latest checkpoint; its presence means the directory holds a started run."""
        return self.checkpoints / "state.json"

    @property
    def plan(self) -> Path:
        """The privacy plan's fingerprint and calibrated knobs, written before the first release."""
        return self.checkpoints / "plan.json"

    def iteration_checkpoint(self, t: int) -> Path:
        return self.checkpoints / f"iteration_{t}.json"

    @property
    def usage_at_stop(self) -> Path:
        """Generator usage when a step stopped after paying for answers (a spend cap, Ctrl-C, a failed server), until
        the next checkpoint counts it."""
        return self.checkpoints / "usage_at_stop.json"

    @property
    def releases(self) -> Path:
        """One file per DP release (event + noisy result), written the moment it is released."""
        return self.checkpoints / "releases"

    @property
    def method_files(self) -> Path:
        """Files a method derives from public data and noisy releases only (e.g. a preference-tuned adapter)."""
        return self.checkpoints / "method"

    @property
    def synthetic_embeddings(self) -> Path:
        return self.root / "cache" / "embeddings.sqlite"

    @property
    def synthetic(self) -> Path:
        return self.root / "synthetic.jsonl"

    @property
    def privacy(self) -> Path:
        return self.root / "privacy.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def evaluation(self) -> Path:
        return self.root / "eval.json"

    @property
    def log(self) -> Path:
        return self.root / "run.log"

    @property
    def lock(self) -> Path:
        """Held (flock) by the one process that runs or resumes this directory."""
        return self.root / ".lock"

    def is_started(self) -> bool:
        """The directory holds a run that spent something: a checkpoint, a release (or a long release's partial
        state), a method's files, or the usage of a step stopped after it paid for answers. A run that stopped
        before all of these (a model, corpus or key that could not be had, found once its directory and plan
        existed; a first request refused) spent nothing: its generations, if any, are in the user-wide request
        cache, so a new run may start in its place (`Run.create`)."""
        def holds_files(folder: Path) -> bool:
            return folder.is_dir() and any(folder.iterdir())

        return (self.state.exists() or self.usage_at_stop.exists() or holds_files(self.releases)
                or holds_files(self.method_files))

    def is_finished(self) -> bool:
        return self.metrics.exists()


def exclusive_lock(path: Path, wait: bool) -> IO[str] | None:
    """An exclusive lock on the file `path` (made if missing), held for as long as the returned file stays open;
    None when another process holds it and `wait` is false. The OS drops a lock when its holder exits, even on
    SIGKILL, so a crash never leaves one behind. Without `fcntl` (Windows) every lock is granted, unlocked."""
    handle = open(create_owner_only(path), "a+", encoding="utf-8")  # noqa: SIM115 - held open: the lock lives with it
    try:
        import fcntl
    except ImportError:
        return handle
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        handle.close()
        return None
    except BaseException:  # interrupted while waiting, or no lock to be had
        handle.close()
        raise
    return handle


def lock_run_dir(run_dir: RunDir) -> IO[str] | None:
    """Take the run directory's exclusive lock for as long as the returned file stays open.

    Two processes running or resuming one directory would each draw the next release with their own
    noise and each write a checkpoint: the run could spend twice. The OS drops the lock when its
    holder exits, even on SIGKILL, so a crash never leaves the directory locked. Without `fcntl`
    (Windows) there is no lock and the user must not start a directory twice.
    """
    try:
        import fcntl  # noqa: F401 - only whether locks exist here
    except ImportError:
        return None
    make_dir(run_dir.root)
    handle = exclusive_lock(run_dir.lock, wait=False)
    if handle is None:
        holder = run_dir.lock.read_text(encoding="utf-8").strip() or "another process"
        raise DpsynthError(f"{run_dir.root} is in use by {holder}; wait for it to finish (or stop it) and "
                           f"then resume with `dpsynth run --resume {run_dir.root}`")
    handle.seek(0)
    handle.truncate()
    handle.write(f"dpsynth process {os.getpid()}\n")
    handle.flush()
    return handle
