"""The ``conveyor`` command's quick exit (``conveyor.cli.entry``): it skips only the interpreter's
teardown of every module and object (0.12-0.18 s of a 10-row job here, ~0.2 s more with Ray
loaded), never what a normal exit does for the job: waiting for its threads, the exit handlers,
flushing Python's and C's buffered output. Each checked in a real subprocess whose output is a pipe
(C's stdout is then fully buffered)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

from tests.helpers import REPO

_SCRIPT = """
import atexit, concurrent.futures, ctypes, sys, threading, time
from pathlib import Path
from conveyor import cli

out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
def late():
    time.sleep(0.3)
    (out / "thread").write_text("done")
threading.Thread(target=late).start()
pool = concurrent.futures.ThreadPoolExecutor(2)  # a library's pool, never shut down: its idle workers must not hold the exit
pool.submit(time.sleep, 0.01).result()
ctypes.CDLL(None).printf(b"written through C's stdio\\n")
print("written through Python's stdout", end="")
sys.argv = ["conveyor", *sys.argv[2:]]
cli.entry()
"""


def _entry(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # which would make C's stdio unbuffered too
    return subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path), *args], capture_output=True, text=True, timeout=120, env=env)


def test_the_quick_exit_keeps_what_a_normal_exit_does_for_the_job(tmp_path: Path) -> None:
    proc = _entry(tmp_path, "plugins")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "thread").read_text() == "done"  # a non-daemon thread was waited for
    assert (tmp_path / "atexit").read_text() == "ran"  # the exit handlers ran
    assert "written through C's stdio" in proc.stdout and "written through Python's stdout" in proc.stdout
    assert "postgres" in proc.stdout  # the command's own output


def test_the_quick_exit_keeps_the_commands_exit_code(tmp_path: Path) -> None:
    proc = _entry(tmp_path, "no-such-command")
    assert proc.returncode == 2 and "unknown command" in proc.stderr
    assert (tmp_path / "atexit").read_text() == "ran"


def test_the_console_script_is_the_quick_exit() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["conveyor"] == "conveyor.cli:entry"


_GC_SCRIPT = """
import atexit, gc, json, sys
from pathlib import Path
import conveyor.config as config
import conveyor.pipelines.job as job
from conveyor import cli

seen, out = {}, Path(sys.argv[1])
build, tasks = config.build_job, job.Load.tasks
def build_job(*args, **kw):
    seen["composing"] = gc.isenabled()
    return build(*args, **kw)
def tasks_(self):
    seen["tasks"], seen["frozen"] = gc.isenabled(), gc.get_freeze_count()
    return tasks(self)
config.build_job, job.Load.tasks = build_job, tasks_
atexit.register(lambda: out.write_text(json.dumps(seen)))
sys.argv = ["conveyor", *sys.argv[2:]]
cli.entry()
"""


def test_a_run_starts_without_the_garbage_collector_and_transfers_with_it(tmp_path: Path) -> None:
    """Start-up (imports, composing, planning) makes long-lived objects and next to no garbage: the
    collector is held back until the job is planned, then what start-up made is frozen and it runs
    again for the transfer (a long job must not run without it)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": list(range(100))}), tmp_path / "in" / "a.parquet")
    seen = tmp_path / "seen.json"
    proc = subprocess.run([sys.executable, "-c", _GC_SCRIPT, str(seen), "run", "source=parquet", f"source.path={tmp_path / 'in'}",
                           "sink=parquet", f"sink.path={tmp_path / 'out'}", "load_mode=create", "runtime=local",
                           f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(seen.read_text())
    assert got["composing"] is False and got["tasks"] is True and got["frozen"] > 10_000, got


_SIGNAL_SCRIPT = """
import signal, sys
from conveyor import cli

seen = []
def mine(signum, frame):
    seen.append(signum)
signal.signal(signal.SIGINT, mine)
signal.signal(signal.SIGTERM, mine)
code = cli.main(sys.argv[1:])
assert code == 0, code
assert signal.getsignal(signal.SIGINT) is mine and signal.getsignal(signal.SIGTERM) is mine, (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
signal.raise_signal(signal.SIGINT)
assert seen == [signal.SIGINT], seen
print("handlers kept")
"""


def test_a_program_calling_main_keeps_its_signal_handlers(tmp_path: Path) -> None:
    """``main(["run", ...])`` takes Ctrl-C / SIGTERM over while the run runs (they cancel it); on main
    it left its own handlers installed after returning, so the calling program's next Ctrl-C printed
    "interrupted: cancelling the running partitions" and did nothing else (a second one ended the
    process with os._exit)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": list(range(100))}), tmp_path / "in" / "a.parquet")
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_SCRIPT, "run", "source=parquet", f"source.path={tmp_path / 'in'}",
                           "sink=parquet", f"sink.path={tmp_path / 'out'}", "load_mode=create", "runtime=local",
                           f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "handlers kept" in proc.stdout, proc.stderr[-3000:]
