"""The tests' shared helpers, in one module: paths, the CLI as a subprocess, SQL on the test
servers, a table's content checksum, and jobs built and run in-process from plain dicts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.core import SourceBase
from conveyor.pipelines.job import JobReport, run_job
from conveyor.testing.suites import lose_manifest_lines  # noqa: F401  (the kit's, used by the resume tests)


def job(source: dict[str, Any], sink: dict[str, Any], strategy: str = "none", strategy_params: dict[str, Any] | None = None,
        max_retries: int = 0, **options: Any) -> JobReport:
    cfg = OmegaConf.create(
        {
            "source": source,
            "sink": sink,
            "strategy": {"type": strategy, **(strategy_params or {})},
            "runtime": {"type": "local", "max_retries": max_retries},
            **options,
        }
    )
    return run_job(build_job(cfg))


REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 180) -> CliResult:
    """Run `conveyor ARGS` as a user would, in a subprocess, with a bounded time."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    proc = subprocess.run(
        [str(BIN / "conveyor"), *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


PG_PASSWORD = "conveyor-test-Secret-7"


def pg_exec(server, *statements: str, dbname: str = "postgres") -> list[tuple]:
    """Run statements on a test server; returns the last one's rows (if any)."""
    import psycopg

    with psycopg.connect(server.dsn(dbname), autocommit=True) as con:
        rows: list[tuple] = []
        for stmt in statements:
            cur = con.execute(stmt)
            rows = cur.fetchall() if cur.description else []
        return rows


def checksum(server, table: str) -> tuple[int, str]:
    """Row count and an order-independent digest of every row as PostgreSQL prints it."""
    return tuple(pg_exec(server, f"SELECT count(*), md5(coalesce(string_agg(_r::text, '|' ORDER BY _r::text), '')) FROM {table} _r")[0])


def popen_run(args: list[str], tmp_path: Path, run: str) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "conveyor"), *args, f"hydra.run.dir={tmp_path}/{run}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ray_address(ray_instance) -> str:
    return ray_instance.get_runtime_context().gcs_address


def runtime_args(kind: str, request) -> list[str]:
    if kind == "ray":  # the CLI joins the test's Ray instance: tasks run in its workers, not in the CLI (one task or a small job too)
        return ["runtime=ray", f"runtime.address={ray_address(request.getfixturevalue('ray_instance'))}"]
    return ["runtime=local"]


def ctrl_c_run(args: list[str], tmp_path: Path, started: Callable[[], None], sig: int = signal.SIGINT) -> tuple[dict[str, Any], str, float]:
    """`conveyor --report ... ARGS` stopped by one Ctrl-C (or ``sig``) once ``started()`` returns (rows are
    moving): it must exit 130 within 30 s, in one line and a resume hint, with a report saying cancelled.
    Returns (the report, stderr, seconds from the signal to the exit)."""
    report_path = tmp_path / "r.json"
    proc = popen_run(["--report", str(report_path), *args], tmp_path, "run")
    started()
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    assert proc.returncode == 130, (proc.returncode, err)
    assert took < 30, f"Ctrl-C took {took:.1f} s"
    assert "Traceback" not in err and "error: cancelled:" in err
    report = json.loads(report_path.read_text())
    assert report["status"] == "cancelled"
    # the hint says how to go on: resume where partitions committed (an append), run it again where none did
    committed = any(p["error"] is None for p in report["partitions"])
    assert ("resume=" in err) if committed else ("resume=" in err or "run it again" in err), err
    return report, err, took


def wait_until(found: Callable[[], Any], what: str, seconds: float = 90) -> None:
    """Poll ``found()`` (every 50 ms, at most ``seconds``) until it is truthy; fail naming ``what``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not seen within {seconds} s")


def wait_quiet(busy: Callable[[], int], seconds: float = 90) -> None:
    """Until ``busy()`` (the sessions a killed driver's tasks still hold) has been 0 for 2 s in a row."""
    deadline = time.monotonic() + seconds
    quiet = 0
    while time.monotonic() < deadline and quiet < 10:
        quiet = 0 if busy() else quiet + 1
        time.sleep(0.2)
    assert quiet >= 10, "conveyor sessions still busy"


class Relayed(SourceBase):
    """A source of another class than PostgresSource that offers PostgreSQL's binary COPY stream
    (it hands on the built-in one's): the sink sees only the offer in SourceInfo.native."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner

    def describe(self):  # type: ignore[no-untyped-def]
        return self.inner.describe()

    def read(self, part):  # type: ignore[no-untyped-def]
        return self.inner.read(part)

    def export_native(self, part, columns):  # type: ignore[no-untyped-def]
        return self.inner.export_native(part, columns)


def id_files(folder: Path, files: int = 3, rows: int = 100) -> Path:
    """``files`` Parquet files in ``folder`` (made), each ``rows`` int64 ids following the last file's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    for i in range(files):
        pq.write_table(pa.table({"id": pa.array(range(i * rows, (i + 1) * rows), pa.int64())}), folder / f"p{i}.parquet")
    return folder


def stop_ray_under(temp: str, wait: float = 15.0) -> None:
    """Stop the Ray processes whose command line names ``temp`` (a `ray start` of this test process's), and their children
    (workers rename themselves: ``ray::IDLE``): `ray stop` stops every Ray process of the machine, another xdist
    worker's too. SIGTERM, then SIGKILL what is left after ``wait`` seconds."""
    def tree() -> list[int]:
        parents: dict[int, int] = {}
        named: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmd = (entry / "cmdline").read_bytes()
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if temp.encode() in cmd:
                named.append(int(entry.name))
        found, todo = set(named), list(named)
        while todo:
            pid = todo.pop()
            kids = [c for c, p in parents.items() if p == pid and c not in found]
            found.update(kids)
            todo += kids
        return sorted(found)

    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = tree()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]
            time.sleep(0.2)
        if not pids:
            break
    # the address file `ray stop` would remove: left, a later ray.init() of this worker (Ray Data's own, in a README
    # block) tries to join the instance that is gone, and waits (Conveyor's own discovery checks that it answers)
    (Path(temp) / "ray_current_cluster").unlink(missing_ok=True)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


class BackgroundWriter:
    """An application writing a test server while a job runs: ``_run`` (a subclass's, bounded in count) in a thread from
    ``with`` until its end, which stops it and waits (at most a minute)."""

    def __init__(self) -> None:
        import threading

        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
