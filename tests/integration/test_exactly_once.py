"""Exactly once and clean stops, on both runtimes, against real PostgreSQL servers and a real Ray.

Each test here failed on the main this work started from: a failing partition with others queued
hung the Ray runtime; Ctrl-C on Ray hung; a driver killed after a commit but before its manifest
line made ``resume`` load the partition again; staging tables of killed runs stayed forever;
``degree=100000`` made tens of thousands of partitions; datadriven made one partition per value.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.errors import TransferError
from conveyor.pipelines.job import run_job
from tests.helpers import BIN, checksum, ctrl_c_run, lose_manifest_lines, pg_exec, popen_run, runtime_args, wait_quiet, wait_until

RUNTIMES = ["local", "ray"]


@pytest.fixture(params=RUNTIMES)
def runtime(request) -> dict:
    """The runtime node of a job: threads in this process, or the module's real Ray instance."""
    if request.param == "ray":
        request.getfixturevalue("ray_instance")
        return {"type": "ray", "max_retries": 0}
    return {"type": "local", "max_retries": 0}


@pytest.fixture(scope="module")
def ex_src(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS ex_src",
            "CREATE TABLE ex_src AS SELECT g AS id, g % 10000 AS grp, md5(g::text) AS h FROM generate_series(1, 200000) g",
            "ANALYZE ex_src")
    return pg_source


def _job(source: dict, sink: dict, strategy: dict, runtime: dict, **options):
    cfg = OmegaConf.create({"source": source, "sink": sink, "strategy": strategy, "runtime": runtime,
                            "load_mode": "append", **options})
    return build_job(cfg)


