"""dpsynth: differentially private synthetic text from several pre-trained language models.

The public Python API (docs/api.md): `synthesize`, `load_run`, `SynthesisResult`, `Sample`, `DpsynthError`
and `__version__`. They are imported on first use, so `import dpsynth` stays cheap.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("dpsynth")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

_PUBLIC = {"synthesize": "dpsynth.api", "load_run": "dpsynth.api", "SynthesisResult": "dpsynth.api",
           "Sample": "dpsynth.api", "DpsynthError": "dpsynth.errors"}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'dpsynth' has no attribute {name!r}")
