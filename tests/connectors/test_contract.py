"""Every built-in connector keeps the connector contract (conveyor.testing.contract), checked
with the same kit a third-party connector package uses: real files, a real DuckDB database, a
real SQLite file through ADBC and the throwaway PostgreSQL servers; nothing mocked."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from conveyor import registry
from conveyor.core import JobOptions, KeyRange, WholeSource
from conveyor.testing.contract import Contract, ContractBroken
from tests.helpers import pg_exec

ROWS = 5000


def _table() -> pa.Table:
    ids = pa.array(range(ROWS), pa.int64())
    return pa.table({"id": ids, "name": pa.array([f"n{i % 97}" for i in range(ROWS)]),
                     "x": pa.array([i * 0.5 for i in range(ROWS)], pa.float64())})


def _make(kind: str, name: str, **config: Any):
    cls = registry.load(kind, name)
    return lambda options: cls(cls.config_class(**config), options)


@pytest.fixture
def parquet_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    t = _table()
    for i in range(3):  # three files, two row groups each
        pq.write_table(t.slice(i * 1700, 1700), folder / f"part-{i}.parquet", row_group_size=900)
    return folder


def test_parquet_source_and_sink(conveyor_contract: Contract, parquet_dir: Path, tmp_path: Path) -> None:
    source = _make("source", "parquet", path=str(parquet_dir))(conveyor_contract.options)
    plans = conveyor_contract.check_source(source, {"none": {}, "files": {}})
    assert len(plans["files"]) == 3
    conveyor_contract.check_source(source, {"files": {"row_groups_per_partition": 1}})
    written = conveyor_contract.check_sink(_make("sink", "parquet", path=str(tmp_path / "out")), source)
    assert written == ROWS and pq.read_table(tmp_path / "out").num_rows == ROWS
    err = conveyor_contract.check_read_error(_make("source", "parquet", path=str(parquet_dir))(conveyor_contract.options),
                                             _gone(parquet_dir))
    assert "part-0.parquet" in err.message


def _gone(folder: Path):
    """The files partition of a file deleted after planning."""
    from conveyor.core import FileSet

    (folder / "part-0.parquet").unlink()
    return FileSet(index=0, count=1, paths=(str(folder / "part-0.parquet"),))


def test_csv_source_and_sink(conveyor_contract: Contract, tmp_path: Path) -> None:
    folder = tmp_path / "csv"
    folder.mkdir()
    t = _table()
    for i in range(2):
        pacsv.write_csv(t.slice(i * 2500, 2500), folder / f"part-{i}.csv")
    source = _make("source", "csv", path=str(folder))(conveyor_contract.options)
    conveyor_contract.check_source(source, {"none": {}, "files": {}})
    assert conveyor_contract.check_sink(_make("sink", "csv", path=str(tmp_path / "out")), source) == ROWS


def test_duckdb_source_and_sink(conveyor_contract: Contract, parquet_dir: Path, tmp_path: Path) -> None:
    db, out = str(tmp_path / "c.duckdb"), str(tmp_path / "out.duckdb")
    duckdb.connect(db).execute(f"CREATE TABLE src AS SELECT * FROM read_parquet('{parquet_dir}/*.parquet')").close()
    duckdb.connect(out).execute("CREATE TABLE dst (id BIGINT, name VARCHAR, x DOUBLE)").close()
    source = _make("source", "duckdb", database=db, table="src")(conveyor_contract.options)
    conveyor_contract.check_source(source, {"none": {}, "rangeid": {"distribute_key": "id"}, "ntile": {"distribute_key": "id"},
                                            "random": {"distribute_key": "id"}})
    assert conveyor_contract.check_sink(_make("sink", "duckdb", database=out, table="dst"), source) == ROWS


def test_adbc_sqlite_source_and_sink(conveyor_contract: Contract, tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE src (id INTEGER, name TEXT, x REAL)")
    t = _table()
    con.executemany("INSERT INTO src VALUES (?, ?, ?)", zip(*(t.column(c).to_pylist() for c in t.column_names)))
    con.commit()
    con.close()
    out = tmp_path / "out.sqlite"  # SQLite locks the file a source reads: another file
    sqlite3.connect(out).execute("CREATE TABLE dst (id INTEGER, name TEXT, x REAL)").connection.close()
    source = _make("source", "adbc", driver="sqlite", uri=str(db), table="src")(conveyor_contract.options)
    conveyor_contract.check_source(source, {"none": {}, "rangeid": {"distribute_key": "id"}})
    assert conveyor_contract.check_sink(_make("sink", "adbc", driver="sqlite", uri=str(out), table="dst"), source) == ROWS


def test_postgres_source_and_sink(conveyor_contract: Contract, pg_source, pg_target) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS contract_src",
            f"CREATE TABLE contract_src AS SELECT g::bigint AS id, 'n' || (g % 97) AS name, g * 0.5::float8 AS x "
            f"FROM generate_series(0, {ROWS - 1}) g", "ANALYZE contract_src")
    pg_exec(pg_target, "DROP TABLE IF EXISTS contract_dst", "CREATE TABLE contract_dst (id bigint, name text, x float8)")
    source = _make("source", "postgres", port=pg_source.port, table="contract_src")(conveyor_contract.options)
    conveyor_contract.check_source(source, {"none": {}, "ctid": {}, "rangeid": {"distribute_key": "id"},
                                            "ntile": {"distribute_key": "id"}, "random": {"distribute_key": "id"},
                                            "datadriven": {"distribute_key": "name"}})
    for copy_path in ("passthrough", "arrow"):
        sink = _make("sink", "postgres", port=pg_target.port, table="contract_dst", copy_path=copy_path)
        assert conveyor_contract.check_sink(sink, source) == ROWS
    assert pg_exec(pg_target, "SELECT count(*), count(DISTINCT id) FROM contract_dst") == [(2 * ROWS, ROWS)]
    pg_exec(pg_source, "DROP TABLE contract_src")
    err = conveyor_contract.check_read_error(source, WholeSource(index=0, count=1))
    assert "contract_src" in err.message


class Careless(registry.load("source", "duckdb")):  # type: ignore[misc]
    """A broken source: it reads everything whatever key range it is given."""

    def read(self, part):
        return super().read(WholeSource(index=part.index, count=part.count) if isinstance(part, KeyRange) else part)


def test_the_kit_catches_a_source_that_reads_a_partition_twice(conveyor_contract: Contract, parquet_dir: Path) -> None:
    """The kit itself: a source that ignores the key range it is given is caught."""
    db = str(parquet_dir / "c.duckdb")
    duckdb.connect(db).execute(f"CREATE TABLE src AS SELECT * FROM read_parquet('{parquet_dir}/*.parquet')").close()
    source = Careless(Careless.config_class(database=db, table="src"), JobOptions(batch_size=1000, degree=2))
    with pytest.raises(ContractBroken, match=r"strategy rangeid: the partitions hold \d+ rows, the source 5000"):
        conveyor_contract.check_source(source, {"rangeid": {"distribute_key": "id"}})
