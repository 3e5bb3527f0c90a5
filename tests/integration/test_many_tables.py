"""Jobs over several tables (``source.tables``), against real PostgreSQL servers, DuckDB and Parquet files.

On the main this work started from a source named one table or one query: ``source.tables`` was
an unknown key, so every test here fails there.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.errors import ConfigError, SchemaError
from conveyor.pipelines.job import run_job
from tests.helpers import checksum, ctrl_c_run, pg_exec, run_cli, runtime_args, wait_quiet, wait_until

TABLES = ("region", "nation", "customer", "orders", "lineitem")
SCHEMA = """
DROP SCHEMA IF EXISTS mt CASCADE; CREATE SCHEMA mt;
CREATE TABLE mt.region (r_id int PRIMARY KEY, r_name text);
CREATE TABLE mt.nation (n_id int PRIMARY KEY, n_region int REFERENCES mt.region, n_name text);
CREATE TABLE mt.customer (c_id int PRIMARY KEY, c_nation int REFERENCES mt.nation, c_name text);
CREATE TABLE mt.orders (o_id int PRIMARY KEY, o_customer int REFERENCES mt.customer, o_total numeric(12,2), o_date date);
CREATE TABLE mt.lineitem (l_order int REFERENCES mt.orders ON DELETE CASCADE, l_line int, l_qty int, l_note text,
                          PRIMARY KEY (l_order, l_line));
INSERT INTO mt.region SELECT g, 'region ' || g FROM generate_series(1, 5) g;
INSERT INTO mt.nation SELECT g, 1 + g % 5, 'nation ' || g FROM generate_series(1, 25) g;
INSERT INTO mt.customer SELECT g, 1 + g % 25, md5(g::text) FROM generate_series(1, 20000) g;
INSERT INTO mt.orders SELECT g, 1 + g % 20000, (g % 100000) / 100.0, DATE '2020-01-01' + g % 1000 FROM generate_series(1, 60000) g;
INSERT INTO mt.lineitem SELECT o, l, (o * l) % 50, md5((o * 7 + l)::text) FROM generate_series(1, 60000) o, generate_series(1, 4) l;
ANALYZE;
"""


@pytest.fixture(scope="module")
def mt(pg_source):
    pg_exec(pg_source, SCHEMA)
    return pg_source


def _spec(source: dict, sink: dict, **options):
    cfg = OmegaConf.create({"source": source, "sink": sink, "strategy": {"type": "auto"},
                            "runtime": {"type": "local", "max_retries": 0}, **options})
    return build_job(cfg)


def _src(server, **kw) -> dict:
    return {"type": "postgres", "port": server.port, "tables": ["mt.*"], **kw}


def _fresh_schema(server, name: str) -> None:
    pg_exec(server, f"DROP SCHEMA IF EXISTS {name} CASCADE", f"CREATE SCHEMA {name}")


def _empty_targets(server, schema: str, orders_check: str = "") -> None:
    """The five tables' targets, made by hand (no keys) in a fresh schema, for an append."""
    _fresh_schema(server, schema)
    pg_exec(server, f"CREATE TABLE {schema}.region (r_id int, r_name text)", f"CREATE TABLE {schema}.nation (n_id int, n_region int, n_name text)",
            f"CREATE TABLE {schema}.customer (c_id int, c_nation int, c_name text)",
            f"CREATE TABLE {schema}.orders (o_id int {orders_check}, o_customer int, o_total numeric(12,2), o_date date)",
            f"CREATE TABLE {schema}.lineitem (l_order int, l_line int, l_qty int, l_note text)")


