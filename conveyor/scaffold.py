"""``conveyor new connector NAME [--sink]``: a connector package that installs, runs and tests from the start.

It writes ``conveyor-NAME/`` with a pyproject declaring the plugin's entry points (the source, with
``--sink`` a sink too, and the config package Conveyor adds to Hydra's search path) and its test
dependencies, a config dataclass and the YAML that extends it for each, a source that already keeps
the contract (it yields a small key range: replace its body with your reads), with ``--sink`` a sink
that keeps it too (each partition an Arrow IPC file, written under a temporary name, its rows read
back from the file before it is renamed into place: replace it with your system's writes), and the
contract tests wired in through Conveyor's pytest kit.
"""

from __future__ import annotations

import keyword
from pathlib import Path

from conveyor import __version__
from conveyor.errors import ConfigError

_PYPROJECT = '''\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "conveyor-{dash}"
version = "0.1.0"
description = "A Conveyor connector: {name}"
requires-python = ">=3.10"
dependencies = ["conveyor>={version}", "pyarrow"]

[project.optional-dependencies]
# what its tests need: `pip install -e '.[test]'`, then `python -m pytest`
test = ["pytest>=8"]

# the plugin, by name: `conveyor run source={name} ...`
[project.entry-points."conveyor.sources"]
{name} = "conveyor_{name}.source:{cls}Source"
{sink_entry}
# its Hydra configs: Conveyor adds the package to the search path (no --config-dir)
[project.entry-points."conveyor.configs"]
{name} = "conveyor_{name}.configs"

[tool.setuptools]
packages = ["conveyor_{name}", "conveyor_{name}.configs"]

[tool.setuptools.package-data]
"conveyor_{name}.configs" = ["source/*.yaml", "sink/*.yaml"]

[tool.pytest.ini_options]
testpaths = ["tests"]
'''

_SOURCE = '''\
"""The {name} source. Replace the bodies of ``describe`` and ``read`` with your system's reads;
keep ``read`` returning Arrow batches made by Arrow (no Python loop per row), and map your
driver's errors onto conveyor.errors (ConnectError, SchemaError, TransferError) with a hint."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from conveyor.core import JobOptions, Partition, SourceBase, SourceInfo, WholeSource
from conveyor.errors import PlanningError

SCHEMA = pa.schema([("id", pa.int64())])


@dataclass
class {cls}SourceConfig:
    #: the defaults live here, once: configs/source/{name}.yaml extends this dataclass
    rows: int = 1000


class {cls}Source(SourceBase):
    config_class = {cls}SourceConfig

    def __init__(self, config: {cls}SourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def describe(self) -> SourceInfo:
        return SourceInfo(schema=SCHEMA, label="{name}", estimated_rows=self.config.rows)

    def read(self, part: Partition) -> Iterator[pa.RecordBatch]:
        if not isinstance(part, WholeSource):
            raise PlanningError(f"{name} source cannot read a {{part.kind}} partition", hint="use strategy=none")
        for lo in range(0, self.config.rows, self.options.batch_size):
            hi = min(lo + self.options.batch_size, self.config.rows)
            # lo..hi-1 made by Arrow compute (a cumulative sum of ones), not by a Python loop
            ids = pc.add(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), hi - lo)), lo - 1)
            yield pa.record_batch([ids], schema=SCHEMA)
'''

_YAML = '''\
# The {name} source. Its keys and defaults are {cls}SourceConfig's (conveyor_{name}/source.py);
# `conveyor run source={name} --cfg job` prints them.
defaults:
  - /conveyor_defaults/source/{name}@_here_
  - _self_
'''

_TEST = '''\
"""The connector contract, checked by Conveyor's kit (the conveyor_contract fixture is a pytest plugin)."""

from conveyor_{name}.source import {cls}Source, {cls}SourceConfig


def test_the_{name}_source_keeps_the_contract(conveyor_contract) -> None:
    source = {cls}Source({cls}SourceConfig(rows=25_000), conveyor_contract.options)
    conveyor_contract.check_source(source)


def test_a_sink_takes_the_{name}_rows_exactly_once(conveyor_contract, tmp_path) -> None:
    from conveyor import registry

    parquet = registry.load("sink", "parquet")
    source = {cls}Source({cls}SourceConfig(rows=10_000), conveyor_contract.options)
    written = conveyor_contract.check_sink(lambda options: parquet(parquet.config_class(path=str(tmp_path / "out")), options), source)
    assert written == 10_000
'''