def _bounded(fn, seconds: float):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it has not returned in time."""
    out: dict = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed back to the test
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    start = time.monotonic()
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s (hung)"
    return out, time.monotonic() - start


# --- a failing partition while others are queued ------------------------------------------------


def test_a_failing_partition_with_others_queued_ends_the_run(ex_src, pg_target, runtime) -> None:
    """8 partitions at degree 2, the third holds a value too long for the target: the run ends,
    names that partition (not one cancelled because of it), and leaves whole partitions only."""
    pg_exec(ex_src, "DROP TABLE IF EXISTS ex_fail", "CREATE TABLE ex_fail AS SELECT id, CASE WHEN id = 2500 THEN "
            "'far too long' ELSE 'ok' END AS s FROM generate_series(1, 8000) id")
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_fail_dst", "CREATE TABLE ex_fail_dst (id int, s varchar(5))")
    spec = _job({"type": "postgres", "port": ex_src.port, "table": "ex_fail"},
                {"type": "postgres", "port": pg_target.port, "table": "ex_fail_dst"},
                {"type": "ntile", "distribute_key": "id", "partitions": 8}, runtime, degree=2)
    out, _ = _bounded(lambda: run_job(spec), 120)
    err = out.get("error")
    assert isinstance(err, TransferError), out
    assert "range-00002" in err.message and "too long" in err.message
    rows = pg_exec(pg_target, "SELECT count(*) FROM ex_fail_dst")[0][0]
    assert rows % 1000 == 0 and f"their {rows:,} rows stay in the target" in err.message
    assert "resume=" in err.hint and "loaded twice" in err.hint
    # whole partitions only: every committed partition is complete
    assert pg_exec(pg_target, "SELECT count(*) FROM (SELECT (id - 1) / 1000 AS p, count(*) AS n FROM ex_fail_dst "
                              "GROUP BY 1 HAVING count(*) <> 1000) x")[0][0] == 0


# --- exactly once: commit markers ----------------------------------------------------------------


def test_resume_asks_the_target_not_the_manifest(ex_src, pg_target, cli, tmp_path: Path) -> None:
    """A driver killed between a partition's commit and its manifest line: the manifest says
    pending, the target has the rows. Resume must not load them again."""
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_marked", "CREATE TABLE ex_marked (id int, grp int, h text)")
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src", f"sink.port={pg_target.port}",
            "sink.table=ex_marked", "load_mode=append", "runtime=local", "degree=2", "strategy.partitions=6"]
    first = cli(*args)
    assert first.code == 0, first.err
    run_dir = lose_manifest_lines(tmp_path / "hydra-run")
    res = cli(*args, f"resume={run_dir}")
    assert res.code == 0, res.err
    assert "resume: 6 of 6 partitions finished" in res.err and "commit markers" in res.err
    assert checksum(pg_target, "ex_marked") == checksum(ex_src, "ex_src")


def test_a_resume_after_the_target_lost_rows_fails_verification(ex_src, pg_target, cli, tmp_path: Path) -> None:
    """A killed append's target emptied by hand before the resume: the resumed part's own counts were right, and the run
    said "verify=count: ok" with 666,899 of 1,833,101 rows missing. What the target holds in all is checked now."""
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_lost", "CREATE TABLE ex_lost (id int, grp int, h text)")
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src", f"sink.port={pg_target.port}",
            "sink.table=ex_lost", "load_mode=append", "runtime=local", "degree=2", "strategy.partitions=6"]
    assert cli(*args).code == 0
    run_dir = lose_manifest_lines(tmp_path / "hydra-run")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    for i, entry in enumerate(manifest["partitions"].values()):  # the first three finished, as a killed run's journal says
        entry.update(status="done" if i < 3 else "pending")
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    pg_exec(pg_target, "TRUNCATE ex_lost")  # the rows the first run committed, gone
    res = cli(*args, f"resume={run_dir}")
    assert res.code == 6 and "Traceback" not in res.err, res.err
    assert "fewer than the" in res.err and "this load committed into it" in res.err, res.err


@pytest.mark.parametrize("partition_by", [None, "grp"])
def test_a_resumed_file_append_replaces_its_own_files(ex_src, cli, tmp_path: Path, partition_by) -> None:
    """Files have no transaction to hold a marker: a partition written before the driver died (its
    manifest line lost) is written again by the resume, or by the dead driver's Ray task. The file
    carries the load id, so the second write replaces the first instead of adding its rows again."""
    out = tmp_path / "appended"
    args = ["run", "pipeline=postgres_to_parquet", f"source.port={ex_src.port}", "source.table=ex_src",
            f"sink.path={out}", "load_mode=append", "runtime=local", "degree=2",
            "strategy=ntile", "strategy.distribute_key=id", "strategy.partitions=4"]
    if partition_by:
        pg_exec(ex_src, "DROP TABLE IF EXISTS ex_few", "CREATE TABLE ex_few AS SELECT id, id % 3 AS grp FROM generate_series(1, 20000) id")
        args = [a.replace("source.table=ex_src", "source.table=ex_few") for a in args] + ["sink.partition_by=[grp]"]
    first = cli(*args)
    assert first.code == 0, first.err
    files = sorted(p.relative_to(out) for p in out.rglob("*.parquet"))
    run_dir = lose_manifest_lines(tmp_path / "hydra-run")
    res = cli(*args, f"resume={run_dir}")
    assert res.code == 0, res.err
    assert sorted(p.relative_to(out) for p in out.rglob("*.parquet")) == files  # the same files, none added
    import pyarrow.dataset as ds

    table = ds.dataset(out, format="parquet", partitioning="hive" if partition_by else None).to_table()
    expected = 20000 if partition_by else 200000
    assert table.num_rows == expected and len(set(table.column("id").to_pylist())) == expected


def test_a_retried_partition_that_had_committed_is_not_written_again(ex_src, pg_target) -> None:
    """The same partition written twice under one load id (a worker that died after its commit,
    retried): the second write finds the marker and writes nothing."""
    from conveyor.core import PrepareRequest, WholeSource

    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_twice", "CREATE TABLE ex_twice (id int, grp int, h text)")
    spec = _job({"type": "postgres", "port": ex_src.port, "table": "ex_src"},
                {"type": "postgres", "port": pg_target.port, "table": "ex_twice", "copy_path": "arrow"},
                {"type": "none"}, {"type": "local"})
    info = spec.source.describe()
    plan = spec.sink.prepare(PrepareRequest(schema=info.schema, info=info))
    part = WholeSource(index=0, count=1)
    try:
        first = spec.sink.write(plan, part, spec.source.read(part))
        second = spec.sink.write(plan, part, spec.source.read(part))
    finally:
        spec.sink.finalize(plan, [])
    assert (first.rows, first.already_committed) == (200000, False)
    assert (second.rows, second.already_committed) == (200000, True)
    assert pg_exec(pg_target, "SELECT count(*) FROM ex_twice")[0][0] == 200000


def _wait_for_copy(server, table: str, seconds: float = 90) -> None:
    wait_until(lambda: pg_exec(server, f"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'conveyor' "
                                       f"AND query ILIKE 'COPY%{table}%'")[0][0], f"a COPY into {table}", seconds)


def _wait_until_idle(server, seconds: float = 90) -> None:
    """Until no conveyor session is busy on the server (a killed driver's tasks have ended)."""
    wait_quiet(lambda: pg_exec(server, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'conveyor' "
                                       "AND state <> 'idle' AND pid <> pg_backend_pid()")[0][0], seconds)


@pytest.mark.parametrize("kind", RUNTIMES)
def test_driver_killed_mid_copy_then_resumed_is_exact(ex_src, pg_target, tmp_path: Path, kind: str, request) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_killed", "CREATE TABLE ex_killed (id int, grp int, h text)")
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src", f"sink.port={pg_target.port}",
            "sink.table=ex_killed", "load_mode=append", "degree=2", "strategy.partitions=8", "sink.copy_path=arrow",
            "batch_size=2000", *runtime_args(kind, request)]
    proc = popen_run(args, tmp_path, "first")
    _wait_for_copy(pg_target, "ex_killed")
    time.sleep(0.3)
    proc.kill()  # SIGKILL: no handler, no report, no manifest update
    proc.communicate(timeout=30)
    _wait_until_idle(pg_target)  # on Ray, the tasks outlive the driver: let them end as they will
    res = subprocess.run([str(BIN / "conveyor"), *args, f"resume={tmp_path}/first", f"hydra.run.dir={tmp_path}/second"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "resume:" in res.stderr
    assert checksum(pg_target, "ex_killed") == checksum(ex_src, "ex_src")  # no row lost, none twice


# --- stopping: Ctrl-C -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", RUNTIMES)
def test_one_ctrl_c_with_partitions_queued_stops_within_seconds(ex_src, pg_target, tmp_path: Path, kind: str, request) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_cancel", "CREATE TABLE ex_cancel (id int, grp int, h text)")
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src",
            f"sink.port={pg_target.port}", "sink.table=ex_cancel", "load_mode=append", "degree=1", "strategy.partitions=20",
            "sink.copy_path=arrow", "batch_size=1000", *runtime_args(kind, request)]
    report, _, took = ctrl_c_run(args, tmp_path, lambda: _wait_for_copy(pg_target, "ex_cancel"))
    committed = sum(p["rows"] for p in report["partitions"] if p["error"] is None)
    _wait_until_idle(pg_target)
    assert pg_exec(pg_target, "SELECT count(*) FROM ex_cancel")[0][0] == committed < 200000  # whole partitions only
    print(f"{kind}: Ctrl-C to exit {took:.2f} s")


def _slow_target(pg_target, table: str, every: int, seconds: float) -> None:
    """A new target ``table`` (id, grp, h) whose trigger sleeps ``seconds`` every ``every``-th row: a real, slow target."""
    pg_exec(pg_target, f"DROP TABLE IF EXISTS {table}", f"CREATE TABLE {table} (id int, grp int, h text)",
            f"CREATE OR REPLACE FUNCTION {table}_slow() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN IF NEW.id % {every} = 0 THEN PERFORM pg_sleep({seconds}); END IF; RETURN NEW; END $$",
            f"CREATE TRIGGER {table}_slow BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_slow()")


def test_a_ctrl_c_on_ray_asks_the_running_partition_to_stop_instead_of_cancelling_its_task(ex_src, pg_target, tmp_path: Path,
                                                                                          request) -> None:
    """Under Ray, Ctrl-C asks the running tasks to stop (they roll back at their next batch or before
    their commit and report it, as the local runtime's threads do) instead of ``ray.cancel``-ling
    them: a cancel that met a task's completion failed a check in Ray's core worker and ended the
    driver with exit 1 and a C++ stack trace (``Tried to complete task that was not pending``;
    test_a_truncate_in_one_transaction_stopped_mid_copy_leaves_the_old_rows[ctrl-c-ray] failed so
    once here). A trigger makes each partition's COPY take ~5 s, so the stop finds one running. On
    the main this started from, that partition came back as its killed worker's (0 s, cancelled
    "before it finished"); now it is its own account (its seconds, rolled back) or, had its commit
    been sealed first, committed."""
    _slow_target(pg_target, "ex_ask", every=100, seconds=0.05)
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src",
            f"sink.port={pg_target.port}", "sink.table=ex_ask", "load_mode=append", "degree=1", "strategy.partitions=20",
            "sink.copy_path=arrow", "batch_size=1000", *runtime_args("ray", request)]
    report, _, took = ctrl_c_run(args, tmp_path, lambda: _wait_for_copy(pg_target, "ex_ask"))
    stopped = [p for p in report["partitions"] if p["error"] is not None and "not started" not in p["error"]]
    assert all(p["seconds"] > 0 and "killed" not in p["error"] for p in stopped), stopped  # each its own account
    committed = sum(p["rows"] for p in report["partitions"] if p["error"] is None)
    assert len(stopped) + (committed > 0) >= 1, report["partitions"]  # the running one stopped itself, or committed
    _wait_until_idle(pg_target)
    assert pg_exec(pg_target, "SELECT count(*) FROM ex_ask")[0][0] == committed < 200000  # whole partitions only
    assert took < 15, f"Ctrl-C took {took:.1f} s"


