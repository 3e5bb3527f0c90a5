"""Conveyor inside Ray Data: a source with its strategy as a ``Datasource``, a sink as an exactly-once ``Datasink``.

    import conveyor.ray_data as crd

    with crd.reading(source={"type": "postgres", "table": "orders", "port": 5432}, degree=4) as ds:
        ds = ds.map_batches(add_tax, batch_format="pyarrow")
        report = crd.write(ds, sink={"type": "postgres", "table": "orders_taxed"}, load_mode="create")
    print(report.rows, report.verification.ok)

A job's config is given as ``conveyor.run`` takes it (a pipeline's name, overrides as strings, nested values as
keywords): :func:`read` takes the ``source``, ``strategy``, ``degree``, ``columns``/``rename`` and ``batch_size`` of
it, :func:`write` the ``sink``, ``load_mode``, ``verify`` and the other job keys a sink reads.

Reading: one Ray Data read task per Conveyor partition, planned when :func:`read` is called; every task reads the
source's one snapshot where it has one (PostgreSQL: the snapshot exported by a transaction :func:`read` holds open
until :func:`reading`'s block ends, or the Dataset is collected). Blocks are the source's Arrow batches, with its
schema (``numeric(15,2)`` is ``decimal128(15, 2)``).

Writing: the sink is prepared on the driver when the first block is ready (``on_write_start``: staging tables made,
the target checked); each write task is one partition of the load, committed once with the sink's commit marker (a
task Ray retries after its worker died finds the marker of an attempt that committed and writes nothing again); the
target's count is checked against the rows Ray Data handed the writes before the load is made visible
(``on_write_complete``: finalize), and a failed pipeline aborts the load (truncate, create, replace: the target is as
it was; append: whole partitions only, and the error says how many rows stayed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from conveyor.core import (
    Agreement,
    Counting,
    Expected,
    Partition,
    PrepareRequest,
    SinkPlan,
    SourceInfo,
    SupportsTargetCount,
    WriteStats,
    sink_capabilities,
)
from conveyor.errors import ConfigError, ConveyorError, TransferError, VerificationError, missing_extra
from conveyor.pipelines.verify import Verification

try:
    import pyarrow as pa
    from ray.data import Datasink as _RayDatasink
    from ray.data import Datasource as _RayDatasource
    from ray.data import ReadTask
    from ray.data.block import BlockAccessor, BlockMetadata
except ModuleNotFoundError as _exc:  # pragma: no cover - an environment without the extra
    raise (missing_extra(_exc) or _exc) from None

__all__ = ["read", "reading", "write", "ConveyorDatasource", "ConveyorDatasink", "WriteReport"]

#: what a write task takes at least before it writes (Ray Data gathers its input blocks up to this): a partition's
#: transaction is not paid per small block
MIN_BYTES_PER_WRITE = 64 * 1024 * 1024


# --- reading ------------------------------------------------------------------------------------------------------


class ConveyorDatasource(_RayDatasource):
    """A Conveyor source, split by its strategy, as a Ray Data datasource: one read task per partition. Made by
    :func:`read`; the plan (and the source's snapshot, which ``held`` keeps open) is taken when it is made."""

    def __init__(self, source: Any, info: SourceInfo, partitions: Sequence[Partition], label: str, held: Any = None) -> None:
        super().__init__()
        self._source, self._info, self._partitions, self._label = source, info, list(partitions), label
        self._held = held  # the session (snapshot) the reads need, closed with it

    def get_name(self) -> str:
        return f"Conveyor({self._label})"

    def estimate_inmemory_data_size(self) -> int | None:
        return self._info.estimated_bytes

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema every block has: the source's."""
        return self._info.schema

    @property
    def partitions(self) -> list[Partition]:
        """The partitions the strategy planned: one read task each."""
        return list(self._partitions)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None) -> list[ReadTask]:
        """One read task per partition (Ray Data's ``parallelism`` is the strategy's to decide: ``degree``)."""
        if self._held is not None and not self._held.holds:
            raise ConfigError(f"{self._label}: the source's snapshot was closed when crd.reading's block ended, and the Dataset "
                              "is read after it", hint="consume the Dataset inside `with crd.reading(...)`, or use crd.read (it holds "
                                                       "the snapshot while the Dataset lives)")
        schema, each = self._info.schema, None
        if self._info.estimated_bytes:
            each = int(self._info.estimated_bytes / max(len(self._partitions), 1))
        tasks = []
        for part in self._partitions:
            # no row count: Ray Data takes the read tasks' num_rows as exact (ds.count() answers with their sum, reading
            # nothing), and a partition's is the planner's estimate; the bytes are an estimate to Ray Data too
            meta = BlockMetadata(num_rows=None, size_bytes=each, input_files=None, exec_stats=None)
            tasks.append(ReadTask(_reader(self._source, part, schema), meta, schema=schema, per_task_row_limit=per_task_row_limit))
        return tasks