_SINK = '''\
"""The {name} sink. Each partition is written all or nothing (here: an Arrow IPC file under a temporary
name, renamed when whole), and its rows are read back from what was stored before it is made final
(conveyor.core.check_stored): replace the bodies with your system's writes, in one transaction a
partition, and keep that check on what your system says it stored."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from conveyor.core import JobOptions, Partition, PrepareRequest, SinkBase, SinkCapabilities, SinkPlan, TargetInfo, WriteStats, check_stored
from conveyor.errors import SchemaError


@dataclass
class {cls}SinkConfig:
    #: the folder that receives one file per partition
    path: str = "???"


class {cls}Sink(SinkBase):
    config_class = {cls}SinkConfig
    capabilities = SinkCapabilities(transactional=True, load_modes=("append", "create"))

    def __init__(self, config: {cls}SinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def describe_target(self, request: PrepareRequest) -> TargetInfo:
        """While planning, read-only: what the target is and takes (here: files; a database says whether each
        partition's commit is final, its range partitions, a native format it imports as it is)."""
        return TargetInfo(label=f"{name} files in {{self.config.path}}", path="arrow: one Arrow IPC file per partition, renamed when whole")

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        """On the driver, once: check the target and decide how the tasks write."""
        if self.options.load_mode == "create" and os.path.isdir(self.config.path) and os.listdir(self.config.path):
            raise SchemaError(f"{name} sink: {{self.config.path}} is not empty", hint="use load_mode=append")
        os.makedirs(self.config.path, exist_ok=True)
        names = tuple(request.column_names)
        plan = SinkPlan(target=self.config.path, write_target=self.config.path, load_mode=self.options.load_mode,
                        columns=names, source_columns=names, schema=request.schema)
        # what the target held before, this load's own files aside (a resumed load writes them again):
        # verify=count compares the rows the target gained with the source's
        return dataclasses.replace(plan, rows_before=self._rows(plan, skip=f"{{self.options.load}}-"))

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[pa.RecordBatch]) -> WriteStats:
        """In a task: one partition, all or nothing. A write again of the same partition replaces its file."""
        start, sent, nbytes = time.perf_counter(), 0, 0
        final = os.path.join(plan.write_target, f"{{self.options.load}}-{{part.index:05d}}.arrow")
        temporary = f"{{final}}.tmp-{{self.options.run_id}}"
        try:
            with pa.OSFile(temporary, "wb") as out, pa.ipc.new_file(out, plan.schema) as writer:
                for batch in batches:
                    writer.write_batch(batch)
                    sent, nbytes = sent + batch.num_rows, nbytes + batch.nbytes
            with pa.memory_map(temporary) as stored:  # what the file holds, not what was sent
                check_stored(plan.target, part.key, sent, pa.ipc.open_file(stored).read_all().num_rows)
            os.replace(temporary, final)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
        return WriteStats(part.key, sent, nbytes, time.perf_counter() - start)

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        """On the driver, once every partition is written: make the load visible (here each file already is)."""

    def abort(self, plan: SinkPlan) -> None:
        """On the driver, after a failure: leave the target as it was (here: nothing half-written stays)."""

    def target_rows(self, plan: SinkPlan) -> int:
        """What the target holds (verify=count after the load)."""
        return self._rows(plan)

    def _rows(self, plan: SinkPlan, skip: str = "") -> int:
        files = [f for f in os.listdir(plan.write_target) if f.endswith(".arrow") and not (skip and f.startswith(skip))]
        return sum(pa.ipc.open_file(pa.memory_map(os.path.join(plan.write_target, f))).read_all().num_rows for f in files)
'''

_SINK_YAML = '''\
# The {name} sink. Its keys and defaults are {cls}SinkConfig's (conveyor_{name}/sink.py).
defaults:
  - /conveyor_defaults/sink/{name}@_here_
  - _self_
'''

_SINK_TEST = '''\


def test_the_{name}_sink_keeps_the_contract(conveyor_contract, tmp_path) -> None:
    from conveyor_{name}.sink import {cls}Sink, {cls}SinkConfig

    source = {cls}Source({cls}SourceConfig(rows=10_000), conveyor_contract.options)
    written = conveyor_contract.check_sink(lambda options: {cls}Sink({cls}SinkConfig(path=str(tmp_path / "out")), options), source)
    assert written == 10_000


from conveyor.testing.suites import SinkSuite  # noqa: E402  (the whole-job rules: each load mode, resume, Ctrl-C)


class Test{cls}SinkSuite(SinkSuite):
    """Real jobs into the {name} sink, read back from what it stored: see conveyor.testing.suites."""

    sink = "{name}"
    modes = ("create", "append")

    def sink_config(self, target):
        return {{"path": str(self.tmp / target)}}

    def create_target(self, target, rows, key):
        import pyarrow as pa

        (self.tmp / target).mkdir(parents=True)
        with pa.OSFile(str(self.tmp / target / "existing.arrow"), "wb") as out, pa.ipc.new_file(out, rows.schema) as writer:
            writer.write_table(rows)

    def read_target(self, target):
        import pyarrow as pa

        files = sorted((self.tmp / target).glob("*.arrow"))
        return pa.concat_tables([pa.ipc.open_file(pa.memory_map(str(f))).read_all() for f in files]) if files else None
'''

