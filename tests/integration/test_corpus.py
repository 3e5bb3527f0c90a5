"""The corpus test: tables after PostgreSQL's regression tests (tests/corpus/regress.sql: every built-in type family,
user types, inheritance and partition trees, collations, generated and identity columns) copied on every path, each
cell checked by PostgreSQL itself, not by Conveyor: the rows as PostgreSQL prints them, compared as multisets.

A cell is **exact** (the copy's rows print as the source's), **refused** (a Conveyor error naming a column of the table),
or **other**: an internal error, a refusal naming no column, or a copy that differs with exit 0 (a silent change). The
test fails on any "other" and prints the matrix.
"""

from __future__ import annotations

import os
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
          "part_range", "part_range_2021", "part_hash", "tenk", "sys_types_tbl", "more_arrays_tbl"]

#: ``make corpus`` (not ``make test``: the suite's time): the other targets table by table and every path column by column
DEEP = os.environ.get("CONVEYOR_CORPUS_DEEP") == "1"

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
    # on the matrix's second version the paths where the server's version matters: PostgreSQL to PostgreSQL (the
    # files' paths read and write PostgreSQL as the Arrow path does; all four on 18 in make corpus)
    paths = PATHS if DEEP or pg_source.version in ("", "15") else PATHS[:2]
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

        for path in paths:
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


#: out of PostgreSQL into each other kind of target Conveyor writes, and back into a table of the source's definition
OTHER_PATHS = ["pg->csv->pg", "pg->mysql->pg", "pg->clickhouse->pg", "pg->delta->pg", "pg->iceberg->pg"]


def _middle(path: str, name: str, folder: Path, mysql, clickhouse) -> dict:
    """The target (and, read back, the source) of ``path``'s middle step."""
    kind = path.split("->")[1]
    if kind == "csv":
        return {"type": "csv", "path": str(folder / name)}
    if kind == "mysql":
        return {"type": "mysql", "port": mysql.port, "user": mysql.user, "database": mysql.database, "table": name}
    if kind == "clickhouse":
        return {"type": "clickhouse", "port": clickhouse.http_port, "table": name}
    if kind == "delta":
        return {"type": "delta", "path": str(folder / "delta" / name)}
    return {"type": "iceberg", "table": f"lake.{name}",
            "catalog": {"type": "sql", "uri": f"sqlite:///{folder}/catalog.db", "warehouse": f"file://{folder}/warehouse"}}


#: cells known to change a value, each with why: the test fails if one of them stops changing (take it out then) or
#: another cell starts. None now (the last, a CSV decimal column of varied scales into numeric without a scale, is
#: refused by name: docs/files.md).
KNOWN: dict[tuple[str, str], str] = {}


@pytest.mark.skipif(not DEEP, reason="make corpus (CONVEYOR_CORPUS_DEEP=1): the other targets, ~2 minutes")
@pytest.mark.pg_versions("15")  # the subject is the other targets: one PostgreSQL version
@pytest.mark.parametrize("path", OTHER_PATHS)
def test_every_corpus_table_through_every_other_target_and_back_is_exact_or_refused_by_name(
        corpus, pg_source, mysql_server, clickhouse_server, tmp_path, path) -> None:
    """Each table into CSV, MySQL/MariaDB, ClickHouse, Delta and Iceberg (``load_mode=create``, as a user would) and back
    into a table of the source's own definition: PostgreSQL compares the two. A target that cannot hold a value must refuse
    it by name on the way out, or the way back must (the typed column refuses text it would have to parse)."""
    src = lambda table: _pg(pg_source, table, dbname=corpus)  # noqa: E731
    present = {r[0] for r in pg_exec(pg_source, "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace", dbname=corpus)}
    matrix: dict[str, str] = {}
    for table in [t for t in TABLES if t in present]:
        want = _digest_db(pg_source, _rows_sql(table))
        copy, name = f"o_{table}_{OTHER_PATHS.index(path)}", f"{table}_{OTHER_PATHS.index(path)}"
        pg_exec(pg_source, f"DROP TABLE IF EXISTS {copy}", f"CREATE TABLE {copy} (LIKE {table})", dbname=corpus)
        middle = _middle(path, name, tmp_path, mysql_server, clickhouse_server)

        def run(table=table, copy=copy, middle=middle):
            conveyor.run(source=src(table), sink=middle, strategy={"type": "auto"}, runtime={"type": "local"}, load_mode="create", degree=2)
            conveyor.run(source=dict(middle), sink=_pg(pg_source, copy, dbname=corpus), strategy={"type": "auto"},
                         runtime={"type": "local"}, load_mode="append", degree=2)

        def back_in_source(copy=copy, want=want) -> str:
            got = _digest_db(pg_source, f"SELECT _r::text AS r FROM {copy} _r")
            return "" if got == want else f"back in PostgreSQL {got[0]} rows, source {want[0]} (or the rows print otherwise)"

        matrix[table] = _cell(run, back_in_source, _columns_of(pg_source, table))
        if (table, path) in KNOWN:
            assert matrix[table].startswith("other: silent change"), f"{table} {path} is {matrix[table]} now: take it out of KNOWN"
            matrix[table] = f"known: {KNOWN[(table, path)]}"
    counts: dict[str, int] = {}
    for outcome in matrix.values():
        counts[outcome.split(":")[0]] = counts.get(outcome.split(":")[0], 0) + 1
    lines = [f"{table:16} {path:20} {outcome}" for table, outcome in matrix.items()]
    print("\n".join(lines) + f"\ncells: {counts}")
    others = [line for line, outcome in zip(lines, matrix.values()) if outcome.startswith("other")]
    assert not others, "\n".join(others)
    assert counts.get("exact", 0) >= len(matrix) // 3  # the tables of plain types travel exactly; the rest are refusals by name


