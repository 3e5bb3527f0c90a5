"""The MySQL / MariaDB sink: one InnoDB transaction per partition, rows by LOAD DATA LOCAL INFILE (or
INSERTs through DuckDB's mysql extension); truncate/create/replace/merge through a staging table."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.mysql import commits
from conveyor.connectors.mysql.common import MYSQL_DIALECT, MySqlConnConfig, _duck_connection, qident
from conveyor.core import JobOptions, Partition, PrepareRequest, SinkCapabilities, SinkPlan, TargetInfo, WriteStats, check_stored, target_for
from conveyor.errors import ConfigError, ConveyorError, SchemaError, TransferError
from conveyor.kit import duckext, guard
from conveyor.kit import merge as merging
from conveyor.kit.arrowutil import CountingBatches, length_checked
from conveyor.kit.mapping import TargetColumn, map_columns
from conveyor.kit.merge import MergeOptions
from conveyor.kit.staged import StagedSink, check_mode, staged_path
from conveyor.log import note, warn


@dataclass
class MySqlSinkConfig(MergeOptions, MySqlConnConfig):
    table: str = "???"
    #: target columns whose values MySQL may convert by its own rules (``[*]``: all)
    allow_cast: list[str] = field(default_factory=list)
    #: how rows go in: load_data (LOAD DATA LOCAL INFILE, fed CSV by DuckDB through a pipe; about 3x the
    #: insert path's speed here; any warning MySQL raises fails the partition), insert (DuckDB's mysql
    #: extension, batched INSERTs), or auto: load_data where the server allows LOCAL INFILE, else insert
    bulk: str = "auto"
    #: record each partition's commit in `_conveyor_commits` (and the run in `_conveyor_runs`) in the
    #: target's database, in the partition's own transaction: exactly once whatever died when, and
    #: resume asks the target. false: where you may not create tables (the run's state is then
    #: checked by named locks just before COMMIT, with a small window; resume trusts the manifest)
    commit_markers: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bulk not in ("auto", "load_data", "insert"):
            raise ValueError(f"bulk: {self.bulk!r} is not one of auto, load_data, insert")
        self.check_merge_options()


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


def arrow_to_mysql(f: Any) -> str:
    """The MySQL column type ``create`` gives an Arrow field (values kept exactly, or refused by name)."""
    import pyarrow as pa
    import pyarrow.types as t

    typ = f.type
    if isinstance(typ, pa.BaseExtensionType) and typ.extension_name == "arrow.uuid":
        return "CHAR(36) CHARACTER SET ascii"  # its canonical text (MySQL has no uuid type): the same value, readable
    if isinstance(typ, pa.BaseExtensionType) and typ.extension_name == "arrow.json":
        return "LONGTEXT"  # the document's text as it is (MySQL's JSON type would reorder and reformat it)
    if t.is_dictionary(typ):
        typ = typ.value_type
    simple = [(t.is_boolean, "BOOLEAN"), (t.is_int8, "TINYINT"), (t.is_int16, "SMALLINT"), (t.is_int32, "INT"), (t.is_int64, "BIGINT"),
              (t.is_uint8, "TINYINT UNSIGNED"), (t.is_uint16, "SMALLINT UNSIGNED"), (t.is_uint32, "INT UNSIGNED"),
              (t.is_uint64, "BIGINT UNSIGNED"), (t.is_float32, "FLOAT"), (t.is_float64, "DOUBLE"), (t.is_date, "DATE"),
              (t.is_string, "LONGTEXT"), (t.is_large_string, "LONGTEXT"), (t.is_binary, "LONGBLOB"), (t.is_large_binary, "LONGBLOB"),
              (t.is_fixed_size_binary, "LONGBLOB")]
    if hasattr(t, "is_string_view") and (t.is_string_view(typ) or t.is_binary_view(typ)):
        return "LONGTEXT" if t.is_string_view(typ) else "LONGBLOB"
    for test, sql in simple:
        if test(typ):
            return sql
    if t.is_timestamp(typ):
        if typ.unit == "ns":
            raise SchemaError(f"column {f.name}: {typ} has nanoseconds; MySQL keeps microseconds",
                              hint="cast it to microseconds in the source")
        return "DATETIME(6)"  # a timestamp with a time zone is kept as its UTC wall-clock time
    if t.is_time(typ) and typ.unit in ("s", "ms", "us"):
        return "TIME(6)"
    if t.is_decimal(typ) and typ.precision <= 65 and typ.scale <= 30:
        return f"DECIMAL({typ.precision},{typ.scale})"
    raise SchemaError(f"column {f.name}: Arrow type {typ} has no exact MySQL type",
                      hint="cast it in the source (e.g. to text), or create the target table yourself")


def _own_mapping(typ: Any) -> bool:
    """Whether ``create`` gives this Arrow type a column of another kind that holds it exactly by design
    (arrow_to_mysql: a zoned timestamp as its UTC wall-clock time, a uuid as its canonical text)."""
    import pyarrow as pa

    return (pa.types.is_timestamp(typ) and typ.tz is not None) or (isinstance(typ, pa.BaseExtensionType)
                                                                     and typ.extension_name == "arrow.uuid")


class _Rows:
    """A PyMySQL connection with the ``execute(...).fetchone()/fetchall()`` shape merging.check_keys uses."""

    def __init__(self, con: Any) -> None:
        self.con = con

    def execute(self, sql: str) -> Any:
        cur = self.con.cursor()
        cur.execute(sql)
        return cur


def _drain(fd: int, writer: threading.Thread) -> None:
    """A pipe's writer still running (the server stopped reading, or never began): read the pipe empty
    through ``fd``, its read end, so the writer's writes return and it ends (bounded: 30 s)."""
    if not writer.is_alive():
        return
    with contextlib.suppress(OSError):
        os.set_blocking(fd, False)
        deadline = time.monotonic() + 30
        while writer.is_alive() and time.monotonic() < deadline:
            try:
                if not os.read(fd, 1 << 20):
                    time.sleep(0.01)
            except BlockingIOError:
                time.sleep(0.01)
    writer.join(timeout=5)


