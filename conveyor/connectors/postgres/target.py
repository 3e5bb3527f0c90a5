"""The PostgreSQL sink's target in the catalog: what it is, what this role may do to it, and
what ``replace`` must carry over to the table that takes its place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.connectors.postgres import commits
from conveyor.connectors.postgres.common import ident, literal
from conveyor.connectors.postgres.types import PgColumn, read_columns
from conveyor.errors import SchemaError
from conveyor.kit.mapping import TargetColumn


@dataclass(frozen=True)
class Target:
    schema: str
    table: str
    exists: bool
    relkind: str = ""
    columns: tuple[PgColumn, ...] = ()
    mapping: tuple[TargetColumn, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def qualified(self) -> str:
        return ident(self.schema, self.table)


def only(relkind: str) -> str:
    """``ONLY `` where a statement on the table would act on its inheritance children too (a plain table: the children are
    tables of their own; a partitioned table's rows are its partitions')."""
    return "ONLY " if relkind == "r" else ""


def scan(con: Any, qualified: str) -> str:
    """The relation ``qualified`` (a table or a stage) as a FROM item of its own rows."""
    return only_of(con, qualified) + qualified


def only_of(con: Any, qualified: str) -> str:
    row = con.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [qualified]).fetchone()
    return only(row[0] if row else "")


def inspect(con: Any, schema: str, table: str) -> Target:
    """The target as the catalog has it (``exists=False`` when it does not)."""
    row = con.execute(
        "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s", [schema, table]).fetchone()
    if row is None:
        return Target(schema, table, False)
    qualified = ident(schema, table)
    cols = read_columns(con, f"SELECT * FROM {qualified} LIMIT 0")
    meta = con.execute(
        "SELECT a.attname, a.attnotnull, a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '', a.attgenerated <> '' "
        "FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [qualified]).fetchall()
    mapping = tuple(TargetColumn(name, c.type_sql, not notnull, bool(hasdef), bool(generated))
                    for (name, notnull, hasdef, generated), c in zip(meta, cols))
    return Target(schema, table, True, row[0], tuple(cols), mapping)


def check_access(con: Any, target: Target, mode: str, user: str, markers: bool, on: str, where: str) -> None:
    """What the load needs, checked before anything is created: the schema exists, the target
    is a table, and this role may do what the load mode does (not found out after staging)."""
    schema = target.schema
    if not con.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema]).fetchone():
        raise SchemaError(f"{where}: schema {schema} does not exist on {on}",
                          hint=f"create it (CREATE SCHEMA {ident(schema)}) or set sink.schema")
    if target.exists and target.relkind not in ("r", "p"):
        kind = {"v": "a view", "m": "a materialized view", "f": "a foreign table"}.get(target.relkind, "not a table")
        raise SchemaError(f"{where} is {kind}: Conveyor loads tables", hint="point sink.table at the table behind it")
    may_create, = con.execute("SELECT has_schema_privilege(%s, 'CREATE')", [schema]).fetchone()
    needs = []
    if mode != "append" and not may_create:
        needs.append(f"CREATE on schema {schema} (for the staging table)")
    if markers and not may_create and not con.execute(
            "SELECT to_regclass(%s) IS NOT NULL", [f"{ident(schema)}.{commits.MARKERS}"]).fetchone()[0]:
        needs.append(f"CREATE on schema {schema} (for {commits.MARKERS}, or set sink.commit_markers=false)")
    if target.exists:
        privileges = {"append": ("INSERT",), "truncate": ("INSERT", "TRUNCATE")}.get(mode, ())
        for privilege in privileges:
            if not con.execute("SELECT has_table_privilege(%s, %s)", [target.qualified, privilege]).fetchone()[0]:
                needs.append(f"{privilege} on {target.name}")
        if mode == "replace" and not con.execute(
                "SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = %s::regclass",
                [target.qualified]).fetchone()[0]:
            needs.append(f"ownership of {target.name} (replace drops it)")
    if needs:
        raise SchemaError(f"{where}: role {user} lacks {'; '.join(needs)}",
                          hint="grant it, or connect as a role that has it (sink.user)")
    if target.exists and mode in ("replace", "truncate"):
        _check_dependents(con, target, mode, where)


def _check_dependents(con: Any, target: Target, mode: str, where: str) -> None:
    """What would make the final swap fail after the whole load: views on the table (replace
    drops it) and foreign keys of other tables pointing at it (replace and truncate)."""
    oid = target.qualified
    refs = [r[0] for r in con.execute(
        "SELECT format('%%s (%%s)', conname, conrelid::regclass) FROM pg_constraint "
        "WHERE contype = 'f' AND confrelid = %s::regclass AND conrelid <> confrelid ORDER BY 1", [oid]).fetchall()]
    views = [] if mode != "replace" else [r[0] for r in con.execute(
        "SELECT DISTINCT v.oid::regclass::text FROM pg_depend d JOIN pg_rewrite w ON w.oid = d.objid "
        "JOIN pg_class v ON v.oid = w.ev_class WHERE d.refobjid = %s::regclass AND v.oid <> d.refobjid ORDER BY 1",
        [oid]).fetchall()]
    found = ([f"views {', '.join(views)} depend on it"] if views else []) + (
        [f"foreign keys point at it: {', '.join(refs)}"] if refs else [])
    if found:
        alternative = "load_mode=truncate keeps the table (and its views)" if mode == "replace" and not refs else \
            "load_mode=append, or drop the foreign keys first"
        raise SchemaError(f"{where}: load_mode={mode} cannot swap it in: {'; '.join(found)}", hint=alternative)


def access_method(con: Any, target: Target) -> str:
    """' USING <am>' for a target that is not a heap table (a columnar one): replace keeps it."""
    row = con.execute("SELECT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE c.oid = %s::regclass",
                      [target.qualified]).fetchone()
    return f" USING {ident(row[0])}" if row and row[0] != "heap" else ""


def table_access_method(con: Any, target: Target) -> str:
    """The target's access method; for a partitioned table, its leaves' other than heap if any has one."""
    rows = con.execute("SELECT DISTINCT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE c.relkind IN ('r', 'm') "
                       "AND (c.oid = %s::regclass OR c.oid IN (SELECT relid FROM pg_partition_tree(%s::regclass)))",
                       [target.qualified, target.qualified]).fetchall()
    found = sorted(r[0] for r in rows)
    return next((am for am in found if am != "heap"), "heap")


def stripe_row_limit(con: Any, target: Target | None) -> int | None:
    """Citus columnar's stripe_row_limit for the target (its own option, else the server's setting);
    None where Citus is not installed."""
    if target is not None and con.execute("SELECT to_regclass('columnar.options')").fetchone()[0] is not None:
        row = con.execute("SELECT stripe_row_limit FROM columnar.options WHERE relation = %s::regclass", [target.qualified]).fetchone()
        if row is not None:
            return int(row[0])
    setting = con.execute("SELECT current_setting('columnar.stripe_row_limit', true)").fetchone()[0]
    return int(setting) if setting else None


def range_leaves(con: Any, target: Target) -> tuple[str, list[tuple[Any, Any, str, str]]] | None:
    """(partition key column, [(lower, upper, schema, table)]) of a target partitioned by RANGE on
    one column: its direct partitions with their bounds as Python values (None: MINVALUE/MAXVALUE);
    None for any other target. The DEFAULT partition is not among them (the parent routes to it)."""
    row = con.execute("SELECT pt.partstrat, pt.partnatts, a.attname, format_type(a.atttypid, a.atttypmod) "
                      "FROM pg_partitioned_table pt JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0] "
                      "WHERE pt.partrelid = %s::regclass", [target.qualified]).fetchone()
    if row is None or row[0] != "r" or row[1] != 1 or row[2] is None:
        return None
    column, type_sql = row[2], row[3]
    children = con.execute(
        "SELECT n.nspname, c.relname, (regexp_match(pg_get_expr(c.relpartbound, c.oid), '^FOR VALUES FROM \\((.*)\\) TO \\((.*)\\)$'))[1:2] "
        "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE i.inhparent = %s::regclass AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'", [target.qualified]).fetchall()
    if not children:
        return column, []
    # every bound as the column's own type, cast by the server from the literal it printed, in one query
    # (an array: a select list stops at 1,664 entries, a pg_partman daily table can have more bounds)
    literals = [v for _, _, bounds in children for v in bounds]
    typed = con.execute(f"SELECT ARRAY[{', '.join('NULL' if v in ('MINVALUE', 'MAXVALUE') else v for v in literals)}]::{type_sql}[]").fetchone()[0]
    leaves = [(typed[2 * i], typed[2 * i + 1], schema, name) for i, (schema, name, _) in enumerate(children)]
    return column, sorted(leaves, key=lambda leaf: (leaf[0] is not None, leaf[0]))


def default_partition_rows(con: Any, target: Target) -> list[tuple[str, int]]:
    """(partition, rows) of each DEFAULT partition under a partitioned target that holds rows:
    rows no other partition's bounds cover (pg_partman's parent_default, for one)."""
    found = con.execute(
        "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_partition_tree(%s::regclass) t "
        "JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relispartition AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' AND c.relkind = 'r'", [target.qualified]).fetchall()
    counts = [(name, con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]) for (name,) in found]
    return [(name, n) for name, n in counts if n]


def primary_key(con: Any, target: Target) -> list[str]:
    """The target's primary key columns, in key order (none: [])."""
    rows = con.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                       "WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY array_position(i.indkey::int2[], a.attnum)",
                       [target.qualified]).fetchall()
    return [r[0] for r in rows]


