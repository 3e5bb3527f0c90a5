"""create / replace of a new PostgreSQL table from a PostgreSQL source table carries the table's definition
(sink.definition): NOT NULL, defaults, identity and serial columns with their sequences past the copied values,
CHECK / UNIQUE / EXCLUDE constraints, the other indexes, comments; and says what it did not carry (triggers,
generated expressions, ...). On the main this started from, only the primary key (and, on request, the foreign
keys) was made: the copy of a table lost its defaults, its sequences and every secondary index.

Each test compares the two tables through the catalogs, names aside (an index's name is unique per schema, so a
copy's are the target's: ``dt_src_code_key`` -> ``dt_copy_code_key``).
"""

from __future__ import annotations

import json
import re

import pytest

from conveyor.errors import SchemaError
from tests.helpers import job, pg_exec

pytestmark = [pytest.mark.usefixtures("pg_password"), pytest.mark.pg_versions]  # on PostgreSQL 15 and 18

SOURCE = [
    "DROP TABLE IF EXISTS dt_src CASCADE", "DROP FUNCTION IF EXISTS dt_touch() CASCADE",
    """CREATE TABLE dt_src (
        id bigint GENERATED ALWAYS AS IDENTITY (START WITH 10 INCREMENT BY 5) PRIMARY KEY,
        ser serial,
        code text NOT NULL UNIQUE,
        qty int NOT NULL DEFAULT 1 CHECK (qty > 0),
        price numeric(12,2) DEFAULT 0.00,
        made timestamptz NOT NULL DEFAULT now(),
        tag text DEFAULT 'none'::text,
        lo int, hi int,
        doubled int GENERATED ALWAYS AS (qty * 2) STORED,
        CONSTRAINT dt_src_range CHECK (lo <= hi),
        CONSTRAINT dt_src_pair UNIQUE (lo, hi) DEFERRABLE INITIALLY DEFERRED,
        CONSTRAINT dt_src_excl EXCLUDE USING btree (tag WITH =) WHERE (tag <> 'none'))""",
    "CREATE INDEX dt_src_lower_code ON dt_src (lower(code))",
    "CREATE INDEX dt_src_cheap ON dt_src (price DESC NULLS LAST) INCLUDE (qty) WHERE price < 100",
    "CREATE INDEX by_hash ON dt_src USING hash (tag)",
    "COMMENT ON TABLE dt_src IS 'the source''s table'", "COMMENT ON COLUMN dt_src.code IS 'a code, é'",
    "CREATE FUNCTION dt_touch() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'",
    "CREATE TRIGGER dt_src_touch BEFORE UPDATE ON dt_src FOR EACH ROW EXECUTE FUNCTION dt_touch()",
    "INSERT INTO dt_src (code, qty, price, tag, lo, hi) SELECT 'c' || g, 1 + g % 7, g / 3.0, CASE WHEN g % 100 = 0 THEN 't' || g ELSE 'none' END, "
    "g, g + 1 FROM generate_series(1, 3000) g",
    "SELECT nextval('dt_src_ser_seq') FROM generate_series(1, 50)",  # the serial's sequence runs ahead of the rows
]