def _fd_path(fd: int) -> str:
    """A path that opens this process's file descriptor ``fd`` (a pipe's end: it has no name of its own)."""
    return f"/dev/fd/{fd}" if os.path.isdir("/dev/fd") else f"/proc/self/fd/{fd}"


def _dq(name: str) -> str:
    """A DuckDB identifier."""
    return '"' + name.replace('"', '""') + '"'


def _in_duck(conf: MySqlConnConfig, table: str) -> str:
    """A MySQL table as DuckDB names it through the attached server."""
    return f"my.{_dq(conf.database or '')}.{_dq(table)}"


class MySqlSink(StagedSink):
    """One MySQL transaction per partition (InnoDB); truncate/create/replace/merge through a staging table."""

    config_class = MySqlSinkConfig
    capabilities = SinkCapabilities(load_modes=("truncate", "append", "create", "replace", "merge"))
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
        return TargetInfo(label=self._where(), checks_before_commit=mode == "append", path=staged_path(mode, self._bulk()[1]))

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
        write_target = self.config.table
        if mode in ("create", "replace"):
            pairs = [(n, n) for n in schema.names]
            cols = ", ".join(f"{qident(f.name)} {arrow_to_mysql(f)}" for f in schema)
            self.config.run(f"CREATE TABLE {self._qualified(stage)} ({cols}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
                            doing=f"load_mode={mode}")
            write_target = stage
        else:
            assert target is not None
            pairs = map_columns(schema.names, target, self.options.map_method, where)
            merge = self._merge_plan(pairs, target) if mode == "merge" else None
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
            self._check_types(pairs, schema, write_target, where)
            lengths = self._text_lengths(pairs, write_target)
            before = self._count(self.config.table) if mode == "append" and self.options.verify != "none" else 0
            bulk = self._bulk()[0]
        except BaseException:
            if write_target != self.config.table:
                self._drop(write_target)
            raise
        once = commits.Once(self._marked_as(), self.options.load, self.config.commit_markers, self.options.run_id)
        return SinkPlan(rows_before=before, target=f"{self.config.where()}.{self.config.table}", write_target=write_target,
                        load_mode=mode, columns=tuple(t for _, t in pairs), source_columns=tuple(s for s, _ in pairs), schema=schema,
                        own=MyPlan(bulk, once, merge if mode == "merge" else None, lengths))

    def _text_lengths(self, pairs: list[tuple[str, str]], table: str) -> tuple[tuple[str, str, int, str], ...]:
        """MyPlan.lengths: the varchar(n) / char(n) columns of ``table`` the rows go into (not those
        ``sink.allow_cast`` leaves to MySQL's own rules)."""
        rows = self.config.run("SELECT column_name, character_maximum_length, column_type FROM information_schema.columns "
                               f"WHERE table_schema = DATABASE() AND table_name = {MYSQL_DIALECT.literal(table)} "
                               "AND data_type IN ('varchar', 'char')", doing="reading the target")
        limits = {name.lower(): (int(n), typ) for name, n, typ in rows}
        allowed = {c.lower() for c in self.config.allow_cast}
        return tuple((s, t, *limits[t.lower()]) for s, t in pairs
                     if t.lower() in limits and "*" not in allowed and t.lower() not in allowed)

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

    def _merge_plan(self, pairs: list[tuple[str, str]], target: list[TargetColumn]) -> merging.MergePlan:
        """merge's keys, which must be exactly a unique index of the target, and the target's only one:
        INSERT ... ON DUPLICATE KEY UPDATE matches rows by any unique index."""
        rows = self.config.run("SELECT index_name, GROUP_CONCAT(column_name ORDER BY seq_in_index) FROM information_schema.statistics "
                               f"WHERE table_schema = DATABASE() AND table_name = {MYSQL_DIALECT.literal(self.config.table)} "
                               "AND non_unique = 0 GROUP BY index_name", doing="reading the target's keys")
        uniques = {name: tuple(cols.split(",")) for name, cols in rows}
        plan = merging.plan(self.config, list(uniques.get("PRIMARY", ())), [t for _, t in pairs], [c.name for c in target], self._where())
        if sorted(plan.keys) not in [sorted(u) for u in uniques.values()]:
            raise ConfigError(f"load_mode=merge into {self._where()}: no unique index is exactly ({', '.join(plan.keys)})",
                              key="sink.merge_keys", hint="MySQL upserts by a unique index: add one on the merge keys, or merge on the "
                                                          "primary key")
        if len(uniques) > 1:
            raise ConfigError(f"load_mode=merge into {self._where()}: it has {len(uniques)} unique indexes "
                              f"({', '.join(sorted(uniques))}); ON DUPLICATE KEY UPDATE would match a row by any of them",
                              key="sink.merge_keys", hint="merge into a table whose only unique index is the merge key")
        return plan

    def _bulk(self) -> tuple[str, str]:
        """(load_data | insert, why) for ``sink.bulk``."""
        asked = self.config.bulk
        if asked == "insert":
            return "insert", "mysql: batched INSERTs through DuckDB's mysql extension (sink.bulk=insert)"
        allowed = str(self.config.run("SELECT @@local_infile", doing="reading the server's settings")[0][0]) in ("1", "ON")
        if allowed:
            return "load_data", f"mysql: LOAD DATA LOCAL INFILE, CSV written by DuckDB into a pipe (sink.bulk={asked})"
        if asked == "load_data":
            raise ConfigError(f"{self.config.where()}: sink.bulk=load_data: the server does not allow LOAD DATA LOCAL INFILE "
                              "(local_infile is OFF)", hint="SET GLOBAL local_infile = 1 on the server, or sink.bulk=insert")
        return "insert", "mysql: batched INSERTs through DuckDB's mysql extension (the server's local_infile is OFF)"

    def _check_types(self, pairs: list[tuple[str, str]], schema: Any, table: str, where: str) -> None:
        """The cast policy (conveyor/kit/casts.py) against the target's columns as DuckDB sees them."""

        from conveyor.kit.casts import ColumnType, check_casts

        with _duck_connection(self.config, write=True) as duck:
            try:
                duck.execute("CALL mysql_clear_cache()")
                target = duck.execute(f"SELECT * FROM {_in_duck(self.config, table)} LIMIT 0").arrow().schema
            except Exception as exc:
                raise self.config.translate(exc, "reading the target's columns") from None
        sources = [ColumnType.of_field(schema.field(s)) for s, _ in pairs]
        times = self._time_columns(table)
        targets = [times.get(t.lower()) or ColumnType(target.field(t).type) for _, t in pairs]
        if self.options.load_mode in ("create", "replace"):  # our own DATETIME(6) holds a UTC time, CHAR(36) a uuid's text:
            targets = [s if _own_mapping(s.arrow) else t for s, t in zip(sources, targets)]  # the documented mappings
        check_casts(pairs, sources, targets, where, self.config.allow_cast, engine="MySQL",
                    note="a time without a zone is then read as UTC: Conveyor's MySQL sessions use time_zone '+00:00'")

    def _time_columns(self, table: str) -> dict[str, Any]:
        """The target's date-time columns as the cast policy judges them, from the server's own types (DuckDB
        sees each as a microsecond timestamp): TIMESTAMP is an instant (stored in UTC, shown in the session's
        time zone: a time without a zone is not one), DATETIME a wall-clock time; both keep their precision's
        fractional digits (MySQL rounds or cuts the rest without a word)."""
        import pyarrow as pa

        from conveyor.kit.casts import ColumnType

        rows = self.config.run("SELECT column_name, data_type, datetime_precision, column_type FROM information_schema.columns "
                               f"WHERE table_schema = DATABASE() AND table_name = {MYSQL_DIALECT.literal(table)} "
                               "AND data_type IN ('timestamp', 'datetime', 'time')", doing="reading the target")
        kinds = {"timestamp": (pa.timestamp("us", tz="UTC"), "timestamptz"), "datetime": (pa.timestamp("us"), "timestamp"),
                 "time": (pa.time64("us"), "time")}
        return {name.lower(): ColumnType(kinds[typ][0], db=kinds[typ][1], sql=str(sql), typmod=int(digits or 0))
                for name, typ, digits, sql in rows}

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        attempt = commits.Attempt(self.config, plan.own.once, part.key, plan.expecting)
        done = attempt.committed_before()
        if done is not None:  # committed by an earlier attempt or run under this load id: nothing to write
            return done
        if plan.own.lengths:  # varchar(n) / char(n) targets: each value's length, before MySQL sees it
            batches = length_checked(batches, plan.own.lengths, part.key, "MySQL")
        try:
            if plan.own.bulk == "load_data":
                return self._load_data(plan, part, batches, attempt)
            return self._insert(plan, part, batches, attempt)
        except BaseException as exc:  # rolled back
            outcome = attempt.failed(exc)
            if isinstance(outcome, WriteStats):
                return outcome
            raise outcome from None

    def _load_data(self, plan: SinkPlan, part: Partition, batches: Iterable[Any], attempt: commits.Attempt) -> WriteStats:
        """LOAD DATA LOCAL INFILE in one transaction, fed through a pipe by DuckDB's CSV writer.

        The pipe has no name on disk: DuckDB writes to ``/dev/fd/<its write end>`` and the client
        reads ``/dev/fd/<its read end>``, both this process's. A named pipe in a temporary folder
        was left behind by a process killed mid-load (SIGKILL, the OOM killer): one per partition
        in flight, never removed.

        Every non-NULL field is quoted (a bare NULL is NULL; ``ESCAPED BY ''``: no backslash rules),
        bytes travel as hex (UNHEX on the server), bools as 0/1, timestamps with a time zone as UTC. LOAD
        DATA LOCAL turns bad values into warnings and goes on: any warning fails the partition, by name."""
        import duckdb
        import pyarrow as pa

        start = time.perf_counter()
        counted = CountingBatches(batches, plan.schema)
        reader = pa.RecordBatchReader.from_batches(plan.schema, counted)
        exprs, targets, sets = [], [], []
        for i, (src, tgt) in enumerate(zip(plan.source_columns, plan.columns)):
            typ, q = plan.schema.field(src).type, _dq(src)
            if pa.types.is_dictionary(typ):
                typ = typ.value_type
            if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ):
                exprs.append(f"hex({q})")
                targets.append(f"@v{i}")
                sets.append(f"{qident(tgt)} = UNHEX(@v{i})")
                continue
            if pa.types.is_boolean(typ):
                exprs.append(f"CAST({q} AS INTEGER)")
            elif pa.types.is_timestamp(typ) and typ.tz:
                exprs.append(f"CAST({q} AS TIMESTAMP)")  # the UTC wall-clock time (TimeZone is UTC)
            else:
                exprs.append(q)
            targets.append(qident(tgt))
        duck = duckdb.connect(config={"threads": 1})
        duck.execute("SET TimeZone = 'UTC'")
        duck.register("__conveyor_batches", reader)
        failed: list[BaseException] = []

        def produce() -> None:
            try:
                duck.execute(f"COPY (SELECT {', '.join(exprs)} FROM __conveyor_batches) TO {duckext.quote(_fd_path(write_end))} "
                             "(FORMAT csv, HEADER false, DELIMITER ',', QUOTE '\"', ESCAPE '\"', NULLSTR 'NULL', FORCE_QUOTE *, "
                             "NEW_LINE '\n')")
            except BaseException as exc:  # reported by the loading side
                failed.append(exc)
            finally:  # DuckDB closed its own; the reader sees the end once this one is closed too
                os.close(write_end)

        read_end, write_end = os.pipe()
        writer = threading.Thread(target=produce, name="conveyor-mysql-csv", daemon=True)
        try:
            writer.start()
        except BaseException:
            for fd in (read_end, write_end):
                os.close(fd)
            duck.close()
            raise
        con = None
        try:
            con = self.config.connect(autocommit=False, partition=part.key, local_infile=True)
            sql = (f"LOAD DATA LOCAL INFILE '{_fd_path(read_end)}' INTO TABLE {self._qualified(plan.write_target)} "
                   "CHARACTER SET utf8mb4 FIELDS TERMINATED BY ',' ENCLOSED BY '\"' ESCAPED BY '' LINES TERMINATED BY '\n' "
                   f"({', '.join(targets)})" + (f" SET {', '.join(sets)}" if sets else ""))
            with con.cursor() as cur:
                try:
                    loaded = cur.execute(sql)
                except Exception as exc:
                    _drain(read_end, writer)
                    if counted.error is not None:
                        raise counted.error from None
                    raise self.config.translate(exc, f"writing {part.key}", part.key) from None
                writer.join(timeout=60)
                if counted.error is not None:
                    raise counted.error
                if failed:
                    raise TransferError(f"{self.config.where()}: writing {part.key}: {str(failed[0]).splitlines()[0]}", partition=part.key)
                warnings = con.show_warnings() if getattr(con._result, "warning_count", 0) else ()
                if warnings:
                    level, code, message = warnings[0][:3]
                    raise TransferError(f"{self.config.where()}: writing {part.key}: MySQL changed or refused a value ({level} {code}: "
                                        f"{message}; {len(warnings)} such)", partition=part.key, retriable=False,
                                        hint="LOAD DATA turns bad values into warnings; the partition was rolled back. Fix the value, "
                                             "or the target column's type")
                check_stored(plan.target, part.key, counted.rows, loaded)  # LOAD DATA's own count of the rows it stored

                def fetch(sql: str) -> Any:
                    cur.execute(sql)
                    return cur.fetchone()

                attempt.seal(loaded, cur.execute, fetch)
            con.commit()
        except BaseException:
            if con is not None:
                with contextlib.suppress(Exception):
                    con.rollback()
            raise
        finally:
            _drain(read_end, writer)
            if con is not None:
                with contextlib.suppress(Exception):
                    con.close()
            with contextlib.suppress(Exception):
                duck.close()
            os.close(read_end)
        return WriteStats(part.key, counted.rows, counted.bytes, time.perf_counter() - start)

    def _insert(self, plan: SinkPlan, part: Partition, batches: Iterable[Any], attempt: commits.Attempt) -> WriteStats:
        import pyarrow as pa

        start = time.perf_counter()
        counted = CountingBatches(batches, plan.schema)
        reader = pa.RecordBatchReader.from_batches(plan.schema, counted)
        dq, into = _dq, _in_duck(self.config, plan.write_target)
        sql = (f"INSERT INTO {into} ({', '.join(dq(c) for c in plan.columns)}) "
               f"SELECT {', '.join(dq(c) for c in plan.source_columns)} FROM __conveyor_batches")
        with _duck_connection(self.config, write=True) as duck:
            duck.register("__conveyor_batches", reader)
            duck.execute("BEGIN")
            try:
                # the transaction's MySQL session reads times as UTC, as Conveyor's own sessions do (DuckDB writes
                # a TIMESTAMP WITH TIME ZONE as its UTC time; the server's default zone would shift it)
                duck.execute("CALL mysql_execute('my', 'SET time_zone = ''+00:00''')")
                inserted = duck.execute(sql).fetchone()[0]
                check_stored(plan.target, part.key, counted.rows, inserted)  # the INSERT's own count
                once = plan.own.once
                attempt.seal(inserted, lambda q: duck.execute(f"CALL mysql_execute('my', {duckext.quote(q)})") and None,
                             lambda q: duck.execute(f"SELECT * FROM mysql_query('my', {duckext.quote(q)})").fetchone(),
                             lambda: duck.execute(f"SELECT count(*) FROM {_in_duck(self.config, commits.MARKERS)} WHERE load_id = ? "
                                                  "AND target = ? AND part = ?", [once.load_id, once.target, part.key]).fetchone()[0])
                duck.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):
                    duck.execute("ROLLBACK")
                if counted.error is not None:  # the source failed; DuckDB only wrapped it
                    raise counted.error from None
                raise  # translated by write()
            finally:
                duck.unregister("__conveyor_batches")
        return WriteStats(part.key, counted.rows, counted.bytes, time.perf_counter() - start)

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
        comment = ""  # the stage's label goes; a replaced table's own comment stays
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
            merged.append(merging.apply(_Rows(con), plan.own.merge, self._qualified(), stage, self._where(), qident,
                                        values=self.options.verify == "checksum", mysql=True))

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