@pytest.mark.parametrize("kind", RUNTIMES)
def test_one_ctrl_c_on_the_pass_through_with_partitions_queued_keeps_whole_partitions(ex_src, pg_target, tmp_path: Path, kind: str,
                                                                                    request) -> None:
    """The same stop on the pass-through (psql's stream relayed, each partition checked against its
    COPY's count before its commit). A trigger on the target sleeps every 1000th row (a real, slow
    target), so Ctrl-C comes while partitions are still queued."""
    _slow_target(pg_target, "ex_cancel_pt", every=1000, seconds=0.02)
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src",
            f"sink.port={pg_target.port}", "sink.table=ex_cancel_pt", "load_mode=append", "degree=1", "strategy.partitions=20",
            "sink.copy_path=passthrough", *runtime_args(kind, request)]
    report, _, took = ctrl_c_run(args, tmp_path, lambda: _wait_for_copy(pg_target, "ex_cancel_pt"))
    assert report["path"].startswith("pass-through")
    committed = sum(p["rows"] for p in report["partitions"] if p["error"] is None)
    _wait_until_idle(pg_target)
    assert pg_exec(pg_target, "SELECT count(*) FROM ex_cancel_pt")[0][0] == committed < 200000  # whole partitions only
    print(f"{kind}: Ctrl-C to exit {took:.2f} s")


