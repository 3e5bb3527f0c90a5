"""Iceberg (pyiceberg, its SQL catalog on a SQLite file) and Delta Lake (deltalake) as sinks and sources, on the
local filesystem and on the S3 test server (moto, with authentication), from the throwaway PostgreSQL server,
on the local runtime and on a real Ray instance. Nothing is mocked.

The contract suites (tests/connectors/test_suites.py) cover each load mode, merge, a resumed append, a Ctrl-C
mid-partition and a too narrow column; here: the type matrix written and read back by the library's own reader
and by DuckDB, refusals by name, a driver SIGKILLed mid-append then resumed (each partition once, the killed
task's files cleaned), a failed truncate leaving the previous snapshot current while readers poll, time travel,
S3, and an incremental merge.
"""

from __future__ import annotations

import datetime as dt
import decimal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import BIN, pg_exec, popen_run, runtime_args, wait_until

ROWS = 200_000


def _catalog_props(folder: Path, s3=None, cli: bool = False) -> dict[str, str]:
    """The catalog's properties; for the CLI, the S3 credentials as interpolations of the environment's (the s3
    fixture sets AWS_*): Conveyor refuses a secret written into a config."""
    props = {"type": "sql", "uri": f"sqlite:///{folder}/catalog.db",
             "warehouse": "s3://lake/warehouse" if s3 else f"file://{folder}/warehouse"}
    if s3:
        props.update({"s3.endpoint": s3.endpoint, "s3.region": "us-east-1",
                      "s3.access-key-id": "${oc.env:AWS_ACCESS_KEY_ID}" if cli else s3.access_key,
                      "s3.secret-access-key": "${oc.env:AWS_SECRET_ACCESS_KEY}" if cli else s3.secret_key})
    return props


def _catalog(folder: Path, s3=None) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("default", **_catalog_props(folder, s3))


def _hydra_dict(props: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}: '{v}'" for k, v in props.items()) + "}"


def _sink(fmt: str, folder: Path, name: str, s3=None) -> list[str]:
    if fmt == "iceberg":
        return ["sink=iceberg", f"sink.table=lake.{name}", f"+sink.catalog={_hydra_dict(_catalog_props(folder, s3, cli=True))}"]
    path = f"s3://lake/delta/{name}" if s3 else str(folder / "delta" / name)
    # (delta-rs takes the credentials and the endpoint from the environment's AWS_* variables)
    return ["sink=delta", f"sink.path={path}"] + (["+sink.storage_options={AWS_ALLOW_HTTP: 'true', AWS_REGION: us-east-1}"] if s3 else [])


def _source(fmt: str, folder: Path, name: str, s3=None) -> list[str]:
    return [a.replace("sink", "source", 1).replace("+sink.", "+source.").replace("sink.", "source.") for a in _sink(fmt, folder, name, s3)]


def _delta_storage(s3) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def _read(fmt: str, folder: Path, name: str, s3=None, **at: Any) -> pa.Table:
    """The table as the format's own library reads it."""
    if fmt == "iceberg":
        return _catalog(folder, s3).load_table(f"lake.{name}").scan(**at).to_arrow()
    from deltalake import DeltaTable

    path = f"s3://lake/delta/{name}" if s3 else str(folder / "delta" / name)
    return pa.table(DeltaTable(path, storage_options=_delta_storage(s3) if s3 else None, **at).to_pyarrow_table())


def _files(fmt: str, folder: Path, name: str) -> list[str]:
    """The data files the current snapshot / version refers to (for DuckDB's reader)."""
    if fmt == "iceberg":
        return [t.file.file_path.removeprefix("file://") for t in _catalog(folder).load_table(f"lake.{name}").scan().plan_files()]
    from deltalake import DeltaTable

    return [u.removeprefix("file://") for u in DeltaTable(str(folder / "delta" / name)).file_uris()]


def _pg(pg_source, table: str) -> list[str]:
    return ["source=postgres", f"source.port={pg_source.port}", f"source.table={table}"]


# --- types -------------------------------------------------------------------------------------------

