"""Sync jobs (incremental.method=replication) against real servers: the source (wal_level=logical)
written while the first load runs and between and during the runs after it; each target compared
with its source (count and a checksum of every row) once the source is quiet and a run has applied
the rest; the driver SIGKILLed at each step of a run (by a wrapper that kills the real process at
that call: the code under test is not replaced), Ctrl-C during --follow, a source schema change,
a missing prerequisite and a target that cannot apply changes, each refused by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import BIN, BackgroundWriter, checksum, pg_exec, run_cli, runtime_args, wait_until

pytestmark = pytest.mark.pg_versions  # on PostgreSQL 15 and 18

COLUMNS = ("id int8 PRIMARY KEY, a text, n numeric(50, 2), f float8, d date, ts timestamptz, arr int[], j jsonb, b bytea, "
           "ch char(5), big text")


def _row(g: str) -> str:
    return (f"{g}, 'a' || {g}, {g} * 1000000000000000000000.25, {g} / 7.0, date '2020-01-01' + {g}::int, "
            f"timestamptz '2026-01-01 00:00:00+00' + {g} * interval '1 second', ARRAY[{g}::int, NULL], jsonb_build_object('g', {g}), "
            f"decode(md5({g}::text), 'hex'), 'c' || ({g} % 10), NULL")


@pytest.fixture
def sync_src(pg_source, pg_target):
    """A table of every kind of value, with a value stored out of line (TOAST), and no slot left behind after."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS sy_t", f"CREATE TABLE sy_t ({COLUMNS})",
            f"INSERT INTO sy_t SELECT {_row('g')} FROM generate_series(1, 20000) g",
            "INSERT INTO sy_t (id, a, n, f, d, big) VALUES (-1, 'special', 'NaN', 'NaN', 'infinity', repeat(md5('x'), 20000))")
    yield pg_source
    for server in (pg_source,):
        pg_exec(server, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'conveyor%' AND NOT active")
        for (pub,) in pg_exec(server, "SELECT pubname FROM pg_publication WHERE pubname LIKE 'conveyor%'"):
            pg_exec(server, f'DROP PUBLICATION "{pub}"')
    # the targets' sync state goes with the slots (a state whose slot is gone is refused by name)
    pg_exec(pg_target, "DROP TABLE IF EXISTS _conveyor_sync")


def _args(src, dst, table: str = "sy_t", target: str = "sy_t", *more: str) -> list[str]:
    strategy = [] if any(m.startswith("strategy=") for m in more) else ["strategy=none"]
    return ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", f"source.table={table}", f"sink.port={dst.port}",
            f"sink.table={target}", "load_mode=replace", "incremental.method=replication", *strategy, *more]


def _sync(tmp_path: Path, args: list[str], name: str) -> dict:
    report = tmp_path / f"{name}.json"
    r = run_cli("--report", str(report), *args, f"hydra.run.dir={tmp_path}/{name}", timeout=300)
    assert r.code == 0, r.err
    return json.loads(report.read_text())


def _same(src, dst, table: str = "sy_t", target: str = "sy_t") -> None:
    assert checksum(dst, target) == checksum(src, table)


def _changes(server, low: int, high: int) -> None:
    """Updates (one keeping the TOASTed value, one moving a key), deletes and inserts over ids low..high."""
    pg_exec(server, f"UPDATE sy_t SET a = a || 'u', f = -f WHERE id BETWEEN {low} AND {high} AND id % 3 = 0",
            "UPDATE sy_t SET a = 'toast kept' WHERE id = -1",
            f"UPDATE sy_t SET id = -id - 1000000 WHERE id = {low + 1}",
            f"DELETE FROM sy_t WHERE id BETWEEN {low} AND {high} AND id % 5 = 0",
            f"INSERT INTO sy_t SELECT {_row('g')} FROM generate_series({high + 100000}, {high + 100050}) g")


