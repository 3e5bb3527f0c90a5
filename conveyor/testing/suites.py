"""The contract as test suites: classes a connector's test module subclasses, one test per rule.

Each suite runs real jobs through Conveyor (``conveyor.pipelines.run.run``, as ``conveyor run``
does: config, plan, tasks, verification, report, manifest) between your connector and the kit's
own data, and reads back what your target stored::

    from conveyor.testing.suites import SinkSuite

    class TestMySink(SinkSuite):
        sink = "mydb"                                      # the plugin's name
        modes = ("append", "truncate", "replace", "create")

        def sink_config(self, target):                     # sink.* keys aimed at ``target``
            return {"url": URL, "table": target}

        def create_target(self, target, rows, key):        # a table (id, name, x) holding ``rows``
            ...

        def read_target(self, target):                     # what it holds (None: no such table)
            ...

The rows are ``id`` (int64), ``name`` (string) and ``x`` (float64), in three partitions
(``strategy=files`` over three Parquet files). :class:`SinkSuite` checks each load mode it lists
(``create``, ``append``, ``truncate``, ``replace``, ``merge``): the target ends holding exactly the
rows the mode promises, each once; that a resumed append whose manifest lost its lines (a driver
killed between its commits and their journal) loads nothing twice (``resumes``); that a Ctrl-C
in the middle of a partition leaves only whole partitions (the flag SIGINT sets, raised from the
first batch written); and, where ``narrow_target`` makes a column too narrow for the kit's values,
that the run fails naming that column, leaving whole partitions only. :class:`SourceSuite` checks
that every strategy it lists covers your source exactly once (``conveyor.testing.contract``) and
that a job from your source into Parquet copies every value exactly.

:class:`ChangeApplySuite` checks a sink that is a sync's target (a
:class:`~conveyor.core.changes.ChangeApplier`): the kit's rows loaded by ``create``, a position recorded,
then changes staged through the sink's own write (``stage_sink``) and applied (``apply_changes``):
updates, inserts and deletes exactly, a key moved, a re-apply of the same changes idempotent, the
position recorded with the apply, a second apply that began from a position the target no longer
holds refused with the target unchanged, and (where ``touch_other_rows`` can make the target's own
trigger or foreign key action change rows the changes do not name) that apply refused by name.

Each test gets pytest's ``tmp_path``; target names are unique per test. Nothing is mocked.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.core import Progress, TaskResult, request_cancel, reset_cancel
from conveyor.errors import JobFailed

__all__ = ["ChangeApplySuite", "SinkSuite", "SourceSuite", "ROWS", "SCHEMA", "kit_rows", "lose_manifest_lines"]

#: the kit's rows: three partitions of these sizes
PARTS = (1700, 1700, 1600)
ROWS = sum(PARTS)
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("x", pa.float64())])


def kit_rows(start: int = 0, count: int = ROWS, name: str = "n") -> pa.Table:
    """``count`` rows from ``id`` = ``start``: names of at most 3 characters (``n`` and id % 97), x = id / 2."""
    ids = pa.array(range(start, start + count), pa.int64())
    return pa.table({"id": ids, "name": pa.array([f"{name}{i % 97}"[:3] for i in range(start, start + count)], pa.string()),
                     "x": pa.array([i * 0.5 for i in range(start, start + count)], pa.float64())}, schema=SCHEMA)


#: the read-back rule's typed columns: each a function of the row's id (None every 10th row)
TYPED: dict[str, tuple[pa.DataType, Any]] = {
    "raw": (pa.binary(), lambda i: bytes([i % 256, 255 - i % 256, 0])),
    "amount": (pa.decimal128(12, 2), lambda i: __import__("decimal").Decimal(i * 37 - 50000) / 100),
    "at": (pa.timestamp("us", tz="UTC"), lambda i: __import__("datetime").datetime(2020, 1, 1, tzinfo=__import__("datetime").timezone.utc)
           + __import__("datetime").timedelta(seconds=i * 3607, microseconds=i)),
    "day": (pa.date32(), lambda i: __import__("datetime").date(1999, 12, 31) + __import__("datetime").timedelta(days=i)),
    "flag": (pa.bool_(), lambda i: i % 3 == 0),
}


def _typed_rows(columns: tuple[str, ...]) -> pa.Table:
    """The kit's rows with ``columns`` of :data:`TYPED` besides."""
    rows = kit_rows()
    for name in columns:
        typ, value = TYPED[name]
        rows = rows.append_column(pa.field(name, typ), pa.array([None if i % 10 == 0 else value(i) for i in range(ROWS)], typ))
    return rows


