"""Errors that tell the truth, and runs that leave nothing they did not mean to (the trust issue's
items 7-12). Each failed on the main this started from, as its docstring says."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.errors import ConfigError, ConnectError, PluginError, SchemaError, TransferError
from tests.helpers import BIN, job, pg_exec, run_cli

pytestmark = pytest.mark.usefixtures("pg_password")


def _compose(*overrides: str):
    from conveyor.config import build_job
    from conveyor.submit import compose

    return build_job(compose(list(overrides)))


# --- the config ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_unknown_pipeline_is_an_error_listing_the_pipelines(tmp_path: Path) -> None:
    """`pipeline=pg2pg --cfg job` printed the default Parquet -> DuckDB job with exit 0 (the group was
    optional: an unknown choice was skipped where Hydra did not compose the job to run it)."""
    res = run_cli("run", "pipeline=pg2pg", "--cfg", "job", cwd=tmp_path)
    assert res.code == 2 and "Could not find 'pipeline/pg2pg'" in res.err and "pg_to_pg" in res.err, (res.err, res.out)
    res = run_cli("run", "pipeline=pg2pg", "source.path=x", f"sink.database={tmp_path}/made.duckdb", cwd=tmp_path)
    assert res.code == 2 and "Could not find 'pipeline/pg2pg'" in res.err and "pg_to_pg" in res.err, res.err
    assert not (tmp_path / "made.duckdb").exists() and not (tmp_path / "outputs").exists()
    with pytest.raises(ConfigError, match="pipeline/pg2pg"):
        _compose("pipeline=pg2pg")


def test_one_value_where_a_list_belongs_says_how_to_write_the_list() -> None:
    """`source.tables=public.orders*` said 'AnyNode is not a ListConfig, list or tuple', no hint."""
    with pytest.raises(ConfigError, match=r"source.tables: takes a list, and public.orders\* is one value") as caught:
        _compose("pipeline=pg_to_pg", "source.tables=public.orders*", "sink.table='{table}_2'")
    assert "'source.tables=[public.orders*]'" in caught.value.hint


def test_null_on_the_command_line_names_the_null_policy() -> None:
    """`source.special_values=null` is YAML's null on the command line: it failed ("Incompatible value
    'None' for field of type 'str'") where 'null' worked."""
    spec = _compose("pipeline=pg_to_pg", "source.table=t", "sink.table=t", "source.special_values=null")
    assert spec.source.config.special_values == "null"
    spec = _compose("pipeline=mysql_to_pg", "source.table=t", "sink.table=t", "source.database=d", "source.zero_dates=null")
    assert spec.source.config.zero_dates == "null"


def test_a_secret_written_into_the_config_is_refused_by_its_key(monkeypatch) -> None:
    """`+source.options={password: ...}` was accepted and written as it was into .hydra/config.yaml,
    overrides.yaml and hydra.yaml; a URI with its password likewise."""
    with pytest.raises(ConfigError, match=r"source.options.password: a secret written into the config") as caught:
        _compose("pipeline=pg_to_pg", "source.table=t", "sink.table=t", "+source.options={password: hunter2}")
    assert "${oc.env:" in caught.value.hint and "hunter2" not in str(caught.value) + caught.value.hint
    with pytest.raises(ConfigError, match="the URI holds a password"):
        _compose("source=adbc", "source.driver=postgresql", "source.uri=postgresql://u:hunter2@h/db", "source.table=t")
    monkeypatch.setenv("SOME_PW", "from-the-environment")
    _compose("pipeline=pg_to_pg", "source.table=t", "sink.table=t", "+source.options={password: '${oc.env:SOME_PW}'}")