class Writer(BackgroundWriter):
    """Writes the source while a run goes on: small transactions of updates, deletes and inserts (bounded)."""

    def __init__(self, server, start: int) -> None:
        super().__init__()
        self.server, self.next = server, start

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.server.dsn(), autocommit=True) as con:
            for _ in range(2000):  # bounded: at most 2,000 transactions
                if self.stop.is_set():
                    return
                i = self.next
                self.next += 1
                with con.transaction():
                    con.execute(f"INSERT INTO sy_t SELECT {_row(str(500000 + i))}")
                    con.execute(f"UPDATE sy_t SET a = a || 'w', n = n + 1 WHERE id = {1 + (i * 37) % 20000}")
                    con.execute(f"DELETE FROM sy_t WHERE id = {1 + (i * 101) % 20000}")
                time.sleep(0.005)


def test_a_sync_hands_a_parallel_first_load_to_replication_exactly(sync_src, pg_target, tmp_path: Path, request) -> None:
    """The first load (ctid, degree 2) while the source is written; runs between and during writes; a
    primary-key update, a TOASTed value left unchanged by an update, a truncate: each target equal to its source."""
    _parallel_first_load(sync_src, pg_target, tmp_path, "local", request)


@pytest.mark.pg_versions("15")  # the runtime's part, not the server's version: on 18 the local runtime's test above
def test_a_sync_hands_a_parallel_first_load_to_replication_exactly_on_ray(sync_src, pg_target, tmp_path: Path, request) -> None:
    _parallel_first_load(sync_src, pg_target, tmp_path, "ray", request)


