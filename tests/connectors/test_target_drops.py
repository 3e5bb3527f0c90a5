"""A target that drops rows without an error (a BEFORE INSERT trigger returning NULL, SQLite's
RAISE(IGNORE)) fails the partition or the load by name, on every path and load mode, and the target
keeps what it had: every check reads what the target stored (its COPY or INSERT count, the rows a
transaction inserted, what a merge left), never what was sent.

On the main this started from, the Arrow paths (pgpq, ADBC) and merge said "ok" with exit 0 while the
target held half the rows: they compared the rows sent with the source's count.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from conveyor.errors import VerificationError
from tests.helpers import job, pg_exec

ROWS = 6000


pytestmark = pytest.mark.usefixtures("pg_password")


@pytest.fixture(scope="module")
def td_src(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS td_src",
            f"CREATE TABLE td_src AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, {ROWS}) g",
            "ALTER TABLE td_src ADD PRIMARY KEY (id)")
    return pg_source


@pytest.fixture(scope="module")
def td_parquet(tmp_path_factory) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path_factory.mktemp("td")
    for i in range(2):
        ids = pa.array(range(i * ROWS // 2 + 1, (i + 1) * ROWS // 2 + 1), pa.int32())
        pq.write_table(pa.table({"id": ids, "v": pa.array([f"v{n}" for n in ids.to_pylist()])}), out / f"p{i}.parquet")
    return str(out)


def _dropping_target(server, table: str, key: bool = False, existing: int = 0) -> None:
    """``table`` (id, v) whose BEFORE INSERT trigger skips every even id, holding ids -1 .. -existing."""
    pg_exec(server, f"DROP TABLE IF EXISTS {table}", f"CREATE TABLE {table} (id int{' PRIMARY KEY' if key else ''}, v text)",
            f"INSERT INTO {table} SELECT -g, 'old' FROM generate_series(1, {existing}) g",
            "CREATE OR REPLACE FUNCTION td_skip_even() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN IF NEW.id % 2 = 0 THEN RETURN NULL; END IF; RETURN NEW; END $$",
            f"CREATE TRIGGER td_skip BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION td_skip_even()")


def _pg_source(server) -> dict:
    return {"type": "postgres", "port": server.port, "table": "td_src"}


def _pg_sink(server, table: str, **kw) -> dict:
    return {"type": "postgres", "port": server.port, "table": table, **kw}


@pytest.mark.parametrize("sink_opts, strategy, params", [
    ({"copy_path": "arrow"}, "ctid", {"partitions": 3}),                  # pgpq: its COPY's count
    ({"copy_path": "arrow", "writer": "adbc"}, "ctid", {"partitions": 3}),  # ADBC's ingest: the server's count of the inserts
    ({"copy_path": "arrow", "allow_cast": ["v"]}, "none", {}),            # through a temp table: the INSERT's count
    ({"copy_path": "passthrough"}, "ctid", {"partitions": 3}),            # the relayed COPY's count
], ids=["pgpq", "adbc", "temp-table", "passthrough"])
def test_an_append_whose_target_drops_rows_fails_and_commits_nothing(td_src, pg_target, sink_opts, strategy, params) -> None:
    _dropping_target(pg_target, "td_append", existing=3)
    with pytest.raises(VerificationError, match=r"the target stored [\d,]+ of the [\d,]+ rows sent to it \(a trigger"):
        job(_pg_source(td_src), _pg_sink(pg_target, "td_append", **sink_opts), strategy, params, load_mode="append", degree=2)
    assert pg_exec(pg_target, "SELECT count(*), min(id) FROM td_append") == [(3, -3)]


def test_a_parquet_append_into_a_target_that_drops_rows_fails(td_parquet, pg_target) -> None:
    _dropping_target(pg_target, "td_pq")
    with pytest.raises(VerificationError, match="rows sent to it"):
        job({"type": "parquet", "path": td_parquet}, _pg_sink(pg_target, "td_pq"), "files", load_mode="append", degree=2)
    assert pg_exec(pg_target, "SELECT count(*) FROM td_pq") == [(0,)]


@pytest.mark.parametrize("method", ["in_place", "staged"])
def test_a_truncate_into_a_target_that_drops_rows_keeps_the_old_rows(td_src, pg_target, method) -> None:
    _dropping_target(pg_target, "td_trunc", existing=5)
    strategy = ("none", {}) if method == "in_place" else ("ctid", {"partitions": 2})
    with pytest.raises(VerificationError, match="(stored|took) [\\d,]+ of the [\\d,]+"):
        job(_pg_source(td_src), _pg_sink(pg_target, "td_trunc", copy_path="arrow", truncate_method=method), *strategy,
            load_mode="truncate", degree=2)
    assert pg_exec(pg_target, "SELECT count(*), max(v) FROM td_trunc") == [(5, "old")]


@pytest.mark.parametrize("verify", ["count", "checksum"])
def test_a_merge_into_a_target_that_drops_rows_is_rolled_back(td_src, pg_target, verify) -> None:
    """Merge read back the staged rows only: 'target 6,000 new rows' and 'checksum ok' for a target
    that took half. Now the merge counts, in its own transaction, the staged keys the target holds."""
    _dropping_target(pg_target, "td_merge", key=True, existing=4)
    with pytest.raises(VerificationError, match=f"holds {ROWS // 2:,} of the {ROWS:,} staged keys"):
        job(_pg_source(td_src), _pg_sink(pg_target, "td_merge"), "ctid", {"partitions": 2}, load_mode="merge", degree=2, verify=verify)
    assert pg_exec(pg_target, "SELECT count(*) FROM td_merge") == [(4,)]


def test_a_merge_whose_target_changes_values_fails_under_checksum(td_src, pg_target) -> None:
    """A trigger that rewrites a value (not one that drops a row) passes the key count; verify=checksum
    compares every merged column of every staged key with the staged value before the merge commits."""
    pg_exec(pg_target, "DROP TABLE IF EXISTS td_mangle", "CREATE TABLE td_mangle (id int PRIMARY KEY, v text)",
            "CREATE OR REPLACE FUNCTION td_upper() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN IF NEW.id = 77 THEN NEW.v := upper(NEW.v); END IF; RETURN NEW; END $$",
            "CREATE TRIGGER td_upper BEFORE INSERT OR UPDATE ON td_mangle FOR EACH ROW EXECUTE FUNCTION td_upper()")
    report = job(_pg_source(td_src), _pg_sink(pg_target, "td_mangle"), load_mode="merge", verify="count")
    assert report.verification.staged_rows == ROWS and "reads back" in " ".join(report.verification.notes)
    with pytest.raises(VerificationError, match="1 of its rows with a staged key do not hold the staged values"):
        job(_pg_source(td_src), _pg_sink(pg_target, "td_mangle"), load_mode="merge", verify="checksum")


def test_a_merge_whose_delete_is_skipped_fails(td_src, pg_target) -> None:
    """merge_delete=hard: a BEFORE DELETE trigger that keeps rows leaves them; the merge reads back that none remain."""
    pg_exec(pg_target, "DROP TABLE IF EXISTS td_keep", "CREATE TABLE td_keep (id int PRIMARY KEY, v text)",
            "INSERT INTO td_keep VALUES (-1, 'gone'), (-2, 'gone')",
            "CREATE OR REPLACE FUNCTION td_no_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
            "CREATE TRIGGER td_no_delete BEFORE DELETE ON td_keep FOR EACH ROW EXECUTE FUNCTION td_no_delete()")
    with pytest.raises(VerificationError, match="the merge's delete left 2 of the 2 rows"):
        job(_pg_source(td_src), _pg_sink(pg_target, "td_keep", merge_delete="hard"), load_mode="merge")
    assert pg_exec(pg_target, "SELECT count(*) FROM td_keep") == [(2,)]


def test_verify_none_loads_what_the_target_takes(td_src, pg_target) -> None:
    """The explicit way out: verify=none checks nothing, and says so."""
    _dropping_target(pg_target, "td_none")
    report = job(_pg_source(td_src), _pg_sink(pg_target, "td_none", copy_path="arrow"), load_mode="append", verify="none")
    assert "not verified" in " ".join(report.verification.notes)
    assert pg_exec(pg_target, "SELECT count(*) FROM td_none") == [(ROWS // 2,)]


def test_an_adbc_sqlite_append_whose_trigger_ignores_rows_fails(td_parquet, tmp_path: Path) -> None:
    """SQLite's RAISE(IGNORE) drops a row silently; ADBC's ingest returns the rows it sent. The
    connection's own count of the rows it inserted (total_changes) is checked before the commit."""
    db = tmp_path / "t.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (id INTEGER, v TEXT)")
        con.execute("CREATE TRIGGER skip BEFORE INSERT ON t WHEN NEW.id % 3 = 0 BEGIN SELECT RAISE(IGNORE); END")
    with pytest.raises(VerificationError, match="rows sent to it"):
        job({"type": "parquet", "path": td_parquet}, {"type": "adbc", "driver": "sqlite", "uri": str(db), "table": "t"}, "files",
            load_mode="append")
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_an_adbc_sqlite_truncate_whose_trigger_ignores_rows_keeps_the_old_rows(td_parquet, tmp_path: Path) -> None:
    """truncate copies the staged rows into the target in one transaction (DELETE, INSERT ... SELECT): the
    INSERT's own count of what the target took is checked before it commits."""
    db = tmp_path / "t.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (id INTEGER, v TEXT)")
        con.execute("INSERT INTO t VALUES (-1, 'old')")
        con.execute("CREATE TRIGGER skip BEFORE INSERT ON t WHEN NEW.id % 3 = 0 BEGIN SELECT RAISE(IGNORE); END")
    with pytest.raises(VerificationError, match=f"took {ROWS * 2 // 3:,} of the {ROWS:,} staged rows"):
        job({"type": "parquet", "path": td_parquet}, {"type": "adbc", "driver": "sqlite", "uri": str(db), "table": "t"}, "files",
            load_mode="truncate")
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT id, v FROM t").fetchall() == [(-1, "old")]


def test_on_ray_workers_a_target_that_drops_rows_fails_the_partition_before_its_commit(td_src, pg_target, ray_instance) -> None:
    """The same check in a task on a Ray worker: the partition's transaction rolls back there."""
    from omegaconf import OmegaConf

    from conveyor.config import build_job
    from conveyor.pipelines.job import run_job

    _dropping_target(pg_target, "td_ray", existing=2)
    spec = build_job(OmegaConf.create({"source": _pg_source(td_src), "sink": _pg_sink(pg_target, "td_ray", copy_path="arrow"),
                                       "strategy": {"type": "ctid", "partitions": 2},
                                       "runtime": {"type": "ray", "max_retries": 0},
                                       "load_mode": "append", "degree": 2}))
    with pytest.raises(VerificationError, match="rows sent to it"):
        run_job(spec)
    assert pg_exec(pg_target, "SELECT count(*) FROM td_ray") == [(2,)]