def test_a_schema_is_copied_in_one_snapshot_while_the_source_is_written(mt, pg_target) -> None:
    """Five tables with foreign keys, copied at degree 2 while new orders arrive and old ones are
    deleted (with their lines): every table is the source as of the job's start, and the target's
    foreign keys hold (without one snapshot, the lines of deleted orders would be read later than
    the orders, or the other way round)."""
    before = {t: checksum(mt, f"mt.{t}") for t in TABLES}
    _fresh_schema(pg_target, "mt_copy")
    spec = _spec(_src(mt), {"type": "postgres", "port": pg_target.port, "schema": "mt_copy", "copy_path": "arrow", "foreign_keys": True},
                 load_mode="create", degree=2, batch_size=2000)
    out: dict = {}
    job = threading.Thread(target=lambda: out.update(report=run_job(spec)), daemon=True)
    job.start()
    wait_until(lambda: pg_exec(pg_target, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'conveyor' "
                                          "AND query ILIKE 'COPY%'")[0][0], "a COPY into the target")
    pg_exec(mt, "BEGIN", "INSERT INTO mt.orders SELECT g, 1, 1.00, DATE '2024-01-01' FROM generate_series(100001, 100500) g",
            "INSERT INTO mt.lineitem SELECT g, 1, 1, 'new' FROM generate_series(100001, 100500) g",
            "DELETE FROM mt.orders WHERE o_id % 97 = 0", "UPDATE mt.customer SET c_name = 'changed' WHERE c_id % 13 = 0", "COMMIT")
    job.join(180)
    assert not job.is_alive()
    report = out["report"]
    assert [t.target.split(" ")[-1] for t in report.tables][:1] == ["mt_copy.lineitem"]  # the largest table first
    for t in TABLES:
        assert checksum(pg_target, f"mt_copy.{t}") == before[t], t
    assert checksum(mt, "mt.orders") != before["orders"]  # the source did change during the copy
    # create made the source's primary keys, then (sink.foreign_keys) its foreign keys, which checked every row: consistent
    keys = pg_exec(pg_target, "SELECT conrelid::regclass::text, contype, pg_get_constraintdef(oid) FROM pg_constraint "
                              "WHERE connamespace = 'mt_copy'::regnamespace AND conrelid::regclass::text NOT LIKE '%\\_conveyor\\_%' "
                              "ORDER BY 1, 2, 3")
    assert keys == pg_exec(mt, "SELECT replace(conrelid::regclass::text, 'mt.', 'mt_copy.'), contype, "
                               "replace(pg_get_constraintdef(oid), 'mt.', 'mt_copy.') FROM pg_constraint "
                               "WHERE connamespace = 'mt'::regnamespace ORDER BY 1, 2, 3")
    assert report.rows == sum(n for n, _ in before.values()) and report.verification.ok


@pytest.mark.parametrize("sink,runtime", [("parquet", "local"), ("parquet", "ray"), ("duckdb", "local")])
def test_a_schema_to_parquet_folders_and_duckdb_tables(mt, tmp_path: Path, sink: str, runtime: str, request) -> None:
    """A folder per table (the tasks of every table in one pool: threads, or a real Ray instance's
    workers), or a DuckDB table per table."""
    import duckdb

    if runtime == "ray":
        request.getfixturevalue("ray_instance")
    if sink == "parquet":
        node = {"type": "parquet", "path": str(tmp_path / "out")}
    else:
        node = {"type": "duckdb", "database": str(tmp_path / "mt.duckdb")}
    spec = build_job(OmegaConf.create({"source": _src(mt, exclude=["mt.region"]), "sink": node, "strategy": {"type": "auto"},
                                       "runtime": {"type": runtime, "max_retries": 0}, "load_mode": "create", "degree": 2}))
    report = run_job(spec)
    assert len(report.tables) == 4
    con = duckdb.connect(str(tmp_path / "mt.duckdb") if sink == "duckdb" else ":memory:")
    for t in TABLES[1:]:
        rel = f"read_parquet('{tmp_path / 'out' / t}/*.parquet')" if sink == "parquet" else t
        n, distinct = con.execute(f"SELECT count(*), count(DISTINCT t) FROM {rel} AS t").fetchone()  # rows, distinct rows
        assert (n, distinct) == (pg_exec(mt, f"SELECT count(*) FROM mt.{t}")[0][0],) * 2, t
    assert not (tmp_path / "out" / "region").exists()
    line = con.execute("SELECT sum(l_qty), count(DISTINCT l_note) FROM " + (
        f"read_parquet('{tmp_path / 'out' / 'lineitem'}/*.parquet')" if sink == "parquet" else "lineitem")).fetchone()
    assert line == tuple(pg_exec(mt, "SELECT sum(l_qty), count(DISTINCT l_note) FROM mt.lineitem")[0])