@pytest.mark.slow
def test_the_runs_config_files_hold_no_secret(pg_source, pg_target, tmp_path: Path) -> None:
    """Hydra's own .hydra/ copies are off; conveyor writes them with secrets masked (a literal one refused
    before: its .hydra/ holds the override masked)."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS tm_src", "CREATE TABLE tm_src AS SELECT 1 AS a")
    res = run_cli("run", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=tm_src", f"sink.port={pg_target.port}",
                  "sink.table=tm_dst", "load_mode=replace", "runtime=local", "+sink.options={password: Hunter2-secret}",
                  f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert res.code == 2 and "sink.options.password" in res.err
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.name == "overrides.yaml" for p in written)
    assert not [p for p in written if "Hunter2-secret" in p.read_text(errors="replace")]


# --- connecting and reading ------------------------------------------------------------------------


def test_a_database_that_does_not_exist_is_named(pg_source) -> None:
    """It said 'is the server running and reachable' of a server that answered."""
    with pytest.raises(ConnectError, match='database "no_such_db" does not exist') as caught:
        job({"type": "postgres", "port": pg_source.port, "dbname": "no_such_db", "table": "t"}, {"type": "parquet", "path": "/nonexistent"})
    assert "server running" not in caught.value.hint and "dbname" in caught.value.hint


def test_parquet_files_whose_types_differ_name_the_column_and_both_types(tmp_path: Path) -> None:
    """It printed identical 'expected' and 'found' lists (the names only)."""
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": pa.array([1], pa.int32()), "v": ["a"]}), tmp_path / "in" / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([2], pa.int64()), "v": ["b"]}), tmp_path / "in" / "b.parquet")
    with pytest.raises(SchemaError, match=r"id: int32 in the first file, int64 here"):
        job({"type": "parquet", "path": str(tmp_path / "in")}, {"type": "parquet", "path": str(tmp_path / "out")}, "files")


def test_a_missing_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    """It was 'internal error: ModuleNotFoundError ... please report it'. psycopg is made unimportable here
    (a None in sys.modules) to stand for an environment without the postgres extra."""
    code = ("import sys; sys.modules['psycopg'] = None\nfrom conveyor.cli import main\n"
            "sys.exit(main(['run', 'pipeline=pg_to_pg', 'source.table=x', 'sink.table=y', 'runtime=local', 'hydra.run.dir=run']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == PluginError.exit_code, proc.stderr
    assert "error: the Python package 'psycopg' is not installed: it comes with Conveyor's 'postgres' extra" in proc.stderr
    assert "pip install 'conveyor[postgres]'" in proc.stderr and "internal error" not in proc.stderr


def test_a_target_with_fewer_columns_is_not_told_to_map_by_position(pg_source, pg_target) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS tm_wide", "CREATE TABLE tm_wide (a int, b int, c int)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS tm_narrow", "CREATE TABLE tm_narrow (a int, b int)")
    with pytest.raises(SchemaError, match="source columns with no target column: c") as caught:
        job({"type": "postgres", "port": pg_source.port, "table": "tm_wide"}, {"type": "postgres", "port": pg_target.port, "table": "tm_narrow"},
            load_mode="append")
    assert "map_method=position" not in caught.value.hint and "source.query" in caught.value.hint


def test_infinity_into_the_adbc_writer_is_refused_by_column(pg_target, tmp_path: Path) -> None:
    """A DuckDB source keeps -infinity; ADBC's COPY writer failed with 'Error occurred writing COPY data:' and nothing after it."""
    import duckdb

    db = tmp_path / "inf.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE inf AS SELECT 1 AS id, '-infinity'::timestamp AS t")
    pg_exec(pg_target, "DROP TABLE IF EXISTS tm_inf", "CREATE TABLE tm_inf (id int, t timestamp)")
    with pytest.raises(TransferError, match=r"column t \(timestamp\[us\]\) holds -infinity, which ADBC's COPY writer cannot write"):
        job({"type": "duckdb", "database": str(db), "table": "inf"}, {"type": "postgres", "port": pg_target.port, "table": "tm_inf",
                                                                      "writer": "adbc"}, load_mode="append")
    job({"type": "duckdb", "database": str(db), "table": "inf"}, {"type": "postgres", "port": pg_target.port, "table": "tm_inf"},
        load_mode="append")  # pgpq writes it
    assert pg_exec(pg_target, "SELECT t::text FROM tm_inf") == [("-infinity",)]


def test_infinity_in_an_array_is_refused_by_column(pg_target, tmp_path: Path) -> None:
    """A DuckDB date[] holding infinity (the corpus's array table copied PostgreSQL -> DuckDB -> PostgreSQL): PostgreSQL
    refused the COPY with "date out of range", naming no column."""
    import duckdb

    db = tmp_path / "inf_list.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE inf AS SELECT * FROM (VALUES (1, ['2000-01-01', 'infinity']::date[]), (2, ['1999-12-31']::date[])) v(id, da)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS tm_inf_list", "CREATE TABLE tm_inf_list (id int, da date[])")
    with pytest.raises(TransferError, match=r"column da \(list<.*date32.*\) holds infinity in an array"):
        job({"type": "duckdb", "database": str(db), "table": "inf"}, {"type": "postgres", "port": pg_target.port, "table": "tm_inf_list"},
            load_mode="append")
    assert pg_exec(pg_target, "SELECT count(*) FROM tm_inf_list") == [(0,)]