_TYPES = """CREATE TABLE lake_types (id int8 PRIMARY KEY, i2 int2, i4 int4, f4 float4, f8 float8, n1 numeric(15,2),
  n2 numeric(38,10), t text, b bytea, d date, ts timestamp(6), tz timestamptz(6), ai int4[], ok bool {extra})"""
_ROWS = [
    "(1, -32768, -2147483648, 1.5, 'NaN', 9999999999999.99, 1234567890123456789012345678.0123456789, 'é😀 tab\\there', "
    "'\\x00ff41', '0001-01-01', '1900-01-01 00:00:00.000001', '2262-04-11 23:47:16.854775+00', '{1,NULL,3}', true {x1})",
    "(2, 32767, 2147483647, '-Infinity', 1e-300, -0.01, -1, '', '\\x', '9999-12-31', '1970-01-01 00:00:00', "
    "'1969-12-31 23:59:59.999999+00', '{}', false {x2})",
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL {x3})",
    "(9223372036854775807, 0, 0, 0, 0.1, 0, 0.0000000001, 'x', '\\x00', '2024-02-29', '2024-02-29 23:59:59.5', "
    "'2024-02-29 23:59:59.123456+05', '{2147483647}', true {x4})",
]
_ICEBERG_EXTRA = (", u uuid, tm time(6)", ", '01234567-89ab-cdef-0123-456789abcdef', '23:59:59.999999'",
                  ", 'ffffffff-ffff-ffff-ffff-ffffffffffff', '00:00:00'", ", NULL, NULL",
                  ", '00000000-0000-0000-0000-000000000001', '12:00:00.5'")


def _make_types(pg_source, fmt: str) -> str:
    table = f"lake_types_{fmt}"
    extra = _ICEBERG_EXTRA if fmt == "iceberg" else ("", "", "", "", "")
    rows = [r.replace(f" {{x{i + 1}}}", extra[i + 1]) for i, r in enumerate(_ROWS)]
    pg_exec(pg_source, f"DROP TABLE IF EXISTS {table}", _TYPES.replace("lake_types", table).replace(" {extra}", extra[0]),
            f"INSERT INTO {table} VALUES {', '.join(rows)}")
    return table


def _normal(table: pa.Table) -> dict[str, list]:
    """Each column's values as Python values, in id order; zone-aware times as UTC instants."""
    table = table.sort_by("id")
    out = {}
    for name in table.column_names:
        values = table.column(name).to_pylist()
        if pa.types.is_timestamp(table.schema.field(name).type) and table.schema.field(name).type.tz:
            values = [None if v is None else v.astimezone(dt.timezone.utc) for v in values]
        out[name] = [("nan" if isinstance(v, float) and v != v else str(v) if isinstance(v, uuid.UUID) else v) for v in values]
    return out


@pytest.mark.parametrize("fmt,kind", [("iceberg", "local"), ("iceberg", "ray"), ("delta", "local"), ("delta", "ray")])
def test_the_type_matrix_travels_postgres_to_the_lake_and_back_exactly(pg_source, cli, tmp_path: Path, fmt: str, kind: str,
                                                                       request) -> None:
    table = _make_types(pg_source, fmt)
    runtime = runtime_args(kind, request)
    res = cli("run", *_pg(pg_source, table), *_sink(fmt, tmp_path, "types"), "load_mode=create", "strategy=ctid", "degree=2", *runtime)
    assert res.code == 0, res.err
    ref = tmp_path / "ref"
    res = cli("run", *_pg(pg_source, table), "sink=parquet", f"sink.path={ref}", "strategy=none", "load_mode=replace")
    assert res.code == 0, res.err
    want = _normal(pq.read_table(ref))
    # the library's own reader, DuckDB over the snapshot's data files, and Conveyor's source: every value as PostgreSQL had it
    assert _normal(_read(fmt, tmp_path, "types")) == want
    assert _normal(duckdb.sql(f"SELECT * FROM read_parquet({_files(fmt, tmp_path, 'types')})").to_arrow_table()) == want
    back = tmp_path / "back"
    res = cli("run", *_source(fmt, tmp_path, "types"), "strategy=files", "sink=parquet", f"sink.path={back}", "load_mode=replace",
              "degree=2", *runtime)
    assert res.code == 0, res.err
    assert _normal(pq.read_table(back)) == want
    got = pq.read_table(back)
    assert got.schema.field("n2").type == pa.decimal128(38, 10) and got.schema.field("tz").type == pa.timestamp("us", "UTC")
    assert got.schema.field("ts").type == pa.timestamp("us") and got.schema.field("ai").type.value_type == pa.int32()
    if fmt == "iceberg":
        assert got.schema.field("u").type == pa.uuid() and got.schema.field("tm").type == pa.time64("us")
        assert want["n2"][0] == decimal.Decimal("1234567890123456789012345678.0123456789")


