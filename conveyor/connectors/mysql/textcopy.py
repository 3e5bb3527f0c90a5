"""MySQL -> PostgreSQL without decoding a value in this process: each partition's rows leave the MySQL
server as lines of PostgreSQL's COPY text format, read by MariaDB's (or MySQL's) command-line client,
and go straight into the target's ``COPY ... FROM STDIN`` (format ``pgcopy-text``).

The server writes each row as one column, ``CONCAT`` of its values in COPY's text form: NULL as ``\\N``,
tabs, newlines, carriage returns and backslashes escaped, bytes as ``\\x`` and their hex digits, a
TIMESTAMP as its UTC time with ``+00``; integers, DECIMAL (any width), DATE, DATETIME and TIME as MySQL
prints them, which PostgreSQL reads back to the same values. The client prints that column as it is
(``--raw``). A zero date reaches PostgreSQL as it is, which refuses it naming the column (or it is NULL
with ``source.zero_dates=null``).

Offered only where every column is of those types: a FLOAT or DOUBLE column (MySQL prints a float with
fewer digits than it holds), BIT, or a spatial type make the job read Arrow batches instead, and so
does a client that is not installed. The PostgreSQL sink takes the stream only where the Arrow path
would have written the same values (``postgres/passthrough.py: negotiate``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from conveyor.connectors.mysql.common import MySqlConnConfig, qident
from conveyor.core import NativeExport
from conveyor.errors import TransferError

FORMAT = "pgcopy-text"
_BS = "CHAR(92 USING utf8mb4)"
_NULL = f"CONCAT({_BS}, 'N')"
_TEXT_CODES = (15, 245, 247, 248, 249, 250, 251, 252, 253, 254)
_PLAIN = (0, 1, 2, 3, 8, 9, 11, 13, 246)  # decimal, integers, TIME, YEAR: MySQL's text is PostgreSQL's


def client() -> str | None:
    return shutil.which("mariadb") or shutil.which("mysql")


def offer(cols: Sequence[Any]) -> NativeExport:
    """What a MySQL source offers beyond Arrow: the text stream, where every column can take it."""
    if client() is None:
        return NativeExport("mysql", tuple(cols), None, "the mariadb / mysql command-line client is not installed")
    for col in cols:
        if not (col.code in _PLAIN or col.code in _TEXT_CODES or col.dated):
            return NativeExport("mysql", tuple(cols), None, f"column {col.name} ({col.typ}): MySQL's text form of it is not exact")
    return NativeExport("mysql", tuple(cols), FORMAT)


def _value(col: Any, zero_dates: str) -> str:
    """A column's value in COPY's text form (NULL where the column is NULL). As few functions per value as can
    be: the server's expressions are this path's cost (lineitem SF0.5: 3.9 CPU-s for a plain SELECT, 18 with a
    CONVERT and a CAST per value, measured with benchmarks' my_prof; CONCAT converts numbers and dates itself,
    and the client's session is utf8mb4 in UTC)."""
    q = qident(col.name)
    if col.code in _PLAIN:
        return q
    if col.dated:
        shown = f"CONCAT({q}, '+00')" if col.code == 7 else q  # TIMESTAMP: the session's time zone is UTC
        if zero_dates == "null":
            return f"IF(MONTH({q}) = 0 OR DAYOFMONTH({q}) = 0, NULL, {shown})"
        return shown  # a zero date: PostgreSQL refuses '0000-00-00', naming the column (the COPY's context)
    if col.text:
        text = f"CONVERT({q} USING utf8mb4)" if col.other_charset else q
        for char, escaped in ((92, _BS), (9, "'t'"), (10, "'n'"), (13, "'r'")):
            text = f"REPLACE({text}, CHAR({char} USING utf8mb4), CONCAT({_BS}, {escaped}))"
        return text
    return f"CONCAT({_BS}, {_BS}, 'x', HEX({q}))"  # bytes: bytea's hex form (its backslash escaped for COPY)


def select_sql(cols: Sequence[Any], names: Sequence[str], relation: str, where: str, zero_dates: str) -> str:
    """One column per row: the row as a line of COPY text (without its newline, which the client adds)."""
    by_name = {c.name: c for c in cols}
    values = [f"IFNULL({_value(by_name[n], zero_dates)}, {_NULL})" for n in names]
    return f"SELECT CONCAT({', CHAR(9 USING utf8mb4), '.join(values)}) FROM {relation}{where}"


class _Lines:
    """The client's output (the rows' lines); at its end its exit status is checked."""

    rows: int | None = None

    def __init__(self, proc: subprocess.Popen[bytes], errors: Any, config: MySqlConnConfig, key: str) -> None:
        self.proc, self.errors, self.config, self.key = proc, errors, config, key

    def read(self, size: int) -> bytes:
        assert self.proc.stdout is not None
        chunk = self.proc.stdout.read(size)
        if chunk:
            return chunk
        if self.proc.wait() != 0:
            self.errors.seek(0)
            lines = self.errors.read().decode(errors="replace").strip().splitlines()
            msg = self.config.scrub(lines[-1] if lines else f"the client exited {self.proc.returncode}")
            raise TransferError(f"{self.config.where()}: reading {self.key}: {msg}", partition=self.key,
                                retriable=any(m in msg for m in ("2002", "2003", "2006", "2013", "Lost connection", "gone away")))
        return b""


@contextlib.contextmanager
def export(config: MySqlConnConfig, sql: str, key: str) -> Iterator[_Lines]:
    """A partition's rows as COPY text lines, read by the command-line client (the password in its environment)."""
    program = client() or "mariadb"
    args = [program, "--no-defaults", "--batch", "--raw", "--skip-column-names", "--quick", "--default-character-set=utf8mb4",
            f"--host={config.host}", f"--port={int(config.port or 3306)}", f"--user={config.user}", f"--database={config.database}",
            f"--connect-timeout={config.connect_timeout}", "--init-command=SET time_zone = '+00:00'"]
    env = {k: v for k, v in os.environ.items() if k != "MYSQL_PWD"}
    password = config.password()
    if password:
        env["MYSQL_PWD"] = password  # the client's own variable: never on its command line
    errors = tempfile.TemporaryFile()
    statement = tempfile.TemporaryFile()  # on its input, not its command line: a sync's lookup of many keys is megabytes
    statement.write(sql.encode() + b";\n")
    statement.seek(0)
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=errors, stdin=statement, env=env)
    finally:
        statement.close()
    try:
        yield _Lines(proc, errors, config, key)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdout, errors):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