def test_sigterm_on_ray_workers_whose_stop_takes_seconds_exits_130_with_its_report(ex_src, pg_target, tmp_path: Path, request) -> None:
    """SIGTERM to a driver whose tasks run on Ray workers: Ray's driver put absl's failure handler in front of
    SIGTERM, which armed a 3 s alarm that aborted the process (exit 134, no report.json) when the stop took
    longer; here each relayed 1 MiB chunk takes seconds into a slow target, so it does. Ray's stack lines for
    the signal are not printed either."""
    _slow_target(pg_target, "ex_term", every=100, seconds=0.03)
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src", f"sink.port={pg_target.port}",
            "sink.table=ex_term", "load_mode=append", "degree=2", "strategy.partitions=4", "sink.copy_path=passthrough",
            *runtime_args("ray", request)]
    report, err, took = ctrl_c_run(args, tmp_path, lambda: _wait_for_copy(pg_target, "ex_term"), sig=signal.SIGTERM)
    assert took > 3, f"the stop took {took:.1f} s: too short to show the alarm's abort"
    assert "SIGTERM received" not in err and "PC: @" not in err, err
    _wait_until_idle(pg_target)
    committed = sum(p["rows"] for p in report["partitions"] if p["error"] is None)
    assert pg_exec(pg_target, "SELECT count(*) FROM ex_term")[0][0] == committed < 200000