_README = '''\
# conveyor-{dash}

A [Conveyor](https://github.com/conveyor) source. Install it next to Conveyor and run it by name:

```bash
pip install -e '.[test]'
conveyor run source={name} source.rows=5000 strategy=none sink=parquet sink.path=out load_mode=create runtime=local
python -m pytest        # the contract tests (Conveyor's kit)
```

`conveyor_{name}/source.py` holds the config dataclass (the defaults) and the source; replace the
body of `read` with your system's reads. A sink is the same: a class with `config_class`,
`prepare`, `write`, `finalize` and `abort`, registered under `conveyor.sinks`.
'''


def new_connector(name: str, where: str = ".", sink: bool = False) -> str:
    """Write ``<where>/conveyor-<name>/`` (with ``sink``: a sink too) and return what to do next."""
    if not name.isidentifier() or keyword.iskeyword(name) or name != name.lower():
        raise ConfigError(f"connector name {name!r} must be a lowercase Python identifier", key="name", hint="e.g. conveyor new connector mysource")
    root = Path(where) / f"conveyor-{name.replace('_', '-')}"
    if root.exists():
        raise ConfigError(f"{root} already exists", key="--dir", hint="choose another name or --dir")
    cls = "".join(p.title() for p in name.split("_"))
    sink_entry = f'\n[project.entry-points."conveyor.sinks"]\n{name} = "conveyor_{name}.sink:{cls}Sink"\n' if sink else ""
    fields = {"name": name, "dash": name.replace("_", "-"), "cls": cls, "version": __version__, "sink_entry": sink_entry}
    files = {
        "pyproject.toml": _PYPROJECT, "README.md": _README, f"conveyor_{name}/__init__.py": '"""A Conveyor connector: {name}."""\n',
        f"conveyor_{name}/source.py": _SOURCE, f"conveyor_{name}/configs/__init__.py": "",
        f"conveyor_{name}/configs/source/{name}.yaml": _YAML, "tests/test_contract.py": _TEST + (_SINK_TEST if sink else ""),
    }
    if sink:
        files.update({f"conveyor_{name}/sink.py": _SINK, f"conveyor_{name}/configs/sink/{name}.yaml": _SINK_YAML})
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(**fields))
    return (f"created {root}\nnext: cd {root} && pip install -e '.[test]' && python -m pytest\n"
            f"then: conveyor run source={name} strategy=none sink=parquet sink.path=out load_mode=create runtime=local")


def new_job(path: str, overrides: list[str], force: bool = False) -> str:
    """``conveyor init``: the job the overrides compose, written as a YAML of the user's own (every key
    explicit, the plugin groups chosen in its defaults list); what to type to run it."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from conveyor.errors import ConfigError
    from conveyor.submit import compose

    target = Path(path)
    if target.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"conveyor init: {path} is not a .yaml file", hint="name it like jobs/nightly.yaml")
    if target.exists() and not force:
        raise ConfigError(f"conveyor init: {path} exists", hint="--force replaces it")
    cfg = OmegaConf.to_container(compose(overrides), resolve=False)
    assert isinstance(cfg, dict)
    cfg.pop("hydra", None)
    cfg.pop("pipeline", None)
    groups = [f"  - override /{kind}: {cfg[kind]['type']}" for kind in ("source", "sink", "strategy", "runtime")
              if isinstance(cfg.get(kind), dict) and cfg[kind].get("type")]
    run = f"conveyor run --config-dir {target.parent or '.'} --config-name {target.stem}"
    text = (f"# A Conveyor job ({' '.join(overrides) or 'the defaults'}), written by conveyor init.\n"
            f"# Run it:   {run}   (any key can still be overridden after it)\n"
            "# Passwords never go here: password_env / password_file name where they come from.\n"
            "defaults:\n  - config\n" + "\n".join(groups) + "\n  - _self_\n\n" + OmegaConf.to_yaml(OmegaConf.create(cfg)))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return f"wrote {target}: run it with `{run}`"
