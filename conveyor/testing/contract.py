"""The connector contract, as checks on one plugin object: what every source and sink must do.

The whole-job rules (each load mode, a resumed append, Ctrl-C mid-partition, a value too wide for
the target) are test classes to subclass in ``conveyor.testing.suites``; these checks are the finer
ones they build on, for a plugin under construction.

Registered as a pytest plugin (the ``pytest11`` entry point ``conveyor``): a connector package's
own tests get the ``conveyor_contract`` fixture without importing anything::

    def test_my_source_keeps_the_contract(conveyor_contract):
        source = MySource(MySourceConfig(path="..."), conveyor_contract.options)
        conveyor_contract.check_source(source, strategies={"none": {}, "rangeid": {"distribute_key": "id"}})

    def test_my_sink_keeps_the_contract(conveyor_contract):
        conveyor_contract.check_sink(lambda options: MySink(MySinkConfig(...), options), source)

``check_source`` plans each strategy with the real strategy plugin and checks that the partitions
cover the source exactly once (the rows of all partitions, as a multiset, are the rows of one
``strategy=none`` read), that source, partitions and schema pickle (a Ray worker gets them that
way), that every batch has the described schema, and that an error while reading is one of
Conveyor's (``conveyor.errors``), not a driver's. ``check_sink`` writes a partition whose batches
fail half way (the sink passes the source's error on or raises one of Conveyor's, and a
transactional sink leaves nothing), writes
it again, and checks the target holds each row once; with commit markers, a third write of the
same partition writes nothing. The kit moves real data through your connector: nothing is mocked.
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from conveyor import registry
from conveyor.core import (
    JobOptions,
    Partition,
    PartitionPlan,
    PlanRequest,
    PrepareRequest,
    SourceInfo,
    SupportsCommitMarkers,
    SupportsTargetCount,
    WholeSource,
    sink_capabilities,
)
from conveyor.errors import ConveyorError
from conveyor.runtime.task import close_batches, pass_through

__all__ = ["Contract", "ContractBroken", "conveyor_contract"]


class ContractBroken(AssertionError):
    """A connector does not keep Conveyor's contract; the message says which rule and where."""


class _Injected(RuntimeError):
    """The failure the kit injects into a write (a source that dies half way)."""


@dataclass
class Contract:
    """The checks, bound to the job options the connectors under test are built with."""

    options: JobOptions = field(default_factory=lambda: JobOptions(batch_size=1000, degree=2, run_id="contract"))

    # --- sources ---------------------------------------------------------------------------------

    def check_source(self, source: Any, strategies: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, list[Partition]]:
        """Plan ``strategies`` ({name: strategy config}) on ``source``; every plan covers it exactly once."""
        info = source.describe()
        _expect(isinstance(info, SourceInfo), f"describe() returned {type(info).__name__}, not a SourceInfo")
        _roundtrip(info.schema, "the described schema")
        plans: dict[str, list[Partition]] = {}
        with source.session() as shipped:
            _roundtrip(shipped, "the source")
            whole = self._rows(shipped, WholeSource(index=0, count=1), info)
            for name, params in (strategies or {"none": {}}).items():
                strategy = _strategy(name, params, self.options)
                planned = strategy.plan(PlanRequest(source=shipped, info=info, degree=self.options.degree))
                _expect(isinstance(planned, PartitionPlan), f"strategy {name}: plan() returned {type(planned).__name__}, not a PartitionPlan")
                parts = list(planned.partitions)
                _expect(bool(parts), f"strategy {name} planned no partitions")
                _expect([p.index for p in parts] == list(range(len(parts))), f"strategy {name}: partition indexes are not 0..n-1")
                _expect(len({p.key for p in parts}) == len(parts), f"strategy {name}: two partitions share a key")
                rows = []
                for part in parts:
                    _expect(_roundtrip(part, f"partition {part.key}") == part, f"partition {part.key} changes when pickled")
                    rows.append(self._rows(pickle.loads(pickle.dumps(shipped)), part, info))
                got = _concat(rows, info)
                _expect(got.num_rows == whole.num_rows,
                        f"strategy {name}: the partitions hold {got.num_rows} rows, the source {whole.num_rows}")
                _expect(_sorted(got).equals(_sorted(whole)), f"strategy {name}: the partitions do not hold the source's rows exactly once")
                plans[name] = parts
        return plans

    def _rows(self, source: Any, part: Partition, info: SourceInfo) -> Any:
        batches = []
        for batch in source.read(part):
            _expect(batch.schema.remove_metadata().equals(info.schema.remove_metadata()),
                    f"partition {part.key}: a batch's schema {batch.schema} is not the described {info.schema}")
            batches.append(batch)
        return _concat(batches, info)

    def check_read_error(self, source: Any, part: Partition) -> ConveyorError:
        """Reading ``part`` (one the source cannot read: a dropped table, a missing file) fails with
        one of Conveyor's errors, naming what is wrong, not with the driver's exception."""
        try:
            for _ in source.read(part):
                pass
        except ConveyorError as exc:
            _expect(bool(exc.message), "the error has no message")
            return exc
        except Exception as exc:
            raise ContractBroken(f"reading {part.key} raised {type(exc).__name__} ({exc}), not a conveyor.errors error") from exc
        raise ContractBroken(f"reading {part.key} did not fail")

    # --- sinks -----------------------------------------------------------------------------------

    def check_sink(self, make_sink: Callable[[JobOptions], Any], source: Any) -> int:
        """Load ``source`` (one partition) with ``load_mode=append`` through a failed and a retried
        write; returns the rows the target gained, which must be the source's, each once."""
        # each check is a load of its own (commit markers and file names are per load id)
        options = JobOptions(batch_size=self.options.batch_size, degree=1, run_id=f"contract-{uuid.uuid4().hex[:12]}",
                             load_mode="append")
        sink = make_sink(options)
        caps = sink_capabilities(sink)
        info = source.describe()
        part = WholeSource(index=0, count=1)
        with source.session() as shipped:
            plan = sink.prepare(PrepareRequest(schema=info.schema, info=info))
            plan = _roundtrip(plan, "the sink plan")
            before = sink.target_rows(plan) if isinstance(sink, SupportsTargetCount) else None
            expected = _rows_of(shipped, part)
            _expect(expected > 1, "check_sink needs a source of at least two rows")
            native = plan.native is not None
            if caps.transactional and not native:  # a native path reads no batches to fail in
                try:
                    sink.write(plan, part, _failing(shipped.read(part)))
                except (_Injected, ConveyorError):
                    pass  # the source's own error, passed on, or one of Conveyor's naming it
                except Exception as exc:
                    raise ContractBroken(f"a write whose source failed raised {type(exc).__name__} ({exc}): neither the "
                                         "source's error nor a conveyor.errors error") from exc
                else:
                    raise ContractBroken("a write whose source failed half way reported success")
            stats = _write(_roundtrip(sink, "the sink"), plan, shipped, part, native)
            _expect(stats.rows == expected, f"the write reported {stats.rows} rows, the source has {expected}")
            if isinstance(sink, SupportsCommitMarkers):
                again = _write(sink, plan, shipped, part, native)
                _expect(again.already_committed, "a partition written twice under one load id was written again")
            sink.finalize(plan, [stats])
            if before is None:
                return expected
            after = sink.target_rows(plan)
            _expect(after - before == expected, f"the target gained {after - before} rows, the source has {expected} "
                    "(a failed attempt left rows, or a retry duplicated them)")
            return after - before