def _definition(server, table: str) -> dict:
    """The table's definition from the catalogs, its own name replaced by T (and sequence names by S)."""
    def norm(text: str | None) -> str | None:
        return None if text is None else re.sub(r"\w*_seq\b", "S", text.replace(table, "T"))

    rows = lambda sql: pg_exec(server, sql.replace("%T", f"'{table}'::regclass"))  # noqa: E731
    return {
        "columns": [tuple(norm(str(v)) if v is not None else None for v in r) for r in rows(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull, attidentity, pg_get_expr(adbin, adrelid), "
            "col_description(attrelid, attnum) FROM pg_attribute LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum "
            "WHERE attrelid = %T AND attnum > 0 ORDER BY attnum")],
        "constraints": sorted((norm(n), t, d) for n, t, d in rows(
            # (PostgreSQL 18 keeps NOT NULL as constraints too, contype 'n': compared above as attnotnull)
            "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %T AND contype <> 'n'")),
        "indexes": sorted(norm(re.sub(r"^CREATE (UNIQUE )?INDEX \S+ ON \S+", r"\1", d)) for (d,) in rows(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %T")),
        "index_names": sorted(norm(n) for (n,) in rows("SELECT relname FROM pg_index JOIN pg_class ON oid = indexrelid WHERE indrelid = %T")),
        "comment": rows("SELECT obj_description(%T, 'pg_class')")[0][0],
    }


@pytest.mark.parametrize("where", ["another server", "the same schema"])
def test_create_carries_the_whole_definition_and_sets_sequences_past_the_rows(pg_source, pg_target, where: str) -> None:
    target = pg_target if where == "another server" else pg_source
    pg_exec(pg_source, *SOURCE)
    pg_exec(target, "DROP TABLE IF EXISTS dt_copy")
    report = job({"type": "postgres", "port": pg_source.port, "table": "dt_src"},
                 {"type": "postgres", "port": target.port, "table": "dt_copy"}, "ctid", {"partitions": 3}, degree=2, load_mode="create")
    assert report.rows == 3000
    src, got = _definition(pg_source, "dt_src"), _definition(target, "dt_copy")
    generated = [c for c in src["columns"] if c[0] == "doubled"][0]
    # every element but the generated column's expression (its values are copied: a generated column takes none)
    assert [c for c in got["columns"] if c[0] != "doubled"] == [c for c in src["columns"] if c[0] != "doubled"]
    assert [c for c in got["columns"] if c[0] == "doubled"] == [(*generated[:4], None, None)]
    assert got["constraints"] == src["constraints"] and got["indexes"] == src["indexes"] and got["comment"] == src["comment"]
    assert got["index_names"] == sorted(["T_cheap", "T_code_key", "T_excl", "T_lower_code", "T_pair", "T_pkey", "T_by_hash"])
    # the sequences stand past the copied values and the source's own: a new row takes the next free key
    id_max, ser_next = pg_exec(pg_source, "SELECT max(id), nextval('dt_src_ser_seq') FROM dt_src")[0]
    new = pg_exec(target, "INSERT INTO dt_copy (code, lo, hi) VALUES ('new', 0, 0) RETURNING id, ser, qty, tag, made IS NOT NULL")[0]
    assert new == (id_max + 5, ser_next, 1, "none", True)
    with pytest.raises(Exception, match="cannot insert a non-DEFAULT value into column \"id\""):
        pg_exec(target, "INSERT INTO dt_copy (id, code) VALUES (1, 'x')")  # GENERATED ALWAYS, as on the source


def test_what_is_not_carried_is_said_and_definition_false_makes_columns_and_key_only(pg_source, pg_target, cli, tmp_path) -> None:
    pg_exec(pg_source, *SOURCE)
    pg_exec(pg_target, "DROP TABLE IF EXISTS dt_copy", "DROP TABLE IF EXISTS dt_bare")
    res = cli("run", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=dt_src", f"sink.port={pg_target.port}",
              "sink.table=dt_copy", "load_mode=create")
    assert res.code == 0, res.err
    text = " ".join((res.out + res.err).split())
    assert "definition carried: 5 NOT NULL, 4 default(s), 2 sequence(s), 5 constraint(s), 3 index(es), 2 comment(s)" in text, text[-3000:]
    assert "not carried: column doubled's generation expression ((qty * 2)): its values are copied into a plain column; trigger dt_src_touch" in text
    report = json.loads(next((tmp_path / "hydra-run").glob("**/report.json")).read_text())
    assert report["definition"].startswith("definition carried: 5 NOT NULL") and "trigger dt_src_touch" in report["definition"]
    res = cli("run", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=dt_src", f"sink.port={pg_target.port}",
              "sink.table=dt_bare", "load_mode=create", "sink.definition=false")
    assert res.code == 0, res.err
    bare = _definition(pg_target, "dt_bare")
    assert bare["index_names"] == ["T_pkey"] and all(c[2] == "False" or c[0] == "id" for c in bare["columns"])


def test_a_definition_the_target_cannot_take_is_one_line_and_leaves_no_table(pg_source, pg_target) -> None:
    """A default calling a function the target's database lacks: refused by name at the finalize, nothing made."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS dt_fn", "DROP FUNCTION IF EXISTS dt_only_here()",
            "CREATE FUNCTION dt_only_here() RETURNS int LANGUAGE sql AS 'SELECT 7'",
            "CREATE TABLE dt_fn (id int PRIMARY KEY, v int DEFAULT dt_only_here())", "INSERT INTO dt_fn VALUES (1, 1), (2, 2)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS dt_fn_copy", "DROP FUNCTION IF EXISTS dt_only_here()")
    with pytest.raises(SchemaError, match=r"the source table's definition could not be carried: function dt_only_here\(\) does not exist") as caught:
        job({"type": "postgres", "port": pg_source.port, "table": "dt_fn"}, {"type": "postgres", "port": pg_target.port, "table": "dt_fn_copy"},
            load_mode="create")
    assert "sink.definition=false" in caught.value.hint
    assert pg_exec(pg_target, "SELECT to_regclass('dt_fn_copy') IS NULL, count(*) FROM pg_class WHERE relname LIKE '%conveyor%stage%'")[0] == \
        (True, 0)


def test_column_types_set_a_new_tables_types_checked_like_any_cast(pg_source, pg_target) -> None:
    """sink.column_types: the target's type for a column of a table the load makes (on the main this started from,
    create took the source's types with no way to set one); a type that would change values is refused by name
    before a row moves unless sink.allow_cast names it; an unknown type, or the key on a load into an existing table,
    is one line."""
    from conveyor.errors import ConfigError

    pg_exec(pg_source, "DROP TABLE IF EXISTS dt_typed", "CREATE TABLE dt_typed (id int PRIMARY KEY, price numeric(12,2), code text)",
            "INSERT INTO dt_typed SELECT g, g * 1.25, 'c' || g FROM generate_series(1, 1000) g")
    src = {"type": "postgres", "port": pg_source.port, "table": "dt_typed"}
    sink = {"type": "postgres", "port": pg_target.port, "table": "dt_typed_copy"}
    pg_exec(pg_target, "DROP TABLE IF EXISTS dt_typed_copy")
    report = job(src, {**sink, "column_types": {"price": "numeric(20,4)", "code": "varchar(50)"}}, "ctid", {"partitions": 2}, degree=2,
                 load_mode="create")
    assert report.rows == 1000 and report.sink_plan.native is None  # not the source's types: through Arrow
    types = dict(pg_exec(pg_target, "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                                    "WHERE attrelid = 'dt_typed_copy'::regclass AND attnum > 0"))
    assert (types["price"], types["code"], types["id"]) == ("numeric(20,4)", "character varying(50)", "integer")
    assert pg_exec(pg_target, "SELECT sum(price), max(length(code)) FROM dt_typed_copy")[0] == \
        pg_exec(pg_source, "SELECT sum(price), max(length(code)) FROM dt_typed")[0]
    pg_exec(pg_target, "DROP TABLE dt_typed_copy")
    with pytest.raises(SchemaError, match=r"price") as caught:  # 1.25 does not fit numeric(5,1)
        job(src, {**sink, "column_types": {"price": "numeric(5,1)"}}, load_mode="create")
    assert "allow_cast" in caught.value.hint
    assert pg_exec(pg_target, "SELECT to_regclass('dt_typed_copy') IS NULL")[0][0]
    with pytest.raises(ConfigError, match=r"sink.column_types: price: 'nosuchtype' is not a type the target's server has"):
        job(src, {**sink, "column_types": {"price": "nosuchtype"}}, load_mode="create")
    with pytest.raises(ConfigError, match=r"sink.column_types: the source has no column nope"):
        job(src, {**sink, "column_types": {"nope": "text"}}, load_mode="create")
    job(src, {**sink, "column_types": {"price": "numeric(5,1)"}, "allow_cast": ["price"]}, load_mode="create")
    assert pg_exec(pg_target, "SELECT price::text FROM dt_typed_copy WHERE id = 1")[0][0] == "1.3"  # PostgreSQL's own rounding, as allowed
    with pytest.raises(ConfigError, match="sink.column_types: applies to a table the load makes"):
        job(src, {**sink, "column_types": {"price": "text"}}, load_mode="append")


def test_duckdb_takes_the_keys_not_null_and_comments_and_says_the_rest(pg_source, tmp_path, cli) -> None:
    """Across engines (PostgreSQL -> DuckDB): NOT NULL, the primary key (built over the rows, in the swap's transaction)
    and the comments; the rest is named as not carried (on the main this started from, a DuckDB table made from any
    source had none of them, and nothing said so)."""
    import duckdb

    pg_exec(pg_source, *SOURCE)
    db = tmp_path / "t.duckdb"
    res = cli("run", "source=postgres", f"source.port={pg_source.port}", "source.table=dt_src", "sink=duckdb", f"sink.database={db}",
              "sink.table=copy", "strategy=ctid", "load_mode=create")
    assert res.code == 0, res.err
    text = " ".join(res.err.split())
    assert "definition carried: 5 NOT NULL, 1 primary key, 2 comment(s); not carried: 4 default(s); 2 identity/serial column(s)" in text
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT constraint_column_names FROM duckdb_constraints() WHERE table_name = 'copy' "
                           "AND constraint_type = 'PRIMARY KEY'").fetchall() == [(["id"],)]
        nullable = dict(con.execute("SELECT column_name, is_nullable FROM duckdb_columns() WHERE table_name = 'copy'").fetchall())
        assert [c for c, n in nullable.items() if not n] == ["id", "ser", "code", "qty", "made"]
        assert con.execute("SELECT comment FROM duckdb_tables() WHERE table_name = 'copy'").fetchone()[0] == "the source's table"
        assert con.execute("SELECT count(*), count(DISTINCT id) FROM copy").fetchone() == (3000, 3000)


def test_mysql_takes_the_keys_not_null_and_comments_made_with_the_table(pg_source, mysql_server) -> None:
    """PostgreSQL -> MySQL: NOT NULL, the primary key and the comments in the CREATE TABLE (InnoDB keeps its rows in
    key order: a key added after would rebuild the table); on the main this started from, none of them."""
    pg_exec(pg_source, *SOURCE)
    mysql_server.execute("DROP TABLE IF EXISTS dt_my")
    job({"type": "postgres", "port": pg_source.port, "table": "dt_src"},
        {"type": "mysql", "port": mysql_server.port, "user": mysql_server.user, "database": mysql_server.database, "table": "dt_my"},
        "ctid", {"partitions": 2}, degree=2, load_mode="create")
    cols = mysql_server.execute("SELECT column_name, is_nullable, column_key, column_comment FROM information_schema.columns "
                              "WHERE table_schema = DATABASE() AND table_name = 'dt_my' ORDER BY ordinal_position")
    assert [c[0] for c in cols if c[1] == "NO"] == ["id", "ser", "code", "qty", "made"]
    assert [c[0] for c in cols if c[2] == "PRI"] == ["id"] and dict((c[0], c[3]) for c in cols)["code"] == "a code, é"
    assert mysql_server.execute("SELECT table_comment FROM information_schema.tables WHERE table_schema = DATABASE() "
                              "AND table_name = 'dt_my'")[0][0] == "the source's table"
    assert mysql_server.execute("SELECT count(*), count(DISTINCT id) FROM dt_my")[0] == (3000, 3000)


@pytest.mark.parametrize("mode", ["create", "replace"])
def test_a_created_table_keeps_no_staging_label_as_its_comment(pg_source, pg_target, mode: str) -> None:
    """The stage's label (a JSON comment naming its run, for conveyor clean) was left as the comment of every table a
    create or replace made from a source table without one."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS lbl_src", "CREATE TABLE lbl_src (id int PRIMARY KEY, v text)", "INSERT INTO lbl_src VALUES (1, 'a')")
    pg_exec(pg_target, "DROP TABLE IF EXISTS lbl_t")
    for _ in range(2 if mode == "replace" else 1):
        job({"type": "postgres", "port": pg_source.port, "table": "lbl_src"}, {"type": "postgres", "port": pg_target.port, "table": "lbl_t"},
            load_mode=mode)
    assert pg_exec(pg_target, "SELECT obj_description('lbl_t'::regclass, 'pg_class')") == [(None,)]
    pg_exec(pg_source, "COMMENT ON TABLE lbl_src IS 'the source''s own'")
    pg_exec(pg_target, "DROP TABLE lbl_t")
    job({"type": "postgres", "port": pg_source.port, "table": "lbl_src"}, {"type": "postgres", "port": pg_target.port, "table": "lbl_t"},
        load_mode=mode)
    assert pg_exec(pg_target, "SELECT obj_description('lbl_t'::regclass, 'pg_class')") == [("the source's own",)]


@pytest.mark.parametrize("copy_path", ["auto", "arrow"])
def test_create_keeps_built_in_range_types_and_column_collations(pg_source, pg_target, copy_path: str) -> None:
    """Built-in range and multirange columns became text (and an EXCLUDE on them was then refused, naming text); a column's
    COLLATE "C" was dropped (the copy sorted differently)."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS rng_src", "CREATE TABLE rng_src (id int PRIMARY KEY, r int4range, d daterange, "
                       "m int4multirange, t text COLLATE \"C\", v varchar(10) COLLATE \"POSIX\", plain text)",
            "INSERT INTO rng_src VALUES (1, '[1,5)', '[2020-01-01,2020-02-01)', '{[1,2),[5,9)}', 'b', 'B', 'x'), "
            "(2, 'empty', NULL, '{}', 'a', 'a', 'y'), (3, '[10,)', '[2021-01-01,)', NULL, 'B', 'b', NULL)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS rng_t")
    job({"type": "postgres", "port": pg_source.port, "table": "rng_src"},
        {"type": "postgres", "port": pg_target.port, "table": "rng_t", "copy_path": copy_path}, load_mode="create")
    shape = ("SELECT attname, format_type(atttypid, atttypmod), (SELECT collname FROM pg_collation WHERE oid = attcollation) "
             "FROM pg_attribute WHERE attrelid = '{}'::regclass AND attnum > 0 ORDER BY attnum")
    assert pg_exec(pg_target, shape.format("rng_t")) == pg_exec(pg_source, shape.format("rng_src"))
    rows = "SELECT id, r::text, d::text, m::text, t, v, plain FROM {} ORDER BY t, id"
    assert pg_exec(pg_target, rows.format("rng_t")) == pg_exec(pg_source, rows.format("rng_src"))
    pg_exec(pg_target, "CREATE EXTENSION IF NOT EXISTS btree_gist", "ALTER TABLE rng_t ADD EXCLUDE USING gist (r WITH &&)")


@pytest.mark.parametrize("keep_definition", [True, False])
def test_create_says_each_column_type_and_the_partitioning_it_does_not_carry(pg_source, pg_target, keep_definition: bool) -> None:
    """An enum, a domain, a composite and an array of an enum became text or the domain's base type, and a partitioned
    source a plain table, with nothing said (exit 0, verify ok): each is named in the definition line and report.json
    now, with what the column was made; the values are the source's text."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS ty_src", "DROP TYPE IF EXISTS ty_mood", "DROP DOMAIN IF EXISTS ty_pos", "DROP TYPE IF EXISTS ty_pair",
            "CREATE TYPE ty_mood AS ENUM ('sad', 'ok', 'happy')", "CREATE DOMAIN ty_pos AS int CHECK (VALUE > 0)",
            "CREATE TYPE ty_pair AS (a int, b text)",
            "CREATE TABLE ty_src (id int, m ty_mood, p ty_pos, c ty_pair, ms ty_mood[], plain text) PARTITION BY RANGE (id)",
            "CREATE TABLE ty_src_lo PARTITION OF ty_src FOR VALUES FROM (0) TO (10)",
            "CREATE TABLE ty_src_hi PARTITION OF ty_src FOR VALUES FROM (10) TO (100)",
            "INSERT INTO ty_src VALUES (1, 'sad', 3, ROW(1, 'x'), '{ok,happy}', 'a'), (12, 'happy', 7, ROW(NULL, 'y,z'), '{}', NULL), "
            "(50, NULL, NULL, NULL, NULL, 'c')")
    pg_exec(pg_target, "DROP TABLE IF EXISTS ty_t")
    report = job({"type": "postgres", "port": pg_source.port, "table": "ty_src"},
                 {"type": "postgres", "port": pg_target.port, "table": "ty_t", "definition": keep_definition}, load_mode="create")
    said = report.sink_plan.definition
    for part in ("column m's type ty_mood (an enum): made text", "column p's type ty_pos (a domain (its constraints)): made integer",
                 "column c's type ty_pair (a composite type): made text", "column ms's type ty_mood[] (an array of a type of its own): made text"):
        assert part in said, said
    assert ("partitioning (PARTITION BY RANGE (id), 2 partition(s)): the target is one table of every partition's rows" in said) == keep_definition
    assert "column id" not in said and "column plain" not in said
    rows = "SELECT id, m::text, p, c::text, ms::text, plain FROM {} ORDER BY id"
    assert pg_exec(pg_target, rows.format("ty_t")) == pg_exec(pg_source, rows.format("ty_src"))
