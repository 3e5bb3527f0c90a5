"""Incremental loads: incremental.cursor=<column> reads only the rows past the cursor the target
committed last (kept in <schema>._conveyor_cursors, moved in the transaction that makes the load
visible); a failed run keeps the old cursor; a run that stopped after committing part of its window
is resumed on that same window, never replaced by a new one that would load those rows again."""

from __future__ import annotations

import pytest

from conveyor.errors import ConfigError, PlanningError
from tests.helpers import checksum, job, pg_exec, run_cli


def _src(server) -> dict:
    return {"type": "postgres", "port": server.port, "table": "inc_src"}


def _dst(server, table: str) -> dict:
    return {"type": "postgres", "port": server.port, "table": table}


def _add(server, first: int, last: int) -> None:
    """Rows first..last, each stamped a second after the one before."""
    pg_exec(server, f"INSERT INTO inc_src SELECT g, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second', "
                    f"md5(g::text) FROM generate_series({first}, {last}) g")


def _cursor(server, table: str) -> list[tuple]:
    return pg_exec(server, f"SELECT cursor, value, pending_load FROM _conveyor_cursors WHERE target = 'public.{table}'")


@pytest.fixture
def inc(pg_source, pg_target):
    pg_exec(pg_source, "DROP TABLE IF EXISTS inc_src", "CREATE TABLE inc_src (id int PRIMARY KEY, updated_at timestamptz, v text)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS _conveyor_cursors")  # each test starts with no cursor kept
    return pg_source


