"""The pass-through: a PostgreSQL source's binary COPY stream into a PostgreSQL target, untouched.

Three parts, one per side and one between them:

- :func:`negotiate` (the sink, in prepare): the source's offer (``SourceInfo.native``) against
  the target's columns: identical types (typmods may differ where PostgreSQL checks each value
  without changing it; a narrower varchar(n) / char(n) takes the Arrow path, which checks lengths) agree
  on ``pgcopy-binary``; anything else says why and takes the Arrow path.
- :func:`export` (the source, in the task): ``psql`` runs ``COPY (SELECT ...) TO STDOUT`` inside
  the job's snapshot with the source's credentials; the stream it yields raises the source's
  error at its end, before the sink can commit, and then says how many rows the source sent
  (``rows``: the COPY's own count, which ``verify=count`` checks the target's COPY count against,
  so the source is not scanned a second time to count it).
- :func:`relay` (the sink, in the task): 1 MiB chunks into ``COPY ... FROM STDIN (FORMAT binary)``.

psql writes the stream into a pipe of its own (``\\g /dev/fd/N``), not its stdout: psql prints a
COPY's count ("COPY n") only where the data did not go, so its stdout keeps the count. That pipe
holds one chunk, 1 MiB (Linux's default maximum pipe size), not the default 64 KiB: psql goes on
reading the source while the relay writes a chunk into the target, where through a 64 KiB pipe
the two sides took turns.

The statements reach psql as a script (its stdin), where psql replaces ``:NAME`` with its variable
NAME; a query in which psql could see one (a colon before a letter, outside ``::``: ``a[1:PORT]``)
is not sent that way: psql gets it as a ``-c`` argument, which it sends as is, and counts the
partition's rows with a ``SELECT count(*)`` in the same snapshot (a second scan, for that query only).
So does a psql older than 12, which cannot send a COPY's data where ``\\g`` names (it would write
the stream into its stdout, and the relay would wait on the other pipe for ever).

Where ``psql`` is Debian's (and Ubuntu's) ``pg_wrapper``, a Perl script (~20-30 ms a start here),
the psql it would run is run directly: for psql, with the server named (PGHOST is always set), the
wrapper runs the newest installed version's binary, with ``PGSYSCONFDIR`` defaulting to
``/etc/postgresql-common`` (:func:`psql_program`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from conveyor.connectors.postgres import psqlsession
from conveyor.connectors.postgres.common import PgConnConfig, ident
from conveyor.connectors.postgres.types import PgColumn, text_length_limit
from conveyor.core import NativeExport, NativeStream, cancel_requested
from conveyor.errors import Cancelled, SchemaError, TransferError

FORMAT = "pgcopy-binary"
#: a MySQL source's rows as lines of COPY's text format (conveyor/connectors/mysql/textcopy.py)
TEXT_FORMAT = "pgcopy-text"
CHUNK = 1 << 20
#: where psql could interpolate one of its variables: a colon (not one of "::") before a letter,
#: an underscore, a non-ASCII byte, a quote or a brace (``:NAME``, ``:'NAME'``, ``:"NAME"``,
#: ``:{?NAME}``); anywhere in the text, quoted or not, so that nothing psql would change goes by script
_PSQL_VARIABLE = re.compile(r"(?<!:):(?=[A-Za-z_\x80-\U0010ffff'\"{])")
_COPY_TAG = re.compile(rb"^COPY (\d+)$", re.MULTILINE)
_COUNT = re.compile(rb"^(\d+)$", re.MULTILINE)
_SCRIPT_LINE = re.compile(r"^psql:<stdin>:\d+: ")


#: Debian's pg_wrapper: where it runs a version's programs from (PgCommon's binroot)
PG_BINROOT = "/usr/lib/postgresql"
_PROGRAM: list[tuple[str, dict[str, str]] | None] = []  # psql_program's answer, once per process


def psql_program() -> tuple[str, dict[str, str]] | None:
    """The psql to run, and the environment it needs beyond libpq's variables; None where there is none.

    ``psql`` on PATH, except where it is Debian's pg_wrapper: a Perl script that starts for ~20-30 ms
    here (more CPU than psql's own start) before it runs the real psql, once per partition. For psql
    it always runs the newest installed version's binary (``get_newest_version``; psql connects to
    older servers), and sets ``PGSYSCONFDIR`` (pg_service.conf) to ``/etc/postgresql-common`` where it
    is unset: the same binary and setting, without the script. A psql older than 13 is left to the
    wrapper (it preloads readline for those)."""
    if not _PROGRAM:
        _PROGRAM.append(_find_psql())
    return _PROGRAM[0]


def _find_psql(binroot: str = PG_BINROOT) -> tuple[str, dict[str, str]] | None:
    found = shutil.which("psql")
    if found is None:
        return None
    real = os.path.realpath(found)
    if os.path.basename(real) != "pg_wrapper" or os.path.basename(os.path.dirname(real)) != "postgresql-common":
        return found, {}
    versions = []
    with contextlib.suppress(OSError):
        for name in os.listdir(binroot):
            if re.fullmatch(r"\d+(\.\d+)?", name) and os.access(os.path.join(binroot, name, "bin", "psql"), os.X_OK):
                versions.append(tuple(int(x) for x in name.split(".")))
    if not versions or max(versions) < (13,):
        return found, {}
    newest = ".".join(str(x) for x in max(versions))
    return os.path.join(binroot, newest, "bin", "psql"), {"PGSYSCONFDIR": os.environ.get("PGSYSCONFDIR", "/etc/postgresql-common")}


_VERSION_LOCK = threading.Lock()
_VERSION: list[int] = []  # psql's major version, once asked (one process asks once)


def _psql_major() -> int:
    """psql's major version in this process (0 where it does not say it plainly): ``\\g FILE`` takes
    a COPY's data from psql 12 on. Asked once per process; a caller that comes while
    :func:`learn_psql_version`'s thread asks waits for its answer."""
    with _VERSION_LOCK:
        if not _VERSION:
            _VERSION.append(_ask_psql_major())
        return _VERSION[0]


