"""`python -m conveyor.testing.pgserver`: the README's way to a PostgreSQL server to try Conveyor with (on the main this
started from, starting one was left to the reader). A real server: it prints the line to paste, takes connections with
the given password (not printed), and Ctrl-C stops it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading

import psycopg
import pytest

from tests.helpers import BIN


def test_a_throwaway_server_starts_prints_its_line_and_stops_on_ctrl_c() -> None:
    proc = subprocess.Popen([str(BIN / "python"), "-m", "conveyor.testing.pgserver"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PGPASSWORD": "try-it-Secret-1"})
    watchdog = threading.Timer(90, proc.kill)  # the read below is bounded: a server that never says its line is killed
    watchdog.start()
    try:
        line = proc.stdout.readline()
        port = int(re.search(r"PGPORT=(\d+)", line).group(1))
        assert line.startswith("export PGHOST=127.0.0.1 PGPORT=") and "try-it-Secret-1" not in line
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", password="try-it-Secret-1", dbname="postgres") as con:
            assert con.execute("SELECT 1").fetchone() == (1,)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(host="127.0.0.1", port=port, user="postgres", password="try-it-Secret-1", dbname="postgres", connect_timeout=3)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()


def _started(module: str, env: dict[str, str]) -> tuple[subprocess.Popen, dict[str, str]]:
    """`python -m conveyor.testing.<module>` started; (the process, the variables its export line sets)."""
    passwords = ("PGPASSWORD", "MYSQL_PWD", "CLICKHOUSE_PASSWORD")  # not given unless the test gives one: then printed
    proc = subprocess.Popen([str(BIN / "python"), "-m", f"conveyor.testing.{module}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**{k: v for k, v in os.environ.items() if k not in passwords}, **env})
    watchdog = threading.Timer(120, proc.kill)  # bounded: a server that never says its line is killed
    watchdog.start()
    try:
        line = proc.stdout.readline()
    finally:
        watchdog.cancel()
    assert line.startswith("export "), f"{line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
    return proc, dict(word.split("=", 1) for word in line.split("#")[0].split()[1:])


def _stopped(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("module", ["pgserver", "mysqlserver", "chserver"])
def test_each_try_server_has_a_help_that_starts_nothing(module: str) -> None:
    done = subprocess.run([str(BIN / "python"), "-m", f"conveyor.testing.{module}", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: python -m conveyor.testing.{module}") and "Ctrl-C" in done.stdout
    assert "export" not in done.stdout.splitlines()[0]


def test_the_postgres_try_server_has_logical_decoding_on_for_sync_jobs() -> None:
    proc, env = _started("pgserver", {})
    try:
        assert env["PGPASSWORD"]  # no $PGPASSWORD given: a new one, printed once
        with psycopg.connect(host="127.0.0.1", port=int(env["PGPORT"]), user="postgres", password=env["PGPASSWORD"], dbname="postgres") as con:
            assert con.execute("SHOW wal_level").fetchone() == ("logical",)
    finally:
        _stopped(proc)


def test_the_mariadb_try_server_keeps_a_row_binlog_and_conveyor_reads_it_by_its_export_line(tmp_path) -> None:
    import pymysql

    proc, env = _started("mysqlserver", {"MYSQL_PWD": "try-it-Secret-2"})
    try:
        assert "MYSQL_PWD" not in env and env["MYSQL_HOST"] == "127.0.0.1"
        con = pymysql.connect(host="127.0.0.1", port=int(env["MYSQL_TCP_PORT"]), user=env["MYSQL_USER"], password="try-it-Secret-2",
                              database=env["MYSQL_DATABASE"], autocommit=True)
        with con.cursor() as cur:
            cur.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image")
            assert cur.fetchone() == (1, "ROW", "FULL")
            cur.execute("CREATE TABLE t (id int PRIMARY KEY, v varchar(10))")
            cur.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        con.close()
        from tests.helpers import run_cli

        r = run_cli("run", "source=mysql", "source.table=t", "sink=parquet", f"sink.path={tmp_path}/out", "strategy=none", "runtime=local",
                    f"hydra.run.dir={tmp_path}/run", env={**env, "MYSQL_PWD": "try-it-Secret-2"})
        assert r.code == 0, r.err
    finally:
        _stopped(proc)


def test_the_clickhouse_try_server_answers_with_its_export_line() -> None:
    import base64
    import urllib.request

    proc, env = _started("chserver", {})
    try:
        auth = base64.b64encode(f"{env['CLICKHOUSE_USER']}:{env['CLICKHOUSE_PASSWORD']}".encode()).decode()
        req = urllib.request.Request(f"http://127.0.0.1:{env['CLICKHOUSE_HTTP_PORT']}/?query=SELECT%201", headers={"Authorization": f"Basic {auth}"})
        with urllib.request.urlopen(req, timeout=30) as got:
            assert got.read().strip() == b"1"
    finally:
        _stopped(proc)