def _parallel_first_load(sync_src, pg_target, tmp_path: Path, kind: str, request) -> None:
    # the applies' changed rows staged in partitions of at most 40 keys, on the job's runtime at its degree
    args = _args(sync_src, pg_target, "sy_t", "sy_t", "strategy=ctid", "degree=2", "incremental.chunk_keys=40",
                 *runtime_args(kind, request))
    with Writer(sync_src, 0):
        first = _sync(tmp_path, args, "first")
    assert first["sync"]["first_load"]["rows"] > 20000
    second = _sync(tmp_path, args, "second")  # the writes made during the first load
    run = second["sync"]["runs"][0]
    assert run["changes"] > 0
    [staged] = run["staged"]
    assert staged["rows"] == run["keys"] and staged["partitions"] >= -(-run["keys"] // 40) >= 2
    assert staged["runtime"] == kind
    _same(sync_src, pg_target)
    _changes(sync_src, 100, 400)
    with Writer(sync_src, 5000):  # a run while the source is written
        _sync(tmp_path, args, "during")
    _sync(tmp_path, args, "after")
    _same(sync_src, pg_target)
    assert pg_exec(pg_target, "SELECT a, length(big) FROM sy_t WHERE id = -1") == [("toast kept", 640000)]
    assert pg_exec(pg_target, "SELECT count(*) FROM sy_t WHERE id = -1000101") == [(1,)]
    pg_exec(sync_src, "TRUNCATE sy_t", f"INSERT INTO sy_t SELECT {_row('g')} FROM generate_series(7, 9) g")
    truncated = _sync(tmp_path, args, "truncated")
    assert truncated["sync"]["runs"][0]["tables"]["public.sy_t"]["full"] is True
    _same(sync_src, pg_target)


_KILLER = """
import os, signal, sys
from conveyor.connectors.postgres import replication
from conveyor.kit import syncapply
from conveyor.cli import main

point = sys.argv[1]
def kill(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
if point == "first-load-recorded":      # the first load finished, its position not yet recorded
    syncapply.SqlChangeApplier.record_sync = kill
elif point == "apply":                  # inside the apply's transaction: rows deleted and written, not committed
    real = syncapply._verify
    def apply_then_kill(*a, **k):
        real(*a, **k)
        kill()
    syncapply._verify = apply_then_kill
elif point == "after-commit":           # the target committed the changes, the slot not yet advanced
    calls = []
    real_advance = replication.advance
    def advance(con, slot, to):
        if not slot.startswith("conveyor_") or calls:
            return real_advance(con, slot, to)
        calls.append(to)
        kill()
    replication.advance = advance
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.pg_versions("15")  # the driver's steps, not the server's version (a sync on 18: the other tests here)
@pytest.mark.parametrize("point", ["first-load-recorded", "apply", "after-commit"])
def test_a_driver_killed_at_each_step_then_run_again_is_exact(sync_src, pg_target, tmp_path: Path, point: str) -> None:
    args = _args(sync_src, pg_target, "sy_t", "sy_k", "strategy=ctid", "degree=2")
    if point != "first-load-recorded":
        _sync(tmp_path, args, "first")
        _changes(sync_src, 1000, 1300)
    before = checksum(pg_target, "sy_k") if point != "first-load-recorded" else None
    proc = subprocess.run([sys.executable, "-c", _KILLER, point, *args, f"hydra.run.dir={tmp_path}/killed"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    if point == "apply":
        assert checksum(pg_target, "sy_k") == before  # the apply had not committed: the target is as it was
    if point == "after-commit":
        _same(sync_src, pg_target, "sy_t", "sy_k")  # committed, and the slot still behind it
        slot = pg_exec(sync_src, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name LIKE 'conveyor%'")
        held = pg_exec(pg_target, "SELECT position FROM _conveyor_sync WHERE target = 'public.sy_k'")
        assert len(slot) == 1 and held and held[0][0] > int(slot[0][0].split("/")[0], 16) << 32 | int(slot[0][0].split("/")[1], 16)
    _changes(sync_src, 2000, 2300)
    again = _sync(tmp_path, args, "again")
    if point == "first-load-recorded":
        assert "first_load" in again["sync"]  # nothing recorded: the table was loaded again
        _changes(sync_src, 3000, 3300)
        _sync(tmp_path, args, "then")
    _same(sync_src, pg_target, "sy_t", "sy_k")


def test_ctrl_c_during_follow_stops_with_every_applied_change_committed(sync_src, pg_target, tmp_path: Path) -> None:
    args = _args(sync_src, pg_target, "sy_t", "sy_f")
    _sync(tmp_path, args, "first")
    report = tmp_path / "follow.json"
    proc = subprocess.Popen([str(BIN / "conveyor"), "--report", str(report), *args, "incremental.follow=0.2",
                             f"hydra.run.dir={tmp_path}/follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: report.exists() and json.loads(report.read_text())["sync"]["runs"], "a first apply of --follow", 60)
        _changes(sync_src, 500, 800)
        wait_until(lambda: checksum(pg_target, "sy_f") == checksum(sync_src, "sy_t"), "the changes applied by --follow", 60)
        runs = len(json.loads(report.read_text())["sync"]["runs"])
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    # stopped between two applies (every applied change committed) or during one (which then commits nothing)
    assert "Traceback" not in err and "error: sync stopped" in err and "committed" in err, err
    done = json.loads(report.read_text())
    assert done["status"] == "cancelled" and len(done["sync"]["runs"]) >= runs >= 2
    assert done["sync"]["runs"][-1]["lag_bytes"] >= 0 and "changes_per_second" in done["sync"]["runs"][-1]
    _same(sync_src, pg_target, "sy_t", "sy_f")


def test_a_source_schema_change_stops_the_sync_by_name(sync_src, pg_target, tmp_path: Path) -> None:
    args = _args(sync_src, pg_target, "sy_t", "sy_s")
    _sync(tmp_path, args, "first")
    pg_exec(sync_src, "ALTER TABLE sy_t ADD COLUMN extra int", "ALTER TABLE sy_t ALTER COLUMN a TYPE varchar(100)")
    r = run_cli(*args, f"hydra.run.dir={tmp_path}/changed")
    assert r.code != 0 and "Traceback" not in r.err
    assert r.error_lines == ["error: sync of public.sy_t stopped: the source table changed since the sync began: column extra added "
                             "(integer); column a retyped from text to character varying(100)"], r.err
    assert "hint: change the target to match, then conveyor clean --drop" in r.err


def test_a_trigger_that_drops_rows_fails_the_apply_and_the_target_keeps_its_rows(sync_src, pg_target, tmp_path: Path) -> None:
    args = _args(sync_src, pg_target, "sy_t", "sy_tr")
    _sync(tmp_path, args, "first")
    pg_exec(pg_target, "CREATE OR REPLACE FUNCTION sy_skip() RETURNS trigger LANGUAGE plpgsql AS "
                       "$$ BEGIN IF NEW.id % 2 = 0 THEN RETURN NULL; END IF; RETURN NEW; END $$",
            "CREATE TRIGGER sy_skip BEFORE INSERT ON sy_tr FOR EACH ROW EXECUTE FUNCTION sy_skip()")
    before = checksum(pg_target, "sy_tr"), pg_exec(pg_target, "SELECT position FROM _conveyor_sync WHERE target = 'public.sy_tr'")
    _changes(sync_src, 100, 200)
    r = run_cli(*args, f"hydra.run.dir={tmp_path}/skipped")
    assert r.code != 0 and "skipped rows without an error): rolled back" in r.err, r.err
    assert (checksum(pg_target, "sy_tr"), pg_exec(pg_target, "SELECT position FROM _conveyor_sync WHERE target = 'public.sy_tr'")) == before
    pg_exec(pg_target, "DROP TRIGGER sy_skip ON sy_tr")
    _sync(tmp_path, args, "fixed")
    _same(sync_src, pg_target, "sy_t", "sy_tr")


def test_missing_prerequisites_and_a_target_that_cannot_apply_are_refused_by_name(sync_src, pg_target, tmp_path: Path) -> None:
    # the target server runs with wal_level=replica: as a source it cannot be decoded
    pg_exec(pg_target, "DROP TABLE IF EXISTS sy_r", "CREATE TABLE sy_r (id int PRIMARY KEY)")
    r = run_cli(*_args(pg_target, pg_target, "sy_r", "sy_r2"), f"hydra.run.dir={tmp_path}/replica")
    assert r.code != 0 and "Traceback" not in r.err
    assert r.error_lines[0].endswith("has wal_level=replica; a sync job reads the source's changes by logical decoding, which needs "
                                     "wal_level=logical"), r.err
    assert "hint: ALTER SYSTEM SET wal_level = logical, then restart the server" in r.err
    pg_exec(sync_src, "DROP TABLE IF EXISTS sy_nokey", "CREATE TABLE sy_nokey (id int)")
    r = run_cli(*_args(sync_src, pg_target, "sy_nokey", "sy_nokey"), f"hydra.run.dir={tmp_path}/nokey")
    assert r.error_lines == ["error: incremental.method=replication: public.sy_nokey has no primary key: a sync applies each change by its key"]
    r = run_cli("run", "source=postgres", "sink=parquet", f"source.port={sync_src.port}", "source.table=sy_t", f"sink.path={tmp_path}/pq",
                "load_mode=replace", "incremental.method=replication", "strategy=none", f"hydra.run.dir={tmp_path}/pq")
    assert r.code != 0 and "sink parquet cannot apply changes" in r.err, r.err
    assert pg_exec(sync_src, "SELECT count(*) FROM pg_replication_slots") == [(0,)]  # refused before anything was made


@pytest.mark.pg_versions("15")  # planning chunks of keys, not the server's version
def test_chunks_several_tables_plan_and_clean(sync_src, pg_target, tmp_path: Path) -> None:
    """Two tables in one job (one slot), a change set applied in chunks of 7 keys; plan shows the slot and the
    WAL it holds; clean lists and drops it, and the next run loads the tables again."""
    pg_exec(sync_src, "DROP TABLE IF EXISTS sy_two", "CREATE TABLE sy_two (k text, n int, v text, PRIMARY KEY (k, n))",
            "INSERT INTO sy_two SELECT 'k' || (g % 3), g, md5(g::text) FROM generate_series(1, 300) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS sy_c_sy_t", "DROP TABLE IF EXISTS sy_c_sy_two")
    args = ["run", "source=postgres", "sink=postgres", f"source.port={sync_src.port}", "source.tables=[sy_t,sy_two]",
            f"sink.port={pg_target.port}", "sink.table='sy_c_{table}'", "load_mode=replace", "incremental.method=replication",
            "incremental.chunk_keys=7", "strategy=none"]
    _sync(tmp_path, args, "first")
    _changes(sync_src, 100, 140)
    pg_exec(sync_src, "UPDATE sy_two SET v = 'x' WHERE n < 20", "UPDATE sy_two SET k = 'moved' WHERE n = 30", "DELETE FROM sy_two WHERE n > 290")
    applied = _sync(tmp_path, args, "chunks")
    assert applied["sync"]["runs"][0]["tables"]["public.sy_two"]["keys"] == 31
    _same(sync_src, pg_target, "sy_t", "sy_c_sy_t")
    _same(sync_src, pg_target, "sy_two", "sy_c_sy_two")
    plan = run_cli(*(["plan"] + args[1:]), f"hydra.run.dir={tmp_path}/plan")
    assert plan.code == 0 and "bytes of WAL on the source" in plan.out, plan.out + plan.err
    listed = run_cli("clean", *args[1:])
    assert listed.code == 0 and "replication slot conveyor_" in listed.out and "sync state of public.sy_c_sy_two" in listed.out
    dropped = run_cli("clean", "--drop", *args[1:])
    assert dropped.code == 0 and "dropped replication slot" in dropped.out, dropped.out + dropped.err
    assert pg_exec(sync_src, "SELECT count(*) FROM pg_replication_slots") == [(0,)]
    again = _sync(tmp_path, args, "again")
    assert "first_load" in again["sync"]
    _same(sync_src, pg_target, "sy_two", "sy_c_sy_two")


@pytest.mark.pg_versions("15")  # the sink's apply, not the server's version
def test_a_sync_into_duckdb(sync_src, tmp_path: Path) -> None:
    import duckdb

    pg_exec(sync_src, "DROP TABLE IF EXISTS sy_d", "CREATE TABLE sy_d (id int8 PRIMARY KEY, a text, n numeric(20, 2), f float8, "
                      "d date, arr int[], big text)",
            "INSERT INTO sy_d SELECT g, 'a' || g, g / 3.0, g / 7.0, date '2020-01-01' + g, ARRAY[g, NULL], NULL FROM generate_series(1, 5000) g",
            "INSERT INTO sy_d VALUES (-1, 'toast', 'NaN', 'NaN', 'infinity', '{}', repeat(md5('x'), 20000))")
    db = tmp_path / "t.duckdb"
    args = ["run", "source=postgres", "sink=duckdb", f"source.port={sync_src.port}", "source.table=sy_d", f"sink.database={db}",
            "sink.table=sy_d", "load_mode=replace", "incremental.method=replication", "strategy=none"]
    r = run_cli(*args, f"hydra.run.dir={tmp_path}/nan")
    assert r.code != 0 and "NaN" in r.err  # DuckDB's DECIMAL has no NaN: refused by name, as on any load
    pg_exec(sync_src, "UPDATE sy_d SET n = 0 WHERE id = -1")
    _sync(tmp_path, args, "first")
    pg_exec(sync_src, "UPDATE sy_d SET a = a || 'u', f = -f WHERE id % 3 = 0", "UPDATE sy_d SET a = 'kept' WHERE id = -1",
            "UPDATE sy_d SET id = 100000 WHERE id = 7", "DELETE FROM sy_d WHERE id % 5 = 0",
            "INSERT INTO sy_d SELECT g, 'new', 1, 2, 'infinity', '{1}', NULL FROM generate_series(6000, 6100) g")
    second = _sync(tmp_path, args, "second")
    assert second["sync"]["runs"][0]["tables"]["public.sy_d"]["deleted"] == 1001  # 1,000 deleted, and the key 7 moved to 100000
    want = pg_exec(sync_src, "SELECT id, a, n::text, f::text, d::text, arr::text, md5(coalesce(big, '')) FROM sy_d ORDER BY id")
    con = duckdb.connect(str(db))
    try:
        got = con.execute("SELECT id, a, CAST(n AS VARCHAR), CAST(f AS VARCHAR), CAST(d AS VARCHAR), CAST(arr AS VARCHAR), "
                          "md5(coalesce(big, '')) FROM sy_d ORDER BY id").fetchall()
    finally:
        con.close()
    assert len(got) == len(want) == 5001 - 1001 + 101  # the key 7 moved to 100000, then deleted with the multiples of 5
    assert [(r[0], r[1], r[6]) for r in got] == [(r[0], r[1], r[6]) for r in want]
    assert [repr(float(r[3])) for r in got] == [repr(float(r[3])) for r in want]
    assert [r[4] for r in got if r[0] >= 6000] == ["infinity"] * 101


@pytest.mark.pg_versions("15")  # the sink's apply, not the server's version
def test_a_sync_into_mysql(sync_src, mysql_server, tmp_path: Path) -> None:
    pg_exec(sync_src, "DROP TABLE IF EXISTS sy_m", "CREATE TABLE sy_m (id int8 PRIMARY KEY, a text NOT NULL, n numeric(30, 4) NOT NULL, "
                      "ts timestamptz, big text)",
            "INSERT INTO sy_m SELECT g, 'a' || g, g / 3.0, timestamptz '2026-01-01 00:00:00.123456+00' + g * interval '1 day', NULL "
            "FROM generate_series(1, 3000) g",
            "INSERT INTO sy_m VALUES (-1, 'toast', 1, NULL, repeat(md5('x'), 20000))")
    mysql_server.execute("DROP TABLE IF EXISTS sy_m")
    args = ["run", "source=postgres", "sink=mysql", f"source.port={sync_src.port}", "source.table=sy_m", f"sink.port={mysql_server.port}",
            f"sink.user={mysql_server.user}", f"sink.database={mysql_server.database}", "sink.table=sy_m", "load_mode=replace",
            "incremental.method=replication", "strategy=none"]
    _sync(tmp_path, args, "first")
    pg_exec(sync_src, "UPDATE sy_m SET a = a || 'u', n = -n WHERE id % 3 = 0", "UPDATE sy_m SET a = 'kept' WHERE id = -1",
            "UPDATE sy_m SET id = 100000 WHERE id = 8", "DELETE FROM sy_m WHERE id % 5 = 0",
            "INSERT INTO sy_m SELECT g, 'new', 12345678901234567890.1234, NULL, NULL FROM generate_series(6000, 6020) g")
    _sync(tmp_path, args, "second")
    want = pg_exec(sync_src, "SELECT id, a, n::text, to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), md5(coalesce(big, '')) "
                             "FROM sy_m ORDER BY id")
    got = mysql_server.execute("SELECT id, a, CAST(n AS CHAR), DATE_FORMAT(ts, '%Y-%m-%d %H:%i:%s.%f'), md5(coalesce(big, '')) "
                               "FROM sy_m ORDER BY id")
    assert [tuple(r) for r in got] == [tuple(r) for r in want] and len(got) == 3001 - 601 + 21  # 8 moved to 100000, then deleted