def loose_indexes(con: Any, target: Target) -> tuple[list[str], list[str]]:
    """(DROP statements, CREATE statements) for the target's own indexes that back no constraint
    (primary keys, unique and exclusion constraints stay: they are the table's rules, and foreign
    keys may need them). Run in the load's transaction, a failure restores them with the rows."""
    rows = con.execute(
        "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), pg_get_indexdef(i.indexrelid) "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE i.indrelid = %s::regclass AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) "
        "ORDER BY c.relname", [target.qualified]).fetchall()
    return [f"DROP INDEX {name}" for name, _ in rows], [ddl for _, ddl in rows]


def always_identity(con: Any, qualified: str) -> set[str]:
    """The table's identity columns GENERATED ALWAYS: an UPDATE can set them only to DEFAULT (an INSERT writes them
    with OVERRIDING SYSTEM VALUE)."""
    return {r[0] for r in con.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND "
                                      "attidentity = 'a' AND NOT attisdropped", (qualified,)).fetchall()}


def keep_identity(con: Any, target: Target, stage: str) -> None:
    """Replace: the new table takes the old one's owner, privileges and comment (LIKE copies
    columns, defaults, constraints, indexes and column comments, not these)."""
    owner, comment = con.execute(
        "SELECT pg_get_userbyid(c.relowner), obj_description(c.oid, 'pg_class') FROM pg_class c WHERE c.oid = %s::regclass",
        [target.qualified]).fetchone()
    staged = ident(target.schema, stage)
    grants = con.execute(  # grantee 0 is PUBLIC; names unquoted, quoted below
        "SELECT a.privilege_type, CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END, a.is_grantable "
        "FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = %s::regclass AND a.grantee <> c.relowner",
        [target.qualified]).fetchall()
    for privilege, grantee, grantable in grants:
        who = "PUBLIC" if grantee is None else ident(grantee)
        con.execute(f"GRANT {privilege} ON {staged} TO {who}" + (" WITH GRANT OPTION" if grantable else ""))
    if comment is not None:
        con.execute(f"COMMENT ON TABLE {staged} IS {literal(comment)}")
    if con.execute("SELECT pg_has_role(%s, 'MEMBER')", [owner]).fetchone()[0]:
        con.execute(f"ALTER TABLE {staged} OWNER TO {ident(owner)}")


