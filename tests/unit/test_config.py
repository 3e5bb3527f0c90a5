from __future__ import annotations

import dataclasses
import pickle

import pytest
from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.core import JobOptions
from conveyor.errors import ConfigError, PluginError


def _cfg(**overrides: object):
    base = {
        "source": {"type": "parquet", "path": "data/x.parquet", "storage_options": {}},
        "sink": {"type": "duckdb", "database": "t.duckdb", "table": "t", "schema": "main"},
        "strategy": {"type": "files", "files_per_partition": 1},
        "runtime": {"type": "local", "max_retries": 0},
        "load_mode": "append",
        "map_method": "name",
        "batch_size": 1000,
        "degree": 2,
    }
    cfg = OmegaConf.create(base)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def test_builds_typed_plugins_without_connecting() -> None:
    spec = build_job(_cfg())
    assert spec.names == {"source": "parquet", "sink": "duckdb", "strategy": "files", "runtime": "local"}
    assert spec.source.config.path == "data/x.parquet"
    assert spec.options.batch_size == 1000 and spec.options.degree == 2
    # everything a worker receives pickles
    pickle.loads(pickle.dumps((spec.source, spec.sink, spec.strategy, spec.runtime)))


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("source.pathh", "x", "source.pathh: unknown key"),
        ("sink.tabel", "x", "sink.tabel: unknown key"),
        ("degre", 3, "degre: unknown key"),
        ("batch_size", "many", "batch_size:"),
        ("strategy.files_per_partition", "two", "strategy.files_per_partition:"),
        ("load_mode", "upsert", "load_mode: 'upsert' is not one of truncate, append, create, replace"),
        ("map_method", "guess", "map_method: 'guess' is not one of name, position"),
        ("batch_size", 0, "batch_size: 0 must be > 0"),
        ("degree", 0, "degree: 0 is not valid"),
        ("sink.table", "???", "sink.table: a value is required"),
        ("strategy.files_per_partition", -1, "strategy: files_per_partition must be >= 0"),
        ("runtime.max_retries", -1, "runtime: max_retries: -1 must be >= 0"),
        ("runtime.prefetch_batches", -2, "runtime: prefetch_batches: -2 must be >= 0"),
        ("verify_keys", -1, "verify_keys: -1 must be >= 0"),
        ("incremental.follow", -1, "incremental.follow: -1 must be >= 0"),
        ("incremental.wait_timeout", -5, "incremental.wait_timeout: -5 must be >= 0"),
        ("incremental.chunk_keys", 0, "incremental.chunk_keys: 0 must be > 0"),
    ],
)
def test_bad_values_name_the_key_path(key: str, value: object, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_job(_cfg(**{key: value}))
    assert str(info.value).startswith(expected), str(info.value)


def test_duckdb_source_needs_table_or_query() -> None:
    cfg = _cfg()
    cfg.source = {"type": "duckdb", "database": "x.duckdb", "table": None, "query": None}
    with pytest.raises(ConfigError, match="set exactly one of table or query"):
        build_job(cfg)


def test_unknown_plugin_type() -> None:
    with pytest.raises(PluginError, match="unknown source 'nope'"):
        build_job(_cfg(**{"source.type": "nope"}))


def test_missing_environment_variable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONVEYOR_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError, match="cannot resolve"):
        build_job(_cfg(**{"source.path": "${oc.env:CONVEYOR_TEST_UNSET}"}))


@pytest.mark.parametrize(("degree", "cpus", "expected"), [(4, 2, 4), (-1, 8, 8), (-2, 8, 4), (-4, 2, 1), (1, 1, 1)])
def test_negative_degree_is_a_fraction_of_the_cpus(degree: int, cpus: int, expected: int) -> None:
    assert JobOptions.resolve_degree(degree, cpus) == expected


def test_defaults_are_written_once_in_the_config_dataclasses_and_composed_from_them() -> None:
    """configs/<kind>/<name>.yaml sets no key of its own: the plugin's config dataclass is the one place a
    default lives, and the composed config (what --cfg job prints, what pipelines interpolate) carries it."""
    import yaml

    from conveyor import registry
    from conveyor.config import TOP_LEVEL_PLUGINS, JobConfig, _defaults_of
    from conveyor.submit import compose
    from tests.helpers import REPO

    top = yaml.safe_load((REPO / "configs" / "config.yaml").read_text())
    assert set(top) == {"defaults", "hydra"}, "config.yaml repeats JobConfig's defaults"
    cfg = OmegaConf.to_container(compose([]))
    job_fields = {f.name for f in dataclasses.fields(JobConfig)} - set(TOP_LEVEL_PLUGINS)
    assert {k: cfg[k] for k in job_fields} == _defaults_of(JobConfig, skip=TOP_LEVEL_PLUGINS)
    checked = 0
    for kind in TOP_LEVEL_PLUGINS:
        for path in sorted((REPO / "configs" / kind).glob("*.yaml")):
            name = path.stem
            assert set(yaml.safe_load(path.read_text())) == {"defaults"}, f"{path.name} repeats defaults of its dataclass"
            schema = registry.load(kind, name).config_class
            node = OmegaConf.to_container(compose([f"{kind}={name}"])[kind])
            assert node == {"type": name, **_defaults_of(schema)}, f"{kind}={name}"
            checked += 1
    assert checked >= 20