def test_a_failed_table_is_resumed_across_tables_exactly(mt, pg_target, cli, tmp_path: Path) -> None:
    """An append over five tables where one target refuses a row: the run fails naming the table
    and its partition, leaves whole partitions, and the resume (after the fix) loads exactly the rest."""
    pg_exec(mt, SCHEMA)  # the source as built (the test above wrote to it)
    _empty_targets(pg_target, "mt_app", orders_check="CHECK (o_id <> 45678)")
    args = ["run", "pipeline=pg_to_pg", f"source.port={mt.port}", "source.tables=[mt.*]", f"sink.port={pg_target.port}",
            "sink.schema=mt_app", "sink.table='{table}'", "load_mode=append", "runtime=local", "degree=2", "strategy=auto"]
    first = cli(*args)
    assert first.code == 5, first.err
    assert "writing mt.orders/ctid-" in first.err and "orders_o_id_check" in first.err, first.err
    assert "partitions had committed" in first.err and "resume=" in first.err
    report = json.loads((tmp_path / "hydra-run" / "report.json").read_text())
    assert {t["table"] for t in report["tables"]} == {f"mt.{t}" for t in TABLES}
    committed = sum(p["rows"] for p in report["partitions"] if p["error"] is None)
    assert sum(pg_exec(pg_target, f"SELECT count(*) FROM mt_app.{t}")[0][0] for t in TABLES) == committed
    pg_exec(pg_target, "ALTER TABLE mt_app.orders DROP CONSTRAINT orders_o_id_check")
    res = cli(*args, f"resume={tmp_path / 'hydra-run'}")
    assert res.code == 0, res.err
    assert "commit markers" in res.err
    for t in TABLES:
        assert checksum(pg_target, f"mt_app.{t}") == checksum(mt, f"mt.{t}"), t


def test_plan_shows_every_table_and_bad_patterns_are_one_clear_error(mt, pg_target, cli) -> None:
    _fresh_schema(pg_target, "mt_plan")
    res = cli("plan", "pipeline=pg_to_pg", f"source.port={mt.port}", "source.tables=[mt.*]",
              f"sink.port={pg_target.port}", "sink.schema=mt_plan", "strategy=auto", "load_mode=create")
    assert res.code == 0, res.err
    assert "5 tables" in res.out and "mt.lineitem/" in res.out and "mt.region/" in res.out
    with pytest.raises(SchemaError, match=r"mt\.nope is not a table"):
        run_job(_spec(_src(mt, tables=["mt.nope"]), {"type": "postgres", "port": pg_target.port}, load_mode="create"))
    with pytest.raises(SchemaError, match="names no table"):
        run_job(_spec(_src(mt, tables=["mt.zz*"]), {"type": "postgres", "port": pg_target.port}, load_mode="create"))
    pg_exec(mt, "CREATE SCHEMA IF NOT EXISTS mt2", "CREATE TABLE IF NOT EXISTS mt2.region (r_id int)")
    with pytest.raises(ConfigError, match=r"mt\.region and mt2\.region would load into the same target"):
        run_job(_spec(_src(mt, tables=["mt.region", "mt2.region"]), {"type": "postgres", "port": pg_target.port}, load_mode="create"))
    with pytest.raises(ConfigError, match="names one target"):
        run_job(_spec(_src(mt), {"type": "postgres", "port": pg_target.port, "table": "one"}, load_mode="create"))
    with pytest.raises(ConfigError, match="exactly one of table, query or tables"):
        run_job(_spec(_src(mt, table="x"), {"type": "postgres", "port": pg_target.port}, load_mode="create"))


