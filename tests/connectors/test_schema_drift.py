"""schema_drift: a load into an existing target whose source gained columns. On the main this started from,
there was no policy: append and merge failed with "source columns with no target column" and no way on but
editing the target by hand. fail (the default) still refuses, naming the columns and the ways on; ignore
loads without them and says so; evolve adds them (nullable) before the load, on PostgreSQL and DuckDB, and a
run that leaves nothing in the target drops them again. Real servers and files: the PostgreSQL test servers,
a DuckDB database file, Parquet files."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.errors import ConfigError, SchemaError, TransferError
from conveyor.kit.mapping import TargetColumn, map_columns
from tests.helpers import job, pg_exec


def test_evolve_is_refused_by_name_where_the_sink_cannot_add_columns() -> None:
    target = [TargetColumn("id"), TargetColumn("v")]
    with pytest.raises(ConfigError, match=r"schema_drift=evolve: mysql table t cannot add the source's new columns \(extra\)"):
        map_columns(["id", "v", "extra"], target, "name", "mysql table t", "evolve")
    assert map_columns(["id", "v", "extra"], target, "name", "t", "ignore") == [("id", "id"), ("v", "v")]
    with pytest.raises(SchemaError, match="source columns with no target column: extra") as caught:
        map_columns(["id", "v", "extra"], target, "name", "t")
    assert "schema_drift=evolve adds them to the target" in caught.value.hint


# --- PostgreSQL -----------------------------------------------------------------------------------


@pytest.fixture
def drift(pg_source, pg_target, pg_password):
    pg_exec(pg_source, "DROP TABLE IF EXISTS sd_src", "CREATE TABLE sd_src (id int PRIMARY KEY, v text, extra numeric(10,2), note text)",
            "INSERT INTO sd_src SELECT g, 'v' || g, g / 4.0, CASE WHEN g % 2 = 0 THEN 'n' || g END FROM generate_series(1, 500) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS sd_dst", "CREATE TABLE sd_dst (id int PRIMARY KEY, v text, kept text DEFAULT 'd')",
            "INSERT INTO sd_dst VALUES (-1, 'old', 'was here')")
    return {"type": "postgres", "port": pg_source.port, "table": "sd_src"}, {"type": "postgres", "port": pg_target.port, "table": "sd_dst"}


def _columns(server, table: str) -> list[tuple]:
    return pg_exec(server, f"SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = '{table}'::regclass "
                           "AND attnum > 0 AND NOT attisdropped ORDER BY attnum")


def test_postgres_fail_names_the_new_columns_and_changes_nothing(drift, pg_target) -> None:
    source, sink = drift
    with pytest.raises(SchemaError, match="source columns with no target column: extra, note") as caught:
        job(source, sink, "ctid", {"partitions": 2}, degree=2, load_mode="append")
    assert "schema_drift=evolve" in caught.value.hint and "schema_drift=ignore" in caught.value.hint
    assert pg_exec(pg_target, "SELECT count(*) FROM sd_dst")[0][0] == 1 and len(_columns(pg_target, "sd_dst")) == 3


def test_postgres_ignore_loads_the_common_columns(drift, pg_target) -> None:
    source, sink = drift
    report = job(source, sink, "ctid", {"partitions": 2}, degree=2, load_mode="append", schema_drift="ignore")
    assert report.rows == 500 and len(_columns(pg_target, "sd_dst")) == 3
    assert pg_exec(pg_target, "SELECT count(*), count(*) FILTER (WHERE kept = 'd'), sum(id) FROM sd_dst")[0] == (501, 500, 125249)


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_postgres_evolve_adds_the_columns_with_the_sources_types_and_loads_them(drift, pg_source, pg_target, mode: str) -> None:
    source, sink = drift
    if mode == "merge":
        pg_exec(pg_target, "INSERT INTO sd_dst VALUES (7, 'stale', 'x')")
    report = job(source, sink, "ctid", {"partitions": 2}, degree=2, load_mode=mode, schema_drift="evolve")
    assert report.rows == 500
    assert _columns(pg_target, "sd_dst") == [("id", "integer"), ("v", "text"), ("kept", "text"), ("extra", "numeric(10,2)"), ("note", "text")]
    got = pg_exec(pg_target, "SELECT id, v, extra::text, note FROM sd_dst WHERE id > 0 ORDER BY id")
    assert got == pg_exec(pg_source, "SELECT id, v, extra::text, note FROM sd_src ORDER BY id")
    assert pg_exec(pg_target, "SELECT v, extra, note FROM sd_dst WHERE id = -1")[0] == ("old", None, None)


def test_postgres_evolve_of_a_run_that_leaves_nothing_drops_the_columns_again(drift, pg_target) -> None:
    """Every partition refused by the target (a CHECK no source row meets): the target is as it was, columns too."""
    source, sink = drift
    pg_exec(pg_target, "ALTER TABLE sd_dst ADD CONSTRAINT sd_small CHECK (id < 0)")
    with pytest.raises(TransferError):
        job(source, sink, "ctid", {"partitions": 2}, degree=2, load_mode="append", schema_drift="evolve")
    assert len(_columns(pg_target, "sd_dst")) == 3 and pg_exec(pg_target, "SELECT count(*) FROM sd_dst")[0][0] == 1


# --- DuckDB ---------------------------------------------------------------------------------------


def test_duckdb_evolve_and_ignore(tmp_path: Path) -> None:
    files = tmp_path / "in"
    files.mkdir()
    pq.write_table(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", None], "extra": pa.array([1.5, None, -2.25])}),
                   files / "p0.parquet")
    db = tmp_path / "t.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE t (id BIGINT, v VARCHAR)")
        con.execute("INSERT INTO t VALUES (0, 'old')")
    src, sink = {"type": "parquet", "path": str(files)}, {"type": "duckdb", "database": str(db), "table": "t"}
    with pytest.raises(SchemaError, match="source columns with no target column: extra"):
        job(src, sink, "files", load_mode="append")
    job(src, sink, "files", load_mode="append", schema_drift="ignore")
    with duckdb.connect(str(db)) as con:
        assert con.execute("SELECT count(*) FROM t").fetchone()[0] == 4 and len(con.execute("DESCRIBE t").fetchall()) == 2
    job(src, sink, "files", load_mode="append", schema_drift="evolve")
    with duckdb.connect(str(db)) as con:
        assert con.execute("SELECT column_name, column_type FROM (DESCRIBE t)").fetchall()[-1] == ("extra", "DOUBLE")
        assert con.execute("SELECT id, v, extra FROM t ORDER BY id, extra NULLS FIRST").fetchall() == [
            (0, "old", None), (1, "a", None), (1, "a", 1.5), (2, "b", None), (2, "b", None), (3, None, None), (3, None, -2.25)]
