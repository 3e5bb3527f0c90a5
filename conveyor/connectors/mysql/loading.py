"""How the MySQL sink's rows go in, one InnoDB transaction per partition: LOAD DATA LOCAL INFILE fed
CSV by DuckDB through a pipe (``load_data``), or INSERTs through DuckDB's mysql extension (``insert``);
each checks the count the server stored and seals the partition's commit marker in the same transaction."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from conveyor.connectors.mysql import commits
from conveyor.connectors.mysql.common import MySqlConnConfig, _duck_connection, qident
from conveyor.core import Partition, SinkPlan, WriteStats, check_stored
from conveyor.errors import TransferError
from conveyor.kit import duckext
from conveyor.kit.arrowutil import CountingBatches

if TYPE_CHECKING:
    from conveyor.connectors.mysql.common import MySqlSinkConfig


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

def in_duck(conf: MySqlConnConfig, table: str) -> str:
    """A MySQL table as DuckDB names it through the attached server."""
    return f"my.{_dq(conf.database or '')}.{_dq(table)}"


def _csv_columns(plan: SinkPlan) -> tuple[list[str], list[str], list[str]]:
    """What DuckDB selects into the CSV for each column, what LOAD DATA reads it into, and its SET clauses:
    bytes as hex (UNHEX on the server, through a variable), bools as 0/1, zoned timestamps as UTC."""
    import pyarrow as pa

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
    return exprs, targets, sets


def _refuse_warnings(config: MySqlSinkConfig, con: Any, key: str) -> None:
    """LOAD DATA LOCAL turns bad values into warnings and goes on: any warning fails the partition, by name."""
    warnings = con.show_warnings() if getattr(con._result, "warning_count", 0) else ()
    if warnings:
        level, code, message = warnings[0][:3]
        raise TransferError(f"{config.where()}: writing {key}: MySQL changed or refused a value ({level} {code}: "
                            f"{message}; {len(warnings)} such)", partition=key, retriable=False,
                            hint="LOAD DATA turns bad values into warnings; the partition was rolled back. Fix the value, "
                                 "or the target column's type")


def load_data(config: MySqlSinkConfig, plan: SinkPlan, part: Partition, batches: Iterable[Any], attempt: commits.Attempt) -> WriteStats:
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
    exprs, targets, sets = _csv_columns(plan)
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
        con = config.connect(autocommit=False, partition=part.key, local_infile=True)
        table = f"{qident(config.database or '')}.{qident(plan.write_target)}"
        sql = (f"LOAD DATA LOCAL INFILE '{_fd_path(read_end)}' INTO TABLE {table} "
               "CHARACTER SET utf8mb4 FIELDS TERMINATED BY ',' ENCLOSED BY '\"' ESCAPED BY '' LINES TERMINATED BY '\n' "
               f"({', '.join(targets)})" + (f" SET {', '.join(sets)}" if sets else ""))
        with con.cursor() as cur:
            try:
                loaded = cur.execute(sql)
            except Exception as exc:
                _drain(read_end, writer)
                if counted.error is not None:
                    raise counted.error from None
                raise config.translate(exc, f"writing {part.key}", part.key) from None
            writer.join(timeout=60)
            if counted.error is not None:
                raise counted.error
            if failed:
                raise TransferError(f"{config.where()}: writing {part.key}: {str(failed[0]).splitlines()[0]}", partition=part.key)
            _refuse_warnings(config, con, part.key)
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


def insert(config: MySqlSinkConfig, plan: SinkPlan, part: Partition, batches: Iterable[Any], attempt: commits.Attempt) -> WriteStats:
    import pyarrow as pa

    start = time.perf_counter()
    counted = CountingBatches(batches, plan.schema)
    reader = pa.RecordBatchReader.from_batches(plan.schema, counted)
    dq, into = _dq, in_duck(config, plan.write_target)
    sql = (f"INSERT INTO {into} ({', '.join(dq(c) for c in plan.columns)}) "
           f"SELECT {', '.join(dq(c) for c in plan.source_columns)} FROM __conveyor_batches")
    with _duck_connection(config, write=True) as duck:
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
                         lambda: duck.execute(f"SELECT count(*) FROM {in_duck(config, commits.MARKERS)} WHERE load_id = ? "
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
