"""verify=count and verify=checksum over ctid partitions: each page range counted by its own TID range scan.

Counting every range in one scan with a FILTER per range compares each row with every range: the
server's work grew with the partitions (TPC-H lineitem SF1: 1.2 CPU-s with 8 ranges, 1.75 with 32;
one TID range scan per range, UNION ALL-ed: 0.6 CPU-s whatever their number). The test reads the
server's own account: the table's sequential scans (pg_stat_user_tables.seq_scan), which a TID range
scan does not add to, once the counting connections have ended (a backend's statistics are in
before it leaves pg_stat_activity). On the main this started from, counting was a sequential scan.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from conveyor.connectors.postgres.common import row_hash_sql
from conveyor.connectors.postgres.source import PostgresSource, PostgresSourceConfig
from conveyor.core import JobOptions, PageRange
from tests.helpers import pg_exec

RANGES = [(0, 40), (40, 41), (41, 90), (90, 200), (200, None)]  # uneven, one a single page, the last open-ended


pytestmark = [pytest.mark.usefixtures("pg_password"), pytest.mark.pg_versions]  # on PostgreSQL 15 and 18


@pytest.fixture(scope="module")
def counted(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS vc_src", "CREATE TABLE vc_src (id int, t text)",
            "INSERT INTO vc_src SELECT g, repeat('x', g % 50) FROM generate_series(1, 40000) g",
            "DELETE FROM vc_src WHERE id % 7 = 0", "VACUUM ANALYZE vc_src")
    assert pg_exec(pg_source, "SELECT pg_relation_size('vc_src') / 8192")[0][0] > 200
    return pg_source


def _seq_scans_once_settled(con: psycopg.Connection, others: set[int]) -> int:
    """vc_src's sequential scans, once every backend but ``others`` and this one has gone (bounded wait)."""
    deadline = time.monotonic() + 10
    while True:
        con.execute("SELECT pg_stat_clear_snapshot()")
        pids = {r[0] for r in con.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'").fetchall()}
        if pids <= others | {con.info.backend_pid} or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return con.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'vc_src'").fetchone()[0]


def test_page_ranges_are_counted_and_checksummed_without_a_sequential_scan(counted) -> None:
    src = PostgresSource(PostgresSourceConfig(port=counted.port, table="vc_src"), JobOptions())
    src.describe()
    parts = [PageRange(index=i, count=len(RANGES), start=a, stop=b) for i, (a, b) in enumerate(RANGES)]
    h = row_hash_sql(("id", "t"))
    expected = []
    with psycopg.connect(counted.dsn(), autocommit=True) as con:
        for a, b in RANGES:
            cond = f"ctid >= '({a},0)'::tid" + (f" AND ctid < '({b},0)'::tid" if b is not None else "")
            expected.append(tuple(int(v) for v in con.execute(f"SELECT count(*), coalesce(sum({h}), 0) FROM vc_src WHERE {cond}").fetchone()))
        assert sum(n for n, _ in expected) == 40000 - 40000 // 7
        others = {r[0] for r in con.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'").fetchall()}
        before = _seq_scans_once_settled(con, others)
        with src.session() as session:
            counts = session.count_rows(parts)
            sums = session.checksums(parts, ("id", "t"))
        after = _seq_scans_once_settled(con, others)
    assert counts == [n for n, _ in expected]
    assert sums == expected
    assert after == before, f"counting {len(parts)} page ranges scanned the whole table {after - before} time(s)"