@pytest.mark.parametrize("kind", RUNTIMES)
def test_a_second_ctrl_c_ends_the_process_at_once(ex_src, pg_target, tmp_path: Path, kind: str, request) -> None:
    """The first Ctrl-C asks the running partition to stop, which it does at its next batch: here that
    takes seconds (a source view that makes each batch of rows take ~8 s: 0.5 ms a row, in the native
    reader's call); the second ends the process at once, by SIGINT's own action, however busy its main
    thread is in Ray or a driver's native call. On the main this started from, the second one's Python
    handler waited for the main thread to come back to the interpreter."""
    pg_exec(ex_src, "CREATE OR REPLACE FUNCTION ex_slow_row(i int) RETURNS int LANGUAGE plpgsql AS "
                    "$$ BEGIN IF i % 100 = 0 THEN PERFORM pg_sleep(0.05); END IF; RETURN i; END $$",
            "CREATE OR REPLACE VIEW ex_slow AS SELECT ex_slow_row(id) AS id, grp, h FROM ex_src")
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_twice_c", "CREATE TABLE ex_twice_c (id int, grp int, h text)")
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_slow", f"sink.port={pg_target.port}",
            "sink.table=ex_twice_c", "load_mode=append", "degree=1", "strategy=none", "sink.copy_path=arrow",
            *runtime_args(kind, request)]
    proc = popen_run(args, tmp_path, "run")
    wait_until(lambda: pg_exec(ex_src, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%ex_slow%' "
                                       "AND state = 'active' AND pid <> pg_backend_pid()")[0][0] > 0, "the read of ex_slow", 120)
    time.sleep(1.0)  # the read is under way (its first batch takes seconds)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert proc.poll() is None, "the run stopped within 0.5 s: nothing left for a second Ctrl-C to cut short"
    second = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - second < 1.5 and proc.returncode == -signal.SIGINT, (time.monotonic() - second, proc.returncode, err)
    assert "again to quit at once" in err and "Traceback" not in err
    # a Ray worker of the killed driver reads on until Ray ends the driver's job (tens of seconds): its sessions are ended here
    for server in (ex_src, pg_target):
        pg_exec(server, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'conveyor' "
                        "AND pid <> pg_backend_pid()")
    _wait_until_idle(pg_target)
    assert pg_exec(pg_target, "SELECT count(*) FROM ex_twice_c")[0][0] == 0  # its one partition never committed


@pytest.mark.parametrize("kind", RUNTIMES)
def test_ctrl_c_during_a_merge_leaves_the_target_as_it_was(ex_src, pg_target, tmp_path: Path, kind: str, request) -> None:
    """load_mode=merge stages every partition first: a Ctrl-C with partitions queued changes no row of
    the target and leaves no staging table once the stopped tasks have ended."""
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_merge", "CREATE TABLE ex_merge (id int PRIMARY KEY, grp int, h text)",
            "INSERT INTO ex_merge SELECT g, 0, 'old' FROM generate_series(1, 5000) g")
    before = checksum(pg_target, "ex_merge")
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src", f"sink.port={pg_target.port}",
            "sink.table=ex_merge", "load_mode=merge", "degree=1", "strategy.partitions=20", "sink.copy_path=arrow",
            "batch_size=1000", *runtime_args(kind, request)]
    proc = popen_run(args, tmp_path, "run")
    _wait_for_copy(pg_target, "_conveyor_stage")
    _ctrl_c_left_the_target_as_it_was(proc)
    _wait_until_idle(pg_target)
    assert checksum(pg_target, "ex_merge") == before
    assert pg_exec(pg_target, "SELECT count(*) FROM pg_class WHERE relname LIKE '\\_conveyor\\_stage\\_%'") == [(0,)]