def lose_manifest_lines(run_dir: Path) -> Path:
    """Make a finished run's manifest say what a driver killed just after its commits would have left:
    every partition pending, no journal lines."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    for entry in manifest["partitions"].values():
        entry.update(status="pending", rows=0)
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "partitions.jsonl").unlink()
    return run_dir


def _files(folder: Path, table: pa.Table) -> Path:
    """``table`` as three Parquet files (the three partitions), read in batches of a few hundred rows."""
    folder.mkdir(parents=True, exist_ok=True)
    at = 0
    for i, n in enumerate(PARTS if table.num_rows == ROWS else _thirds(table.num_rows)):
        pq.write_table(table.slice(at, n), folder / f"part-{i}.parquet")
        at += n
    return folder


def _thirds(rows: int) -> tuple[int, int, int]:
    a = rows // 3
    return a, a, rows - 2 * a


def _normal(table: pa.Table | None) -> list[tuple[Any, ...]]:
    """A table's (id, name, x) rows, sorted: what two tables are compared by."""
    if table is None:
        raise AssertionError("the target does not exist")
    cols = [table.column(c).cast(SCHEMA.field(c).type) for c in SCHEMA.names]
    return sorted(zip(*(c.to_pylist() for c in cols)), key=lambda r: (r[0] is None, r[0], r[1] or "", r[2] or 0.0))


def _rows_of(table: pa.Table) -> list[tuple[Any, ...]]:
    return _normal(table)


class _CancelMidPartition:
    """Progress that raises the run's cancel flag (what Ctrl-C and SIGTERM set) at the first batch written
    after a partition has committed: one partition is whole in the target, one is half written."""

    live_rows_after = 0.0

    def __init__(self) -> None:
        self.committed = self.fired = False

    def started(self, key: str) -> None:
        pass

    def advanced(self, key: str, rows: int, nbytes: int) -> None:
        if self.committed and not self.fired and (rows or nbytes):
            self.fired = True
            request_cancel()

    def finished(self, result: TaskResult) -> None:
        self.committed = self.committed or result.ok


class _Suite:
    """What the sink and source suites share: the kit's files, and a job run as ``conveyor run`` runs it."""

    @pytest.fixture(autouse=True)
    def _kit(self, tmp_path: Path) -> Iterator[None]:
        self.tmp = tmp_path
        self.name = f"kit_{uuid.uuid4().hex[:10]}"
        reset_cancel()
        yield
        reset_cancel()

    def run_job(self, source: Mapping[str, Any], sink: Mapping[str, Any], *, load_mode: str, strategy: Mapping[str, Any] | None = None,
                resume: Path | None = None, run: str = "run", progress: Progress | None = None, **options: Any) -> Any:
        """A job through ``conveyor.pipelines.run.run``, in a run directory of its own (its manifest, its report)."""
        from omegaconf import OmegaConf

        from conveyor.pipelines.run import RunPlace
        from conveyor.pipelines.run import run as run_job

        cfg = OmegaConf.create({"source": dict(source), "sink": dict(sink), "strategy": dict(strategy or {"type": "files"}),
                                "runtime": {"type": "local"}, "load_mode": load_mode, "degree": 2, "batch_size": 500,
                                "resume": str(resume) if resume else None, **options})
        place = RunPlace(run_dir=self.tmp / run)
        factory = (lambda plan: _held(progress)) if progress is not None else None
        return run_job(cfg, place, progress=factory)


@contextmanager
def _held(progress: Progress) -> Iterator[Progress]:
    yield progress


