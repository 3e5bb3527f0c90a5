"""Conveyor: moves tables between databases and files, in parallel, from declarative configs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("conveyor")
except PackageNotFoundError:  # a source tree that was not installed
    __version__ = "0+unknown"

#: the Python API (conveyor.api), imported when first used: the command line starts without it
__all__ = ["run", "plan", "compose", "ConveyorError", "__version__"]


def __getattr__(name: str) -> object:  # PEP 562: a module's lazy attributes
    if name in ("run", "plan", "compose"):
        from conveyor import api

        return getattr(api, name)
    if name == "ConveyorError":
        from conveyor.errors import ConveyorError

        return ConveyorError
    raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
