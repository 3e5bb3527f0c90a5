"""conveyor.ray_data against a real Ray instance (local, 2 CPUs) and real PostgreSQL servers: a Conveyor source as a
Ray Data Datasource, a Conveyor sink as an exactly-once Datasink."""

from __future__ import annotations

import os
import signal
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conveyor.errors import ConveyorError, VerificationError
from tests.helpers import checksum, pg_exec

pytestmark = pytest.mark.usefixtures("pg_password")

ray_data = pytest.importorskip("conveyor.ray_data")


@pytest.fixture(autouse=True, scope="module")
def _functions_by_value(ray_instance):
    """The pipelines' own steps (map_batches functions of this module) travel to the workers by value."""
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _source(pg_source, table: str, rows: int) -> None:
    pg_exec(pg_source, f"DROP TABLE IF EXISTS {table}",
            f"CREATE TABLE {table} (id int PRIMARY KEY, price numeric(15,2) NOT NULL, flag char(1), at timestamptz, note text)",
            f"INSERT INTO {table} SELECT g, (g * 7.31)::numeric(15,2), chr(65 + g % 3), timestamptz '2020-02-29 12:00:00.123456+00' "
            f"+ g * interval '1 minute 0.000001 s', CASE WHEN g % 10 = 0 THEN NULL ELSE md5(g::text) END FROM generate_series(1, {rows}) g")


def _pg(server, table: str, **more) -> dict:
    return {"type": "postgres", "port": server.port, "table": table, **more}


def _taxed(batch: pa.Table) -> pa.Table:
    """The pipeline's own step: price with 10% tax, exact in decimal (as the SQL expectation computes it)."""
    from decimal import Decimal

    taxed = pc.round(pc.multiply(batch["price"], pa.scalar(Decimal("1.1"), pa.decimal128(2, 1))), ndigits=2, round_mode="half_up")
    return batch.set_column(batch.schema.get_field_index("price"), "price", taxed.cast(pa.decimal128(15, 2)))