@pytest.mark.parametrize("fmt,column,why", [
    ("delta", "u uuid", "Delta Lake has no UUID type"),
    ("delta", "tm time", "Delta Lake has no time-of-day type"),
    ("iceberg", "big numeric(40,0)", "at most 38 digits"),
])
def test_a_type_the_format_cannot_hold_is_refused_by_its_column_before_a_row_moves(pg_source, cli, tmp_path: Path, fmt: str,
                                                                                    column: str, why: str) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS lake_refused", f"CREATE TABLE lake_refused (id int8, {column})",
            "INSERT INTO lake_refused (id) VALUES (1)")
    res = cli("run", *_pg(pg_source, "lake_refused"), *_sink(fmt, tmp_path, "refused"), "load_mode=create", "strategy=none")
    assert res.code != 0
    assert f"column {column.split()[0]} " in res.err and why in res.err and "Traceback" not in res.err
    if fmt == "iceberg":
        cat = _catalog(tmp_path)
        assert not cat.namespace_exists("lake") or not cat.list_tables("lake")
    else:
        assert not (tmp_path / "delta" / "refused" / "_delta_log").exists()


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
@pytest.mark.parametrize("column,value", [("d date", "'0044-03-15 BC'"), ("ts timestamp", "'10000-01-01 00:00:00'")])
def test_a_date_before_year_1_or_after_9999_is_refused_by_its_column(pg_source, cli, tmp_path: Path, fmt: str, column: str,
                                                                     value: str) -> None:
    """deltalake failed with "Invalid isoformat string: '-0044-03-15'" (an internal error), pyiceberg with exit 5 naming no
    column: both keep each file's lowest and highest value as Python dates, years 1 to 9999."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS lake_years", f"CREATE TABLE lake_years (id int8, {column})",
            f"INSERT INTO lake_years VALUES (1, {value}), (2, NULL)")
    res = cli("run", *_pg(pg_source, "lake_years"), *_sink(fmt, tmp_path, "years"), "load_mode=create", "strategy=none")
    assert res.code != 0 and "Traceback" not in res.err and "internal error" not in res.err, res.err
    assert f"column {column.split()[0]} " in res.err and "before year 1 or after year 9999" in res.err, res.err


def test_nanoseconds_and_uint64_are_refused_by_name(cli, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "ns": pa.array([1], pa.timestamp("ns"))}), src / "a.parquet")
    res = cli("run", "source=parquet", f"source.path={src}", *_sink("iceberg", tmp_path, "ns"), "load_mode=create")
    assert res.code != 0 and "column ns" in res.err and "nanoseconds would be cut" in res.err
    pq.write_table(pa.table({"id": pa.array([2**64 - 1], pa.uint64())}), src / "a.parquet")
    res = cli("run", "source=parquet", f"source.path={src}", *_sink("delta", tmp_path, "u64"), "load_mode=create")
    assert res.code != 0 and "column id" in res.err and "unsigned 64-bit" in res.err


# --- exactly once -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eo(pg_source):
    """A 200,000-row PostgreSQL table (id, grp, h = md5(id)) for the exactly-once tests."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS lake_eo",
            "CREATE TABLE lake_eo (id int8 PRIMARY KEY, grp int4 NOT NULL, h text NOT NULL)",
            f"INSERT INTO lake_eo SELECT n, n % 1000, md5(n::text) FROM generate_series(1, {ROWS}) n")
    return pg_source


def _exact(table: pa.Table, rows: int = ROWS) -> None:
    ids = table.column("id")
    assert table.num_rows == rows
    assert len(ids.unique()) == rows and ids.to_pylist() and sum(ids.to_pylist()) == rows * (rows + 1) // 2


