from __future__ import annotations

import subprocess
import sys

import pytest

from conveyor import registry
from conveyor.errors import PluginError


def test_builtins_are_registered_through_entry_points() -> None:
    names = {kind: {e.name for e in registry.available(kind)} for kind in registry.KINDS}
    assert {"parquet", "csv", "duckdb"} <= names["source"]
    assert {"parquet", "csv", "duckdb"} <= names["sink"]
    assert {"none", "files"} <= names["strategy"]
    assert "local" in names["runtime"]


def test_listing_imports_no_plugin_module() -> None:
    code = (
        "import sys; from conveyor import registry\n"
        "[registry.available(k) for k in registry.KINDS]\n"
        "loaded = [m for m in sys.modules if m.startswith(('conveyor.connectors', 'conveyor.strategies', 'duckdb', 'pyarrow'))]\n"
        "print(loaded)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(("kind", "name", "other"), [
    ("source", "postgres", "conveyor.connectors.postgres.sink"),
    ("sink", "postgres", "conveyor.connectors.postgres.source"),
    ("source", "mysql", "conveyor.connectors.mysql.sink"),
    ("source", "clickhouse", "conveyor.connectors.clickhouse.sink"),
    ("sink", "parquet", "conveyor.connectors.files.sources"),
])
def test_loading_a_connector_imports_its_side_only(kind: str, name: str, other: str) -> None:
    """A job that reads PostgreSQL does not import the PostgreSQL sink's modules (and so on): a
    connector package's names are imported from its submodules when asked for (on the main this
    started from, the postgres package imported both sides: 46 ms of every such run)."""
    code = (
        "import sys; from conveyor import registry\n"
        f"registry.load({kind!r}, {name!r})\n"
        f"print({other!r} in sys.modules)\n"
        f"import {other.rsplit('.', 1)[0]} as pkg; print(all(getattr(pkg, n) is not None for n in pkg.__all__))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.split() == ["False", "True"]  # not imported by the load; every exported name still there when asked


def test_load_returns_the_class() -> None:
    from conveyor.connectors.files import ParquetSource

    assert registry.load("source", "parquet") is ParquetSource


def test_unknown_name_lists_the_available_ones() -> None:
    with pytest.raises(PluginError) as info:
        registry.load("sink", "nosuchsink")
    assert "unknown sink 'nosuchsink'" in str(info.value)
    assert "duckdb" in (info.value.hint or "") and "parquet" in (info.value.hint or "")


def test_unknown_kind() -> None:
    with pytest.raises(PluginError):
        registry.available("gizmo")


def test_the_installed_entry_points_are_read_once_per_sys_path(monkeypatch, tmp_path) -> None:
    """Each ``entry_points()`` call reads every installed distribution's metadata (about 6 ms here);
    a job's start looked plugins up 33 times. They are read once, and again when sys.path changes
    (a plugin on a new path is found)."""
    from importlib import metadata

    calls = []

    def counted(**kw):
        calls.append(kw)
        return metadata.entry_points(**kw)

    monkeypatch.setattr(registry, "entry_points", counted)
    monkeypatch.setattr(registry, "_scanned", None)
    for kind in registry.KINDS:
        registry.available(kind)
        registry.load(kind, registry.available(kind)[0].name)
    registry.config_packages()
    assert len(calls) == 1
    info = tmp_path / "conveyor_probe-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: conveyor-probe\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[conveyor.sources]\nprobe = conveyor.connectors.files:ParquetSource\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "probe" in {e.name for e in registry.available("source")} and len(calls) == 2


def test_a_named_plugin_that_does_not_import_says_which_package_to_install(tmp_path) -> None:
    """An installed plugin whose module fails to import registers no defaults, and Hydra's composition
    said only "Could not load 'conveyor_defaults/source/mysql'" with a hint to run again with --verbose:
    now the one line is the registry's own, naming the missing package, with the pip command as the
    hint. (The plugin's import is made to fail in a subprocess: no broken package is installed here.)"""
    script = """
import sys
from importlib.metadata import EntryPoint
real = EntryPoint.load
def load(self):
    if self.value.startswith("conveyor.connectors.mysql.source"):
        raise ModuleNotFoundError("No module named 'pymysql_broken'", name="pymysql_broken")
    return real(self)
EntryPoint.load = load
from conveyor import cli
sys.exit(cli.main(["plan", "source=mysql", "source.table=t", "sink=parquet", f"sink.path={sys.argv[1]}", "runtime=local"]))
"""
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: source 'mysql' needs the Python package 'pymysql_broken', which is not installed",
                     "hint: pip install pymysql_broken"], proc.stderr


def test_composing_a_job_reads_no_distribution_metadata() -> None:
    """On main composing a job read every plugin's distribution name (``ep.dist.name``), which parses
    that package's METADATA file: 34 parses at each job's start, ~31 ms here (the four kinds' names
    alone: 1.6-1.9 ms). Only the names are needed; `conveyor plugins` still shows the packages."""
    code = (
        "import importlib.metadata as md\n"
        "import conveyor\n"  # its own version, read once as it is imported
        "parsed = []\n"
        "real = md.Distribution.metadata\n"
        "md.Distribution.metadata = property(lambda self: parsed.append(1) or real.fget(self))\n"
        "from conveyor.submit import compose\n"
        "from conveyor.config import build_job\n"
        "build_job(compose(['pipeline=pg_to_pg', 'source.table=t', 'sink.table=t', 'strategy=none']))\n"
        "print(len(parsed))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0"
    assert any(e.distribution for e in registry.available("source"))  # the listing still names the packages


class _Bare:
    """A source written against the two methods alone, before the hooks were declared."""

    from conveyor.core import JobOptions as config_class

    def describe(self):  # type: ignore[no-untyped-def]
        raise AssertionError("never built")

    def read(self, part):  # type: ignore[no-untyped-def]
        raise AssertionError("never built")


def test_a_plugin_lacking_part_of_its_contract_is_refused_when_loaded(monkeypatch) -> None:
    """Every member the job calls on a source is declared (Source) with a default (SourceBase): a class
    without them is refused by name when loaded, not met with an AttributeError half way through a run."""
    from importlib.metadata import EntryPoint

    ep = EntryPoint("bare", f"{__name__}:_Bare", registry.GROUPS["source"])
    monkeypatch.setattr(registry, "_entries", lambda kind: {"bare": [ep]})
    with pytest.raises(PluginError) as info:
        registry.load("source", "bare")
    assert "lacks session, warm_up, keeping, many, tables, for_table, checksums, export_native, snapshot_id of the source contract" in str(info.value)
    assert "subclass conveyor.core.SourceBase" in (info.value.hint or "")
    from conveyor.core import SourceBase

    assert registry.missing_members("source", type("Based", (SourceBase, _Bare), {})) == []
