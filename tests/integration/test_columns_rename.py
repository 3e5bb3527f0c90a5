"""The job's `columns` (a subset of the source's, in order) and `rename` ({source column: target name}), for any
source and sink: on the main this started from there was neither (a subset needed source.query, a rename a view).
Real servers and files: PostgreSQL into Parquet, into an existing PostgreSQL table with other column names (the
pass-through cannot carry renamed columns: the Arrow path), and DuckDB; each refusal is one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

import conveyor
from conveyor.errors import ConfigError, TransferError
from tests.helpers import pg_exec

pytestmark = pytest.mark.usefixtures("pg_password")


@pytest.fixture
def csrc(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS cr_src", "CREATE TABLE cr_src (id int PRIMARY KEY, hidden text, v text, n numeric(10,2))",
            "INSERT INTO cr_src SELECT g, 'h' || g, 'v' || g, g / 4.0 FROM generate_series(1, 3000) g")
    return {"type": "postgres", "port": pg_source.port, "table": "cr_src"}


def test_a_subset_renamed_into_parquet_and_into_another_postgres_table(csrc, pg_source, pg_target, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = conveyor.run(None, "source=postgres", "sink=parquet", "strategy=ctid", source=csrc, sink={"path": str(out)},
                          load_mode="create", degree=2, columns=["v", "id", "n"], rename={"id": "order_id", "n": "amount"})
    assert report.rows == 3000
    table = pq.read_table(out)
    assert table.column_names == ["v", "order_id", "amount"] and sorted(table["order_id"].to_pylist())[:2] == [1, 2]
    pg_exec(pg_target, "DROP TABLE IF EXISTS cr_dst", "CREATE TABLE cr_dst (order_id int PRIMARY KEY, label text)")
    report = conveyor.run("pg_to_pg", source={**csrc}, sink={"port": pg_target.port, "table": "cr_dst"}, load_mode="append",
                          columns=["id", "v"], rename={"id": "order_id", "v": "label"})
    assert report.rows == 3000 and report.sink_plan.native is None  # renamed columns take the Arrow path
    assert pg_exec(pg_target, "SELECT count(*), min(label), max(order_id) FROM cr_dst")[0] == (3000, "v1", 3000)
    # the key carried, renamed, into a table the job makes
    pg_exec(pg_target, "DROP TABLE IF EXISTS cr_new")
    conveyor.run("pg_to_pg", source={**csrc}, sink={"port": pg_target.port, "table": "cr_new"}, load_mode="create",
                 columns=["id", "v"], rename={"id": "order_id"})
    assert pg_exec(pg_target, "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                              "WHERE i.indrelid = 'cr_new'::regclass AND i.indisprimary") == [("order_id",)]


def test_refusals_name_the_key(csrc, tmp_path: Path) -> None:
    run = dict(sink={"path": str(tmp_path / "x")}, load_mode="create")
    with pytest.raises(ConfigError, match="columns: the source has no column nope"):
        conveyor.run(None, "source=postgres", "sink=parquet", "strategy=none", source=csrc, columns=["id", "nope"], **run)
    with pytest.raises(ConfigError, match="rename: the source has no column nope"):
        conveyor.run(None, "source=postgres", "sink=parquet", "strategy=none", source=csrc, rename={"nope": "x"}, **run)
    with pytest.raises(ConfigError, match="rename: hidden is not among the columns read"):
        conveyor.run(None, "source=postgres", "sink=parquet", "strategy=none", source=csrc, columns=["id"], rename={"hidden": "s"}, **run)
    with pytest.raises(ConfigError, match="rename: two columns would be named v"):
        conveyor.run(None, "source=postgres", "sink=parquet", "strategy=none", source=csrc, rename={"id": "v"}, **run)
    assert not (tmp_path / "x").exists()


def test_a_column_left_out_is_never_read(pg_source, tmp_path: Path) -> None:
    """A numeric NaN, an infinity and a two-dimensional array in columns the job left out stopped it ("column n2: a value
    does not fit decimal128(10, 2): NaN"): the PostgreSQL source read every column and the projection came after. It reads
    only the chosen ones now; the same columns chosen still refuse the value by name."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS cr_odd", "CREATE TABLE cr_odd (id int PRIMARY KEY, n2 numeric(10,2), ts timestamp, md int[], v text)",
            "INSERT INTO cr_odd VALUES (1, 'NaN', 'infinity', '{{1,2},{3,4}}', 'a'), (2, 1.5, now(), '{1}', 'b')")
    src = {"type": "postgres", "port": pg_source.port, "table": "cr_odd"}
    for path in ("auto", "duckdb", "adbc"):
        report = conveyor.run(None, "source=postgres", "sink=parquet", "strategy=ctid", source={**src, "decoder": path} if path != "auto" else src,
                              sink={"path": str(tmp_path / path)}, load_mode="create", columns=["v", "id"])
        assert report.rows == 2 and pq.read_table(tmp_path / path).column_names == ["v", "id"]
    with pytest.raises(TransferError, match=r"column n2 \(numeric\(10,2\)\): a value does not fit"):
        conveyor.run(None, "source=postgres", "sink=parquet", "strategy=ctid", source=src, sink={"path": str(tmp_path / "n2")},
                     load_mode="create", columns=["id", "n2"])
