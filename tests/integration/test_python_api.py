"""conveyor.run / conveyor.plan from Python, as a notebook or an orchestrator calls them: a pipeline's name,
the command line's overrides and nested keywords; the report back as an object; two jobs in one process, one
from a thread; a failure raised as its ConveyorError with the report, never SystemExit; no signal handler taken.
On the main this started from there was no public API (conveyor.submit.compose and conveyor.pipelines.run.run
worked but were undocumented). Real jobs: Parquet files into DuckDB files, and PostgreSQL into Parquet."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import conveyor
from conveyor.errors import ConfigError, SchemaError
from tests.helpers import pg_exec


@pytest.fixture
def files(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"id": pa.array(range(i * 500, i * 500 + 500), pa.int64()), "v": [f"v{j}" for j in range(500)]}),
                       folder / f"p{i}.parquet")
    return folder


def test_the_exported_surface_is_what_the_docs_promise() -> None:
    assert sorted(conveyor.__all__) == sorted(["run", "plan", "compose", "ConveyorError", "__version__"])
    assert all(getattr(conveyor, name) is not None for name in conveyor.__all__)
    assert issubclass(ConfigError, conveyor.ConveyorError) and issubclass(SchemaError, conveyor.ConveyorError)


def test_two_jobs_in_one_process_and_one_from_a_thread_keep_the_signal_handlers(files: Path, tmp_path: Path) -> None:
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    db = tmp_path / "t.duckdb"
    first = conveyor.run(None, "source=parquet", "sink=duckdb", source={"path": str(files)}, sink={"database": str(db), "table": "t"},
                         load_mode="create", run_dir=tmp_path / "run1")
    assert first.ok and first.rows == 1000 and len(first.results) == 2 and first.verification.ok
    saved = json.loads((tmp_path / "run1" / "report.json").read_text())
    assert saved["status"] == "succeeded" and saved["conveyor_version"] == conveyor.__version__
    assert saved["started_at"] <= saved["ended_at"] and saved["ended_at"].endswith("Z")  # ISO 8601 in UTC: they sort as times
    # the same job again, appending, from a thread (as an orchestrator's worker runs it)
    out: dict = {}
    worker = threading.Thread(target=lambda: out.update(report=conveyor.run(
        None, "source=parquet", "sink=duckdb", f"source.path={files}", f"sink.database={db}", "sink.table=t", "load_mode=append")))
    worker.start()
    worker.join(120)
    assert out["report"].rows == 1000
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*), count(DISTINCT id) FROM t").fetchone() == (2000, 1000)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def test_a_failure_is_its_conveyor_error_with_the_report_never_system_exit(files: Path, tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE t (id BIGINT)")
    with pytest.raises(SchemaError, match="source columns with no target column: v") as caught:
        conveyor.run(None, "source=parquet", "sink=duckdb", source={"path": str(files)}, sink={"database": str(db), "table": "t"})
    assert caught.value.exit_code == SchemaError.exit_code and caught.value.report.rows == 0  # it stopped at the prepare: planned
    assert len(caught.value.report.plan.partitions) == 2
    with pytest.raises(ConfigError, match="load_mode") as caught:
        conveyor.run(None, "source=parquet", "sink=duckdb", load_mode="upsert", source={"path": str(files)}, sink={"database": str(db)})
    assert caught.value.report is None  # refused before anything was planned (docs/python-api.md says so)


def test_a_plan_prints_as_conveyor_plan_does(files: Path, tmp_path: Path) -> None:
    """conveyor.plan returned a dataclass whose printed form was its whole repr (every partition, the spec, the schema)."""
    made = conveyor.plan(None, "source=parquet", "sink=duckdb", "strategy=files", source={"path": str(files)},
                         sink={"database": str(tmp_path / "t.duckdb"), "table": "t"})
    text = str(made)
    assert text.startswith("parquet") and "2 partition(s), strategy=files" in " ".join(text.split()), text
    assert "p0.parquet" in text and "p1.parquet" in text and "partition" in text
    assert repr(made).startswith("<JobPlan ") and "2 partition(s)" in repr(made) and len(repr(made)) < 300


def test_plan_and_a_keyword_node_of_another_type(pg_source, pg_password, tmp_path: Path) -> None:
    """A pipeline's source replaced by a keyword node of another type: its keys are the new plugin's."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS api_src", "CREATE TABLE api_src AS SELECT g AS id FROM generate_series(1, 3000) g")
    made = conveyor.plan("postgres_to_parquet", source={"port": pg_source.port, "table": "api_src"}, sink={"path": str(tmp_path / "o")},
                         strategy={"type": "ctid", "partitions": 3})
    assert len(made.partitions) == 3 and not (tmp_path / "o").exists()
    report = conveyor.run("duckdb_to_parquet", source={"type": "postgres", "port": pg_source.port, "table": "api_src"},
                          sink={"path": str(tmp_path / "o")}, load_mode="create")
    assert report.rows == 3000