def test_a_value_the_targets_copy_refuses_on_the_arrow_path_names_its_column(pg_target, tmp_path: Path) -> None:
    """Text into an enum that lacks one label (Parquet -> PostgreSQL, ADBC's COPY): the message was libpq's wrapping
    ("[libpq] Failed to execute COPY statement: PGRES_FATAL_ERROR ERROR: invalid input value for enum ...") and named no
    column; the server's context says which."""
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int32()), "m": ["sad", "happy"]}), tmp_path / "moods.parquet")
    pg_exec(pg_target, "DROP TABLE IF EXISTS tm_moods", "DROP TYPE IF EXISTS tm_mood", "CREATE TYPE tm_mood AS ENUM ('sad', 'ok')",
            "CREATE TABLE tm_moods (id int, m tm_mood)")
    with pytest.raises(TransferError) as raised:
        job({"type": "parquet", "path": str(tmp_path / "moods.parquet")}, {"type": "postgres", "port": pg_target.port, "table": "tm_moods"},
            load_mode="append")
    assert """invalid input value for enum tm_mood: "happy" (column m, line 2 of the partition's COPY)""" in str(raised.value)
    assert "libpq" not in str(raised.value) and "PGRES" not in str(raised.value)
    assert pg_exec(pg_target, "SELECT count(*) FROM tm_moods") == [(0,)]


def test_a_column_postgresql_cannot_take_from_arrow_is_named_and_aclitem_takes_no_binary_stream(pg_source, pg_target) -> None:
    """The corpus's system types: an int2vector read as an Arrow list was refused as "PostgreSQL cannot cast it: cannot cast
    type smallint[] to int2vector" naming no column; an aclitem column failed the pass-through's binary COPY ("no binary
    input function available for type aclitem"), naming none either."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS tm_sys", "CREATE TABLE tm_sys (id int, v int2vector, acl aclitem)",
            "INSERT INTO tm_sys VALUES (1, '1 2 3', 'postgres=arwdDxt/postgres')")
    pg_exec(pg_target, "DROP TABLE IF EXISTS tm_sys", "CREATE TABLE tm_sys (id int, v int2vector, acl aclitem)")
    source = {"type": "postgres", "port": pg_source.port, "table": "tm_sys"}
    with pytest.raises(SchemaError, match=r"column v \(list<.*int16.*> -> int2vector\): PostgreSQL cannot cast it"):
        job(source, {"type": "postgres", "port": pg_target.port, "table": "tm_sys", "copy_path": "arrow"}, load_mode="append")
    report = job({"type": "postgres", "port": pg_source.port, "query": "SELECT id, acl FROM tm_sys"}, {"type": "postgres", "port": pg_target.port, "table": "tm_sys"},
                 load_mode="append")
    assert report.sink_plan.native is None and "aclitem" in report.sink_plan.path_reason
    assert pg_exec(pg_target, "SELECT id, acl::text FROM tm_sys") == [(1, "postgres=arwdDxt/postgres")]


def test_allow_cast_to_a_smaller_scale_loads_on_the_default_writer(pg_source, pg_target) -> None:
    """Following the hint of a refused numeric(15,2) -> numeric(15,1) load, sink.allow_cast failed on pgpq:
    'invalid byte sequence for encoding "UTF8": 0x00' (the numeric's binary form into a text column)."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS tm_price", "CREATE TABLE tm_price (id int, p numeric(15,2))",
            "INSERT INTO tm_price VALUES (1, 12.34), (2, 0.05), (3, NULL)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS tm_price", "CREATE TABLE tm_price (id int, p numeric(15,1))")
    sink = {"type": "postgres", "port": pg_target.port, "table": "tm_price", "copy_path": "arrow"}
    with pytest.raises(SchemaError, match=r"column p .*allow_cast=\[p\]|column p \(numeric\(15,2\) -> numeric\(15,1\)\)"):
        job({"type": "postgres", "port": pg_source.port, "table": "tm_price"}, sink, load_mode="append")
    report = job({"type": "postgres", "port": pg_source.port, "table": "tm_price"}, {**sink, "allow_cast": ["p"]}, load_mode="append")
    assert "pgpq encoder" in report.sink_plan.path_reason
    assert pg_exec(pg_target, "SELECT id, p::text FROM tm_price ORDER BY id") == [(1, "12.3"), (2, "0.1"), (3, None)]


