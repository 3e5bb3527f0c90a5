"""DuckDB sink: a table in a database file.

DuckDB does the Arrow work in native code both ways: ``fetch_record_batch`` streams a
query's result as Arrow batches, and an ``INSERT ... SELECT`` over a registered Arrow
reader loads batches without a Python loop. Each partition is written in one transaction.

DuckDB lets one process at a time open a database file for writing; inside that process
many connections (one per task) share the database, so the sink is for runtimes that run
tasks in the driver's process (``runtime=local``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.duckdb import carry, common, state
from conveyor.connectors.duckdb.common import close, connect, new_file, qident, qualified, remove_file, swap_blocker, target_schema
from conveyor.connectors.duckdb.syncsink import DuckChangeApplier
from conveyor.core import (
    INFINITY,
    CursorState,
    CursorWindow,
    JobOptions,
    Partition,
    PrepareRequest,
    SinkCapabilities,
    SinkPlan,
    TargetInfo,
    WriteStats,
    check_partition_rows,
    check_stored,
    target_for,
)
from conveyor.errors import ConfigError, SchemaError, TransferError, VerificationError
from conveyor.kit import merge as merging
from conveyor.kit.arrowutil import CountingBatches
from conveyor.kit.mapping import TargetColumn, map_columns
from conveyor.kit.merge import MergeOptions
from conveyor.kit.staged import StagedSink, check_mode, staged_path, swap_steps
from conveyor.log import note, say


@dataclass
class DuckDBSinkConfig(MergeOptions):
    #: the database file; created if missing
    database: str = "???"
    table: str = "???"
    schema: str = "main"
    #: columns whose values may change type by DuckDB's own cast on insert (double -> integer
    #: rounds, text is parsed, ...); ["*"]: every column. By default a type change that could alter
    #: a value is refused before anything moves (conveyor/kit/casts.py)
    allow_cast: list[str] = field(default_factory=list)
    #: record each partition's commit in <schema>._conveyor_commits, in the partition's own
    #: transaction: a retried or resumed partition that had committed is not written again
    commit_markers: bool = True
    #: create / replace: the source table's NOT NULL, primary key and comments (carry.py); the log says the rest
    definition: bool = True

    def __post_init__(self) -> None:
        self.check_merge_options()


@dataclass(frozen=True)
class DuckPlan:
    """The DuckDB sink's own decisions (``SinkPlan.own``)."""

    #: load_mode=merge: keys, updated columns, what happens to rows the source lacks
    merge: merging.MergePlan | None = None
    #: incremental.cursor: the window this load reads; its upper end becomes the committed cursor
    window: CursorWindow | None = None
    #: the database file did not exist before this run: a failed run that leaves nothing in it removes it
    made_file: bool = False
    #: schema_drift=evolve: the columns this run added to the target (a failed run that left nothing drops them)
    added: tuple[str, ...] = ()
    #: create / replace: the source's primary key and comment, in the transaction that swaps the table in (carry.py)
    before_swap: tuple[str, ...] = ()


