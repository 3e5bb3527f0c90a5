"""Load modes, column mapping, UNLOGGED and partitioned targets, Parquet -> PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conveyor.errors import SchemaError, TransferError
from tests.helpers import Relayed, checksum, job, pg_exec


def _sink(server, table: str, **kw) -> dict:
    return {"type": "postgres", "port": server.port, "table": table, **kw}


@pytest.fixture
def parquet_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "pq"
    folder.mkdir()
    for i in range(3):
        ids = pa.array(range(i * 1000, i * 1000 + 1000), pa.int64())
        pq.write_table(pa.table({"ID": ids, "Label": pc.cast(ids, pa.string())}), folder / f"f{i}.parquet")
    return folder


def test_parquet_to_postgres_tpch_orders(tpch_orders: Path, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS orders")
    report = job({"type": "parquet", "path": str(tpch_orders)}, _sink(pg_target, "orders"), "files", load_mode="create", degree=2)
    assert report.rows == 15000
    types = dict(pg_exec(pg_target, "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                                    "WHERE attrelid = 'orders'::regclass AND attnum > 0"))
    assert types["o_totalprice"] == "numeric(15,2)" and types["o_orderdate"] == "date" and types["o_comment"] == "text"
    import duckdb

    expected = duckdb.sql(f"SELECT count(*), sum(o_orderkey), sum(o_totalprice), count(DISTINCT o_comment) "
                          f"FROM read_parquet('{tpch_orders}/*.parquet')").fetchone()
    got = pg_exec(pg_target, "SELECT count(*), sum(o_orderkey), sum(o_totalprice), count(DISTINCT o_comment) FROM orders")[0]
    assert tuple(got) == tuple(expected)


def test_append_truncate_and_mapping_by_name(parquet_dir: Path, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS mapped",
            "CREATE TABLE mapped (label text, id integer NOT NULL, loaded_at timestamptz NOT NULL DEFAULT now())")
    src = {"type": "parquet", "path": str(parquet_dir)}
    job(src, _sink(pg_target, "mapped"), "files", load_mode="append", degree=2)
    job(src, _sink(pg_target, "mapped"), "files", load_mode="append", degree=2)
    assert pg_exec(pg_target, "SELECT count(*), count(DISTINCT id), min(label), count(loaded_at) FROM mapped")[0] == (6000, 3000, "0", 6000)
    job(src, _sink(pg_target, "mapped"), "files", load_mode="truncate", degree=2)
    assert pg_exec(pg_target, "SELECT count(*), count(DISTINCT id) FROM mapped")[0] == (3000, 3000)
    assert pg_exec(pg_target, "SELECT count(*) FROM pg_class WHERE relname LIKE '_conveyor_stage%'")[0][0] == 0


def test_mapping_by_position(parquet_dir: Path, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS pos", "CREATE TABLE pos (a bigint, b text)")
    job({"type": "parquet", "path": str(parquet_dir)}, _sink(pg_target, "pos"), load_mode="append", map_method="position")
    assert pg_exec(pg_target, "SELECT count(*), sum(a), max(b::int) FROM pos")[0] == (3000, sum(range(3000)), 2999)


def test_extra_and_missing_columns_are_reported_before_rows_move(parquet_dir: Path, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS strict_t", "CREATE TABLE strict_t (id int, must text NOT NULL)", "INSERT INTO strict_t VALUES (-1, 'keep')")
    with pytest.raises(SchemaError) as info:
        job({"type": "parquet", "path": str(parquet_dir)}, _sink(pg_target, "strict_t"), load_mode="truncate")
    assert "source columns with no target column: Label" in str(info.value)
    assert "without a default the source does not fill: must" in str(info.value)
    assert pg_exec(pg_target, "SELECT * FROM strict_t") == [(-1, "keep")]


def test_a_failed_replace_leaves_the_old_table(parquet_dir: Path, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS keep_me", "CREATE TABLE keep_me (ID bigint, \"Label\" text)", "INSERT INTO keep_me VALUES (7, 'old')")
    (parquet_dir / "f1.parquet").write_bytes(b"PAR1 damaged PAR1")
    for mode in ("replace", "truncate"):
        with pytest.raises(SchemaError, match="f1.parquet"):
            job({"type": "parquet", "path": str(parquet_dir)}, _sink(pg_target, "keep_me"), "files", load_mode=mode, degree=2)
        assert pg_exec(pg_target, "SELECT * FROM keep_me") == [(7, "old")]
    assert pg_exec(pg_target, "SELECT count(*) FROM pg_class WHERE relname LIKE '_conveyor_stage%'")[0][0] == 0


def test_a_value_that_does_not_fit_rolls_its_partition_back(pg_target, tmp_path: Path) -> None:
    pq.write_table(pa.table({"v": pa.array([1, 2, 3_000_000_000], pa.int64())}), tmp_path / "big.parquet")
    pg_exec(pg_target, "DROP TABLE IF EXISTS small", "CREATE TABLE small (v int4)")
    with pytest.raises(TransferError, match="column v -> v: a value does not fit int32"):
        job({"type": "parquet", "path": str(tmp_path / "big.parquet")}, _sink(pg_target, "small"), load_mode="append")
    assert pg_exec(pg_target, "SELECT count(*) FROM small")[0][0] == 0


def test_unlogged_and_partitioned_targets(parquet_dir: Path, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS unl", "DROP TABLE IF EXISTS parted",
            "CREATE TABLE parted (id bigint, label text) PARTITION BY RANGE (id)",
            "CREATE TABLE parted_a PARTITION OF parted FOR VALUES FROM (0) TO (1500)",
            "CREATE TABLE parted_b PARTITION OF parted FOR VALUES FROM (1500) TO (10000)")
    src = {"type": "parquet", "path": str(parquet_dir)}
    job(src, _sink(pg_target, "unl", unlogged=True), "files", load_mode="create", degree=2)
    assert pg_exec(pg_target, "SELECT relpersistence FROM pg_class WHERE relname = 'unl'")[0][0] == "u"
    assert pg_exec(pg_target, "SELECT count(*) FROM unl")[0][0] == 3000
    job(src, _sink(pg_target, "parted"), "files", load_mode="truncate", degree=2)
    job(src, _sink(pg_target, "parted"), "files", load_mode="append", degree=2)
    assert pg_exec(pg_target, "SELECT count(*) FROM parted_a")[0][0] == 3000
    assert pg_exec(pg_target, "SELECT count(*) FROM parted_b")[0][0] == 3000
    with pytest.raises(SchemaError, match="partitioned"):
        job(src, _sink(pg_target, "parted"), load_mode="replace")


def test_postgres_to_postgres_replace_swaps_in_one_transaction(pg_source, pg_target) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS src_r", "CREATE TABLE src_r AS SELECT g AS id, md5(g::text) AS h FROM generate_series(1, 5000) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS dst_r", "CREATE TABLE dst_r (id int PRIMARY KEY, h text)", "INSERT INTO dst_r VALUES (0, 'old')")
    report = job({"type": "postgres", "port": pg_source.port, "table": "src_r"}, _sink(pg_target, "dst_r"), "ctid",
                 load_mode="replace", degree=2)
    assert report.sink_plan.native == "pgcopy-binary"
    assert checksum(pg_target, "dst_r") == checksum(pg_source, "src_r")
    # INCLUDING ALL: the primary key came along
    assert pg_exec(pg_target, "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'dst_r'::regclass AND indisprimary") == [("dst_r_pkey",)]


def test_plan_shows_the_path_and_the_strategys_choice(pg_source, pg_target, cli) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS planned", "CREATE TABLE planned AS SELECT g AS id FROM generate_series(1, 1000) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS planned", "CREATE TABLE planned (id int)")
    base = ["plan", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=planned",
            f"sink.port={pg_target.port}", "sink.table=planned", "strategy=auto"]
    res = cli(*base)
    assert res.code == 0, res.err
    assert "strategy: chose ctid" in res.out and "path: pass-through" in res.out
    res = cli(*base, "sink.copy_path=arrow")
    assert "path: arrow: copy_path=arrow" in res.out
    pg_exec(pg_target, "DROP TABLE planned", "CREATE TABLE planned (id bigint)")
    out = " ".join(cli(*base).out.split())  # as wrapped to the terminal's width
    assert "path: arrow: column id: integer -> bigint differ" in out
    assert "truncate in one transaction (TRUNCATE, then COPY straight into the target)" in out  # pg_to_pg's truncate, one partition
    assert pg_exec(pg_target, "SELECT count(*) FROM planned")[0][0] == 0


def test_the_pass_through_is_negotiated_on_the_sources_offer_not_its_class(pg_source, pg_target) -> None:
    """The sink never receives the source: prepare gets SourceInfo.native (column types, wire format)
    and records the agreed format in SinkPlan.native; the task streams export_native into write_native."""
    from dataclasses import replace

    from omegaconf import OmegaConf

    from conveyor.config import build_job
    from conveyor.core import PrepareRequest
    from conveyor.pipelines import run_job

    pg_exec(pg_source, "DROP TABLE IF EXISTS relayed", "CREATE TABLE relayed (id bigint, d date, t text)",
            "INSERT INTO relayed SELECT g, date '2000-01-01' + g, 'r' || g FROM generate_series(1, 5000) g",
            "INSERT INTO relayed VALUES (0, 'infinity', NULL)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS relayed", "CREATE TABLE relayed (id bigint, d date, t text)")
    assert "source" not in PrepareRequest.__dataclass_fields__
    spec = build_job(OmegaConf.create({
        "source": {"type": "postgres", "port": pg_source.port, "table": "relayed"}, "sink": _sink(pg_target, "relayed"),
        "strategy": {"type": "none"}, "runtime": {"type": "local"}, "load_mode": "append"}))
    report = run_job(replace(spec, source=Relayed(spec.source)))
    assert report.sink_plan is not None and report.sink_plan.native == "pgcopy-binary"
    assert report.sink_plan.path_reason.startswith("pass-through") and report.rows == 5001
    assert checksum(pg_target, "relayed") == checksum(pg_source, "relayed")


def test_the_pass_through_reads_psql_through_a_pipe_that_holds_a_chunk(pg_source) -> None:
    """The pipe psql writes the stream into holds one relay chunk (1 MiB), so psql goes on reading
    the source while the relay writes a chunk into the target; through Linux's default 64 KiB pipe
    the two sides took turns (TPC-H lineitem SF1, one stream, alternating runs: 8.4-8.5 s, then 8.1-8.2 s; orders
    1.73-1.80 s, then 1.63-1.67 s). Linux only (F_SETPIPE_SZ); on the main this started from: 64 KiB."""
    fcntl = pytest.importorskip("fcntl")
    from conveyor.connectors.postgres import passthrough
    from conveyor.connectors.postgres.common import PgConnConfig

    if not hasattr(fcntl, "F_GETPIPE_SZ") or int(Path("/proc/sys/fs/pipe-max-size").read_text()) < passthrough.CHUNK:
        pytest.skip("pipes cannot hold 1 MiB here")
    pg_exec(pg_source, "DROP TABLE IF EXISTS piped", "CREATE TABLE piped AS SELECT g AS id FROM generate_series(1, 1000) g")
    with passthrough.export(PgConnConfig(port=pg_source.port), "SELECT id FROM piped",
                            ["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"], "piped-0") as stream:
        assert fcntl.fcntl(stream.data.fileno(), fcntl.F_GETPIPE_SZ) == passthrough.CHUNK
        data = b"".join(iter(lambda: stream.read(passthrough.CHUNK), b""))
    assert stream.rows == 1000  # the COPY's own count, from psql's stdout (the data went to the pipe)
    # the whole binary COPY stream: its signature, 1000 rows of one int4 (2 + 4 + 4 bytes), the trailer
    assert data.startswith(b"PGCOPY\n\xff\r\n\x00") and data.endswith(b"\xff\xff") and len(data) == 19 + 1000 * 10 + 2


def test_an_append_from_a_source_that_cannot_count_into_a_table_with_rows_passes_verify_count(pg_target, tmp_path: Path) -> None:
    """A CSV source cannot count its partitions, and the PostgreSQL sink does not scan an append's
    target before it (each partition's rows are checked before its commit instead). On the main this
    started from, verify=count then counted the table after the load against a "before" of 0 and
    failed the run after its rows had committed ("target: 3 new rows, source 2")."""
    (tmp_path / "a.csv").write_text("id,label\n1,a\n2,b\n")
    pg_exec(pg_target, "DROP TABLE IF EXISTS counted_before", "CREATE TABLE counted_before (id int, label text)",
            "INSERT INTO counted_before VALUES (0, 'there before')")
    report = job({"type": "csv", "path": str(tmp_path)}, _sink(pg_target, "counted_before"), "files", load_mode="append")
    v = report.verification
    assert v.ok and v.written_rows == 2 and v.target_rows is None
    assert any("were not counted" in n for n in v.notes)
    assert pg_exec(pg_target, "SELECT id, label FROM counted_before ORDER BY id") == [(0, "there before"), (1, "a"), (2, "b")]


def test_a_pass_through_whose_query_raises_many_notices_finishes(pg_source, pg_target, cli) -> None:
    """psql writes a query's notices to its stderr. That was a pipe read only at the stream's end:
    past 64 KiB of notices psql stopped, waiting for it to be read, and the relay waited for psql's
    stream, so the job hung (on the main this started from, until it was killed). psql's messages
    now go to a file. The CLI runs as a process of its own, so a hang fails on its timeout."""
    pg_exec(pg_source, "CREATE OR REPLACE FUNCTION talkative(i int) RETURNS int LANGUAGE plpgsql AS "
                       "$$ BEGIN RAISE NOTICE 'row % of a query that talks a lot', i; RETURN i; END $$",
            "DROP TABLE IF EXISTS talk", "CREATE TABLE talk AS SELECT g AS id FROM generate_series(1, 20000) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS talk", "CREATE TABLE talk (id int)")
    res = cli("run", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=null",
              "source.query='SELECT talkative(id) AS id FROM talk'", "strategy=none", f"sink.port={pg_target.port}",
              "sink.table=talk", "runtime=local", timeout=90)
    assert res.code == 0, res.err
    assert "pass-through" in res.out + res.err  # 20000 notices of ~40 bytes: 800 KB through psql's stderr
    assert pg_exec(pg_target, "SELECT count(*), sum(id) FROM talk") == [(20000, 20000 * 20001 // 2)]
