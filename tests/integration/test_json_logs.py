"""--log-format json (or CONVEYOR_LOG_FORMAT=json): every line the CLI writes on stderr is one JSON object, for
log shippers; a run ends with a summary event, an error is one object with its hint and exit code, and
progress lines carry their numbers. On the main this started from, stderr was text only. The job is real:
Parquet files into a DuckDB database file, in a subprocess of the installed `conveyor` command."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.log import set_format
from conveyor.runtime.progress import LogProgress


def _objects(stderr: str) -> list[dict]:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert lines, "nothing on stderr"
    return [json.loads(x) for x in lines]  # each line is one JSON object, or this fails naming it


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_run_writes_json_lines_and_a_summary_event(tmp_path: Path, cli, how: str) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": list(range(1000)), "v": [str(i) for i in range(1000)]}), tmp_path / "in" / "a.parquet")
    args = ["run", "source=parquet", f"source.path={tmp_path / 'in'}", "sink=duckdb", f"sink.database={tmp_path / 'out.duckdb'}",
            "sink.table=t", "load_mode=create"]
    res = cli(*args, "--log-format", "json") if how == "flag" else cli(*args, env={"CONVEYOR_LOG_FORMAT": "json"})
    assert res.code == 0, res.err
    objects = _objects(res.err)
    assert all({"time", "level", "message"} <= set(o) for o in objects)
    summary = [o for o in objects if o.get("event") == "summary"]
    assert len(summary) == 1 and summary[0]["rows"] == 1000 and summary[0]["status"] == "ok" and summary[0]["verification"]["ok"] is True
    assert res.out.strip() == ""  # no table on stdout: the summary is the event


def test_an_error_is_one_json_object_with_its_hint_and_exit_code(tmp_path: Path, cli) -> None:
    res = cli("run", "source=parquet", f"source.path={tmp_path / 'missing'}", "sink=duckdb", f"sink.database={tmp_path / 'x.duckdb'}",
              "sink.table=t", "--log-format=json")
    assert res.code == 2
    errors = [o for o in _objects(res.err) if o["level"] == "error"]
    assert len(errors) == 1 and errors[0]["exit_code"] == 2 and "no such file" in errors[0]["message"] and errors[0]["hint"]
    res = cli("run", "--log-format", "yaml")
    assert res.code == 2 and "--log-format: 'yaml' is not text or json" in res.err


def test_progress_lines_carry_their_numbers(monkeypatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    set_format("json")
    try:
        progress = LogProgress(total_rows=100, partitions=2)
        progress.started("p0")
        progress.advanced("p0", 40, 4000)
        progress.line()
    finally:
        set_format("text")
    (obj,) = _objects(out.getvalue())
    assert obj["event"] == "progress" and obj["rows"] == 40 and obj["rows_total"] == 100 and obj["partitions"] == 2
    assert obj["message"].startswith("progress: 40 rows (40%)") and " rows/s, " in obj["message"] and " MB/s" in obj["message"]
