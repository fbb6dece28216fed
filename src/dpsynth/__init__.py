"""dpsynth: differentially private synthetic text from several pre-trained language models."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dpsynth")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
