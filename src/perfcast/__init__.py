"""perfcast: predict how fast ML models run, and how much memory they need, on hardware you do
not own."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("perfcast")
except PackageNotFoundError:  # a source tree on sys.path without an installed distribution
    __version__ = "0+unknown"