def test_postgres_through_map_batches_into_postgres_and_parquet_exact(ray_instance, pg_source, pg_target, tmp_path) -> None:
    _source(pg_source, "rd_src", 40_000)
    with ray_data.reading(source=_pg(pg_source, "rd_src"), strategy={"type": "ctid", "partitions": 4}) as ds:
        # the schema is the source's as Conveyor reads it: exact decimals, UTC microseconds, char(n) as text
        schema = ds.schema().base_schema
        assert schema.field("price").type == pa.decimal128(15, 2)
        assert schema.field("at").type == pa.timestamp("us", tz="UTC")
        assert schema.field("flag").type in (pa.string(), pa.large_string(), pa.string_view())
        taxed = ds.map_batches(_taxed, batch_format="pyarrow")
        report = ray_data.write(taxed, sink=_pg(pg_target, "rd_dst"), load_mode="create")
        assert report.rows == 40_000 and report.handed == 40_000 and report.verification.ok
        assert report.verification.target_rows == 40_000
        parquet = ray_data.write(taxed, sink={"type": "parquet", "path": str(tmp_path / "rd_out")}, load_mode="create")
        assert parquet.rows == 40_000 and parquet.verification.ok
    # the target as PostgreSQL stored it: every row, the tax exact, the types the source's
    pg_exec(pg_source, "DROP TABLE IF EXISTS rd_expect",
            "CREATE TABLE rd_expect AS SELECT id, round(price * 1.1, 2)::numeric(15,2) AS price, flag, at, note FROM rd_src")
    assert checksum(pg_target, "rd_dst") == checksum(pg_source, "rd_expect")
    types = dict(pg_exec(pg_target, "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                                    "WHERE attrelid = 'rd_dst'::regclass AND attnum > 0 AND NOT attisdropped"))
    assert types["price"] == "numeric(15,2)" and types["at"] == "timestamp with time zone"
    # the Parquet files hold the pipeline's rows exactly
    got = pq.read_table(tmp_path / "rd_out").sort_by("id")
    assert got.schema.field("price").type == pa.decimal128(15, 2) and got.num_rows == 40_000
    want = pg_exec(pg_source, "SELECT id, price, flag, at, note FROM rd_expect ORDER BY id")
    assert [tuple(r.values()) for r in got.to_pylist()] == [tuple(r) for r in want]
    # and a file source is a Dataset too: the Parquet files read back through their own strategy, one task per file
    back = ray_data.read(source={"type": "parquet", "path": str(tmp_path / "rd_out")}, strategy={"type": "files"}).materialize()
    assert back.count() == 40_000 and back.schema().base_schema.field("price").type == pa.decimal128(15, 2)
    assert back.sum("id") == sum(range(1, 40_001))


def test_one_read_task_per_partition_whatever_ray_data_asks(ray_instance, pg_source) -> None:
    _source(pg_source, "rd_tasks", 10_000)
    source = ray_data.datasource(source=_pg(pg_source, "rd_tasks"), strategy={"type": "ctid", "partitions": 3})
    try:
        tasks = source.get_read_tasks(200)
        assert len(tasks) == 3 == len(source.partitions)
        # no task claims a row count: Ray Data would take their sum for ds.count() without reading, and they are estimates
        assert all(t.metadata.num_rows is None for t in tasks)
        assert all(t.schema == source.schema for t in tasks)
    finally:
        source._held.close()


def test_every_partition_reads_the_one_snapshot_taken_when_read_was_called(ray_instance, pg_source, pg_target) -> None:
    _source(pg_source, "rd_snap", 20_000)
    with ray_data.reading(source=_pg(pg_source, "rd_snap"), strategy={"type": "ctid", "partitions": 4}) as ds:
        pg_exec(pg_source, "DELETE FROM rd_snap WHERE id % 2 = 0", "INSERT INTO rd_snap SELECT g, 1, 'Z', now(), 'new' "
                           "FROM generate_series(100001, 105000) g")
        assert ds.count() == 20_000
        assert ds.filter(lambda row: row["flag"] == "Z").count() == 0


def _rows(server, table: str) -> int:
    return pg_exec(server, f"SELECT count(*) FROM {table}")[0][0]


def test_a_retried_write_task_finds_its_commit_and_writes_nothing_again(ray_instance, pg_source, pg_target) -> None:
    """A task that committed and whose worker died before Ray heard of it runs again with the same index and the same
    blocks: the commit marker of the first attempt makes the second write nothing (driven here by hand, the two
    attempts in one process)."""
    pg_exec(pg_target, "DROP TABLE IF EXISTS rd_once", "CREATE TABLE rd_once (id bigint, h text)")
    sink = ray_data.datasink(sink=_pg(pg_target, "rd_once"), load_mode="append")
    block = pa.table({"id": pa.array(range(1000), pa.int64()), "h": [str(i) for i in range(1000)]})
    sink.on_write_start(block.schema)

    class Ctx:
        task_idx = 7

    first = sink.write([block], Ctx())
    again = sink.write([block], Ctx())
    assert first.rows == 1000 and not first.already_committed
    assert again.already_committed and again.rows == 1000
    assert _rows(pg_target, "rd_once") == 1000


def _kill_a_writer(server, killed: list[int], stop: threading.Event) -> None:
    """SIGKILL the Ray worker whose COPY into the target is running (found by its connection's local port)."""
    import psutil

    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline and not killed:
        ports = [r[0] for r in pg_exec(server, "SELECT client_port FROM pg_stat_activity WHERE application_name = 'conveyor' "
                                               "AND state = 'active' AND query ILIKE 'COPY%' AND client_port IS NOT NULL")]
        if ports:
            for conn in psutil.net_connections(kind="tcp"):
                if conn.laddr and conn.laddr.port in ports and conn.pid and conn.pid != os.getpid():
                    os.kill(conn.pid, signal.SIGKILL)
                    killed.append(conn.pid)
                    return
        time.sleep(0.01)


@pytest.mark.parametrize("fused", [True, False], ids=["read-and-write-in-one-task", "write-tasks-of-their-own"])
def test_a_worker_killed_mid_write_is_retried_and_every_row_lands_once(ray_instance, pg_source, pg_target, fused: bool) -> None:
    """Fused: a Conveyor read written as it is runs each partition's read and write in one task, whose retry reads the
    partition again in the snapshot; not fused (min_bytes_per_write set): the write tasks take blocks from the object
    store, and a retry takes the same ones."""
    _source(pg_source, "rd_kill", 200_000)
    pg_exec(pg_target, "DROP TABLE IF EXISTS rd_kill_t",
            "CREATE TABLE rd_kill_t (id int, price numeric(15,2), flag char(1), at timestamptz, note text)")
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_a_writer, args=(pg_target, killed, stop), daemon=True)
    with ray_data.reading(source=_pg(pg_source, "rd_kill"), strategy={"type": "ctid", "partitions": 4}) as ds:
        killer.start()
        try:
            report = ray_data.write(ds, sink=_pg(pg_target, "rd_kill_t"), load_mode="append", min_bytes_per_write=None if fused else 1)
        finally:
            stop.set()
            killer.join(5)
    assert killed, "no write was caught mid-COPY"
    assert report.rows == 200_000 and report.verification.ok
    if fused:  # one write task per partition: each read and written in one task
        assert sorted(s.partition for s in report.partitions) == [f"raydata-{i:05d}" for i in range(4)]
    assert checksum(pg_target, "rd_kill_t") == checksum(pg_source, "rd_kill")


def test_a_failed_pipeline_leaves_a_staged_target_as_it_was(ray_instance, pg_target) -> None:
    import ray

    pg_exec(pg_target, "DROP TABLE IF EXISTS rd_keep", "CREATE TABLE rd_keep (n bigint)", "INSERT INTO rd_keep SELECT generate_series(1, 10)")

    def fail_late(batch: pa.Table) -> pa.Table:
        if pc.max(batch["n"]).as_py() >= 90_000:
            raise ValueError("the pipeline's own step failed")
        return batch

    ds = ray.data.range(100_000, override_num_blocks=10).map_batches(lambda b: {"n": b["id"]}, batch_format="pyarrow")
    with pytest.raises(Exception, match="the pipeline's own step failed"):
        ray_data.write(ds.map_batches(fail_late, batch_format="pyarrow"), sink=_pg(pg_target, "rd_keep"),
                       load_mode="truncate", min_bytes_per_write=1)
    assert pg_exec(pg_target, "SELECT count(*), sum(n) FROM rd_keep")[0] == (10, 55)
    assert not pg_exec(pg_target, "SELECT relname FROM pg_class WHERE relname LIKE '_conveyor_stage_%'")
    # the same Dataset without the failing step truncates and loads
    report = ray_data.write(ds, sink=_pg(pg_target, "rd_keep"), load_mode="truncate")
    assert report.rows == 100_000 and pg_exec(pg_target, "SELECT count(*), sum(n) FROM rd_keep")[0] == (100_000, 4_999_950_000)


def test_a_block_whose_values_would_change_is_refused_by_column(ray_instance, pg_target) -> None:
    """The sink is prepared for the first block's schema; a later block of another type is cast only where no value
    changes (int64 -> float64 of small integers), else refused naming the column, and the failed write leaves nothing."""
    sink = ray_data.datasink(sink=_pg(pg_target, "rd_mixed"), load_mode="create")
    sink.on_write_start(pa.schema([("n", pa.float64())]))

    class Ctx:
        task_idx = 0

    assert sink.write([pa.table({"n": pa.array([1, 2], pa.int64())})], Ctx()).rows == 2  # exact as doubles
    Ctx.task_idx = 1
    with pytest.raises(ConveyorError, match="column n: a block holds int64, the write was prepared for double"):
        sink.write([pa.table({"n": pa.array([2**53 + 1], pa.int64())})], Ctx())
    sink.on_write_failed(RuntimeError("the pipeline stopped"))
    assert not pg_exec(pg_target, "SELECT 1 FROM pg_class WHERE relname = 'rd_mixed' OR relname LIKE '_conveyor_stage_%'")


def test_a_sink_that_cannot_commit_a_partition_once_is_refused(ray_instance) -> None:
    with pytest.raises(ConveyorError, match="could write its rows twice"):
        ray_data.datasink(sink={"type": "flight", "location": "grpc://127.0.0.1:1", "path": ["x"]})


def test_verification_reads_what_the_target_stored(ray_instance, pg_target) -> None:
    """A target trigger that drops rows silently: the partition's check against the rows handed to it fails and the
    load is not made visible."""
    import ray

    pg_exec(pg_target, "DROP TABLE IF EXISTS rd_drop", "CREATE TABLE rd_drop (id bigint)",
            "CREATE OR REPLACE FUNCTION rd_drop_odd() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN IF NEW.id % 2 = 1 THEN RETURN NULL; END IF; RETURN NEW; END $$",
            "CREATE TRIGGER rd_drop_odd BEFORE INSERT ON rd_drop FOR EACH ROW EXECUTE FUNCTION rd_drop_odd()")
    ds = ray.data.range(1000).map_batches(lambda b: {"id": b["id"]}, batch_format="pyarrow")
    with pytest.raises(VerificationError, match="the target stored 500 of the 1,000 rows sent to it") as failed:
        ray_data.write(ds, sink=_pg(pg_target, "rd_drop"), load_mode="append")
    assert type(failed.value) is VerificationError  # the task's own error, not Ray's wrapper of it
    assert _rows(pg_target, "rd_drop") == 0


def test_merge_and_replace_from_a_dataset(ray_instance, pg_target) -> None:
    """The other load modes of the PostgreSQL sink: merge upserts by the target's key, replace swaps a new table in."""
    import ray

    pg_exec(pg_target, "DROP TABLE IF EXISTS rd_merge", "CREATE TABLE rd_merge (id bigint PRIMARY KEY, h text)",
            "INSERT INTO rd_merge SELECT g, 'old' FROM generate_series(1, 1000) g")
    ds = ray.data.range(1500).filter(lambda r: r["id"] >= 500).map_batches(
        lambda b: {"id": b["id"], "h": pa.array(["new"] * len(b["id"]))}, batch_format="pyarrow")
    report = ray_data.write(ds, sink=_pg(pg_target, "rd_merge"), load_mode="merge", min_bytes_per_write=1)
    assert report.verification.ok
    assert pg_exec(pg_target, "SELECT h, count(*) FROM rd_merge GROUP BY h ORDER BY h") == [("new", 1000), ("old", 499)]
    report = ray_data.write(ds, sink=_pg(pg_target, "rd_merge"), load_mode="replace")
    assert report.rows == 1000 and pg_exec(pg_target, "SELECT count(*), min(id) FROM rd_merge")[0] == (1000, 500)


def test_a_dataset_read_after_its_snapshot_was_closed_says_so(ray_instance, pg_source) -> None:
    _source(pg_source, "rd_closed", 1_000)
    with ray_data.reading(source=_pg(pg_source, "rd_closed"), strategy={"type": "ctid", "partitions": 2}) as ds:
        pass
    with pytest.raises(ConveyorError, match="the source's snapshot was closed when crd.reading's block ended") as failed:
        ds.count()
    assert "consume the Dataset inside" in failed.value.hint
