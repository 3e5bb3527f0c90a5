"""Sync from MySQL / MariaDB (incremental.method=replication, source=mysql) against real servers: a
MariaDB with its binary log on (ROW, FULL images) written while the first load runs and between runs
(inserts, updates, key updates, deletes, a TRUNCATE); the target compared with the source (every row,
as each server prints it) after every run once the source is quiet; the driver SIGKILLed at the first
load, inside the apply and after the commit (by a wrapper that kills the real process at that call);
every prerequisite and a purged binlog refused by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import BackgroundWriter, pg_exec, run_cli, runtime_args

COLUMNS = ("id BIGINT PRIMARY KEY, a VARCHAR(40) NOT NULL, n DECIMAL(30,2), d DATE, dt DATETIME(6), b VARBINARY(16), "
           "big MEDIUMTEXT")
MY_VIEW = ("SELECT id, a, CAST(n AS CHAR), DATE_FORMAT(d, '%Y-%m-%d'), DATE_FORMAT(dt, '%Y-%m-%d %H:%i:%s.%f'), LOWER(HEX(b)), "
           "MD5(COALESCE(big, '')) FROM {t} ORDER BY id")
PG_VIEW = ("SELECT id, a, n::text, to_char(d, 'YYYY-MM-DD'), to_char(dt, 'YYYY-MM-DD HH24:MI:SS.US'), encode(b, 'hex'), "
           "md5(coalesce(big, '')) FROM {t} ORDER BY id")


def _row(i: int) -> str:
    return (f"({i}, 'a{i} é', {i}000000000000.25, DATE '2020-01-01' + INTERVAL {i % 3000} DAY, "
            f"TIMESTAMP '2026-01-01 00:00:00.123456' + INTERVAL {i} SECOND, UNHEX(MD5('{i}')), {'REPEAT(MD5(1), 2000)' if i % 997 == 0 else 'NULL'})")


@pytest.fixture
def binlog_server(mysql_server):
    """The session's MariaDB server: its binary log is on, in ROW format with full images (what a sync needs)."""
    return mysql_server


@pytest.fixture
def my_src(binlog_server, pg_target):
    binlog_server.execute("DROP TABLE IF EXISTS ms_t", f"CREATE TABLE ms_t ({COLUMNS})",
                          "INSERT INTO ms_t " + "SELECT * FROM (" + " UNION ALL ".join(f"SELECT {_row(i)[1:-1]}" for i in range(1, 2)) + ") x")
    binlog_server.execute("INSERT INTO ms_t SELECT seq, CONCAT('a', seq, ' é'), seq * 1000000000000 + 0.25, "
                          "DATE '2020-01-01' + INTERVAL (seq % 3000) DAY, TIMESTAMP '2026-01-01 00:00:00.123456' + INTERVAL seq SECOND, "
                          "UNHEX(MD5(seq)), IF(seq % 997 = 0, REPEAT(MD5(1), 2000), NULL) FROM seq_2_to_20000")
    yield binlog_server
    pg_exec(pg_target, "DROP TABLE IF EXISTS _conveyor_sync")


def _args(src, dst, *more: str, table: str = "ms_t", target: str = "ms_t") -> list[str]:
    strategy = [] if any(m.startswith("strategy=") for m in more) else ["strategy=none"]
    return ["run", "source=mysql", "sink=postgres", f"source.port={src.port}", f"source.user={src.user}", f"source.database={src.database}",
            f"source.table={table}", f"sink.port={dst.port}", f"sink.table={target}", "load_mode=replace",
            "incremental.method=replication", *strategy, *more]


def _sync(tmp_path: Path, args: list[str], name: str) -> dict:
    report = tmp_path / f"{name}.json"
    r = run_cli("--report", str(report), *args, f"hydra.run.dir={tmp_path}/{name}", timeout=300)
    assert r.code == 0, r.err
    return json.loads(report.read_text())


def _same(src, dst, table: str = "ms_t", target: str = "ms_t") -> None:
    want = [tuple(r) for r in src.execute(MY_VIEW.format(t=table))]
    got = [tuple(r) for r in pg_exec(dst, PG_VIEW.format(t=target))]
    assert len(got) == len(want) and got == want


