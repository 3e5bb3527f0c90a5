"""Throwaway MariaDB (MySQL) servers for tests and benchmarks.

Each server gets its own data directory under a temp folder, listens on 127.0.0.1 only on a free
port, and requires a password over TCP: a user ``conveyor`` (all privileges) and a database
``conveyor`` are made at start-up by an init file. As root the server runs as the unprivileged
``mysql`` system user (created by Debian's mariadb-server package), otherwise as the current user.
``scripts/ensure-mariadb.sh`` installs the server (``make test`` runs it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.testing.pgserver import discard, free_port


def _binary(*names: str) -> str:
    for name in names:
        for folder in ("/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"):
            if os.access(f"{folder}/{name}", os.X_OK):
                return f"{folder}/{name}"
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(f"MariaDB server binaries not found ({', '.join(names)}): run scripts/ensure-mariadb.sh (make test does)")


#: the settings of a server whose changes a binlog reader follows (``settings=BINLOG``): the binary log on, in ROW format
#: with full row images (the log's files in the data folder)
BINLOG = {"log-bin": "binlog", "binlog-format": "ROW", "binlog-row-image": "FULL", "server-id": "1"}


@dataclass
class MySqlServer:
    """A running throwaway MariaDB server; ``user``/``password`` connect over TCP."""

    name: str = "mysql"
    password: str = "conveyor-test-mysql-Secret-3"
    user: str = "conveyor"
    database: str = "conveyor"
    settings: dict[str, str] = field(default_factory=dict)
    port: int = 0
    root: Path | None = None
    os_user: str = "mysql"
    _proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> MySqlServer:
        self.root = Path(tempfile.mkdtemp(prefix=f"conveyor-{self.name}-"))
        data = self.root / "data"
        data.mkdir()
        init = self.root / "init.sql"
        pw = self.password.replace("\\", "\\\\").replace("'", "\\'")
        init.write_text(
            f"CREATE USER IF NOT EXISTS '{self.user}'@'%' IDENTIFIED BY '{pw}';\n"
            f"GRANT ALL PRIVILEGES ON *.* TO '{self.user}'@'%' WITH GRANT OPTION;\n"
            f"CREATE DATABASE IF NOT EXISTS `{self.database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci;\n"
        )
        as_root = os.geteuid() == 0
        if as_root:
            info = pwd.getpwnam(self.os_user)
            for p in (self.root, data, init):
                os.chown(p, info.pw_uid, info.pw_gid)
        else:
            self.os_user = pwd.getpwuid(os.geteuid()).pw_name
        subprocess.run(
            [_binary("mariadb-install-db", "mysql_install_db"), "--no-defaults", f"--datadir={data}", f"--user={self.os_user}",
             "--auth-root-authentication-method=socket", "--skip-test-db", "--skip-name-resolve"],
            check=True, capture_output=True, timeout=180,
        )
        self.port = self.port or free_port()
        args = [
            _binary("mariadbd", "mysqld"), "--no-defaults", f"--datadir={data}", f"--port={self.port}", "--bind-address=127.0.0.1",
            f"--socket={self.root / 'sock'}", f"--pid-file={self.root / 'pid'}", f"--log-error={self.root / 'err.log'}",
            f"--user={self.os_user}", f"--init-file={init}", "--skip-name-resolve", "--local-infile=1",
            "--innodb-buffer-pool-size=256M", "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
            "--skip-log-bin", "--max-allowed-packet=256M", "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
            "--default-time-zone=+00:00", "--max-connections=100",
            *(f"--{k}={v}" for k, v in self.settings.items()),
        ]
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._wait(timeout)
        return self

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                log = (self.root / "err.log").read_text(errors="replace")[-2000:] if self.root else ""
                raise RuntimeError(f"MariaDB {self.name} exited at start-up: {log}")
            try:
                import pymysql

                pymysql.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password,
                                database=self.database, connect_timeout=2).close()
                return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError(f"MariaDB {self.name} did not accept connections on port {self.port} within {timeout}s")

    def stop(self) -> None:
        discard(self._proc, self.root)
        self._proc, self.root = None, None

    def connect(self, **kw):  # a pymysql connection, for tests' SQL
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password,
                               database=self.database, autocommit=True, **kw)

    def execute(self, *statements: str) -> list[tuple]:
        """Run statements; the last one's rows."""
        con = self.connect()
        try:
            rows: list[tuple] = []
            with con.cursor() as cur:
                for stmt in statements:
                    cur.execute(stmt)
                    rows = list(cur.fetchall())
            return rows
        finally:
            con.close()

    def __enter__(self) -> MySqlServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m conveyor.testing.mysqlserver``: a throwaway MariaDB server, its binary log on in ROW format, to try
    Conveyor with, until Ctrl-C (:func:`conveyor.testing.tryserver.serve`)."""
    from conveyor.testing.tryserver import serve

    def export(s: MySqlServer, given: bool) -> str:
        line = f"export MYSQL_HOST=127.0.0.1 MYSQL_TCP_PORT={s.port} MYSQL_USER={s.user} MYSQL_DATABASE={s.database}"
        return line if given else f"{line} MYSQL_PWD={s.password}"

    return serve("python -m conveyor.testing.mysqlserver", "MariaDB server (binary log on, ROW format)", argv,
                 lambda args, pw: MySqlServer("try", password=pw, settings=dict(BINLOG)), export,
                 "bash scripts/ensure-mariadb.sh installs them (Debian's mariadb-server)", password_env="MYSQL_PWD")


if __name__ == "__main__":
    raise SystemExit(main())