def rename_stage_indexes(con: Any, target: Target, stage: str) -> None:
    """Indexes made by LIKE ... INCLUDING ALL carry the staging table's name: give them the target's."""
    rows = con.execute(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = %s::regclass AND c.relname LIKE %s",
        [target.qualified, stage.replace("_", "\\_") + "%"]).fetchall()
    for (name,) in rows:
        new = index_name(target.table, name[len(stage):])
        con.execute(f"ALTER INDEX {ident(target.schema, name)} RENAME TO {ident(new)}")


def index_name(table: str, suffix: str) -> str:
    """An index name for ``table`` + ``suffix`` within PostgreSQL's 63 bytes: the table part is
    shortened, as PostgreSQL itself does, so the suffix (``_pkey``) stays and the name never
    equals the table's own (a 63-byte table name once made ``(table + "_pkey")[:63]`` collide)."""
    room = 63 - len(suffix.encode())
    head = table.encode()[:room].decode(errors="ignore")
    return head + suffix


def add_foreign_keys(con: Any, steps: list[str], translated: Any, where: str) -> None:
    """The ``ALTER TABLE ... ADD FOREIGN KEY`` steps in one transaction on ``con`` (closed after): all made,
    or none, named by the server's reason (``translated``: the connector's error for it)."""
    import contextlib

    try:
        for step in steps:
            con.execute(step)
        con.commit()
    except Exception as exc:
        with contextlib.suppress(Exception):
            con.rollback()
        raise SchemaError(f"{where}: its foreign keys could not be made (the rows are loaded): {translated(exc).message}",
                          hint="the tables are loaded without them; see the rows the key refuses, or sink.foreign_keys=false") from None
    finally:
        con.close()
