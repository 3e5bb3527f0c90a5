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
import atexit, ctypes, sys, threading, time
from pathlib import Path
from conveyor import cli

out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
def late():
    time.sleep(0.3)
    (out / "thread").write_text("done")
threading.Thread(target=late).start()
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