def _changes(src, low: int, high: int) -> None:
    """Updates, a key moved, deletes and inserts over ids low..high."""
    src.execute(f"UPDATE ms_t SET a = CONCAT(a, 'u'), n = -n WHERE id BETWEEN {low} AND {high} AND id % 3 = 0",
                f"UPDATE ms_t SET id = -id - 1000000 WHERE id = {low + 1}",
                f"DELETE FROM ms_t WHERE id BETWEEN {low} AND {high} AND id % 5 = 0",
                f"INSERT INTO ms_t VALUES {', '.join(_row(i) for i in range(high + 100000, high + 100050))}")


class Writer(BackgroundWriter):
    """Writes the source while a run goes on: small transactions of an insert, an update and a delete (bounded)."""

    def __init__(self, server, start: int) -> None:
        super().__init__()
        self.server, self.next = server, start

    def _run(self) -> None:
        con = self.server.connect()
        try:
            with con.cursor() as cur:
                for _ in range(2000):  # bounded: at most 2,000 transactions
                    if self.stop.is_set():
                        return
                    i = self.next
                    self.next += 1
                    cur.execute("BEGIN")
                    cur.execute(f"INSERT INTO ms_t VALUES {_row(500000 + i)}")
                    cur.execute(f"UPDATE ms_t SET a = CONCAT(a, 'w'), n = n + 1 WHERE id = {1 + (i * 37) % 20000}")
                    cur.execute(f"DELETE FROM ms_t WHERE id = {1 + (i * 101) % 20000}")
                    cur.execute("COMMIT")
                    time.sleep(0.005)
        finally:
            con.close()


