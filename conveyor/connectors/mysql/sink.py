"""The MySQL / MariaDB sink: one InnoDB transaction per partition, rows by LOAD DATA LOCAL INFILE (or
INSERTs through DuckDB's mysql extension); truncate/create/replace/merge through a staging table."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.connectors.mysql import commits, loading
from conveyor.connectors.mysql import target as targets
from conveyor.connectors.mysql.common import MYSQL_DIALECT, MySqlSinkConfig, Statements, qident
from conveyor.connectors.mysql.syncsink import MyChangeApplier
from conveyor.core import JobOptions, Partition, PrepareRequest, SinkCapabilities, SinkPlan, TargetInfo, WriteStats, target_for
from conveyor.errors import ConveyorError
from conveyor.kit import guard
from conveyor.kit import merge as merging
from conveyor.kit.arrowutil import length_checked, negative_zero_checked
from conveyor.kit.mapping import TargetColumn, map_columns
from conveyor.kit.staged import StagedSink, check_mode, staged_path
from conveyor.log import note, say, warn


@dataclass(frozen=True)
class MyPlan:
    """The MySQL sink's own decisions (``SinkPlan.own``): how rows go in, and a merge's plan."""

    bulk: str
    once: commits.Once
    merge: merging.MergePlan | None = None
    #: (source column, target column, n, type) of each varchar(n) / char(n) target column: each value's
    #: length checked before MySQL sees it (MySQL cuts excess trailing spaces with only a note,
    #: which the insert path never sees)
    lengths: tuple[tuple[str, str, int, str], ...] = ()
    #: create / replace: the table's comment (the source table's) once it is swapped in
    comment: str = ""


class MySqlSink(MyChangeApplier, StagedSink):
    """One MySQL transaction per partition (InnoDB); truncate/create/replace/merge through a staging table."""

    config_class = MySqlSinkConfig
    capabilities = SinkCapabilities(load_modes=("truncate", "append", "create", "replace", "merge"), read_back=True)
    empty = "DELETE FROM"  # TRUNCATE commits on its own in MySQL: DELETE keeps the swap in one transaction

    def __init__(self, config: MySqlSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self.table = config.table

    def for_target(self, schema: str, table: str, options: JobOptions) -> MySqlSink:
        """This sink aimed at the target for one table of a job over several (``sink.table`` a template)."""
        return MySqlSink(dataclasses.replace(self.config, table=target_for(self.config.table, schema, table, "sink.table")), options)

    def _where(self) -> str:
        return f"mysql table {self.config.database}.{self.config.table}"

    def _qualified(self, table: str | None = None) -> str:
        return f"{qident(self.config.database or '')}.{qident(table or self.config.table)}"

    def _quote(self, name: str) -> str:
        return qident(name)

    def _target_columns(self) -> list[TargetColumn] | None:
        rows = self.config.run("SELECT column_name, column_type, is_nullable = 'YES', column_default IS NOT NULL "
                               "FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = "
                               f"{MYSQL_DIALECT.literal(self.config.table)} ORDER BY ordinal_position", doing="reading the target")
        return [TargetColumn(r[0], r[1], bool(r[2]), bool(r[3])) for r in rows] or None

    def describe_target(self, request: PrepareRequest) -> TargetInfo:
        """An append's partitions commit final (each checked before its commit); the rest is staged. How rows go
        in (LOAD DATA or INSERTs) is the server's setting, read here."""
        mode = self.options.load_mode
        return TargetInfo(label=self._where(), checks_before_commit=mode == "append", path=staged_path(mode, targets.bulk(self.config)[1]))

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        try:
            if self.config.commit_markers:  # before the type check below, whose DuckDB then knows the tables
                commits.ensure_tables(self.config)
            commits.hold_guard(self.config, self.options.run_id, self.config.commit_markers)
            for stale in commits.drop_stale(self.config, self._marked_as()):
                warn(f"removed a staging table left by a run that is gone: {stale.describe()}")
            return self._prepare(request)
        except BaseException:
            guard.release(self.options.run_id)
            raise

    def _prepare(self, request: PrepareRequest) -> SinkPlan:
        schema, mode, where = request.schema, self.options.load_mode, self._where()
        target = self._target_columns()
        check_mode(mode, target is not None, where)
        stage = f"{commits.STAGE_PREFIX}{self.options.run_id}"
        write_target, comment, said = self.config.table, "", ""
        if mode in ("create", "replace"):
            pairs = [(n, n) for n in schema.names]
            cols, comment, said = targets.created_columns(schema, request.info, self.config.definition)
            if said:
                say(f"{where}: {said}")
            self.config.run(f"CREATE TABLE {self._qualified(stage)} ({cols}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
                            doing=f"load_mode={mode}")
            write_target = stage
        else:
            assert target is not None
            pairs = map_columns(schema.names, target, self.options.map_method, where, self.options.schema_drift)
            merge = targets.merge_plan(self.config, self._where(), pairs, target) if mode == "merge" else None
            if mode == "truncate":  # the target's indexes too: a duplicate key fails its partition, as it would the target
                self.config.run(f"CREATE TABLE {self._qualified(stage)} LIKE {self._qualified()}", doing=f"load_mode={mode}")
                write_target = stage
            elif mode == "merge":  # no unique index: duplicated source keys reach the check that names them
                self.config.run(f"CREATE TABLE {self._qualified(stage)} ENGINE=InnoDB AS SELECT * FROM {self._qualified()} WHERE 1 = 0",
                                doing=f"load_mode={mode}")
                write_target = stage
        try:
            if write_target != self.config.table:  # whose it is: a run that dies leaves it to the next one, or conveyor clean
                commits.label_stage(self.config, write_target, self.options.run_id, self._marked_as())
            targets.check_types(self.config, self.options.load_mode, pairs, schema, write_target, where)
            lengths = targets.text_lengths(self.config, pairs, write_target)
            before = self._count(self.config.table) if mode == "append" and self.options.verify != "none" else 0
            bulk = targets.bulk(self.config)[0]
        except BaseException:
            if write_target != self.config.table:
                self._drop(write_target)
            raise
        once = commits.Once(self._marked_as(), self.options.load, self.config.commit_markers, self.options.run_id)
        return SinkPlan(rows_before=before, target=f"{self.config.where()}.{self.config.table}", write_target=write_target,
                        load_mode=mode, columns=tuple(t for _, t in pairs), source_columns=tuple(s for s, _ in pairs), schema=schema,
                        own=MyPlan(bulk, once, merge if mode == "merge" else None, lengths, comment), definition=said)

    def _marked_as(self) -> str:
        """The target as its commit markers name it."""
        return f"{self.config.database}.{self.config.table}"

    def leftovers(self, remove: bool) -> list[str]:
        """Conveyor's staging tables in the target's database; with ``remove``, drop those whose run is gone."""
        found = commits.stages(self.config)
        if not remove:
            return [s.describe() for s in found]
        dropped = {s.name for s in commits.drop_stale(self.config)}
        return [("dropped " if s.name in dropped else "kept (in use) ") + s.describe() for s in found]

    def committed(self, plan: SinkPlan) -> dict[str, int] | None:
        """{partition: rows} committed into this target under the plan's load id (None: no markers kept)."""
        once: commits.Once = plan.own.once
        return commits.committed(self.config, once.load_id, once.target) if once.markers else None

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        attempt = commits.Attempt(self.config, plan.own.once, part.key, plan.expecting)
        done = attempt.committed_before()
        if done is not None:  # committed by an earlier attempt or run under this load id: nothing to write
            return done
        if plan.own.lengths:  # varchar(n) / char(n) targets: each value's length, before MySQL sees it
            batches = length_checked(batches, plan.own.lengths, part.key, "MySQL")
        if self.config.negative_zero == "error":  # MySQL stores -0.0 as 0
            batches = negative_zero_checked(batches, part.key, "MySQL", "sink.negative_zero=zero")
        try:
            if plan.own.bulk == "load_data":
                return loading.load_data(self.config, plan, part, batches, attempt)
            return loading.insert(self.config, plan, part, batches, attempt)
        except BaseException as exc:  # rolled back
            outcome = attempt.failed(exc)
            if isinstance(outcome, WriteStats):
                return outcome
            raise outcome from None

    def _count(self, table: str) -> int:
        return int(self.config.run(f"SELECT count(*) FROM {self._qualified(table)}", doing="counting")[0][0])

    def target_rows(self, plan: SinkPlan) -> int:
        return self._count(plan.write_target)

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        try:
            if self.staged(plan, self.table):
                self._swap_in(plan, results)
        finally:
            guard.release(self.options.run_id)

    def _forget(self, plan: SinkPlan) -> list[str]:
        """A staged load made visible, or dropped, no longer needs its markers."""
        once: commits.Once = plan.own.once
        return [commits.forget_sql(once.load_id, once.target)] if once.markers and self.staged(plan, self.table) else []

    def _swap_in(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        stage = self._qualified(plan.write_target)
        if plan.load_mode == "merge":
            return self._merge(plan, stage)
        if plan.load_mode == "truncate":
            return super().finalize(plan, results)  # DELETE + INSERT ... SELECT in one transaction
        # create / replace: RENAME TABLE swaps atomically (MySQL's DDL commits on its own: no transaction)
        comment = plan.own.comment  # the stage's label goes; the source's comment, or a replaced table's own, stays
        if plan.load_mode == "replace" and self._target_columns() is not None:
            comment = str(self.config.run("SELECT table_comment FROM information_schema.tables WHERE table_schema = DATABASE() "
                                          f"AND table_name = {MYSQL_DIALECT.literal(self.config.table)}", doing="reading the target")[0][0] or "")
            old = self._qualified(f"{commits.OLD_PREFIX}{self.options.run_id}")
            self.config.run(f"RENAME TABLE {self._qualified()} TO {old}, {stage} TO {self._qualified()}", f"DROP TABLE {old}",
                            doing="load_mode=replace")
        else:
            self.config.run(f"RENAME TABLE {stage} TO {self._qualified()}", doing=f"load_mode={plan.load_mode}")
        with contextlib.suppress(ConveyorError):  # after the swap, best effort: the rows are in place
            self.config.run(f"ALTER TABLE {self._qualified()} COMMENT = '{comment.replace(chr(92), chr(92) * 2).replace(chr(39), chr(39) * 2)}'")
        forget = self._forget(plan)
        if forget:  # DDL commits on its own: the markers go after it, best effort
            with contextlib.suppress(ConveyorError):
                self.config.run(*forget)

    def abort(self, plan: SinkPlan) -> None:
        try:
            super().abort(plan)  # the staging table dropped
            forget = self._forget(plan)
            if forget:
                with contextlib.suppress(ConveyorError):
                    self.config.run(*forget)
        finally:
            guard.release(self.options.run_id)

    def _merge(self, plan: SinkPlan, stage: str) -> None:
        """The staged keys checked, then upsert (and deletes) in one transaction, read back from the
        target before it commits; the stage dropped after."""
        merged: list[merging.Merged] = []

        def apply(con: Any) -> None:
            # the keys written too: a case- or accent-insensitive key column (MySQL's default collations) takes the source's spelling
            merged.append(merging.apply(Statements(con), plan.own.merge, self._qualified(), stage, self._where(), qident,
                                        values=self.options.verify == "checksum", mysql=True, written_keys=plan.own.merge.keys))

        self._in_one_transaction(plan, [], first=apply)
        note(f"{self.table}: {merged[0].describe()} (read back from the target before the merge committed)")
        self._drop(plan.write_target)

    def _in_one_transaction(self, plan: SinkPlan, steps: list[str], taken: Callable[[int], None] | None = None,
                            first: Callable[[Any], None] | None = None) -> None:
        """``steps`` in one transaction, after ``first`` (a check inside it: merge's staged keys); ``taken``
        hears the INSERT's count of the rows it copied (StagedSink.finalize's truncate)."""
        con = self.config.connect(autocommit=False)
        try:
            if first is not None:
                first(con)
            with con.cursor() as cur:
                for step in [*steps, *self._forget(plan)]:
                    changed = cur.execute(step)
                    if taken is not None and step.startswith("INSERT INTO"):
                        taken(int(changed))
            con.commit()
        except Exception as exc:
            with contextlib.suppress(Exception):
                con.rollback()
            raise self.config.translate(exc, f"finishing load_mode={plan.load_mode}") from None
        finally:
            con.close()

    def _drop(self, table: str) -> None:
        with contextlib.suppress(Exception):  # best effort: the run's own error matters more
            self.config.run(f"DROP TABLE IF EXISTS {self._qualified(table)}")
