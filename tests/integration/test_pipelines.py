"""One run per shipped pipeline config (configs/pipeline/*.yaml), through the CLI."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from tests.helpers import REPO, pg_exec

PIPELINES = sorted(p.stem for p in (REPO / "configs" / "pipeline").glob("*.yaml"))


def _orders_count(tpch_orders: Path) -> int:
    return duckdb.sql(f"SELECT count(*) FROM read_parquet('{tpch_orders}/*.parquet')").fetchone()[0]


def run_demo(cli, tmp_path, tpch_orders, pg_source, pg_target):
    db = tmp_path / "d.duckdb"
    assert cli("run", "pipeline=demo", f"source.path={tpch_orders}", f"sink.database={db}").code == 0
    return duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM orders").fetchone()[0]


def run_parquet_to_duckdb(cli, tmp_path, tpch_orders, pg_source, pg_target):
    db = tmp_path / "p.duckdb"
    duckdb.connect(str(db)).execute(f"CREATE TABLE o AS SELECT * FROM read_parquet('{tpch_orders}/*.parquet') LIMIT 0").close()
    res = cli("run", "pipeline=parquet_to_duckdb", f"source.path={tpch_orders}/*.parquet", f"sink.database={db}", "sink.table=o")
    assert res.code == 0, res.err
    return duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM o").fetchone()[0]


def run_duckdb_to_parquet(cli, tmp_path, tpch_orders, pg_source, pg_target):
    db = tmp_path / "s.duckdb"
    duckdb.connect(str(db)).execute(f"CREATE TABLE o AS SELECT * FROM read_parquet('{tpch_orders}/*.parquet')").close()
    res = cli("run", "pipeline=duckdb_to_parquet", f"source.database={db}", "source.table=o", f"sink.path={tmp_path}/out")
    assert res.code == 0, res.err
    return pq.read_table(tmp_path / "out").num_rows


def _load_orders_into_source(cli, tpch_orders, pg_source) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS orders")
    res = cli("run", "pipeline=parquet_to_postgres", f"source.path={tpch_orders}", f"sink.port={pg_source.port}",
              "sink.table=orders", "load_mode=create")
    assert res.code == 0, res.err


def run_parquet_to_postgres(cli, tmp_path, tpch_orders, pg_source, pg_target):
    _load_orders_into_source(cli, tpch_orders, pg_source)
    return pg_exec(pg_source, "SELECT count(*) FROM orders")[0][0]


def run_pg_to_pg(cli, tmp_path, tpch_orders, pg_source, pg_target):
    _load_orders_into_source(cli, tpch_orders, pg_source)
    pg_exec(pg_target, "DROP TABLE IF EXISTS orders")
    res = cli("run", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=orders",
              f"sink.port={pg_target.port}", "sink.table=orders", "load_mode=create")
    assert res.code == 0, res.err
    assert "pass-through" in res.out
    return pg_exec(pg_target, "SELECT count(*) FROM orders")[0][0]


def run_postgres_to_parquet(cli, tmp_path, tpch_orders, pg_source, pg_target):
    _load_orders_into_source(cli, tpch_orders, pg_source)
    res = cli("run", "pipeline=postgres_to_parquet", f"source.port={pg_source.port}", "source.table=orders",
              f"sink.path={tmp_path}/pgout")
    assert res.code == 0, res.err
    return pq.read_table(tmp_path / "pgout").num_rows


def run_s3_parquet_to_postgres(cli, tmp_path, tpch_orders, pg_source, pg_target, request=None):
    s3, s3_orders = request.getfixturevalue("s3"), request.getfixturevalue("s3_orders")
    pg_exec(pg_target, "DROP TABLE IF EXISTS orders_s3")
    res = cli("run", "pipeline=s3_parquet_to_postgres", f"vars.files={s3_orders}/*.parquet", f"vars.endpoint={s3.endpoint}",
              f"sink.port={pg_target.port}", "sink.table=orders_s3", "load_mode=create")
    assert res.code == 0, res.err
    return pg_exec(pg_target, "SELECT count(*) FROM orders_s3")[0][0]


def _mysql_env(request) -> tuple:
    """The test MariaDB, and the MySQL client variables that point the pipelines at it (the CLI reads them)."""
    m = request.getfixturevalue("mysql_server")
    return m, {"MYSQL_HOST": "127.0.0.1", "MYSQL_TCP_PORT": str(m.port), "MYSQL_USER": m.user,
                                          "MYSQL_DATABASE": m.database, "MYSQL_PWD": m.password}


def run_pg_to_mysql(cli, tmp_path, tpch_orders, pg_source, pg_target, request=None):
    m, env = _mysql_env(request)
    _load_orders_into_source(cli, tpch_orders, pg_source)
    m.execute("DROP TABLE IF EXISTS p_orders")
    res = cli("run", "pipeline=pg_to_mysql", f"source.port={pg_source.port}", "source.table=orders", "sink.table=p_orders",
              "load_mode=create", env=env)
    assert res.code == 0, res.err
    return m.execute("SELECT count(*) FROM p_orders")[0][0]


def run_mysql_to_pg(cli, tmp_path, tpch_orders, pg_source, pg_target, request=None):
    m, env = _mysql_env(request)
    run_pg_to_mysql(cli, tmp_path, tpch_orders, pg_source, pg_target, request)
    m.execute("ALTER TABLE p_orders ADD PRIMARY KEY (o_orderkey)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS orders_my")
    res = cli("run", "pipeline=mysql_to_pg", "source.table=p_orders", f"sink.port={pg_target.port}", "sink.table=orders_my",
              "load_mode=create", env=env)
    assert res.code == 0, res.err
    return pg_exec(pg_target, "SELECT count(*) FROM orders_my")[0][0]


def run_mysql_to_parquet(cli, tmp_path, tpch_orders, pg_source, pg_target, request=None):
    m, env = _mysql_env(request)
    run_pg_to_mysql(cli, tmp_path, tpch_orders, pg_source, pg_target, request)
    res = cli("run", "pipeline=mysql_to_parquet", "source.table=p_orders", f"sink.path={tmp_path}/myout", env=env)
    assert res.code == 0, res.err
    return pq.read_table(tmp_path / "myout").num_rows


def _clickhouse_env(request) -> tuple:
    """The test ClickHouse server, and the variables that point the pipelines at it (the CLI reads them)."""
    ch = request.getfixturevalue("clickhouse_server")
    return ch, {"CLICKHOUSE_HTTP_PORT": str(ch.http_port), "CLICKHOUSE_PASSWORD": ch.password}


def run_pg_to_clickhouse(cli, tmp_path, tpch_orders, pg_source, pg_target, request=None):
    ch, env = _clickhouse_env(request)
    _load_orders_into_source(cli, tpch_orders, pg_source)
    ch.execute("DROP TABLE IF EXISTS p_orders")
    res = cli("run", "pipeline=pg_to_clickhouse", f"source.port={pg_source.port}", "source.table=orders", "sink.table=p_orders",
              env=env)
    assert res.code == 0, res.err
    return int(ch.execute("SELECT count() FROM p_orders")[0][0])


def run_clickhouse_to_parquet(cli, tmp_path, tpch_orders, pg_source, pg_target, request=None):
    ch, env = _clickhouse_env(request)
    run_pg_to_clickhouse(cli, tmp_path, tpch_orders, pg_source, pg_target, request)
    res = cli("run", "pipeline=clickhouse_to_parquet", "source.table=p_orders", f"sink.path={tmp_path}/chout", env=env)
    assert res.code == 0, res.err
    return pq.read_table(tmp_path / "chout").num_rows


def run_pg_to_iceberg(cli, tmp_path, tpch_orders, pg_source, pg_target):
    from pyiceberg.catalog import load_catalog

    _load_orders_into_source(cli, tpch_orders, pg_source)
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/lake/catalog.db", "warehouse": f"file://{tmp_path}/lake/warehouse"}
    res = cli("run", "pipeline=pg_to_iceberg", f"source.port={pg_source.port}", "source.table=orders", "sink.table=tpch.orders",
              f"sink.catalog.uri={catalog['uri']}", f"sink.catalog.warehouse={catalog['warehouse']}")
    assert res.code == 0, res.err
    return len(load_catalog("default", **catalog).load_table("tpch.orders").scan().to_arrow())


def run_pg_to_delta(cli, tmp_path, tpch_orders, pg_source, pg_target):
    from deltalake import DeltaTable

    _load_orders_into_source(cli, tpch_orders, pg_source)
    res = cli("run", "pipeline=pg_to_delta", f"source.port={pg_source.port}", "source.table=orders", f"sink.path={tmp_path}/lake/orders")
    assert res.code == 0, res.err
    return DeltaTable(str(tmp_path / "lake" / "orders")).count()


def run_pg_migrate(cli, tmp_path, tpch_orders, pg_source, pg_target):
    pg_exec(pg_source, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = 'pl_mig'",
            "DROP DATABASE IF EXISTS pl_mig WITH (FORCE)", "CREATE DATABASE pl_mig")
    pg_exec(pg_target, "DROP DATABASE IF EXISTS pl_mig WITH (FORCE)", "CREATE DATABASE pl_mig")
    res = cli("run", "pipeline=parquet_to_postgres", f"source.path={tpch_orders}", f"sink.port={pg_source.port}", "sink.dbname=pl_mig",
              "sink.table=orders", "load_mode=create")
    assert res.code == 0, res.err
    pg_exec(pg_source, "ALTER TABLE orders ADD PRIMARY KEY (o_orderkey)", dbname="pl_mig")
    args = ("run", "pipeline=pg_migrate", f"source.port={pg_source.port}", "source.dbname=pl_mig", f"sink.port={pg_target.port}",
            "sink.dbname=pl_mig")
    for more in ((), ("migrate.cutover=true",)):
        res = cli(*args, *more)
        assert res.code == 0, res.err
    assert "cutover done: write downtime" in res.out + res.err
    assert pg_exec(pg_target, "SELECT count(*) FROM pg_constraint WHERE conname = 'orders_pkey'", dbname="pl_mig") == [(1,)]
    return pg_exec(pg_target, "SELECT count(*) FROM orders", dbname="pl_mig")[0][0]


def test_every_pipeline_has_a_run() -> None:
    assert PIPELINES and all(f"run_{name}" in globals() for name in PIPELINES), PIPELINES


@pytest.mark.parametrize("name", PIPELINES)
def test_pipeline(name: str, cli, tmp_path: Path, tpch_orders: Path, pg_source, pg_target, request) -> None:
    run = globals()[f"run_{name}"]
    extra = {"request": request} if "request" in run.__code__.co_varnames else {}
    rows = run(cli, tmp_path, tpch_orders, pg_source, pg_target, **extra)
    assert rows == _orders_count(tpch_orders)


def test_one_owner_runs_the_job_writes_report_and_manifest_and_a_failure_carries_its_report(tpch_orders: Path, tmp_path: Path) -> None:
    """conveyor.pipelines.run owns the whole run (the CLI only prints): it returns the report, or
    raises one JobFailed carrying it, and writes report.json and manifest.json either way."""
    import json

    from conveyor.errors import JobFailed, SchemaError
    from conveyor.pipelines.run import RunPlace, run
    from conveyor.submit import compose

    db = tmp_path / "owner.duckdb"
    overrides = ["pipeline=demo", f"source.path={tpch_orders}", f"sink.database={db}"]
    report = run(compose(overrides), RunPlace(run_dir=tmp_path / "ok"))
    assert report.ok and report.rows == _orders_count(tpch_orders)
    assert json.loads((tmp_path / "ok" / "report.json").read_text())["status"] == "succeeded"
    assert json.loads((tmp_path / "ok" / "manifest.json").read_text())["partitions"]
    with pytest.raises(JobFailed) as failed:
        run(compose([*overrides, "load_mode=create"]), RunPlace(run_dir=tmp_path / "bad"))
    assert isinstance(failed.value.cause, SchemaError) and failed.value.exit_code == SchemaError.exit_code
    assert failed.value.report is not None and failed.value.report.error is failed.value.cause
    saved = json.loads((tmp_path / "bad" / "report.json").read_text())
    assert saved["status"] == "failed" and saved["error"]["type"] == "SchemaError" and "already exists" in saved["error"]["message"]


def test_degree_is_resolved_once_against_the_runtime_and_reaches_strategy_runtime_and_report(
        tpch_orders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """degree=-2 is half the runtime's CPUs: here a local runtime that says its tasks have 8 (as a
    Ray cluster's cpus() does), so 4 - not half of this machine's CPUs - for all three."""
    import json
    from dataclasses import replace

    from conveyor.pipelines.run import RunPlace, run
    from conveyor.runtime.local import LocalRuntime
    from conveyor.submit import compose

    seen: list[int] = []

    class EightCpus(LocalRuntime):
        def cpus(self) -> int:
            return 8

        def run(self, tasks, degree, progress):  # type: ignore[no-untyped-def]
            seen.append(degree)
            return super().run(tasks, degree, progress)

    import conveyor.config as config

    build = config.build_job

    def with_eight(*args, **kwargs):  # type: ignore[no-untyped-def]
        spec = build(*args, **kwargs)
        return replace(spec, runtime=EightCpus(spec.runtime.config, spec.options))

    overrides = ["pipeline=demo", f"source.path={tpch_orders}", f"sink.database={tmp_path}/d.duckdb", "degree=-2",
                 "strategy.files_per_partition=0"]
    monkeypatch.setattr(config, "build_job", with_eight)
    report = run(compose(overrides), RunPlace(run_dir=tmp_path / "run"))
    assert report.plan.degree == 4 and seen == [4]
    assert len(report.plan.partitions) == 4  # 4 files over 4 partitions: the strategy got 4
    options = json.loads((tmp_path / "run" / "report.json").read_text())["options"]
    assert options["degree"] == 4 and options["degree_configured"] == -2