def test_append_three_runs_and_a_failed_one_load_each_row_once(inc, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS inc_app", "CREATE TABLE inc_app (id int, updated_at timestamptz, v text)")
    _add(inc, 1, 1000)
    inc_job = {"load_mode": "append", "incremental": {"cursor": "updated_at"}}
    first = job(_src(inc), _dst(pg_target, "inc_app"), "rangeid", {"distribute_key": "id", "partitions": 3}, degree=2, **inc_job)
    assert first.rows == 1000 and first.plan.window.low is None
    assert checksum(pg_target, "inc_app") == checksum(inc, "inc_src")
    assert _cursor(pg_target, "inc_app")[0][1].startswith("2026-01-01T00:16:40")  # 1,000 s past midnight
    _add(inc, 1001, 1500)
    second = job(_src(inc), _dst(pg_target, "inc_app"), "rangeid", {"distribute_key": "id", "partitions": 3}, degree=2, **inc_job)
    assert second.rows == 500 and "updated_at > 2026-01-01 00:16:40" in second.plan.window.describe()
    assert checksum(pg_target, "inc_app") == checksum(inc, "inc_src")
    # a run that fails (a row the target refuses) commits nothing and keeps the cursor
    _add(inc, 1501, 2000)
    pg_exec(pg_target, "ALTER TABLE inc_app ADD CONSTRAINT inc_app_no_1750 CHECK (id <> 1750)")
    kept = _cursor(pg_target, "inc_app")[0][1]
    with pytest.raises(Exception, match="inc_app_no_1750"):
        job(_src(inc), _dst(pg_target, "inc_app"), **inc_job)
    assert _cursor(pg_target, "inc_app")[0][1] == kept
    assert pg_exec(pg_target, "SELECT count(*) FROM inc_app")[0][0] == 1500
    pg_exec(pg_target, "ALTER TABLE inc_app DROP CONSTRAINT inc_app_no_1750")
    third = job(_src(inc), _dst(pg_target, "inc_app"), **inc_job)
    assert third.rows == 500
    assert checksum(pg_target, "inc_app") == checksum(inc, "inc_src")
    # nothing new: nothing read, the cursor stays
    fourth = job(_src(inc), _dst(pg_target, "inc_app"), **inc_job)
    assert fourth.rows == 0 and "no new rows" in fourth.plan.window.describe()
    assert checksum(pg_target, "inc_app") == checksum(inc, "inc_src")
    assert _cursor(pg_target, "inc_app")[0][2] is None  # no window pending


def test_merge_takes_the_changed_rows_only(inc, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS inc_mrg", "CREATE TABLE inc_mrg (id int PRIMARY KEY, updated_at timestamptz, v text)")
    _add(inc, 1, 1000)
    opts = {"load_mode": "merge", "incremental": {"cursor": "updated_at"}}
    assert job(_src(inc), _dst(pg_target, "inc_mrg"), **opts).rows == 1000
    # 100 rows change (their updated_at moves past the cursor) and 50 are new
    pg_exec(inc, "UPDATE inc_src SET v = 'changed', updated_at = timestamptz '2026-02-01 00:00:00+00' + id * interval '1 second' "
                 "WHERE id % 10 = 0")
    _add(inc, 1001, 1050)
    report = job(_src(inc), _dst(pg_target, "inc_mrg"), **opts)
    assert report.rows == 150
    assert checksum(pg_target, "inc_mrg") == checksum(inc, "inc_src")
    assert pg_exec(pg_target, "SELECT count(*) FROM inc_mrg WHERE v = 'changed'") == [(100,)]


def test_a_window_stopped_half_way_is_resumed_not_replaced(inc, pg_target, tmp_path) -> None:
    def cli(*args: str):
        return run_cli(*args, cwd=tmp_path)

    pg_exec(pg_target, "DROP TABLE IF EXISTS inc_half", "CREATE TABLE inc_half (id int, updated_at timestamptz, v text, "
                                                       "CONSTRAINT inc_half_low CHECK (id < 800))")
    _add(inc, 1, 1000)
    args = ["run", "pipeline=pg_to_pg", f"source.port={inc.port}", "source.table=inc_src", f"sink.port={pg_target.port}",
            "sink.table=inc_half", "load_mode=append", "incremental.cursor=updated_at", "strategy=rangeid",
            "strategy.distribute_key=id", "strategy.partitions=4", "degree=1", "runtime=local"]
    failed = cli(*args, f"hydra.run.dir={tmp_path}/first")
    assert failed.code != 0 and "inc_half_low" in failed.err
    committed = pg_exec(pg_target, "SELECT count(*) FROM inc_half")[0][0]
    assert 0 < committed < 1000  # whole partitions only
    _add(inc, 1001, 1100)  # meanwhile, new rows: a new window would overlap the committed partitions
    again = cli(*args, f"hydra.run.dir={tmp_path}/second")
    assert again.code != 0 and "stopped after committing" in again.err and "resume=" in again.err
    assert pg_exec(pg_target, "SELECT count(*) FROM inc_half")[0][0] == committed
    pg_exec(pg_target, "ALTER TABLE inc_half DROP CONSTRAINT inc_half_low")
    resumed = cli(*args, f"resume={tmp_path}/first", f"hydra.run.dir={tmp_path}/third")
    assert resumed.code == 0, resumed.err
    assert pg_exec(pg_target, "SELECT count(*), count(DISTINCT id), max(id) FROM inc_half") == [(1000, 1000, 1000)]
    after = cli(*args, f"hydra.run.dir={tmp_path}/fourth")  # the next window starts where the resumed one ended
    assert after.code == 0, after.err
    assert checksum(pg_target, "inc_half") == checksum(inc, "inc_src")


def test_incremental_is_refused_by_name_where_it_cannot_hold(inc, pg_target, tmp_path) -> None:
    with pytest.raises(ConfigError, match="load_mode=truncate"):
        job(_src(inc), _dst(pg_target, "inc_x"), load_mode="truncate", incremental={"cursor": "updated_at"})
    pg_exec(pg_target, "DROP TABLE IF EXISTS inc_x", "CREATE TABLE inc_x (id int, updated_at timestamptz, v text)")
    with pytest.raises(Exception, match="'nope' is not a column"):
        job(_src(inc), _dst(pg_target, "inc_x"), incremental={"cursor": "nope"})
    with pytest.raises(Exception, match="a cursor is a timestamp"):
        job(_src(inc), _dst(pg_target, "inc_x"), incremental={"cursor": "v"})
    with pytest.raises(ConfigError, match="keeps no cursor"):
        job(_src(inc), {"type": "adbc", "driver": "sqlite", "uri": str(tmp_path / "x.db"), "table": "inc_x"}, load_mode="append",
            incremental={"cursor": "updated_at"})
    assert PlanningError  # imported for the resume test's error class


@pytest.mark.parametrize("kind", ["duckdb", "sqlite"])
def test_duckdb_and_adbc_sources_load_incrementally_into_postgresql(pg_target, tmp_path, kind: str) -> None:
    """The window is the SQL sources' own (conveyor/kit/sql.py): DuckDB and any ADBC driver
    (SQLite here) read only the rows past the cursor, bound as parameters in their dialect."""
    import sqlite3

    import duckdb

    db = tmp_path / f"src.{kind}"

    def add(first: int, last: int) -> None:
        rows = [(g, g * 10, f"v{g}") for g in range(first, last + 1)]
        if kind == "duckdb":
            with duckdb.connect(str(db)) as con:
                con.execute("CREATE TABLE IF NOT EXISTS items (id INTEGER, seq BIGINT, v VARCHAR)")
                con.executemany("INSERT INTO items VALUES (?, ?, ?)", rows)
        else:
            con = sqlite3.connect(db)
            con.execute("CREATE TABLE IF NOT EXISTS items (id INTEGER, seq INTEGER, v TEXT)")
            con.executemany("INSERT INTO items VALUES (?, ?, ?)", rows)
            con.commit()
            con.close()

    src = ({"type": "duckdb", "database": str(db), "table": "items"} if kind == "duckdb"
           else {"type": "adbc", "driver": "sqlite", "uri": str(db), "table": "items"})
    target = f"inc_{kind}"
    pg_exec(pg_target, f"DROP TABLE IF EXISTS {target}", f"CREATE TABLE {target} (id int, seq bigint, v text)")
    opts = {"load_mode": "append", "incremental": {"cursor": "seq"}}
    add(1, 300)
    assert job(src, _dst(pg_target, target), "rangeid", {"distribute_key": "id", "partitions": 3}, degree=2, **opts).rows == 300
    add(301, 420)
    second = job(src, _dst(pg_target, target), "rangeid", {"distribute_key": "id", "partitions": 3}, degree=2, **opts)
    assert second.rows == 120 and "seq > 3000 AND seq <= 4200" in second.plan.window.describe()
    assert second.verification.ok and second.verification.source_rows == 120
    assert pg_exec(pg_target, f"SELECT count(*), count(DISTINCT id), sum(seq) FROM {target}") == [(420, 420, sum(g * 10 for g in range(1, 421)))]
    assert job(src, _dst(pg_target, target), **opts).rows == 0


def test_the_window_travels_to_ray_workers(inc, pg_target, ray_instance) -> None:
    """The windowed source is what the Ray tasks get: two appends on the module's real Ray instance,
    each partition read by a worker, load every row once."""
    from omegaconf import OmegaConf

    from conveyor.config import build_job
    from conveyor.pipelines.job import run_job

    pg_exec(pg_target, "DROP TABLE IF EXISTS inc_ray", "CREATE TABLE inc_ray (id int, updated_at timestamptz, v text)")

    def run() -> int:
        cfg = OmegaConf.create({"source": _src(inc), "sink": _dst(pg_target, "inc_ray"),
                                "strategy": {"type": "rangeid", "distribute_key": "id", "partitions": 3},
                                "runtime": {"type": "ray", "max_retries": 0}, "load_mode": "append", "degree": 2,
                                "incremental": {"cursor": "updated_at"}})
        return run_job(build_job(cfg)).rows

    _add(inc, 1, 600)
    assert run() == 600
    _add(inc, 601, 900)
    assert run() == 300
    assert checksum(pg_target, "inc_ray") == checksum(inc, "inc_src")
    assert pg_exec(pg_target, "SELECT count(DISTINCT id) FROM inc_ray") == [(900,)]


def test_a_parquet_folder_keeps_its_cursor_beside_its_files(inc, cli, tmp_path) -> None:
    """Into Parquet files: three runs each append only the new rows; a run that fails half way (a
    value the files cannot hold) keeps the old cursor and its window pending; a new run is then
    refused, and the resume loads exactly the rest of that window; the next run goes on from there."""
    import json

    import pyarrow.dataset as ds

    pg_exec(inc, "DROP TABLE IF EXISTS inc_f", "CREATE TABLE inc_f (id int PRIMARY KEY, updated_at timestamptz, d date)")

    def add(first: int, last: int) -> None:
        pg_exec(inc, f"INSERT INTO inc_f SELECT g, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second', "
                     f"DATE '2020-01-01' + g FROM generate_series({first}, {last}) g")

    out = tmp_path / "out"
    args = ["run", "source=postgres", f"source.port={inc.port}", "source.table=inc_f", "sink=parquet", f"sink.path={out}",
            "load_mode=append", "incremental.cursor=updated_at", "strategy=ntile", "strategy.distribute_key=id",
            "strategy.partitions=4", "degree=2", "runtime=local"]

    def ids() -> list[int]:
        return sorted(ds.dataset(out, format="parquet").to_table(columns=["id"]).column("id").to_pylist())

    def state() -> dict:
        return json.loads((out / "_conveyor_cursors.json").read_text())["updated_at"]

    add(1, 1000)
    assert cli(*args).code == 0
    assert ids() == list(range(1, 1001)) and state()["value"][0].startswith("2026-01-01T00:16:40") and state()["pending"] is None
    add(1001, 1500)
    second = cli(*args)
    assert second.code == 0, second.err
    assert ids() == list(range(1, 1501))
    add(1501, 2000)
    pg_exec(inc, "UPDATE inc_f SET d = 'infinity' WHERE id = 1990")  # Parquet cannot hold it: refused by name, in the last partition
    failed = cli(*args)
    assert failed.code != 0 and "column d" in failed.err, failed.err
    assert state()["value"][0].startswith("2026-01-01T00:25:00") and state()["pending"]["high"][0].startswith("2026-01-01T00:33:20")
    assert 1990 not in ids() and len(ids()) > 1500  # whole partitions of the window only
    refused = run_cli(*args, f"hydra.run.dir={tmp_path}/refused", cwd=tmp_path)
    assert refused.code == 2 and "stopped after committing" in refused.err, refused.err
    pg_exec(inc, "UPDATE inc_f SET d = DATE '2020-01-01' WHERE id = 1990")
    resumed = cli(*args, f"resume={tmp_path / 'hydra-run'}")
    assert resumed.code == 0, resumed.err
    assert ids() == list(range(1, 2001)) and state()["pending"] is None and state()["value"][0].startswith("2026-01-01T00:33:20")
    add(2001, 2100)
    assert cli(*args).code == 0
    assert ids() == list(range(1, 2101))


def test_a_duckdb_target_keeps_its_cursor_and_commit_markers(inc, tmp_path) -> None:
    """Into DuckDB: the cursor and the markers live in the database file beside the target. A run
    that fails half way (a row the target refuses) keeps the old cursor and the committed partitions'
    markers; a new run is refused; the resume writes only the partitions the markers lack."""
    import duckdb

    db = tmp_path / "inc.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE inc_d (id INTEGER, updated_at TIMESTAMPTZ, v VARCHAR NOT NULL)")
    con.close()
    cfg = {"load_mode": "append", "incremental": {"cursor": "updated_at"}, "degree": 2}
    sink = {"type": "duckdb", "database": str(db), "table": "inc_d"}

    def run(**kw):
        return job(_src(inc), sink, "ntile", {"distribute_key": "id", "partitions": 4}, **cfg, **kw)

    def got() -> tuple:
        with duckdb.connect(str(db)) as c:
            return c.execute("SELECT count(*), count(DISTINCT id), sum(id) FROM inc_d").fetchone()

    def cursor() -> tuple:
        with duckdb.connect(str(db)) as c:
            return c.execute("SELECT value, pending_load FROM _conveyor_cursors WHERE target = 'main.inc_d'").fetchone()

    _add(inc, 1, 1000)
    assert run().rows == 1000 and got() == (1000, 1000, 500500) and cursor()[0].startswith("2026-01-01T00:16:40")
    _add(inc, 1001, 1500)
    assert run().rows == 500 and got() == (1500, 1500, 1125750)
    _add(inc, 1501, 2000)
    pg_exec(inc, "UPDATE inc_src SET v = NULL WHERE id = 1990")  # the target refuses it: its partition fails
    with pytest.raises(Exception, match="NOT NULL|null"):
        job(_src(inc), sink, "ntile", {"distribute_key": "id", "partitions": 4}, **cfg)
    failed_load = cursor()[1]
    assert cursor()[0].startswith("2026-01-01T00:25:00") and failed_load  # the old cursor, the window pending
    assert 1500 < got()[0] < 2000  # whole partitions of the window only
    with pytest.raises(PlanningError, match="stopped after committing"):
        run()
    pg_exec(inc, "UPDATE inc_src SET v = 'fixed' WHERE id = 1990")
    from omegaconf import OmegaConf

    from conveyor.config import build_job
    from conveyor.pipelines.job import run_job

    resumed = run_job(build_job(OmegaConf.create({"source": _src(inc), "sink": sink, "strategy": {"type": "ntile", "distribute_key": "id",
                                                  "partitions": 4}, "runtime": {"type": "local"}, **cfg}), load_id=failed_load))
    skipped = [r for r in resumed.results if r.already_committed]
    assert skipped and sum(r.rows for r in resumed.results) == 500 and got() == (2000, 2000, 2001000)  # only what the markers lacked
    assert cursor() == (cursor()[0], None) and cursor()[0].startswith("2026-01-01T00:33:20")
    _add(inc, 2001, 2100)
    assert run().rows == 100 and got() == (2100, 2100, 2100 * 2101 // 2)
