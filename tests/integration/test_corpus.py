"""The corpus test: tables after PostgreSQL's regression tests (tests/corpus/regress.sql: every built-in type family,
user types, inheritance and partition trees, collations, generated and identity columns) copied on every path, each
cell checked by PostgreSQL itself, not by Conveyor: the rows as PostgreSQL prints them, compared as multisets.

A cell is **exact** (the copy's rows print as the source's), **refused** (a Conveyor error naming a column of the table),
or **other**: an internal error, a refusal naming no column, or a copy that differs with exit 0 (a silent change). The
test fails on any "other" and prints the matrix.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import conveyor
from conveyor.errors import ConveyorError
from tests.helpers import pg_exec

pytestmark = [pytest.mark.usefixtures("pg_password"), pytest.mark.pg_versions]

CORPUS = Path(__file__).parent.parent / "corpus" / "regress.sql"

#: the tables copied (a partitioned table with its whole tree; an inheritance parent alone, its children apart)
TABLES = ["int_tbl", "float_tbl", "num_tbl", "num_wide", "money_tbl", "char_tbl", "bit_tbl", "bytea_tbl", "date_tbl", "misc_tbl", "xml_tbl",
          "json_tbl",
          "array_tbl", "range_tbl", "user_types_tbl", "geo_tbl", "collate_tbl", "defaults_tbl", "person", "emp", "student", "stud_emp",
          "part_range", "part_range_2021", "part_hash", "tenk"]

PATHS = ["pg->pg pass-through", "pg->pg arrow", "pg->parquet->pg", "pg->duckdb->pg"]


def _rows_sql(table: str) -> str:
    """The table's own rows (an inheritance parent without its children's: what a copy of it holds), as text."""
    return f"SELECT _r::text AS r FROM ONLY {table} _r" if not table.startswith("part_") else f"SELECT _r::text AS r FROM {table} _r"


def _pg(server, table: str, **more) -> dict:
    return {"type": "postgres", "port": server.port, "table": table, **more}


@pytest.fixture(scope="module")
def corpus(pg_source, pg_target) -> str:
    """The corpus in a database of its own on the source server, and an empty one of that name on the target."""
    for server in (pg_source, pg_target):
        pg_exec(server, "DROP DATABASE IF EXISTS corpus", "CREATE DATABASE corpus")
    pg_exec(pg_source, CORPUS.read_text(), "ANALYZE", dbname="corpus")
    return "corpus"


def _cell(run, check, columns: list[str]) -> str:
    try:
        run()
    except ConveyorError as exc:
        said = str(exc)
        named = any(re.search(rf"\b{re.escape(c)}\b", said) for c in columns)
        return f"refused: {said.splitlines()[0][:160]}" if named else f"other: refused naming no column: {said.splitlines()[0][:200]}"
    except Exception as exc:  # an error Conveyor did not translate
        return f"other: internal {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    differs = check()
    return "exact" if not differs else f"other: silent change: {differs}"


def test_every_corpus_table_on_every_path_is_exact_or_refused_by_name(corpus, pg_source, pg_target, tmp_path) -> None:
    src = lambda table, **more: _pg(pg_source, table, dbname=corpus, **more)  # noqa: E731
    matrix: dict[tuple[str, str], str] = {}
    present = {r[0] for r in pg_exec(pg_source, "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace", dbname=corpus)}
    for table in [t for t in TABLES if t in present]:  # (xml_tbl: only where the server takes xml)
        columns = _columns_of(pg_source, table)
        want = _digest_db(pg_source, _rows_sql(table))

        def same_on_target(copy: str, want=want) -> str:
            got = _digest_db(pg_target, f"SELECT _r::text AS r FROM {copy} _r")
            return "" if got == want else f"target {got[0]} rows, source {want[0]} (or the rows print otherwise)"

        def back_in_source(copy: str, want=want) -> str:
            got = _digest_db(pg_source, f"SELECT _r::text AS r FROM {copy} _r")
            return "" if got == want else f"back in PostgreSQL {got[0]} rows, source {want[0]} (or the rows print otherwise)"

        for path in PATHS:
            copy = f"c_{table}_{PATHS.index(path)}"
            if path.startswith("pg->pg"):
                pg_exec(pg_target, f"DROP TABLE IF EXISTS {copy}", dbname=corpus)
                mode = "arrow" if path.endswith("arrow") else "auto"

                def run(table=table, copy=copy, mode=mode):
                    conveyor.run(source=src(table), sink=_pg(pg_target, copy, dbname=corpus, copy_path=mode),
                                 strategy={"type": "auto"}, runtime={"type": "local"}, load_mode="create", degree=2)

                matrix[(table, path)] = _cell(run, lambda copy=copy: same_on_target(copy), columns)
                continue
            # out of PostgreSQL and back into a table of the source's own definition: PostgreSQL compares the two
            pg_exec(pg_source, f"DROP TABLE IF EXISTS {copy}", f"CREATE TABLE {copy} (LIKE {table})", dbname=corpus)
            if path == "pg->parquet->pg":
                middle = {"type": "parquet", "path": str(tmp_path / copy)}
                back = {"type": "parquet", "path": str(tmp_path / copy)}
            else:
                middle = {"type": "duckdb", "database": str(tmp_path / f"{copy}.duckdb"), "table": table}
                back = {"type": "duckdb", "database": str(tmp_path / f"{copy}.duckdb"), "table": table}

            def run(table=table, copy=copy, middle=middle, back=back):
                conveyor.run(source=src(table), sink=middle, strategy={"type": "auto"}, runtime={"type": "local"}, load_mode="create", degree=2)
                conveyor.run(source=back, sink=_pg(pg_source, copy, dbname=corpus), strategy={"type": "auto"}, runtime={"type": "local"},
                             load_mode="append", degree=2)

            matrix[(table, path)] = _cell(run, lambda copy=copy: back_in_source(copy), columns)
    counts: dict[str, int] = {}
    for outcome in matrix.values():
        counts[outcome.split(":")[0]] = counts.get(outcome.split(":")[0], 0) + 1
    lines = [f"{table:16} {path:22} {outcome}" for (table, path), outcome in matrix.items()]
    print("\n".join(lines) + f"\ncells: {counts}")
    others = [line for line, outcome in zip(lines, matrix.values()) if outcome.startswith("other")]
    assert not others, "\n".join(others)
    assert counts.get("exact", 0) >= len(matrix) * 3 // 4  # most cells are exact copies; the rest refusals by name


def _columns_of(server, table: str) -> list[str]:
    return [r[0] for r in pg_exec(server, f"SELECT attname FROM pg_attribute WHERE attrelid = '{table}'::regclass AND attnum > 0 "
                                          "AND NOT attisdropped ORDER BY attnum", dbname="corpus")]


def _digest_db(server, sql: str) -> tuple[int, str]:
    return tuple(pg_exec(server, f"SELECT count(*), md5(coalesce(string_agg(r, '|' ORDER BY r), '')) FROM ({sql}) x", dbname="corpus")[0])
