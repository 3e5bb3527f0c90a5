"""``conveyor new connector NAME``: a connector package that installs, runs and tests from the start.

It writes ``conveyor-NAME/`` with a pyproject declaring the plugin's entry points (the source, and
the config package Conveyor adds to Hydra's search path), a config dataclass and the YAML that
extends it, a source that already keeps the contract (it yields a small key range: replace its
body with your reads), and the contract tests wired in through Conveyor's pytest kit.
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
description = "A Conveyor source: {name}"
requires-python = ">=3.10"
dependencies = ["conveyor>={version}", "pyarrow"]

# the plugin, by name: `conveyor run source={name} ...`
[project.entry-points."conveyor.sources"]
{name} = "conveyor_{name}.source:{cls}Source"

# its Hydra configs: Conveyor adds the package to the search path (no --config-dir)
[project.entry-points."conveyor.configs"]
{name} = "conveyor_{name}.configs"

[tool.setuptools]
packages = ["conveyor_{name}", "conveyor_{name}.configs"]

[tool.setuptools.package-data]
"conveyor_{name}.configs" = ["source/*.yaml"]

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

from conveyor.core import JobOptions, Partition, SourceInfo, WholeSource
from conveyor.errors import PlanningError

SCHEMA = pa.schema([("id", pa.int64())])


@dataclass
class {cls}SourceConfig:
    #: the defaults live here, once: configs/source/{name}.yaml extends this dataclass
    rows: int = 1000


class {cls}Source:
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

_README = '''\
# conveyor-{dash}

A [Conveyor](https://github.com/conveyor) source. Install it next to Conveyor and run it by name:

```bash
pip install -e .
conveyor run source={name} source.rows=5000 strategy=none sink=parquet sink.path=out load_mode=create runtime=local
python -m pytest        # the contract tests (Conveyor's kit)
```

`conveyor_{name}/source.py` holds the config dataclass (the defaults) and the source; replace the
body of `read` with your system's reads. A sink is the same: a class with `config_class`,
`prepare`, `write`, `finalize` and `abort`, registered under `conveyor.sinks`.
'''


def new_connector(name: str, where: str = ".") -> str:
    """Write ``<where>/conveyor-<name>/`` and return what to do next."""
    if not name.isidentifier() or keyword.iskeyword(name) or name != name.lower():
        raise ConfigError(f"connector name {name!r} must be a lowercase Python identifier", key="name", hint="e.g. conveyor new connector mysource")
    root = Path(where) / f"conveyor-{name.replace('_', '-')}"
    if root.exists():
        raise ConfigError(f"{root} already exists", key="--dir", hint="choose another name or --dir")
    fields = {"name": name, "dash": name.replace("_", "-"), "cls": "".join(p.title() for p in name.split("_")),
              "version": __version__}
    files = {
        "pyproject.toml": _PYPROJECT, "README.md": _README, f"conveyor_{name}/__init__.py": '"""A Conveyor source: {name}."""\n',
        f"conveyor_{name}/source.py": _SOURCE, f"conveyor_{name}/configs/__init__.py": "",
        f"conveyor_{name}/configs/source/{name}.yaml": _YAML, "tests/test_contract.py": _TEST,
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(**fields))
    return (f"created {root}\nnext: cd {root} && pip install -e . && python -m pytest\n"
            f"then: conveyor run source={name} strategy=none sink=parquet sink.path=out load_mode=create runtime=local")
