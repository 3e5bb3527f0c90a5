"""The tables every run into a database shares (commit markers, incremental cursors), made by two
runs at once: PostgreSQL's CREATE TABLE IF NOT EXISTS does not cover that race, and one of two jobs
started together into the same schema failed at prepare with 'type "_conveyor_commits" already
exists' (seen with two `conveyor run` started at once, each into its own table)."""

from __future__ import annotations

import threading

import psycopg
import pytest

from conveyor.connectors.postgres import commits
from tests.helpers import pg_exec


@pytest.mark.parametrize("ensure", [commits.ensure_markers, commits.ensure_cursors], ids=["markers", "cursors"])
def test_two_runs_making_the_shared_table_at_once_both_succeed(pg_target, ensure) -> None:
    rounds, errors = 15, []
    for r in range(rounds):  # a fresh schema each round: the table does not exist yet
        schema = f"shared_race_{r}"
        pg_exec(pg_target, f"DROP SCHEMA IF EXISTS {schema} CASCADE", f"CREATE SCHEMA {schema}")
        conns = [psycopg.connect(pg_target.dsn(), autocommit=True) for _ in range(2)]
        start = threading.Barrier(2, timeout=30)

        def make(con: psycopg.Connection, schema: str = schema, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                ensure(con, schema)
            except Exception as exc:  # collected: the assertion below names it
                errors.append(f"{schema}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=make, args=(c,)) for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for c in conns:
            c.close()
        assert pg_exec(pg_target, f"SELECT count(*) FROM pg_tables WHERE schemaname = '{schema}'")[0][0] == 1
        pg_exec(pg_target, f"DROP SCHEMA {schema} CASCADE")
    assert not errors, errors
