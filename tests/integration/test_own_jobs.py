"""A user's own job as YAML in their own folder: `conveyor init` writes it from a pipeline and overrides, and
`conveyor run --config-dir <folder> --config-name <name>` runs it (keys still overridable after). On the main this
started from nothing wrote such a file and the README did not say how to keep one. Real runs: PostgreSQL into
Parquet, in subprocesses of the installed command."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pytest

from tests.helpers import PG_PASSWORD, pg_exec

pytestmark = pytest.mark.usefixtures("pg_password")


def test_init_writes_a_job_that_runs_by_name_and_takes_overrides(pg_source, tmp_path: Path, cli) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS own_src", "CREATE TABLE own_src AS SELECT g AS id, 'v' || g AS v FROM generate_series(1, 2500) g")
    res = cli("init", "jobs/nightly.yaml", "pipeline=postgres_to_parquet", f"source.port={pg_source.port}", "source.table=own_src",
              "sink.path=out/own", "load_mode=replace", cwd=tmp_path)
    assert res.code == 0, res.err
    assert "conveyor run --config-dir jobs --config-name nightly" in res.out
    text = (tmp_path / "jobs" / "nightly.yaml").read_text()
    assert "override /source: postgres" in text and "override /sink: parquet" in text
    assert "password_env: PGPASSWORD" in text and PG_PASSWORD not in text  # where the password comes from, never it
    res = cli("run", "--config-dir", "jobs", "--config-name", "nightly", cwd=tmp_path)
    assert res.code == 0, res.err
    assert ds.dataset(tmp_path / "out" / "own").count_rows() == 2500
    res = cli("run", "--config-dir", "jobs", "--config-name", "nightly", "sink.path=out/other", "degree=2", cwd=tmp_path)
    assert res.code == 0, res.err
    assert ds.dataset(tmp_path / "out" / "other").count_rows() == 2500
    res = cli("init", "jobs/nightly.yaml", "pipeline=postgres_to_parquet", cwd=tmp_path)
    assert res.code == 2 and "jobs/nightly.yaml exists" in res.err and "--force" in res.err
