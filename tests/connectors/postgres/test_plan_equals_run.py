"""`conveyor plan` prints the path `conveyor run` takes, for every load mode and path: both come from one
decision (decide.py over the inspected target, agreed once by the job in pipelines/agree.py), so they
cannot drift. And before a row moves, the job asks the PostgreSQL sink twice: describe_target, prepare.

On the main this started from, plan asked the sink's explain_path and the run its prepare, each
deciding on its own (a routed target whose encoder is not pgpq printed routing that the run did not
take), and the job asked the sink four times (target_layout, partition_rows, explain_path, prepare).
"""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.connectors.postgres.sink import PostgresSink
from conveyor.pipelines.job import plan_job, run_job
from tests.helpers import pg_exec

pytestmark = pytest.mark.usefixtures("pg_password")


@pytest.fixture(scope="module")
def pe_src(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS pe_src",
            "CREATE TABLE pe_src AS SELECT g AS id, md5(g::text) AS v, (g % 3)::int2 AS k FROM generate_series(1, 3000) g",
            "ALTER TABLE pe_src ADD PRIMARY KEY (id)")
    return pg_source


def _spec(src, dst, table: str, mode: str, strategy: dict, **sink):
    return build_job(OmegaConf.create({"source": {"type": "postgres", "port": src.port, "table": "pe_src"},
                                       "sink": {"type": "postgres", "port": dst.port, "table": table, **sink},
                                       "strategy": strategy, "runtime": {"type": "local"}, "load_mode": mode, "degree": 2}))


def _target(dst, table: str, columns: str = "id int PRIMARY KEY, v text, k int2", partitioned: bool = False) -> None:
    pg_exec(dst, f"DROP TABLE IF EXISTS {table} CASCADE")
    if partitioned:
        pg_exec(dst, f"CREATE TABLE {table} (id int, v text, k int2) PARTITION BY LIST (k)",
                *(f"CREATE TABLE {table}_{i} PARTITION OF {table} FOR VALUES IN ({i})" for i in range(3)),
                f"CREATE INDEX ON {table} (id)")
    else:
        pg_exec(dst, f"CREATE TABLE {table} ({columns})")


ONE, SEVERAL = {"type": "none"}, {"type": "ctid", "partitions": 3}

CASES = [  # (name, load mode, strategy, sink keys, target: None (none), "plain", "partitioned", or columns)
    ("append pass-through", "append", SEVERAL, {}, "plain"),
    ("append pgpq", "append", SEVERAL, {"copy_path": "arrow"}, "plain"),
    ("append adbc", "append", SEVERAL, {"copy_path": "arrow", "writer": "adbc"}, "plain"),
    ("append cast by PostgreSQL", "append", SEVERAL, {"allow_cast": ["v"]}, "id int PRIMARY KEY, v varchar(40), k int2"),
    ("truncate in place", "truncate", ONE, {}, "plain"),
    ("truncate staged", "truncate", SEVERAL, {}, "plain"),
    ("truncate staged by choice", "truncate", ONE, {"truncate_method": "staged", "copy_path": "arrow"}, "plain"),
    ("create", "create", SEVERAL, {}, None),
    ("replace", "replace", SEVERAL, {}, "plain"),
    ("merge", "merge", SEVERAL, {"copy_path": "arrow"}, "plain"),
    ("append routed into partitions", "append", SEVERAL, {"copy_path": "arrow"}, "partitioned"),
    ("append routed by the server, adbc", "append", SEVERAL, {"copy_path": "arrow", "writer": "adbc"}, "partitioned"),
    ("append through the parent", "append", SEVERAL, {"routing": "parent"}, "partitioned"),
    ("truncate in place routed", "truncate", ONE, {"copy_path": "arrow"}, "partitioned"),
]


@pytest.mark.parametrize(("name", "mode", "strategy", "sink", "target"), CASES, ids=[c[0] for c in CASES])
def test_the_path_plan_prints_is_the_path_the_run_takes(pe_src, pg_target, name, mode, strategy, sink, target) -> None:
    table = ("pe_" + name.replace(" ", "_").replace(",", "").replace("-", "_"))[:40].lower()
    if target is None:
        pg_exec(pg_target, f"DROP TABLE IF EXISTS {table} CASCADE")
    else:
        _target(pg_target, table, **({"partitioned": True} if target == "partitioned" else {} if target == "plain" else {"columns": target}))
    planned = plan_job(_spec(pe_src, pg_target, table, mode, strategy, **sink))
    report = run_job(_spec(pe_src, pg_target, table, mode, strategy, **sink))
    assert planned.path and report.sink_plan.path == planned.path, (planned.path, report.sink_plan.path)
    assert report.sink_plan.path_reason.startswith(planned.path)
    assert report.sink_plan.native == planned.agreement.native and report.sink_plan.counting == planned.agreement.counting
    assert pg_exec(pg_target, f"SELECT count(*) FROM {table}")[0][0] == 3000


class _Asked(PostgresSink):
    """The PostgreSQL sink, with the names of what the job asks of it on the driver."""

    asked: list[str] = []

    def describe_target(self, request):  # type: ignore[no-untyped-def]
        self.asked.append("describe_target")
        return super().describe_target(request)

    def prepare(self, request):  # type: ignore[no-untyped-def]
        self.asked.append("prepare")
        return super().prepare(request)

    def write_native(self, plan, part, stream):  # type: ignore[no-untyped-def]
        self.asked.append("write_native")
        return super().write_native(plan, part, stream)


def test_before_a_row_moves_the_job_asks_the_sink_twice(pe_src, pg_target) -> None:
    _target(pg_target, "pe_asked")
    spec = _spec(pe_src, pg_target, "pe_asked", "append", SEVERAL)
    _Asked.asked = []
    run_job(dataclasses.replace(spec, sink=_Asked(spec.sink.config, spec.options)))
    assert _Asked.asked[:3] == ["describe_target", "prepare", "write_native"], _Asked.asked


def test_plan_refuses_what_the_run_would(pe_src, pg_target) -> None:
    """The target is described while planning: a plan of an append into a table that is not there, or of a
    column the target's type would change, is refused as the run is (the plan printed a path before)."""
    from conveyor.errors import SchemaError

    pg_exec(pg_target, "DROP TABLE IF EXISTS pe_missing")
    with pytest.raises(SchemaError, match="pe_missing does not exist"):
        plan_job(_spec(pe_src, pg_target, "pe_missing", "append", SEVERAL))
    _target(pg_target, "pe_narrow", columns="id int, v int, k int2")
    with pytest.raises(SchemaError, match=r"column v \(text -> integer\)"):
        plan_job(_spec(pe_src, pg_target, "pe_narrow", "append", SEVERAL))
