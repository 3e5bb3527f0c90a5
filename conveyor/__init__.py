"""Conveyor: moves tables between databases and files, in parallel, from declarative configs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("conveyor")
except PackageNotFoundError:  # a source tree that was not installed
    __version__ = "0+unknown"
