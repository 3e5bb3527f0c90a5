"""The job's snapshot is exported by a REPEATABLE READ, READ ONLY transaction, as the source asks.

On the main this started from, the exporting connection was not in autocommit: psycopg sent its
own BEGIN (READ COMMITTED, read-write) before the source's ``BEGIN ISOLATION LEVEL REPEATABLE READ
READ ONLY``, which the server then ignored, writing "there is already a transaction in progress"
into its log on every job. A transaction's isolation level and read-only flag are not shown to
other sessions (pg_stat_activity has neither): the test reads the server's log for that warning.
"""

from __future__ import annotations

import psycopg
import pytest

from conveyor.connectors.postgres.source import PostgresSource, PostgresSourceConfig
from conveyor.core import JobOptions
from tests.helpers import pg_exec

pytestmark = pytest.mark.usefixtures("pg_password")


def test_the_snapshot_is_exported_by_a_read_only_repeatable_read_transaction(pg_source) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS snap_src", "CREATE TABLE snap_src AS SELECT g AS id FROM generate_series(1, 10) g")
    log = pg_source.root / "log"
    seen = log.stat().st_size
    source = PostgresSource(PostgresSourceConfig(port=pg_source.port, table="snap_src"), JobOptions())
    with source.session() as shipped:
        assert shipped.snapshot_id
        # the exporting backend: idle in its transaction, which holds the snapshot
        state = pg_exec(pg_source, "SELECT state FROM pg_stat_activity WHERE application_name = 'conveyor' "
                                   "AND query = 'SELECT pg_export_snapshot()' AND pid <> pg_backend_pid()")
        assert [r[0] for r in state] == ["idle in transaction"]
        # and the snapshot reads as the tasks read it
        with psycopg.connect(pg_source.dsn(), autocommit=True) as con:
            con.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            con.execute(f"SET TRANSACTION SNAPSHOT '{shipped.snapshot_id}'")
            assert con.execute("SELECT count(*) FROM snap_src").fetchone() == (10,)
            con.execute("ROLLBACK")
    with open(log, "rb") as f:
        f.seek(seen)
        written = f.read().decode(errors="replace")
    assert "there is already a transaction in progress" not in written
