"""What a cached answer's model is, for model files on disk.

The request cache keys each answer by its generator's `model_id`. A name and a size are not enough to tell two
model files apart: two fine-tunes of one base exported under one file name with one quantisation have the same
size, and the second run would be served the first model's texts. Hashing a whole GGUF (hundreds of MB) at every
start is too slow, so a large file is identified by its size and a hash of evenly spaced windows over its whole
length (its header, the metadata with the chat template, and tensors of every layer); a small file is hashed
whole. Changing this identity makes every earlier cached answer of a local model a miss (asked again, not wrong).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_WINDOW = 64 << 10
_WINDOWS = 33  # the first, the last and 31 between: 2.1 MB read per file
_WHOLE_BELOW = _WINDOW * _WINDOWS
NOT_MODEL_CONTENT = (".md", ".txt", ".lock", ".metadata")  # notes and download bookkeeping


def file_fingerprint(path: Path) -> str:
    """Size and a hash of the file (whole when small, else 33 windows of 64 KiB across it): 12 hex digits."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        digest.update(str(size).encode())
        if size <= _WHOLE_BELOW:
            f.seek(0)
            digest.update(f.read())
        else:
            for i in range(_WINDOWS):
                f.seek((size - _WINDOW) * i // (_WINDOWS - 1))
                digest.update(f.read(_WINDOW))
    return digest.hexdigest()[:12]


def folder_fingerprint(folder: Path) -> str:
    """Every file of a model folder that can change what it writes (weights, config, tokenizer and its chat
    template, generation defaults), by relative name: 12 hex digits. Notes and `.git` are left out."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_file() and ".git" not in relative.parts and path.suffix not in NOT_MODEL_CONTENT:
            digest.update(f"{relative}:{file_fingerprint(path)};".encode())
    return digest.hexdigest()[:12]
