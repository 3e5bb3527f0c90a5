"""A PostgreSQL table's definition beyond its columns and keys, read from the catalogs on the source
(``read``), and carried onto a table a PostgreSQL sink creates (``steps`` / ``after_swap``).

Read: NOT NULL, column defaults, identity and serial columns with where their sequences stand, CHECK,
UNIQUE and EXCLUDE constraints, the other indexes (expression, partial, INCLUDE, any access method),
the table's and columns' comments; and what is not carried: triggers, row security policies, rules,
generated columns' expressions (the values are copied into a plain column), extended statistics.

Carried (``sink.definition``, PostgreSQL -> PostgreSQL, a table the job creates): built on the staging
table after its rows and before it is swapped in, in the finalize's transaction, so a step that fails
leaves the target as it was. Indexes and index-backed constraints are named for the target table: a
source name that starts with the source table's name has it replaced by the target's; any other gets
the target's name in front (index names are unique per schema, and the source's may be in it).
Sequences are made for the target (``<table>_<column>_seq``) and set past the source's last value and
the largest value copied.
"""

from __future__ import annotations

from typing import Any

from conveyor.connectors.postgres.common import ident, literal
from conveyor.core import SequenceDef, SinkPlan, TableDefinition
from conveyor.errors import SchemaError, first_line
from conveyor.log import say


def read(con: Any, oid: int) -> TableDefinition:
    """The definition of table ``oid`` (psycopg connection), from its catalogs."""
    cols = con.execute(
        "SELECT a.attname, a.attnotnull, a.attidentity, a.attgenerated, pg_get_expr(d.adbin, d.adrelid), "
        "col_description(a.attrelid, a.attnum), pg_get_serial_sequence(quote_ident(n.nspname) || '.' || quote_ident(c.relname), a.attname) "
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", [oid]).fetchall()
    not_null, defaults, sequences, comments, not_carried = [], [], [], [], []
    for name, notnull, identity, generated, default, comment, seq in cols:
        if notnull:
            not_null.append(name)
        if comment is not None:
            comments.append((name, comment))
        if generated:
            not_carried.append(f"column {name}'s generation expression ({default}): its values are copied into a plain column")
            continue
        if identity or (seq and default and default.startswith("nextval(")):
            sequences.append(_sequence(con, name, {"a": "always", "d": "by default"}.get(identity, ""), seq))
        elif default is not None:
            defaults.append((name, default))
    declared = [(name, sql, _KINDS.get(typtype, _ARRAY if category == "A" else "a type of its own (an extension's or a user's)"))
                for name, sql, typtype, category in con.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typtype, t.typcategory FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND t.oid >= 16384 ORDER BY a.attnum", [oid]).fetchall()]
    constraints = [(name, sql, _after_on(index) if index else "", later) for name, sql, index, later in con.execute(
        "SELECT conname, pg_get_constraintdef(oid), CASE WHEN contype = 'u' THEN pg_get_indexdef(conindid) END, "
        "CASE WHEN condeferrable THEN 'DEFERRABLE' || CASE WHEN condeferred THEN ' INITIALLY DEFERRED' ELSE '' END ELSE '' END "
        "FROM pg_constraint WHERE conrelid = %s AND contype IN ('c', 'u', 'x') ORDER BY conname", [oid]).fetchall()]
    indexes = con.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = %s AND NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid) "
        "ORDER BY c.relname", [oid]).fetchall()
    table, table_comment, relrowsecurity = con.execute(
        "SELECT relname, obj_description(%s::oid, 'pg_class'), relrowsecurity FROM pg_class WHERE oid = %s", [oid, oid]).fetchone()
    for what, sql in (("trigger", "SELECT tgname FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal"),
                      ("row security policy", "SELECT polname FROM pg_policy WHERE polrelid = %s"),
                      ("rule", "SELECT rulename FROM pg_rewrite WHERE ev_class = %s AND rulename <> '_RETURN'"),
                      ("extended statistics object", "SELECT stxname FROM pg_statistic_ext WHERE stxrelid = %s")):
        not_carried += [f"{what} {name}" for (name,) in con.execute(sql, [oid]).fetchall()]
    if relrowsecurity:
        not_carried.append("row level security (enabled on the source)")
    # inheritance (not partitioning): the target is a table of its own, its rows the source table's own (read with ONLY)
    not_carried += [f"INHERITS ({parent}): the target is a table of its own" for (parent,) in con.execute(
        "SELECT i.inhparent::regclass::text FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent WHERE i.inhrelid = %s "
        "AND p.relkind <> 'p' ORDER BY i.inhseqno", [oid]).fetchall()]
    children = con.execute("SELECT coalesce(array_length(array_agg(i.inhrelid), 1), 0) FROM pg_inherits i JOIN pg_class c "
                           "ON c.oid = i.inhrelid WHERE i.inhparent = %s AND NOT c.relispartition", [oid]).fetchone()[0]
    partitioned = con.execute("SELECT pg_get_partkeydef(%s), "
                              "(SELECT coalesce(array_length(array_agg(inhrelid), 1), 0) FROM pg_inherits WHERE inhparent = %s), "
                              "(SELECT inhparent::regclass::text FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent "
                              " WHERE i.inhrelid = %s AND p.relkind = 'p')", [oid, oid, oid]).fetchone()
    if partitioned[0]:
        not_carried.append(f"partitioning (PARTITION BY {partitioned[0]}, {partitioned[1]} partition(s)): the target is one table of "
                           "every partition's rows")
    if partitioned[2]:
        not_carried.append(f"PARTITION OF {partitioned[2]}: the target is a table of its own")
    if children:
        not_carried.append(f"its {children} inheritance children: their rows are theirs (the source table is read with ONLY)")
    return TableDefinition("postgres", table, tuple(not_null), table_comment, tuple(comments), tuple(defaults), tuple(sequences),
                           tuple(constraints), tuple((name, _after_on(sql)) for name, sql in indexes), tuple(not_carried),
                           tuple(declared))