class DuckDBSink(DuckChangeApplier, StagedSink):
    """Loads a DuckDB table.

    append writes straight into the target, one transaction per partition. truncate,
    create, replace and merge load a staging table first; ``finalize`` swaps (or merges) it in
    within one transaction, so a failed run leaves the target as it was (``StagedSink``).
    truncate swaps the stage in where nothing tells it from the target (:func:`~conveyor.connectors.duckdb.common.swap_blocker`),
    else empties the target and copies the stage's rows in, keeping the target's DDL.
    """

    config_class = DuckDBSinkConfig
    #: DuckDB lets one process at a time write a database file
    capabilities = SinkCapabilities(single_process=True, load_modes=("truncate", "append", "create", "replace", "merge"),
                                    read_back=True)

    def __init__(self, config: DuckDBSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self.table = config.table

    def for_target(self, schema: str, table: str, options: JobOptions) -> DuckDBSink:
        """This sink aimed at the target for one table of a job over several (``sink.table`` a template)."""
        return DuckDBSink(dataclasses.replace(self.config, table=target_for(self.config.table, schema, table, "sink.table")), options)

    @property
    def _target(self) -> str:
        return qualified(self.config.schema, self.config.table)

    @property
    def _name(self) -> str:
        return f"{self.config.schema}.{self.config.table}"

    def committed(self, plan: SinkPlan) -> dict[str, int] | None:
        """{partition: rows} committed into this target under the load id (None: no markers kept)."""
        if not self.config.commit_markers:
            return None
        con = connect(self.config.database)
        try:
            return state.committed(con, self.config.schema, self.options.load, self._name)
        finally:
            close(con)

    def cursor_state(self, column: str) -> CursorState:
        """The cursor the last finished load committed into this target, and an unfinished run's window."""
        con = connect(self.config.database)
        try:
            return state.cursor_state(con, self.config.schema, self._name, column)
        finally:
            close(con)

    def _stage_name(self) -> str:
        return f"_conveyor_stage_{self.options.run_id}"

    def _columns(self, con: Any) -> list[TargetColumn] | None:
        rows = con.execute(
            "SELECT column_name, data_type, is_nullable = 'YES', column_default IS NOT NULL "
            "FROM information_schema.columns WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
            [self.config.schema, self.config.table],
        ).fetchall()
        return [TargetColumn(*r) for r in rows] or None

    def describe_target(self, request: PrepareRequest) -> TargetInfo:
        """An append's partitions commit final (each checked before its commit); the rest is staged."""
        mode = self.options.load_mode
        return TargetInfo(label=f"duckdb table {self._name} in {self.config.database}", checks_before_commit=mode == "append",
                          path=staged_path(mode, "arrow: DuckDB inserts each partition's batches"))

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        schema = request.schema
        import pyarrow as pa

        mode = self.options.load_mode
        where = f"duckdb table {self.config.schema}.{self.config.table}"
        common.refuse_wide_decimals(schema, where)
        added: tuple[str, ...] = ()
        before_swap: tuple[str, ...] = ()
        said = ""
        made = new_file(self.config.database)
        con = connect(self.config.database)
        try:
            with state.MAKING:  # (several tables' prepares at once: see state.MAKING)
                con.execute(f"CREATE SCHEMA IF NOT EXISTS {qident(self.config.schema)}")
            target_cols = self._columns(con)
            empty = pa.Table.from_batches([], schema=schema)
            con.register("__conveyor_empty", empty)
            stage = qualified(self.config.schema, self._stage_name())
            check_mode(mode, bool(target_cols), where)
            if mode in ("create", "replace"):
                self._create_from_arrow(con, stage, where)
                before_swap, said = carry.made(con, request.info, schema.names, stage, where) if self.config.definition else ((), "")
                pairs = [(n, n) for n in schema.names]
                write_target = self._stage_name()
            else:
                pairs = map_columns(schema.names, target_cols, self.options.map_method, where, self.options.schema_drift, evolves=True)
                added = self._evolve(con, pairs, target_cols, where)
                write_target = self.config.table
                if mode in ("truncate", "merge"):
                    con.execute(f"CREATE TABLE {stage} AS SELECT * FROM {self._target} LIMIT 0")
                    write_target = self._stage_name()
            self._probe(con, qualified(self.config.schema, write_target), pairs, where, schema)
            before = 0
            if mode == "append" and self.options.verify != "none":
                before = con.execute(f"SELECT count(*) FROM {self._target}").fetchone()[0]
            merge = None
            if mode == "merge":
                key = con.execute("SELECT constraint_column_names FROM duckdb_constraints() WHERE schema_name = ? AND table_name = ? "
                                  "AND constraint_type = 'PRIMARY KEY'", [self.config.schema, self.config.table]).fetchone()
                merge = merging.plan(self.config, key[0] if key else [], [t for _, t in pairs], [c.name for c in target_cols or []], where)
            state.ensure(con, self.config.schema, self.config.commit_markers, request.window is not None)
            if request.window is not None:  # committed at once: a run that stops half way is known to the next
                if mode == "append" and not self.config.commit_markers:
                    raise ConfigError("incremental.cursor with load_mode=append needs sink.commit_markers=true: they tell a run that "
                                      "stopped half way from one that loaded nothing", key="sink.commit_markers")
                state.record_pending(con, self.config.schema, self._name, request.window, self.options.load, mode)
        except BaseException:
            close(con)
            if made:  # a run that fails before its rows leaves no empty database file behind
                remove_file(self.config.database)
            raise
        close(con)
        return SinkPlan(
            own=DuckPlan(merge, request.window, made, added, before_swap),
            rows_before=before,
            target=f"{self.config.database}:{self.config.schema}.{self.config.table}",
            write_target=write_target,
            load_mode=mode,
            columns=tuple(t for _, t in pairs),
            source_columns=tuple(s for s, _ in pairs),
            schema=schema,
            keeps=(INFINITY,),  # DuckDB's own date and timestamp infinity
            definition=said,
        )

    def _evolve(self, con: Any, pairs: list[tuple[str, str]], target_cols: Any, where: str) -> tuple[str, ...]:
        """schema_drift=evolve: the source's columns the target lacks added to it, nullable, of the type
        DuckDB gives the source's Arrow type (one transaction); their names."""
        have = {c.name for c in target_cols}
        new = [t for _, t in pairs if t not in have]
        if not new:
            return ()
        types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM __conveyor_empty)").fetchall())
        con.execute("BEGIN")
        for name in new:
            con.execute(f"ALTER TABLE {self._target} ADD COLUMN {qident(name)} {types[name]}")
        con.execute("COMMIT")
        say(f"{where}: schema_drift=evolve: added column(s) {', '.join(f'{n} {types[n]}' for n in new)}")
        return tuple(new)

    def _create_from_arrow(self, con: Any, stage: str, where: str) -> None:
        import duckdb

        try:
            con.execute(f"CREATE TABLE {stage} AS SELECT * FROM __conveyor_empty")
        except duckdb.Error as exc:
            raise SchemaError(f"{where}: cannot create from the source schema: {str(exc).splitlines()[0]}") from None

    def _insert_sql(self, table: str, plan_cols: Sequence[str], src_cols: Sequence[str], relation: str) -> str:
        cols = ", ".join(qident(c) for c in plan_cols)
        select = ", ".join(qident(c) for c in src_cols)
        return f"INSERT INTO {table} ({cols}) SELECT {select} FROM {relation}"

    def _probe(self, con: Any, table: str, pairs: list[tuple[str, str]], where: str, source: Any) -> None:
        """Refuse a column whose values the target's type would change (conveyor/kit/casts.py), then
        bind the insert against an empty batch, so other mismatches fail before rows move too."""
        import duckdb
        from conveyor.kit.casts import ColumnType, check_casts

        target = target_schema(con, table)
        check_casts(pairs, [ColumnType.of_field(source.field(s)) for s, _ in pairs],
                    [ColumnType(target.field(t).type) for _, t in pairs], where, self.config.allow_cast, engine="DuckDB")
        sql = self._insert_sql(table, [t for _, t in pairs], [s for s, _ in pairs], "__conveyor_empty")
        con.execute("BEGIN")
        try:
            con.execute(sql)
        except duckdb.Error as exc:
            raise SchemaError(f"{where}: source columns do not fit the target: {str(exc).splitlines()[0]}") from None
        finally:
            con.execute("ROLLBACK")

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        import pyarrow as pa

        import duckdb

        start = time.perf_counter()
        counted = CountingBatches(batches, plan.schema)
        reader = pa.RecordBatchReader.from_batches(plan.schema, counted)
        con = connect(self.config.database)
        markers = self.config.commit_markers
        try:
            con.register("__conveyor_batches", reader)
            con.execute("BEGIN")
            try:
                before = state.committed_rows(con, self.config.schema, self.options.load, self._name, part.key) if markers else None
                if before is not None:  # committed by an earlier attempt or run under this load id
                    con.execute("ROLLBACK")
                    return WriteStats(part.key, before, 0, time.perf_counter() - start, already_committed=True)
                into = qualified(self.config.schema, plan.write_target)
                stored = int(con.execute(self._insert_sql(into, plan.columns, plan.source_columns, "__conveyor_batches")).fetchone()[0])
                if self.options.verify != "none":  # the INSERT's own count: what DuckDB stored
                    check_stored(plan.target, part.key, counted.rows, stored)
                check_partition_rows(plan.target, part.key, plan.expecting, stored)
                if markers:
                    state.mark(con, self.config.schema, self.options.load, self._name, part.key, stored)
                con.execute("COMMIT")
            except (duckdb.Error, VerificationError) as exc:
                _rollback(con)
                if counted.error is not None:  # the source failed; DuckDB only wrapped it
                    raise counted.error from None
                if isinstance(exc, VerificationError):
                    raise
                first = str(exc).splitlines()[0]
                full = "No space left on device" in first or "Disk quota exceeded" in first
                raise TransferError(f"duckdb {plan.target}: {first}", partition=part.key, retriable=not full,
                                    hint="free space on the database file's file system (df -h shows it)" if full else None) from None
        finally:
            close(con)
        return WriteStats(part.key, stored, counted.bytes, time.perf_counter() - start)

    def target_rows(self, plan: SinkPlan) -> int:
        con = connect(self.config.database)
        try:
            return int(con.execute(f"SELECT count(*) FROM {qualified(self.config.schema, plan.write_target)}").fetchone()[0])
        finally:
            close(con)

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        own: DuckPlan = plan.own
        if plan.load_mode == "append":  # every partition committed: the window's end becomes the cursor
            if own.window is not None:
                self._in_one_transaction(plan, [])
            return
        if plan.load_mode == "truncate" and self.staged(plan, self.table):
            self._in_one_transaction(plan, lambda con: self._truncate_steps(con, plan))
            return
        if plan.load_mode != "merge":
            return super().finalize(plan, results)
        stage, where = self._qualified(plan.write_target), f"duckdb table {self.config.schema}.{self.config.table}"

        def merge(con: Any) -> list[str]:
            merged = merging.apply(con, own.merge, self._qualified(), stage, where, qident, values=self.options.verify == "checksum")
            note(f"{self._name}: {merged.describe()} (read back from the target before the merge committed)")
            return [f"DROP TABLE {stage}"]

        self._in_one_transaction(plan, merge)

    def _truncate_steps(self, con: Any, plan: SinkPlan) -> list[str]:
        """truncate, inside the transaction that makes it visible: the loaded stage takes the target's
        place (DROP, RENAME: its rows are not written a second time) when nothing tells the two apart,
        else the target is emptied and the stage's rows copied in (its DDL, indexes and comments stay)."""
        why = swap_blocker(con, self.config.schema, self.config.table, plan.write_target)
        if why is None:
            note(f"truncate: {self._name} swapped for the loaded stage (same columns, types and constraints; "
                 "no index, comment or reference to it): its rows are not copied twice")
        else:
            note(f"truncate: {self._name} emptied and the stage's rows copied in ({why})")
        # a swap is replace's DROP and RENAME; otherwise truncate's empty-and-copy
        return swap_steps("replace" if why is None else "truncate", self._qualified(), self._qualified(plan.write_target),
                          qident(self.config.table), [qident(c) for c in plan.columns], self.empty)

    def abort(self, plan: SinkPlan) -> None:
        super().abort(plan)  # a staging table dropped
        own: DuckPlan = plan.own
        if own.made_file and (plan.write_target != self.config.table or self.committed(plan) == {}):
            remove_file(self.config.database)  # this run made the file, and nothing of it stays
            return
        if own.added and (plan.write_target != self.config.table or self.committed(plan) == {}):
            con = connect(self.config.database)  # nothing of this run stayed: nor do the columns it added
            try:
                for name in own.added:
                    con.execute(f"ALTER TABLE {self._target} DROP COLUMN {qident(name)}")
            finally:
                close(con)
        if plan.write_target == self.config.table:
            return
        con = connect(self.config.database)
        try:  # nothing of a staged load stayed: its markers and its window go
            if self.config.commit_markers:
                state.forget(con, self.config.schema, self.options.load, self._name)
            if own.window is not None:
                state.clear_pending(con, self.config.schema, self._name, own.window.column, self.options.load)
        finally:
            close(con)

    # StagedSink's finalize / abort, in DuckDB's spelling

    def _qualified(self, table: str | None = None) -> str:
        return qualified(self.config.schema, table or self.config.table)

    def _quote(self, name: str) -> str:
        return qident(name)

    def _in_one_transaction(self, plan: SinkPlan, steps: Sequence[str] | Callable[[Any], Sequence[str]],
                            taken: Callable[[int], None] | None = None, first: Callable[[Any], None] | None = None) -> None:
        """``steps`` in the transaction that makes the load visible, with the cursor's move (and a staged
        load's markers forgotten); a callable ``steps`` is asked for them inside the transaction."""
        own: DuckPlan = plan.own
        con = connect(self.config.database)
        try:
            con.execute("BEGIN")
            if first is not None:  # a check inside the transaction, before the steps (merge: the staged keys)
                first(con)
            for step in own.before_swap:  # create / replace: the key over the loaded rows, the comment
                con.execute(step)
            for step in steps(con) if callable(steps) else steps:
                con.execute(step)
            if own.window is not None:
                state.commit_cursor(con, self.config.schema, self._name, own.window, self.options.load)
            if self.config.commit_markers and plan.write_target != self.config.table:
                state.forget(con, self.config.schema, self.options.load, self._name)
            con.execute("COMMIT")
        except Exception:
            _rollback(con)
            raise
        finally:
            close(con)

    def _drop(self, table: str) -> None:
        con = connect(self.config.database)
        try:
            con.execute(f"DROP TABLE IF EXISTS {qualified(self.config.schema, table)}")
        finally:
            close(con)


def _rollback(con: Any) -> None:
    """ROLLBACK where a transaction is still open: a COMMIT that failed (a full disk) has ended it, and the rollback's own
    "no transaction is active" hid the cause."""
    import duckdb

    with contextlib.suppress(duckdb.Error):
        con.execute("ROLLBACK")