@pytest.mark.parametrize("kind", RUNTIMES)
@pytest.mark.parametrize("stop", ["ctrl-c", "kill"])
def test_a_truncate_in_one_transaction_stopped_mid_copy_leaves_the_old_rows(ex_src, pg_target, tmp_path: Path, kind: str,
                                                                           stop: str, request) -> None:
    """One partition, truncate: TRUNCATE and COPY run in one transaction. Stopped mid-COPY (Ctrl-C, or
    the driver SIGKILLed while a Ray worker goes on writing), the target holds the old rows or, where
    the partition had sealed its commit before the stop reached it, exactly the new ones, and a
    Ctrl-C's message says which (before the stop lock, a Ray task committed after the driver had
    said "the target is as it was")."""
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_inplace", "CREATE TABLE ex_inplace (id int, grp int, h text)",
            "INSERT INTO ex_inplace SELECT g, 0, 'old' FROM generate_series(1, 500) g")
    before, source = checksum(pg_target, "ex_inplace"), checksum(ex_src, "ex_src")
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src", f"sink.port={pg_target.port}",
            "sink.table=ex_inplace", "load_mode=truncate", "strategy=none", "degree=1", "sink.copy_path=arrow",
            "batch_size=200", *runtime_args(kind, request)]
    proc = popen_run(args, tmp_path, "run")
    _wait_for_copy(pg_target, "ex_inplace")
    if stop == "kill":
        proc.kill()
        proc.communicate(timeout=60)
        _wait_until_idle(pg_target)
        assert checksum(pg_target, "ex_inplace") in (before, source)  # never part of it, never twice
        return
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    _wait_until_idle(pg_target)
    if "error: cancelled: the target is as it was" in err:
        assert checksum(pg_target, "ex_inplace") == before
    else:  # the one partition had sealed its commit before the stop reached it: said so, and whole
        assert "error: cancelled: the load had committed before it stopped: the target holds its 200,000 new rows" in err, err
        assert checksum(pg_target, "ex_inplace") == source


def _ctrl_c_left_the_target_as_it_was(proc: subprocess.Popen) -> None:
    """Ctrl-C to a running job: exit 130, one line saying the target is as it was, no traceback."""
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "error: cancelled: the target is as it was" in err


def test_a_second_ctrl_c_quits_at_once_without_a_traceback(ex_src, pg_target, tmp_path: Path) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_cancel2", "CREATE TABLE ex_cancel2 (id int, grp int, h text)")
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src", f"sink.port={pg_target.port}",
            "sink.table=ex_cancel2", "load_mode=append", "degree=1", "strategy.partitions=20", "sink.copy_path=arrow",
            "batch_size=1000", "runtime=local"]
    proc = popen_run(args, tmp_path, "run")
    _wait_for_copy(pg_target, "ex_cancel2")
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    # two signals sent back to back: Python may run its handler once for both (the run stops as for one Ctrl-C: exit
    # 130), or between them, and then the second ends the process by SIGINT's default action, as documented (a shell
    # says 130; Popen says -2). Either way at once, and no traceback.
    assert proc.returncode in (130, -signal.SIGINT) and "Traceback" not in err, err