def _ask_psql_major() -> int:
    program = psql_program()
    if program is None:
        return 0
    try:
        out = subprocess.run([program[0], "--version"], capture_output=True, text=True, timeout=30, env={**os.environ, **program[1]}).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    found = re.search(r"\(PostgreSQL\) (\d+)", out)
    return int(found.group(1)) if found else 0


def learn_psql_version() -> None:
    """Ask psql its version in a thread of its own, now: called where a job agrees on the pass-through
    (the sink, while the job plans), so that the partitions this process runs find it known. Asking
    starts a psql (~20 ms here, through Debian's pg_wrapper) that the first partition's stream
    otherwise waited for before its own psql started."""
    if not _VERSION and not _VERSION_LOCK.locked():
        threading.Thread(target=_psql_major, name="conveyor-psql-version", daemon=True).start()


def _widen(fd: int) -> None:
    """Make the pipe ``fd`` hold CHUNK bytes where the system lets us (Linux: F_SETPIPE_SZ, up to
    /proc/sys/fs/pipe-max-size); elsewhere, or when refused, it keeps its size."""
    import fcntl

    setsz = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setsz is not None:
        with contextlib.suppress(OSError):  # over this user's pipe-buffer allowance: the default size
            fcntl.fcntl(fd, setsz, CHUNK)


def offer(columns: Sequence[PgColumn], config: PgConnConfig) -> NativeExport:
    """What a PostgreSQL source offers: its column types, and the stream where psql is installed and can be given every
    connection setting of the source (libpq's variables carry them)."""
    if psql_program() is None:
        return NativeExport("postgres", tuple(columns), None, "psql (PostgreSQL's client) is not installed")
    unset = config.options_without_variable()
    if unset:
        return NativeExport("postgres", tuple(columns), None,
                            f"source.options sets {', '.join(unset)}, which psql cannot be given (no libpq variable carries it)")
    if os.name != "posix" or not os.path.isdir("/dev/fd"):
        return NativeExport("postgres", tuple(columns), None,
                            "the pass-through needs a POSIX system with /dev/fd (psql writes into an inherited pipe)")
    for col in columns:
        if col.typname in _NO_BINARY or col.elem in _NO_BINARY:
            return NativeExport("postgres", tuple(columns), None, f"column {col.name} ({col.type_sql}) has no binary COPY form")
    return NativeExport("postgres", tuple(columns), FORMAT, counts=True)