def _write(sink: Any, plan: Any, source: Any, part: Partition, native: bool) -> Any:
    """One partition written as a task writes it: the native path the sink agreed on, or batches."""
    if native:
        return pass_through(source, sink, plan, part)
    batches = source.read(part)
    try:
        return sink.write(plan, part, batches)
    finally:
        close_batches(batches)  # the source's connection closes now, not when collected


def _failing(batches: Iterator[Any]) -> Iterator[Any]:
    """Half the source's first batch, then an error: a partition that dies half way."""
    try:
        for batch in batches:
            if batch.num_rows > 1:
                yield batch.slice(0, batch.num_rows // 2)
            raise _Injected("the source failed half way (injected by the contract kit)")
    finally:
        close_batches(batches)


def _rows_of(source: Any, part: Partition) -> int:
    batches = source.read(part)
    try:
        return sum(b.num_rows for b in batches)
    finally:
        close_batches(batches)


def _strategy(name: str, params: Mapping[str, Any], options: JobOptions) -> Any:
    cls = registry.load("strategy", name)
    return cls(cls.config_class(**params), options)


def _roundtrip(obj: Any, what: str) -> Any:
    try:
        return pickle.loads(pickle.dumps(obj))
    except Exception as exc:
        raise ContractBroken(f"{what} does not pickle ({type(exc).__name__}: {exc}): a Ray worker could not get it") from exc


def _concat(batches: list[Any], info: SourceInfo) -> Any:
    import pyarrow as pa

    tables = [b if isinstance(b, pa.Table) else pa.Table.from_batches([b]) for b in batches]
    if not tables:
        return info.schema.empty_table()
    return pa.concat_tables([t.replace_schema_metadata(None) for t in tables]).combine_chunks()


def _sorted(table: Any) -> Any:
    from conveyor.kit.arrowutil import without_views

    table = table.cast(without_views(table.schema))  # Arrow sorts no string_view / binary_view
    sortable = [n for n, t in zip(table.column_names, table.schema.types) if not _nested(t)]
    return table.sort_by([(n, "ascending") for n in sortable]) if sortable else table


def _nested(typ: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_nested(typ) or isinstance(typ, pa.BaseExtensionType))


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise ContractBroken(message)


@pytest.fixture
def conveyor_contract() -> Contract:
    """The contract checks for a connector's own tests (``conveyor.testing.contract``)."""
    return Contract()