_ARRAY = "an array of a type of its own"
_KINDS = {"e": "an enum", "d": "a domain (its constraints)", "c": "a composite type", "r": "a range type of its own",
          "m": "a multirange type of its own"}


def _sequence(con: Any, column: str, identity: str, seq: str | None) -> SequenceDef:
    if not seq:
        return SequenceDef(column, identity, "", None)
    row = con.execute(
        "SELECT s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle, p.last_value "
        "FROM pg_sequence s LEFT JOIN pg_sequences p ON format('%%I.%%I', p.schemaname, p.sequencename)::regclass = s.seqrelid "
        "WHERE s.seqrelid = %s::regclass", [seq]).fetchone()
    start, inc, low, high, cache, cycle, last = row
    options = f"START WITH {start} INCREMENT BY {inc} MINVALUE {low} MAXVALUE {high} CACHE {cache}{' CYCLE' if cycle else ''}"
    return SequenceDef(column, identity, options, last)


def _after_on(indexdef: str) -> str:
    """``CREATE [UNIQUE] INDEX name ON [ONLY] schema.table USING ...`` -> ``[UNIQUE] USING ...`` (what follows the table)."""
    head, _, rest = indexdef.partition(" USING ")
    return ("UNIQUE " if head.startswith("CREATE UNIQUE ") else "") + "USING " + rest


def object_name(name: str, source_table: str, target_table: str) -> str:
    """An index's or constraint's name for the target (see the module's docstring), within 63 bytes."""
    from conveyor.connectors.postgres.target import index_name

    suffix = name[len(source_table):] if name.startswith(source_table) and len(name) > len(source_table) else "_" + name
    return index_name(target_table, suffix)


def index_builds(d: TableDefinition, stage: str, schema: str) -> list[str]:
    """The indexes of the definition (UNIQUE constraints' included), built on the staging table once its
    rows are in, before the finalize's transaction, several at once (:func:`build_indexes`); IF NOT
    EXISTS: a finalize run again after its driver died finds those it built (an unfinished build is
    rolled back whole)."""
    table = ident(schema, stage)
    named = [(name, index) for name, _, index, _ in d.constraints if index] + list(d.indexes)
    out = []
    for name, sql in named:
        unique, _, using = sql.partition("USING ")
        out.append(f"CREATE {unique}INDEX IF NOT EXISTS {ident(object_name(name, d.table, stage))} ON {table} USING {using}")
    return out


