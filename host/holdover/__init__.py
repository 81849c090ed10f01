"""holdover: a power and uplink sentinel that saves long training runs."""

from importlib.metadata import PackageNotFoundError, version

try:
    # One version, the installed package's (pyproject reads it from the firmware's version.py).
    __version__ = version("holdover")
except PackageNotFoundError:  # run from a source tree that was never installed
    from holdover.firmware.version import VERSION as __version__  # noqa: F401