@dataclasses.dataclass
class _Inner:
    names: tuple[str, ...] = ("a", "b")
    limit: int | None = None


@dataclasses.dataclass
class _Shapes:
    """Defaults of the shapes a plugin's config uses (a required field, a nested dataclass, a tuple)."""

    required: str
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    options: dict[str, int] = dataclasses.field(default_factory=lambda: {"x": 1})
    ratio: float = 0.5


def test_dataclass_defaults_read_as_omegaconf_reads_them() -> None:
    """_defaults_of walks the dataclass fields itself (OmegaConf's structured configs cost 0.02-0.04 s
    of every CLI run): for every installed plugin's config, the job's, and _Shapes, the same dict, value types included, as
    OmegaConf.to_container(OmegaConf.structured(...))."""
    from conveyor import registry
    from conveyor.config import TOP_LEVEL_PLUGINS, JobConfig, _defaults_of

    plugins = [getattr(registry.load(kind, entry.name), "config_class", None)
               for kind in TOP_LEVEL_PLUGINS for entry in registry.available(kind)]
    schemas = [JobConfig, _Shapes, *(s for s in plugins if s is not None and dataclasses.is_dataclass(s))]
    assert len(schemas) >= 22
    for schema in schemas:
        expected = OmegaConf.to_container(OmegaConf.structured(schema))
        got = _defaults_of(schema)
        assert got == expected, schema
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in expected.items()}, schema
    assert _defaults_of(_Shapes) == {"required": "???", "inner": {"names": ["a", "b"], "limit": None}, "options": {"x": 1}, "ratio": 0.5}


def test_a_misspelt_key_is_still_refused_after_composing_from_the_dataclass_defaults() -> None:
    from conveyor.submit import compose

    with pytest.raises(ConfigError, match=r"sink\.tabel: unknown key"):
        build_job(compose(["sink=postgres", "sink.table=t", "+sink.tabel=t", "source.path=x"]))


def test_composing_a_job_imports_only_the_plugins_it_names(tmp_path) -> None:
    """Every installed plugin's defaults are in Hydra's store (``conveyor_defaults/<kind>/<name>``), but
    a plugin's module is imported and its node made only when a composition asks for it. On main every
    run imported every installed plugin (MySQL's, ADBC's, Flight's, ...) and wrapped all 26 nodes first:
    0.06-0.07 s of each run here."""
    import json
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "in" / "a.parquet")
    script = ("import json, sys\nfrom conveyor import cli\n"
              "code = cli.main(sys.argv[1:])\n"
              "print(json.dumps(sorted(m for m in sys.modules if m.startswith('conveyor.connectors'))))\nsys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", script, "plan", "pipeline=demo", f"source.path={tmp_path / 'in'}",
                           f"sink.database={tmp_path / 'x.duckdb'}"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "conveyor.connectors.files.sources" in loaded and "conveyor.connectors.duckdb" in loaded  # the job's own
    assert not any(m.startswith(("conveyor.connectors.mysql", "conveyor.connectors.adbc", "conveyor.connectors.flight",
                                 "conveyor.connectors.postgres")) for m in loaded), loaded


def test_a_schema_qualified_postgres_table_is_split_or_refused() -> None:
    pg = {"type": "postgres", "table": "public.dotted", "schema": "public"}
    spec = build_job(_cfg(sink=pg))
    assert (spec.sink.config.schema, spec.sink.config.table) == ("public", "dotted")
    spec = build_job(_cfg(sink={**pg, "table": "app.orders"}))
    assert (spec.sink.config.schema, spec.sink.config.table) == ("app", "orders")
    with pytest.raises(ConfigError, match="holds a dot: name the schema with sink.schema"):
        build_job(_cfg(sink={**pg, "schema": "other", "table": "app.orders"}))
    with pytest.raises(ConfigError, match="holds a dot"):
        build_job(_cfg(sink={**pg, "table": "a.b.c"}))


def test_a_map_of_the_users_own_keys_is_set_on_the_command_line_as_the_docs_write_it() -> None:
    """``source.column_types={price: 'decimal(15,2)'}`` as docs/files.md writes it (Hydra's struct mode refused a new key in
    an empty map without a +); a misspelled key of the plugin itself is still refused."""
    from conveyor.submit import compose

    cfg = compose(["source=csv", "source.path=x.csv", "sink=parquet", "sink.path=out", "source.column_types={price: 'decimal(15,2)'}",
                   "sink.storage_options={anon: 'true'}"])
    assert dict(cfg.source.column_types) == {"price": "decimal(15,2)"} and dict(cfg.sink.storage_options) == {"anon": "true"}
    with pytest.raises(ConfigError, match="Could not override 'source.colum_types'"):
        compose(["source=csv", "source.path=x.csv", "sink=parquet", "sink.path=out", "source.colum_types={price: int64}"])
