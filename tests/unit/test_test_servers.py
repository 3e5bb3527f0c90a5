"""The test suite's own throwaway servers: a pytest run stopped by SIGTERM (``timeout``, a CI runner
giving up) stops them and removes their folders, as a finished or Ctrl-C'd run does. Before
tests/conftest.py turned SIGTERM into a KeyboardInterrupt, the process ended at once and both
PostgreSQL servers kept running, their folders left in /tmp."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conveyor.testing.pgserver import PgServer
from tests.helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.postgres]  # a pytest of its own starting two servers

PROBE = '''
import time
from pathlib import Path

def test_waits(pg_servers):
    Path(__file__).with_name("roots").write_text("\\n".join(str(s.root) for s in pg_servers))
    time.sleep(120)
'''


def _running(root: str) -> bool:
    pid_file = Path(root) / "data" / "postmaster.pid"
    if not pid_file.exists():
        return False
    try:
        os.kill(int(pid_file.read_text().split()[0]), 0)
    except (ProcessLookupError, ValueError):
        return False
    return True


def _as_a_runner_starts_it() -> None:
    """The probe's signals as a CI runner's fresh `pytest` has them: none blocked, SIGTERM's default action. A process
    inherits its parent's blocked signals and ignored ones; this test's process is an xdist worker that ran other tests
    first (Ray's libraries among them), and twice in the clean clone's run the probe never saw the SIGTERM: it slept
    its 120 s out and passed."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_sigterm_stops_the_sessions_postgres_servers(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                             "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_as_a_runner_starts_it)
    roots_file = tmp_path / "roots"
    try:
        deadline = time.monotonic() + 120
        while not roots_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert roots_file.exists(), f"the probe never started its servers: {proc.communicate(timeout=30)[0][-2000:]}"
        roots = roots_file.read_text().split()
        assert len(roots) == 2 and all(_running(r) for r in roots)
        proc.send_signal(signal.SIGTERM)
        try:  # two servers stopped and removed: seconds, but minutes on a machine the other xdist worker keeps busy
            out = proc.communicate(timeout=180)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"the probe did not end within 180 s of SIGTERM; its output:\n{proc.communicate(timeout=30)[0][-3000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, out  # interrupted, not passed
    left = [r for r in roots if _running(r) or Path(r).exists()]
    for root in left:  # not left behind by this test either
        PgServer(root=Path(root)).stop()
    assert not left, f"servers or folders left after SIGTERM: {left}\n{out[-2000:]}"
