"""DuckDB's connections, one thread at a time opening and closing a file, and its identifiers."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from conveyor.errors import ConnectError


def qident(name: str) -> str:
    """A DuckDB identifier, double-quoted with embedded quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str, table: str) -> str:
    return f"{qident(schema)}.{qident(table)}"


#: DuckDB's connect and close, one thread at a time in a process: each partition's write opens the
#: file and closes it after its commit, and a close that shut the file's database down (its last
#: connection) while another thread opened the same file failed that open ("Unique file handle
#: conflict: ... already attached"; ~3% of opens with two threads here)
_OPEN_CLOSE = threading.Lock()


def connect(database: str, read_only: bool = False) -> Any:
    import duckdb

    try:
        with _OPEN_CLOSE:
            return duckdb.connect(database, read_only=read_only)
    except duckdb.Error as exc:
        raise ConnectError(f"duckdb database {database!r}: {str(exc).splitlines()[0]}",
                           hint="check the path and that no other process holds it open for writing") from None


def new_file(database: str) -> bool:
    """Whether connecting to ``database`` makes its file (an in-memory database has none)."""
    return database not in ("", ":memory:") and not database.startswith(":memory:") and not os.path.exists(database)


def remove_file(database: str) -> None:
    """A database file a failed run made, and its write-ahead log, removed."""
    for path in (database, f"{database}.wal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def close(con: Any) -> None:
    with _OPEN_CLOSE:
        con.close()


def swap_blocker(con: Any, schema: str, table: str, stage: str) -> str | None:
    """Why the staged copy of ``table`` (made by ``CREATE TABLE stage AS SELECT * FROM table LIMIT 0``)
    cannot simply take its place; None when nothing tells them apart: the same CREATE statement after
    the name (column names, types, defaults, NOT NULL, keys, CHECKs), and on the target no index, no
    comment or tag, and nothing that refers to it (a foreign key, a catalog dependency)."""
    tables = {r[0]: r[1:] for r in con.execute(
        "SELECT table_name, sql, comment, tags, index_count, table_oid FROM duckdb_tables() "
        "WHERE database_name = current_database() AND schema_name = ? AND table_name IN (?, ?)", [schema, table, stage]).fetchall()}
    if table not in tables or stage not in tables:
        return "the target or its stage is not in the catalog"
    (sql, comment, tags, indexes, oid), stage_sql = tables[table], tables[stage][0]
    if sql[sql.find("("):] != stage_sql[stage_sql.find("("):]:
        return "its DDL has what a copy of its columns does not: keys, defaults, NOT NULL or CHECKs"
    if indexes:
        return f"it has {indexes} index(es)"
    if comment is not None or tags:
        return "it has a comment or tags"
    if con.execute("SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = ? "
                   "AND table_name = ? AND comment IS NOT NULL", [schema, table]).fetchone()[0]:
        return "a column has a comment"
    if con.execute("SELECT count(*) FROM duckdb_constraints() WHERE database_name = current_database() "
                   "AND constraint_type = 'FOREIGN KEY' AND referenced_table = ?", [table]).fetchone()[0]:
        return "a foreign key refers to it"
    if con.execute("SELECT count(*) FROM duckdb_dependencies() WHERE objid = ? OR refobjid = ?", [oid, oid]).fetchone()[0]:
        return "another catalog entry depends on it"
    return None


def target_schema(con: Any, table: str) -> Any:
    """A table's columns as Arrow types, each DuckDB type as the one that holds it exactly (UUID as arrow.uuid,
    not the text DuckDB exports by default, so a UUID column takes a uuid source as it is)."""
    import duckdb

    try:
        con.execute("SET arrow_lossless_conversion = true")
    except duckdb.Error:  # a DuckDB without the setting
        pass
    import pyarrow as pa

    try:
        schema = con.execute(f"SELECT * FROM {table} LIMIT 0").arrow().schema
        # ... but a BOOLEAN as Arrow's bool (lossless conversion exports it as the arrow.bool8 extension, which no
        # Arrow bool casts to: every bool column into DuckDB was refused as a change of meaning)
        return pa.schema([f.with_type(pa.bool_()) if getattr(f.type, "extension_name", "") == "arrow.bool8" else f for f in schema],
                         metadata=schema.metadata)
    finally:
        with contextlib.suppress(duckdb.Error):
            con.execute("RESET arrow_lossless_conversion")


def refuse_wide_decimals(schema: Any, where: str) -> None:
    """A decimal of more than 38 digits refused by its column: DuckDB's DECIMAL holds 38, and its Arrow import
    refuses a wider one naming no column."""
    import pyarrow as pa

    from conveyor.errors import SchemaError

    wide = next((f for f in schema if pa.types.is_decimal(f.type) and f.type.precision > 38), None)
    if wide is not None:
        raise SchemaError(f"{where}: column {wide.name} ({wide.type}) has more digits than DuckDB's DECIMAL holds (38)",
                          hint="cast it in source.query: to text (exact), or to numeric(38, s) where its values fit")