class SinkSuite(_Suite):
    """The sink contract, one test per rule; see the module's docstring for the hooks to write."""

    #: the sink plugin's name (``sink=<name>``)
    sink: ClassVar[str] = ""
    #: the load modes to check: create, append, truncate, replace, merge
    modes: ClassVar[tuple[str, ...]] = ("append",)
    #: a resumed append asks the target what was committed (commit markers) or replaces its own files:
    #: false for a sink whose resume trusts the manifest
    resumes: ClassVar[bool] = True

    # --- the hooks ------------------------------------------------------------------------------

    #: the typed columns (of :data:`TYPED`) the read-back rule writes besides the kit's: those the sink holds
    read_back_types: ClassVar[tuple[str, ...]] = ("raw", "amount", "at", "day", "flag")

    def sink_config(self, target: str) -> dict[str, Any]:
        """The ``sink.*`` keys of a sink aimed at ``target`` (a name the suite made up)."""
        raise NotImplementedError

    def create_target(self, target: str, rows: pa.Table, key: bool) -> None:
        """Make ``target`` with columns (id bigint, name text, x double; ``key``: id its primary key) holding ``rows``."""
        raise NotImplementedError

    def read_target(self, target: str) -> pa.Table | None:
        """Everything ``target`` holds, with columns id, name and x (None where it does not exist)."""
        raise NotImplementedError

    def narrow_target(self, target: str) -> str | None:
        """Make ``target`` (empty) with a column too narrow for some value of the kit (id as a 32-bit integer,
        or name of at most 4 characters) and return that column's name; None: every Arrow value fits."""
        return None

    # --- the rules ------------------------------------------------------------------------------

    def _source(self, rows: pa.Table, folder: str = "in") -> dict[str, Any]:
        return {"type": "parquet", "path": str(_files(self.tmp / folder, rows))}

    def _sink(self, target: str) -> dict[str, Any]:
        return {"type": self.sink, **self.sink_config(target)}

    def _needs(self, mode: str) -> None:
        if mode not in self.modes:
            pytest.skip(f"the sink does not do load_mode={mode} (SinkSuite.modes)")

    def test_create_makes_the_target_with_every_row(self) -> None:
        self._needs("create")
        report = self.run_job(self._source(kit_rows()), self._sink(self.name), load_mode="create")
        assert report.rows == ROWS
        assert _normal(self.read_target(self.name)) == _rows_of(kit_rows())

    def test_append_adds_every_row_once(self) -> None:
        self._needs("append")
        old = kit_rows(-2, 2, name="o")
        self.create_target(self.name, old, key=False)
        self.run_job(self._source(kit_rows()), self._sink(self.name), load_mode="append")
        assert _normal(self.read_target(self.name)) == _rows_of(pa.concat_tables([old, kit_rows()]))

    def test_truncate_leaves_exactly_the_source(self) -> None:
        self._needs("truncate")
        self.create_target(self.name, kit_rows(-5, 5, name="o"), key=False)
        self.run_job(self._source(kit_rows()), self._sink(self.name), load_mode="truncate")
        assert _normal(self.read_target(self.name)) == _rows_of(kit_rows())

    def test_replace_leaves_exactly_the_source(self) -> None:
        self._needs("replace")
        self.create_target(self.name, kit_rows(-5, 5, name="o"), key=False)
        self.run_job(self._source(kit_rows()), self._sink(self.name), load_mode="replace")
        assert _normal(self.read_target(self.name)) == _rows_of(kit_rows())

    def test_merge_upserts_by_key(self) -> None:
        self._needs("merge")
        kept, changed = kit_rows(-3, 3, name="k"), kit_rows(0, 10, name="o")
        self.create_target(self.name, pa.concat_tables([kept, changed]), key=True)
        self.run_job(self._source(kit_rows()), self._sink(self.name), load_mode="merge")
        assert _normal(self.read_target(self.name)) == _rows_of(pa.concat_tables([kept, kit_rows()]))

    def test_a_resumed_append_loads_nothing_twice(self) -> None:
        """The driver died after its partitions committed and before its journal said so: the resume asks
        the target (commit markers) or replaces its own files, and the target holds every row once."""
        self._needs("append")
        if not self.resumes:
            pytest.skip("the sink's resume trusts the manifest (SinkSuite.resumes)")
        self.create_target(self.name, kit_rows(-2, 2, name="o"), key=False)
        source, sink = self._source(kit_rows()), self._sink(self.name)
        self.run_job(source, sink, load_mode="append")
        run_dir = lose_manifest_lines(self.tmp / "run")
        report = self.run_job(source, sink, load_mode="append", resume=run_dir, run="resumed")
        assert _normal(self.read_target(self.name)) == _rows_of(pa.concat_tables([kit_rows(-2, 2, name="o"), kit_rows()]))
        assert report.rows in (0, ROWS), report.rows  # asked the target (nothing written) or wrote its own files again

    def test_ctrl_c_mid_partition_leaves_whole_partitions_only(self) -> None:
        self._needs("append")
        old = kit_rows(-2, 2, name="o")
        self.create_target(self.name, old, key=False)
        with pytest.raises(JobFailed) as failed:
            self.run_job(self._source(kit_rows()), self._sink(self.name), load_mode="append", progress=_CancelMidPartition())
        assert "cancel" in str(failed.value.cause).lower(), failed.value.cause
        committed = self._whole_partitions_only(old, kit_rows(), failed.value.report)
        assert 1 <= committed < 3, f"{committed} partitions committed: the cancel came before the first or after the last"

    def test_a_value_the_target_cannot_hold_is_refused_by_its_column(self) -> None:
        self._needs("append")
        column = self.narrow_target(self.name)
        if column is None:
            pytest.skip("every Arrow value fits the sink's target (SinkSuite.narrow_target)")
        good = kit_rows(0, 300)
        bad = pa.table({"id": pa.array([2**40], pa.int64()), "name": ["much too long"], "x": [0.5]}, schema=SCHEMA)
        rows = pa.concat_tables([good, bad])
        with pytest.raises(JobFailed) as failed:
            self.run_job(self._source(rows, "bad"), self._sink(self.name), load_mode="append")
        assert column in str(failed.value.cause), f"the error does not name column {column}: {failed.value.cause}"
        self._whole_partitions_only(kit_rows(0, 0), rows, failed.value.report)

    def test_its_read_back_returns_what_it_wrote(self) -> None:
        """What the sink wrote, read back as ``conveyor verify`` and ``verify=checksum`` read it (a source of the sink's
        type, with the keys ``Sink.read_back`` adds), is its source row for row: the kit's rows and the columns of
        :attr:`read_back_types` (bytes, a decimal, a timestamp, a date, a bool), NULLs among them. Changing one value of
        the source afterwards is then found by its key (the comparison can fail)."""
        from omegaconf import OmegaConf

        from conveyor import registry
        from conveyor.config import build_job
        from conveyor.pipelines.compare import compare

        self._needs("create")
        if not getattr(getattr(registry.load("sink", self.sink), "capabilities", None), "read_back", False):
            pytest.skip("the sink declares no read-back (SinkCapabilities.read_back): conveyor verify cannot compare its target")
        rows = _typed_rows(self.read_back_types)
        source, sink = self._source(rows, "typed"), self._sink(self.name)
        self.run_job(source, sink, load_mode="create")
        cfg = lambda src: OmegaConf.create({"source": src, "sink": sink, "strategy": {"type": "files"},  # noqa: E731
                                            "runtime": {"type": "local"}, "load_mode": "create", "degree": 2})
        result = compare(build_job(cfg(source)), key=["id"])
        assert result.equal and result.source.rows == result.target.rows == ROWS, (result.keys, result.unmatched)
        changed = rows.set_column(2, "x", pa.array([-1.25 if i == 77 else v for i, v in enumerate(rows.column("x").to_pylist())]))
        result = compare(build_job(cfg(self._source(changed, "changed"))), key=["id"])
        assert [k for k, _ in result.keys] == [(77,)], result.keys

    def _whole_partitions_only(self, old: pa.Table, source: pa.Table, report: Any) -> int:
        """The target holds ``old`` and, of ``source``'s three partitions, each whole or not at all, nothing else;
        as many as the report says committed."""
        from collections import Counter

        held = Counter(_normal(self.read_target(self.name)))
        before = Counter(_rows_of(old))
        assert not before - held, "rows the target held before are gone"
        new = held - before
        at, whole = 0, 0
        parts = PARTS if source.num_rows == ROWS else _thirds(source.num_rows)
        for n in parts:
            rows = Counter(_rows_of(source.slice(at, n)))
            there = rows & new
            assert not there or there == rows, f"a partition of {n} rows has {sum(there.values())} of them in the target: not whole"
            if there:
                whole += 1
                new -= rows
            at += n
        assert not new, f"{sum(new.values())} rows in the target that are neither old nor a whole partition's"
        committed = sum(1 for r in (report.results if report is not None else []) if r.ok)
        assert whole == committed, f"{whole} whole partitions in the target, {committed} reported committed"
        return whole


