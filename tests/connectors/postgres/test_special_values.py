"""Dates and timestamps Arrow cannot hold (infinity, -infinity, timestamps after 294247-01-10).

On the main this started from, PostgreSQL -> Parquet and -> DuckDB wrote them as years 5877612 BC
and 290279 BC with exit 0 and verification passing, and the Arrow path into PostgreSQL failed on
them. Now: PostgreSQL and DuckDB targets keep infinity and -infinity exactly (pass-through and the
Arrow path's pgpq writer); Parquet and the ADBC writer refuse them naming the column, unless
source.special_values says null or clamp. Other special values (NaN and infinities in floats and numeric, -0.0, 24:00:00) travel
exactly on every path (test_types.py holds them in its matrix too).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from conveyor.errors import TransferError
from tests.helpers import job, pg_exec

pytestmark = pytest.mark.pg_versions  # on PostgreSQL 15 and 18

DDL = "CREATE TABLE special (id int, d date, ts timestamp, tz timestamptz, f float8, n numeric, tm time)"
ROWS = ("(1, 'infinity', 'infinity', 'infinity', 'NaN', 'NaN', '24:00:00'), "
        "(2, '-infinity', '-infinity', '-infinity', '-0', 'Infinity', '00:00:00'), "
        "(3, '2024-02-29', '294276-12-31 23:59:59', '2000-01-01 00:00:00+00', '-Infinity', '-Infinity', '12:00:00'), "
        "(4, NULL, NULL, NULL, NULL, NULL, NULL)")


@pytest.fixture(scope="module")
def special(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS special", DDL, f"INSERT INTO special VALUES {ROWS}")
    return pg_source


def _src(server, **kw) -> dict:
    return {"type": "postgres", "port": server.port, "table": "special", **kw}


def _text(server, table: str = "special") -> list[tuple]:
    return pg_exec(server, f"SELECT t::text FROM {table} t ORDER BY id")


def test_pass_through_keeps_them_exactly(special, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS special", DDL)
    report = job(_src(special), {"type": "postgres", "port": pg_target.port, "table": "special"}, load_mode="append")
    assert report.sink_plan.native == "pgcopy-binary"
    assert _text(pg_target) == _text(special)


@pytest.mark.parametrize("writer", ["pgpq", "adbc"])
@pytest.mark.parametrize("mode", ["append", "create"])
def test_the_arrow_path_into_postgresql_keeps_infinity(special, pg_target, mode: str, writer: str) -> None:
    """On main, pgpq and ADBC failed on them ("Error occurred writing COPY data:")."""
    pg_exec(pg_target, "DROP TABLE IF EXISTS special", DDL)
    if mode == "create":
        pg_exec(pg_target, "DROP TABLE special")
    sink = {"type": "postgres", "port": pg_target.port, "table": "special", "copy_path": "arrow", "writer": writer}
    if writer == "adbc":  # ADBC's writer cannot keep them: it refuses by name
        with pytest.raises(TransferError, match=r"postgres column d \(date\) holds (-)?infinity") as err:
            job(_src(special), sink, load_mode=mode)
        assert "special_values=null or clamp" in err.value.hint and "passthrough" in err.value.hint
        return
    report = job(_src(special, table=None, query="SELECT * FROM special WHERE id <> 3"), sink, load_mode=mode)
    assert report.sink_plan.native is None and report.sink_plan.own.writer == "pgpq"
    assert _text(pg_target) == pg_exec(special, "SELECT t::text FROM special t WHERE id <> 3 ORDER BY id")
    assert _text(pg_target)[0][0].startswith("(1,infinity,infinity,infinity,")


def test_a_timestamp_beyond_arrow_is_still_refused_on_the_arrow_path(special, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS special", DDL, "INSERT INTO special (id) VALUES (42)")
    with pytest.raises(TransferError, match=r"column ts \(timestamp without time zone\) holds a timestamp after 294247-01-10"):
        job(_src(special), {"type": "postgres", "port": pg_target.port, "table": "special", "copy_path": "arrow"},
            load_mode="append")
    assert pg_exec(pg_target, "SELECT id FROM special") == [(42,)]


def test_postgres_to_duckdb_to_postgres_keeps_infinity(special, pg_target, tmp_path: Path) -> None:
    db = str(tmp_path / "x.duckdb")
    job(_src(special, table=None, query="SELECT * FROM special WHERE id <> 3"), {"type": "duckdb", "database": db, "table": "t"},
        load_mode="create")
    con = duckdb.connect(db)
    assert con.execute("SELECT d::text, ts::text, tz::text FROM t ORDER BY id").fetchall()[:2] == [
        ("infinity", "infinity", "infinity"), ("-infinity", "-infinity", "-infinity")]
    con.close()
    pg_exec(pg_target, "DROP TABLE IF EXISTS special", DDL)
    # n went into DuckDB as its exact text (a VARCHAR), which the cast policy does not parse back
    job({"type": "duckdb", "database": db, "query": "SELECT id, d, ts, tz, f, tm FROM t"},
        {"type": "postgres", "port": pg_target.port, "table": "special"}, load_mode="append")
    cols = "SELECT (id, d, ts, tz, f, tm)::text FROM special WHERE id <> 3 ORDER BY id"
    assert pg_exec(pg_target, cols) == pg_exec(special, cols)


def test_parquet_refuses_them_by_default(special, tmp_path: Path) -> None:
    with pytest.raises(TransferError, match=r"column d \(date\) holds (-)?infinity"):
        job(_src(special), {"type": "parquet", "path": str(tmp_path / "p")}, load_mode="create")
    # a timestamp after 294247-01-10 alone is named as such
    with pytest.raises(TransferError, match=r"column ts \(timestamp without time zone\) holds a timestamp after 294247-01-10"):
        job({"type": "postgres", "port": special.port, "query": "SELECT ts FROM special WHERE id = 3"},
            {"type": "parquet", "path": str(tmp_path / "q")}, load_mode="create")


def test_null_and_clamp_when_asked(special, tmp_path: Path) -> None:
    job(_src(special, special_values="null"), {"type": "parquet", "path": str(tmp_path / "n")}, load_mode="create")
    t = pq.read_table(tmp_path / "n").sort_by("id")
    assert t.column("d").to_pylist()[:3] == [None, None, t.column("d")[2].as_py()] and str(t.column("d")[2]) == "2024-02-29"
    assert t.column("ts").null_count == 4 and t.column("tz").null_count == 3
    job(_src(special, special_values="clamp"), {"type": "duckdb", "database": str(tmp_path / "c.duckdb"), "table": "t"},
        load_mode="create")
    con = duckdb.connect(str(tmp_path / "c.duckdb"))
    rows = con.execute("SELECT d::text, ts::text, tz IS NOT NULL, f::text, n, tm::text FROM t ORDER BY id").fetchall()
    assert rows[0][:3] == ("5874897-12-31", "294247-01-10 04:00:54.775806", True)
    assert rows[1][:2] == ("4714-11-24 (BC)", "4714-11-24 (BC) 00:00:00")
    assert rows[0][3] == "nan" and rows[1][3] == "-0.0" and rows[2][3] == "-inf"
    assert rows[0][4] == "NaN" and rows[1][4] == "Infinity"  # unconstrained numeric travels as its exact text
    assert rows[0][5] == "24:00:00"
