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
