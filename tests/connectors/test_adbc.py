"""ADBC with real SQLite files: SQLite <-> DuckDB <-> Parquet, load modes, keyed strategies, bad input."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from conveyor.errors import PlanningError, PluginError, SchemaError
from tests.helpers import job


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Path:
    path = tmp_path / "src.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE items (id INTEGER, name TEXT, price REAL, grp TEXT)")
    con.execute("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 5000) "
                "INSERT INTO items SELECT CASE WHEN i % 100 = 0 THEN NULL ELSE i END, 'näme ' || i, i * 0.25, 'g' || (i % 3) FROM s")
    con.commit()
    con.close()
    return path


def _src(db: Path, **kw) -> dict:
    return {"type": "adbc", "driver": "sqlite", "uri": str(db), "table": "items", **kw}


def _rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize(("strategy", "params"), [("none", {}), ("rangeid", {"distribute_key": "id"}),
                                                   ("ntile", {"distribute_key": "name"}), ("random", {"distribute_key": "id"}),
                                                   ("datadriven", {"distribute_key": "grp"})])
def test_sqlite_to_duckdb_covers_every_row(sqlite_db: Path, tmp_path: Path, strategy: str, params: dict) -> None:
    from omegaconf import OmegaConf

    from conveyor.config import build_job
    from conveyor.pipelines.job import run_job

    db = tmp_path / "out.duckdb"
    report = run_job(build_job(OmegaConf.create({
        "source": _src(sqlite_db), "sink": {"type": "duckdb", "database": str(db), "table": "items"},
        "strategy": {"type": strategy, **params}, "runtime": {"type": "local"}, "load_mode": "create", "degree": 2,
    })))
    assert report.rows == 5000
    con = duckdb.connect(str(db))
    got = con.execute("SELECT count(*), count(id), sum(id), sum(price), count(DISTINCT name) FROM items").fetchone()
    assert got == _rows(sqlite_db, "SELECT count(*), count(id), sum(id), sum(price), count(DISTINCT name) FROM items")[0]


def test_duckdb_to_sqlite_load_modes(tmp_path: Path) -> None:
    src = tmp_path / "src.duckdb"
    duckdb.connect(str(src)).execute("CREATE TABLE t AS SELECT range AS id, 'v' || range AS v FROM range(3000)").close()
    dst = tmp_path / "dst.sqlite"
    sink = {"type": "adbc", "driver": "sqlite", "uri": str(dst), "table": "t"}
    source = {"type": "duckdb", "database": str(src), "table": "t"}
    job(source, sink, load_mode="create")
    assert _rows(dst, "SELECT count(*), sum(id) FROM t") == [(3000, sum(range(3000)))]
    job(source, sink, load_mode="append")
    assert _rows(dst, "SELECT count(*) FROM t") == [(6000,)]
    job(source, sink, load_mode="truncate")
    assert _rows(dst, "SELECT count(*) FROM t") == [(3000,)]
    job(source, sink, load_mode="replace")
    assert _rows(dst, "SELECT count(*) FROM t") == [(3000,)]
    assert _rows(dst, "SELECT name FROM sqlite_master WHERE name LIKE '_conveyor%'") == []
    with pytest.raises(SchemaError, match="already exists"):
        job(source, sink, load_mode="create")


def test_parquet_to_sqlite_to_parquet(tpch_orders: Path, tmp_path: Path) -> None:
    dst = tmp_path / "o.sqlite"
    job({"type": "parquet", "path": str(tpch_orders)}, {"type": "adbc", "driver": "sqlite", "uri": str(dst), "table": "orders"},
        "files", load_mode="create", degree=2)
    job({"type": "adbc", "driver": "sqlite", "uri": str(dst), "table": "orders"}, {"type": "parquet", "path": str(tmp_path / "back")},
        load_mode="create")
    back = pq.read_table(tmp_path / "back")
    orig = pq.read_table(tpch_orders)
    assert back.num_rows == orig.num_rows == 15000
    assert sorted(back.column("o_orderkey").to_pylist()) == sorted(orig.column("o_orderkey").to_pylist())
    assert sorted(back.column("o_comment").to_pylist()) == sorted(orig.column("o_comment").to_pylist())
    # SQLite has no decimal: prices went as exact text
    assert sorted(back.column("o_totalprice").to_pylist()) == sorted(str(v) for v in orig.column("o_totalprice").to_pylist())


def test_sqlite_has_no_partitioned_execution(sqlite_db: Path, tmp_path: Path) -> None:
    with pytest.raises(PlanningError, match="the sqlite driver has no partitioned execution"):
        job(_src(sqlite_db), {"type": "parquet", "path": str(tmp_path / "o")}, "native", load_mode="create")


def test_unknown_driver_names_the_package(cli, tmp_path: Path) -> None:
    res = cli("run", "runtime=local", "source=adbc", "source.driver=nosuchdb", "source.uri=x", "source.table=t",
              "sink=parquet", f"sink.path={tmp_path}/o")
    assert res.code == 2 and "Traceback" not in res.err
    assert "error: adbc driver 'nosuchdb' is not installed" in res.err and "hint: pip install adbc-driver-nosuchdb" in res.err


def test_missing_table(sqlite_db: Path, tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="no such table"):
        job(_src(sqlite_db, table="nope"), {"type": "parquet", "path": str(tmp_path / "o")}, load_mode="create")


def test_unknown_driver_in_python() -> None:
    from conveyor.connectors.adbc import _module

    with pytest.raises(PluginError):
        _module("nosuchdb")


def test_a_typed_adbc_target_follows_the_cast_policy(pg_target, tmp_path: Path) -> None:
    """ADBC's PostgreSQL driver as a generic ADBC target: a date into an integer column is refused
    before anything moves (the database would otherwise decide), a widening integer is loaded."""
    import pyarrow as pa

    from tests.helpers import pg_exec

    pg_exec(pg_target, "DROP TABLE IF EXISTS adbc_cast", "CREATE TABLE adbc_cast (id bigint, d int)")
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int32()), "d": pa.array([9497, 9498], pa.date32())}), src)
    sink = {"type": "adbc", "driver": "postgresql", "table": "adbc_cast",
            "uri": f"postgresql://postgres@127.0.0.1:{pg_target.port}/postgres"}  # the password: PGPASSWORD (libpq)
    with pytest.raises(SchemaError, match=r"column d \(date32\[day\] -> int4\): the values would change meaning"):
        job({"type": "parquet", "path": str(src)}, sink, load_mode="append")
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int32()), "d": pa.array([7, 8], pa.int16())}), src)
    assert job({"type": "parquet", "path": str(src)}, sink, load_mode="append").rows == 2
    assert pg_exec(pg_target, "SELECT id, d FROM adbc_cast ORDER BY id") == [(1, 7), (2, 8)]


def test_every_sql_source_answers_the_keyed_questions_alike(pg_source, tmp_path: Path) -> None:
    """One SqlSource base answers key_stats / key_values / quantiles / count_rows for PostgreSQL,
    DuckDB and ADBC (the three copies had drifted: ADBC listed NULL keys last on PostgreSQL)."""
    from conveyor.connectors.adbc import AdbcSource, AdbcSourceConfig
    from conveyor.connectors.duckdb import DuckDBSource, DuckDBSourceConfig
    from conveyor.connectors.postgres.source import PostgresSource, PostgresSourceConfig
    from conveyor.core import JobOptions, KeyRange, ModuloBucket, ValueSet
    from tests.helpers import pg_exec

    pg_exec(pg_source, "DROP TABLE IF EXISTS alike", "CREATE TABLE alike (k bigint, g text)",
            "INSERT INTO alike SELECT CASE WHEN g % 50 = 0 THEN NULL ELSE g % 13 END, 'g' || (g % 3) FROM generate_series(1, 1000) g")
    db = tmp_path / "alike.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE alike AS SELECT CASE WHEN g % 50 = 0 THEN NULL ELSE g % 13 END::BIGINT AS k, 'g' || (g % 3) AS g "
                    "FROM range(1, 1001) t(g)")
    options = JobOptions()
    sources = {
        "postgres": PostgresSource(PostgresSourceConfig(port=pg_source.port, table="alike"), options),
        "adbc postgresql": AdbcSource(AdbcSourceConfig(driver="postgresql", uri=pg_source.dsn(), table="alike"), options),
        "duckdb": DuckDBSource(DuckDBSourceConfig(database=str(db), table="alike"), options),
    }
    parts = [KeyRange(index=0, count=3, column="k", upper=5, nulls=True), KeyRange(index=1, count=3, column="k", lower=5),
             ModuloBucket(index=2, count=3, column="k", buckets=4, bucket=1), ValueSet(index=3, count=4, column="g", values=("g1", None))]
    answers = {}
    for name, source in sources.items():
        source.describe()
        stats = source.key_stats("k")
        answers[name] = (stats.kind, stats.min, stats.max, stats.rows, stats.nulls, source.key_values("k"),
                         source.key_quantiles("k", 4, exact=True), source.count_rows(parts))
    assert answers["postgres"][5][0] == (None, 20)  # NULL keys first, counted
    assert answers["postgres"][:5] == ("integer", 0, 12, 1000, 20)
    assert answers["adbc postgresql"] == answers["postgres"] == answers["duckdb"]


def test_an_unknown_distribute_key_is_refused_by_name_in_every_sql_source(sqlite_db: Path, tmp_path: Path) -> None:
    """The shared SqlSource._key_kind (DuckDB and ADBC read the kind from their Arrow schema)."""
    from conveyor.connectors.adbc import AdbcSource, AdbcSourceConfig
    from conveyor.connectors.duckdb import DuckDBSource, DuckDBSourceConfig
    from conveyor.core import JobOptions

    options = JobOptions()
    duck = tmp_path / "k.duckdb"
    with duckdb.connect(str(duck)) as con:
        con.execute("CREATE TABLE items AS SELECT range AS id FROM range(10)")
    sources = {"adbc sqlite": AdbcSource(AdbcSourceConfig(driver="sqlite", uri=str(sqlite_db), table="items"), options),
               "duckdb": DuckDBSource(DuckDBSourceConfig(database=str(duck), table="items"), options)}
    for name, source in sources.items():
        with pytest.raises(SchemaError, match=rf"^{name} source: distribute_key 'nope' is not a column of the source") as err:
            source.key_stats("nope")
        assert err.value.hint.startswith("columns are: id")
        assert source.key_stats("id").kind == "integer"


def test_a_value_longer_than_a_varchar_n_target_is_refused_not_cut(pg_target, tmp_path: Path) -> None:
    """Through ADBC's PostgreSQL driver too: PostgreSQL cuts a value's excess trailing spaces to fit
    varchar(n) without an error, so on main 'abc  ' arrived as 'abc'; the driver names the column's
    type and length, and each value's length is checked before the database sees it."""
    import pyarrow as pa

    from conveyor.errors import TransferError
    from tests.helpers import pg_exec

    pg_exec(pg_target, "DROP TABLE IF EXISTS adbc_len", "CREATE TABLE adbc_len (id bigint, v varchar(3))")
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1, 2], "v": ["ab ", "abc  "]}), src)
    sink = {"type": "adbc", "driver": "postgresql", "table": "adbc_len",
            "uri": f"postgresql://postgres@127.0.0.1:{pg_target.port}/postgres"}  # the password: PGPASSWORD (libpq)
    with pytest.raises(TransferError, match=r"column v -> v: a value of 5 characters is too long for character varying\(3\)"):
        job({"type": "parquet", "path": str(src)}, sink, load_mode="append")
    assert pg_exec(pg_target, "SELECT count(*) FROM adbc_len") == [(0,)]
    pq.write_table(pa.table({"id": [1, 2], "v": ["ab ", "abc"]}), src)
    job({"type": "parquet", "path": str(src)}, sink, load_mode="append")
    assert pg_exec(pg_target, "SELECT id, v FROM adbc_len ORDER BY id") == [(1, "ab "), (2, "abc")]