#: the built-in types without binary input and output (pg_type.typsend / typreceive = 0): a binary COPY refuses them
_NO_BINARY = ("aclitem", "gtsvector")


def source_columns(native: NativeExport | None) -> dict[str, PgColumn]:
    """{name: PgColumn} of a PostgreSQL source ({} for any other)."""
    return {c.name: c for c in native.columns} if native is not None and native.dialect == "postgres" else {}


def same_type(src: PgColumn, tgt: PgColumn) -> bool:
    """Whether two PostgreSQL columns are of one type, typmods aside: the same built-in base type, or
    enums of one name (an enum's oid differs from server to server)."""
    if src.typtype == "e" and tgt.typtype == "e":
        return src.typname == tgt.typname
    return src.type_oid == tgt.type_oid and src.type_oid < 16384 and src.typtype == "b"


def negotiate(native: NativeExport | None, pairs: Sequence[tuple[str, str]], targets: Sequence[PgColumn],
              copy_path: str) -> tuple[str | None, str]:
    """(the agreed format or None, why): pass the stream through when both ends are PostgreSQL with
    identical column types; ``copy_path=passthrough`` refuses anything else, ``arrow`` never asks."""
    if copy_path == "arrow":
        return None, "arrow: copy_path=arrow"
    if native is not None and native.dialect == "mysql":
        return _negotiate_text(native, pairs, targets, copy_path)
    src = source_columns(native)
    why = None
    if not src or native is None:
        why = "the source is not PostgreSQL"
    elif native.format != FORMAT:
        why = native.why_not or f"the source streams no {FORMAT}"
    else:
        for (s, _), t in zip(pairs, targets):
            sc = src[s]
            if not same_type(sc, t):
                why = f"column {s}: {sc.type_sql} -> {t.type_sql} differ"
                break
            if text_length_limit(sc, t) is not None:
                why = (f"column {s}: {sc.type_sql} -> {t.type_sql}: each value's length is checked (PostgreSQL would cut "
                       "a longer value's trailing spaces)")
                break
            if t.typname in ("time", "timestamp", "timestamptz") and 0 <= t.typmod < (6 if sc.typmod < 0 else sc.typmod):
                why = (f"column {s}: {sc.type_sql} -> {t.type_sql}: each value's fractional seconds are checked (PostgreSQL "
                       "would round them)")
                break
    if why is None:
        differ = [f"{s} {src[s].type_sql} -> {t.type_sql}" for (s, _), t in zip(pairs, targets) if src[s].type_sql != t.type_sql]
        learn_psql_version()  # the source's partitions will run psql: its version is asked meanwhile
        if differ:  # same types, other typmods: PostgreSQL checks each value against the target's
            return FORMAT, ("pass-through: PostgreSQL binary COPY stream, same column types; typmods differ "
                            f"(each value checked by PostgreSQL): {', '.join(differ)}")
        return FORMAT, "pass-through: PostgreSQL binary COPY stream, identical column types"
    if copy_path == "passthrough":
        raise SchemaError(f"copy_path=passthrough is not possible: {why}", hint="use sink.copy_path=auto or arrow")
    return None, f"arrow: {why}"


