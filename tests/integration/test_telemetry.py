"""OpenTelemetry: a job is one trace (the job, its phases, a span per partition with its rows and attempts) and
its metrics (rows, bytes, partitions by status, partition seconds), in the application's providers; the
command line makes providers from OpenTelemetry's environment variables. On the main this started from there
were no traces or metrics. Each case runs in a process of its own (OpenTelemetry's global providers are set
once per process), with the SDK's in-memory exporter and reader, or its console exporter from the command
line; the jobs are real (Parquet files into a DuckDB file, three partitions, one failing in the second case)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.helpers import BIN, REPO, id_files

SCRIPT = r"""
import json, sys
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

import conveyor
folder, db, mode = sys.argv[1:4]
try:
    conveyor.run(None, "source=parquet", "sink=duckdb", "strategy=files", source={"path": folder}, sink={"database": db, "table": "t"},
                 load_mode=mode, degree=2)
    error = None
except conveyor.ConveyorError as exc:
    error = str(exc)
out = {"error": error, "spans": [{"name": s.name, "trace": s.context.trace_id, "parent": s.parent.span_id if s.parent else None,
                                  "id": s.context.span_id, "attributes": dict(s.attributes), "status": s.status.status_code.name,
                                  "start": s.start_time, "end": s.end_time} for s in spans.get_finished_spans()],
       "metrics": {m.name: [(dict(p.attributes), getattr(p, "value", None) if hasattr(p, "value") else p.count)
                            for p in m.data.data_points]
                   for rm in (reader.get_metrics_data() or type("none", (), {"resource_metrics": []})).resource_metrics
                   for sm in rm.scope_metrics for m in sm.metrics}}
print(json.dumps(out))
"""


def _files(tmp_path: Path) -> Path:
    return id_files(tmp_path / "in")


def _traced(tmp_path: Path, folder: Path, mode: str) -> dict:
    proc = subprocess.run([str(BIN / "python"), "-c", SCRIPT, str(folder), str(tmp_path / "t.duckdb"), mode], cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_job_is_one_trace_with_its_phases_and_partitions_and_its_metrics(tmp_path: Path) -> None:
    out = _traced(tmp_path, _files(tmp_path), "create")
    assert out["error"] is None
    spans = out["spans"]
    (job,) = [s for s in spans if s["name"] == "conveyor.job"]
    assert {s["trace"] for s in spans} == {job["trace"]} and all(s["parent"] == job["id"] for s in spans if s is not job)
    assert job["attributes"]["conveyor.rows"] == 300 and job["attributes"]["conveyor.sink"] == "duckdb"
    assert job["attributes"]["conveyor.status"] == "ok"
    parts = sorted((s for s in spans if s["name"] == "conveyor.partition"), key=lambda s: s["attributes"]["conveyor.partition"])
    assert [(p["attributes"]["conveyor.rows"], p["attributes"]["conveyor.status"]) for p in parts] == [(100, "ok")] * 3
    phases = [s["name"] for s in sorted(spans, key=lambda s: s["start"]) if s["name"] in
              ("conveyor.plan", "conveyor.prepare", "conveyor.tasks", "conveyor.verify", "conveyor.finalize")]
    assert phases == ["conveyor.plan", "conveyor.prepare", "conveyor.tasks", "conveyor.verify", "conveyor.finalize"]
    assert all(job["start"] <= s["start"] <= s["end"] <= job["end"] for s in spans)
    metrics = out["metrics"]
    assert sum(v for _, v in metrics["conveyor.rows"]) == 300 and metrics["conveyor.partitions"] == [[{"conveyor.status": "ok"}, 3]]
    assert metrics["conveyor.partition.duration"][0][1] == 3  # three partitions' seconds recorded


def test_a_failed_partition_and_job_carry_an_error_status(tmp_path: Path) -> None:
    """The target refuses the third file's rows (a CHECK): that partition's span and the job's are errors."""
    import duckdb

    with duckdb.connect(str(tmp_path / "t.duckdb")) as con:
        con.execute("CREATE TABLE t (id BIGINT CHECK (id < 200))")
    out = _traced(tmp_path, _files(tmp_path), "append")
    assert out["error"]
    (job,) = [s for s in out["spans"] if s["name"] == "conveyor.job"]
    assert job["status"] == "ERROR" and job["attributes"]["conveyor.status"] == "failed"
    failed = [s for s in out["spans"] if s["name"] == "conveyor.partition" and s["status"] == "ERROR"]
    assert len(failed) == 1 and failed[0]["attributes"]["conveyor.status"] == "failed"
    assert [1 for attrs, _ in out["metrics"]["conveyor.partitions"] if attrs == {"conveyor.status": "failed"}]


def test_the_command_line_exports_from_the_environment(tmp_path: Path, cli) -> None:
    folder = _files(tmp_path)
    res = cli("run", "source=parquet", f"source.path={folder}", "sink=duckdb", f"sink.database={tmp_path / 'c.duckdb'}", "sink.table=t",
              "load_mode=create", env={"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "nightly-copy"})
    assert res.code == 0, res.err
    assert '"name": "conveyor.job"' in res.out and '"service.name": "nightly-copy"' in res.out and res.out.count('"name": "conveyor.partition"') == 3
    res = cli("run", "source=parquet", f"source.path={folder}", "sink=duckdb", f"sink.database={tmp_path / 'd.duckdb'}", "sink.table=t",
              "load_mode=create", env={"OTEL_TRACES_EXPORTER": "nosuch"})
    assert res.code == 2 and "OpenTelemetry exporter 'nosuch' is not installed" in res.err
