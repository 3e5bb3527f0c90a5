"""ctid ranges by rows where a table's pages hold them unevenly.

A table whose first pages a DELETE emptied (a retention purge of its oldest rows) keeps those pages
after VACUUM, which frees them but cannot give them back from the front of the file. Equal page
ranges then gave one stream every row: on TPC-H lineitem SF1 with its first half of pages emptied,
`postgres_to_parquet` at degree 2 took 5.3-5.9 s against 4.5-4.7 s with the ranges split by rows
(3 alternating runs). The plan samples the pages' live rows (TABLESAMPLE SYSTEM, ~256 pages) on the
connection that counts them, and splits by rows only where equal ranges would be uneven.
"""

from __future__ import annotations

import pytest

from tests.helpers import checksum, job, pg_exec

ROWS = 120_000


@pytest.fixture(scope="module")
def purged(pg_source):
    """~5,500 pages, the first half of them emptied by a DELETE and a VACUUM (ids 1..60000 gone). The
    servers' fixture sets PGPASSWORD, which the jobs' password_env reads."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS ctid_purged",
            "CREATE TABLE ctid_purged WITH (autovacuum_enabled = off) AS "
            f"SELECT g AS id, repeat(md5(g::text), 10) AS pad FROM generate_series(1, {ROWS}) g",
            f"DELETE FROM ctid_purged WHERE id <= {ROWS // 2}", "VACUUM ANALYZE ctid_purged")
    return pg_source


def _rows_per_range(server, parts) -> list[int]:
    counts = []
    for p in parts:
        cond = f"ctid >= '({p.start},0)'::tid" + ("" if p.stop is None else f" AND ctid < '({p.stop},0)'::tid")
        counts.append(pg_exec(server, f"SELECT count(*) FROM ctid_purged WHERE {cond}")[0][0])
    return counts


@pytest.mark.parametrize("degree", [2, 4])
def test_ctid_ranges_hold_about_equal_rows_when_the_first_pages_were_emptied(purged, pg_target, degree) -> None:
    """On the main this started from, the ranges were equal page ranges: at degree 2 the first held
    no row and the second all 60,000."""
    pages = pg_exec(purged, "SELECT pg_relation_size('ctid_purged') / 8192")[0][0]
    assert pages >= 4096  # large enough to be sampled
    pg_exec(pg_target, "DROP TABLE IF EXISTS ctid_purged", "CREATE TABLE ctid_purged (id int, pad text)")
    report = job({"type": "postgres", "port": purged.port, "table": "ctid_purged"},
                 {"type": "postgres", "port": pg_target.port, "table": "ctid_purged"}, "ctid", load_mode="append", degree=degree)
    parts = report.plan.partitions
    assert len(parts) == degree and parts[0].start == 0 and parts[-1].stop is None
    assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))  # every page in exactly one range
    counts = _rows_per_range(purged, parts)
    assert sum(counts) == ROWS // 2
    share = ROWS // 2 / degree
    assert all(abs(c - share) < 0.15 * share for c in counts), counts
    assert "about equal rows" in report.plan.note
    assert checksum(pg_target, "ctid_purged") == checksum(purged, "ctid_purged")  # every row once


def test_ctid_keeps_equal_page_ranges_where_the_rows_are_even(pg_source, pg_target) -> None:
    """A sample that finds the rows even leaves the equal page ranges as they were (a sample's own
    noise never moves them)."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS ctid_even",
            f"CREATE TABLE ctid_even AS SELECT g AS id, repeat(md5(g::text), 10) AS pad FROM generate_series(1, {ROWS}) g",
            "VACUUM ANALYZE ctid_even")
    pages = pg_exec(pg_source, "SELECT pg_relation_size('ctid_even') / 8192")[0][0]
    pg_exec(pg_target, "DROP TABLE IF EXISTS ctid_even", "CREATE TABLE ctid_even (id int, pad text)")
    report = job({"type": "postgres", "port": pg_source.port, "table": "ctid_even"},
                 {"type": "postgres", "port": pg_target.port, "table": "ctid_even"}, "ctid", load_mode="append", degree=2)
    assert [(p.start, p.stop) for p in report.plan.partitions] == [(0, -(-pages // 2)), (-(-pages // 2), None)], (pages, report.plan.note)
    assert "about equal rows" not in report.plan.note
