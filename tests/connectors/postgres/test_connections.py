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
        def _ping(self, con, run_ids) -> None:
            events.append(("ping", time.monotonic()))
            pinging.set()
            con.execute("SELECT pg_sleep(0.5)")
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


def test_the_runs_of_one_process_share_one_guard_connection(pg_target, monkeypatch) -> None:
    """A job over many tables holds a run id per table; their guards share one connection (on the main
    this started from, a connection and a pinging thread each: 200 tables passed max_connections). Each
    run's lock is held while it runs and free once it is released, whatever the others do."""
    from conveyor.connectors.postgres import commits
    from conveyor.connectors.postgres.common import connect
    from tests.helpers import PG_PASSWORD

    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    conf = PgConnConfig(port=pg_target.port)
    runs = [f"shared-guard-{i}" for i in range(150)]
    for run in runs:
        commits.hold_guard(conf, run)
    con = connect(conf, autocommit=True)
    try:
        def held(run: str) -> bool:
            return not con.execute(f"SELECT pg_try_advisory_xact_lock_shared({commits.guard_key_sql('%s')})", [run]).fetchone()[0]

        keys = [con.execute(f"SELECT {commits.guard_key_sql('%s')}", [r]).fetchone()[0] for r in runs]
        ours = ("FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"  # these runs' locks, not another test's on the server
                " AND ((classid::bigint << 32) | objid::bigint) = ANY(%s)")
        holders = con.execute(f"SELECT count(DISTINCT pid) {ours}", [keys]).fetchone()[0]
        assert holders == 1
        assert all(held(r) for r in runs)
        for run in runs[::2]:
            commits.release_guard(run)
        assert not any(held(r) for r in runs[::2]) and all(held(r) for r in runs[1::2])
        for run in runs[1::2]:
            commits.release_guard(run)
        assert not any(held(r) for r in runs)
        assert con.execute(f"SELECT count(*) {ours}", [keys]).fetchone()[0] == 0
    finally:
        con.close()


def test_a_running_jobs_connections_are_reused_clean(pg_target, monkeypatch) -> None:
    """While a job runs (kit.reuse.reusing), a closed connection is handed to the next connect() to the same
    server, reset as a new session: its transaction rolled back, settings, advisory locks and temporary
    tables gone; after the job, and outside one, close() closes."""
    from conveyor.connectors.postgres.common import connect
    from conveyor.kit import reuse
    from tests.helpers import PG_PASSWORD

    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    conf = PgConnConfig(port=pg_target.port)
    other = connect(conf, autocommit=True)
    with reuse.reusing():
        first = connect(conf)
        pid = first.info.backend_pid
        first.execute("SET work_mem = '7MB'")
        first.execute("SELECT pg_advisory_lock(4242)")
        first.execute("CREATE TEMP TABLE scratch (x int)")
        first.execute("CREATE TABLE reuse_rolled_back (x int)")  # in the transaction close() rolls back
        first.close()
        first.close()  # twice: still one idle connection, never handed to two callers
        again = connect(conf, autocommit=True)
        assert again.info.backend_pid == pid and again.autocommit
        assert again.execute("SHOW work_mem").fetchone()[0] != "7MB"
        assert again.execute("SELECT to_regclass('reuse_rolled_back'), to_regclass('pg_temp.scratch')").fetchone() == (None, None)
        assert other.execute("SELECT pg_try_advisory_lock(4242)").fetchone()[0]
        other.execute("SELECT pg_advisory_unlock(4242)")
        third = connect(conf)
        assert third.info.backend_pid != pid  # the first is in use
        again.close()
        third.close()
    assert again.closed and third.closed  # the job over: the idle ones closed
    outside = connect(conf)
    outside.close()
    assert outside.closed
    other.close()


def _one_int(stream) -> tuple[int, bytes]:
    """A one-row, one-int4-column binary COPY stream's value (after its 19-byte header, 2-byte field count and
    4-byte length), and the stream's last bytes."""
    import struct

    data = b""
    while chunk := stream.read(1 << 20):
        data += chunk
    return struct.unpack(">i", data[25:29])[0], data[-2:]


