"""Typed configs: the composed Hydra config becomes dataclasses before anything connects.

Each plugin class names its config dataclass in ``config_class``. A YAML node is merged into
that dataclass's structured schema, so an unknown key, a wrong type or a missing value fails
here with its full key path (``source.pathh``), never later inside a worker.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf import errors as oc_errors

from conveyor import registry
from conveyor.core import LOAD_MODES, MAP_METHODS, SCHEMA_DRIFTS, JobOptions
from conveyor.core.cursor import IncrementalConfig
from conveyor.core.migration import MigrateConfig
from conveyor.errors import ConfigError
from conveyor.log import warn

TOP_LEVEL_PLUGINS = ("source", "sink", "strategy", "runtime")


@dataclass
class JobConfig:
    """The top level of ``configs/config.yaml``: one node per plugin and the job options."""

    source: Any = None
    sink: Any = None
    strategy: Any = None
    runtime: Any = None
    #: truncate: empty the target and load it (through staging: a failed run keeps the old rows);
    #: append: add the rows, each partition commits on its own; create: create the target from the
    #: source's Arrow schema (fails if it exists); replace: load a new table from the source schema
    #: and swap it in when every partition is done; merge (sinks that upsert by key: PostgreSQL):
    #: stage every partition, then update matched rows and insert new ones in one transaction
    load_mode: str = "append"
    #: name: match columns by name (exact, else a unique case-insensitive match); position: i-th to i-th
    map_method: str = "name"
    #: source columns an existing target lacks (append, merge, truncate): fail (named, before a row
    #: moves); evolve (added to the target as nullable columns first: PostgreSQL and DuckDB sinks);
    #: ignore (loaded without them, said in the log)
    schema_drift: str = "fail"
    #: rows per Arrow record batch
    batch_size: int = 65536
    #: tasks at once: N > 0 runs N; N < 0 uses CPUs / |N| (-2 = half the CPUs)
    degree: int = 1
    #: count: source and target row counts compared before the load is made visible (per partition
    #: where the source can count); checksum: also a content checksum computed by both databases
    #: (PostgreSQL on both sides); none
    verify: str = "count"
    #: conveyor verify: the key rows are matched by (default: the primary key), the differing keys named, and whether -0.0
    #: differs from 0.0 (distinct: a copy that lost a sign is a difference; equal: for a target that cannot hold -0.0, such as
    #: MySQL with sink.negative_zero=zero)
    verify_key: list[str] | None = None
    verify_keys: int = 20
    verify_zero: str = "distinct"
    #: the source's columns to load, in that order (null: all), and {source column: its name in the target}
    columns: list[str] | None = None
    rename: dict[str, str] = field(default_factory=dict)
    #: a previous run's directory: re-run only its partitions that did not finish (load_mode=append)
    resume: str | None = None
    #: free-form values that pipeline configs interpolate as ${vars.name} (a bucket, a glob, ...)
    vars: dict[str, Any] = field(default_factory=dict)
    #: incremental loads: incremental.cursor=<column> (combined with append or merge)
    incremental: IncrementalConfig = field(default_factory=IncrementalConfig)
    #: a sync that moves a whole database (pipeline=pg_migrate): its definitions, then the rows, then its indexes
    migrate: MigrateConfig = field(default_factory=MigrateConfig)


@dataclass(frozen=True)
class JobSpec:
    """A validated job: built plugins plus the job options."""

    source: Any
    sink: Any
    strategy: Any
    runtime: Any
    options: JobOptions
    names: dict[str, str]
    #: the job's incremental settings (a sync job's slot and its follow interval)
    incremental: IncrementalConfig = field(default_factory=IncrementalConfig)
    #: a whole-database migration's settings (``migrate.schema``: the sync moves the database's definitions too)
    migrate: MigrateConfig = field(default_factory=MigrateConfig)


#: the Hydra config group under which every plugin's dataclass defaults are registered
DEFAULTS_GROUP = "conveyor_defaults"


def _defaults_of(schema: type, skip: Iterable[str] = ()) -> dict[str, Any]:
    """A config dataclass's fields and defaults as a plain dict (``???`` where a value is required),
    as ``OmegaConf.to_container(OmegaConf.structured(schema))`` reads them (tests/unit/test_config.py
    checks every plugin's), from the dataclass's fields: every CLI run registers every installed
    plugin's, and OmegaConf's structured configs are slow at it (benchmarks/results/design-measurements.md)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(schema):
        if f.name in skip:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = _plain(f.default_factory())
        else:
            out[f.name] = "???"
    return out


def _plain(value: Any) -> Any:
    """A default as a config node holds it: dataclasses as dicts, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@functools.cache
def register_defaults() -> None:
    """Register the config dataclasses as the defaults the YAML extends: the dataclass is the one
    place a default is written. ``configs/config.yaml`` starts from ``conveyor_defaults/job`` and
    ``configs/<kind>/<name>.yaml`` from ``conveyor_defaults/<kind>/<name>``, so ``--cfg job`` shows
    every key with its value, and a pipeline can interpolate any of them. The nodes are plain
    dicts, not structured configs: validation stays in :func:`build_job` (with its messages, and
    the keys a pipeline sets for a sibling plugin). A plugin that does not load registers nothing;
    the job that names it reports why. Once per process: the installed plugins do not change under it."""
    from hydra.core.config_store import ConfigStore

    from conveyor.compat import config_store_group

    if not OmegaConf.has_resolver("conveyor_groups"):
        OmegaConf.register_new_resolver("conveyor_groups", _groups_help)
    store = ConfigStore.instance()
    store.store(group=DEFAULTS_GROUP, name="job", node=_defaults_of(JobConfig, skip=TOP_LEVEL_PLUGINS))
    groups = config_store_group(store, DEFAULTS_GROUP)
    for kind in TOP_LEVEL_PLUGINS:
        names = registry.names(kind)
        if isinstance(groups, dict):  # Hydra 1.3's store: each plugin's node made when a composition asks for it
            groups[kind] = _LazyDefaults(kind, names)
            continue
        for name in names:
            node = _plugin_defaults(kind, name)
            if node is not None:
                store.store(group=f"{DEFAULTS_GROUP}/{kind}", name=name, node=node)


def _plugin_defaults(kind: str, name: str) -> dict[str, Any] | None:
    """A plugin's defaults node, from its config dataclass (None: it does not load, or has none)."""
    try:
        schema = registry.load(kind, name).config_class
    except Exception:  # reported when a job names the plugin
        return None
    return {"type": name, **_defaults_of(schema)}


class _LazyDefaults(dict):  # type: ignore[type-arg]
    """``conveyor_defaults/<kind>`` in Hydra's ConfigStore, whose nodes are made the first time a
    composition looks one up (``name in group``, then ``group[name]``, as ConfigStore does): a run
    imports the plugins it names, not every installed one, and wraps four nodes, not 26 (registering
    them all cost every run time). Listed by name from the entry points; a plugin that
    does not load is, once asked for, not there (as when it was not registered)."""

    def __init__(self, kind: str, names: Iterable[str]) -> None:
        super().__init__({f"{name}.yaml": None for name in names})
        self.kind = kind

    def _made(self, key: Any) -> bool:
        if not dict.__contains__(self, key):
            return False
        if dict.__getitem__(self, key) is None:
            from hydra.core.config_store import ConfigNode

            name = str(key).removesuffix(".yaml")
            node = _plugin_defaults(self.kind, name)
            if node is None:
                dict.__delitem__(self, key)
                return False
            made = OmegaConf.create(node)
            for field, value in node.items():  # a map of the user's own keys (column_types, storage_options, ...) takes
                if isinstance(value, dict):  # new keys as written (Hydra's struct mode refused them without a +)
                    OmegaConf.set_struct(made[field], False)
            dict.__setitem__(self, key, ConfigNode(name=key, node=made, group=f"{DEFAULTS_GROUP}/{self.kind}",
                                                   package=None, provider=None))
        return True

    def __contains__(self, key: object) -> bool:
        return self._made(key)

    def __getitem__(self, key: Any) -> Any:
        if not self._made(key):
            raise KeyError(key)
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        return dict.__getitem__(self, key) if self._made(key) else default


def hydra_overrides(overrides: list[str]) -> list[str]:
    """What composing Conveyor's config needs first, for ``hydra.main`` and the compose API alike:
    the dataclass defaults registered (:func:`register_defaults`), and ``overrides`` with Hydra's
    search path extended by every installed plugin's config package (see
    :func:`conveyor.registry.config_packages`); a user's own ``hydra.searchpath`` wins."""
    register_defaults()
    packages = registry.config_packages()
    if not packages or any(o.lstrip("+~").startswith("hydra.searchpath") for o in overrides):
        return overrides
    return [f"hydra.searchpath=[{','.join('pkg://' + p for p in packages)}]", *overrides]


def _groups_help() -> str:
    """The config groups a user chooses from, for ``conveyor run --help``."""
    from importlib.resources import files

    lines = [f"{kind}: {', '.join(registry.names(kind))}" for kind in TOP_LEVEL_PLUGINS]
    pipelines = sorted(p.name.removesuffix(".yaml") for p in files("conveyor.configs").joinpath("pipeline").iterdir()
                       if p.name.endswith(".yaml"))
    return "\n".join([f"pipeline: {', '.join(pipelines)}", *lines])


def check_choice(value: str, choices: Iterable[str], key: str) -> str:
    """Raise a ConfigError naming ``key`` unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ConfigError(
            f"{key}: {value!r} is not one of {', '.join(choices)}", key=key, hint=f"set {key}=<one of {'|'.join(choices)}>"
        )
    return value


def _translate(exc: Exception, prefix: str) -> ConfigError:
    """An OmegaConf error as one ConfigError line with the full key path."""
    full_key = getattr(exc, "full_key", None) or getattr(exc, "key", None) or ""
    key = f"{prefix}.{full_key}" if prefix and full_key else (prefix or str(full_key))
    if isinstance(exc, oc_errors.ConfigKeyError):
        return ConfigError(f"{key}: unknown key", key=key, hint="check the spelling; `conveyor run --cfg job` prints the composed config")
    if isinstance(exc, oc_errors.MissingMandatoryValue):
        return ConfigError(f"{key}: a value is required", key=key, hint=f"set it in the YAML or on the command line: {key}=...")
    if isinstance(exc, oc_errors.InterpolationResolutionError):
        first = str(exc).splitlines()[0]
        if "Environment variable" in first:
            hint = "set the environment variable, or give ${oc.env:NAME,default} a default"
        elif (missing := re.search(r"Interpolation key '([^']+)' not found", first)) is not None:
            name = missing.group(1)
            hint = (f"define it: {name}=... on the command line, or under vars: in the YAML"
                    if name.startswith("vars.") else f"no key {name} in the config: check the spelling")
        else:
            hint = "check the ${...} expression"
        return ConfigError(f"{key + ': ' if key else ''}cannot resolve: {first}", key=key, hint=hint)
    value = getattr(exc, "value", None) if hasattr(exc, "value") else None
    first = str(exc).splitlines()[0]
    if "is not a ListConfig" in first:  # a single value where a list belongs
        shown = str(value).strip("'\"")
        return ConfigError(f"{key}: takes a list, and {shown} is one value", key=key,
                           hint=f"write it in brackets, quoted for the shell: '{key}=[{shown}]' (several: '{key}=[a,b]')")
    if value is not None:
        first = f"{value!r} is not valid: {first}"
    return ConfigError(f"{key}: {first}", key=key)


def to_dataclass(node: Any, schema: type, prefix: str) -> Any:
    """Merge ``node`` into ``schema``'s structured config and return the dataclass instance."""
    try:
        base = OmegaConf.structured(schema)
        merged = OmegaConf.merge(base, node if node is not None else {})
        obj = OmegaConf.to_object(merged)
    except oc_errors.OmegaConfBaseException as exc:
        raise _translate(exc, prefix) from None
    except ValueError as exc:  # raised by a dataclass __post_init__ check
        raise ConfigError(f"{prefix}: {exc}", key=prefix) from None
    return obj


def _plugin_node(cfg: DictConfig, kind: str) -> tuple[str, Any]:
    node = cfg.get(kind)
    if node is None or not isinstance(node, DictConfig):
        raise ConfigError(f"{kind}: no {kind} is configured", key=kind, hint=f"choose one: {kind}=<name>")
    name = node.get("type")
    if not name:
        raise ConfigError(f"{kind}.type: a value is required", key=f"{kind}.type", hint=f"`conveyor plugins` lists the {kind} plugins")
    rest = OmegaConf.masked_copy(node, [k for k in node.keys() if k != "type"])
    return str(name), rest


def build_plugin(kind: str, cfg: DictConfig, options: JobOptions) -> tuple[str, Any]:
    name, node = _plugin_node(cfg, kind)
    cls = registry.load(kind, name)
    schema = cls.config_class
    node = _without_siblings_keys(kind, name, node, schema)
    node = _many_tables_defaults(kind, cfg, node, schema)
    conf = to_dataclass(node, schema, kind)
    return name, cls(conf, options)


def _many_tables_defaults(kind: str, cfg: DictConfig, node: Any, schema: type) -> Any:
    """A job over several tables (``source.tables``): a pipeline's required ``source.table`` is not
    required then, and a sink that names no table loads each source table into the table of its
    own name (``sink.table='{table}'``)."""
    source = cfg.get("source")
    tables = source.get("tables") if isinstance(source, DictConfig) else None
    if not tables or not dataclasses.is_dataclass(schema) or "table" not in {f.name for f in dataclasses.fields(schema)}:
        return node
    if "table" not in node or OmegaConf.is_missing(node, "table"):
        node = OmegaConf.merge(node, {"table": "{table}" if kind == "sink" else None})
    return node


def _without_siblings_keys(kind: str, name: str, node: Any, schema: type) -> Any:
    """A pipeline sets keys of the plugins it chooses (``strategy.distribute_key`` for ctid's
    siblings, ``sink.database`` for duckdb); when the user switches the group (``strategy=none``,
    ``sink=parquet``) those keys belong to another plugin of the group, not to a typo. They are
    dropped, with a warning where a value was set; a key no plugin of the group knows stays an error."""
    own = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else set()
    foreign = [k for k in node.keys() if k not in own]
    if not foreign:
        return node
    siblings: set[str] = set()
    for other_name in registry.names(kind):
        if other_name == name:
            continue
        try:
            other = registry.load(kind, other_name).config_class
        except Exception:  # a sibling that does not load knows nothing here
            continue
        if other is not None and dataclasses.is_dataclass(other):
            siblings |= {f.name for f in dataclasses.fields(other)}
    dropped = [k for k in foreign if k in siblings]
    for key in dropped:
        if node.get(key) is not None:
            warn(f"{kind}.{key} is not a setting of {kind}={name}: ignored")
    return OmegaConf.masked_copy(node, [k for k in node.keys() if k not in dropped])


def refuse_secrets(config: Any, path: str = "") -> None:
    """A secret written into the config itself (a password, a token, a URI with its password) is refused
    by its key: Conveyor takes secrets from the environment or files (``password_env``, ``password_file``,
    ``${oc.env:VAR}``), which no file a run writes ever holds; a value in the config would travel with it."""
    from conveyor.secrets import is_secret_key

    if isinstance(config, dict):
        for k, v in config.items():
            key = f"{path}.{k}" if path else str(k)
            if k == "hydra":
                continue
            literal = isinstance(v, str) and v and not (v.startswith("${") and v.endswith("}"))
            if (literal or isinstance(v, (int, float)) and not isinstance(v, bool)) and is_secret_key(str(k)):
                raise ConfigError(f"{key}: a secret written into the config would be kept with it (in the run's files and the "
                                  "report's config)", key=key,
                                  hint=f"give it through the environment: {key}='${{oc.env:MY_VAR}}', or password_env / password_file "
                                       "(PGPASSWORD, MYSQL_PWD)")
            if literal and re.search(r"://[^:/@\s]+:[^@/\s]+@", v) and "${" not in v:
                raise ConfigError(f"{key}: the URI holds a password, which would be kept with the config", key=key,
                                  hint="write the password as ${oc.env:MY_VAR} inside the URI, or leave it out and use the driver's "
                                       "environment (PGPASSWORD)")
            refuse_secrets(v, key)
    elif isinstance(config, list):
        for i, v in enumerate(config):
            refuse_secrets(v, f"{path}[{i}]")


def build_job(cfg: DictConfig, run_id: str | None = None, kinds: tuple[str, ...] = TOP_LEVEL_PLUGINS,
              load_id: str | None = None) -> JobSpec:
    """Validate the composed config and build the plugins (all four by default), without connecting anywhere."""
    refuse_secrets(OmegaConf.to_container(cfg, resolve=False))
    try:
        OmegaConf.resolve(cfg)
    except oc_errors.OmegaConfBaseException as exc:
        raise _translate(exc, "") from None
    top = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k not in TOP_LEVEL_PLUGINS])
    job = to_dataclass(top, JobConfig, "")
    check_choice(job.load_mode, LOAD_MODES, "load_mode")
    check_choice(job.map_method, MAP_METHODS, "map_method")
    check_choice(job.schema_drift, SCHEMA_DRIFTS, "schema_drift")
    check_choice(job.verify, ("count", "checksum", "none"), "verify")
    if job.batch_size <= 0:
        raise ConfigError(f"batch_size: {job.batch_size} must be > 0", key="batch_size")
    if job.degree == 0:
        raise ConfigError("degree: 0 is not valid", key="degree", hint="N > 0 runs N tasks at once, N < 0 uses CPUs/|N|")
    if job.verify_keys < 0:
        raise ConfigError(f"verify_keys: {job.verify_keys} must be >= 0", key="verify_keys", hint="the keys conveyor verify names at most")
    for name in ("follow", "wait_timeout", "chunk_keys"):
        value = getattr(job.incremental, name)
        if value < 0 or (name == "chunk_keys" and value == 0):
            raise ConfigError(f"incremental.{name}: {value:g} must be {'> 0' if name == 'chunk_keys' else '>= 0'}", key=f"incremental.{name}",
                              hint={"follow": "seconds between the runs of a sync (0: one run)",
                                    "wait_timeout": "seconds a sync waits for the source's open transactions (0: as long as it takes)",
                                    "chunk_keys": "the changed keys one read takes at most"}[name])
    options = JobOptions(
        load_mode=job.load_mode,
        map_method=job.map_method,
        schema_drift=job.schema_drift,
        batch_size=job.batch_size,
        degree=job.degree,
        verify=job.verify,
        run_id=run_id or uuid.uuid4().hex[:12],
        load_id=load_id or "",
        cursor=job.incremental.cursor or None,
    )
    check_choice(job.incremental.method, ("cursor", "replication"), "incremental.method")
    if options.cursor and job.load_mode not in ("append", "merge"):
        raise ConfigError(f"incremental.cursor: load_mode={job.load_mode} replaces the target's rows, so each run would keep "
                          "only the rows past the last cursor", key="load_mode", hint="use load_mode=append or merge with incremental.cursor")
    built = {kind: build_plugin(kind, cfg, options) for kind in kinds}
    from conveyor.pipelines.columns import projected

    source = projected(built.get("source", (None, None))[1], job.columns, job.rename)  # the job's columns / rename, if any
    return JobSpec(source=source, sink=built.get("sink", (None, None))[1], strategy=built.get("strategy", (None, None))[1],
                   runtime=built.get("runtime", (None, None))[1], options=options, names={kind: built[kind][0] for kind in kinds},
                   incremental=job.incremental, migrate=job.migrate)
