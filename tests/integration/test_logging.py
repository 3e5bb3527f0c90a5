"""The run's decisions go through `logging` into the run directory's conveyor.log; --verbose shows them."""

from __future__ import annotations

import re

import pytest

from tests.helpers import pg_exec


@pytest.fixture
def log_tables(pg_source, pg_target):
    pg_exec(pg_source, "DROP TABLE IF EXISTS log_src", "CREATE TABLE log_src AS SELECT g AS id, md5(g::text) AS h FROM generate_series(1, 20000) g")
    # rows above 15,000 break the target's constraint: the last rangeid partition fails, fatally
    pg_exec(pg_target, "DROP TABLE IF EXISTS log_dst", "CREATE TABLE log_dst (id int CHECK (id <= 15000), h text)")


@pytest.mark.parametrize("runtime", ["local", "ray"])
def test_the_runs_decisions_and_a_failed_tasks_account_are_in_its_log(cli, pg_source, pg_target, log_tables, tmp_path, runtime) -> None:
    res = cli("run", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=log_src", f"sink.port={pg_target.port}",
              "sink.table=log_dst", "load_mode=append", "strategy=rangeid", "strategy.distribute_key=id", "strategy.partitions=4",
              f"runtime={runtime}", "degree=2", timeout=300)
    assert res.code == 5, res.out + res.err
    log = (tmp_path / "hydra-run" / "conveyor.log").read_text()
    # the plan, the path the sink chose, and every partition's outcome with where it ran
    assert re.search(r"\[conveyor\]\[INFO\] - plan: .*4 partition\(s\), strategy=rangeid, degree=2", log), log
    assert re.search(r"\[INFO\] - path: ", log), log
    outcomes = re.findall(r"- partition (\S+): (?:[\d,]+ rows in|failed:|cancelled:)[^\n]*attempts \d+", log)
    assert sorted(outcomes) == [f"range-0000{i}" for i in range(4)], log
    failed = re.search(r"- partition (\S+): failed: .*check constraint.*attempts 1; ran on (\S+) pid (\d+); attempt 1 failed \(fatal\)", log)
    assert failed, log
    # the failed task's traceback, carried back from the process that ran it
    assert f"partition {failed.group(1)}: the task's traceback:\nTraceback (most recent call last):" in log
    pids = {int(p) for p in re.findall(r"; ran on \S+ pid (\d+)", log)}
    driver_pids = {int(p) for p in re.findall(r"driver pid (\d+)", log)}
    if runtime == "ray":  # the tasks ran in Ray's worker processes, and their account reached the driver's log
        assert driver_pids and not pids & driver_pids, (pids, driver_pids)
    else:
        assert pids == driver_pids, (pids, driver_pids)
    # the terminal shows the error, not the log's notes, nor Ray's note that it chose token authentication
    # for Conveyor's own instance (the choice stands: the instance listens on this machine's address)
    assert "plan: " not in res.err and "check constraint" in res.err
    assert "Token authentication is enabled" not in res.out + res.err


def test_verbose_shows_the_notes_on_stderr(cli, pg_source, pg_target, log_tables) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS log_all", "CREATE TABLE log_all (id int, h text)")
    res = cli("run", "-v", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=log_src", f"sink.port={pg_target.port}",
              "sink.table=log_all", "load_mode=append", "strategy=none", "runtime=local", timeout=300)
    assert res.code == 0, res.out + res.err
    assert re.search(r"^plan: .*1 partition\(s\), strategy=none", res.err, re.M), res.err
    assert re.search(r"^partition \S+: 20,000 rows in .*; ran on ", res.err, re.M), res.err