def test_datadriven_over_many_values_does_not_hold_them_in_the_driver(pg_source) -> None:
    """`conveyor plan` with datadriven on 3M distinct values held them all in the driver (687 MB for
    integers); now the database cuts them into runs and the driver receives one value per run."""
    from conveyor.core import KeyRange
    from conveyor.pipelines.job import plan_job

    pg_exec(pg_source, "DROP TABLE IF EXISTS tm_many", "CREATE TABLE tm_many AS SELECT g AS id FROM generate_series(1, 300000) g")
    spec = _compose("source=postgres", f"source.port={pg_source.port}", "source.table=tm_many", "sink=parquet", "sink.path=/nonexistent",
                    "strategy=datadriven", "strategy.distribute_key=id", "strategy.partitions=8", "runtime=local")
    tracemalloc.start()
    try:
        plan = plan_job(spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(plan.partitions) == 8 and all(isinstance(p, KeyRange) for p in plan.partitions)
    assert [p.lower for p in plan.partitions[1:]] == [37501 + 37500 * i for i in range(7)]  # runs of equal rows
    assert peak < 8 << 20, f"planning held {peak / 1e6:.1f} MB"


# --- what a failed or cancelled run leaves ---------------------------------------------------------


def test_a_failed_duckdb_run_leaves_no_database_file_it_made(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "in" / "a.parquet")
    db = tmp_path / "new.duckdb"
    with pytest.raises(SchemaError):  # append into a table that is not there
        job({"type": "parquet", "path": str(tmp_path / "in")}, {"type": "duckdb", "database": str(db), "table": "t"}, load_mode="append")
    assert not db.exists() and not Path(f"{db}.wal").exists()


def test_a_failed_create_leaves_no_output_folder_it_made(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "in" / "a.parquet")
    (tmp_path / "in" / "b.parquet").write_bytes(b"not parquet at all")
    out = tmp_path / "out" / "made"
    with pytest.raises(SchemaError):
        job({"type": "parquet", "path": str(tmp_path / "in")}, {"type": "parquet", "path": str(out)}, "files", load_mode="create")
    assert not out.exists()


@pytest.mark.slow
def test_plugins_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`conveyor plugins | head -1` ended with 'internal error: BrokenPipeError ... please report it'."""
    proc = subprocess.run(f"set -o pipefail; {BIN / 'conveyor'} plugins | head -1", shell=True, executable="/bin/bash",
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "COLUMNS": "80"})
    assert proc.stdout.strip() == "sources:" and "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 141)


def test_progress_off_a_terminal_is_a_line_every_interval_while_a_pass_through_streams() -> None:
    """A pass-through partition reports its rows only when its COPY has counted them: the display showed
    '0 rows 0.0 MB' for a whole run, and off a terminal one line in 67 s (every 10 s promised). Bytes are
    now reported as the stream moves, rows estimated from them until counted, and lines come by the clock."""
    import io
    import time

    from conveyor.core import TaskResult
    from conveyor.runtime.progress import LogProgress

    out = io.StringIO()
    with LogProgress(1000, 2, interval=0.1, out=out, total_bytes=100_000) as shown:
        shown.started("p0")
        shown.advanced("p0", 0, 25_000)  # a quarter of the bytes streamed, no rows counted yet
        time.sleep(0.35)
        shown.advanced("p0", 260, 0)  # its COPY counted 260 rows: the estimate stands down
        shown.finished(TaskResult("p0", 0, 260))
        time.sleep(0.25)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 4, lines
    assert lines[0].startswith("progress: about 250 rows (25%), 0.0 MB") and "0/2 partitions" in lines[0]
    assert lines[-1].startswith("progress: 260 rows (26%)") and "1/2 partitions" in lines[-1]


@pytest.mark.slow
def test_a_malformed_yaml_config_is_one_line_naming_its_file_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("source:\n  type: parquet\n   path: x\n")
    res = run_cli("run", "--config-dir", str(tmp_path), "--config-name", "bad", cwd=tmp_path)
    assert res.code == 2 and "Traceback" not in res.err, res.err
    assert res.error_lines == [f"error: {tmp_path}/bad.yaml (line 3, column 8) is not valid YAML: mapping values are not allowed here"], res.err


@pytest.mark.slow
def test_a_report_or_run_folder_that_cannot_be_written_is_refused_before_anything_moves(tmp_path: Path) -> None:
    rows = tmp_path / "in"
    rows.mkdir()
    pq.write_table(pa.table({"id": [1, 2]}), rows / "a.parquet")
    out = tmp_path / "out"
    job_args = ["run", "source=parquet", f"source.path={rows}", "sink=parquet", f"sink.path={out}", "load_mode=replace", "strategy=files"]
    res = run_cli("--report", "/proc/1/no/report.json", *job_args, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert res.code == 2 and res.error_lines == ["error: --report /proc/1/no/report.json: cannot be written: No such file or directory"]
    assert not out.exists()  # refused before the load, not called a failure after it committed
    res = run_cli(*job_args, "hydra.run.dir=/proc/1/no", cwd=tmp_path)
    assert res.code == 2 and "Traceback" not in res.err
    assert res.error_lines == ["error: cannot write a file or folder the run needs: [Errno 2] No such file or directory: '/proc/1/no'"], res.err