@pytest.mark.parametrize("kind", ["local", "ray"])
def test_a_mysql_sync_hands_a_parallel_first_load_to_the_binlog_exactly(my_src, pg_target, tmp_path: Path, kind: str, request) -> None:
    """The first load (rangeid, degree 2) while the source is written, then the run that reads again what changed while
    it read; runs after writes and during them; a key moved, a TRUNCATE: the target equal to the source after each
    run once the source is quiet."""
    args = _args(my_src, pg_target, "strategy=rangeid", "degree=2", "incremental.chunk_keys=40", *runtime_args(kind, request))
    with Writer(my_src, 0):
        first = _sync(tmp_path, args, "first")
    assert first["sync"]["first_load"]["rows"] > 19_000  # read live while the writer inserted and deleted
    [catch_up] = first["sync"]["runs"]  # the changes made while the load read, read again at once
    assert catch_up["changes"] > 0 and catch_up["staged"][0]["runtime"] == kind
    second = _sync(tmp_path, args, "second")  # the writes after the first run's position
    _same(my_src, pg_target)
    assert second["sync"]["runs"][0]["to"].startswith("binlog.")
    if kind == "ray":  # the runtime's part is the staged partitions above; the runs below are the feed's, run once (local)
        return
    _changes(my_src, 100, 400)
    with Writer(my_src, 5000):  # a run while the source is written
        _sync(tmp_path, args, "during")
    after = _sync(tmp_path, args, "after")
    run = after["sync"]["runs"][0]
    assert run["changes"] > 0 and run["staged"][0]["partitions"] >= -(-run["keys"] // 40)
    _same(my_src, pg_target)
    assert pg_exec(pg_target, "SELECT count(*) FROM ms_t WHERE id = -1000101") == [(1,)]
    my_src.execute("TRUNCATE TABLE ms_t", f"INSERT INTO ms_t VALUES {_row(7)}, {_row(8)}, {_row(9)}")
    truncated = _sync(tmp_path, args, "truncated")
    assert truncated["sync"]["runs"][0]["tables"][f"{my_src.database}.ms_t"]["full"] is True
    _same(my_src, pg_target)


_KILLER = """
import os, signal, sys
from conveyor.connectors.mysql import feed
from conveyor.kit import syncapply
from conveyor.cli import main

point = sys.argv[1]
def kill(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
if point == "first-load":               # the first load finished, its position not yet recorded
    syncapply.SqlChangeApplier.record_sync = kill
elif point == "apply":                  # inside the apply's transaction: rows deleted and written, not committed
    real = syncapply._verify
    def apply_then_kill(*a, **k):
        real(*a, **k)
        kill()
    syncapply._verify = apply_then_kill
elif point == "after-commit":           # the target committed the changes and their position, the run not yet ended
    feed.MySqlFeedRun.advance = kill
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("point", ["first-load", "apply", "after-commit"])
def test_a_driver_killed_at_each_step_then_run_again_is_exact(my_src, pg_target, tmp_path: Path, point: str) -> None:
    args = _args(my_src, pg_target, "strategy=rangeid", "degree=2", target="ms_k")
    if point != "first-load":
        _sync(tmp_path, args, "first")
        _changes(my_src, 1000, 1300)
    before = pg_exec(pg_target, PG_VIEW.format(t="ms_k")) if point == "apply" else None
    proc = subprocess.run([sys.executable, "-c", _KILLER, point, *args, f"hydra.run.dir={tmp_path}/killed"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    if point == "apply":
        assert pg_exec(pg_target, PG_VIEW.format(t="ms_k")) == before  # the apply had not committed: the target is as it was
    if point == "after-commit":
        _same(my_src, pg_target, target="ms_k")
    _changes(my_src, 2000, 2300)
    again = _sync(tmp_path, args, "again")
    assert ("first_load" in again["sync"]) == (point == "first-load")  # nothing recorded: the table was loaded again
    _same(my_src, pg_target, target="ms_k")


def test_a_composite_key_moved_and_a_second_run_at_once(binlog_server, pg_target, tmp_path: Path) -> None:
    """A two-column key (one of it text), a key moved within it; a run while another holds the job: refused by name."""
    binlog_server.execute("DROP TABLE IF EXISTS ms_c", "CREATE TABLE ms_c (k1 INT, k2 VARCHAR(10), v DECIMAL(9,3), PRIMARY KEY (k1, k2))",
                          "INSERT INTO ms_c SELECT seq % 50, CONCAT('ü', seq), seq / 8 FROM seq_1_to_3000")
    args = _args(binlog_server, pg_target, table="ms_c", target="ms_c")
    first = _sync(tmp_path, args, "first")
    binlog_server.execute("UPDATE ms_c SET k2 = CONCAT(k2, 'x') WHERE k1 = 3", "UPDATE ms_c SET k1 = k1 + 1000 WHERE k1 = 4",
                          "DELETE FROM ms_c WHERE k1 = 5", "UPDATE ms_c SET v = -v WHERE k1 = 6")
    # this run takes its position as on MySQL (no consistent snapshot status there): under a global read lock
    report = tmp_path / "second.json"
    locked = ("import sys\nfrom conveyor.connectors.mysql.feed import MySqlChangeFeed\nfrom conveyor.cli import main\n"
              "MySqlChangeFeed.lock_positions = True\nsys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", locked, "--report", str(report), *args, f"hydra.run.dir={tmp_path}/second"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(report.read_text())["sync"]["runs"][0]["keys"] == 120 + 120 + 60 + 60  # a moved key: its old and its new
    want = [tuple(map(str, r)) for r in binlog_server.execute("SELECT k1, k2, v FROM ms_c ORDER BY k1, k2")]
    got = [tuple(map(str, r)) for r in pg_exec(pg_target, "SELECT k1, k2, v FROM ms_c ORDER BY k1, k2 COLLATE \"C\"")]
    assert sorted(got) == sorted(want) and len(got) == 3000 - 60
    held = binlog_server.connect()
    try:
        with held.cursor() as cur:
            cur.execute(f"SELECT GET_LOCK('conveyor_sync:{first['sync']['slot']}', 0)")
            assert cur.fetchone()[0] == 1
        r = run_cli(*args, f"hydra.run.dir={tmp_path}/twice", timeout=120)
        assert r.code != 0 and "is running in another process" in r.err and "Traceback" not in r.err
    finally:
        held.close()


def test_prerequisites_a_recreated_table_and_a_purged_binlog_are_refused_by_name(binlog_server, pg_target, tmp_path: Path) -> None:
    from conveyor.testing.mysqlserver import MySqlServer

    def refused(args: list[str], *words: str, env: dict[str, str] | None = None) -> None:
        r = run_cli(*args, f"hydra.run.dir={tmp_path}/refused", timeout=120, env=env)
        assert r.code != 0 and "Traceback" not in r.err, r.err
        assert all(w in r.err for w in words), r.err

    with MySqlServer("nobinlog", password=binlog_server.password) as off:  # the binary log off (mariadbd's default here)
        off.execute("CREATE TABLE ms_p (id INT PRIMARY KEY)")
        refused(_args(off, pg_target, table="ms_p", target="ms_p"), "binary log is off (log_bin)", "hint: set log_bin")
    binlog_server.execute("DROP TABLE IF EXISTS ms_p", "CREATE TABLE ms_p (id INT PRIMARY KEY, v INT)", "INSERT INTO ms_p VALUES (1, 1)",
                          "DROP TABLE IF EXISTS ms_nokey", "CREATE TABLE ms_nokey (id INT)",
                          "DROP TABLE IF EXISTS ms_fkey", "CREATE TABLE ms_fkey (id DOUBLE PRIMARY KEY)")
    args = _args(binlog_server, pg_target, table="ms_p", target="ms_p")
    for setting, value, words in (("binlog_format", "STATEMENT", "binlog_format is STATEMENT"),
                                  ("binlog_row_image", "MINIMAL", "binlog_row_image is MINIMAL")):
        binlog_server.execute(f"SET GLOBAL {setting} = '{value}'")
        try:
            refused(args, words)
        finally:
            binlog_server.execute(f"SET GLOBAL {setting} = '{'ROW' if setting == 'binlog_format' else 'FULL'}'")
    refused(_args(binlog_server, pg_target, table="ms_nokey", target="ms_nokey"), "has no primary key")
    refused(_args(binlog_server, pg_target, table="ms_fkey", target="ms_fkey"), "key column id is double")
    binlog_server.execute("CREATE USER IF NOT EXISTS 'norepl'@'%' IDENTIFIED BY 'pw-norepl-1'",
                          "GRANT SELECT, BINLOG MONITOR ON *.* TO 'norepl'@'%'")
    refused([*args, "source.user=norepl", "source.password_env=NOREPL_PW"], "may not read the binary log", "REPLICATION SLAVE",
            env={"NOREPL_PW": "pw-norepl-1"})
    binlog_server.execute("CREATE USER IF NOT EXISTS 'nopos'@'%' IDENTIFIED BY 'pw-nopos-1'",
                          "GRANT SELECT, REPLICATION SLAVE ON *.* TO 'nopos'@'%'")
    refused([*args, "source.user=nopos", "source.password_env=NOPOS_PW"], "may not read the binary log's position",
            "REPLICATION CLIENT (MariaDB: BINLOG MONITOR)", env={"NOPOS_PW": "pw-nopos-1"})
    # a table dropped and made again, the same columns: its rows since are not the ones the sync followed
    _sync(tmp_path, args, "first")
    binlog_server.execute("DROP TABLE ms_p", "CREATE TABLE ms_p (id INT PRIMARY KEY, v INT)", "INSERT INTO ms_p VALUES (2, 2)")
    refused(args, "sync of conveyor.ms_p stopped", "definition changed", "DROP TABLE")
    assert run_cli("clean", "--drop", *args[1:], f"hydra.run.dir={tmp_path}/clean").code == 0
    again = _sync(tmp_path, args, "again")
    assert "first_load" in again["sync"] and pg_exec(pg_target, "SELECT id, v FROM ms_p") == [(2, 2)]
    # the binlog that holds the changes since the target's position purged
    binlog_server.execute("INSERT INTO ms_p VALUES (3, 3)")
    for _ in range(40):  # MariaDB keeps a file until its crash-recovery checkpoint moved on (bounded: 10 s)
        binlog_server.execute("FLUSH BINARY LOGS")
        newest = binlog_server.execute("SHOW MASTER STATUS")[0][0]
        binlog_server.execute(f"PURGE BINARY LOGS TO '{newest}'")
        if binlog_server.execute("SHOW BINARY LOGS")[0][0] == newest:
            break
        time.sleep(0.25)
    refused(args, "was purged", "the changes between are lost", "conveyor clean --drop")
    assert pg_exec(pg_target, "SELECT id, v FROM ms_p") == [(2, 2)]


def test_positions_and_statements_read_from_the_binlog() -> None:
    from conveyor.connectors.mysql import binlog

    pos = binlog.position("binlog.000003", 1234)
    assert binlog.text("binlog", pos) == "binlog.000003:1234" and binlog.split(pos) == (3, 1234)
    assert binlog.position("binlog.000004", 4) > binlog.position("binlog.000003", 4_000_000_000)
    table = binlog.BinlogTable("db", "t", (("id", "int(11)", "int"), ("v", "varchar(5)", "varchar")), (0,))
    assert binlog.changed_columns(table.signature, table.signature.replace("varchar(5)", "varchar(9)")) == "column v varchar(5) -> varchar(9)"

    class Event:
        def __init__(self, query: str, schema: bytes = b"db") -> None:
            self.query, self.schema = query, schema

    out = binlog.Decoded(keys={(1,)})
    binlog._statement(Event("TRUNCATE TABLE `t`"), table, out)
    assert out.truncated and not out.keys
    for other in ("TRUNCATE TABLE t2", "ALTER TABLE other ADD COLUMN x INT", "BEGIN", "CREATE TABLE tt (id INT)"):
        binlog._statement(Event(other), table, binlog.Decoded())  # not this table: nothing
    binlog._statement(Event("DROP TABLE t", b"elsewhere"), table, binlog.Decoded())  # another schema's t
    with pytest.raises(Exception, match="definition changed"):
        binlog._statement(Event("/* c */ ALTER TABLE t ADD COLUMN x INT"), table, binlog.Decoded())
    with pytest.raises(Exception, match="logged as a statement"):
        binlog._statement(Event("UPDATE t SET v = 'a'"), table, binlog.Decoded())


def test_a_mysql_sync_into_clickhouse(binlog_server, clickhouse_server, tmp_path: Path) -> None:
    """MariaDB's binlog into ClickHouse (partitions rebuilt and swapped in): written during the first load, then
    updates, a moved key, deletes and inserts, then a TRUNCATE; the target equal to the source after each run."""
    my, ch = binlog_server, clickhouse_server
    my.execute("DROP TABLE IF EXISTS mc_t", "CREATE TABLE mc_t (id BIGINT PRIMARY KEY, a VARCHAR(40) NOT NULL, n DECIMAL(18,2) NOT NULL)",
               "INSERT INTO mc_t SELECT seq, CONCAT('a', seq), seq / 4 FROM seq_1_to_20000")
    ch.execute("DROP TABLE IF EXISTS mc_t")
    args = ["run", "source=mysql", "sink=clickhouse", f"source.port={my.port}", f"source.user={my.user}", f"source.database={my.database}",
            "source.table=mc_t", f"sink.port={ch.http_port}", "sink.table=mc_t", "sink.partition_by='intDiv(id, 5000)'",
            "load_mode=replace", "incremental.method=replication", "strategy=rangeid", "degree=2"]

    def same() -> None:
        want = [tuple(map(str, r)) for r in my.execute("SELECT id, a, CAST(n AS CHAR) FROM mc_t ORDER BY id")]
        got = [tuple(r) for r in ch.execute("SELECT id, a, toString(n) FROM mc_t ORDER BY id FORMAT TSV")]
        assert len(got) == len(want) and got == want

    class Writes(BackgroundWriter):
        def _run(self) -> None:
            con = my.connect()
            try:
                with con.cursor() as cur:
                    for i in range(2000):  # bounded
                        if self.stop.is_set():
                            return
                        cur.execute(f"UPDATE mc_t SET a = CONCAT(a, 'w'), n = n + 1 WHERE id = {1 + (i * 37) % 20000}")
                        cur.execute(f"DELETE FROM mc_t WHERE id = {1 + (i * 101) % 20000}")
                        time.sleep(0.005)
            finally:
                con.close()

    with Writes():
        _sync(tmp_path, args, "first")
    _sync(tmp_path, args, "second")
    same()
    my.execute("UPDATE mc_t SET a = 'u', n = -n WHERE id % 7 = 0", "UPDATE mc_t SET id = 99999 WHERE id = 12",
               "DELETE FROM mc_t WHERE id BETWEEN 5000 AND 5100", "INSERT INTO mc_t VALUES (100000, 'new', 1.25)")
    done = _sync(tmp_path, args, "third")
    same()
    assert "partition(s) rewritten" in done["sync"]["runs"][0]["tables"][f"{my.database}.mc_t"]["detail"]
    my.execute("TRUNCATE TABLE mc_t", "INSERT INTO mc_t VALUES (3, 'after', 3.5), (7777, 'after', -1)")
    truncated = _sync(tmp_path, args, "truncated")
    assert truncated["sync"]["runs"][0]["tables"][f"{my.database}.mc_t"]["full"] is True
    same()


def test_keys_are_read_from_the_row_events_bytes_exactly_beside_every_column_type(binlog_server) -> None:
    """A five-column key of each key type (unsigned beyond the signed range, a negative decimal, fractional seconds, text,
    a date) beside columns of every other type, NULL or not, long or short: the keys read from the binlog's bytes are
    the keys the server holds, as its own text of them (written, updated before and after, deleted)."""
    from conveyor.connectors.mysql import binlog
    from conveyor.connectors.mysql.common import MySqlConnConfig

    my = binlog_server
    my.execute("DROP TABLE IF EXISTS mk_t", """CREATE TABLE mk_t (
        ti TINYINT, u BIGINT UNSIGNED NOT NULL, sm SMALLINT UNSIGNED, d DECIMAL(20,4) NOT NULL, md MEDIUMINT, f FLOAT, db DOUBLE,
        vc VARCHAR(300), dt DATETIME(3) NOT NULL, tx MEDIUMTEXT, bl BLOB, js JSON, en ENUM('a','b'), st SET('x','y'), bt BIT(10),
        tm TIME(2), ts TIMESTAMP(6) NULL, yr YEAR, c CHAR(4) NOT NULL, wide DECIMAL(65,30), dd DATE NOT NULL, iu INT UNSIGNED,
        PRIMARY KEY (u, d, dt, c, dd))""")
    cols = "ti, u, sm, d, md, f, db, vc, dt, tx, bl, js, en, st, bt, tm, ts, yr, c, wide, dd, iu"
    my.execute(f"INSERT INTO mk_t ({cols}) VALUES "
               "(-1, 18446744073709551615, 65535, -123.4500, -8388608, 1.5, -2.5e300, REPEAT('é', 300), '2024-02-29 23:59:59.123', "
               "REPEAT('t', 65000), X'00ff', '{\"a\": 1}', 'b', 'x,y', b'1010101010', '-838:59:59.99', '2038-01-19 03:14:07.999999', "
               "2155, 'äbc', -12345678901234567890.123456789012345678901234567890, '1000-01-01', 4294967295),"
               "(NULL, 0, NULL, 0.0001, NULL, NULL, NULL, NULL, '1970-01-01 00:00:00.000', NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
               "NULL, NULL, '', NULL, '9999-12-31', NULL),"
               "(5, 9223372036854775808, 1, 99999999999999.9999, 1, 0, 0, 'x', '2000-01-01 12:00:00.5', '', '', 'null', 'a', '', "
               "b'0', '00:00:00', NULL, 1901, 'z', 0, '2000-02-29', 0)")
    config = MySqlConnConfig(host="127.0.0.1", port=my.port, user=my.user, database=my.database)
    con = config.connect()
    try:
        mariadb, base = binlog.check_server(con)
    finally:
        con.close()
    table = binlog.describe(config, "mk_t")
    texts = "SELECT CAST(u AS CHAR), CAST(d AS CHAR), CAST(dt AS CHAR), c, CAST(dd AS CHAR) FROM mk_t"

    def held() -> set[tuple]:
        return {(int(u), d, dt, c, dd) for u, d, dt, c, dd in my.execute(texts)}

    before = held()
    since = binlog.consistent(config, mariadb)
    my.execute("UPDATE mk_t SET tx = 'changed', js = '[1]' WHERE c = 'äbc'", "UPDATE mk_t SET u = 42, dt = '2001-01-01 00:00:00.001' WHERE c = ''",
               "DELETE FROM mk_t WHERE c = 'z'", f"INSERT INTO mk_t ({cols}) SELECT ti, 7, sm, -d, md, f, db, vc, dt, tx, bl, js, en, "
               "st, bt, tm, ts, yr, 'new', wide, dd, iu FROM mk_t WHERE c = 'äbc'")
    after = held()
    got = binlog.read(config, mariadb, base, table, since, binlog.consistent(config, mariadb))
    assert got.changes == 4 and got.keys == before | after, (got.keys, before | after)