def steps(d: TableDefinition, stage: str, target_table: str, schema: str, columns: set[str]) -> list[str]:
    """The statements, in the finalize's transaction, that give the staging table ``schema.stage`` the
    rest of the definition once its rows and indexes are in (NOT NULL is made with the table:
    :func:`not_null`), for the columns it has. Defaults, identity and CHECK constraints go in one ALTER
    TABLE: one scan of the rows checks every constraint; a UNIQUE constraint takes its built index."""
    table, source_table = ident(schema, stage), d.table
    first: list[str] = []
    alter: list[str] = []
    after: list[str] = []
    alter += [f"ALTER COLUMN {ident(c)} SET DEFAULT {expr}" for c, expr in d.defaults if c in columns]
    for s in d.sequences:
        if s.column not in columns:
            continue
        seq = ident(schema, object_name(f"{source_table}_{s.column}_seq", source_table, target_table))
        if s.identity:
            alter.append(f"ALTER COLUMN {ident(s.column)} ADD GENERATED {s.identity.upper()} AS IDENTITY (SEQUENCE NAME {seq} {s.options})")
        else:
            first.append(f"CREATE SEQUENCE {seq} {s.options} OWNED BY {table}.{ident(s.column)}")
            alter.append(f"ALTER COLUMN {ident(s.column)} SET DEFAULT nextval({literal(seq)}::regclass)")
        # past the source's last value and every value copied (a sequence behind the rows would hand out taken keys)
        past = f"greatest({'NULL' if s.last_value is None else int(s.last_value)}, (SELECT max({ident(s.column)}) FROM {table}))"
        after.append(f"SELECT setval({literal(seq)}, {past}) WHERE {past} IS NOT NULL")
    for name, sql, index, later in d.constraints:
        if sql.startswith("CHECK "):  # the table's own name space: only a name made of the source table's changes
            alter.append(f"ADD CONSTRAINT {ident(object_name(name, source_table, target_table) if name.startswith(source_table) else name)} {sql}")
            continue
        named = ident(object_name(name, source_table, stage))  # an index of the schema's: named for the stage, renamed with it
        after.append(f"ALTER TABLE {table} ADD CONSTRAINT {named} UNIQUE USING INDEX {named} {later}".rstrip() if index else
                     f"ALTER TABLE {table} ADD CONSTRAINT {named} {sql}")
    if d.comment is not None:
        after.append(f"COMMENT ON TABLE {table} IS {literal(d.comment)}")
    after += [f"COMMENT ON COLUMN {table}.{ident(c)} IS {literal(text)}" for c, text in d.column_comments if c in columns]
    return first + ([f"ALTER TABLE {table} " + ", ".join(alter)] if alter else []) + after


def build_indexes(connect: Any, plan: SinkPlan, schema: str, degree: int, where: str) -> None:
    """:func:`index_builds` of ``plan``'s definition, ``degree`` at once, each on its own connection
    (``connect()``, autocommit): CREATE INDEX takes a lock that lets other builds on the table run."""
    from concurrent.futures import ThreadPoolExecutor

    builds = index_builds(plan.own.definition, plan.write_target, schema)

    def build(sql: str) -> None:
        con = connect()
        try:
            _run(con, sql, where)
        finally:
            con.close()

    if builds:
        with ThreadPoolExecutor(max(1, min(degree, len(builds))), thread_name_prefix="conveyor-index") as pool:
            for done in [pool.submit(build, sql) for sql in builds]:
                done.result()


def _run(con: Any, step: str, where: str) -> None:
    try:
        con.execute(step)
    except Exception as exc:
        raise SchemaError(f"{where}: the source table's definition could not be carried: {first_line(exc)} (at: {step[:300]})",
                          hint="sink.definition=false makes the table with its columns and primary key only; the target is as "
                               "it was") from None


def not_null(d: TableDefinition | None, column: str) -> str:
    """`` NOT NULL`` for a column the source holds to it, made with the table (the rows' COPY checks it, no scan after)."""
    return " NOT NULL" if d is not None and column in d.not_null else ""


def carry(con: Any, plan: SinkPlan, schema: str, target_table: str, where: str, name: str) -> None:
    """The :func:`steps` of ``plan``'s definition on its staged table, run on ``con`` (the finalize's
    transaction), said in the log; a step that fails is one line naming it."""
    d = plan.own.definition
    say(f"{name}: {said(d)}")
    for step in steps(d, plan.write_target, target_table, schema, set(plan.columns)):
        _run(con, step, where)


def said(d: TableDefinition) -> str:
    """What the log says was carried and what was not."""
    return d.said(((len(d.not_null), "NOT NULL"), (len(d.defaults), "default(s)"), (len(d.sequences), "sequence(s)"),
                   (len(d.constraints), "constraint(s)"), (len(d.indexes), "index(es)"), (d.comments, "comment(s)")), d.not_carried)