def _markers(fmt: str, folder: Path, name: str) -> list[str]:
    """The partitions this table's commits name (one per committed partition, whatever the load)."""
    if fmt == "iceberg":
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = _catalog(folder).load_table(f"lake.{name}")
        except NoSuchTableError:
            return []
        return [s.summary.additional_properties["conveyor.partition"] for s in table.metadata.snapshots
                if s.summary and "conveyor.partition" in s.summary.additional_properties]
    from deltalake import DeltaTable

    path = folder / "delta" / name
    if not (path / "_delta_log").exists():
        return []
    return [h["conveyor.partition"] for h in reversed(DeltaTable(str(path)).history()) if "conveyor.partition" in h]  # oldest first


def _create_empty(fmt: str, folder: Path, name: str, pg_source, cli) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS lake_empty", "CREATE TABLE lake_empty (LIKE lake_eo)")
    res = cli("run", *_pg(pg_source, "lake_empty"), *_sink(fmt, folder, name), "load_mode=create", "strategy=none")
    assert res.code == 0, res.err


# each format once and each runtime once (the kill is the driver's, the commit the format's: every pair ran here and
# passed; four cost ~3.5 minutes of the suite)
@pytest.mark.parametrize("fmt,kind", [("iceberg", "local"), ("delta", "ray")])
def test_a_driver_killed_mid_append_then_resumed_commits_each_partition_once(eo, cli, tmp_path: Path, fmt: str, kind: str,
                                                                             request) -> None:
    _create_empty(fmt, tmp_path, "killed", eo, cli)
    args = ["run", *_pg(eo, "lake_eo"), *_sink(fmt, tmp_path, "killed"), "load_mode=append", "strategy=ctid",
            "strategy.partitions=40", "degree=2", "batch_size=1000", *runtime_args(kind, request)]
    base = len(_markers(fmt, tmp_path, "killed"))  # (the create's own)
    proc = popen_run(args, tmp_path, "first")
    wait_until(lambda: len(_markers(fmt, tmp_path, "killed")) > base, "a committed partition", 120)
    proc.kill()  # no handler, no report, no manifest update; its tasks may still commit (they are exactly-once too)
    proc.communicate(timeout=30)
    time.sleep(3)
    assert len(_markers(fmt, tmp_path, "killed")) < base + 40, "the run ended before the kill: it tests nothing"
    res = subprocess.run([str(BIN / "conveyor"), *args, f"resume={tmp_path}/first", f"hydra.run.dir={tmp_path}/second"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "resume:" in res.stderr
    marks = _markers(fmt, tmp_path, "killed")[base:]
    assert len(marks) == len(set(marks)) == 40  # each partition committed once, over both runs
    got = _read(fmt, tmp_path, "killed")
    _exact(got)
    assert duckdb.sql("SELECT count(*) FROM got WHERE grp <> id % 1000 OR h <> md5(id::varchar)").fetchone()[0] == 0
    # what a killed task wrote and never committed is listed, then removed once the killed driver's beat is stale (one
    # such file is made here for certain: a copy of a committed one under a name no snapshot or version refers to)
    import shutil

    committed = Path(_files(fmt, tmp_path, "killed")[0])
    shutil.copy(committed, committed.with_name(f"{'part-00000-' if fmt == 'delta' else ''}planted-orphan.parquet"))
    clean = ["clean", *args[1:]]
    res = cli(*clean)
    assert res.code == 0, res.err
    assert "planted-orphan.parquet" in res.out + res.err
    from conveyor.connectors.lake.common import STALE

    time.sleep(STALE + 1)
    res = cli(*clean, "--drop")
    assert res.code == 0, res.err
    res = cli(*clean)
    assert "data file" not in res.out + res.err and not list(committed.parent.glob("*planted-orphan*"))
    _exact(_read(fmt, tmp_path, "killed"))  # every file a snapshot refers to is still there


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_failed_truncate_leaves_the_previous_snapshot_current_and_readers_never_see_half(eo, cli, tmp_path: Path, fmt: str) -> None:
    """The target's id is int32; the source's ids above 2**31 are in the last partition only (allow_cast lets the plan
    through): that partition fails mid-load, after others have staged. Meanwhile a reader polls the table."""
    pg_exec(eo, "DROP TABLE IF EXISTS lake_late", "CREATE TABLE lake_late AS SELECT id::int8, grp, h FROM lake_eo",
            "UPDATE lake_late SET id = id + 3000000000 WHERE id > 190000")
    old = pa.table({"id": pa.array([-1, -2], pa.int32()), "grp": pa.array([0, 0], pa.int32()), "h": ["old", "old"]})
    if fmt == "iceberg":
        cat = _catalog(tmp_path)
        cat.create_namespace_if_not_exists("lake")
        cat.create_table("lake.late", schema=old.schema).append(old)
        before = cat.load_table("lake.late").current_snapshot().snapshot_id
    else:
        from deltalake import write_deltalake

        write_deltalake(str(tmp_path / "delta" / "late"), old)
    seen: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set() and len(seen) < 10_000:
            seen.append(_read(fmt, tmp_path, "late").num_rows)
            time.sleep(0.02)

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        res = cli("run", *_pg(eo, "lake_late"), *_sink(fmt, tmp_path, "late"), "load_mode=truncate", "strategy=rangeid",
                  "strategy.distribute_key=id", "strategy.partitions=8", "degree=1", "sink.allow_cast=[id]", "runtime=local")
    finally:
        stop.set()
        reader.join(timeout=30)
    assert res.code != 0 and "column id" in res.err
    assert seen and set(seen) == {2}  # every read saw the old content whole
    assert sorted(_read(fmt, tmp_path, "late").column("id").to_pylist()) == [-2, -1]
    if fmt == "iceberg":
        table = _catalog(tmp_path).load_table("lake.late")
        assert table.current_snapshot().snapshot_id == before and list(table.metadata.refs) == ["main"]
    else:
        assert not [p for p in (tmp_path / "delta" / "late").iterdir() if p.name.startswith("conveyor-stage-")]


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_truncate_is_seen_whole_or_not_at_all_and_time_travel_reads_the_earlier_one(eo, cli, tmp_path: Path, fmt: str) -> None:
    res = cli("run", *_pg(eo, "lake_eo"), *_sink(fmt, tmp_path, "tt"), "load_mode=create", "source.query='SELECT * FROM lake_eo WHERE id <= 1000'", "strategy=none",
              "source.table=null")
    assert res.code == 0, res.err
    first = (_catalog(tmp_path).load_table("lake.tt").current_snapshot().snapshot_id if fmt == "iceberg" else 0)
    seen: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set() and len(seen) < 10_000:
            seen.append(_read(fmt, tmp_path, "tt").num_rows)
            time.sleep(0.02)

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        res = cli("run", *_pg(eo, "lake_eo"), *_sink(fmt, tmp_path, "tt"), "load_mode=truncate", "strategy=ctid",
                  "strategy.partitions=10", "degree=2", "runtime=local")
    finally:
        stop.set()
        reader.join(timeout=30)
    assert res.code == 0, res.err
    assert seen and set(seen) <= {1000, ROWS}
    _exact(_read(fmt, tmp_path, "tt"))
    at = {"snapshot_id": first} if fmt == "iceberg" else {"version": 0}
    assert _read(fmt, tmp_path, "tt", **at).num_rows == 1000  # the library's time travel
    out = tmp_path / "earlier"
    res = cli("run", *_source(fmt, tmp_path, "tt"), f"source.{'snapshot_id' if fmt == 'iceberg' else 'version'}={first}",
              "strategy=files", "sink=parquet", f"sink.path={out}", "load_mode=replace")
    assert res.code == 0, res.err
    _exact(pq.read_table(out), 1000)


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_on_s3_an_append_twice_and_a_parallel_read_back(eo, s3, cli, tmp_path: Path, fmt: str, request) -> None:
    import contextlib

    with contextlib.suppress(Exception):
        s3.client().create_bucket(Bucket="lake")
    name = f"s3_{fmt}"
    args = ["run", *_pg(eo, "lake_eo"), *_sink(fmt, tmp_path, name, s3), "strategy=rangeid", "strategy.distribute_key=id", "strategy.partitions=4", "degree=2"]
    res = cli(*args, "load_mode=create", "source.query='SELECT * FROM lake_eo WHERE id <= 100000'", "source.table=null")
    assert res.code == 0, res.err
    res = cli(*args, "load_mode=append", "source.query='SELECT * FROM lake_eo WHERE id > 100000'", "source.table=null")
    assert res.code == 0, res.err
    _exact(_read(fmt, tmp_path, name, s3))
    out = tmp_path / "back"
    res = cli("run", *_source(fmt, tmp_path, name, s3), "strategy=files", "degree=2", "sink=parquet", f"sink.path={out}",
              "load_mode=replace", *runtime_args("ray", request),
              # the Ray instance may have started before the S3 server: its workers get the credentials from the driver
              # (delta-rs reads them from the environment)
              "runtime.forward_env=[AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY,AWS_ENDPOINT_URL,AWS_DEFAULT_REGION]")
    assert res.code == 0, res.err
    _exact(pq.read_table(out))
    assert s3.secret_key not in res.out + res.err


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_an_incremental_merge_moves_only_new_and_changed_rows(pg_source, cli, tmp_path: Path, fmt: str) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS lake_inc",
            "CREATE TABLE lake_inc (id int8 PRIMARY KEY, updated_at timestamptz NOT NULL, v text)",
            "INSERT INTO lake_inc SELECT g, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second', 'a' FROM generate_series(1, 1000) g")
    args = ["run", *_pg(pg_source, "lake_inc"), *_sink(fmt, tmp_path, "inc"), "incremental.cursor=updated_at", "strategy=rangeid",
            "strategy.distribute_key=id", "strategy.partitions=3", "sink.merge_keys=[id]"]
    res = cli("run", *_pg(pg_source, "lake_inc"), *_sink(fmt, tmp_path, "inc"), "load_mode=create", "strategy=none",
              "source.query='SELECT * FROM lake_inc WHERE false'", "source.table=null")
    assert res.code == 0, res.err
    res = cli(*args, "load_mode=merge")
    assert res.code == 0, res.err
    assert _read(fmt, tmp_path, "inc").num_rows == 1000
    pg_exec(pg_source, "UPDATE lake_inc SET v = 'b', updated_at = updated_at + interval '1 day' WHERE id <= 10",
            "INSERT INTO lake_inc SELECT g, timestamptz '2026-01-03 00:00:00+00' + g * interval '1 second', 'c' FROM generate_series(1001, 1005) g")
    res = cli(*args, "load_mode=merge")
    assert res.code == 0, res.err
    assert "updated_at > 2026-01-01 00:16:40" in res.err + res.out  # the second run's window: only what changed since
    log = (tmp_path / "hydra-run" / "conveyor.log").read_text()
    assert "merge: 5 rows inserted, 10 updated" in log
    got = _read(fmt, tmp_path, "inc").sort_by("id")
    assert got.num_rows == 1005 and len(got.column("id").unique()) == 1005
    assert got.column("v").to_pylist()[:11] == ["b"] * 10 + ["a"] and got.column("v").to_pylist()[-5:] == ["c"] * 5


# --- a sync job (incremental.method=replication) into each format ---------------------------------------


@pytest.fixture
def sync_src(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS lake_sy", "CREATE TABLE lake_sy (id int8 PRIMARY KEY, a text, n numeric(20, 2), d date, "
                       "ts timestamptz)",
            "INSERT INTO lake_sy SELECT g, 'a' || g, g / 3.0, date '2020-01-01' + g, timestamptz '2026-01-01 00:00:00+00' + g * "
            "interval '1 second' FROM generate_series(1, 5000) g")
    yield pg_source
    pg_exec(pg_source, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'conveyor%' AND NOT active")
    for (pub,) in pg_exec(pg_source, "SELECT pubname FROM pg_publication WHERE pubname LIKE 'conveyor%'"):
        pg_exec(pg_source, f'DROP PUBLICATION "{pub}"')


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_sync_applies_updates_deletes_and_inserts_in_one_commit_each_run(sync_src, cli, tmp_path: Path, fmt: str) -> None:
    import json

    args = ["run", *_pg(sync_src, "lake_sy"), *_sink(fmt, tmp_path, "sy"), "load_mode=replace", "incremental.method=replication",
            "strategy=none"]

    def synced(name: str) -> dict:
        report = tmp_path / f"{name}.json"
        res = cli("--report", str(report), *args, f"hydra.run.dir={tmp_path}/{name}")
        assert res.code == 0, res.err
        return json.loads(report.read_text())

    def same() -> None:
        want = pg_exec(sync_src, "SELECT id, a, n, d FROM lake_sy ORDER BY id")
        got = _read(fmt, tmp_path, "sy").sort_by("id")
        assert list(zip(*(got.column(c).to_pylist() for c in ("id", "a", "n", "d")))) == [tuple(r) for r in want]

    synced("first")
    same()
    pg_exec(sync_src, "UPDATE lake_sy SET a = a || 'u' WHERE id % 3 = 0", "UPDATE lake_sy SET id = 100000 WHERE id = 7",
            "DELETE FROM lake_sy WHERE id % 5 = 0",
            "INSERT INTO lake_sy SELECT g, 'new', 1, '2030-01-01', now() FROM generate_series(6000, 6100) g")
    second = synced("second")
    applied = second["sync"]["runs"][0]["tables"]["public.lake_sy"]
    assert applied["deleted"] == 1001  # 1,000 deleted, and the key 7 moved to 100000
    same()
    synced("third")  # nothing changed: the position alone moves
    same()


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_sync_of_a_composite_key_applies_5000_changed_keys(pg_source, cli, tmp_path: Path, fmt: str) -> None:
    """A two-column key, 5,000 keys changed in one run (updates, deletes, inserts): one commit, the table exact (Iceberg's
    delete filter is a balanced tree of the keys, not one OR per key)."""
    import json

    pg_exec(pg_source, "DROP TABLE IF EXISTS lake_ck", "CREATE TABLE lake_ck (k text, n int, v text, PRIMARY KEY (k, n))",
            "INSERT INTO lake_ck SELECT 'k' || (g % 7), g, md5(g::text) FROM generate_series(1, 20000) g")
    try:
        args = ["run", *_pg(pg_source, "lake_ck"), *_sink(fmt, tmp_path, "ck"), "load_mode=replace", "incremental.method=replication",
                "strategy=none"]
        res = cli(*args, f"hydra.run.dir={tmp_path}/first")
        assert res.code == 0, res.err
        pg_exec(pg_source, "UPDATE lake_ck SET v = 'u' WHERE n <= 4000", "DELETE FROM lake_ck WHERE n BETWEEN 4001 AND 4900",
                "INSERT INTO lake_ck SELECT 'new', g, 'n' FROM generate_series(1, 100) g")
        report = tmp_path / "second.json"
        res = cli("--report", str(report), *args, f"hydra.run.dir={tmp_path}/second", timeout=600)
        assert res.code == 0, res.err
        applied = json.loads(report.read_text())["sync"]["runs"][0]["tables"]["public.lake_ck"]
        assert (applied["keys"], applied["deleted"]) == (5000, 900)
        want = pg_exec(pg_source, "SELECT k, n, v FROM lake_ck ORDER BY k, n")
        got = _read(fmt, tmp_path, "ck").sort_by([("k", "ascending"), ("n", "ascending")])
        assert list(zip(*(got.column(c).to_pylist() for c in ("k", "n", "v")))) == [tuple(r) for r in want]
    finally:
        pg_exec(pg_source, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'conveyor%' AND NOT active")
        for (pub,) in pg_exec(pg_source, "SELECT pubname FROM pg_publication WHERE pubname LIKE 'conveyor%'"):
            pg_exec(pg_source, f'DROP PUBLICATION "{pub}"')


def _three_files(fmt: str, folder: Path, name: str, rows: pa.Table) -> None:
    """An Iceberg or Delta table ``name`` of ``rows`` in three data files, a third of the rows each, in id order."""
    third = rows.num_rows // 3
    if fmt == "iceberg":
        cat = _catalog(folder)
        cat.create_namespace_if_not_exists("lake")
        made = cat.create_table(f"lake.{name}", schema=rows.schema)
        for i in range(3):
            made.append(rows.slice(i * third, third))
    else:
        from deltalake import write_deltalake

        for i in range(3):
            write_deltalake(str(folder / "delta" / name), rows.slice(i * third, third), mode="append")


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_filter_and_columns_are_pushed_down_to_the_files(cli, tmp_path: Path, fmt: str) -> None:
    """Three data files of disjoint id ranges: a filter that only the first can match plans one partition (the other
    files are not read), and only the named columns come out."""
    rows = pa.table({"id": pa.array(range(3000), pa.int64()), "name": [f"n{i}" for i in range(3000)], "x": [float(i) for i in range(3000)]})
    _three_files(fmt, tmp_path, "pushed", rows)
    where = ["source.row_filter='id < 100'"] if fmt == "iceberg" else ["source.filters=[[id, '<', 100]]"]
    out = tmp_path / "out"
    res = cli("run", *_source(fmt, tmp_path, "pushed"), *where, "source.columns=[id, x]", "strategy=files", "sink=parquet",
              f"sink.path={out}", "load_mode=replace")
    assert res.code == 0, res.err
    import json

    report = json.loads((tmp_path / "hydra-run" / "report.json").read_text())
    assert len(report["partitions"]) == 1  # the other two files were ruled out by their statistics: not read
    got = pq.read_table(out)
    assert got.column_names == ["id", "x"] and sorted(got.column("id").to_pylist()) == list(range(100))


@pytest.mark.parametrize("fmt,spec", [("iceberg", "['day(d)', 'bucket(4, id)']"), ("delta", "[d]")])
def test_a_partitioned_table_is_created_and_appended_to_exactly(eo, cli, tmp_path: Path, fmt: str, spec: str) -> None:
    query = "SELECT id, grp, h, date '2020-01-01' + (id % 3)::int AS d FROM lake_eo WHERE id {} 100000"
    args = ["run", *_pg(eo, "lake_eo"), *_sink(fmt, tmp_path, "parted"), "source.table=null", "strategy=rangeid",
            "strategy.distribute_key=id", "strategy.partitions=3", "degree=2"]
    res = cli(*args, f'source.query="{query.format("<=")}"', "load_mode=create", f"sink.partition_by={spec}")
    assert res.code == 0, res.err
    res = cli(*args, f'source.query="{query.format(">")}"', "load_mode=append")
    assert res.code == 0, res.err
    got = _read(fmt, tmp_path, "parted")
    _exact(got)
    assert duckdb.sql("SELECT count(*) FROM got WHERE d <> date '2020-01-01' + (id % 3)::int OR h <> md5(id::varchar)").fetchone()[0] == 0
    if fmt == "iceberg":
        table = _catalog(tmp_path).load_table("lake.parted")
        assert [f.name for f in table.spec().fields] == ["d_day", "id_bucket"]
        assert {t.file.partition[0] for t in table.scan().plan_files()} == {18262, 18263, 18264}  # days since 1970 of the 3 dates
    else:
        from deltalake import DeltaTable

        table = DeltaTable(str(tmp_path / "delta" / "parted"))
        assert table.metadata().partition_columns == ["d"]
        assert {p["d"] for p in table.partitions()} == {"2020-01-01", "2020-01-02", "2020-01-03"}


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_small_table_is_read_in_the_driver_under_runtime_auto(cli, tmp_path: Path, fmt: str) -> None:
    """The source says its files' bytes: runtime=auto (the default) reads a small table of several files in the driver's
    threads, as it does a small folder of Parquet files (it started a private Ray instance: 10.6 s for a 2.7 s read)."""
    import json

    _three_files(fmt, tmp_path, "small", pa.table({"id": pa.array(range(3000), pa.int64()), "x": [float(i) for i in range(3000)]}))
    res = cli("run", *_source(fmt, tmp_path, "small"), "runtime=auto", "degree=2", "sink=parquet", f"sink.path={tmp_path}/out",
              "load_mode=replace")
    assert res.code == 0, res.err
    report = json.loads((tmp_path / "hydra-run" / "report.json").read_text())
    assert len(report["partitions"]) == 3 and "ran in the driver process" in report["runtime_note"]
    assert report["totals"]["runtime_startup_seconds"] == 0 and pq.read_table(f"{tmp_path}/out").num_rows == 3000
