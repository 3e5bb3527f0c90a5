"""Every built-in connector runs the contract suites (conveyor.testing.suites), as a third-party
connector package does: each load mode it offers, a resumed append, a Ctrl-C mid-partition, a value
its target cannot hold; and every strategy over its source. Real files, a real DuckDB database, a real
SQLite file through ADBC, the throwaway PostgreSQL and MariaDB servers; nothing mocked."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from conveyor.testing.suites import ChangeApplySuite, SinkSuite, SourceSuite
from tests.helpers import pg_exec

KEYED = {"rangeid": {"distribute_key": "id"}, "ntile": {"distribute_key": "id"}, "random": {"distribute_key": "id"}}


# --- files ---------------------------------------------------------------------------------------


class _Folder:
    tmp: Path

    def folder(self, target: str) -> Path:
        return self.tmp / "targets" / target


class TestParquetSink(_Folder, SinkSuite):
    sink = "parquet"
    modes = ("create", "append", "truncate", "replace")

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"path": str(self.folder(target))}

    def create_target(self, target: str, rows: pa.Table, key: bool) -> None:
        self.folder(target).mkdir(parents=True)
        pq.write_table(rows, self.folder(target) / "existing.parquet")

    def read_target(self, target: str) -> pa.Table | None:
        return pq.read_table(self.folder(target)) if self.folder(target).exists() else None


class TestCsvSink(_Folder, SinkSuite):
    sink = "csv"
    modes = ("create", "append", "truncate", "replace")
    read_back_types = ("amount", "at", "day", "flag")  # bytes are refused by name: no text form reads back as bytes

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"path": str(self.folder(target))}

    def create_target(self, target: str, rows: pa.Table, key: bool) -> None:
        self.folder(target).mkdir(parents=True)
        pacsv.write_csv(rows, self.folder(target) / "existing.csv")

    def read_target(self, target: str) -> pa.Table | None:
        folder = self.folder(target)
        if not folder.exists():
            return None
        types = pacsv.ConvertOptions(column_types={"id": pa.int64(), "name": pa.string(), "x": pa.float64()})
        return pa.concat_tables([pacsv.read_csv(f, convert_options=types) for f in sorted(folder.glob("*.csv"))])


class TestParquetSource(SourceSuite):
    source = "parquet"
    strategies = {"files": {}, "none": {}}

    def source_config(self, table: str) -> dict[str, Any]:
        return {"path": str(self.tmp / table)}

    def create_source(self, table: str, rows: pa.Table) -> None:
        (self.tmp / table).mkdir()
        for i in range(3):
            pq.write_table(rows.slice(i * 1700, 1700), self.tmp / table / f"p{i}.parquet", row_group_size=900)


class TestCsvSource(SourceSuite):
    source = "csv"
    strategies = {"files": {}, "none": {}}

    def source_config(self, table: str) -> dict[str, Any]:
        return {"path": str(self.tmp / table)}

    def create_source(self, table: str, rows: pa.Table) -> None:
        (self.tmp / table).mkdir()
        for i in range(2):
            pacsv.write_csv(rows.slice(i * 2500, 2500), self.tmp / table / f"p{i}.csv")


# --- DuckDB and SQLite (ADBC) ----------------------------------------------------------------------


class _DuckDB:
    tmp: Path

    @property
    def db(self) -> str:
        return str(self.tmp / "kit.duckdb")

    def create_table(self, table: str, rows: pa.Table, key: bool = False) -> None:
        with duckdb.connect(self.db) as con:
            con.execute(f"CREATE TABLE {table} (id BIGINT{' PRIMARY KEY' if key else ''}, name VARCHAR, x DOUBLE)")
            con.register("rows_in", rows)
            con.execute(f"INSERT INTO {table} SELECT * FROM rows_in")


class TestDuckDBSink(_DuckDB, SinkSuite):
    sink = "duckdb"
    modes = ("create", "append", "truncate", "replace", "merge")

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"database": self.db, "table": target}

    def create_target(self, target: str, rows: pa.Table, key: bool) -> None:
        self.create_table(target, rows, key)

    def read_target(self, target: str) -> pa.Table | None:
        with duckdb.connect(self.db) as con:
            if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [target]).fetchone()[0]:
                return None
            return con.execute(f"SELECT id, name, x FROM {target}").arrow().read_all()

    def narrow_target(self, target: str) -> str | None:
        with duckdb.connect(self.db) as con:
            con.execute(f"CREATE TABLE {target} (id INTEGER, name VARCHAR, x DOUBLE)")
        return "id"


class TestDuckDBSource(_DuckDB, SourceSuite):
    source = "duckdb"
    strategies = {"none": {}, **KEYED}

    def source_config(self, table: str) -> dict[str, Any]:
        return {"database": self.db, "table": table}

    def create_source(self, table: str, rows: pa.Table) -> None:
        self.create_table(table, rows)


class _Sqlite:
    tmp: Path

    def file(self, name: str) -> str:
        return str(self.tmp / f"{name}.sqlite")  # a file each: SQLite locks the file a source reads

    def create_table(self, file: str, table: str, rows: pa.Table) -> None:
        con = sqlite3.connect(file)
        con.execute(f"CREATE TABLE {table} (id INTEGER, name TEXT, x REAL)")
        con.executemany(f"INSERT INTO {table} VALUES (?, ?, ?)", zip(*(rows.column(c).to_pylist() for c in rows.column_names)))
        con.commit()
        con.close()


class TestAdbcSqliteSink(_Sqlite, SinkSuite):
    sink = "adbc"
    modes = ("create", "append", "truncate", "replace")
    resumes = False  # no commit markers: an ADBC target's resume trusts the manifest

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"driver": "sqlite", "uri": self.file("target"), "table": target}

    def create_target(self, target: str, rows: pa.Table, key: bool) -> None:
        self.create_table(self.file("target"), target, rows)

    def read_target(self, target: str) -> pa.Table | None:
        con = sqlite3.connect(self.file("target"))
        try:
            if not con.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", [target]).fetchone()[0]:
                return None
            rows = con.execute(f"SELECT id, name, x FROM {target}").fetchall()
        finally:
            con.close()
        return pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "name": [r[1] for r in rows], "x": [r[2] for r in rows]})


class TestAdbcSqliteSource(_Sqlite, SourceSuite):
    source = "adbc"
    strategies = {"none": {}, "rangeid": {"distribute_key": "id"}}

    def source_config(self, table: str) -> dict[str, Any]:
        return {"driver": "sqlite", "uri": self.file("source"), "table": table}

    def create_source(self, table: str, rows: pa.Table) -> None:
        self.create_table(self.file("source"), table, rows)


# --- PostgreSQL --------------------------------------------------------------------------------------


def _pg_load(server: Any, table: str, rows: pa.Table, key: bool = False) -> None:
    values = ", ".join(f"({i}, '{n}', {x!r})" for i, n, x in zip(*(rows.column(c).to_pylist() for c in ("id", "name", "x"))))
    pg_exec(server, f"CREATE TABLE {table} (id bigint{' PRIMARY KEY' if key else ''}, name text, x float8)",
            *([f"INSERT INTO {table} VALUES {values}"] if rows.num_rows else []), f"ANALYZE {table}")


def _pg_read(server: Any, table: str) -> pa.Table | None:
    if pg_exec(server, f"SELECT to_regclass('{table}')")[0][0] is None:
        return None
    rows = pg_exec(server, f"SELECT id, name, x FROM {table}")
    return pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "name": pa.array([r[1] for r in rows], pa.string()),
                     "x": pa.array([r[2] for r in rows], pa.float64())})


@pytest.mark.parametrize("writer", ["pgpq", "adbc"])
class TestPostgresSink(SinkSuite):
    """The kit's source is Parquet: the Arrow path with each writer (the pass-through, PostgreSQL to
    PostgreSQL, is checked by tests/integration)."""
    sink = "postgres"
    modes = ("create", "append", "truncate", "replace", "merge")

    @pytest.fixture(autouse=True)
    def _server(self, pg_target, writer: str) -> None:
        self.server, self.writer = pg_target, writer

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"port": self.server.port, "table": target, "copy_path": "arrow", "writer": self.writer}

    def create_target(self, target: str, rows: pa.Table, key: bool) -> None:
        _pg_load(self.server, target, rows, key)

    def read_target(self, target: str) -> pa.Table | None:
        return _pg_read(self.server, target)

    def narrow_target(self, target: str) -> str | None:
        pg_exec(self.server, f"CREATE TABLE {target} (id bigint, name varchar(4), x float8)")
        return "name"


class TestPostgresSource(SourceSuite):
    source = "postgres"
    strategies = {"ctid": {}, "none": {}, "datadriven": {"distribute_key": "name"}, **KEYED}

    @pytest.fixture(autouse=True)
    def _server(self, pg_source) -> None:
        self.server = pg_source

    def source_config(self, table: str) -> dict[str, Any]:
        return {"port": self.server.port, "table": table}

    def create_source(self, table: str, rows: pa.Table) -> None:
        _pg_load(self.server, table, rows)


# --- MySQL / MariaDB ---------------------------------------------------------------------------------


def _my_load(m: Any, table: str, rows: pa.Table, key: bool = False) -> None:
    values = ", ".join(f"({i}, '{n}', {x!r})" for i, n, x in zip(*(rows.column(c).to_pylist() for c in ("id", "name", "x"))))
    m.execute(f"CREATE TABLE {table} (id BIGINT{' PRIMARY KEY' if key else ''}, name VARCHAR(64), x DOUBLE)",
              *([f"INSERT INTO {table} VALUES {values}"] if rows.num_rows else []))


class _MySql:
    @pytest.fixture(autouse=True)
    def _server(self, mysql_server) -> None:
        self.my = mysql_server

    def connection(self) -> dict[str, Any]:
        return {"port": self.my.port, "user": self.my.user, "database": self.my.database}


@pytest.mark.parametrize("bulk", ["load_data", "insert"])
class TestMySqlSink(_MySql, SinkSuite):
    sink = "mysql"
    modes = ("create", "append", "truncate", "replace", "merge")

    @pytest.fixture(autouse=True)
    def _bulk(self, bulk: str) -> None:
        self.bulk = bulk

    def sink_config(self, target: str) -> dict[str, Any]:
        return {**self.connection(), "table": target, "bulk": self.bulk}

    def create_target(self, target: str, rows: pa.Table, key: bool) -> None:
        _my_load(self.my, target, rows, key)

    def read_target(self, target: str) -> pa.Table | None:
        if not self.my.execute(f"SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() "
                               f"AND table_name = '{target}'")[0][0]:
            return None
        rows = self.my.execute(f"SELECT id, name, x FROM {target}")
        return pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "name": pa.array([r[1] for r in rows], pa.string()),
                         "x": pa.array([r[2] for r in rows], pa.float64())})

    def narrow_target(self, target: str) -> str | None:
        self.my.execute(f"CREATE TABLE {target} (id BIGINT, name VARCHAR(4), x DOUBLE)")
        return "name"


class TestMySqlSource(_MySql, SourceSuite):
    source = "mysql"
    strategies = {"none": {}, **KEYED}

    def source_config(self, table: str) -> dict[str, Any]:
        return {**self.connection(), "table": table}

    def create_source(self, table: str, rows: pa.Table) -> None:
        _my_load(self.my, table, rows, key=True)


# --- the kit itself: a broken sink is caught -------------------------------------------------------


def test_the_sink_suite_catches_a_sink_that_writes_a_batch_twice(tmp_path: Path, monkeypatch) -> None:
    """A Parquet sink that writes its first batch twice (a writer retrying a batch it had already sent):
    the append rule sees the duplicated rows, the Ctrl-C rule a partition that is not whole."""
    from importlib.metadata import EntryPoint

    from conveyor import registry
    from conveyor.errors import ConveyorError

    real = registry._entries
    doubled = EntryPoint("doubling", f"{__name__}:Doubling", registry.GROUPS["sink"])
    monkeypatch.setattr(registry, "_entries", lambda kind: {**real(kind), **({"doubling": [doubled]} if kind == "sink" else {})})

    class Broken(TestParquetSink):
        sink = "doubling"

    suite = Broken()
    suite.tmp, suite.name = tmp_path, "broken"
    with pytest.raises((AssertionError, ConveyorError)):
        suite.test_append_adds_every_row_once()


def _doubling():  # type: ignore[no-untyped-def]
    from conveyor import registry

    parquet = registry.load("sink", "parquet")

    class Doubling(parquet):  # type: ignore[misc, valid-type]
        def write(self, plan, part, batches):  # type: ignore[no-untyped-def]
            def twice(it):  # type: ignore[no-untyped-def]
                first = True
                for batch in it:
                    yield batch
                    if first:
                        first = False
                        yield batch

            return super().write(plan, part, twice(batches))

    return Doubling


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    if name == "Doubling":  # loaded by its entry point only when the kit's self-test runs
        return _doubling()
    raise AttributeError(name)


# --- ClickHouse ---------------------------------------------------------------------------------------


class _ClickHouse:
    @pytest.fixture(autouse=True)
    def _server(self, clickhouse_server) -> None:
        self.ch = clickhouse_server

    def connection(self) -> dict[str, Any]:
        return {"port": self.ch.http_port}

    def create_table(self, table: str, rows: pa.Table, key: bool = False) -> None:
        self.ch.execute(f"CREATE TABLE {table} (id Int64, name String, x Float64) ENGINE = MergeTree "
                        f"{'ORDER BY id' if key else 'ORDER BY tuple()'}")
        if rows.num_rows:
            values = ", ".join(f"({i}, '{n}', {x!r})" for i, n, x in zip(*(rows.column(c).to_pylist() for c in ("id", "name", "x"))))
            self.ch.execute(f"INSERT INTO {table} VALUES {values}")


class TestClickHouseSink(_ClickHouse, SinkSuite):
    sink = "clickhouse"
    modes = ("create", "append", "truncate", "replace", "merge")
    read_back_types = ("raw", "amount", "day", "flag")  # 18.16's DateTime holds whole seconds: the kit's microseconds are refused by name

    def sink_config(self, target: str) -> dict[str, Any]:
        return {**self.connection(), "table": target}

    def create_target(self, target: str, rows: pa.Table, key: bool) -> None:
        self.create_table(target, rows, key)

    def read_target(self, target: str) -> pa.Table | None:
        if self.ch.execute(f"SELECT count() FROM system.tables WHERE database = 'default' AND name = '{target}'")[0][0] == "0":
            return None
        rows = self.ch.execute(f"SELECT id, name, x FROM {target} FORMAT TSV")
        return pa.table({"id": pa.array([int(r[0]) for r in rows], pa.int64()), "name": pa.array([r[1] for r in rows], pa.string()),
                         "x": pa.array([float(r[2]) for r in rows], pa.float64())})

    def narrow_target(self, target: str) -> str | None:
        self.ch.execute(f"CREATE TABLE {target} (id Int32, name String, x Float64) ENGINE = MergeTree ORDER BY tuple()")
        return "id"


class TestClickHouseSource(_ClickHouse, SourceSuite):
    source = "clickhouse"
    strategies = {"none": {}, "native": {}, **KEYED}

    def source_config(self, table: str) -> dict[str, Any]:
        return {**self.connection(), "table": table}

    def create_source(self, table: str, rows: pa.Table) -> None:
        self.create_table(table, rows, key=True)


# --- Iceberg (pyiceberg's SQL catalog on a SQLite file) and Delta Lake, on the local filesystem -------------


class _Iceberg:
    tmp: Path

    def catalog_props(self) -> dict[str, Any]:
        return {"type": "sql", "uri": f"sqlite:///{self.tmp}/catalog.db", "warehouse": f"file://{self.tmp}/warehouse"}

    def catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        cat = load_catalog("default", **self.catalog_props())
        cat.create_namespace_if_not_exists("kit")
        return cat

    def create_table(self, table: str, rows: pa.Table, id_type: pa.DataType = pa.int64(), key: bool = False) -> None:
        from pyiceberg.schema import Schema
        from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType

        schema = pa.schema([pa.field("id", id_type, not key), ("name", pa.string()), ("x", pa.float64())])
        fields = Schema(NestedField(1, "id", IntegerType() if id_type == pa.int32() else LongType(), required=key),
                        NestedField(2, "name", StringType()), NestedField(3, "x", DoubleType()), identifier_field_ids=[1] if key else [])
        made = self.catalog().create_table(f"kit.{table}", schema=fields)
        if rows.num_rows:
            made.append(rows.cast(schema))


class TestIcebergSink(_Iceberg, SinkSuite):
    sink = "iceberg"
    modes = ("create", "append", "truncate", "replace", "merge")

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"catalog": self.catalog_props(), "table": f"kit.{target}"}

    def create_target(self, target: str, rows: pa.Table, key: bool) -> None:
        self.create_table(target, rows, key=key)

    def read_target(self, target: str) -> pa.Table | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            got = self.catalog().load_table(f"kit.{target}").scan().to_arrow()
        except NoSuchTableError:
            return None
        return got.select(["id", "name", "x"]).cast(pa.schema([("id", pa.int64()), ("name", pa.string()), ("x", pa.float64())]))

    def narrow_target(self, target: str) -> str | None:
        self.create_table(target, pa.table({"id": pa.array([], pa.int32()), "name": pa.array([], pa.string()),
                                            "x": pa.array([], pa.float64())}), pa.int32())
        return "id"


class TestIcebergSource(_Iceberg, SourceSuite):
    source = "iceberg"
    strategies = {"files": {}, "none": {}}

    def source_config(self, table: str) -> dict[str, Any]:
        return {"catalog": self.catalog_props(), "table": f"kit.{table}"}

    def create_source(self, table: str, rows: pa.Table) -> None:
        self.create_table(table, rows.slice(0, 0))
        made = self.catalog().load_table(f"kit.{table}")
        for i in range(3):  # three appends: three data files
            made.append(rows.slice(i * 1700, 1700).cast(made.schema().as_arrow().remove_metadata()))


class _Delta:
    tmp: Path

    def path(self, table: str) -> str:
        return str(self.tmp / "delta" / table)


class TestDeltaSink(_Delta, SinkSuite):
    sink = "delta"
    modes = ("create", "append", "truncate", "replace", "merge")

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"path": self.path(target), "merge_keys": ["id"]}  # a Delta table has no key of its own

    def create_target(self, target: str, rows: pa.Table, key: bool) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.path(target), rows, mode="error")

    def read_target(self, target: str) -> pa.Table | None:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.path(target)):
            return None
        return pa.table(DeltaTable(self.path(target)).to_pyarrow_table()).select(["id", "name", "x"])

    def narrow_target(self, target: str) -> str | None:
        from deltalake import write_deltalake

        write_deltalake(self.path(target), pa.table({"id": pa.array([], pa.int32()), "name": pa.array([], pa.string()),
                                                     "x": pa.array([], pa.float64())}), mode="error")
        return "id"


class TestDeltaSource(_Delta, SourceSuite):
    source = "delta"
    strategies = {"files": {}, "none": {}}

    def source_config(self, table: str) -> dict[str, Any]:
        return {"path": self.path(table)}

    def create_source(self, table: str, rows: pa.Table) -> None:
        from deltalake import write_deltalake

        for i in range(3):
            write_deltalake(self.path(table), rows.slice(i * 1700, 1700), mode="append")


# --- sync targets: the change apply contract (conveyor.testing.suites.ChangeApplySuite) ---------------------------------


class TestPostgresChangeApply(ChangeApplySuite):
    sink = "postgres"

    @pytest.fixture(autouse=True)
    def _server(self, pg_target) -> None:
        self.server = pg_target

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"port": self.server.port, "table": target}

    def read_target(self, target: str) -> pa.Table | None:
        return _pg_read(self.server, target)

    def touch_other_rows(self, target: str) -> str | None:
        pg_exec(self.server, f"CREATE OR REPLACE FUNCTION {target}_touch() RETURNS trigger LANGUAGE plpgsql AS "
                             f"$$ BEGIN DELETE FROM {target} WHERE id = 4999; RETURN NULL; END $$",
                f"CREATE TRIGGER {target}_touch AFTER UPDATE ON {target} FOR EACH STATEMENT EXECUTE FUNCTION {target}_touch()")
        return "a trigger that deletes another row"


class TestDuckDBChangeApply(_DuckDB, ChangeApplySuite):
    sink = "duckdb"

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"database": self.db, "table": target}

    def read_target(self, target: str) -> pa.Table | None:
        return TestDuckDBSink.read_target(self, target)  # type: ignore[arg-type]


class TestMySqlChangeApply(_MySql, ChangeApplySuite):
    sink = "mysql"

    def sink_config(self, target: str) -> dict[str, Any]:
        return {**self.connection(), "table": target}

    def read_target(self, target: str) -> pa.Table | None:
        return TestMySqlSink.read_target(self, target)  # type: ignore[arg-type]



class TestClickHouseChangeApply(_ClickHouse, ChangeApplySuite):
    sink = "clickhouse"

    def sink_config(self, target: str) -> dict[str, Any]:
        return {**self.connection(), "table": target}

    def read_target(self, target: str) -> pa.Table | None:
        return TestClickHouseSink.read_target(self, target)  # type: ignore[arg-type]


class TestPartitionedClickHouseChangeApply(TestClickHouseChangeApply):
    """The same, into a table of several partitions (each run rewrites only those its changes touch)."""

    def sink_config(self, target: str) -> dict[str, Any]:
        return {**self.connection(), "table": target, "partition_by": "intDiv(id, 1000)"}


class TestIcebergChangeApply(_Iceberg, ChangeApplySuite):
    sink = "iceberg"

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"catalog": self.catalog_props(), "table": f"kit.{target}"}

    def read_target(self, target: str) -> pa.Table | None:
        return TestIcebergSink.read_target(self, target)  # type: ignore[arg-type]


class TestDeltaChangeApply(_Delta, ChangeApplySuite):
    sink = "delta"

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"path": self.path(target)}

    def read_target(self, target: str) -> pa.Table | None:
        return TestDeltaSink.read_target(self, target)  # type: ignore[arg-type]