def test_the_pass_throughs_psql_is_kept_between_partitions_clean_and_never_after_an_error(pg_target, monkeypatch) -> None:
    """While a job's connections are reused, a partition's psql (its process, connection and SCRAM exchange) carries the
    next partition to the same server: each partition's stream whole, with its COPY count; nothing of one partition's
    session reaches the next; a psql whose partition failed, or whose stream was left unread, is not kept; none is left
    running after the job."""
    from conveyor.connectors.postgres import passthrough
    from conveyor.errors import TransferError
    from conveyor.kit import reuse
    from tests.helpers import PG_PASSWORD

    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    conf = PgConnConfig(port=pg_target.port)
    begin = ["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"]
    before = _idle_conveyor_connections(pg_target)

    def one(sql: str, key: str) -> tuple[int, int | None]:
        with passthrough.export(conf, sql, begin, key) as stream:
            value, tail = _one_int(stream)
            assert tail == b"\xff\xff"
            return value, stream.rows

    with reuse.reusing():
        pid, rows = one("SELECT pg_backend_pid() FROM (SELECT set_config('work_mem', '7MB', false)) s", "p1")
        assert rows == 1
        assert one("SELECT pg_backend_pid()", "p2") == (pid, 1)  # the same psql, the same server process
        assert one("SELECT (current_setting('work_mem') = '7MB')::int", "p3") == (0, 1)  # its session reset between partitions
        with pytest.raises(TransferError, match="p4: .*division by zero"):
            one("SELECT 1 / (pg_backend_pid() - pg_backend_pid())", "p4")
        after_error, _ = one("SELECT pg_backend_pid()", "p5")
        assert after_error != pid  # the failed partition's psql was not kept
        with passthrough.export(conf, "SELECT pg_backend_pid() FROM generate_series(1, 3000000)", begin, "p6") as stream:
            assert stream.read(1 << 16)  # a stream left unread (the target failed): its psql is not kept
        assert one("SELECT pg_backend_pid()", "p7")[0] not in (pid, after_error)
        assert _idle_conveyor_connections(pg_target) == before + 1  # one psql kept, idle
    for _ in range(50):  # the job over: the kept psql ends (bounded: 5 s)
        if _idle_conveyor_connections(pg_target) == before:
            break
        import time

        time.sleep(0.1)
    assert _idle_conveyor_connections(pg_target) == before
    # outside a job: a psql per partition, as before
    first, second = one("SELECT pg_backend_pid()", "q1"), one("SELECT pg_backend_pid()", "q2")
    assert first[0] != second[0]


def test_source_options_reach_the_pass_throughs_psql(pg_target, monkeypatch) -> None:
    """``source.options`` are libpq settings of every connection of the source, psql's included: a search_path given
    there read another table of the same name through the pass-through (psql got only host, port, user and database),
    exit 0, the rows of the table the user did not name. Libpq's own variables carry them to psql; a setting no
    variable carries (keepalives) sends the job to the Arrow path, said in its plan."""
    from tests.helpers import PG_PASSWORD, job

    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    pg_exec(pg_target, "DROP SCHEMA IF EXISTS opt_other CASCADE", "CREATE SCHEMA opt_other",
            "DROP TABLE IF EXISTS public.opt_t, public.opt_out_a, public.opt_out_b",
            "CREATE TABLE public.opt_t (id int PRIMARY KEY, v text)", "INSERT INTO public.opt_t SELECT g, 'public' FROM generate_series(1, 10) g",
            "CREATE TABLE opt_other.opt_t (id int PRIMARY KEY, v text)",
            "INSERT INTO opt_other.opt_t SELECT g, 'other' FROM generate_series(1, 7) g")
    source = {"type": "postgres", "port": pg_target.port, "query": "SELECT id, v FROM opt_t",
              "options": {"options": "-c search_path=opt_other"}}
    report = job(source, {"type": "postgres", "port": pg_target.port, "table": "public.opt_out_a"}, load_mode="create")
    assert report.sink_plan.path_reason.startswith("pass-through")
    assert pg_exec(pg_target, "SELECT count(*), min(v), max(v) FROM public.opt_out_a")[0] == (7, "other", "other")
    report = job({**source, "options": {"options": "-c search_path=opt_other", "keepalives": "1"}},
                 {"type": "postgres", "port": pg_target.port, "table": "public.opt_out_b"}, load_mode="create")
    assert "keepalives" in report.sink_plan.path_reason and not report.sink_plan.path_reason.startswith("pass-through")
    assert pg_exec(pg_target, "SELECT count(*), min(v), max(v) FROM public.opt_out_b")[0] == (7, "other", "other")
