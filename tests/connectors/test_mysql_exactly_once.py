"""Exactly once into MySQL / MariaDB, whatever dies when: commit markers, the driver's guard and the
stop, on both runtimes, against a real MariaDB server and a real Ray instance.

On the main this work started from, the MySQL sink kept no markers and no guard: a retried
partition that had committed was written again, ``resume`` trusted a manifest a killed driver
could not update (its rows loaded twice), and Ray tasks left running by a killed driver kept
committing. Every test here fails there (most on ``sink.commit_markers``, which did not exist, or
on the rows counted twice).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.core import PrepareRequest, WholeSource
from tests.helpers import BIN, ctrl_c_run, popen_run, runtime_args, wait_quiet, wait_until

ROWS = 200_000


@pytest.fixture(scope="module")
def my(mysql_server):
    """A 200,000-row source table (id, grp, h) on the test MariaDB."""
    m = mysql_server
    m.execute("SET SESSION max_recursive_iterations = 1000000", "DROP TABLE IF EXISTS eo_src",
              "CREATE TABLE eo_src (id BIGINT PRIMARY KEY, grp INT, h CHAR(32))",
              f"INSERT INTO eo_src WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {ROWS}) "
              "SELECT n, n % 1000, MD5(n) FROM s")
    return m


def _fresh(m, table: str) -> None:
    m.execute(f"DROP TABLE IF EXISTS {table}", f"CREATE TABLE {table} (id BIGINT, grp INT, h CHAR(32))")


def _content(m, table: str) -> tuple:
    """Rows, distinct ids, and an order-independent digest of every row: equal to the source's means
    no row lost, none twice, none changed."""
    return tuple(m.execute(f"SELECT count(*), count(DISTINCT id), sum(id), sum(CRC32(CONCAT_WS('|', id, grp, h))) FROM {table}")[0])


def _spec(m, table: str, **sink):
    cfg = OmegaConf.create({"source": {"type": "mysql", "port": m.port, "user": m.user, "database": m.database, "table": "eo_src"},
                            "sink": {"type": "mysql", "port": m.port, "user": m.user, "database": m.database, "table": table, **sink},
                            "strategy": {"type": "none"}, "runtime": {"type": "local"}, "load_mode": "append"})
    return build_job(cfg)


@pytest.mark.parametrize("bulk", ["load_data", "insert"])
def test_a_retried_partition_that_had_committed_is_not_written_again(my, bulk: str) -> None:
    """The same partition written twice under one load id (a worker that died after its commit,
    retried): the second write finds the marker and writes nothing."""
    _fresh(my, "eo_twice")
    spec = _spec(my, "eo_twice", bulk=bulk)
    info = spec.source.describe()
    plan = spec.sink.prepare(PrepareRequest(schema=info.schema, info=info))
    part = WholeSource(index=0, count=1)
    try:
        first = spec.sink.write(plan, part, spec.source.read(part))
        second = spec.sink.write(plan, part, spec.source.read(part))
        marked = spec.sink.committed(plan)
    finally:
        spec.sink.finalize(plan, [])
    assert (first.rows, first.already_committed) == (ROWS, False)
    assert (second.rows, second.already_committed) == (ROWS, True)
    assert marked == {part.key: ROWS}
    assert _content(my, "eo_twice") == _content(my, "eo_src")


def test_two_attempts_racing_for_a_partition_commit_it_once(my) -> None:
    """An attempt whose marker is taken by another, still open transaction waits for it at its last
    statement; when that one commits, this one rolls back and reports the other's rows."""
    import pymysql

    _fresh(my, "eo_race")
    spec = _spec(my, "eo_race")
    info = spec.source.describe()
    plan = spec.sink.prepare(PrepareRequest(schema=info.schema, info=info))
    part = WholeSource(index=0, count=1)
    other = pymysql.connect(host="127.0.0.1", port=my.port, user=my.user, password=my.password, database=my.database,
                            autocommit=False)
    out: dict = {}
    try:
        with other.cursor() as cur:  # the other attempt: its marker inserted, not yet committed
            cur.execute("INSERT INTO _conveyor_commits (load_id, target, part, committed_rows) VALUES (%s, %s, %s, 123)",
                        [plan.own.once.load_id, plan.own.once.target, part.key])
        writer = threading.Thread(target=lambda: out.update(stats=spec.sink.write(plan, part, spec.source.read(part))), daemon=True)
        writer.start()
        wait_until(lambda: my.execute("SELECT count(*) FROM information_schema.processlist "  # the attempt waits on the marker's key
                                      "WHERE info LIKE 'INSERT INTO `\\_conveyor\\_commits`%'")[0][0], "the attempt's seal", 60)
        assert writer.is_alive(), out
        other.commit()
        writer.join(60)
        assert not writer.is_alive()
    finally:
        other.close()
        spec.sink.finalize(plan, [])
    assert (out["stats"].rows, out["stats"].already_committed) == (123, True)
    assert my.execute("SELECT count(*) FROM eo_race")[0][0] == 0  # its own rows rolled back


