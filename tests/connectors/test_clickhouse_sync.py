"""Sync into ClickHouse (incremental.method=replication, sink=clickhouse) against real servers: readers polling the
target every 10 ms during applies never see a duplicate key, a deleted row or (one partition) a partial run; the driver
SIGKILLed inside the apply (between two partitions' swaps, and after every swap before the position is recorded) and
run again: exact; from PostgreSQL and from MariaDB's binary log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import pg_exec, run_cli

PG_ROWS = "SELECT id, a, n::text, d::text FROM {t} ORDER BY id"
CH_ROWS = "SELECT id, a, toString(n), toString(d) FROM {t} ORDER BY id FORMAT TSV"


@pytest.fixture
def ch_src(pg_source, clickhouse_server):
    pg_exec(pg_source, "DROP TABLE IF EXISTS cs_t", "CREATE TABLE cs_t (id int8 PRIMARY KEY, a text NOT NULL, n numeric(18, 2) NOT NULL, d date)",
            "INSERT INTO cs_t SELECT g, 'a' || g, g / 4.0, date '2020-01-01' + (g % 1000) FROM generate_series(1, 20000) g")
    clickhouse_server.execute("DROP TABLE IF EXISTS cs_t")
    yield pg_source
    pg_exec(pg_source, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'conveyor%' AND NOT active")
    for (pub,) in pg_exec(pg_source, "SELECT pubname FROM pg_publication WHERE pubname LIKE 'conveyor%'"):
        pg_exec(pg_source, f'DROP PUBLICATION "{pub}"')
    clickhouse_server.execute("DROP TABLE IF EXISTS _conveyor_sync")


def _args(src, ch, *more: str) -> list[str]:
    return ["run", "source=postgres", "sink=clickhouse", f"source.port={src.port}", "source.table=cs_t", f"sink.port={ch.http_port}",
            "sink.table=cs_t", "load_mode=replace", "incremental.method=replication", "strategy=none", *more]


def _sync(tmp_path: Path, args: list[str], name: str) -> dict:
    report = tmp_path / f"{name}.json"
    r = run_cli("--report", str(report), *args, f"hydra.run.dir={tmp_path}/{name}", timeout=300)
    assert r.code == 0, r.err
    return json.loads(report.read_text())


def _same(src, ch) -> None:
    want = [tuple("" if v is None else str(v) for v in r) for r in pg_exec(src, PG_ROWS.format(t="cs_t"))]
    got = [tuple("" if v == "\\N" else v for v in r) for r in ch.execute(CH_ROWS.format(t="cs_t"))]
    assert len(got) == len(want) and got == want


def _changes(src, low: int, high: int) -> None:
    pg_exec(src, f"UPDATE cs_t SET a = a || 'u', n = -n WHERE id BETWEEN {low} AND {high} AND id % 3 = 0",
            f"UPDATE cs_t SET id = -id WHERE id = {low + 1}",
            f"DELETE FROM cs_t WHERE id BETWEEN {low} AND {high} AND id % 5 = 0",
            f"INSERT INTO cs_t SELECT g, 'new', g, NULL FROM generate_series({high + 100000}, {high + 100050}) g")


class Reader:
    """Polls the target every 10 ms (bounded: 3,000 polls) for (rows, distinct keys, sum of a column); what it saw."""

    def __init__(self, ch) -> None:
        self.ch, self.seen, self.stop = ch, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for _ in range(3000):
            if self.stop.is_set():
                return
            self.seen.append(tuple(self.ch.execute("SELECT count(), uniqExact(id), toString(sum(n)) FROM cs_t")[0]))
            time.sleep(0.01)

    def __enter__(self) -> Reader:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.mark.parametrize("partitioned", [False, True])
def test_readers_see_no_duplicate_no_deleted_row_and_each_partition_whole(ch_src, clickhouse_server, tmp_path: Path,
                                                                          partitioned: bool) -> None:
    ch = clickhouse_server
    more = ["sink.partition_by='intDiv(id, 5000)'"] if partitioned else []
    _sync(tmp_path, _args(ch_src, ch, *more), "first")
    _same(ch_src, ch)
    plan = run_cli("plan", *_args(ch_src, ch, *more)[1:], f"hydra.run.dir={tmp_path}/plan")
    assert plan.code == 0, plan.err
    said = "the partitions of default.cs_t its changes touch (PARTITION BY intDiv(id, 5000): 5 partitions now, 20,000 rows, the " \
           "largest 5,000)" if partitioned else "rewrites default.cs_t whole on the server (20,000 rows now; no PARTITION BY)"
    assert said in plan.out, plan.out
    for r, (low, high) in enumerate([(100, 400), (3000, 9000), (12000, 19000)]):
        before = tuple(ch.execute("SELECT count(), uniqExact(id), toString(sum(n)) FROM cs_t")[0])
        _changes(ch_src, low, high)
        with Reader(ch) as reader:
            done = _sync(tmp_path, _args(ch_src, ch, *more), f"run{r}")
        after = tuple(ch.execute("SELECT count(), uniqExact(id), toString(sum(n)) FROM cs_t")[0])
        _same(ch_src, ch)
        assert len(reader.seen) > 3
        assert all(n == distinct for n, distinct, _ in reader.seen), "a reader saw a key twice"
        if not partitioned:  # one partition: the run is seen whole or not at all
            assert set(reader.seen) <= {before, after}, f"a reader saw a partial run: {set(reader.seen) - {before, after}}"
        applied = done["sync"]["runs"][0]["tables"]["public.cs_t"]
        assert applied["detail"].endswith(f"{int(after[0]):,} rows") or partitioned
    pg_exec(ch_src, "TRUNCATE cs_t", "INSERT INTO cs_t VALUES (1, 'one', 1, NULL), (2, 'two', 2, '2024-02-29')")
    truncated = _sync(tmp_path, _args(ch_src, ch, *more), "truncated")
    assert truncated["sync"]["runs"][0]["tables"]["public.cs_t"]["full"] is True
    _same(ch_src, ch)


_KILLER = """
import os, signal, sys
from conveyor.connectors.clickhouse import chsync, common
from conveyor.cli import main

point = sys.argv[1]
def kill(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
if point == "between-partitions":    # one partition swapped in, the others not
    real = common.ClickHouseConnConfig.run
    def run(self, *statements, **kw):
        out = real(self, *statements, **kw)
        if any("REPLACE PARTITION" in s for s in statements):
            kill()
        return out
    common.ClickHouseConnConfig.run = run
elif point == "before-position":     # every partition swapped in and checked, the position not recorded
    chsync.ChChangeApplier.record_sync = kill
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("point", ["between-partitions", "before-position"])
def test_a_driver_killed_inside_the_apply_then_run_again_is_exact(ch_src, clickhouse_server, tmp_path: Path, point: str) -> None:
    ch = clickhouse_server
    args = _args(ch_src, ch, "sink.partition_by='intDiv(id, 5000)'")
    _sync(tmp_path, args, "first")
    _changes(ch_src, 1000, 16000)  # four partitions
    proc = subprocess.run([sys.executable, "-c", _KILLER, point, *args, f"hydra.run.dir={tmp_path}/killed"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert all(n == d for n, d in ch.execute("SELECT count(), uniqExact(id) FROM cs_t"))
    again = _sync(tmp_path, args, "again")
    assert again["sync"]["runs"][0]["changes"] > 0  # the killed run's changes, applied again
    _same(ch_src, ch)
    _changes(ch_src, 17000, 18000)
    _sync(tmp_path, args, "then")
    _same(ch_src, ch)
