"""Set-up on a fresh machine: the Makefile says what to install when Python's venv is missing, and
scripts/ensure-postgres.sh installs what the PostgreSQL tests need (server, psql, pg_partman) when absent."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO


def test_make_says_what_to_install_when_python_cannot_make_a_venv(tmp_path: Path) -> None:
    """A Python without venv/ensurepip (Debian without python3-venv): one error and the package to install,
    exit 2, no half-made .venv (on main: Python's own 'No module named venv' traceback, or ensurepip's)."""
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 'No module named venv' >&2\nexit 1\n")
    fake.chmod(0o755)
    proc = subprocess.run(["make", "-C", str(REPO), "install", f"PYTHON={fake}", f"VENV={tmp_path}/venv"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "hint: on Debian/Ubuntu: apt-get install python3 python3-venv" in proc.stderr, proc.stderr
    assert not (tmp_path / "venv").exists()


def _stub_path(tmp_path: Path, installs: bool) -> dict[str, str]:
    """A PATH with no PostgreSQL and an `apt-get` stand-in. A stand-in, not the real one: the test
    machine has PostgreSQL already and installing packages is not a test's business; the real
    install path runs in CI on a fresh machine, where `make test` calls this script first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("id", "head", "mkdir", "touch", "chmod", "sed", "sort"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    pg = tmp_path / "pg" / "15" / "bin"
    share = tmp_path / "share"
    made = (f"mkdir -p {pg} {share}/15/extension && touch {pg}/initdb && printf '#!/bin/sh\\n' > {bin_dir}/psql && chmod +x {bin_dir}/psql"
            f" && if [ \"$4\" = postgresql-15-partman ]; then touch {share}/15/extension/pg_partman.control; fi") if installs else ":"
    apt = bin_dir / "apt-get"
    apt.write_text(f"#!/bin/bash\necho \"$@\" >> {tmp_path}/apt.log\nif [ \"$1\" = install ]; then {made}; fi\n")
    apt.chmod(0o755)
    return {"PATH": str(bin_dir), "PG_BIN_GLOB": str(tmp_path / "pg" / "*" / "bin"), "PG_SHARE_DIR": str(share),
            "HOME": os.environ.get("HOME", "/root")}


@pytest.mark.skipif(os.geteuid() != 0, reason="the script uses sudo when not root")
def test_ensure_postgres_installs_the_server_psql_and_partman_when_missing(tmp_path: Path) -> None:
    proc = subprocess.run(["/bin/bash", str(REPO / "scripts" / "ensure-postgres.sh")], env=_stub_path(tmp_path, installs=True),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "apt.log").read_text().splitlines()
    assert log == ["update -qq", "install -y -qq postgresql postgresql-client", "install -y -qq postgresql-15-partman"], log
    assert "PostgreSQL ready:" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the script uses sudo when not root")
def test_ensure_postgres_fails_clearly_when_the_install_left_psql_missing(tmp_path: Path) -> None:
    proc = subprocess.run(["/bin/bash", str(REPO / "scripts" / "ensure-postgres.sh")], env=_stub_path(tmp_path, installs=False),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "error: installed postgresql postgresql-client but initdb or psql is still missing" in proc.stderr


def test_ensure_postgres_does_nothing_where_both_are_present() -> None:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "ensure-postgres.sh")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""
