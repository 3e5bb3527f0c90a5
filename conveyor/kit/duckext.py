"""DuckDB extensions from their PyPI wheels, installed offline (no download) into a per-user cache folder.

``duckdb-extension-postgres`` and ``duckdb-extension-mysql`` carry the extension file built for one
duckdb version, and pin duckdb to it; DuckDB installs a file under its canonical name only, so the
file is copied to that name first, then ``FORCE INSTALL``-ed into an extension directory of ours.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: extension -> (the PyPI package's module, the file name DuckDB installs it under, the pip extra)
KNOWN = {"postgres": ("duckdb_extension_postgres", "postgres_scanner", "postgres"),
         "mysql": ("duckdb_extension_mysql", "mysql_scanner", "mysql")}

_LOCK = threading.Lock()
_READY: dict[str, str] = {}


def extension_dir(name: str) -> str:
    """The extension directory holding ``name``, installed from its wheel once per machine and
    DuckDB version. Once installed, finding it imports neither DuckDB nor the wheel's package (a
    job that never reads through DuckDB, a PostgreSQL pass-through, pays nothing for asking)."""
    with _LOCK:
        if name in _READY:
            return _READY[name]
        module, canonical, extra = KNOWN[name]
        try:
            version = importlib.metadata.version("duckdb")
        except importlib.metadata.PackageNotFoundError:
            raise RuntimeError("the Python package duckdb is not installed") from None
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"the Python package {module.replace('_', '-')} is not installed "
                               f"(pip install 'conveyor[{extra}]' brings it)")
        pkg = Path(next(iter(spec.submodule_search_locations)))
        ext = next(pkg.rglob("*.duckdb_extension"), None)
        if ext is None:
            raise RuntimeError(f"{module.replace('_', '-')} holds no extension file ({pkg})")
        uid = os.getuid() if hasattr(os, "getuid") else 0
        root = Path(tempfile.gettempdir()) / f"conveyor-duckdb-{uid}" / version
        extdir = root / "extensions"
        done = extdir / f"{canonical}.done"
        if not done.exists():
            import duckdb

            root.mkdir(parents=True, exist_ok=True)
            file = root / f"{canonical}.duckdb_extension"
            tmp = root / f".{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.write_bytes(ext.read_bytes())
            os.replace(tmp, file)
            con = duckdb.connect(config={"extension_directory": str(extdir)})
            try:
                con.execute(f"FORCE INSTALL '{file}'")
                con.execute(f"LOAD {name}")
            finally:
                con.close()
            done.touch()
        _READY[name] = str(extdir)
        return _READY[name]


def unavailable(name: str) -> str | None:
    """Why the extension cannot load in this process (None: it can)."""
    try:
        extension_dir(name)
    except Exception as exc:  # any reason, reported as one line
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def quote(value: object) -> str:
    """A DuckDB string literal."""
    return "'" + str(value).replace("'", "''") + "'"


# --- one in-memory DuckDB per process and server, with the server attached (LOAD costs ~0.1 s: paid once) ---

_DATABASES: dict[tuple[object, ...], object] = {}
#: one lock per key, held while its DuckDB is made: the partitions a job starts at once wait for the
#: first one's instead of each making (and then closing) their own
_MAKING: dict[tuple[object, ...], threading.Lock] = {}


def attached(key: tuple[object, ...], make: Callable[[], Any]) -> Any:
    """This process's DuckDB for ``key`` (a server and its credentials), made by ``make`` the first
    time; a thread that asks while it is being made waits for it (making one costs ~0.2 CPU-s: the
    extension's LOAD and the ATTACH's connection and catalog reads)."""
    with _LOCK:
        db = _DATABASES.get(key)
        if db is not None:
            return db
        making = _MAKING.setdefault(key, threading.Lock())
    with making:
        with _LOCK:
            db = _DATABASES.get(key)
        if db is None:
            db = make()
            with _LOCK:
                _DATABASES[key] = db
        return db


@contextlib.contextmanager
def cursor(key: tuple[object, ...], make: Callable[[], Any]) -> Iterator[Any]:
    """A cursor of this process's DuckDB for ``key`` (:func:`attached`), closed after the block; a block
    that failed makes the DuckDB forgotten (its server connections may be broken)."""
    con = attached(key, make).cursor()
    ok = False
    try:
        yield con
        ok = True
    finally:
        with contextlib.suppress(Exception):
            con.close()
        if not ok:
            forget(key)


def forget(key: tuple[object, ...]) -> None:
    """Stop handing out a DuckDB whose server connections may be broken (a failed read or write): the next use
    makes a new one. It is not closed here: another partition's thread may still be reading through it
    (closing it under that reader aborts the process); it closes when its last cursor is gone."""
    with _LOCK:
        _DATABASES.pop(key, None)