def _negotiate_text(native: NativeExport, pairs: Sequence[tuple[str, str]], targets: Sequence[PgColumn],
                    copy_path: str) -> tuple[str | None, str]:
    """A MySQL source's COPY text lines (``mysql/textcopy.py``): taken where the target reads each value as the Arrow
    path would write it (the cast policy judged the columns already); not into a length-limited column, whose
    values the Arrow path checks one by one (PostgreSQL would cut a longer value's trailing spaces)."""
    why = native.why_not if native.format != TEXT_FORMAT else None
    for (s, _), t in zip(pairs, targets):
        if why is None and text_length_limit(None, t) is not None:
            why = f"column {s} -> {t.type_sql}: each value's length is checked"
    if why is None:
        return TEXT_FORMAT, "pass-through: MySQL's rows as COPY text lines, written by the server, read by its client"
    if copy_path == "passthrough":
        raise SchemaError(f"copy_path=passthrough is not possible: {why}", hint="use sink.copy_path=auto or arrow")
    return None, f"arrow: {why}"


class _CopyOut:
    """The stream psql writes (``data``, the pipe ``\\g`` names); at its end, psql's exit status and
    the binary COPY trailer are checked, and ``rows`` is what the source said it sent."""

    def __init__(self, proc: subprocess.Popen[bytes], data: Any, messages: Any, config: PgConnConfig, key: str,
                 count: re.Pattern[bytes]) -> None:
        self.proc, self.data, self.messages, self.config, self.key, self.count = proc, data, messages, config, key, count
        self.tail = b""
        #: the rows the source sent (its COPY's count, or its count in the same snapshot), once read to the end
        self.rows: int | None = None

    def read(self, size: int) -> bytes:
        chunk = self.data.read(size)
        if chunk:
            self.tail = (self.tail + chunk[-2:])[-2:]  # not tail + chunk, which copied every 1 MiB chunk once more
            return chunk
        out = self.proc.stdout.read() if self.proc.stdout else b""
        if self.proc.wait() != 0 or self.tail != b"\xff\xff":  # a stream cut short has no trailer
            err = _last_bytes(self.messages).decode(errors="replace")
            last = err.strip().splitlines()[-1] if err.strip() else f"psql exited {self.proc.returncode}"
            msg = self.config.scrub(_SCRIPT_LINE.sub("", last))
            raise TransferError(f"postgres source {self.config.where()}: reading {self.key}: {msg}",
                                partition=self.key, retriable="connection" in msg or "terminat" in msg)
        said = self.count.findall(out)
        self.rows = int(said[-1]) if len(said) == 1 else None
        return b""


class _KeptOut:
    """The stream of a kept psql (:mod:`~conveyor.connectors.postgres.psqlsession`), checked at its end as :class:`_CopyOut`
    checks a psql of its own: the script's lines up to its marker (psql still running), the binary COPY trailer."""

    def __init__(self, stream: Any, config: PgConnConfig, key: str) -> None:
        self.stream, self.config, self.key = stream, config, key
        self.tail = b""
        self.rows: int | None = None

    def read(self, size: int) -> bytes:
        try:
            chunk = self.stream.read(size)
            if chunk:
                self.tail = (self.tail + chunk[-2:])[-2:]
                return chunk
            out = self.stream.lines()
        except BrokenPipeError:
            self._failed()
        if self.tail != b"\xff\xff":
            self._failed()
        said = _COPY_TAG.findall(out)
        self.rows = int(said[-1]) if len(said) == 1 else None
        return b""

    def _failed(self) -> NoReturn:
        session = self.stream.session
        with contextlib.suppress(subprocess.TimeoutExpired):
            session.proc.wait(timeout=5)  # ON_ERROR_STOP: psql leaves after its error; its message is then all written
        err = _last_bytes(session.messages).decode(errors="replace")
        last = err.strip().splitlines()[-1] if err.strip() else f"psql exited {session.proc.returncode}"
        msg = self.config.scrub(_SCRIPT_LINE.sub("", last))
        raise TransferError(f"postgres source {self.config.where()}: reading {self.key}: {msg}",
                            partition=self.key, retriable="connection" in msg or "terminat" in msg)


