"""PostgreSQL sink: binary COPY from Arrow batches (ADBC), or a binary COPY pass-through.

Each partition is written in one transaction, so a failed or retried partition leaves
nothing. Load modes:

- append: COPY into the target, one transaction per partition.
- truncate: COPY into an UNLOGGED staging table copied from the target's definition; at
  the end, in one transaction, TRUNCATE the target and INSERT the staged rows.
- create: COPY into a new staging table made from the source schema (and a PostgreSQL source
  table's definition: ``definition``), renamed to the target at the end (fails, before any row
  moves, if the target exists).
- replace: like create (or, if the target exists, a staging table LIKE the target INCLUDING
  ALL), then DROP the old target and rename the staging table in one transaction.

A failed run drops the staging table: the target is as it was.

This module is the lifecycle (prepare, finalize, abort, verification, clean-up); the catalog
checks are in ``target``, the Arrow writers in ``writers``, the pass-through in ``passthrough``
and exactly-once (markers, the driver's guard) in ``commits``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.postgres import commits, decide, definition, partitioned, passthrough, writers
from conveyor.connectors.postgres import target as targets
from conveyor.connectors.postgres.common import PgConnConfig, connect, ident, row_hash_sql, translate
from conveyor.connectors.postgres.migration import PgSchemaImport
from conveyor.connectors.postgres.prepare import Preparer, drop_added
from conveyor.connectors.postgres.syncsink import PgChangeApplier
from conveyor.connectors.postgres.target import Target
from conveyor.core import (
    CursorState,
    CursorWindow,
    ForeignKey,
    JobOptions,
    NativeStream,
    Partition,
    PrepareRequest,
    SinkBase,
    SinkCapabilities,
    SinkPlan,
    TargetInfo,
    WriteStats,
    decode_cursor,
    encode_cursor,
    target_for,
)
from conveyor.errors import ConfigError, ConveyorError
from conveyor.kit import merge as merging
from conveyor.kit.arrowutil import fraction_checked, length_checked
from conveyor.kit.merge import MergeOptions
from conveyor.kit.staged import StagedSink, check_taken, swap_steps
from conveyor.log import note

COPY_PATHS = ("auto", "arrow", "passthrough")
WRITERS = ("auto", "pgpq", "adbc")
TRUNCATE_METHODS = ("auto", "in_place", "staged")
ROUTINGS = ("auto", "leaves", "parent")


@dataclass
class PostgresSinkConfig(MergeOptions, PgConnConfig):
    schema: str = "public"
    table: str = "???"
    #: create / replace make the new table UNLOGGED (faster, not crash-safe, not replicated)
    unlogged: bool = False
    #: a sync's applies run as a replica's (session_replication_role = replica, as PostgreSQL's own subscriptions do):
    #: the target's triggers and foreign key checks and actions do not fire, the source's own effects arrive as its
    #: changes (a migration's target, whose triggers and constraints are the source's; needs a superuser)
    apply_as_replica: bool = False
    #: create / replace: load the new table UNLOGGED (its rows write no WAL), then SET LOGGED just
    #: before it is swapped in (one pass writes it to the WAL): the target ends as logged as ever
    unlogged_load: bool = False
    #: at most this many partitions write into the target at once, across every worker (0: as many
    #: as the degree runs): a target stops scaling past its lock contention knee (relation extension,
    #: free-space map) while the source can still take more readers
    max_streams: int = 0
    #: truncate: drop the target's indexes that back no constraint before the final insert and build
    #: them again after it, in the same transaction (a failure leaves table and indexes as they were)
    rebuild_indexes: bool = False
    #: how load_mode=truncate replaces the rows, atomically either way. in_place: one transaction
    #: (TRUNCATE, then COPY ... FREEZE into the target: every row written once, and no WAL on a
    #: wal_level=minimal server; readers of the target wait until it commits), for a plan of one
    #: partition. staged: partitions in parallel into an UNLOGGED staging table, copied into the
    #: target in one transaction at the end (every row written twice; readers see the old rows
    #: until then). auto: in_place when the plan has one partition (and verify is not checksum)
    truncate_method: str = "auto"
    #: create / replace: the new table's access method (e.g. columnar); null: the server's default
    #: for create, the target's own for replace
    access_method: str | None = None
    #: auto: pass a PostgreSQL source's binary COPY stream through untouched when the column
    #: types are identical, else Arrow; arrow: always decode to Arrow; passthrough: require it
    copy_path: str = "auto"
    #: the Arrow path's binary COPY encoder. auto: pgpq where it encodes every column (it costs
    #: about a third of ADBC's client CPU), else ADBC; pgpq: require it; adbc: ADBC's adbc_ingest
    writer: str = "auto"
    #: a partitioned target (append, or a truncate in one transaction): leaves: each task computes every
    #: row's leaf partition on the client (Arrow / numpy over whole batches: range, list and hash on
    #: integer, date and timestamp keys, list on text) and COPYs each leaf's rows straight into it
    #: (the Arrow path); parent: COPY into the parent, the server routes every row; auto: leaves where
    #: the client can route the top level, unless no partition has an index and the source's COPY
    #: stream could pass through (the parent costs less there), else the parent (`conveyor plan` says
    #: which and why)
    routing: str = "auto"
    #: routed loads: the Arrow batches (MiB) one task holds, grouped by partition, before it COPYs
    #: each partition's share and lets them all go
    routing_buffer_mb: int = 64
    #: a target of another access method than heap (Citus columnar: a stripe holds one transaction's rows,
    #: up to its stripe_row_limit): the rows each partition's transaction should hold at least, so the
    #: plan makes whole stripes instead of many small ones (read from columnar.options where Citus has
    #: it; 0: plan as for a heap table)
    stripe_rows: int = 150000
    #: run ANALYZE on the target after the load
    analyze: bool = False
    #: create / replace making a new table from a source table with a primary key: make the same key
    #: (built after the rows, before the table is swapped in)
    primary_key: bool = True
    #: the same from a PostgreSQL source table: the rest of its definition too (NOT NULL, defaults, sequences,
    #: CHECK / UNIQUE / EXCLUDE, indexes, comments: definition.py); the log says what was not carried
    definition: bool = True
    #: create / replace making a new table: {column: PostgreSQL type} instead of the source's (e.g. {price:
    #: "numeric(20,4)", ip: text}), checked like a load into an existing column (sink.allow_cast for a lossy one)
    column_types: dict[str, str] = field(default_factory=dict)
    #: a job over several tables creating its targets (create / replace): make the source's foreign
    #: keys between them after every table is loaded (each checks every row)
    foreign_keys: bool = False
    #: record each partition's commit in <schema>._conveyor_commits, in the partition's own
    #: transaction: retries and resumes never load a partition twice. false: no marker table (then
    #: a partition retried after a lost worker, or resumed after a killed driver, may load twice)
    commit_markers: bool = True
    #: columns whose values may change type by PostgreSQL's own cast (e.g. timestamp -> timestamptz
    #: in the session's TimeZone, text -> integer); ["*"]: every column. By default a type change that
    #: could alter a value is refused before anything moves (see conveyor/kit/casts.py for the rules)
    allow_cast: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.copy_path not in COPY_PATHS:
            raise ValueError(f"copy_path: {self.copy_path!r} is not one of {', '.join(COPY_PATHS)}")
        if self.writer not in WRITERS:
            raise ValueError(f"writer: {self.writer!r} is not one of {', '.join(WRITERS)}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing: {self.routing!r} is not one of {', '.join(ROUTINGS)}")
        if self.truncate_method not in TRUNCATE_METHODS:
            raise ValueError(f"truncate_method: {self.truncate_method!r} is not one of {', '.join(TRUNCATE_METHODS)}")
        self.check_merge_options()
        if self.table and "." in self.table and "{" not in self.table:
            schema, _, table = self.table.partition(".")
            if self.schema != "public" or not schema or not table or "." in table:
                raise ValueError(f"table: {self.table!r} holds a dot: name the schema with sink.schema and the table with sink.table")
            self.schema, self.table = schema, table  # schema.table, the schema left at its default: split


class PostgresSink(PgChangeApplier, PgSchemaImport, SinkBase):
    config_class = PostgresSinkConfig
    capabilities = SinkCapabilities(transactional=True, load_modes=("truncate", "append", "create", "replace", "merge"),
                                    native_formats=(passthrough.FORMAT, passthrough.TEXT_FORMAT), read_back=True)

    def __init__(self, config: PostgresSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def for_target(self, schema: str, table: str, options: JobOptions) -> PostgresSink:
        """This sink aimed at the target for one table of a job over several (``sink.table`` a template)."""
        return PostgresSink(dataclasses.replace(self.config, table=target_for(self.config.table, schema, table, "sink.table")), options)

    @property
    def name(self) -> str:
        return f"{self.config.schema}.{self.config.table}"

    @property
    def where(self) -> str:
        return f"postgres table {self.name}"

    def _qualified(self, table: str | None = None) -> str:
        return ident(self.config.schema, table or self.config.table)

    def _stage(self) -> str:
        return commits.stage_name(self.options.run_id)

    # --- describe the target, prepare ------------------------------------------------------------

    def describe_target(self, request: PrepareRequest) -> TargetInfo:
        """The target for the plan, read in one connection and decided as prepare decides (decide.py)."""
        con = connect(self.config, autocommit=True)
        try:
            ins = decide.inspect(con, self.config, self.options, self.where)
        except ConveyorError:
            raise
        except Exception as exc:
            raise translate(exc, self.config, f"reading {self.where}") from None
        finally:
            con.close()
        return decide.describe(ins, request, self.config, self.options, self.where, self.name)

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        return Preparer(self).run(request)

    # --- incremental cursors (<schema>._conveyor_cursors) ----------------------------------------

    def cursor_state(self, column: str) -> CursorState:
        """The cursor the last finished load committed into this target, and an unfinished run's window."""
        con = connect(self.config, autocommit=True)
        try:
            row = commits.cursor_row(con, self.config.schema, self.name, column)
            if row is None:
                return CursorState()
            value, kind, load, mode, low, high, pkind = row
            state = CursorState(value=decode_cursor(value, kind) if value is not None else None)
            if load:
                window = CursorWindow(column, decode_cursor(low, pkind) if low is not None else None,
                                      decode_cursor(high, pkind) if high is not None else None)
                done = len(commits.committed(con, self.config.schema, load, self.name)) if mode == "append" else 0
                state = dataclasses.replace(state, pending=window, pending_load=load, pending_mode=mode, pending_committed=done)
            return state
        except Exception as exc:
            raise translate(exc, self.config, "reading the incremental cursor") from None
        finally:
            con.close()

    def record_window(self, con: Any, window: CursorWindow) -> None:
        if self.options.load_mode == "append" and not self.config.commit_markers:
            raise ConfigError("incremental.cursor with load_mode=append needs sink.commit_markers=true: they tell a run that "
                              "stopped half way from one that loaded nothing", key="sink.commit_markers")
        commits.ensure_cursors(con, self.config.schema)
        commits.record_pending(con, self.config.schema, self.name, window.column, self.options.load, self.options.load_mode,
                               encode_cursor(window.low) if window.low is not None else None,
                               encode_cursor(window.high) if window.high is not None else None)

    def _commit_cursor(self, con: Any, plan: SinkPlan) -> None:
        """In the transaction that makes the load visible: the window's upper end becomes the cursor."""
        window: CursorWindow | None = plan.own.window
        if window is None:
            return
        value = None if window.empty else encode_cursor(window.high)
        con.execute(commits.commit_cursor_sql(self.config.schema, self.name, window.column, self.options.load, value))

    # --- write -------------------------------------------------------------------------------

    def _into(self, plan: SinkPlan, part: Partition) -> SinkPlan:
        return partitioned.into(plan, part, self.config.table)

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        plan = self._into(plan, part)
        if plan.own.lengths:  # varchar(n) / char(n) targets: each value's length, before PostgreSQL sees it
            batches = length_checked(batches, plan.own.lengths, part.key, "PostgreSQL")
        if plan.own.fractions:  # time(n) / timestamp(n) targets: each value's fractional seconds, which PostgreSQL would round
            batches = fraction_checked(batches, plan.own.fractions, part.key, "PostgreSQL")
        if plan.own.writer == "pgpq":
            return writers.write_pgpq(self.config, plan, part, batches)
        return writers.write_adbc(self.config, self.options.load, plan, part, batches)

    def write_native(self, plan: SinkPlan, part: Partition, stream: NativeStream) -> WriteStats:
        """The pass-through: the source's binary COPY stream, relayed into the target in one transaction.
        The target's COPY count must be the rows the source's COPY said it sent (where it says),
        checked before the commit."""
        plan = self._into(plan, part)
        once: commits.Once = plan.own.once
        attempt = commits.Attempt(once, part.key, plan.expecting)
        con = connect(self.config, partition=part.key)

        def relayed() -> tuple[int, int, int | None]:
            stored, nbytes = passthrough.relay(con, self._qualified(plan.write_target), plan.columns, stream, part.key, once.freeze,
                                               plan.native or passthrough.FORMAT)
            return stored, nbytes, getattr(stream, "rows", None)  # what the source's COPY said it sent, where it says

        try:
            stats = attempt.run(con, con.execute, lambda sql: con.execute(sql).fetchone(), relayed)
        finally:
            con.close()
        return stats if stats.already_committed else dataclasses.replace(stats, source_rows=getattr(stream, "rows", None))

    def leftovers(self, remove: bool) -> list[str]:
        """Conveyor's staging tables in the target's schema; with ``remove``, drop those whose run is gone."""
        def listed(con: Any) -> list[str]:
            found = commits.stages(con, self.config.schema)
            if remove:
                dropped = {s.name for s in commits.drop_stale(con, self.config.schema)}
                return [("dropped " if s.name in dropped else "kept (in use) ") + s.describe() for s in found]
            return [s.describe() for s in found]

        return self._on("listing staging tables", listed)

    def add_foreign_keys(self, plan: SinkPlan, keys: Sequence[tuple[ForeignKey, Any]]) -> list[str]:
        """``sink.foreign_keys``: the source's foreign keys between targets this job created, in one transaction."""
        if not self.config.foreign_keys or plan.load_mode not in ("create", "replace"):
            return []
        made, steps = [], []
        for fk, ref in keys:
            if not isinstance(ref, PostgresSink) or (ref.config.host, ref.config.port, ref.config.dbname) != (
                    self.config.host, self.config.port, self.config.dbname):
                continue
            cols, ref_cols = ", ".join(ident(c) for c in fk.columns), ", ".join(ident(c) for c in fk.columns_referenced)
            steps.append(f"ALTER TABLE {self._qualified()} ADD FOREIGN KEY ({cols}) REFERENCES {ref._qualified()} ({ref_cols})"
                         + (f" {fk.actions}" if fk.actions else ""))
            made.append(f"{self.name} ({', '.join(fk.columns)}) -> {ref.name} ({', '.join(fk.columns_referenced)})")
        if steps:
            targets.add_foreign_keys(connect(self.config), steps, lambda exc: translate(exc, self.config, "adding foreign keys"),
                                     self.where)
        return made if steps else []

    def committed(self, plan: SinkPlan) -> dict[str, int] | None:
        """{partition: rows} committed into this target under the plan's load id (None: no markers kept)."""
        once: commits.Once = plan.own.once
        if not once.markers:
            return None
        return self._on("reading commit markers", lambda con: commits.committed(con, once.schema, once.load_id, once.target))

    def _on(self, what: str, read: Any) -> Any:
        """``read(con)`` on a connection of its own (autocommit), its error the connector's, said as ``what``."""
        con = connect(self.config, autocommit=True)
        try:
            return read(con)
        except Exception as exc:
            raise translate(exc, self.config, what) from None
        finally:
            con.close()

    # --- verification ---------------------------------------------------------------------------

    def target_rows(self, plan: SinkPlan) -> int:
        return int(self._on("verifying", lambda con: con.execute(
            f"SELECT count(*) FROM {targets.scan(con, self._qualified(plan.write_target))}").fetchone())[0])

    def checksum(self, plan: SinkPlan) -> str:
        def read(con: Any) -> Any:
            return con.execute(f"SELECT count(*), coalesce(sum({row_hash_sql(plan.columns)}), 0) "
                               f"FROM {targets.scan(con, self._qualified(plan.write_target))}").fetchone()

        n, h = self._on("verifying", read)
        n0, h0 = plan.own.checksum_before
        return f"{n - n0}:{h - h0}"

    # --- finalize / abort -----------------------------------------------------------------------

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        if plan.own.definition is not None:  # its indexes over the staged rows, several at once, before the swap's transaction
            definition.build_indexes(lambda: connect(self.config, autocommit=True), plan, self.config.schema, self.options.degree, self.where)
        con = connect(self.config)
        target = Target(self.config.schema, self.config.table, True)
        try:
            if StagedSink.staged(plan, self.config.table):
                if plan.load_mode == "merge":
                    # the keys written too (a numeric 1.0 the source now holds as 1.000, a nondeterministic collation's other
                    # spelling), but an identity GENERATED ALWAYS, which an UPDATE can set only to DEFAULT
                    always = targets.always_identity(con, self._qualified())
                    merged = merging.apply(con, plan.own.merge, self._qualified(), self._qualified(plan.write_target), self.where, ident,
                                           has_merge=con.info.server_version >= 150000, values=self.options.verify == "checksum",
                                           written_keys=[k for k in plan.own.merge.keys if k not in always],
                                           overriding="OVERRIDING SYSTEM VALUE ")  # a new row's identity GENERATED ALWAYS too
                    con.execute(f"DROP TABLE {self._qualified(plan.write_target)}")
                    note(f"{self.name}: {merged.describe()} (read back from the target before the merge committed)")
                else:
                    self._swap_in(con, plan, target, sum(r.rows for r in results))
                self._forget_markers(con, plan)  # a staged load is visible whole: its markers served their purpose
            elif plan.load_mode == "truncate":
                self._forget_markers(con, plan)  # in place, one partition: committed with it; no resume or retry follows a finalize
            self._commit_cursor(con, plan)
            con.commit()
            partitioned.say_default_rows(con, target, self.name)
            if self.config.analyze:
                con.execute(f"ANALYZE {self._qualified()}")
                con.commit()
        except Exception as exc:
            with contextlib.suppress(Exception):
                con.rollback()
            if isinstance(exc, ConveyorError):
                raise
            raise translate(exc, self.config, f"finalizing {self.name}") from None
        finally:
            con.close()
            commits.release_guard(self.options.run_id)

    def _swap_in(self, con: Any, plan: SinkPlan, target: Target, staged: int) -> None:
        """truncate / create / replace, in the finalize's transaction: the staged rows made the target's."""
        stage = self._qualified(plan.write_target)
        if plan.load_mode == "replace" and con.execute("SELECT to_regclass(%s) IS NOT NULL", [self._qualified()]).fetchone()[0]:
            targets.keep_identity(con, target, plan.write_target)  # the new table takes the old one's owner, grants and comment
        steps = swap_steps(plan.load_mode, self._qualified(), stage, ident(self.config.table), [ident(c) for c in plan.columns],
                           empty=f"TRUNCATE {targets.only_of(con, self._qualified())}".strip(), overriding="OVERRIDING SYSTEM VALUE ")
        if self.config.unlogged_load and not self.config.unlogged and plan.load_mode in ("create", "replace"):
            steps.insert(0, f"ALTER TABLE {stage} SET LOGGED")  # with its indexes
        if plan.own.primary_key:  # built once over the loaded rows; a duplicate fails here, the target untouched
            steps.insert(0, f"ALTER TABLE {stage} ADD PRIMARY KEY ({', '.join(ident(c) for c in plan.own.primary_key)})")
        insert = steps[1] if plan.load_mode == "truncate" else None
        if plan.load_mode == "truncate" and self.config.rebuild_indexes:
            drop, build = targets.loose_indexes(con, target)
            steps = [steps[0], *drop, steps[1], *build, *steps[2:]]  # empty, drop, insert, build, drop stage
        if plan.own.definition is not None:  # the source table's definition, built over the loaded rows
            definition.carry(con, plan, self.config.schema, self.config.table, self.where, self.name)
        for step in steps:
            done = con.execute(step)
            if step is insert:
                check_taken(self.where, done.rowcount, staged)
        if plan.load_mode != "truncate":
            targets.rename_stage_indexes(con, target, plan.write_target)
            # the stage's label (whose it is, for clean) is not the table's: gone where neither the source nor the old table
            # gave the table a comment of its own
            said = con.execute("SELECT obj_description(%s::regclass, 'pg_class')", [self._qualified()]).fetchone()[0]
            if said and said.startswith('{"conveyor": "staging table"'):
                con.execute(f"COMMENT ON TABLE {self._qualified()} IS NULL")

    def _forget_markers(self, con: Any, plan: SinkPlan) -> None:
        once: commits.Once = plan.own.once
        if once.markers:
            commits.forget(con, once.schema, once.load_id, once.target)

    def abort(self, plan: SinkPlan) -> None:
        try:
            if plan.own.added and (plan.write_target != self.config.table or self.committed(plan) == {}):  # nothing of it stayed
                self._on("dropping the columns this run added", lambda con: drop_added(con, self._qualified(), plan.own.added))
            if plan.write_target == self.config.table:
                return
            con = connect(self.config, autocommit=True)
            try:
                con.execute(f"DROP TABLE IF EXISTS {self._qualified(plan.write_target)}")
                self._forget_markers(con, plan)
                if plan.own.window is not None:  # nothing of a staged load stayed: its window is not pending
                    commits.clear_pending(con, self.config.schema, self.name, plan.own.window.column, self.options.load)
            finally:
                con.close()
        finally:
            commits.release_guard(self.options.run_id)