def _wait_for_load(m, table: str, seconds: float = 90) -> None:
    wait_until(lambda: m.execute(f"SELECT count(*) FROM information_schema.processlist WHERE info LIKE 'LOAD DATA%{table}%'")[0][0],
               f"a LOAD DATA into {table}", seconds)


def _wait_until_idle(m, seconds: float = 90) -> None:
    """Until no other session of the test user runs a statement (a killed driver's tasks have ended)."""
    wait_quiet(lambda: m.execute(f"SELECT count(*) FROM information_schema.processlist WHERE user = '{m.user}' "
                                 "AND command <> 'Sleep' AND id <> CONNECTION_ID()")[0][0], seconds)


def _run_args(m, table: str, *extra: str) -> list[str]:
    return ["run", "source=mysql", "sink=mysql", f"source.port={m.port}", f"sink.port={m.port}", f"source.user={m.user}",
            f"sink.user={m.user}", f"source.database={m.database}", f"sink.database={m.database}", "source.table=eo_src",
            f"sink.table={table}", "load_mode=append", "strategy=ntile", "strategy.distribute_key=id", "batch_size=2000", *extra]


def _pipe_folders() -> set[str]:
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob("conveyor-mysql-*")}


@pytest.mark.parametrize("kind", ["local", "ray"])
def test_driver_killed_mid_load_then_resumed_is_exact(my, tmp_path: Path, kind: str, request) -> None:
    """SIGKILL of the driver while partitions load: whatever its tasks had committed stays (each
    whole), what they had not rolls back (on Ray they outlive the driver and find its lock free),
    and the resume loads exactly the rest."""
    _fresh(my, "eo_killed")
    args = _run_args(my, "eo_killed", "degree=2", "strategy.partitions=8", *runtime_args(kind, request))
    before = _pipe_folders()
    proc = popen_run(args, tmp_path, "first")
    _wait_for_load(my, "eo_killed")
    time.sleep(0.3)
    proc.kill()  # no handler, no report, no manifest update
    proc.communicate(timeout=30)
    _wait_until_idle(my)
    # and nothing of the killed loads is left on disk: on main each partition in flight left a folder in the
    # temporary directory holding its named pipe (LOAD DATA's rows.csv), never removed
    assert _pipe_folders() - before == set()
    res = subprocess.run([str(BIN / "conveyor"), *args, f"resume={tmp_path}/first", f"hydra.run.dir={tmp_path}/second"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "resume:" in res.stderr
    assert _content(my, "eo_killed") == _content(my, "eo_src")


@pytest.mark.parametrize("kind", ["local", "ray"])
def test_ctrl_c_with_partitions_queued_leaves_whole_partitions_the_report_counts(my, tmp_path: Path, kind: str, request) -> None:
    _fresh(my, "eo_cancel")
    args = _run_args(my, "eo_cancel", "degree=1", "strategy.partitions=20", *runtime_args(kind, request))
    report, _, _ = ctrl_c_run(args, tmp_path, lambda: _wait_for_load(my, "eo_cancel"))
    committed = sum(p["rows"] for p in report["partitions"] if p["error"] is None)
    _wait_until_idle(my)
    assert my.execute("SELECT count(*) FROM eo_cancel")[0][0] == committed < ROWS  # what the report says, and no more
    marked = my.execute(f"SELECT coalesce(sum(committed_rows), 0) FROM _conveyor_commits WHERE target = '{my.database}.eo_cancel' "
                        f"AND load_id = '{report['run_id']}'")[0][0]
    assert marked == committed


def test_without_markers_a_load_still_works_and_resume_trusts_the_manifest(my, cli, tmp_path: Path) -> None:
    """sink.commit_markers=false: no table is made for them, rows arrive once, and resume says whose word it takes."""
    _fresh(my, "eo_nomark")
    args = _run_args(my, "eo_nomark", "sink.commit_markers=false", "runtime=local", "degree=2", "strategy.partitions=4")
    first = cli(*args)
    assert first.code == 0, first.err
    assert _content(my, "eo_nomark") == _content(my, "eo_src")
    assert not my.execute(f"SELECT load_id FROM _conveyor_commits WHERE target = '{my.database}.eo_nomark'")
    res = cli(*args, f"resume={tmp_path / 'hydra-run'}")
    assert res.code == 0, res.err
    assert "resume: 4 of 4 partitions finished" in res.err and "manifest" in res.err
    assert _content(my, "eo_nomark") == _content(my, "eo_src")


def test_a_killed_staged_run_leaves_a_labelled_stage_that_the_next_run_removes(my, cli, tmp_path: Path) -> None:
    """A truncate whose driver is killed mid-load: the target is as it was, its staging table says
    whose it is, `conveyor clean` lists it as stale, and the next run into the target drops it."""
    my.execute("DROP TABLE IF EXISTS eo_stage", "CREATE TABLE eo_stage (id BIGINT, grp INT, h CHAR(32))",
               "INSERT INTO eo_stage VALUES (-1, -1, 'old')")
    for (name,) in my.execute("SHOW TABLES LIKE '\\_conveyor\\_stage%'"):
        my.execute(f"DROP TABLE `{name}`")
    args = _run_args(my, "eo_stage", "degree=1", "strategy.partitions=20", "runtime=local").copy()
    args[args.index("load_mode=append")] = "load_mode=truncate"
    proc = popen_run(args, tmp_path, "killed")
    _wait_for_load(my, "_conveyor_stage")
    proc.kill()
    proc.communicate(timeout=30)
    _wait_until_idle(my)
    stages = my.execute("SELECT table_name, table_comment FROM information_schema.tables WHERE table_schema = DATABASE() "
                        "AND table_name LIKE '\\_conveyor\\_stage%'")
    assert len(stages) == 1
    note = json.loads(stages[0][1])
    assert note["target"] == f"{my.database}.eo_stage" and note["run_id"] in stages[0][0] and note["started"]
    assert my.execute("SELECT h FROM eo_stage") == [("old",)]  # the target as it was
    listed = subprocess.run([str(BIN / "conveyor"), "clean", "sink=mysql", f"sink.port={my.port}", f"sink.user={my.user}",
                             f"sink.database={my.database}", "sink.table=x"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert listed.returncode == 0 and stages[0][0] in listed.stdout and "stale (its run is gone)" in listed.stdout, listed
    res = cli(*args)
    assert res.code == 0, res.err
    assert f"warning: removed a staging table left by a run that is gone: {my.database}.{stages[0][0]}" in res.err
    assert not my.execute("SHOW TABLES LIKE '\\_conveyor\\_stage%'")
    assert _content(my, "eo_stage") == _content(my, "eo_src")
