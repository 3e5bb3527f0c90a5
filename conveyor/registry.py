"""Plugins by name, through entry points.

Four groups: ``conveyor.sources``, ``conveyor.sinks``, ``conveyor.strategies`` and
``conveyor.runtimes``; and ``conveyor.configs`` for a plugin package's Hydra configs. The
built-ins register through the same entry points as third-party packages. Listing names
imports nothing; only the plugin a config asks for is loaded. The registry is the allowlist:
a config can name a plugin, never an arbitrary import path.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from conveyor.errors import PluginError

KINDS = ("source", "sink", "strategy", "runtime")
GROUPS = {
    "source": "conveyor.sources",
    "sink": "conveyor.sinks",
    "strategy": "conveyor.strategies",
    "runtime": "conveyor.runtimes",
}

# Which extra provides the driver a built-in plugin needs, for the "install ..." hint.
_EXTRA_FOR_MODULE = {
    "psycopg": "postgres",
    "adbc_driver_postgresql": "postgres",
    "adbc_driver_manager": "postgres",
    "s3fs": "s3",
    "ray": "ray",
}


@dataclass(frozen=True)
class PluginEntry:
    kind: str
    name: str
    value: str
    distribution: str | None


#: every installed entry point, read once per sys.path: each ``entry_points()`` call reads the
#: metadata of every installed distribution, and a job's start asked many times
_scanned: tuple[tuple[str, ...], Any] | None = None


def _entry_points(group: str) -> Any:
    global _scanned
    key = tuple(sys.path)
    if _scanned is None or _scanned[0] != key:
        _scanned = (key, entry_points())
    return _scanned[1].select(group=group)


def _entries(kind: str) -> dict[str, list[EntryPoint]]:
    if kind not in GROUPS:
        raise PluginError(f"unknown plugin kind {kind!r}", hint=f"kinds are: {', '.join(KINDS)}")
    found: dict[str, list[EntryPoint]] = {}
    for ep in _entry_points(GROUPS[kind]):
        found.setdefault(ep.name, [])
        # The same distribution seen twice on sys.path (e.g. an editable install) is one plugin.
        if all(other.value != ep.value for other in found[ep.name]):
            found[ep.name].append(ep)
    return found


#: the entry point group through which a plugin package names its Hydra config package
CONFIGS_GROUP = "conveyor.configs"


def config_packages() -> list[str]:
    """The config packages installed plugins declare (``[project.entry-points."conveyor.configs"]
    example = "conveyor_example.configs"``): Conveyor adds each to Hydra's search path, so the
    plugin's ``source/<name>.yaml`` is found without ``--config-dir``."""
    found: list[str] = []
    for ep in _entry_points(CONFIGS_GROUP):
        if ep.value not in found and ep.value.replace(".", "").replace("_", "").isalnum():
            found.append(ep.value)
    return sorted(found)


def names(kind: str) -> list[str]:
    """The names of a kind's installed plugins, sorted; reads no distribution's metadata (which
    :func:`available` does for each plugin's package name)."""
    return sorted(_entries(kind))


def available(kind: str) -> list[PluginEntry]:
    """Every installed plugin of a kind, sorted by name; imports nothing."""
    out = []
    for name, eps in sorted(_entries(kind).items()):
        for ep in eps:
            dist = ep.dist.name if getattr(ep, "dist", None) is not None else None
            out.append(PluginEntry(kind, name, ep.value, dist))
    return out


def load(kind: str, name: str) -> type:
    """The plugin class registered as ``name`` in ``kind``'s group."""
    eps = _entries(kind).get(name)
    if not eps:
        names = ", ".join(sorted(_entries(kind))) or "none installed"
        raise PluginError(
            f"unknown {kind} {name!r}",
            hint=f"available {kind} plugins: {names} (`conveyor plugins` lists them all)",
        )
    if len(eps) > 1:
        where = ", ".join(ep.value for ep in eps)
        raise PluginError(
            f"{kind} {name!r} is registered more than once: {where}",
            hint="uninstall one of the packages that provide it",
        )
    try:
        cls = eps[0].load()
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        extra = _EXTRA_FOR_MODULE.get(missing)
        hint = f"pip install 'conveyor[{extra}]'" if extra else f"pip install {missing}"
        raise PluginError(
            f"{kind} {name!r} needs the Python package {missing!r}, which is not installed",
            hint=hint,
        ) from exc
    if not dataclasses.is_dataclass(getattr(cls, "config_class", None)):  # what every plugin declares (core's protocols)
        raise PluginError(f"{kind} {name!r} ({eps[0].value}) declares no config_class dataclass",
                          hint="a plugin class names its config dataclass: config_class = MyConfig")
    missing = missing_members(kind, cls)
    if missing:
        base = _BASES.get(kind)
        raise PluginError(f"{kind} {name!r} ({eps[0].value}) lacks {', '.join(missing)} of the {kind} contract",
                          hint=f"subclass conveyor.core.{base}: it gives every hook its default" if base else
                          f"implement {', '.join(missing)}")
    return cls


#: the base class that gives a plugin kind's hooks their defaults
_BASES = {"source": "SourceBase", "sink": "SinkBase", "runtime": "RuntimeBase"}


def missing_members(kind: str, cls: type) -> list[str]:
    """The members of ``kind``'s Protocol (``conveyor.core``) that the plugin class lacks: what the job
    would otherwise find missing half way through a run."""
    from conveyor import core

    protocol = {"source": core.Source, "sink": core.Sink, "strategy": core.Strategy, "runtime": core.Runtime}.get(kind)
    if protocol is None:
        return []
    names = [n for n in vars(protocol) if not n.startswith("_") and callable(vars(protocol)[n])]
    names += [n for n in getattr(protocol, "__annotations__", {}) if not n.startswith("_") and n != "config_class"]
    return [n for n in dict.fromkeys(names) if not hasattr(cls, n)]


def lazy_exports(package: str, **modules: tuple[str, ...]) -> Any:
    """A connector package's module ``__getattr__`` (PEP 562): ``from package import Name`` imports
    the submodule that ``modules`` lists ``Name`` under only then, so a job that reads PostgreSQL
    does not import the sink's modules, nor one that writes Parquet the file sources'."""
    import importlib

    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    return __getattr__