def _reader(source: Any, part: Partition, schema: pa.Schema) -> Any:
    """A read task's function: the partition's batches as Arrow tables of the source's schema (what travels to a
    worker is the source, which reads in the job's snapshot, and the partition)."""

    def read_partition() -> Iterator[pa.Table]:
        from conveyor.runtime.task import close_batches

        batches = source.read(part)
        try:
            for batch in batches:
                yield pa.Table.from_batches([batch], schema=schema)
        except ConveyorError:
            raise
        except Exception as exc:  # a connector's error, as the job would say it (and picklable back to the driver)
            from conveyor.runtime.task import _as_conveyor_error

            raise _as_conveyor_error(exc, part.key) from None
        finally:
            close_batches(batches)

    read_partition.__name__ = f"read_{part.key.replace('/', '_').replace('-', '_')}"
    return read_partition


def read(pipeline: str | None = None, *overrides: str, ray_remote_args: dict[str, Any] | None = None, **config: Any) -> Any:
    """A ``ray.data.Dataset`` of the job's source (as ``conveyor.run`` composes it): its partitions planned now, in
    the source's snapshot, one read task each. The snapshot is held open until the Dataset is garbage-collected or
    the process ends; :func:`reading` closes it when its block ends."""

    source = datasource(pipeline, *overrides, **config)
    return _dataset(source, ray_remote_args)


@contextlib.contextmanager
def reading(pipeline: str | None = None, *overrides: str, ray_remote_args: dict[str, Any] | None = None, **config: Any) -> Iterator[Any]:
    """:func:`read`, with the source's snapshot closed when the block ends (the Dataset must be consumed inside it)."""

    source = datasource(pipeline, *overrides, **config)
    try:
        yield _dataset(source, ray_remote_args)
    finally:
        if source._held is not None:
            source._held.close()


def _dataset(source: ConveyorDatasource, ray_remote_args: dict[str, Any] | None) -> Any:
    """The Dataset of the datasource's read tasks, one block stream each: Ray Data's parallelism set to their number, so
    it does not split each task's output into sub-blocks (which a write fused into the read would commit one by one)."""
    import ray.data

    return ray.data.read_datasource(source, override_num_blocks=len(source.partitions), ray_remote_args=ray_remote_args or {})


def datasource(pipeline: str | None = None, *overrides: str, **config: Any) -> ConveyorDatasource:
    """The :class:`ConveyorDatasource` of the job's source and strategy, planned now (its snapshot held)."""
    from conveyor.api import compose
    from conveyor.config import build_job
    from conveyor.pipelines.plan import plan_one

    spec = build_job(compose(pipeline, *overrides, **config), kinds=("source", "strategy"))
    if spec.options.cursor or spec.incremental.method == "replication":
        raise ConfigError("incremental: a Ray Data read takes every row of its source", key="incremental",
                          hint="leave incremental unset (conveyor run does incremental loads and sync)")
    if spec.source.many():
        raise ConfigError("source.tables: a Ray Data read takes one table", key="source.tables",
                          hint="read each table into a Dataset of its own (source.table=...)")
    degree = _degree(spec.options.degree)
    info = spec.source.describe()
    held = _Held()
    try:
        source = held.enter(spec.source.session())
        plan = plan_one(dataclasses.replace(spec, options=dataclasses.replace(spec.options, degree=degree)), info, source)
    except BaseException:
        held.close()
        raise
    made = ConveyorDatasource(source, info, plan.partitions, info.label, held if held.holds else None)
    if held.holds:
        weakref.finalize(made, held.close)
    return made


def _degree(degree: int) -> int:
    """``degree`` resolved against the Ray cluster's CPUs (N < 0: CPUs / |N|)."""
    if degree > 0:
        return degree
    import ray

    from conveyor.core import JobOptions

    cpus = int(ray.cluster_resources().get("CPU", 0)) if ray.is_initialized() else None
    return JobOptions.resolve_degree(degree, cpus)