@contextlib.contextmanager
def export(config: PgConnConfig, select_sql: str, begin_sql: Sequence[str], key: str) -> Iterator[NativeStream]:
    """A partition as PostgreSQL's binary COPY stream, read by psql in the job's snapshot: a kept psql's where
    connections are reused (:mod:`~conveyor.connectors.postgres.psqlsession`), else a psql of its own."""
    copy = f"COPY ({select_sql}) TO STDOUT (FORMAT binary)"
    program, program_env = psql_program() or ("psql", {})  # none found (offer said so): Popen's error says it
    begin = "".join(f"{stmt};\n" for stmt in begin_sql)
    if (psqlsession.usable(program_env) and _PSQL_VARIABLE.search(begin + copy) is None and psql_program() is not None
            and _psql_major() >= 12):
        with psqlsession.opened(program, {**config.subprocess_env(), **program_env},
                                lambda fifo: f"{begin}{copy} \\g {fifo}\nCOMMIT;\n") as stream:
            yield _KeptOut(stream, config, key)
        return
    read_fd, write_fd = os.pipe()
    try:
        _widen(read_fd)
        script: str | None = "".join(f"{stmt};\n" for stmt in begin_sql) + f"{copy} \\g /dev/fd/{write_fd}\nCOMMIT;\n"
        if _PSQL_VARIABLE.search(script) is None and _psql_major() >= 12:  # psql changes nothing in it: the COPY's own count
            args, count = [program, "-X", "-v", "ON_ERROR_STOP=1", "-f", "-"], _COPY_TAG
        else:  # sent as is (-c), and counted in the same snapshot
            args, count, script = [program, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-o", f"/dev/fd/{write_fd}"], _COUNT, None
            for stmt in [*begin_sql, copy, "\\o", f"SELECT count(*) FROM ({select_sql}) AS _conveyor_rows", "COMMIT"]:
                args += ["-c", stmt]
        # psql's messages go to a file, not a pipe: a query whose functions raise more notices than a
        # pipe holds (64 KiB) would stop psql until they were read, and they are read at the end
        messages = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=messages,
                                    stdin=subprocess.DEVNULL if script is None else subprocess.PIPE,
                                    pass_fds=(write_fd,), env={**config.subprocess_env(), **program_env})
        except BaseException:
            messages.close()
            raise
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # psql holds it: the stream ends when psql closes it
    data = open(read_fd, "rb")
    try:
        if script is not None and proc.stdin is not None:
            # the whole script before the stream is read: psql reads the COPY's lines before it runs
            # it, so what is left (COMMIT) fits in the pipe whatever the query's length
            with contextlib.suppress(BrokenPipeError):  # psql stopped early: its error is read at the stream's end
                proc.stdin.write(script.encode())
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        yield _CopyOut(proc, data, messages, config, key, count)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (data, messages, proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _last_bytes(f: Any, size: int = 1 << 16) -> bytes:
    """The end of the file ``f`` (psql's messages: the error is their last line)."""
    end = f.seek(0, os.SEEK_END)
    f.seek(max(0, end - size))
    return f.read()


def relay(con: Any, table: str, columns: Sequence[str], stream: NativeStream, key: str, freeze: bool = False,
          fmt: str = FORMAT) -> tuple[int, int]:
    """Forward ``stream`` into ``COPY table FROM STDIN`` on ``con`` (in its transaction): (rows, bytes).
    ``freeze``: the table was truncated in this transaction, so its rows are written frozen. ``fmt``: the
    stream's format (binary COPY, or COPY text lines)."""
    nbytes = 0
    options = ("FORMAT text" if fmt == TEXT_FORMAT else "FORMAT binary") + (", FREEZE" if freeze else "")
    with con.cursor() as cur:
        with cur.copy(f"COPY {table} ({', '.join(ident(c) for c in columns)}) FROM STDIN ({options})") as cp:
            while chunk := stream.read(CHUNK):
                if cancel_requested():
                    raise Cancelled(f"partition {key}: cancelled")
                cp.write(chunk)
                nbytes += len(chunk)
        return cur.rowcount, nbytes