@pytest.mark.parametrize("kind", ["local", "ray"])
def test_ctrl_c_in_a_many_table_append_then_resume_is_exact(mt, pg_target, tmp_path: Path, kind: str, request) -> None:
    """Ctrl-C while the tables' partitions are queued (threads, or a real Ray instance's workers): exit 130
    with whole partitions only (the report's committed rows are the targets' rows), then the resume loads
    exactly the rest of every table."""
    pg_exec(mt, SCHEMA)
    _empty_targets(pg_target, "mt_stop")
    args = ["run", "pipeline=pg_to_pg", f"source.port={mt.port}", "source.tables=[mt.*]", f"sink.port={pg_target.port}",
            "sink.schema=mt_stop", "load_mode=append", "degree=1", "strategy=ctid", "strategy.partitions=6", "sink.copy_path=arrow",
            "batch_size=1000", *runtime_args(kind, request)]
    report, _, _ = ctrl_c_run(args, tmp_path, lambda: wait_until(lambda: pg_exec(
        pg_target, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'conveyor' AND query ILIKE 'COPY%'")[0][0],
        "a COPY into a target"))
    committed = sum(p["rows"] for p in report["partitions"] if p["error"] is None)
    wait_quiet(lambda: pg_exec(pg_target, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'conveyor' "
                                          "AND state <> 'idle' AND pid <> pg_backend_pid()")[0][0])
    assert sum(pg_exec(pg_target, f"SELECT count(*) FROM mt_stop.{t}")[0][0] for t in TABLES) == committed
    assert committed < sum(pg_exec(mt, f"SELECT count(*) FROM mt.{t}")[0][0] for t in TABLES)
    res = run_cli(*args, f"resume={tmp_path / 'run'}", f"hydra.run.dir={tmp_path}/resumed", cwd=tmp_path)
    assert res.code == 0, res.err
    for t in TABLES:
        assert checksum(pg_target, f"mt_stop.{t}") == checksum(mt, f"mt.{t}"), t


def test_a_schema_of_many_small_tables_needs_few_connections_and_one_partition_each(pg_source, pg_target, monkeypatch) -> None:
    """120 small tables into a target whose role may hold 6 connections at once. On the main this
    started from, each table's run held a guard connection (and a thread pinging it) until the job's
    finalize, so such a job failed with "too many connections" (a server's max_connections is 100 by
    default: 200 tables could not be copied at all), and every small table was split into `degree`
    partitions. Now the runs of one process share one guard connection per server, the driver reuses
    its connections from step to step, and a small table is one partition (the tables spread over the workers)."""
    n = 120
    pg_exec(pg_source, "DROP SCHEMA IF EXISTS small CASCADE", "CREATE SCHEMA small",
            *[f"CREATE TABLE small.t{i:03d} AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, {10 * (i + 1)}) g" for i in range(n)])
    pg_exec(pg_target, "DROP SCHEMA IF EXISTS small CASCADE", "DROP ROLE IF EXISTS few",
            "CREATE ROLE few LOGIN PASSWORD 'few-secret' CONNECTION LIMIT 6", "CREATE SCHEMA small AUTHORIZATION few")
    monkeypatch.setenv("FEW_PASSWORD", "few-secret")
    spec = _spec({"type": "postgres", "port": pg_source.port, "tables": ["small.*"]},
                 {"type": "postgres", "port": pg_target.port, "schema": "small", "user": "few", "password_env": "FEW_PASSWORD"},
                 load_mode="create", degree=2)
    report = run_job(spec)
    assert len(report.tables) == n and len(report.plan.partitions) == len(report.results) == n, len(report.plan.partitions)
    assert report.verification.ok and report.rows == sum(10 * (i + 1) for i in range(n))
    for i in (0, 57, n - 1):
        assert checksum(pg_target, f"small.t{i:03d}") == checksum(pg_source, f"small.t{i:03d}")
    assert pg_exec(pg_target, "SELECT count(*) FROM pg_stat_activity WHERE usename = 'few'")[0][0] == 0  # none left open
    pg_exec(pg_source, "DROP SCHEMA small CASCADE")
    pg_exec(pg_target, "DROP SCHEMA small CASCADE", "DROP ROLE few")
