"""ADBC connections of one job share one database object (ADBC reads the server's type catalogue
once per database object); the templates that make this possible are bounded and closed."""

from __future__ import annotations

import pytest

from conveyor.connectors.postgres import common
from conveyor.connectors.postgres.common import PgConnConfig, adbc_connect, close_adbc_templates
from tests.helpers import pg_exec


def _idle_conveyor_connections(server) -> int:
    return pg_exec(server, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'conveyor'")[0][0]


def test_one_template_per_job_and_server_bounded_and_closed(pg_target) -> None:
    close_adbc_templates()
    conf = PgConnConfig(port=pg_target.port)
    before = _idle_conveyor_connections(pg_target)
    clones = [adbc_connect(conf, scope="job-a") for _ in range(3)]
    for con in clones:
        cur = con.cursor()
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)
        cur.close()
        con.close()
    # one template connection stays open for job-a; its clones are closed
    assert len(common._TEMPLATES) == 1
    assert _idle_conveyor_connections(pg_target) == before + 1
    for i in range(common._MAX_TEMPLATES + 2):
        adbc_connect(conf, scope=f"job-{i}").close()
    assert len(common._TEMPLATES) == common._MAX_TEMPLATES
    assert _idle_conveyor_connections(pg_target) == before + common._MAX_TEMPLATES
    close_adbc_templates()
    assert not common._TEMPLATES
    assert _idle_conveyor_connections(pg_target) == before


def test_a_new_job_sees_types_created_after_an_earlier_job(pg_target) -> None:
    """The type catalogue is per job: an enum created between two jobs is known to the second."""
    close_adbc_templates()
    conf = PgConnConfig(port=pg_target.port)
    pg_exec(pg_target, "DROP TABLE IF EXISTS later", "DROP TYPE IF EXISTS later_enum")
    adbc_connect(conf, scope="first").close()
    pg_exec(pg_target, "CREATE TYPE later_enum AS ENUM ('a', 'b')", "CREATE TABLE later (e later_enum)",
            "INSERT INTO later VALUES ('b')")
    con = adbc_connect(conf, scope="second")
    cur = con.cursor()
    cur.execute("SELECT e FROM later")
    table = cur.fetch_arrow_table()
    # a catalogue read before the type existed would give opaque bytes of an "unnamed<oid:...>" type
    assert str(table.schema.field(0).type) == "string" and table.column(0).to_pylist() == ["b"]
    cur.close()
    con.close()
    close_adbc_templates()


def test_a_refused_connection_inside_a_task_is_retriable(pg_target) -> None:
    """A task that connects while the target restarts (test_target_server_restarted_mid_run once met
    it: 'server closed the connection unexpectedly' at connect) is retried like one that lost its
    connection mid-COPY; on the driver, before anything moves, it stays a ConnectError."""
    from conveyor.connectors.postgres.common import connect
    from conveyor.errors import ConnectError, TransferError
    from conveyor.testing.pgserver import free_port

    conf = PgConnConfig(port=free_port(), connect_timeout=2)
    with pytest.raises(TransferError) as in_task:
        connect(conf, partition="ctid-00003")
    assert in_task.value.retriable and in_task.value.partition == "ctid-00003"
    with pytest.raises(ConnectError):
        connect(conf)


def test_the_run_guard_is_closed_after_its_ping_in_flight_never_under_it(pg_target, monkeypatch) -> None:
    """The driver's guard pings its connection from a thread of its own; closing it while a ping ran
    on it freed what the statement was using, and the driver segfaulted at the end of a run (make
    bench: parquet_to_postgres on a running Ray instance, in psycopg's execute of the ping). close()
    now waits for a ping in flight and no ping starts after it. A ping made slow (pg_sleep) holds the
    window open: on the main this started from, close() returned while the ping still ran."""
    import threading
    import time

    from conveyor.connectors.postgres import commits
    from tests.helpers import PG_PASSWORD

    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    events: list[tuple[str, float]] = []
    pinging = threading.Event()

    class SlowPing(commits._Guard):
        def _ping(self) -> None:
            events.append(("ping", time.monotonic()))
            pinging.set()
            self.con.execute("SELECT pg_sleep(0.5)")
            events.append(("pinged", time.monotonic()))

    guard = SlowPing(PgConnConfig(port=pg_target.port), "guard-close-race")
    assert pinging.wait(10), "the guard never pinged"
    time.sleep(0.1)  # the ping's statement is on the server
    guard.close()
    closed = time.monotonic()
    time.sleep(1.5)  # a ping that would start after close() has had its turn
    assert [e for e, _ in events] == ["ping", "pinged"], events
    assert events[1][1] <= closed  # close() returned after the ping's statement had ended
    assert guard.con.closed