class SourceSuite(_Suite):
    """The source contract: every strategy covers the source once, and a copy into Parquet is exact."""

    #: the source plugin's name (``source=<name>``)
    source: ClassVar[str] = ""
    #: {strategy: its keys} to plan the source with
    strategies: ClassVar[dict[str, dict[str, Any]]] = {"none": {}}

    def source_config(self, table: str) -> dict[str, Any]:
        """The ``source.*`` keys of a source reading ``table``."""
        raise NotImplementedError

    def create_source(self, table: str, rows: pa.Table) -> None:
        """Make ``table`` with columns (id bigint, name text, x double) holding ``rows``."""
        raise NotImplementedError

    def test_every_strategy_covers_the_source_once(self) -> None:
        from conveyor import registry
        from conveyor.testing.contract import Contract

        self.create_source(self.name, kit_rows())
        contract = Contract()
        cls = registry.load("source", self.source)
        built = cls(cls.config_class(**self.source_config(self.name)), contract.options)
        contract.check_source(built, self.strategies)

    def test_a_copy_into_parquet_is_exact(self) -> None:
        self.create_source(self.name, kit_rows())
        out = self.tmp / "out"
        strategy = next(iter(self.strategies.items()))
        report = self.run_job({"type": self.source, **self.source_config(self.name)}, {"type": "parquet", "path": str(out)},
                              load_mode="create", strategy={"type": strategy[0], **strategy[1]})
        assert report.rows == ROWS
        assert _normal(pq.read_table(out)) == _rows_of(kit_rows())