class _Held:
    """A source's session kept open past the call that opened it (closed once)."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self.holds = False

    def enter(self, session: Any) -> Any:
        source = self._stack.enter_context(session)
        self.holds = not isinstance(session, contextlib.nullcontext)
        return source

    def close(self) -> None:
        self._stack.close()
        self.holds = False

    def __reduce__(self) -> Any:  # a copy of the datasource travelling somewhere holds nothing
        return _Held, ()


# --- writing ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WritePart(Partition):
    """The rows one Ray Data write task writes: a partition of the load, keyed by the task's index (a task that Ray
    retries has the same index and the same input blocks, so its commit marker is the one an earlier attempt left)."""

    kind: ClassVar[str] = "raydata"

    def describe(self) -> str:
        return f"Ray Data write task {self.index}"


@dataclass
class WriteReport:
    """What a Ray Data write did: the target, the rows its partitions committed (as the target counted them),
    the verification and where the seconds went."""

    target: str = ""
    load_mode: str = ""
    partitions: list[WriteStats] = field(default_factory=list)
    verification: Verification | None = None
    seconds: float = 0.0
    #: the rows Ray Data handed the write tasks
    handed: int = 0

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.partitions)

    @property
    def ok(self) -> bool:
        return self.verification is None or self.verification.ok


class ConveyorDatasink(_RayDatasink):
    """A Conveyor sink as a Ray Data datasink (made by :func:`datasink`; :func:`write` runs it)."""

    def __init__(self, spec: Any, min_bytes_per_write: int | None = None, schema: pa.Schema | None = None) -> None:
        self._spec, self._min_bytes, self._schema = spec, min_bytes_per_write, schema
        self._plan: SinkPlan | None = None
        self._start = 0.0
        self.report = WriteReport(load_mode=spec.options.load_mode)

    def get_name(self) -> str:
        return f"Conveyor({self._spec.names['sink']})"

    @property
    def min_bytes_per_write(self) -> int | None:
        """Where the Dataset's schema is not known before it runs, the write is an operator of its own (set, Ray Data
        does not fuse it with the steps before it): its first input's schema is then the Dataset's, what
        ``on_write_start`` prepares the sink with, and each task's transaction holds this much at least. Where the
        schema is known (given), the write may run in the read's own tasks: one partition read and written in one
        task, no block through the object store."""
        if self._min_bytes is not None:
            return self._min_bytes
        return None if self._schema is not None else MIN_BYTES_PER_WRITE

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        """The sink prepared on the driver for rows of ``schema`` (the first block's): the target checked, a
        staging table made for truncate / create / replace."""
        self._start = time.perf_counter()
        if self._schema is not None:  # known before the Dataset ran (the first input of a fused write is the read's task)
            schema = self._schema
        if schema is None:
            raise ConfigError("the Dataset's blocks have no schema Conveyor can load", hint="give the write Arrow or pandas blocks")
        self._plan = _prepared(self._spec, schema)
        self.report.target = self._plan.target

    def write(self, blocks: Iterable[Any], ctx: Any) -> WriteStats:
        """One write task: its blocks as one partition of the load, committed once (its commit marker)."""
        plan = self._plan
        if plan is None:
            raise TransferError("the Conveyor datasink wrote before on_write_start prepared it")
        part = WritePart(index=int(ctx.task_idx), count=0)
        handed = _Handed(blocks, plan.schema)
        # the sink checks, before its commit, the rows the target stored against the rows it was handed
        checking = dataclasses.replace(plan, expecting=Expected.from_read(handed, lambda: handed.sent)
                                       if plan.counting == Counting.READ else None)
        try:
            stats = self._spec.sink.write(checking, part, handed)
        except ConveyorError:
            raise
        except Exception as exc:
            from conveyor.runtime.task import _as_conveyor_error

            raise _as_conveyor_error(exc, part.key) from None
        return stats

    def on_write_complete(self, write_result: Any) -> None:
        """Every task committed: the target's count checked against the rows Ray Data handed the writes, then the
        load made visible (``finalize``); a failed check aborts it."""
        if self._plan is None:  # no block reached the write (an empty Dataset): nothing was prepared or written
            self.report.verification = Verification(self._spec.options.verify, 0, notes=["the Dataset had no blocks: nothing written"])
            return
        stats = [s for s in write_result.write_returns if isinstance(s, WriteStats)]
        self.report.partitions, self.report.handed = stats, int(write_result.num_rows)
        try:
            self.report.verification = _verified(self._spec, self._plan, stats, self.report.handed)
            if not self.report.verification.ok:
                raise VerificationError(f"verification failed for {self._plan.target}: {'; '.join(self.report.verification.mismatched)}",
                                        hint="the load was not made visible" if self._plan.load_mode != "append" else
                                        "the committed partitions stay in the target (append)")
            self._spec.sink.finalize(self._plan, stats)
        except BaseException:
            _abort(self._spec.sink, self._plan)
            raise
        finally:
            self.report.seconds = time.perf_counter() - self._start

    def on_write_failed(self, error: Exception) -> None:
        """A failed pipeline: the load aborted (staged modes leave the target as it was)."""
        if self._plan is not None:
            _abort(self._spec.sink, self._plan)
            if self._plan.load_mode == "append" and isinstance(error, ConveyorError):
                with contextlib.suppress(Exception):
                    _say_what_stayed(error, self._spec.sink, self._plan)


class _Handed:
    """A write task's blocks as the sink's Arrow batches, in the prepared schema, counted as they go (``sent``, set
    at their end: what :class:`Expected` checks the target's count against)."""

    def __init__(self, blocks: Iterable[Any], schema: pa.Schema) -> None:
        self.sent: int | None = None
        self._blocks, self._schema = blocks, schema

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        rows = 0
        for block in self._blocks:
            table = BlockAccessor.for_block(block).to_arrow()
            if table.num_rows == 0:  # an empty block (a filter's) may have no columns at all
                continue
            table = _conformed(table, self._schema)
            for batch in table.to_batches():
                rows += batch.num_rows
                yield batch
        self.sent = rows


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A block in the schema the sink was prepared for: the same columns, each of its type or cast to it where the
    cast changes no value (Arrow's safe cast); anything else refused, naming the column."""
    if table.schema.equals(schema):
        return table
    if table.column_names != schema.names:
        raise TransferError(f"a block's columns ({', '.join(table.column_names)}) are not those the write was prepared for "
                            f"({', '.join(schema.names)})", hint="every block of the Dataset must have the same columns, in the same order")
    columns = []
    for name, column, want in zip(schema.names, table.columns, schema.types):
        if column.type == want:
            columns.append(column)
            continue
        try:
            columns.append(column.cast(want, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TransferError(f"column {name}: a block holds {column.type}, the write was prepared for {want}, and the cast "
                                f"would change values ({str(exc).splitlines()[0]})",
                                hint="make every block of that column one type (e.g. in map_batches)") from None
    return pa.Table.from_arrays(columns, schema=schema)


def _prepared(spec: Any, schema: pa.Schema) -> SinkPlan:
    """The sink's plan for a load of rows of ``schema`` (whose source is a Dataset: no native format, no source
    count but the rows handed to the writes)."""
    sink, options = spec.sink, spec.options
    info = SourceInfo(schema=schema, label="a Ray Data Dataset")
    target = sink.describe_target(PrepareRequest(schema=schema, info=info))
    if target.refused:
        raise ConfigError(target.refused.format(partitions="several"), key=target.refused_key or None, hint=target.refused_hint or None)
    checks = target.checks_before_commit
    counting = Counting.NONE if options.verify == "none" else Counting.READ if checks else Counting.AFTER
    agreed = Agreement(checks_before_commit=checks, counting=counting, path=target.path or "arrow")
    made = sink.prepare(PrepareRequest(schema=schema, info=info, agreement=agreed))
    return dataclasses.replace(made, checks_before_commit=checks, counting=counting, path=agreed.path)


def _verified(spec: Any, plan: SinkPlan, stats: Sequence[WriteStats], handed: int) -> Verification:
    """Before the load is made visible: the rows the partitions committed (as the target counted them) and the rows
    the target now holds against the rows Ray Data handed the write tasks."""
    out = Verification(spec.options.verify, source_rows=handed, written_rows=sum(s.rows for s in stats))
    if spec.options.verify == "none":
        out.notes.append("not verified (verify=none)")
        return out
    if out.written_rows != handed:
        out.mismatched.append(f"the write tasks committed {out.written_rows:,} rows, Ray Data handed them {handed:,}")
    sink = spec.sink
    if isinstance(sink, SupportsTargetCount) and plan.rows_before is not None:
        held = sink.target_rows(plan)
        if held is not None:
            out.target_rows = held
            if held - plan.rows_before != handed:
                before = f" ({plan.rows_before:,} before the load)" if plan.rows_before else ""
                out.mismatched.append(f"the target holds {held:,} rows{before}, not the {handed:,} handed to the writes")
    elif plan.checks_before_commit:
        out.notes.append("each partition's rows checked in the target before its commit")
    return out


def _abort(sink: Any, plan: SinkPlan) -> None:
    with contextlib.suppress(Exception):  # the original error matters more; abort is best effort
        sink.abort(plan)


def _say_what_stayed(error: ConveyorError, sink: Any, plan: SinkPlan) -> None:
    """An append that failed: the partitions that committed stay (each whole); the error says how many rows."""
    from conveyor.core import SupportsCommitMarkers

    marked = sink.committed(plan) if isinstance(sink, SupportsCommitMarkers) else None
    if marked is None:
        return
    stayed = f"{len(marked)} partition(s) had committed: their {sum(marked.values()):,} rows stay in the target"
    error.message = f"{error.message} ({stayed})"
    error.args = (error.message,)


def datasink(pipeline: str | None = None, *overrides: str, min_bytes_per_write: int | None = None, schema: pa.Schema | None = None,
             **config: Any) -> ConveyorDatasink:
    """The :class:`ConveyorDatasink` of the job's sink (as ``conveyor.run`` composes it), for ``ds.write_datasink``. Give
    ``schema`` where the Dataset's is known before it runs (``ds.schema(fetch_if_missing=False)``): the write may then
    run in the tasks of the steps before it."""
    from conveyor.api import compose
    from conveyor.config import build_job

    spec = build_job(compose(pipeline, *overrides, **config), kinds=("sink",))
    modes = sink_capabilities(spec.sink).load_modes
    if spec.options.load_mode not in modes:
        raise ConfigError(f"load_mode={spec.options.load_mode}: sink {spec.names['sink']} does not do it", key="load_mode",
                          hint=f"its load modes: {', '.join(modes)}")
    if spec.options.cursor or spec.incremental.method == "replication":
        raise ConfigError("incremental: a Ray Data write loads the rows of its Dataset", key="incremental", hint="leave incremental unset")
    if not sink_capabilities(spec.sink).transactional:
        raise ConfigError(f"sink {spec.names['sink']}: its partitions are not written all or nothing, so a write task Ray retries "
                          "could write its rows twice", key="sink", hint="write to a sink that commits each partition once")
    return ConveyorDatasink(spec, min_bytes_per_write, schema)


def write(ds: Any, pipeline: str | None = None, *overrides: str, min_bytes_per_write: int | None = None,
          concurrency: int | None = None, **config: Any) -> WriteReport:
    """Write the Dataset into the job's sink, exactly once per write task; the :class:`WriteReport`. A failure
    raises what stopped it after aborting the load. Where the Dataset's schema is known before it runs (a Conveyor
    read, nothing after it that changes columns), each partition is read and written in one task."""
    known = ds.schema(fetch_if_missing=False)
    known = getattr(known, "base_schema", known)
    sink = datasink(pipeline, *overrides, min_bytes_per_write=min_bytes_per_write,
                    schema=known if isinstance(known, pa.Schema) else None, **config)
    try:
        ds.write_datasink(sink, concurrency=concurrency)
    except Exception as exc:
        cause = _conveyor_cause(exc)
        if cause is None:
            raise
        raise cause from None  # the task's own error (Ray's wrapper adds the worker's traceback to its message)
    return sink.report


def _conveyor_cause(exc: BaseException) -> ConveyorError | None:
    """The ConveyorError a write task raised, out of the Ray error that carried it back (None: not one)."""
    seen = 0
    while exc is not None and seen < 10:
        cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError: the task's exception
        if isinstance(cause, ConveyorError):
            return cause
        if isinstance(exc, ConveyorError) and type(exc).__module__.startswith("conveyor"):
            return exc
        exc, seen = cause if isinstance(cause, BaseException) else exc.__cause__, seen + 1
    return None