def test_ctrl_c_during_plan_is_one_line(ex_src, tmp_path: Path) -> None:
    """`conveyor plan` of a slow plan (ntile over a large key) interrupted: exit 130, no traceback.
    The interrupt goes once a planning query runs on the server (the key's statistics, then the
    ntile: the first takes about 11 s here, so the test does not wait for the second), not after a
    fixed sleep."""
    proc = subprocess.Popen([str(BIN / "conveyor"), "plan", "pipeline=pg_to_pg", f"source.port={ex_src.port}",
                             "source.table=null", "source.query='SELECT g AS id FROM generate_series(1, 100000000) g'", "sink.table=x",
                             "load_mode=create",  # a plan describes the target too: x is not there
                             "strategy=ntile", "strategy.distribute_key=id", "strategy.partitions=4"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as from a terminal: a test run started in the background (nohup, `&`) hands its
                            # children an ignored SIGINT, and Python then never raises KeyboardInterrupt
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    running = ("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%_conveyor_q%' AND query LIKE '%100000000%' AND state = 'active' "
               "AND pid <> pg_backend_pid()")
    deadline = time.monotonic() + 60
    try:
        while proc.poll() is None and time.monotonic() < deadline and not pg_exec(ex_src, running)[0][0]:
            time.sleep(0.1)
        assert proc.poll() is None, "the plan ended before its query was seen running"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert "cancelled" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        pg_exec(ex_src, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%generate_series(1, 100000000)%' "
                        "AND pid <> pg_backend_pid()")


# --- leftovers of killed runs -------------------------------------------------------------------------


def test_a_killed_staged_run_leaves_a_labelled_stage_that_the_next_run_removes(ex_src, pg_target, tmp_path: Path, cli) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_stage", "CREATE TABLE ex_stage (id int, grp int, h text)",
            "INSERT INTO ex_stage VALUES (-1, -1, 'old')")
    for (name,) in pg_exec(pg_target, "SELECT relname FROM pg_class WHERE relname LIKE '\\_conveyor\\_stage%' AND relkind = 'r'"):
        pg_exec(pg_target, f'DROP TABLE "{name}"')
    args = ["run", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src", f"sink.port={pg_target.port}",
            "sink.table=ex_stage", "load_mode=truncate", "degree=1", "strategy.partitions=20", "sink.copy_path=arrow",
            "batch_size=1000", "runtime=local"]
    proc = popen_run(args, tmp_path, "killed")
    _wait_for_copy(pg_target, "_conveyor_stage")
    proc.kill()
    proc.communicate(timeout=30)
    _wait_until_idle(pg_target)
    stages = pg_exec(pg_target, "SELECT relname, obj_description(oid, 'pg_class') FROM pg_class "
                                "WHERE relname LIKE '\\_conveyor\\_stage%' AND relkind = 'r'")
    assert len(stages) == 1
    note = json.loads(stages[0][1])
    assert note["target"] == "public.ex_stage" and note["run_id"] in stages[0][0] and note["started"]
    assert pg_exec(pg_target, "SELECT h FROM ex_stage") == [("old",)]  # the target as it was
    listed = subprocess.run([str(BIN / "conveyor"), "clean", "sink=postgres", f"sink.port={pg_target.port}", "sink.table=x"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert listed.returncode == 0 and stages[0][0] in listed.stdout and "stale (its run is gone)" in listed.stdout
    res = cli(*args)
    assert res.code == 0, res.err
    assert f"warning: removed a staging table left by a run that is gone: public.{stages[0][0]}" in res.err
    assert pg_exec(pg_target, "SELECT count(*) FROM pg_class WHERE relname LIKE '\\_conveyor\\_stage%' AND relkind = 'r'") == [(0,)]
    assert checksum(pg_target, "ex_stage") == checksum(ex_src, "ex_src")


def test_clean_keeps_the_stage_of_a_running_job(pg_target, tmp_path: Path) -> None:
    """A stage whose run still holds its guard lock is in use: listed as such, never dropped."""
    import psycopg

    from conveyor.connectors.postgres.commits import guard_key_sql

    pg_exec(pg_target, "DROP TABLE IF EXISTS _conveyor_stage_aaaaaaaaaaaa", "CREATE TABLE _conveyor_stage_aaaaaaaaaaaa (x int)")
    with psycopg.connect(pg_target.dsn(), autocommit=True) as holder:  # stands in for the running job's driver
        holder.execute(f"SELECT pg_advisory_lock({guard_key_sql('%s')})", ["aaaaaaaaaaaa"])
        res = subprocess.run([str(BIN / "conveyor"), "clean", "--drop", "sink=postgres", f"sink.port={pg_target.port}",
                              "sink.table=x"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert "kept (in use)" in res.stdout and "in use by a running job" in res.stdout
        assert pg_exec(pg_target, "SELECT count(*) FROM pg_class WHERE relname = '_conveyor_stage_aaaaaaaaaaaa'") == [(1,)]
    res = subprocess.run([str(BIN / "conveyor"), "clean", "--drop", "sink=postgres", f"sink.port={pg_target.port}", "sink.table=x"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "dropped public._conveyor_stage_aaaaaaaaaaaa" in res.stdout
    assert pg_exec(pg_target, "SELECT count(*) FROM pg_class WHERE relname = '_conveyor_stage_aaaaaaaaaaaa'") == [(0,)]


# --- inputs that run away ----------------------------------------------------------------------------


def test_a_huge_degree_is_bounded_and_says_so(ex_src, pg_target, runtime, capsys) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_degree", "CREATE TABLE ex_degree (id int, grp int, h text)")
    spec = _job({"type": "postgres", "port": ex_src.port, "table": "ex_src"},
                {"type": "postgres", "port": pg_target.port, "table": "ex_degree"},
                {"type": "ctid"}, runtime, degree=100000)
    out, took = _bounded(lambda: run_job(spec), 300)
    assert "error" not in out, out.get("error")
    report = out["value"]
    size = pg_exec(ex_src, "SELECT pg_table_size('ex_src')")[0][0]
    assert 1 <= len(report.results) <= max(16, size // (4 << 20))  # 16: the bound's floor for small tables
    err = capsys.readouterr().err
    assert "warning: strategy=ctid:" in err and "instead of 100000 (degree=100000)" in err
    assert "warning: degree=100000 capped to" in err
    assert checksum(pg_target, "ex_degree") == checksum(ex_src, "ex_src")
    print(f"{runtime['type']}: degree=100000 -> {len(report.results)} partitions, {took:.2f} s")


def test_datadriven_with_10000_values_is_packed_and_balanced(ex_src, pg_target, runtime) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_dd", "CREATE TABLE ex_dd (id int, grp int, h text)")
    spec = _job({"type": "postgres", "port": ex_src.port, "table": "ex_src"},
                {"type": "postgres", "port": pg_target.port, "table": "ex_dd"},
                {"type": "datadriven", "distribute_key": "grp"}, runtime, degree=2)
    out, took = _bounded(lambda: run_job(spec), 300)
    assert "error" not in out, out.get("error")
    report = out["value"]
    assert 2 <= len(report.results) <= 8  # at most 4 x degree (fewer for a small table), not one per value
    rows = [r.rows for r in report.results]
    assert max(rows) - min(rows) <= 20 * 2  # balanced by row counts (20 rows per value)
    assert checksum(pg_target, "ex_dd") == checksum(ex_src, "ex_src")
    print(f"{runtime['type']}: datadriven 10,000 values -> {len(report.results)} partitions, {took:.2f} s")


def test_datadriven_query_values_are_packed_into_value_sets(ex_src, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS ex_ddq", "CREATE TABLE ex_ddq (id int, grp int, h text)")
    spec = _job({"type": "postgres", "port": ex_src.port, "table": "ex_src"},
                {"type": "postgres", "port": pg_target.port, "table": "ex_ddq"},
                {"type": "datadriven", "distribute_key": "grp", "datadriven_query": "SELECT g FROM generate_series(0, 4999) g",
                 "partitions": 5}, {"type": "local"}, degree=2)
    report = run_job(spec)
    assert len(report.results) == 5
    assert pg_exec(pg_target, "SELECT count(*), count(DISTINCT grp), max(grp) FROM ex_ddq")[0] == (100000, 5000, 4999)


def test_plan_of_many_partitions_is_summarised_and_quick(ex_src, cli) -> None:
    start = time.monotonic()
    res = cli("plan", "pipeline=pg_to_pg", f"source.port={ex_src.port}", "source.table=ex_src", "sink.table=x", "load_mode=create",
              "strategy=datadriven", "strategy.distribute_key=id", "strategy.partitions=500")
    assert res.code == 0, res.err
    assert time.monotonic() - start < 60
    assert "500 partition(s)" in res.out and "480 more (range-00020 .. range-00499)" in res.out
    assert "range-00021" not in res.out


def test_planning_reads_the_jobs_snapshot(ex_src) -> None:
    """A value inserted after the snapshot was exported is in no partition's plan, so planning,
    reading and verification agree (before, planning read the table as it was at that moment)."""
    from conveyor.core import PlanRequest

    pg_exec(ex_src, "DROP TABLE IF EXISTS ex_snap", "CREATE TABLE ex_snap AS SELECT g AS k FROM generate_series(1, 5) g")
    spec = _job({"type": "postgres", "port": ex_src.port, "table": "ex_snap"}, {"type": "parquet", "path": "unused"},
                {"type": "datadriven", "distribute_key": "k"}, {"type": "local"}, degree=4)
    info = spec.source.describe()
    with spec.source.session() as source:
        pg_exec(ex_src, "INSERT INTO ex_snap VALUES (6)")
        parts = spec.strategy.plan(PlanRequest(source=source, info=info, degree=4)).partitions
    planned = sorted(v for p in parts for v in getattr(p, "values", ()))
    assert planned == [1, 2, 3, 4, 5]
