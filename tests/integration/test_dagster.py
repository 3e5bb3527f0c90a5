"""The Dagster integration against the real library: a copied table as an asset, materialized in-process by
dagster.materialize (a real Dagster run, its event log, its metadata), a failing job failing its step with
Conveyor's message. On the main this started from there was no orchestrator integration. The jobs are real:
Parquet files into a DuckDB file."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import duckdb
import pytest

from conveyor.dagster import ConveyorResource, conveyor_asset
from tests.helpers import id_files


@pytest.fixture
def files(tmp_path: Path) -> Path:
    return id_files(tmp_path / "in")


def test_an_asset_materializes_a_copy_with_its_report_as_metadata(files: Path, tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    asset = conveyor_asset("orders_copy", None, "source=parquet", "sink=duckdb", "strategy=files", source={"path": str(files)},
                           sink={"database": str(db), "table": "t"}, load_mode="replace", degree=2, group_name="copies")
    result = dg.materialize([asset], resources={"conveyor": ConveyorResource(run_dir=str(tmp_path / "runs"))})
    assert result.success
    (event,) = result.get_asset_materialization_events()
    meta = event.materialization.metadata
    assert meta["rows"].value == 300 and meta["partitions"].value == 3 and meta["verification"].value["ok"] is True
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM t").fetchone()[0] == 300
    assert list((tmp_path / "runs").glob("*orders_copy/report.json"))  # the run's report kept per Dagster run


def test_a_failing_job_fails_its_step_with_conveyors_message(files: Path, tmp_path: Path) -> None:
    asset = conveyor_asset("broken", None, "source=parquet", "sink=duckdb", source={"path": str(tmp_path / "missing")},
                           sink={"database": str(tmp_path / "x.duckdb"), "table": "t"})
    result = dg.materialize([asset], resources={"conveyor": ConveyorResource()}, raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert "no such file or folder" in failure.message and "hint:" in failure.message