class ChangeApplySuite(_Suite):
    """The sync target's contract (``ChangeApplier``), one test per rule; the hooks are ``sink_config`` and ``read_target``
    (as :class:`SinkSuite`'s), and ``touch_other_rows``."""

    #: the sink plugin's name (``sink=<name>``)
    sink: ClassVar[str] = ""
    slot: ClassVar[str] = "conveyor_kit_suite"

    def sink_config(self, target: str) -> dict[str, Any]:
        """The ``sink.*`` keys of a sink aimed at ``target`` (a name the suite made up)."""
        raise NotImplementedError

    def read_target(self, target: str) -> pa.Table | None:
        """Everything ``target`` holds, with columns id, name and x (None where it does not exist)."""
        raise NotImplementedError

    def _source(self, rows: pa.Table, folder: str = "in") -> dict[str, Any]:
        return {"type": "parquet", "path": str(_files(self.tmp / folder, rows))}

    def _sink(self, target: str) -> dict[str, Any]:
        return {"type": self.sink, **self.sink_config(target)}

    def touch_other_rows(self, target: str) -> str | None:
        """Give ``target`` a trigger, rule or foreign key action that changes a row the changes do not name when one of
        its rows is updated or deleted; return what it is (None: the sink's targets have none to make)."""
        return None

    # --- the kit ---------------------------------------------------------------------------------

    def _applier(self, target: str) -> Any:
        from omegaconf import OmegaConf

        from conveyor.config import build_job
        from conveyor.core.changes import ChangeApplier

        spec = build_job(OmegaConf.create({"source": self._source(kit_rows(0, 1), folder=f"probe_{uuid.uuid4().hex[:6]}"),
                                           "sink": self._sink(target), "strategy": {"type": "none"}, "runtime": {"type": "local"},
                                           "load_mode": "replace"}))
        assert isinstance(spec.sink, ChangeApplier), f"sink {self.sink} does not implement conveyor.core.changes.ChangeApplier"
        return spec.sink, spec.options

    def _begin(self) -> tuple[Any, Any]:
        """The target holding the kit's rows (a load, as a sync's first run makes it), its position recorded at 100."""
        from conveyor.core.changes import SyncRecord

        self.run_job(self._source(kit_rows()), self._sink(self.name), load_mode="create", run="first")
        sink, options = self._applier(self.name)
        sink.record_sync(SyncRecord(self.slot, "kit.rows", 100, "id bigint; primary key (id)"))
        return sink, options

    def _staged(self, sink: Any, options: Any, present: pa.Table, gone: list[int]) -> str:
        """A stage holding ``present`` (rows at the source) and the ``gone`` keys, loaded through the sink's own write."""
        import dataclasses

        from omegaconf import OmegaConf

        from conveyor.config import build_job
        from conveyor.pipelines.job import run_job

        stage = sink.sync_stage(self.slot)
        absent = pa.table({"id": pa.array(gone, pa.int64()), "name": pa.nulls(len(gone), pa.string()), "x": pa.nulls(len(gone), pa.float64())})
        rows = pa.concat_tables([present, absent])
        rows = rows.append_column("_conveyor_present", pa.array([True] * present.num_rows + [False] * len(gone)))
        folder = self.tmp / f"stage_{uuid.uuid4().hex[:6]}"
        folder.mkdir(parents=True)
        pq.write_table(rows, folder / "rows.parquet")
        spec = build_job(OmegaConf.create({"source": {"type": "parquet", "path": str(folder)}, "sink": self._sink(self.name),
                                           "strategy": {"type": "none"}, "runtime": {"type": "local"},
                                           "load_mode": sink.stage_load_mode}))
        run_job(dataclasses.replace(spec, sink=sink.stage_sink(stage, spec.options)))
        return stage

    def _apply(self, sink: Any, stage: str | None, position: int, expect: int | None = 100) -> Any:
        from conveyor.core.changes import Change, SyncRecord

        record = SyncRecord(self.slot, "kit.rows", position, "id bigint; primary key (id)")
        try:
            return sink.apply_changes([Change(sink, stage, ("id",), False, record, expect, False)])[0]
        finally:
            if stage is not None:
                sink.drop_stage(stage)

    @staticmethod
    def _changed(rows: pa.Table, updated: range, inserted: range, deleted: range) -> pa.Table:
        ids = [i for i in rows.column("id").to_pylist() if i not in deleted]
        names = {i: "upd" if i in updated else f"n{i % 97}"[:3] for i in ids}
        out = pa.table({"id": pa.array(ids + list(inserted), pa.int64()),
                        "name": pa.array([names[i] for i in ids] + ["new"] * len(inserted), pa.string()),
                        "x": pa.array([i * 0.5 for i in ids] + [i * 0.5 for i in inserted], pa.float64())}, schema=SCHEMA)
        return out

    # --- the rules ------------------------------------------------------------------------------

    def test_an_apply_updates_inserts_and_deletes_exactly_and_records_its_position(self) -> None:
        sink, options = self._begin()
        updated, inserted, deleted = range(100), range(10000, 10050), range(200, 300)
        want = self._changed(kit_rows(), updated, inserted, deleted)
        import pyarrow.compute as pc

        present = want.filter(pc.is_in(want.column("id"), pa.array(list(updated) + list(inserted), pa.int64())))
        applied = self._apply(sink, self._staged(sink, options, present, list(deleted)), 200)
        assert (applied.keys, applied.written, applied.deleted) == (250, 150, 100)
        assert _normal(self.read_target(self.name)) == _rows_of(want)
        assert sink.sync_state(self.slot).position == 200

    def test_a_key_moved_and_a_reapply_of_the_same_changes_leave_the_same_rows(self) -> None:
        sink, options = self._begin()
        moved = pa.table({"id": pa.array([20000], pa.int64()), "name": pa.array(["mov"]), "x": pa.array([5.0])}, schema=SCHEMA)
        self._apply(sink, self._staged(sink, options, moved, [5]), 200)
        want = _normal(self.read_target(self.name))
        assert (20000, "mov", 5.0) in want and not any(r[0] == 5 for r in want)
        again = self._apply(sink, self._staged(sink, options, moved, [5]), 200, expect=200)  # decoded again after a kill
        assert _normal(self.read_target(self.name)) == want and again.written == 1

    def test_a_table_without_changes_records_its_position_alone(self) -> None:
        sink, _ = self._begin()
        self._apply(sink, None, 300)
        assert sink.sync_state(self.slot).position == 300
        assert _normal(self.read_target(self.name)) == _rows_of(kit_rows())

    def test_an_apply_from_a_position_the_target_no_longer_holds_is_refused_and_changes_nothing(self) -> None:
        from conveyor.errors import ConveyorError

        sink, options = self._begin()
        self._apply(sink, None, 150)  # another run applied up to 150 meanwhile
        before = _normal(self.read_target(self.name))
        present = self._changed(kit_rows(), range(10), range(0), range(0)).slice(0, 10)
        with pytest.raises(ConveyorError, match="another run of this job applied changes meanwhile"):
            self._apply(sink, self._staged(sink, options, present, [1000]), 200, expect=100)
        assert _normal(self.read_target(self.name)) == before
        assert sink.sync_state(self.slot).position == 150

    def test_two_applies_at_once_from_one_position_commit_once(self) -> None:
        """Two runs that read the same changes apply them at the same moment: one commits, the other is refused (a
        ConveyorError, whether it waited for the first or met it), and the target holds the changes once."""
        import threading

        from conveyor.core.changes import Change, SyncRecord
        from conveyor.errors import ConveyorError

        sink, options = self._begin()
        present = self._changed(kit_rows(), range(20), range(10000, 10005), range(0)).slice(0, 20)
        stage = self._staged(sink, options, present, [30, 31])
        record = SyncRecord(self.slot, "kit.rows", 200, "id bigint; primary key (id)")
        start, outcomes = threading.Barrier(2, timeout=60), []

        def apply() -> None:
            mine, _ = self._applier(self.name)  # its own sink object, as another process's run would have
            start.wait()
            try:
                outcomes.append(mine.apply_changes([Change(mine, stage, ("id",), False, record, 100, False)])[0])
            except Exception as exc:  # the loser's refusal, checked below
                outcomes.append(exc)

        threads = [threading.Thread(target=apply) for _ in range(2)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        finally:
            sink.drop_stage(stage)
        assert len(outcomes) == 2, "an apply did not finish within 120 s"
        won = [o for o in outcomes if not isinstance(o, BaseException)]
        lost = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(won) == 1 and len(lost) == 1, f"both applies {'committed' if len(won) == 2 else 'failed'}: {outcomes}"
        assert isinstance(lost[0], ConveyorError), f"the second apply failed with {type(lost[0]).__name__}: {lost[0]}"
        assert sink.sync_state(self.slot).position == 200
        assert len(_normal(self.read_target(self.name))) == kit_rows().num_rows - 2

    def test_a_trigger_or_foreign_key_action_that_changes_other_rows_is_refused_by_name(self) -> None:
        from conveyor.errors import VerificationError

        sink, options = self._begin()
        what = self.touch_other_rows(self.name)
        if what is None:
            pytest.skip("the sink's targets have no trigger or foreign key action to make (ChangeApplySuite.touch_other_rows)")
        before = _normal(self.read_target(self.name))
        present = self._changed(kit_rows(), range(10), range(0), range(0)).slice(0, 10)
        with pytest.raises(VerificationError, match="changed rows the source did not"):
            self._apply(sink, self._staged(sink, options, present, []), 200)
        assert _normal(self.read_target(self.name)) == before
        assert sink.sync_state(self.slot).position == 100