def _columns_of(server, table: str) -> list[str]:
    return [r[0] for r in pg_exec(server, f"SELECT attname FROM pg_attribute WHERE attrelid = '{table}'::regclass AND attnum > 0 "
                                          "AND NOT attisdropped ORDER BY attnum", dbname="corpus")]


def _digest_db(server, sql: str) -> tuple[int, str]:
    return tuple(pg_exec(server, f"SELECT count(*), md5(coalesce(string_agg(r, '|' ORDER BY r), '')) FROM ({sql}) x", dbname="corpus")[0])


#: every path, column by column (``make corpus``): a table refused by name is copied again without the column named, until
#: the rest copies or nothing is left, so a column behind another's refusal is tried too (not in ``make test``)
ALL_PATHS = ["pg->pg arrow", "pg->parquet->pg", "pg->duckdb->pg", *OTHER_PATHS]


@pytest.mark.skipif(not DEEP, reason="make corpus (CONVEYOR_CORPUS_DEEP=1): every column on every path, ~4 minutes")
@pytest.mark.pg_versions("15")
@pytest.mark.parametrize("path", ALL_PATHS)
def test_every_corpus_column_on_every_path_is_exact_or_refused_by_name(corpus, pg_source, pg_target, mysql_server, clickhouse_server,
                                                                        tmp_path, path) -> None:
    """Each table with the job's ``columns`` (a table made from a subset keeps the source's types), the column a refusal
    names left out of the next try; the columns that remain are compared by PostgreSQL as in the tests above."""
    present = {r[0] for r in pg_exec(pg_source, "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace", dbname=corpus)}
    matrix: dict[str, str] = {}
    run_args = {"strategy": {"type": "auto"}, "runtime": {"type": "local"}, "degree": 2}
    for table in [t for t in TABLES if t in present]:
        columns = _columns_of(pg_source, table)
        generated = {r[0] for r in pg_exec(pg_source, f"SELECT attname FROM pg_attribute WHERE attrelid = '{table}'::regclass "
                                                      "AND attgenerated <> ''", dbname=corpus)}
        refused: list[str] = []
        for attempt in range(len(columns)):
            use = [c for c in columns if c not in refused]
            if set(use) <= generated:
                matrix[table] = f"refused: every column ({', '.join(refused)})"
                break
            picked = ", ".join(f'"{c}"' for c in use)
            want = _digest_db(pg_source, f"SELECT _r::text AS r FROM (SELECT {picked} FROM {'' if table.startswith('part_') else 'ONLY '}{table}) _r")
            n = f"{ALL_PATHS.index(path)}_{attempt}"
            copy, name = f"d_{table}_{n}", f"{table}_{n}"
            if path == "pg->pg arrow":
                def run(table=table, copy=copy, use=use):
                    conveyor.run(source=_pg(pg_source, table, dbname=corpus), sink=_pg(pg_target, copy, dbname=corpus, copy_path="arrow"),
                                 columns=use, load_mode="create", **run_args)
                server = pg_target
            else:
                pg_exec(pg_source, f"DROP TABLE IF EXISTS {copy}", f"CREATE TABLE {copy} (LIKE {table})",
                        *[f'ALTER TABLE {copy} DROP COLUMN "{c}"' for c in refused], dbname=corpus)
                if path == "pg->parquet->pg":
                    middle = {"type": "parquet", "path": str(tmp_path / name)}
                elif path == "pg->duckdb->pg":
                    middle = {"type": "duckdb", "database": str(tmp_path / f"{name}.duckdb"), "table": name}
                else:
                    middle = _middle(path, name, tmp_path, mysql_server, clickhouse_server)

                def run(table=table, copy=copy, use=use, middle=middle):
                    conveyor.run(source=_pg(pg_source, table, dbname=corpus), sink=middle, columns=use, load_mode="create", **run_args)
                    conveyor.run(source=dict(middle), sink=_pg(pg_source, copy, dbname=corpus), load_mode="append", **run_args)
                server = pg_source

            def same(copy=copy, picked=picked, want=want, server=server) -> str:
                got = _digest_db(server, f"SELECT _r::text AS r FROM (SELECT {picked} FROM {copy}) _r")
                return "" if got == want else f"{got[0]} rows, source {want[0]} (or the rows print otherwise)"

            outcome = _cell(run, same, use)
            named = [c for c in use if outcome.startswith("refused") and re.search(rf"\b{re.escape(c)}\b", outcome)]
            if not named:
                matrix[table] = outcome + (f" (refused by name: {', '.join(refused)})" if refused else "")
                break
            refused.append(named[0])
        if (table, path) in KNOWN and matrix[table].startswith("other: silent change"):
            matrix[table] = f"known: {KNOWN[(table, path)]}"
    lines = [f"{table:16} {path:20} {outcome}" for table, outcome in matrix.items()]
    print("\n".join(lines))
    others = [line for line, outcome in zip(lines, matrix.values()) if outcome.startswith("other")]
    assert not others, "\n".join(others)
