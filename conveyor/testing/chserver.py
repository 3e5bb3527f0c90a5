"""Throwaway ClickHouse servers for tests and benchmarks.

Each server gets a copy of the installed configuration (``/etc/clickhouse-server``) in a temp folder,
its data, temp and log paths rewritten into that folder, listens on 127.0.0.1 only on free ports (HTTP
and the native TCP port), and its ``default`` user needs a password. As root the server runs as the
unprivileged ``clickhouse`` system user (created by Debian's clickhouse-server package), otherwise as
the current user. ``scripts/ensure-clickhouse.sh`` installs the server (``make test`` runs it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from conveyor.testing.pgserver import discard, free_port

CONFIG_DIR = Path("/etc/clickhouse-server")


def _binary() -> list[str]:
    for folder in ("/usr/sbin", "/usr/bin", "/usr/local/bin"):
        if os.access(f"{folder}/clickhouse-server", os.X_OK):
            return [f"{folder}/clickhouse-server"]
    found = shutil.which("clickhouse-server")
    if found:
        return [found]
    found = shutil.which("clickhouse")
    if found:
        return [found, "server"]
    raise RuntimeError("ClickHouse server binary not found: run scripts/ensure-clickhouse.sh (make test does)")


@dataclass
class ClickHouseServer:
    """A running throwaway ClickHouse server; ``user``/``password`` connect over HTTP on ``http_port``."""

    name: str = "clickhouse"
    password: str = "conveyor-test-clickhouse-Secret-5"
    user: str = "default"
    database: str = "default"
    http_port: int = 0
    tcp_port: int = 0
    root: Path | None = None
    os_user: str = "clickhouse"
    _proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> ClickHouseServer:
        self.root = Path(tempfile.mkdtemp(prefix=f"conveyor-{self.name}-"))
        for sub in ("data", "tmp", "user_files", "format_schemas", "log"):
            (self.root / sub).mkdir()
        self._write_config()
        if os.geteuid() == 0:
            info = pwd.getpwnam(self.os_user)
            for path in [self.root, *self.root.rglob("*")]:
                os.chown(path, info.pw_uid, info.pw_gid)
            run_as = {"user": info.pw_uid, "group": info.pw_gid}
        else:
            run_as = {}
        self.http_port = self.http_port or free_port()
        self.tcp_port = self.tcp_port or free_port()
        args = [*_binary(), f"--config-file={self.root / 'config.xml'}", "--", f"--http_port={self.http_port}",
                f"--tcp_port={self.tcp_port}", f"--interserver_http_port={free_port()}"]
        self._proc = subprocess.Popen(args, cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True, **run_as)
        self._wait(timeout)
        return self

    def _write_config(self) -> None:
        assert self.root is not None
        tree = ET.parse(CONFIG_DIR / "config.xml")
        top = tree.getroot()
        for tag, sub in (("path", "data/"), ("tmp_path", "tmp/"), ("user_files_path", "user_files/"),
                         ("format_schema_path", "format_schemas/")):
            node = top.find(tag)
            if node is None:
                node = ET.SubElement(top, tag)
            node.text = str(self.root / sub)
        logger = top.find("logger")
        if logger is not None:
            for tag, file in (("log", "server.log"), ("errorlog", "server.err.log")):
                node = logger.find(tag)
                if node is not None:
                    node.text = str(self.root / "log" / file)
            level = logger.find("level")
            if level is not None:
                level.text = "warning"
        for node in top.findall("listen_host"):
            top.remove(node)
        ET.SubElement(top, "listen_host").text = "127.0.0.1"
        for tag in ("https_port", "tcp_port_secure", "mysql_port", "graphite", "openSSL"):
            for node in top.findall(tag):
                top.remove(node)
        tree.write(self.root / "config.xml")
        users = ET.parse(CONFIG_DIR / "users.xml")
        default = users.getroot().find("users/default")
        assert default is not None, "the installed users.xml has no default user"
        pw = default.find("password")
        if pw is None:
            pw = ET.SubElement(default, "password")
        pw.text = self.password
        users.write(self.root / "users.xml")

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                log = self.root / "log" / "server.err.log" if self.root else None
                text = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
                raise RuntimeError(f"ClickHouse {self.name} exited at start-up: {text}")
            try:
                self.execute("SELECT 1")
                return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError(f"ClickHouse {self.name} did not answer on port {self.http_port} within {timeout}s")

    def execute(self, *statements: str, data: bytes | None = None, settings: dict[str, str] | None = None) -> list[list[str]]:
        """Run statements over HTTP (with server ``settings``); the last one's rows (TSV fields as text)."""
        out: list[list[str]] = []
        for stmt in statements:
            last = stmt is statements[-1] and data is not None
            params = {"database": self.database, **(settings or {}), **({"query": stmt} if last else {})}
            req = urllib.request.Request(f"http://127.0.0.1:{self.http_port}/?{urllib.parse.urlencode(params)}",
                                         data=data if last else stmt.encode(),  # the statement in the body: no URL length limit
                                         headers={"X-ClickHouse-User": self.user, "X-ClickHouse-Key": self.password})
            with urllib.request.urlopen(req, timeout=60) as resp:
                text = resp.read().decode()
            out = [line.split("\t") for line in text.splitlines()]
        return out

    def stop(self) -> None:
        discard(self._proc, self.root)
        self._proc, self.root = None, None

    def __enter__(self) -> ClickHouseServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m conveyor.testing.chserver``: a throwaway ClickHouse server to try Conveyor with, until Ctrl-C
    (:func:`conveyor.testing.tryserver.serve`)."""
    from conveyor.testing.tryserver import serve

    def export(s: ClickHouseServer, given: bool) -> str:
        line = f"export CLICKHOUSE_HOST=127.0.0.1 CLICKHOUSE_HTTP_PORT={s.http_port} CLICKHOUSE_USER={s.user}"
        return line if given else f"{line} CLICKHOUSE_PASSWORD={s.password}"

    return serve("python -m conveyor.testing.chserver", "ClickHouse server", argv, lambda args, pw: ClickHouseServer("try", password=pw),
                 export, "bash scripts/ensure-clickhouse.sh installs them (Debian's clickhouse-server)", password_env="CLICKHOUSE_PASSWORD")


if __name__ == "__main__":
    raise SystemExit(main())
