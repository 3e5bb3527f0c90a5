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


def test_a_subset_created_in_postgres_keeps_the_source_columns_own_types_and_values(pg_source, pg_target) -> None:
    """A table made from a subset keeps each column's own type: on the main this started from, `columns` made the target
    from the Arrow schema alone, so json became jsonb (keys reordered, a duplicate key dropped, 1e400 spelled out), inet,
    cidr, macaddr and pg_lsn became text (``::ffff:1.2.3.4`` stored as ``::ffff:1.2.3.4/128``), oid bigint and a
    ``COLLATE "C"`` column lost its collation, all with exit 0."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS cr_types",
            "CREATE TABLE cr_types (id int, skipped text, j json, ip inet, net cidr, mac macaddr, lsn pg_lsn, o oid, c text COLLATE \"C\")",
            "INSERT INTO cr_types VALUES (1, 'x', '{\"b\": 1, \"a\": 2, \"a\": 3}', '::ffff:1.2.3.4', '10.1.2.0/24', '08:00:2b:01:02:03', "
            "'16/B374D848', 4294967295, 'B'), (2, 'y', '1e400', '192.168.1.226/24', '2001:4f8:3:ba::/64', 'ff:ff:ff:ff:ff:ff', '0/0', 0, 'a'), "
            "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
    chosen = ["id", "j", "ip", "net", "mac", "lsn", "o", "c"]
    pg_exec(pg_target, "DROP TABLE IF EXISTS cr_types_copy")
    conveyor.run(source={"type": "postgres", "port": pg_source.port, "table": "cr_types"},
                 sink={"type": "postgres", "port": pg_target.port, "table": "cr_types_copy"}, runtime={"type": "local"},
                 load_mode="create", columns=chosen, rename={"j": "doc"})
    types = "SELECT format_type(atttypid, atttypmod), attcollation::regcollation::text FROM pg_attribute WHERE attrelid = '{}'::regclass " \
            "AND attnum > 0 AND attname <> 'skipped' AND NOT attisdropped ORDER BY attnum"
    assert pg_exec(pg_target, types.format("cr_types_copy")) == pg_exec(pg_source, types.format("cr_types"))
    rows = "SELECT ({})::text FROM {} ORDER BY id"
    assert pg_exec(pg_target, rows.format("id, doc, ip, net, mac, lsn, o, c", "cr_types_copy")) == \
        pg_exec(pg_source, rows.format(", ".join(chosen), "cr_types"))
