"""Files on S3 (moto's S3 server on loopback, with authentication) and DuckDB queries over them."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from conveyor.errors import ConfigError, ConnectError, SchemaError
from tests.helpers import job, pg_exec


def _duck_with_s3(s3) -> duckdb.DuckDBPyConnection:
    import s3fs

    con = duckdb.connect()
    con.register_filesystem(s3fs.S3FileSystem(skip_instance_cache=True))
    return con


def _diff(con: duckdb.DuckDBPyConnection, a: str, b: str) -> tuple[int, int, int]:
    """(rows in a, rows only in a, rows only in b): 0 and 0 mean the same multiset of rows."""
    n = con.execute(f"SELECT count(*) FROM {a}").fetchone()[0]
    only_a = con.execute(f"SELECT count(*) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b})").fetchone()[0]
    only_b = con.execute(f"SELECT count(*) FROM (SELECT * FROM {b} EXCEPT ALL SELECT * FROM {a})").fetchone()[0]
    return n, only_a, only_b


def test_s3_parquet_to_duckdb(s3_orders: str, tpch_orders: Path, tmp_path: Path) -> None:
    db = tmp_path / "o.duckdb"
    report = job({"type": "parquet", "path": f"{s3_orders}/*.parquet"}, {"type": "duckdb", "database": str(db), "table": "orders"},
                 "files", load_mode="create", degree=2)
    assert len(report.results) == 4 and report.plan.partitions[0].paths[0].startswith("s3://conveyor-test/orders/")
    con = duckdb.connect(str(db))
    assert _diff(con, "orders", f"read_parquet('{tpch_orders}/*.parquet')") == (15000, 0, 0)


def test_duckdb_query_over_s3_datadriven_by_file(s3_orders: str, tpch_orders: Path, tmp_path: Path) -> None:
    db = tmp_path / "o.duckdb"
    source = {
        "type": "duckdb",
        "query": f"SELECT * FROM read_parquet('{s3_orders}/*.parquet', filename = true)",
        "drop_columns": ["filename"],
    }
    cfg_strategy = {"distribute_key": "filename", "datadriven_query": f"SELECT file FROM glob('{s3_orders}/*.parquet')"}
    from omegaconf import OmegaConf

    from conveyor.config import build_job
    from conveyor.pipelines.job import run_job

    report = run_job(build_job(OmegaConf.create({
        "source": source, "sink": {"type": "duckdb", "database": str(db), "table": "orders"},
        "strategy": {"type": "datadriven", **cfg_strategy}, "runtime": {"type": "local"}, "load_mode": "create", "degree": 2,
    })))
    assert len(report.results) == 4 and all(r.rows == 3750 for r in report.results)
    con = duckdb.connect(str(db))
    assert "filename" not in [c[0] for c in con.execute("DESCRIBE orders").fetchall()]
    assert _diff(con, "orders", f"read_parquet('{tpch_orders}/*.parquet')") == (15000, 0, 0)


def test_s3_to_postgres_pipeline_and_back_to_s3(cli, s3, s3_orders: str, tpch_orders: Path, pg_target, tmp_path: Path) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS s3_orders")
    res = cli("run", "pipeline=s3_parquet_to_postgres", f"vars.files={s3_orders}/*.parquet", f"vars.endpoint={s3.endpoint}",
              f"sink.port={pg_target.port}", "sink.table=s3_orders", "load_mode=create", "degree=2")
    assert res.code == 0, res.err
    assert "datadriven" in res.out and res.out.count("values-0000") == 4
    assert s3.secret_key not in res.out + res.err
    # PostgreSQL -> S3 Parquet, then compare every row with the original files
    report = job({"type": "postgres", "port": pg_target.port, "table": "s3_orders"},
                 {"type": "parquet", "path": "s3://conveyor-test/roundtrip"}, "ctid", load_mode="replace", degree=2)
    assert report.rows == 15000
    con = _duck_with_s3(s3)
    assert _diff(con, "read_parquet('s3://conveyor-test/roundtrip/*.parquet')", f"read_parquet('{tpch_orders}/*.parquet')") == (15000, 0, 0)


def test_hive_partitioned_output_on_s3(s3, s3_orders: str, tpch_orders: Path) -> None:
    report = job({"type": "parquet", "path": s3_orders}, {"type": "parquet", "path": "s3://conveyor-test/hive", "partition_by": ["o_orderstatus"]},
                 "files", load_mode="replace", degree=2)
    assert report.rows == 15000
    con = _duck_with_s3(s3)
    folders = {r[0].split("/")[-2] for r in con.execute("SELECT file FROM glob('s3://conveyor-test/hive/*/*.parquet')").fetchall()}
    assert folders == {"o_orderstatus=F", "o_orderstatus=O", "o_orderstatus=P"}
    back = "(SELECT * EXCLUDE (o_orderstatus), o_orderstatus::VARCHAR AS o_orderstatus FROM read_parquet('s3://conveyor-test/hive/*/*.parquet', hive_partitioning = true))"
    orig = f"(SELECT * EXCLUDE (o_orderstatus), o_orderstatus::VARCHAR AS o_orderstatus FROM read_parquet('{tpch_orders}/*.parquet'))"
    assert _diff(con, back, orig) == (15000, 0, 0)


def test_row_group_partitions_split_one_file(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": pa.array(range(10000), pa.int64())}), tmp_path / "one.parquet", row_group_size=1000)
    from omegaconf import OmegaConf

    from conveyor.config import build_job
    from conveyor.pipelines.job import run_job

    report = run_job(build_job(OmegaConf.create({
        "source": {"type": "parquet", "path": str(tmp_path / "one.parquet")},
        "sink": {"type": "parquet", "path": str(tmp_path / "out")},
        "strategy": {"type": "files", "row_groups_per_partition": 3}, "runtime": {"type": "local"}, "load_mode": "create", "degree": 2,
    })))
    assert [r.rows for r in report.results] == [3000, 3000, 3000, 1000]
    assert sorted(pq.read_table(tmp_path / "out").column("x").to_pylist()) == list(range(10000))


def test_memory_filesystem_round_trip() -> None:
    import fsspec
    import pyarrow.parquet as pq

    mem = fsspec.filesystem("memory")
    with mem.open("/conveyor-in/a.parquet", "wb") as f:
        pq.write_table(pa.table({"k": [1, 2, 3]}), f)
    job({"type": "parquet", "path": "memory://conveyor-in"}, {"type": "csv", "path": "memory://conveyor-out"}, load_mode="replace")
    assert mem.cat("/conveyor-out/part-00000.csv").decode().splitlines() == ['"k"', "1", "2", "3"]


# --- bad input ------------------------------------------------------------------------------


def test_a_corrupted_file_is_named_and_replace_keeps_the_target(s3, s3_orders: str, tpch_orders: Path, tmp_path: Path) -> None:
    client = s3.client()
    for f in sorted(tpch_orders.iterdir())[:2]:
        client.upload_file(str(f), "conveyor-test", f"damaged/{f.name}")
    client.put_object(Bucket="conveyor-test", Key="damaged/zz-broken.parquet", Body=b"PAR1 not really PAR1")
    db = tmp_path / "t.duckdb"
    duckdb.connect(str(db)).execute("CREATE TABLE orders AS SELECT 1 AS keep").close()
    with pytest.raises(SchemaError, match="s3://conveyor-test/damaged/zz-broken.parquet"):
        job({"type": "parquet", "path": "s3://conveyor-test/damaged"}, {"type": "duckdb", "database": str(db), "table": "orders"},
            "files", load_mode="replace")
    assert duckdb.connect(str(db)).execute("SELECT * FROM orders").fetchall() == [(1,)]


def test_missing_bucket_is_named(s3, cli, tmp_path: Path) -> None:
    res = cli("run", "pipeline=demo", "source.path=s3://no-such-bucket/x/*.parquet", f"sink.database={tmp_path}/x.duckdb")
    assert res.code == 2 and "Traceback" not in res.err
    assert "error: source.path 's3://no-such-bucket/x/*.parquet': bucket 'no-such-bucket' does not exist" in res.err


def test_wrong_credentials_are_a_clear_error(s3, s3_orders: str, cli, tmp_path: Path) -> None:
    wrong = {"AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG", "AWS_SECRET_ACCESS_KEY": "wrong-secret-value"}
    res = cli("run", "pipeline=demo", f"source.path={s3_orders}", f"sink.database={tmp_path}/x.duckdb", env=wrong)
    assert res.code == 3, res.err
    assert "access denied" in res.err and "hint: check the credentials" in res.err
    assert "wrong-secret-value" not in res.err + res.out and "Traceback" not in res.err
    assert not (tmp_path / "x.duckdb").exists()


def test_missing_s3_prefix_in_a_python_job(s3) -> None:
    with pytest.raises((ConfigError, ConnectError)):
        job({"type": "parquet", "path": "s3://conveyor-test/nothing-here/"}, {"type": "parquet", "path": "memory://x"}, load_mode="replace")
